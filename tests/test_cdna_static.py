"""CI's static checks on real CDNA code objects (compiler.code_object: AMD's LLVM, then ld.lld)
for gfx942 and gfx950: no scratch or spills, MFMAs in the main loop, pinned registers in the
ISA, ping-pong priorities and barriers in the loop, and clear errors before LLVM runs.

Code objects come from the toolchain's disk cache after the first run."""
import os

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.analysis import hsaco
from pykittens.ir.nodes import walk
from pykittens.kernels import KERNELS
from pykittens.toolchain import amdgpu
from conftest import ROOT, assert_names_line, line_of, run_doc_blocks

CDNA = ("gfx942", "gfx950")


def build(kernel, target, **consts):
    """(code object, report, instructions, main loop) of one kernel."""
    obj = compiler.code_object(kernel, target, **consts)
    rep = hsaco.report(obj, target, num_waves=compiler.tile_ir(kernel, target,
                                                                  **consts).num_waves)
    insts, labels = hsaco.instructions(amdgpu.disassemble(obj, target), rep["kernel"])
    return obj, rep, insts, hsaco.main_loop(insts, labels)


def text(inst) -> str:
    op, arg = inst
    return f"{op} {arg}".strip()


def uses_mma(kernel, target, **consts) -> bool:
    return any(op.kind == "mma" for op in walk(compiler.tile_ir(kernel, target, **consts).body))


# ---- the library ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,target", [(n, t) for n in sorted(KERNELS) for t in CDNA
                                         if t in KERNELS[n].targets])
def test_library_kernel_has_no_spills_and_mfma_in_its_main_loop(name, target):
    spec = KERNELS[name]
    obj, rep, insts, loop = build(spec.kernel, target, **spec.compile_consts)
    assert hsaco.code_object_version(obj) == rep["code_object_version"] == 5
    assert rep["scratch_bytes"] == 0
    assert (rep["vgpr_spill"], rep["sgpr_spill"]) == (0, 0), rep
    mma = uses_mma(spec.kernel, target, **spec.compile_consts)
    assert mma or name != "gemm_basic", "the basic GEMM issues no mma"
    if mma:
        assert loop is not None and rep["loop_mfma"] == loop.mfma(insts) > 0, rep
    else:
        assert rep["agpr"] == 0, rep       # without MFMAs, AGPRs would be VGPR spill space


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("name", ["layernorm", "softmax"])
def test_exact_rows_drop_the_edge_code(target, name):
    """Rows of exactly the held width (EXACT=1, windows promised inside): the code object
    holds the vector accesses alone: under half the instructions of the checked build,
    no more VGPRs, no scratch, and as many waves a SIMD or more."""
    from pykittens.kernels import exact_row_launch, ln_launch
    launch = ln_launch if name == "layernorm" else exact_row_launch
    _, consts = launch({"x": np.empty((4096, 12288), pk.bf16.np)}, target)
    assert consts.get("EXACT") == 1
    kernel = KERNELS[name].kernel
    _, exact, insts, _ = build(kernel, target, DT="bf16", **consts)
    _, checked, checked_insts, _ = build(kernel, target, DT="bf16", **{**consts, "EXACT": 0})
    assert exact["scratch_bytes"] == 0 and exact["vgpr_spill"] == 0
    assert 2 * len(insts) < len(checked_insts)
    assert exact["unified_vgpr"] <= checked["unified_vgpr"]
    assert exact["occupancy_waves_per_simd"] >= checked["occupancy_waves_per_simd"]


@pytest.mark.parametrize("target", CDNA)
def test_code_object_version_5_by_default(target):
    assert hsaco.code_object_version(compiler.code_object(pinned_gemm, target)) == 5


# ---- pinned registers -------------------------------------------------------------------------

@pk.kernel(num_waves=1)
def pinned_gemm(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
                BK: pk.const = 32):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    ta = pk.empty(pk.rt((32, BK), pk.bf16, role="a", pin="v200"))
    tb = pk.empty(pk.rt((BK, 32), pk.bf16, role="b", layout="col", pin="v216"))
    for k in pk.range((a.shape[1] + BK - 1) // BK):
        pk.load(ta, a, (0, k * BK))
        pk.load(tb, b, (k * BK, 0))
        pk.mma_AB(acc, ta, tb)
    pk.store(c, acc, (0, 0))


# MFMA per target, and the 32-bit registers one A (or B) operand of it takes: K/4 for bf16.
PINNED_MFMA = {"gfx942": ("v_mfma_f32_32x32x8_bf16", 2), "gfx950": ("v_mfma_f32_32x32x16_bf16", 4)}


@pytest.mark.parametrize("target", CDNA)
def test_pinned_gemm_runs_its_mfmas_on_the_pinned_registers(target):
    obj, rep, insts, loop = build(pinned_gemm, target)
    name, d = PINNED_MFMA[target]
    want = [f"{name} a[0:15], v[{200 + i * d}:{200 + i * d + d - 1}], "
            f"v[{216 + i * d}:{216 + i * d + d - 1}], a[0:15]" for i in range(8 // d)]
    body = loop.instructions(insts)
    assert [text(i) for i in body if hsaco.classify(i[0]) == "mfma"] == want
    assert sum(hsaco.classify(op) == "mfma" for op, _ in insts) == len(want)   # all in the loop
    assert rep["loop_mfma"] == len(want)
    # the accumulator never leaves a0..a15 inside the loop: 16 writes (zeros) before it,
    # 16 reads (the store) after it
    assert not [op for op, _ in body if op.startswith("v_accvgpr_")]
    ops = [op for op, _ in insts]
    assert ops.count("v_accvgpr_write_b32") == ops.count("v_accvgpr_read_b32") == 16
    assert rep["agpr"] == 16
    assert rep["vgpr"] == 224                          # v0..v223: the highest pin is v216..v223
    assert rep["scratch_bytes"] == 0 and rep["vgpr_spill"] == 0


@pk.kernel(num_waves=8)
def pinned_under_pressure(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], PIN: pk.const = "v72"):
    keep = pk.load(pk.rt((64, 16), pk.f32, pin=PIN), x)      # 16 pinned registers
    t = pk.load(pk.rt((64, 128), pk.f32), x)                 # 128 of LLVM's own, and more
    pk.store(out, pk.exp2(t) * 3.0 + t, (0, 0))
    pk.store(out, keep * 2.0, (0, 128))


@pytest.mark.parametrize("num_waves", [4, 8])
@pytest.mark.parametrize("target", CDNA)
def test_vgpr_pins_bound_the_allocator(target, num_waves):
    """LLVM doubles "amdgpu-num-vgpr" on these chips (a VGPR+AGPR total): asked for the
    lowest pin itself, it allocated up to v143 over the pins at v72..v87 and the ISA
    emulator read the pinned tile back clobbered. Under pressure it must spill instead."""
    rep = build(pinned_under_pressure, target, num_waves=num_waves)[1]
    assert rep["vgpr"] == 88 and rep["vgpr_spill"] > 0, rep


@pytest.mark.parametrize("target", CDNA)
def test_pinned_agprs_come_out_of_the_wave_share(target):
    """8 waves are 2 per SIMD, 256 registers each: with 16 AGPRs pinned LLVM gets the VGPRs
    below 240 (it counted only its own VGPRs and made 256 + 16, a kernel that cannot run)."""
    rep = build(pinned_under_pressure, target, PIN="a0")[1]
    assert (rep["agpr"], rep["unified_vgpr"], rep["occupancy_waves_per_simd"]) == (16, 256, 2)


@pk.kernel(num_waves=1)
def decaying_gemm(a: pk.gl[pk.bf16, 2], bt: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2]):
    acc = pk.zeros(pk.rt((32, 128), pk.f32, role="acc", pin="a0"))   # a0..a63
    for k in pk.range(a.shape[1] // 32):
        acc *= 0.5                                                    # a pinned tile, in place
        pk.mma_ABt(acc, pk.load(pk.rt((32, 32), pk.bf16, role="a"), a, (0, k * 32)),
                   pk.load(pk.rt((128, 32), pk.bf16, "row", role="b"), bt, (0, k * 32)))
    pk.store(c, acc)


@pytest.mark.parametrize("target", CDNA)
def test_pinned_tile_updates_in_place_word_by_word(target, rng):
    """acc *= 0.5 on a pinned tile reads, scales and writes back one register at a time, so
    the tile never sits in VGPRs whole; the code object computes it (ISA emulator)."""
    obj, rep, insts, loop = build(decaying_gemm, target)
    moves = [(op, arg) for op, arg in loop.instructions(insts) if op.startswith("v_accvgpr")]
    regs = [arg.split(",")[1].strip() if op.endswith("read_b32") else arg.split(",")[0]
            for op, arg in moves]
    assert [op[-8:-4] for op, _ in moves] == ["read", "rite"] * 64
    assert regs == [f"a{i // 2}" for i in range(128)]
    a = rng.standard_normal((32, 96)).astype(pk.bf16.np)
    bt = rng.standard_normal((128, 96)).astype(pk.bf16.np)
    want = sum(0.5 ** (2 - i) * a[:, 32 * i:32 * i + 32].astype(np.float64)
               @ bt[:, 32 * i:32 * i + 32].astype(np.float64).T for i in range(3))
    got = pk.emulate(decaying_gemm, a, bt, np.zeros((32, 128), np.float32), grid=1,
                     target=target, isa=True)["c"]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-4)


@pk.kernel(num_waves=4)
def pinned_beside_llvms_mfma(a: pk.gl[pk.bf16, 2], bt: pk.gl[pk.bf16, 2],
                             c: pk.gl[pk.f32, 2], s: pk.gl[pk.f32, 2]):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    for k in pk.range(a.shape[1] // 32):
        ta = pk.load(pk.rt((32, 32), pk.bf16, role="a"), a, (0, k * 32))
        tb = pk.load(pk.rt((32, 32), pk.bf16, "row", role="b"), bt, (0, k * 32))
        prod = pk.mma_ABt(pk.empty(pk.rt((32, 32), pk.f32, role="acc")), ta, tb, c=0)
        pk.mma_ABt(acc, ta, tb)                                  # pinned, in place
        pk.store(s, prod, (0, k * 32))                           # LLVM's own MFMA
    pk.store(c, acc)


@pytest.mark.parametrize("target", CDNA)
def test_llvms_mfmas_keep_off_pinned_agprs(target, rng):
    """At one wave per SIMD a VGPR budget above 256 made LLVM select the AGPR forms of its
    own MFMAs and put their results on a0.., over the pinned accumulator (the ISA emulator
    read it back clobbered): with AGPRs pinned, LLVM's MFMAs write VGPRs."""
    obj, rep, insts, loop = build(pinned_beside_llvms_mfma, target)
    dests = [arg.split(",")[0] for op, arg in insts if hsaco.classify(op) == "mfma"]
    assert "a[0:15]" in dests and all(d.startswith("v[") for d in dests if d != "a[0:15]")
    a = rng.standard_normal((32, 64)).astype(pk.bf16.np)
    bt = rng.standard_normal((32, 64)).astype(pk.bf16.np)
    got = pk.emulate(pinned_beside_llvms_mfma, a, bt, np.zeros((32, 32), np.float32),
                     np.zeros((32, 64), np.float32), grid=1, target=target, isa=True)
    a64, b64 = a.astype(np.float64), bt.astype(np.float64)
    assert np.allclose(got["c"], a64 @ b64.T, rtol=1e-5, atol=1e-4)
    for k in range(2):
        blk = slice(32 * k, 32 * k + 32)
        assert np.allclose(got["s"][:, blk], a64[:, blk] @ b64[:, blk].T, rtol=1e-5, atol=1e-4)


# ---- plain fp8 on gfx950: the f8f6f4 MFMAs without scales -----------------------------------

from test_mma import gemm as wave_gemm  # noqa: E402  (64x64 per workgroup, 32x32 per wave)


@pytest.mark.parametrize("dt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mma,bk,instr,per_step", [
    (32, 64, "v_mfma_f32_32x32x64_f8f6f4", 1), (16, 128, "v_mfma_f32_16x16x128_f8f6f4", 4)])
def test_plain_fp8_gemm_on_gfx950_uses_f8f6f4(dt, mma, bk, instr, per_step, rng):
    obj, rep, insts, loop = build(wave_gemm, "gfx950", DT=dt, MMA=mma, BK=bk)
    assert rep["scratch_bytes"] == 0 and (rep["vgpr_spill"], rep["sgpr_spill"]) == (0, 0)
    assert [op for op, _ in loop.instructions(insts) if op.startswith("v_mfma")] == \
        [instr] * per_step                        # 32x32 per wave: (32 / mma)^2 * bk / K
    assert rep["loop_executed"]["mfma"] == per_step
    d = getattr(pk, dt)
    a = rng.standard_normal((64, 2 * bk)).astype(d.np)
    b = rng.standard_normal((2 * bk, 64)).astype(d.np)
    out = pk.emulate(wave_gemm, a, b, np.zeros((64, 64), np.float32), grid=(1, 1),
                     target="gfx950", MMA=mma, BK=bk)["c"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out - ref) <= 1e-6 * np.linalg.norm(ref)


# ---- 8-wave ping-pong (the kernel of tests/test_schedule.py) -----------------------------------

from test_schedule import pingpong_gemm  # noqa: E402  (one kernel, two kinds of checks)


@pytest.mark.parametrize("target", CDNA)
def test_pingpong_has_priorities_and_barriers_in_the_main_loop(target):
    obj, rep, insts, loop = build(pingpong_gemm, target)
    body = [text(i) for i in loop.instructions(insts)]
    assert body.count("s_barrier") == 2                # memory cluster, compute cluster
    hi, lo = body.index("s_setprio 1"), body.index("s_setprio 0")
    mfma = [i for i, t in enumerate(body) if hsaco.classify(t.split()[0]) == "mfma"]
    assert mfma and hi < min(mfma) and max(mfma) < lo  # the MFMAs issue at raised priority
    assert rep["loop_mfma"] == len(mfma)
    inside = set(loop.body)
    outside = [text(i) for j, i in enumerate(insts) if j not in inside]
    assert outside.count("s_barrier") == 2             # group 1's offset, group 0's re-align
    assert not [t for t in outside if t.startswith("s_setprio")]
    assert rep["scratch_bytes"] == 0 and rep["vgpr_spill"] == 0


# ---- errors before LLVM -----------------------------------------------------------------------

@pk.kernel(num_waves=1)
def over_pinned(c: pk.gl[pk.f32, 2], WHICH: pk.const = "agpr"):
    if WHICH == "agpr":
        pk.empty(pk.rt((32, 32), pk.f32, role="acc", pin="a248"))               # pin: a248
    elif WHICH == "vgpr":
        pk.empty(pk.rt((32, 32), pk.bf16, role="a", pin="v250"))                # pin: v250
    else:
        pk.empty(pk.rt((32, 32), pk.bf16, role="a", pin="v200"))                # pin: v200
        pk.empty(pk.rt((32, 32), pk.bf16, role="b", layout="col", pin="v204"))  # pin: v204


@pk.kernel(num_waves=4)
def lds_hog(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], TILES: pk.const = 2):
    for _ in range(TILES):
        s = pk.empty(pk.st((128, 128), pk.f32))                           # lds: 64 KiB each
    pk.load(s, x, (0, 0))
    pk.barrier()
    pk.store(out, pk.load(pk.rt((4, 64), pk.f32), s, (4 * pk.wave_id(), 0)), (0, 0))


@pytest.fixture
def no_llvm(monkeypatch):
    """Any compile or disassembly in the toolchain's child process fails the test."""
    def llvm_ran(*a, **k):
        raise AssertionError("LLVM ran; the error should have come before it")
    monkeypatch.setattr(amdgpu, "run_isolated", llvm_ran)


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("which,marker,message", [
    ("agpr", "# pin: a248", "needs a248..a263 but {t} has only a0..a255"),
    ("vgpr", "# pin: v250", "needs v250..v257 but {t} has only v0..v255"),
    ("overlap", "# pin: v204", "(v204..v211) overlaps the tile pinned at line {line} "
                               "(v200..v207)"),
])
def test_bad_pins_fail_before_llvm(target, which, marker, message, no_llvm):
    with pytest.raises(pk.KernelError) as e:
        compiler.code_object(over_pinned, target, WHICH=which)
    msg = message.format(t=target, line=line_of(__file__, "# pin: v200"))
    assert msg in str(e.value) and "[kernel over_pinned] pinned tile rt<" in str(e.value)
    assert_names_line(e.value, __file__, marker)


@pytest.mark.parametrize("target,tiles", [("gfx942", 2), ("gfx950", 3)])
def test_lds_overflow_fails_before_llvm(target, tiles, no_llvm):
    with pytest.raises(pk.KernelError) as e:
        compiler.code_object(lds_hog, target, TILES=tiles)
    limit = {"gfx942": 65536, "gfx950": 163840}[target]
    assert (f"[kernel lds_hog] shared tiles need {tiles * 65536} bytes of LDS/shared memory "
            f"but {target} has {limit} per workgroup") in str(e.value)
    assert_names_line(e.value, __file__, "# lds: 64 KiB each")


def test_lds_within_the_limit_compiles():
    """gfx950's 160 KiB take the two 64 KiB tiles that gfx942 refuses."""
    obj, rep, _, _ = build(lds_hog, "gfx950", TILES=2)
    assert rep["lds_bytes"] == 2 * 65536 and rep["scratch_bytes"] == 0


# ---- docs/targets/cdna.md -----------------------------------------------------------------------

GUIDE = os.path.join(ROOT, "docs", "targets", "cdna.md")


def test_cdna_guide_snippets_run(monkeypatch, capsys):
    """Every python block of the CDNA notes runs, in order, in one namespace, from the
    repository root; where a plain block follows one, it is what the block prints."""
    monkeypatch.chdir(ROOT)
    assert len(run_doc_blocks(GUIDE, "cdna_md", capsys)) >= 10
