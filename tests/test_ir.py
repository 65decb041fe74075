"""Tile IR: element and value types, errors, the printer, the verifier's resource facts."""
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.ir import types as T
from pykittens.ir.errors import KernelError, NotSupportedYet
from pykittens.ir.nodes import Block, Loc, Op, Value, walk
from pykittens.ir.printer import format_block, format_kernel
from pykittens.ir.verify import verify
from pykittens.targets import get


def test_dtypes():
    assert list(T.DTYPES) == ["f32", "bf16", "f16", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz",
                              "e8m0", "e2m1x2", "e2m3p", "e3m2p", "i8", "i32"]
    assert (T.e2m1x2.bytes, T.e2m1x2.packed, T.e2m1x2.is_fp8) == (1, 2, False)
    for fp6 in (T.e2m3p, T.e3m2p):                  # four values in three bytes
        assert (fp6.bytes, fp6.packed * 3, fp6.is_fp8) == (1, 4, False)
    assert pk.e2m3p is T.e2m3p and pk.e3m2p is T.e3m2p
    assert [(d.bits, d.bytes, d.is_float, d.is_fp8) for d in (T.f32, T.bf16, T.e4m3, T.i8)] == \
        [(32, 4, True, False), (16, 2, True, False), (8, 1, True, True), (8, 1, False, False)]
    assert pk.f32 is T.f32 and pk.e4m3fnuz is T.e4m3fnuz


@pytest.mark.parametrize("spec, want", [
    (T.bf16, T.bf16), ("f16", T.f16), (np.float32, T.f32), (np.dtype("int8"), T.i8),
    (ml_dtypes.bfloat16, T.bf16), (ml_dtypes.float8_e4m3fn, T.e4m3),
    (ml_dtypes.float8_e5m2fnuz, T.e5m2fnuz), ("torch.bfloat16", T.bf16),
    ("float8_e4m3fnuz", T.e4m3fnuz), ("int32", T.i32),
    (np.uint8, T.e2m1x2), ("torch.float4_e2m1fn_x2", T.e2m1x2),    # FP4 pairs' storage
])
def test_dtype_of(spec, want):
    assert T.dtype_of(spec) is want


def test_uint8_arrays_hold_any_packed_format():
    """An uint8 array is FP4 pairs unless the kernel's DT says FP6: the storage matches any
    packed format, and nothing else."""
    assert T.dtype_of(np.uint8) is T.e2m1x2 and T.dtype_of("e2m3p") is T.e2m3p
    assert T.same_storage(T.e2m1x2, T.e3m2p) and T.same_storage(T.e2m3p, T.e2m1x2)
    assert not T.same_storage(T.e2m1x2, T.e4m3) and not T.same_storage(T.i8, T.e2m3p)


@pytest.mark.parametrize("bad", [np.float64, "f64", np.uint16, object()])
def test_dtype_of_rejects(bad):
    with pytest.raises(TypeError, match="unsupported element type"):
        T.dtype_of(bad)


def test_fp8_max():
    assert [T.fp8_max(d) for d in (T.e4m3, T.e5m2, T.e4m3fnuz, T.e5m2fnuz)] == \
        [448.0, 57344.0, 240.0, 57344.0]


def test_value_type_strings():
    rt = T.RegTileType(T.f32, (16, 32), "col", "acc", ("a", 0))
    assert str(rt) == "rt<f32>[16x32,col,acc] @a0"
    assert str(T.RegVecType(T.f32, T.RegTileType(T.f32, (4, 64)), "row")) == \
        "rv<f32>[4,row of rt<f32>[4x64,row]]"
    assert str(T.SharedTileType(T.bf16, (64, 64), 8)) == "st<bf16>[64x64,swz8]"
    assert str(T.GlobalType(T.i8, (None, 128))) == "gl<i8>[?,128]"
    assert str(T.ScalarType(T.i32)) == "i32"
    assert T.is_tile(rt) and not T.is_tile(T.ScalarType(T.i32))
    assert T.RegVecType(T.f32, rt, "col").length == 32


def test_kernel_error_format():
    e = KernelError("bad thing", Loc("/x/k.py", 12), "gemm")
    assert str(e) == "/x/k.py:12: [kernel gemm] bad thing"
    assert (e.message, e.loc.line, e.kernel) == ("bad thing", 12, "gemm")
    assert str(KernelError("plain")) == "plain"
    assert issubclass(NotSupportedYet, KernelError)


def test_walk_and_format_block():
    inner = Block([Op("barrier")])
    v = Value(T.ScalarType(T.i32), "i")
    root = Block([Op("const", v, attrs={"value": 3}, loc=Loc("f.py", 7)),
                  Op("for", Value(T.ScalarType(T.i32), "j"), (v, v), {"step": 1}, [inner])])
    assert [op.kind for op in walk(root)] == ["const", "for", "barrier"]
    lines = format_block(root)
    assert lines[0] == f"  %i{v.id}: i32 = const() {{value=3}}   # line 7"
    assert lines[2:] == ["  {", "    barrier()", "  }"]


@pk.kernel(num_waves=4)
def resources(x: pk.gl[pk.bf16, 2], out: pk.gl[pk.f32, 2], N: pk.const = 4):
    a = pk.empty(pk.st((64, 64), pk.bf16))          # 8 KiB
    b = pk.empty(pk.st((16, 64), pk.f32))           # 4 KiB
    pk.load(a, x)
    acc = pk.zeros(pk.rt((32, 64), pk.f32))         # 32 regs per lane on a 64-lane wave
    for j in pk.range(N):
        t = pk.load(pk.rt((32, 64), pk.f32), a, (0, 0))   # 32 more, live inside the loop
        acc += t
    pk.store(b, pk.load(pk.rt((16, 64), pk.f32), x))
    pk.store(out, acc)


def test_verify_resource_facts():
    k = resources.specialize()
    facts = verify(k, get("gfx942"))
    assert facts["lds_bytes"] == 64 * 64 * 2 + 16 * 64 * 4
    # acc (32) and the loop's tile (32) are live together; the zeros' const is scalar
    assert facts["tile_registers"] == 64
    assert verify(k, get("sm_90a"))["tile_registers"] == 128    # 32 lanes: twice the slots


def test_format_kernel_header_and_body():
    text = format_kernel(resources.specialize(N=2))
    first = text.splitlines()[0]
    assert first == ("kernel resources(x: gl<bf16>[?,?], out: gl<f32>[?,?]) num_waves=4 "
                     "[N=2] {")
    assert text.endswith("}")
    assert text.count("for(") == 1 and "st<bf16>[64x64]" in text and "st<f32>[16x64]" in text
