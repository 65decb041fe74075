"""Bad input, one case per row. Every mistake is an error that names the argument (or the
kernel's line) and says what to do; nothing runs silently wrong, and the command line never
shows a traceback. Covers the kernel API (pk.emulate, pk.launch and the CUDA/HIP launchers,
which share one set of argument rules), tracing, the emulator's race and aliasing checks,
the library's launch helpers, pykittens.ops.attention, and the `pykittens` command."""
import os
import re
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.cli import main
from pykittens.emulator import MissingBarrier, Race, UnwrittenRead
from pykittens.kernels import KERNELS, gemm_ws_launch, ln_tma_consts
from pykittens.kernels.attention import attention_fwd_launch, attention_fwd_varlen_launch
from pykittens.kernels.attention_bwd import attention_bwd_launch
from pykittens.kernels.attention_cdna import cdna_launch
from pykittens.runtime import cuda as rc
from pykittens.runtime.args import ArgumentError

import conftest
from conftest import ROOT, assert_names_line

HERE = __file__
F32 = np.float32


def X(rows=16, cols=64, dtype=F32, seed=1):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(dtype)


# ---- kernels the cases use -------------------------------------------------------------------

@pk.kernel  # MARK-copy
def copy2(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], a: pk.f32, n: pk.i32):
    r0 = pk.program_id(0) * 8
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), x, (r0, 0)) * a, (r0, 0))


@pk.kernel  # MARK-static
def static_k(x: pk.gl[pk.f32, (None, 64)], out: pk.gl[pk.f32, 2]):
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), x))


@pk.kernel  # MARK-dt
def dt_k(x: pk.gl["DT", 2], out: pk.gl["DT", 2], DT: pk.const = None, TAG: pk.const = 0):
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), x))


def plain(x: pk.gl[pk.f32, 2]):  # MARK-plain
    pass


# ---- the kernel API: pk.emulate's argument checks (shared with the GPU launchers) ----------

def _buf():
    return X(17, 64)


API = [
    ("plain function", lambda: pk.emulate(plain, X(), grid=1), "MARK-plain",
     r"pk.emulate takes a @pk.kernel, but 'plain' is a plain function: put @pk.kernel"),
    ("not a function", lambda: pk.emulate(42, X(), grid=1), None,
     r"pk.emulate takes a @pk.kernel function, not int"),
    ("float64 array", lambda: pk.emulate(copy2, X(dtype=np.float64), X(), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'x' of copy2 has element type float64, which pykittens kernels "
                  r"do not take .* x.astype\(np.float32\)"),
    ("int64 array", lambda: pk.emulate(copy2, X().astype(np.int64), X(), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'x' of copy2 has element type int64"),
    ("bool array", lambda: pk.emulate(copy2, X() > 0, X(), 1.0, 1, grid=2), "MARK-copy",
     r"argument 'x' of copy2 has element type bool"),
    ("complex array", lambda: pk.emulate(copy2, X(), X().astype(np.complex64), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'out' of copy2 has element type complex64"),
    ("f16 for f32", lambda: pk.emulate(copy2, X(dtype=np.float16), X(), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'x' of copy2 has element type f16 but the kernel expects f32; "
                  r"convert it first \(x.astype\(np.float32\)\)"),
    ("bf16 for f32", lambda: pk.emulate(copy2, X(), X(dtype=ml_dtypes.bfloat16), 1.0, 1,
                                        grid=2),
     "MARK-copy", r"argument 'out' of copy2 has element type bf16 but the kernel expects f32"),
    ("rank", lambda: pk.emulate(copy2, X().reshape(-1), X(), 1.0, 1, grid=2), "MARK-copy",
     r"argument 'x' of copy2 has rank 1 but the kernel expects rank 2"),
    ("static dim", lambda: pk.emulate(static_k, X(8, 32), X(8, 64), grid=1), "MARK-static",
     r"argument 'x' of static_k has size 32 in dim 1 but the kernel is compiled for 64"),
    ("list", lambda: pk.emulate(copy2, X().tolist(), X(), 1.0, 1, grid=2), "MARK-copy",
     r"argument 'x' of copy2 must be a numpy array or torch tensor, not list"),
    ("transposed", lambda: pk.emulate(copy2, X(64, 16).T, X(), 1.0, 1, grid=2), "MARK-copy",
     r"argument 'x' of copy2 has stride 16 in its last dimension \(e.g. a transposed view\); "
     r"kernels need the last dimension contiguous: pass np.ascontiguousarray\(x\)"),
    ("reversed columns", lambda: pk.emulate(copy2, X()[:, ::-1], X(), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'x' of copy2 has a negative stride"),
    ("reversed rows", lambda: pk.emulate(copy2, X()[::-1], X(), 1.0, 1, grid=2), "MARK-copy",
     r"argument 'x' of copy2 has a negative stride \(-64, 1\)"),
    ("every other column", lambda: pk.emulate(copy2, X(16, 128)[:, ::2], X(), 1.0, 1, grid=2),
     "MARK-copy", r"argument 'x' of copy2 has stride 2 in its last dimension"),
    ("shifted overlap", lambda: (lambda b: pk.emulate(copy2, b[:16], b[1:], 1.0, 1, grid=2))(
        _buf()), "MARK-copy",
     r"arguments 'x' and 'out' overlap in memory but are different views of it"),
    ("reshaped overlap", lambda: (lambda b: pk.emulate(copy2, b, b.reshape(8, 128), 1.0, 1,
                                                       grid=2))(X()), "MARK-copy",
     r"arguments 'x' and 'out' overlap in memory .* or the very same tensor for an in-place"),
    ("scalar str", lambda: pk.emulate(copy2, X(), X(), "1.0", 1, grid=2), "MARK-copy",
     r"argument 'a' of copy2 must be a number \(f32\), not str"),
    ("scalar bool", lambda: pk.emulate(copy2, X(), X(), True, 1, grid=2), "MARK-copy",
     r"argument 'a' of copy2 must be a number \(f32\), not bool"),
    ("scalar array", lambda: pk.emulate(copy2, X(), X(), 1.0, np.array([1, 2]), grid=2),
     "MARK-copy", r"argument 'n' of copy2 must be a number \(i32\), not ndarray"),
    ("fractional int", lambda: pk.emulate(copy2, X(), X(), 1.0, 1.5, grid=2), "MARK-copy",
     r"argument 'n' of copy2 must be an integer \(i32\), got 1.5"),
    ("int overflow", lambda: pk.emulate(copy2, X(), X(), 1.0, 2**31, grid=2), "MARK-copy",
     r"argument 'n' of copy2 = 2147483648 does not fit i32"),
    ("int underflow", lambda: pk.emulate(copy2, X(), X(), 1.0, -2**31 - 1, grid=2), "MARK-copy",
     r"argument 'n' of copy2 = -2147483649 does not fit i32"),
    ("f32 overflow", lambda: pk.emulate(copy2, X(), X(), 1e39, 1, grid=2), "MARK-copy",
     r"argument 'a' of copy2 = 1e\+39 overflows f32"),
    ("missing", lambda: pk.emulate(copy2, X(), X(), 1.0, grid=2), "MARK-copy",
     r"missing argument\(s\) \['n'\] for kernel copy2"),
    ("too many", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, 2, grid=2), "MARK-copy",
     r"copy2 takes 4 tensor/scalar arguments \(x, out, a, n\), got 5"),
    ("twice", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, a=2.0, grid=2), "MARK-copy",
     r"argument 'a' given twice"),
    ("unknown const", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, BOGUS=1, grid=2),
     "MARK-copy", r"unknown compile-time constant\(s\) \['BOGUS'\]"),
    ("unhashable const", lambda: pk.emulate(dt_k, X(), X(), TAG=[1], grid=1),
     "MARK-dt", r"compile-time constant\(s\) \['TAG'\] must be hashable values \(e.g. a "
                r"tuple, not a list\)"),
    ("dtype const", lambda: pk.emulate(dt_k, X(), X(), DT="float64", grid=1), "MARK-dt",
     r"compile-time constant DT='float64' \(the element type of 'x'\) is not an element type"),
    ("dtype inferred", lambda: pk.emulate(dt_k, X(dtype=np.float16), X(), grid=1), "MARK-dt",
     r"argument 'out' of dt_k has element type f32 but the kernel expects f16"),
    ("float grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=(10 / 4,)), "MARK-copy",
     r"grid sizes must be ints, got 2.5 in grid=\(2.5,\): use integer division"),
    ("float grid scalar", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=16 / 8),
     "MARK-copy", r"grid sizes must be ints, got 2.0"),
    ("numpy float grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=(np.float32(2),)),
     "MARK-copy", r"grid sizes must be ints"),
    ("str grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=("2",)), "MARK-copy",
     r"grid sizes must be ints, got '2'"),
    ("bool grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=True), "MARK-copy",
     r"grid sizes must be ints, got True"),
    ("zero grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=(2, 0)), "MARK-copy",
     r"grid must be 1 to 3 positive sizes below 2\^31, got \(2, 0\)"),
    ("huge grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=2**31), "MARK-copy",
     r"grid must be 1 to 3 positive sizes below 2\^31"),
    ("4-d grid", lambda: pk.emulate(copy2, X(), X(), 1.0, 1, grid=(1, 1, 1, 1)), "MARK-copy",
     r"grid must be an int or a tuple of 1 to 3 ints"),
    ("broadcast output", lambda: pk.emulate(copy2, X(), np.broadcast_to(X(1, 64), (16, 64)),
                                            1.0, 1, grid=2), "MARK-copy",
     r"argument 'out' of copy2 repeats elements \(a stride of 0, e.g. from expand\(\) or "
     r"np.broadcast_to\) and the kernel writes it"),
    ("TMA row pitch", lambda: pk.emulate(KERNELS["tma_scale"].kernel, X(64, 100,
                                         ml_dtypes.bfloat16), X(64, 100, ml_dtypes.bfloat16),
                                         grid=(1, 2), target="sm_90a"), None,
     r"argument 'x' of tma_scale is copied by TMA, which needs a 16-byte aligned start and "
     r"strides of a multiple of 16 bytes .*pad the rows to a multiple of 8 elements"),
]


@pytest.mark.parametrize("call, marker, msg", [c[1:] for c in API], ids=[c[0] for c in API])
def test_kernel_api(call, marker, msg):
    with pytest.raises(pk.KernelError, match=msg) as e:
        call()
    if marker:
        assert_names_line(e.value, HERE, f"# {marker}")
    if isinstance(e.value, ArgumentError):
        assert f"(called at {HERE}:" in str(e.value)       # and where the user called


def test_a_broadcast_input_is_fine():
    row = X(1, 64)
    got = pk.emulate(copy2, np.broadcast_to(row, (16, 64)), X(), 2.0, 1, grid=2)["out"]
    assert np.array_equal(got, np.repeat(2 * row, 16, axis=0))


def test_unknown_target_and_isa_on_hopper():
    with pytest.raises(ValueError, match="unknown target 'gfx90a'"):
        pk.emulate(copy2, X(), X(), 1.0, 1, grid=2, target="gfx90a")
    with pytest.raises(ValueError, match="the ISA emulator runs AMD code objects"):
        pk.emulate(copy2, X(), X(), 1.0, 1, grid=2, target="sm_90a", isa=True)


def test_torch_arguments_follow_the_same_rules():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 16)
    with pytest.raises(ArgumentError, match=r"argument 'x' of copy2 has stride 16 in its last "
                                            r"dimension .* pass x.contiguous\(\)"):
        pk.emulate(copy2, x.t(), torch.zeros(16, 64), 1.0, 1, grid=2)
    with pytest.raises(ArgumentError, match=r"element type float64.*x.to\(torch.float32\)"):
        pk.emulate(copy2, x.double().t().contiguous(), torch.zeros(16, 64), 1.0, 1, grid=2)
    xs = torch.randn(16, 64)
    got = pk.emulate(copy2, xs, torch.zeros(16, 64), 2.0, 1, grid=2)["out"]
    assert np.array_equal(got, 2 * xs.numpy())
    with pytest.raises(ArgumentError, match="'x' and 'out' overlap in memory"):
        pk.emulate(copy2, xs[:8], xs.view(8, 128)[:, :64], 1.0, 1, grid=1)


# ---- tracing: integer coordinates, loop-carried values, Hopper-only features --------------

@pk.kernel
def half_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], HOW: pk.const = "div"):
    pid = pk.program_id(0)
    t = pk.rt((1, 64), pk.f32)
    if HOW == "div":
        c = pid * 3 / 2
        pk.store(out, pk.load(t, x, (0, c)), (0, c))  # MARK-half-div
    elif HOW == "py":
        pk.store(out, pk.load(t, x, (0, 32.5)))  # MARK-half-py
    elif HOW == "bool":
        pk.store(out, pk.load(t, x, (True, 0)))  # MARK-half-bool
    elif HOW == "floor":
        c = pid * 3 // 2
        pk.store(out, pk.load(t, x, (0, c * 64)), (0, c * 64))
    elif HOW == "sload":
        v = x[0, pid / 2]  # MARK-half-sload
        pk.store(out, pk.full(t, v))
    elif HOW == "range":
        for i in pk.range(pid / 2):  # MARK-half-range
            pass
    elif HOW == "step":
        for i in pk.range(0, 4, 2.5):  # MARK-half-step
            pass
    elif HOW == "intfloat":
        pk.store(out, pk.load(t, x, (0, 64.0)), (0, 64.0))


@pytest.mark.parametrize("how, marker, msg", [
    ("div", "MARK-half-div", r"a coordinate must be an integer, but this traced scalar is "
                             r"f32 \(made by `/` or by a float operand\): use `//`"),
    ("py", "MARK-half-py", r"a coordinate must be an integer, got 32.5: use `//`"),
    ("bool", "MARK-half-bool", r"a coordinate must be an integer .* not bool"),
    ("sload", "MARK-half-sload", r"an index of x must be an integer, but this traced scalar "
                                 r"is f32"),
    ("range", "MARK-half-range", r"a pk.range bound must be an integer"),
    ("step", "MARK-half-step", r"pk.range step must be a non-zero Python int, not 2.5"),
])
def test_coordinates_are_exact_integers(how, marker, msg):
    with pytest.raises(pk.KernelError, match=msg) as e:
        pk.emulate(half_k, X(4, 256), X(4, 256), grid=2, HOW=how)
    assert_names_line(e.value, HERE, f"# {marker}")


def test_integer_coordinates_that_are_exact_still_work():
    x = X(4, 256)
    got = pk.emulate(half_k, x, np.zeros_like(x), grid=2, HOW="floor")["out"]
    assert np.array_equal(got[0, :128], x[0, :128]) and np.all(got[0, 128:] == 0)
    got = pk.emulate(half_k, x, np.zeros_like(x), grid=1, HOW="intfloat")["out"]
    assert np.array_equal(got[0, 64:128], x[0, 64:128])


@pk.kernel
def loop_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], HOW: pk.const = "scalar"):
    t = pk.rt((1, 64), pk.f32)
    if HOW == "scalar":
        off = pk.program_id(0) * 0
        for i in pk.range(4):  # MARK-loop-scalar
            pk.store(out, pk.load(t, x, (0, off)), (0, off))
            off = off + 64
    elif HOW == "python":
        off = 0
        for i in pk.range(4):  # MARK-loop-python
            pk.store(out, pk.load(t, x, (0, off)), (0, off))
            off += 64
    elif HOW == "tile":
        acc = pk.zeros(t)
        for i in pk.range(4):  # MARK-loop-tile
            acc = acc + pk.load(t, x, (0, i * 64))
        pk.store(out, acc)
    elif HOW == "index":
        j = 0
        for i in pk.range(4):
            for j in pk.static_range(2):           # a static loop's variable may change
                pk.store(out, pk.load(t, x, (j, i * 64)), (j, i * 64))
            off = i * 64                            # rebinding without reading: fine


@pytest.mark.parametrize("how, marker, msg", [
    ("scalar", "MARK-loop-scalar", r"`off` is rebound in this pk.range body to a value "
                                   r"computed from its value before the loop, but scalars are "
                                   r"not loop-carried .* compute it from the loop index"),
    ("python", "MARK-loop-python", r"`off` is a Python number that this pk.range body changes "
                                   r"\(0 -> 64\); the body is traced once"),
    ("tile", "MARK-loop-tile", r"`acc` is read in this pk.range body and then rebound to a new "
                               r"tile.*update it in place"),
])
def test_loop_carried_values_are_not_silently_dropped(how, marker, msg):
    with pytest.raises(pk.KernelError, match=msg) as e:
        pk.emulate(loop_k, X(2, 256), X(2, 256), grid=1, HOW=how)
    assert_names_line(e.value, HERE, f"# {marker}")


def test_loop_index_arithmetic_is_fine():
    x = X(2, 256)
    got = pk.emulate(loop_k, x, np.zeros_like(x), grid=1, HOW="index")["out"]
    assert np.array_equal(got, x)


def test_stage_index_must_be_an_integer():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((8, 64), pk.f32), count=2)
        pk.load(s[1.5], x)  # MARK-stage

    with pytest.raises(pk.KernelError, match=r"a stage index must be an integer, got 1.5") as e:
        pk.emulate(k, X(8, 64), grid=1)
    assert_names_line(e.value, HERE, "# MARK-stage")


def test_hopper_features_on_cdna_are_named_before_shared_memory_budgets():
    @pk.kernel(num_waves=4)
    def k(x: pk.gl[pk.f32, 2]):
        big = pk.empty(pk.st((256, 256), pk.f32))       # 256 KiB: over every CDNA budget
        pk.load(big, x)
        bar = pk.mbarrier(4)  # MARK-mbar
        pk.arrive(bar)
        pk.wait(bar, 0)

    with pytest.raises(pk.NotSupportedYet, match=r"mbarriers are a Hopper feature; on gfx942 "
                                                 r"synchronise waves with pk.barrier\(\)") as e:
        pk.emulate(k, X(256, 256), grid=1, target="gfx942")
    assert_names_line(e.value, HERE, "# MARK-mbar")


def test_ops_outside_a_kernel_and_calling_a_kernel():
    with pytest.raises(pk.KernelError, match="can only be called while a @pk.kernel function "
                                             "is being traced"):
        pk.program_id(0)
    with pytest.raises(pk.KernelError, match="is not called directly: use pk.emulate"):
        copy2(X(), X(), 1.0, 1)


# ---- the emulator: races on global memory, aliasing, missing barriers ------------------------

@pk.kernel(num_waves=2)
def ww_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], HOW: pk.const = "workgroups"):
    t = pk.rt((4, 64), pk.f32)
    w = pk.wave_id()
    if HOW == "workgroups":            # every workgroup writes rows 0..3 (a mapping bug)
        with pk.if_(w == 0):
            pk.store(out, pk.load(t, x, (0, 0)), (0, 0))  # MARK-ww-wg
    elif HOW == "waves":               # both waves write rows 0..3, unordered
        pk.store(out, pk.load(t, x, (4 * w, 0)), (0, 0))  # MARK-ww-waves
    elif HOW == "ordered":             # both write rows 0..3, one after the other
        with pk.if_(w == 0):
            pk.store(out, pk.load(t, x, (0, 0)), (0, 0))
        pk.barrier()
        with pk.if_(w == 1):
            pk.store(out, pk.load(t, x, (4, 0)), (0, 0))
    elif HOW == "shift":               # in place: each workgroup reads the next one's columns
        c0 = pk.program_id(0) * 64
        with pk.if_(w == 0):
            pk.store(out, pk.load(t, x, (0, c0 + 64)), (0, c0))  # MARK-ww-shift
    elif HOW == "own":                 # in place, each element by its own lanes: fine
        c0 = pk.program_id(0) * 64
        r0 = 4 * w
        pk.store(out, pk.load(t, x, (r0, c0)) * 2.0, (r0, c0))
    elif HOW == "atomic":              # every wave of every workgroup adds: fine
        pk.atomic_add(out, pk.load(t, x, (0, 0)), (0, 0))
    elif HOW == "atomic+store":
        with pk.if_((pk.program_id(0) == 0) & (w == 0)):
            pk.store(out, pk.load(t, x, (0, 0)), (0, 0))
        with pk.if_(pk.program_id(0) == 1):
            pk.atomic_add(out, pk.load(t, x, (0, 0)), (0, 0))  # MARK-ww-atomic


@pytest.mark.parametrize("how, alias, marker, msg", [
    ("workgroups", False, "MARK-ww-wg", r"race on global tensor 'out': writes element \(0, 0\), "
                                        r"which workgroup \(0, 0, 0\), wave 0 writes in the "
                                        r"same launch.*\(workgroup \(1, 0, 0\), wave 0"),
    ("waves", False, "MARK-ww-waves", r"race on global tensor 'out': writes element \(0, 0\), "
                                      r"which workgroup \(0, 0, 0\), wave 0 writes"),
    ("shift", True, "MARK-ww-shift", r"race on global tensor 'x' \(also passed as 'out'\): "
                                     r"(reads|writes) element"),
    ("atomic+store", False, "MARK-ww-atomic", r"race on global tensor 'out': adds atomically "
                                              r"to element \(0, 0\), which workgroup "
                                              r"\(0, 0, 0\), wave 0 writes"),
])
def test_global_races_are_reported(how, alias, marker, msg):
    x = X(8, 256)
    out = x if alias else np.zeros_like(x)
    with pytest.raises(Race, match=msg) as e:
        pk.emulate(ww_k, x, out, grid=3, HOW=how)
    assert_names_line(e.value, HERE, f"# {marker}")


def test_ordered_writes_atomics_and_in_place_updates_are_not_races():
    x = X(8, 256)
    got = pk.emulate(ww_k, x, np.zeros_like(x), grid=1, HOW="ordered")["out"]
    assert np.array_equal(got[:4, :64], x[4:8, :64]) and np.all(got[4:] == 0)
    got = pk.emulate(ww_k, x, np.zeros_like(x), grid=3, HOW="atomic")["out"]
    assert np.allclose(got[:4, :64], 6 * x[:4, :64], rtol=1e-5)      # 3 workgroups x 2 waves
    res = pk.emulate(ww_k, x, x, grid=4, HOW="own")                  # one array, two names
    assert res["x"] is res["out"] and np.array_equal(res["out"], 2 * x)
    assert np.array_equal(x, X(8, 256))                               # inputs untouched


def test_in_place_library_kernel_matches_out_of_place():
    spec = KERNELS["scaled_add"]
    x, y = X(37, 100), X(37, 100, seed=2)
    grid, _ = spec.launch({"x": x}, "gfx950")
    res = pk.emulate(spec.kernel, x, y, x, 1.5, grid=grid, target="gfx950")
    assert np.allclose(res["out"], 1.5 * x + y) and res["x"] is res["out"]


def test_missing_barrier_is_named_as_such():
    @pk.kernel(num_waves=2)
    def k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((8, 64), pk.f32))
        w = pk.wave_id()
        pk.store(s, pk.load(pk.rt((4, 64), pk.f32), x, (w * 4, 0)), (w * 4, 0))
        pk.store(out, pk.load(pk.rt((4, 64), pk.f32), s, ((1 - w) * 4, 0)), (w * 4, 0))  # MARK-mb

    with pytest.raises(MissingBarrier, match=r"missing barrier: reads shared memory .* put "
                                             r"pk.barrier\(\) .* between the store and this "
                                             r"load") as e:
        pk.emulate(k, X(8, 64), X(8, 64), grid=1)
    assert isinstance(e.value, Race) and isinstance(e.value, UnwrittenRead)
    assert_names_line(e.value, HERE, "# MARK-mb")


# ---- pk.launch and the CUDA / HIP launchers (no GPU here: the checks run first) ------------

class FakeGPUTensor(conftest.FakeGPUTensor):
    """The stand-in GPU tensor, with the element count pk.launch reads (an empty tensor
    launches nothing)."""

    def numel(self):
        return int(np.prod(self.shape))


def G(shape, **kw):
    return FakeGPUTensor(shape, **kw)


LAUNCH = [
    ("numpy", lambda: pk.launch(copy2, X(), X(), 1.0, 1, grid=2),
     r"argument 'x' of copy2 is on the CPU; move it to the GPU with .to\('cuda'\); numpy "
     r"arrays run with pk.emulate"),
    ("plain function", lambda: pk.launch(plain, X(), grid=1),
     r"pk.launch takes a @pk.kernel, but 'plain' is a plain function"),
    ("x.t() on the GPU", lambda: pk.launch(copy2, G((16, 64), strides=(1, 16)),
                                           G((16, 64), ptr=0x7F0000100000), 1.0, 1, grid=2),
     r"argument 'x' of copy2 has stride 16 in its last dimension \(e.g. a transposed view\)"),
    ("GPU float64", lambda: pk.launch(copy2, G((16, 64), dtype="torch.float64"),
                                      G((16, 64), ptr=0x7F0000100000), 1.0, 1, grid=2),
     r"argument 'x' of copy2 has element type float64"),
    ("GPU float grid", lambda: pk.launch(copy2, G((16, 64)), G((16, 64), ptr=0x7F0000100000),
                                         1.0, 1, grid=(16 / 8 + 0.5,)),
     r"grid sizes must be ints, got 2.5"),
    ("GPU overlap", lambda: pk.launch(copy2, G((16, 64)), G((16, 64), ptr=0x7F0000000100),
                                      1.0, 1, grid=2),
     r"arguments 'x' and 'out' overlap in memory but are different views"),
    ("GPU int overflow", lambda: pk.launch(copy2, G((16, 64)), G((16, 64), ptr=0x7F0000100000),
                                           1.0, 2**40, grid=2),
     r"argument 'n' of copy2 = 1099511627776 does not fit i32"),
    ("GPU i32 sizes", lambda: pk.launch(copy2, G((2**16, 2**16)), G((16, 64),
                                                                    ptr=0x7F00000000000), 1.0, 1,
                                        grid=2),
     r"argument 'x' of copy2 has a size, stride or element offset of 2\^31 or more"),
]


@pytest.mark.parametrize("call, msg", [c[1:] for c in LAUNCH], ids=[c[0] for c in LAUNCH])
def test_launch_checks(call, msg):
    with pytest.raises(pk.KernelError, match=msg):
        call()


def test_launch_with_cpu_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(16, 64)
    with pytest.raises(ArgumentError, match=r"argument 'x' of copy2 is on the CPU; move it to "
                                            r"the GPU with .to\('cuda'\)"):
        pk.launch(copy2, x, torch.zeros(16, 64), 1.0, 1, grid=2)


@pytest.mark.parametrize("bound, msg", [
    ({"x": G((4, 8), strides=(1, 4))}, r"argument 'x' has stride 4 in its last dimension"),
    ({"x": G((4, 8), dtype="torch.float16")}, r"argument 'x' has element type f16 but the "
                                              r"kernel expects f32"),
    ({"x": G((4, 8), device=("cuda", 1))}, r"argument 'x' is on cuda:1 but the kernel is "
                                           r"loaded on cuda:0"),
    ({"x": G((4, 8)), "alpha": 1e40}, r"argument 'alpha' = 1e\+40 overflows f32"),
    ({"x": G((4, 8)), "n": 3.5}, r"argument 'n' must be an integer \(i32\), got 3.5"),
    ({"x": object()}, r"argument 'x' must be a torch tensor, not object"),
])
def test_cuda_launcher_uses_the_same_rules(bound, msg):
    from pykittens.ir import types as T
    from pykittens.ir.nodes import Param
    params = [Param("x", "gl", T.GlobalType(T.f32, (None, None))),
              Param("alpha", "scalar", T.ScalarType(T.f32)),
              Param("n", "scalar", T.ScalarType(T.i32))]
    with pytest.raises(ArgumentError, match=msg):
        rc.kernel_arg_values(params, {"alpha": 1.0, "n": 1, **bound}, device=0)


def test_cuda_block_and_grid_shapes():
    with pytest.raises(ValueError, match="block sizes must be ints, got 64.0"):
        rc.dims3((64.0,), "block")


HIP_IR = """
target triple = "amdgcn-amd-amdhsa"
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @scale(ptr addrspace(1) %x, i32 %x.size0, i32 %x.size1,
                                 i32 %x.stride0, i32 %x.stride1, float %alpha) #0 {
  %c = call i32 @llvm.amdgcn.workitem.id.x()
  %p = getelementptr float, ptr addrspace(1) %x, i32 %c
  %v = load float, ptr addrspace(1) %p
  %s = fmul float %v, %alpha
  store float %s, ptr addrspace(1) %p
  ret void
}
attributes #0 = { "amdgpu-flat-work-group-size"="64,64" }
"""


@pytest.mark.usefixtures("module_cache")
@pytest.mark.parametrize("x, grid, msg", [
    (G((64, 48), strides=(1, 64)), 4, r"argument 'x' has stride 64 in its last dimension"),
    (G((64, 48), strides=(-48, 1)), 4, r"argument 'x' has a negative stride"),
    (G((64, 48), device=("cpu", None)), 4, r"argument 'x' is on the CPU"),
    (G((64, 48), dtype="torch.float16"), 4, r"argument 'x' has element type f16"),
    (G((64, 48)), (2.5,), r"grid sizes must be ints, got 2.5"),
    (G((64, 48)), (0,), r"grid must be 1 to 3 positive sizes"),
])
def test_hip_launcher_checks_strides_and_grids(x, grid, msg):
    """ROCm launches check what the generated code assumes (unit last stride) before the
    HIP runtime is needed."""
    from pykittens.ir import types as T
    from pykittens.ir.nodes import Param
    from pykittens.runtime import hip
    from pykittens.toolchain import amdgpu
    obj = amdgpu.compile_ir(HIP_IR, "gfx942")
    params = [Param("x", "gl", T.GlobalType(T.f32, (None, None))),
              Param("alpha", "scalar", T.ScalarType(T.f32))]
    with pytest.raises(ArgumentError, match=msg):
        hip.launch(obj, "scale", params, {"x": x, "alpha": 2.0}, grid=grid, num_waves=1)


# ---- the library's launch helpers ------------------------------------------------------------

def Z(*shape):
    return np.zeros(shape, ml_dtypes.bfloat16)


LIB = [
    ("fwd rank", lambda: attention_fwd_launch({"q": Z(2, 64, 64), "k": Z(1, 2, 64, 64),
                                               "v": Z(1, 2, 64, 64)}, "sm_90a"),
     ValueError, r"attention: q must be a \(B, H, N, D\) array or tensor, got shape \(2, 64, 64\)"),
    ("fwd missing v", lambda: attention_fwd_launch({"q": Z(1, 2, 64, 64), "k": Z(1, 2, 64, 64)},
                                                   "sm_90a"),
     ValueError, r"attention: the inputs need 'v'"),
    ("fwd head dim", lambda: attention_fwd_launch({"q": Z(1, 2, 64, 96), "k": Z(1, 2, 64, 96),
                                                   "v": Z(1, 2, 64, 96)}, "gfx950"),
     ValueError, r"attention: head dim 96 is not supported; the kernels take 64 or 128"),
    ("fwd GQA", lambda: attention_fwd_launch({"q": Z(1, 6, 64, 64), "k": Z(1, 4, 64, 64),
                                              "v": Z(1, 4, 64, 64)}, "sm_90a"),
     ValueError, r"attention: 6 query heads are not a multiple of 4 key/value heads"),
    ("fwd batch", lambda: attention_fwd_launch({"q": Z(2, 2, 64, 64), "k": Z(1, 2, 64, 64),
                                                "v": Z(1, 2, 64, 64)}, "sm_90a"),
     ValueError, r"must agree in batch"),
    ("fwd k/v", lambda: attention_fwd_launch({"q": Z(1, 2, 64, 64), "k": Z(1, 2, 64, 64),
                                              "v": Z(1, 2, 32, 64)}, "gfx942"),
     ValueError, r"and k and v in shape"),
    ("cdna map", lambda: cdna_launch(1, 2, 64, 64, "gfx950", MAP="diagonal"),
     ValueError, r"attention: grid mapping 'diagonal' is not one of"),
    ("varlen rank", lambda: attention_fwd_varlen_launch(
        {"q": Z(1, 2, 64, 64), "k": Z(2, 64, 64), "v": Z(2, 64, 64),
         "cu_seqlens_q": np.array([0, 64]), "cu_seqlens_k": np.array([0, 64])}, "sm_90a"),
     ValueError, r"attention: q must be a \(H, total, D\) array or tensor"),
    ("varlen decreasing", lambda: attention_fwd_varlen_launch(
        {"q": Z(2, 64, 64), "k": Z(2, 64, 64), "v": Z(2, 64, 64),
         "cu_seqlens_q": np.array([0, 40, 30]), "cu_seqlens_k": np.array([0, 32, 64])},
        "sm_90a"),
     ValueError, r"cu_seqlens_q must be B \+ 1 >= 2 non-decreasing offsets"),
    ("varlen past the end", lambda: attention_fwd_varlen_launch(
        {"q": Z(2, 64, 64), "k": Z(2, 64, 64), "v": Z(2, 64, 64),
         "cu_seqlens_q": np.array([0, 64]), "cu_seqlens_k": np.array([0, 65])}, "gfx950"),
     ValueError, r"cu_seqlens_k must be B \+ 1 >= 2 non-decreasing offsets from 0 to at most 64"),
    ("varlen fractional", lambda: attention_fwd_varlen_launch(
        {"q": Z(2, 64, 64), "k": Z(2, 64, 64), "v": Z(2, 64, 64),
         "cu_seqlens_q": np.array([0, 31.5, 64]), "cu_seqlens_k": np.array([0, 32, 64])},
        "sm_90a"),
     ValueError, r"cu_seqlens_q must hold integer offsets"),
    ("varlen counts", lambda: attention_fwd_varlen_launch(
        {"q": Z(2, 64, 64), "k": Z(2, 64, 64), "v": Z(2, 64, 64),
         "cu_seqlens_q": np.array([0, 32, 64]), "cu_seqlens_k": np.array([0, 64])}, "sm_90a"),
     ValueError, r"hold 3 and 2 offsets; both must hold B \+ 1"),
    ("bwd atomic dQ on CDNA", lambda: attention_bwd_launch(
        {"q": Z(1, 2, 64, 64), "k": Z(1, 2, 64, 64)}, "gfx942", dq="atomic"),
     ValueError, r"dq='atomic' is not available on gfx942: .* use dq='pass'"),
    ("bwd mapping on CDNA", lambda: attention_bwd_launch(
        {"q": Z(1, 2, 64, 64), "k": Z(1, 2, 64, 64)}, "gfx950", MAP="diagonal"),
     ValueError, r"grid mapping 'diagonal' is not one of"),
    ("bwd heads on CDNA", lambda: attention_bwd_launch(
        {"q": Z(1, 3, 64, 64), "k": Z(1, 2, 64, 64)}, "gfx950"),
     ValueError, r"3 query heads are not a multiple of 2 key/value heads"),
    ("bwd head dim", lambda: attention_bwd_launch({"q": Z(1, 2, 64, 32), "k": Z(1, 2, 64, 32)},
                                                  "sm_90a"),
     ValueError, r"attention backward: head dim 32 is not supported"),
    ("bwd dq", lambda: attention_bwd_launch({"q": Z(1, 2, 64, 64), "k": Z(1, 2, 64, 64)},
                                            "sm_90a", dq="fast"),
     ValueError, r"attention backward: dq='fast'; choose one of"),
    ("bwd rank", lambda: attention_bwd_launch({"q": Z(2, 64, 64), "k": Z(1, 2, 64, 64)},
                                              "sm_90a"),
     ValueError, r"attention: q must be a \(B, H, N, D\)"),
    ("gemm_ws K", lambda: gemm_ws_launch({"a": Z(128, 100), "b": Z(128, 100)}, "sm_90a"),
     ValueError, r"gemm_ws copies A and B by TMA: each stored row of A must be a multiple "
                 r"of 16 bytes, got K = 100 \(200 bytes\); pad K"),
    ("gemm_sk nothing to split", lambda: KERNELS["gemm_sk"].launch(
        {"a": Z(128 * 132, 64), "b": Z(128, 64)}, "sm_90a"),
     ValueError, r"gemm_sk splits nothing of a 16896 x 128 x 64 product \(its blocks fill "
                 r"whole rounds of the grid\); use gemm_ws"),
    ("layernorm TMA", lambda: ln_tma_consts(9000), ValueError,
     r"the TMA schedule stages at most 8192 columns, not 9000"),
    ("unknown target", lambda: attention_fwd_launch({"q": Z(1, 2, 64, 64),
                                                     "k": Z(1, 2, 64, 64),
                                                     "v": Z(1, 2, 64, 64)}, "sm_80"),
     ValueError, r"unknown target 'sm_80'"),
]


@pytest.mark.parametrize("call, exc, msg", [c[1:] for c in LIB], ids=[c[0] for c in LIB])
def test_library_launch_helpers(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_library_kernel_with_a_float64_array():
    spec = KERNELS["softmax"]
    with pytest.raises(ArgumentError, match=r"argument 'x' of softmax has element type float64"):
        pk.emulate(spec.kernel, X(dtype=np.float64), X(), grid=1)


# ---- pykittens.ops.attention ----------------------------------------------------------------

def _attention_cases():
    torch = pytest.importorskip("torch")
    bf = torch.bfloat16

    def T(*shape, dtype=bf, device="cpu"):
        return torch.zeros(*shape, dtype=dtype, device=device)

    q = T(1, 16, 2, 64)
    return [
        ("list", lambda: ([q], q, q), {}, TypeError, r"attention: q must be a torch.Tensor, "
                                                     r"not list"),
        ("rank", lambda: (T(16, 2, 64), q, q), {}, ValueError,
         r"attention: q must be \(batch, seq, heads, head_dim\), got 3 dims"),
        ("float32", lambda: (q.float(), q.float(), q.float()), {}, TypeError,
         r"attention: q is torch.float32; the kernels take bfloat16 or float16"),
        ("stride", lambda: (T(1, 16, 64, 2).transpose(2, 3), q, q), {}, ValueError,
         r"attention: q needs a unit stride in its last dim \(head dim\); pass .contiguous\(\)"),
        ("dtypes", lambda: (q, q.half(), q.half()), {}, TypeError,
         r"attention: q, k, v must share one dtype"),
        ("devices", lambda: (q, T(1, 16, 2, 64, device="meta"), T(1, 16, 2, 64, device="meta")),
         {}, ValueError, r"attention: q, k, v are on cpu, meta, meta; put them on one device"),
        ("k and v", lambda: (q, q, T(1, 8, 2, 64)), {}, ValueError,
         r"attention: k \(1, 16, 2, 64\) and v \(1, 8, 2, 64\) differ"),
        ("batch", lambda: (T(2, 16, 2, 64), q, q), {}, ValueError,
         r"must agree in batch and head dim"),
        ("head dim", lambda: (T(1, 16, 2, 96), T(1, 16, 2, 96), T(1, 16, 2, 96)), {},
         ValueError, r"attention: head dim 96 is not supported"),
        ("GQA", lambda: (T(1, 16, 3, 64), q, q), {}, ValueError,
         r"attention: 3 query heads are not a multiple of 2 key/value heads"),
        ("no kv heads", lambda: (q, T(1, 16, 0, 64), T(1, 16, 0, 64)), {}, ValueError,
         r"attention: 2 query heads are not a multiple of 0"),
        ("scale negative", lambda: (q, q, q), {"scale": -0.1}, ValueError,
         r"attention: scale must be a positive finite number, got -0.1"),
        ("scale nan", lambda: (q, q, q), {"scale": float("nan")}, ValueError,
         r"scale must be a positive finite number, got nan"),
        ("scale str", lambda: (q, q, q), {"scale": "0.125"}, TypeError,
         r"attention: scale must be a number \(or None for 1/sqrt\(head_dim\)\), not str"),
        ("causal", lambda: (q, q, q), {"causal": "yes"}, TypeError,
         r"attention: causal must be True or False, not 'yes'"),
    ]


ATTN_IDS = ["list", "rank", "float32", "stride", "dtypes", "devices", "k and v", "batch",
            "head dim", "GQA", "no kv heads", "scale negative", "scale nan", "scale str",
            "causal"]


@pytest.mark.parametrize("case", ATTN_IDS)
def test_attention_op_checks(case):
    from pykittens.ops import attention
    (name, args, kw, exc, msg), = [c for c in _attention_cases() if c[0] == case]
    with pytest.raises(exc, match=msg):
        attention(*args(), **kw)


# ---- the command line --------------------------------------------------------------------------

def _file(tmp_path, name, body):
    f = tmp_path / name
    f.write_text(textwrap.dedent(body))
    return str(f)


SPEC_SRC = '''
import numpy as np
import pykittens as pk
from pykittens.kernels import KernelSpec

@pk.kernel
def double(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    pk.store(out, pk.load(pk.rt((4, 64), pk.f32), x, (0, 0)) * 2.0, (0, 0))

@pk.kernel
def racy(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    pk.store(out, pk.load(pk.rt((4, 64), pk.f32), x, (0, 0)), (0, 0))

def inputs(s, d, rng):
    return {"x": rng.standard_normal(s).astype(np.float32), "out": np.zeros(s, np.float32)}

ONE = KernelSpec("double", double, inputs, lambda i: {"out": 2.0 * i["x"]},
                 lambda i, t: ((1,), {}), ("out",), shapes=((4, 64),))
NONE = KernelSpec("double", double, inputs, lambda i: {"out": 2.0 * i["x"]},
                  lambda i, t: ((1,), {}), ("out",))
RACY = KernelSpec("racy", racy, inputs, lambda i: {"out": i["x"]},
                  lambda i, t: ((2,), {}), ("out",), shapes=((4, 64),))
FLOATGRID = KernelSpec("double", double, inputs, lambda i: {"out": 2.0 * i["x"]},
                       lambda i, t: ((4 / 4,), {}), ("out",), shapes=((4, 64),))

def not_decorated(x: pk.gl[pk.f32, 2]):
    pass

def broken_inputs(s, d, rng):
    return {"x": np.zeros(s[5])}

BROKEN = KernelSpec("double", double, broken_inputs, lambda i: {"out": 2.0 * i["x"]},
                    lambda i, t: ((1,), {}), ("out",), shapes=((4, 64),))
'''

CLI = [
    ("no command", [], 2, r"pykittens: error: the following arguments are required"),
    ("unknown kernel", ["compile", "nope", "--target", "gfx942"], 2,
     r"pykittens: error: unknown kernel 'nope': use one of scaled_add"),
    ("missing target", ["compile", "softmax"], 2,
     r"pykittens compile: error: the following arguments are required: --target"),
    ("bad target", ["compile", "softmax", "--target", "gfx999"], 2,
     r"argument --target: invalid choice: 'gfx999'"),
    ("bad stage", ["compile", "softmax", "--target", "gfx942", "--emit", "ptx"], 2,
     r"argument --emit: invalid choice: 'ptx'"),
    ("-D without =", ["compile", "softmax", "--target", "gfx942", "-D", "oops"], 2,
     r"-D takes NAME=VALUE, got 'oops'"),
    ("-D without name", ["compile", "softmax", "--target", "gfx942", "-D", "=3"], 2,
     r"-D takes NAME=VALUE, got '=3'"),
    ("-D float64", ["compile", "softmax", "--target", "gfx942", "-D", "DT=float64"], 1,
     r"softmax.py:\d+: \[kernel softmax\] compile-time constant DT='float64'"),
    ("-D unknown", ["compile", "softmax", "--target", "gfx942", "-D", "NOPE=1"], 1,
     r"unknown compile-time constant\(s\) \['NOPE'\]"),
    ("shape rank", ["emulate", "layernorm", "--target", "gfx942", "--shape", "37"], 2,
     r"--shape for layernorm takes 2 sizes \(e.g. --shape 16 64\), got 1"),
    ("shape zero", ["emulate", "layernorm", "--target", "gfx942", "--shape", "0", "300"], 2,
     r"--shape sizes must be >= 1, got 0 300"),
    ("shape negative", ["emulate", "softmax", "--target", "gfx942", "--shape", "-4", "300"], 2,
     r"--shape sizes must be >= 1"),
    ("shape text", ["emulate", "softmax", "--target", "gfx942", "--shape", "4x300"], 2,
     r"argument --shape: invalid int value: '4x300'"),
    ("dtype name", ["emulate", "softmax", "--target", "gfx942", "--dtype", "fp32"], 2,
     r"--dtype 'fp32' is not an element type: softmax takes f32 or bf16"),
    ("dtype of kernel", ["emulate", "softmax", "--target", "gfx942", "--dtype", "f16"], 2,
     r"softmax is checked for --dtype f32 or bf16, not f16"),
    ("Hopper kernel on CDNA", ["emulate", "gemm_ws", "--target", "gfx942"], 2,
     r"gemm_ws runs on sm_90a only, not gfx942; pick --target sm_90a"),
    ("Hopper compile on CDNA", ["compile", "tma_scale", "--target", "gfx950"], 2,
     r"tma_scale runs on sm_90a only, not gfx950"),
    ("isa on Hopper", ["emulate", "softmax", "--target", "sm_90a", "--isa"], 2,
     r"--isa runs AMD code objects: softmax on gfx942/gfx950, not sm_90a"),
    ("seed", ["emulate", "softmax", "--target", "gfx942", "--seed", "x"], 2,
     r"argument --seed: invalid int value: 'x'"),
    ("negative seed", ["emulate", "softmax", "--target", "gfx942", "--seed", "-1"], 1,
     r"pykittens: error: .*negative"),
    ("chiplet shape", ["chiplet", "--op", "gemm", "--shape", "1", "2"], 2,
     r"pykittens chiplet: error: "),
    ("chiplet tile", ["chiplet", "--op", "gemm", "--shape", "64", "64", "64", "--tile", "1"], 2,
     r"--tile for gemm takes 3 sizes"),
    ("chiplet mapping", ["chiplet", "--op", "gemm", "--shape", "64", "64", "64", "--mapping",
                         "zigzag"], 2, r"pykittens chiplet: error: "),
    ("missing file", ["emulate", "/no/such/file.py:SPEC", "--target", "gfx942"], 2,
     r"no such file: /no/such/file.py"),
]


@pytest.mark.parametrize("argv, code, msg", [c[1:] for c in CLI], ids=[c[0] for c in CLI])
def test_cli_mistakes(argv, code, msg, capsys):
    assert main(argv) == code
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and cap.err.endswith("\n"), cap.err
    assert "Traceback" not in cap.err
    assert re.search(msg, cap.err), cap.err


USER_CLI = [
    ("bare kernel", ["emulate", "{f}:double", "--target", "sm_90a"], 2,
     r"{f}:double is a bare kernel: emulate needs a KernelSpec"),
    ("no such name", ["emulate", "{f}:NOPE", "--target", "sm_90a"], 2,
     r"{f} has no pk.kernel or KernelSpec named 'NOPE'"),
    ("plain function", ["compile", "{f}:not_decorated", "--target", "sm_90a"], 2,
     r"{f}:not_decorated is a plain function: decorate it with @pk.kernel"),
    ("no shapes", ["emulate", "{f}:NONE", "--target", "gfx950"], 2,
     r"double lists no shapes: give --shape"),
    ("race", ["emulate", "{f}:RACY", "--target", "gfx950"], 1,
     r"race on global tensor 'out'"),
    ("float grid", ["emulate", "{f}:FLOATGRID", "--target", "gfx950"], 1,
     r"grid sizes must be ints, got 1.0"),
    ("error in the spec", ["emulate", "{f}:BROKEN", "--target", "gfx950"], 1,
     r"pykittens: error: {f}:\d+: IndexError: tuple index out of range"),
    ("syntax error", ["compile", "{bad}:k", "--target", "gfx942"], 2,
     r"could not load {bad}:3: SyntaxError"),
    ("error on import", ["compile", "{boom}:k", "--target", "gfx942"], 2,
     r"could not load {boom}:2: ZeroDivisionError: division by zero"),
]


@pytest.mark.parametrize("argv, code, msg", [c[1:] for c in USER_CLI],
                         ids=[c[0] for c in USER_CLI])
def test_cli_user_file_mistakes(argv, code, msg, tmp_path, capsys):
    files = {"f": _file(tmp_path, "mine.py", SPEC_SRC),
             "bad": _file(tmp_path, "bad.py", "import pykittens as pk\n\ndef k(:\n"),
             "boom": _file(tmp_path, "boom.py", "import pykittens as pk\nX = 1 / 0\n")}
    argv = [a.format(**files) for a in argv]
    assert main(argv) == code
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "Traceback" not in cap.err, cap.err
    assert re.search(msg.format(**{k: re.escape(v)
                                                 for k, v in files.items()}), cap.err), cap.err


def test_cli_defaults_that_used_to_fail(tmp_path, capsys):
    """`pykittens emulate gemm_basic` (its first dtype by default) and a KernelSpec with one
    shape run without options."""
    assert main(["emulate", "gemm_basic", "--target", "gfx942"]) == 0
    assert "gemm_basic gfx942 bf16" in capsys.readouterr().out
    f = _file(tmp_path, "mine.py", SPEC_SRC)
    assert main(["emulate", f"{f}:ONE", "--target", "sm_90a"]) == 0
    assert "shape=(4, 64)" in capsys.readouterr().out


def _cli(*argv, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYKITTENS_TRACEBACK", None)
    return subprocess.Popen([sys.executable, "-m", "pykittens.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_cli_process_mistake_is_one_line_and_a_status():
    p = _cli("emulate", "layernorm", "--target", "gfx942", "--shape", "37")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and out == b""
    assert err.decode() == ("pykittens: error: --shape for layernorm takes 2 sizes (e.g. "
                            "--shape 16 64), got 1\n")


def test_cli_output_into_a_closed_pipe_ends_quietly():
    """`pykittens compile ... --emit llvm | head -1`: the reader goes away early."""
    p = _cli("compile", "layernorm", "--target", "sm_90a", "--emit", "llvm")
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=300)
    assert first.startswith(b";") or first.strip()
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert p.returncode != 0 and err.count(b"\n") <= 1
