"""Whole kernels run from their code objects: every library kernel that targets CDNA, at
small ragged shapes on gfx942 and gfx950, against its float64 reference and the lane
emulator (bitwise where no matrix instruction is involved: both compute the same f32
operations in the same order); the docs' CDNA examples likewise; the `isa=True` and
`--isa` entry points."""
import os

import numpy as np
import pytest

import pykittens as pk
from pykittens import isa
from pykittens.cli import main
from pykittens.ir import types as T
from pykittens.kernels import KERNELS
from pykittens.kernels.spec import rel_err
from conftest import ROOT, needs_amd_llvm, run_doc_blocks

CDNA = ("gfx942", "gfx950")
# (kernel, dtype, shape): each on both chips, C-order rows or rows padded to 16 elements
# (which switches the build to aligned vector accesses where the shape did not allow it)
CASES = [(n, dt, s, i % 2 == 1) for n, spec in sorted(KERNELS.items()) if "gfx942" in spec.targets
         for i, (dt, s) in enumerate((dt, s) for s in spec.shapes for dt in spec.dtypes)]
MMA = {"gemm_basic", "gemm_pingpong"}


def run_both(spec, dt, shape, target, pad, seed=0):
    rng = np.random.default_rng(seed)
    inputs = spec.poison(spec.make_inputs(shape, T.dtype_of(dt), rng))   # unwritten: NaN
    grid, consts = spec.launch(inputs, target)
    got = isa.emulate(spec.kernel, grid=grid, target=target, pad_rows=pad, **inputs, **consts)
    lane = pk.emulate(spec.kernel, grid=grid, target=target, **inputs, **consts)
    return inputs, got, lane, spec.reference(inputs)


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("name,dt,shape,pad", CASES,
                         ids=[f"{n}-{d}-{'x'.join(map(str, s))}{'-padded' if p else ''}"
                              for n, d, s, p in CASES])
def test_library_kernel_from_its_code_object(name, dt, shape, pad, target):
    spec = KERNELS[name]
    inputs, got, lane, ref = run_both(spec, dt, shape, target, pad)
    for o in spec.outputs:
        assert rel_err(spec.value(o, got[o]), ref[o]) <= spec.tolerance(dt), o
        if name in MMA:
            assert rel_err(got[o], lane[o].astype(np.float64)) < 1e-6
        else:
            assert np.array_equal(got[o].view(np.uint8), lane[o].view(np.uint8)), o
    for k, v in inputs.items():                    # inputs come back unmodified
        if isinstance(v, np.ndarray) and k not in spec.outputs:
            assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8))


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("name,shape", [("layernorm", (8, 2048)), ("softmax", (8, 2048)),
                                        ("rmsnorm_bwd", (19, 2048))])
def test_exact_rows_from_their_code_objects(target, name, shape):
    """Rows that fill their windows (EXACT=1: the code checks no bounds), from the code
    object: against float64 and, bitwise, the lane emulator (which checks the promise); the
    backward walks fewer workgroups than rows, each its own number of steps."""
    spec = KERNELS[name]
    inputs, got, lane, ref = run_both(spec, "bf16", shape, target, False)
    assert spec.launch(inputs, target)[1].get("EXACT") == 1
    for o in spec.outputs:
        assert rel_err(spec.value(o, got[o]), ref[o]) <= spec.tolerance("bf16"), o
        assert np.array_equal(got[o].view(np.uint8), lane[o].view(np.uint8)), o


@pytest.mark.parametrize("target", CDNA)
def test_dispatch_state(target):
    """Workgroup ids (the SGPRs after the user SGPRs) and pk.num_programs, which the code
    reads from the code-object-v5 hidden arguments (hidden_block_count_*) the dispatch
    writes after the explicit ones."""
    from test_emulator import ids_k
    gx, gy, gz = 3, 2, 2
    got = pk.emulate(ids_k, np.full((gz, gy, gx * 8, 64), -1, np.int32), grid=(gx, gy, gz),
                     target=target, num_waves=1, isa=True)["out"]
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                vals = got[z, y, 8 * x:8 * x + 8]
                assert np.all(vals == np.array([x, y, z, gx, gy, gz, 0, 1])[:, None])


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("name", ["bf16", "f16", "i8", "i32"])
def test_casts_from_the_code_object(target, name):
    """pk.cast of f32 in registers (tests/test_emulator.py's cast kernel, ragged grid), from
    the code object against numpy's conversions: round to nearest even (ties included),
    integers saturate."""
    from test_emulator import M, N, cast_k, grid_2d, ref_cast
    x = (np.random.default_rng(7).standard_normal((M, N)) * 200).astype(np.float32)
    x[:2, :8] = [[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e10, -1e10],
                 [126.5, 127.5, -128.5, -129.5, 2.7, -2.7, 3.5, 4.5]]
    got = isa.emulate(cast_k, x, np.full((M, N), np.nan, np.float32), grid=grid_2d(M, N),
                      target=target, MID=name)["out"]
    with np.errstate(over="ignore"):                  # 1e10 -> f16: inf
        want = ref_cast(x, name) if name != "i32" else \
            np.clip(np.rint(x.astype(np.float64)), -2**31, 2**31 - 1).astype(np.int32)
    assert np.array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("dt,sw,lay", [("f32", 0, "row"), ("bf16", 4, "col"),
                                       ("bf16", 8, "row"), ("f32", 8, "col")])
def test_shared_tiles_from_the_code_object(target, dt, sw, lay):
    """tests/test_emulator.py's shared-tile round trip (whole-workgroup copy in, per-wave
    reads and writes, copy out; ragged against the tile) with swizzled tiles, f32 rows of
    two 128-byte column blocks included: numpy's expected values, from the code object."""
    from test_emulator import shared_k
    npd = T.DTYPES[dt].np
    m, n = 50, 40
    x = np.random.default_rng(2).standard_normal((m, n)).astype(npd)
    got = isa.emulate(shared_k, x, np.full((m, n), np.nan, np.float32),
                      np.full((m, n), np.nan, npd), grid=2, target=target, SW=sw, LAY=lay,
                      FILL=7.0)
    assert np.array_equal(got["out"], 2 * x.astype(np.float32))
    xp = np.full((64, 64), 7.0)
    xp[:m, :n] = x.astype(np.float64)
    ref = np.concatenate([xp[32 * b + 8 * (3 - w):32 * b + 8 * (4 - w)]
                          for b in range(2) for w in range(4)]) + 1
    assert np.array_equal(got["back"].astype(np.float64),
                          ref[:m, :n].astype(npd).astype(np.float64))


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("sw", [0, 8])
def test_direct_to_lds_from_the_code_object(target, sw):
    """tests/test_codegen.py's memory -> LDS DMA (4 waves, a 64 x 64 bf16 tile, plain and
    128B-swizzled), from the code object: each lane's chunk lands at the wave's LDS base +
    lane * bytes, so the tile read back must be the tensor. 50 columns: the ordinary path."""
    from test_codegen import _direct
    rng = np.random.default_rng(5)
    for shape in ((128, 64), (100, 50)):
        x = rng.standard_normal(shape).astype(pk.bf16.np)
        got = isa.emulate(_direct, x, np.zeros_like(x), grid=(-(-shape[0] // 64),),
                          target=target, SW=sw)["out"]
        assert np.array_equal(got.view(np.uint16), x.view(np.uint16))


@pytest.mark.parametrize("target", CDNA)
def test_pinned_gemm_example(target):
    """docs/examples/pinned_gemm.py at K = 96. Its MFMAs are inline asm, which LLVM's
    hazard recognizer does not see, so the renderer places their wait states itself: the
    code object has no hazard on either chip and runs from the code object with the
    dynamic checks on. The same listing with the renderer's s_nops taken out has the read
    of the accumulator too close to the loop's last MFMA (on gfx942 7 wait states where 11
    are needed), which the static check reports (on gfx950 LLVM's own instructions happen
    to fill the gaps)."""
    import runpy
    from pykittens import compiler
    pinned_gemm = runpy.run_path(os.path.join(ROOT, "docs/examples/pinned_gemm.py"))["pinned_gemm"]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 96)).astype(pk.bf16.np)
    bt = rng.standard_normal((32, 96)).astype(pk.bf16.np)
    args = (a, bt, np.zeros((32, 32), np.float32))
    ref = a.astype(np.float64) @ bt.astype(np.float64).T
    asm = compiler.assembly(pinned_gemm, target)
    assert isa.check_hazards(asm, target) == []
    c = pk.emulate(pinned_gemm, *args, grid=1, target=target, isa=True)["c"]
    assert rel_err(c, ref) < 1e-6
    bare = "\n".join(ln for ln in asm.split("\n") if not ln.strip().startswith("s_nop"))
    found = isa.check_hazards(bare, target)
    if target == "gfx942":                   # the renderer's s_nops are what keeps it clean
        assert ("v_accvgpr_read_b32", "a0", "xdl-write-read") in {
            (v.consumer.split(" at ")[0], v.register, v.rule) for v in found}
        assert min(v.actual for v in found if v.rule == "xdl-write-read") == 7


@pytest.mark.parametrize("doc", ["docs/language.md", "docs/targets/cdna.md"])
def test_docs_cdna_examples_agree(doc, monkeypatch):
    """Every python block of the guide runs as usual; each CDNA kernel it emulates also
    runs from its code object and must give the lane emulator's result."""
    monkeypatch.chdir(ROOT)
    lane_emulate = pk.emulate
    seen = []

    def both(kernel, *args, grid, target="gfx950", **kw):
        res = lane_emulate(kernel, *args, grid=grid, target=target, **kw)
        if target in CDNA and not kw.get("isa"):
            try:
                got = isa.emulate(kernel, *args, grid=grid, target=target, **kw)
            except pk.NotSupportedYet:           # no code object for this kernel yet
                return res
            for k, v in res.items():
                if not np.array_equal(got[k].view(np.uint8), v.view(np.uint8)):
                    a, b = got[k].astype(np.float64), v.astype(np.float64)
                    inf = np.isinf(b)                # e.g. LSE of rows that see no key
                    assert np.array_equal(a[inf], b[inf]), (kernel.name, k)
                    assert rel_err(a[~inf], b[~inf]) < 1e-6, (kernel.name, k)
            seen.append(kernel.name)
        return res

    monkeypatch.setattr(pk, "emulate", both)
    run_doc_blocks(os.path.join(ROOT, doc), "isa_docs")
    assert seen


@needs_amd_llvm          # through the CLI, which reports the missing tool as exit status 1
def test_isa_entry_points_and_errors(capsys):
    spec = KERNELS["softmax"]
    assert main(["emulate", "softmax", "--target", "gfx950", "--dtype", "bf16", "--shape", "5",
                 "70", "--isa"]) == 0
    assert "softmax gfx950 (code object, ISA emulator) bf16 shape=(5, 70) out" in \
        capsys.readouterr().out
    assert main(["emulate", "softmax", "--target", "sm_90a", "--isa"]) == 2
    assert "--isa runs AMD code objects: softmax on gfx942/gfx950, not sm_90a" in \
        capsys.readouterr().err
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match="the ISA emulator runs AMD code objects .gfx942, "
                                         "gfx950., not sm_90a"):
        pk.emulate(spec.kernel, x, x, grid=1, target="sm_90a", isa=True, DT="f32")
    with pytest.raises(pk.KernelError, match="has element type bf16 but the kernel expects f32"):
        pk.emulate(spec.kernel, x.astype(pk.bf16.np), x, grid=1, target="gfx950", isa=True,
                   DT="f32")
    with pytest.raises(ValueError, match="grid must be 1 to 3 positive sizes"):
        pk.emulate(spec.kernel, x, x, grid=(0,), target="gfx950", isa=True)
