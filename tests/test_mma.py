"""Matrix multiply on CDNA: role tiles in MFMA layouts, emulated against numpy and compiled."""
import re

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels.spec import rel_err

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()

CDNA = ("gfx942", "gfx950")
FP8 = {"gfx942": pk.e4m3fnuz, "gfx950": pk.e4m3}


@pk.kernel(num_waves=4)
def gemm(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl[pk.f32, 2],
         DT: pk.const = None, BK: pk.const = 32, MMA: pk.const = 0):
    # A 64x64 block per workgroup, one 32x32 quadrant per wave; K stepped in a real loop.
    wm, wn = pk.wave_id() // 2, pk.wave_id() % 2
    m0 = pk.program_id(0) * 64 + wm * 32
    n0 = pk.program_id(1) * 64 + wn * 32
    mma = MMA or None                      # 0: the target's choice
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", mma=mma))
    for k in pk.range((a.shape[1] + BK - 1) // BK):
        ta = pk.load(pk.rt((32, BK), DT, role="a", mma=mma), a, (m0, k * BK))
        tb = pk.load(pk.rt((BK, 32), DT, role="b", layout="col", mma=mma), b, (k * BK, n0))
        pk.mma_AB(acc, ta, tb)
    pk.store(c, acc, (m0, n0))


@pk.kernel(num_waves=1)
def gemm_abt(a: pk.gl[pk.bf16, 2], bt: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2]):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
    ta = pk.load(pk.rt((32, 64), pk.bf16, role="a"), a, (0, 0))
    tb = pk.load(pk.rt((32, 64), pk.bf16, role="b", layout="row"), bt, (0, 0))
    pk.mma_ABt(acc, ta, tb)
    pk.store(c, acc, (0, 0))


@pk.kernel(num_waves=1)
def gemm_atb(at: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2]):
    acc = pk.zeros(pk.rt((16, 32), pk.f32, role="acc", mma=16))
    ta = pk.load(pk.rt((64, 16), pk.bf16, role="a", layout="col", mma=16), at, (0, 0))
    tb = pk.load(pk.rt((64, 32), pk.bf16, role="b", layout="col", mma=16), b, (0, 0))
    pk.mma_AtB(acc, ta, tb)
    pk.store(c, acc, (0, 0))


def _operands(rng, m, n, k, dtype):
    a = rng.standard_normal((m, k)).astype(dtype.np)
    b = rng.standard_normal((k, n)).astype(dtype.np)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("mma", (16, 32))
@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 70, 96)])
def test_gemm_bf16_matches_numpy(target, mma, shape, rng):
    m, n, k = shape
    a, b, ref = _operands(rng, m, n, k, pk.bf16)
    out = pk.emulate(gemm, a, b, np.full((m, n), np.nan, np.float32),
                     grid=(-(-m // 64), -(-n // 64)), target=target, MMA=mma)["c"]
    assert rel_err(out, ref) < 1e-5          # bf16 products are exact in f32


@pytest.mark.parametrize("target", CDNA)
def test_gemm_fp8_uses_the_chip_flavour(target, rng):
    dt = FP8[target]
    a, b, ref = _operands(rng, 64, 64, 64, dt)
    out = pk.emulate(gemm, a, b, np.zeros((64, 64), np.float32), grid=(1, 1), target=target,
                     MMA=32)["c"]
    assert rel_err(out, ref) < 1e-5
    other = pk.e4m3 if target == "gfx942" else pk.e4m3fnuz
    a2 = a.astype(np.float32).astype(other.np)
    with pytest.raises(pk.KernelError, match="not supported on"):
        pk.emulate(gemm, a2, a2, np.zeros((64, 64), np.float32), grid=(1, 1), target=target)


@pytest.mark.parametrize("target", CDNA)
def test_transposed_operands(target, rng):
    a, b, ref = _operands(rng, 32, 32, 64, pk.bf16)
    out = pk.emulate(gemm_abt, a, np.ascontiguousarray(b.T), np.zeros((32, 32), np.float32),
                     grid=1, target=target)["c"]
    assert rel_err(out, ref) < 1e-5
    a, b, ref = _operands(rng, 16, 32, 64, pk.bf16)
    out = pk.emulate(gemm_atb, np.ascontiguousarray(a.T), b, np.zeros((16, 32), np.float32),
                     grid=1, target=target)["c"]
    assert rel_err(out, ref) < 1e-5


def _asm(ir, target):
    mod = llvm.parse_assembly(ir)
    mod.verify()
    tm = llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu=target, opt=3)
    return tm.emit_assembly(mod)


@pytest.mark.parametrize("target,mma,instr", [
    ("gfx942", 32, "v_mfma_f32_32x32x8_bf16"), ("gfx942", 16, "v_mfma_f32_16x16x16_bf16"),
    ("gfx950", 32, "v_mfma_f32_32x32x16_bf16"), ("gfx950", 16, "v_mfma_f32_16x16x32_bf16")])
def test_gemm_compiles_to_the_mfma(target, mma, instr):
    asm = _asm(compiler.llvm_ir(gemm, target, DT="bf16", MMA=mma), target)
    assert instr in asm
    assert re.search(r"\.private_segment_fixed_size:\s+0", asm)
    assert any(instr in body for body in _loop_bodies(asm))   # inside the K loop


def _loop_bodies(asm: str) -> list[str]:
    """Text between a label and a later branch back to it."""
    lines = asm.splitlines()
    where = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.LBB\w+):", ln))}
    out = []
    for i, ln in enumerate(lines):
        m = re.match(r"\s+s_(?:cbranch_\w+|branch)\s+(\.LBB\w+)", ln)
        if m and where.get(m.group(1), i) < i:
            out.append("\n".join(lines[where[m.group(1)]:i]))
    return out


def test_fp8_gemm_compiles(rng):
    asm = _asm(compiler.llvm_ir(gemm, "gfx942", DT="e4m3fnuz"), "gfx942")
    assert "v_mfma_f32_32x32x16_fp8_fp8" in asm


def test_mma_argument_errors():
    @pk.kernel
    def bad(a: pk.gl[pk.bf16, 2]):
        acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
        ta = pk.zeros(pk.rt((32, 16), pk.bf16, role="a"))
        tb = pk.zeros(pk.rt((16, 32), pk.bf16, role="b", layout="row"))
        pk.mma_AB(acc, ta, tb)

    with pytest.raises(pk.KernelError, match="layout='col'") as e:
        bad.specialize()
    assert "test_mma.py" in str(e.value)

    @pk.kernel
    def mixed(a: pk.gl[pk.bf16, 2]):
        acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", mma=16))
        ta = pk.zeros(pk.rt((32, 16), pk.bf16, role="a"))
        tb = pk.zeros(pk.rt((16, 32), pk.bf16, role="b", layout="col"))
        pk.mma_AB(acc, ta, tb)

    from pykittens.lower import lower
    with pytest.raises(pk.KernelError, match="different matrix-instruction sizes on gfx942"):
        lower(mixed.specialize(), "gfx942")


@pytest.mark.parametrize("dt", ["bf16", "f16", "e4m3"])
def test_gemm_on_hopper_uses_mma_sync(dt, rng):
    dtype = pk.ir.types.dtype_of(dt)
    a, b, ref = _operands(rng, 100, 70, 96, dtype)
    out = pk.emulate(gemm, a, b, np.zeros((100, 70), np.float32), grid=(2, 2),
                     target="sm_90a")["c"]
    assert rel_err(out, ref) < 1e-5
    ir = compiler.llvm_ir(gemm, "sm_90a", DT=dt)
    mod = llvm.parse_assembly(ir)
    mod.verify()
    tm = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(
        cpu="sm_90a", features="+ptx84")
    ptx = tm.emit_assembly(mod)
    k = 32 if dt == "e4m3" else 16
    assert f"mma.sync.aligned.m16n8k{k}.row.col.f32.{dt}.{dt}.f32" in ptx


# ---- block-scaled (MX) matrix multiply on CDNA4 ------------------------------------------------

@pk.kernel(num_waves=1)
def mx_gemm(a: pk.gl["DT", 2], b: pk.gl["DT", 2], sa: pk.gl[pk.e8m0, 2],
            sb: pk.gl[pk.e8m0, 2], c: pk.gl[pk.f32, 2], DT: pk.const = None,
            MMA: pk.const = 32, BK: pk.const = 128):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", mma=MMA))
    for k in pk.range(a.shape[1] // BK):
        ta = pk.load(pk.rt((32, BK), DT, role="a", mma=MMA, scaled=True), a, (0, k * BK))
        tb = pk.load(pk.rt((BK, 32), DT, "col", role="b", mma=MMA, scaled=True), b,
                     (k * BK, 0))
        blocks = BK * pk.dtype_of(DT).packed // 32     # scales per step (FP4: 2 a column)
        tsa = pk.load(pk.rt((32, blocks), pk.e8m0, role="a_scale", mma=MMA), sa,
                      (0, k * blocks))
        tsb = pk.load(pk.rt((blocks, 32), pk.e8m0, role="b_scale", mma=MMA), sb,
                      (k * blocks, 0))
        pk.mma_AB(acc, ta, tb, scale_a=tsa, scale_b=tsb)
    pk.store(c, acc)


def _mx_operands(rng, dt, k=256):
    a = rng.standard_normal((32, k)).astype(dt.np)
    b = rng.standard_normal((k, 32)).astype(dt.np)
    sa = (2.0 ** rng.integers(-4, 5, (32, k // 32))).astype(pk.e8m0.np)
    sb = (2.0 ** rng.integers(-4, 5, (k // 32, 32))).astype(pk.e8m0.np)
    ref = (a.astype(np.float64) * np.repeat(sa.astype(np.float64), 32, 1)) @ \
        (b.astype(np.float64) * np.repeat(sb.astype(np.float64), 32, 0))
    return a, b, sa, sb, ref


@pytest.mark.parametrize("dt", [pk.e4m3, pk.e5m2])
@pytest.mark.parametrize("mma,instr", [(32, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                       (16, "v_mfma_scale_f32_16x16x128_f8f6f4")])
def test_block_scaled_mma_on_gfx950(dt, mma, instr, rng):
    a, b, sa, sb, ref = _mx_operands(rng, dt)
    out = pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                     target="gfx950", MMA=mma)["c"]
    assert rel_err(out, ref) < 1e-6
    # and from the code object: the MFMA's operand and scale registers as the ISA documents
    # them (pykittens/isa), not as the lane layouts say
    got = pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                     target="gfx950", MMA=mma, isa=True)["c"]
    assert rel_err(got, ref) < 1e-6
    ir = compiler.llvm_ir(mx_gemm, "gfx950", DT=dt.name, MMA=mma)
    assert f"@llvm.amdgcn.mfma.scale.f32.{mma}x{mma}x{64 if mma == 32 else 128}.f8f6f4" in ir
    assert instr in _asm(ir, "gfx950")


def _fp4_values(codes):
    """FP4 E2M1 codes -> float64 (ml_dtypes' decoding, not the emulators')."""
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def _fp4_pack(codes, axis):
    """Codes -> bytes of pairs along `axis`: element 2i in bits 3:0, 2i + 1 in bits 7:4."""
    lo, hi = (np.take(codes, range(r, codes.shape[axis], 2), axis=axis) for r in (0, 1))
    return (lo | hi << 4).astype(np.uint8)


@pytest.mark.parametrize("mma,instr", [(32, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                       (16, "v_mfma_scale_f32_16x16x128_f8f6f4")])
def test_block_scaled_fp4_mma_on_gfx950(mma, instr, rng):
    """MXFP4: packed pairs (pk.e2m1x2) in both emulators against float64; the instruction
    with FP4 formats (cbsz:4 blgp:4) and 4-register operands."""
    k = 256
    ca, cb = rng.integers(0, 16, (32, k)), rng.integers(0, 16, (k, 32))
    sa = (2.0 ** rng.integers(-4, 5, (32, k // 32))).astype(pk.e8m0.np)
    sb = (2.0 ** rng.integers(-4, 5, (k // 32, 32))).astype(pk.e8m0.np)
    ref = (_fp4_values(ca) * np.repeat(sa.astype(np.float64), 32, 1)) @ \
        (_fp4_values(cb) * np.repeat(sb.astype(np.float64), 32, 0))
    a, b = _fp4_pack(ca, 1), _fp4_pack(cb, 0)
    outs = [pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                       target="gfx950", MMA=mma, BK=64, isa=isa)["c"] for isa in (False, True)]
    assert rel_err(outs[0], ref) < 1e-6 and np.array_equal(outs[0], outs[1])
    # A packed high nibble first (B as before) is another product: the check sees packing
    swapped = _fp4_pack(ca[:, np.arange(k) ^ 1], 1)
    bad = pk.emulate(mx_gemm, swapped, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                     target="gfx950", MMA=mma, BK=64)["c"]
    assert rel_err(bad, ref) > 1e-2
    asm = _asm(compiler.llvm_ir(mx_gemm, "gfx950", DT="e2m1x2", MMA=mma, BK=64), "gfx950")
    ops = re.findall(instr + r" [va]\[\d+:\d+\], [va]\[(\d+):(\d+)\], [va]\[(\d+):(\d+)\].*"
                     r"cbsz:4 blgp:4", asm)
    # 4 registers an operand: 32 FP4 values a lane
    assert ops and all(int(h) - int(lo) == 3 for r in ops for lo, h in (r[:2], r[2:])), ops


def _fp6_values(codes, dt):
    """FP6 codes -> float64 (ml_dtypes' decoding, not the emulators')."""
    return codes.astype(np.uint8).view(FP6_NP[dt]).astype(np.float64)


FP6_NP = {"e2m3p": ml_dtypes.float6_e2m3fn, "e3m2p": ml_dtypes.float6_e3m2fn}


def _fp6_pack(codes, axis, msb_first=False):
    """6-bit codes -> bytes along `axis`, each line one little-endian bit string (value j in
    bits 6j .. 6j + 5), built with Python integers; msb_first=True packs each group of four
    values the other way round (a planted packing bug)."""
    lines = np.moveaxis(np.asarray(codes), axis, -1)
    out = np.zeros((*lines.shape[:-1], lines.shape[-1] * 3 // 4), np.uint8)
    for idx in np.ndindex(*lines.shape[:-1]):
        for q in range(lines.shape[-1] // 4):
            four = [int(c) for c in lines[idx][4 * q:4 * q + 4]]
            word = sum(c << (6 * (3 - j if msb_first else j)) for j, c in enumerate(four))
            out[idx][3 * q:3 * q + 3] = [(word >> s) & 255 for s in (0, 8, 16)]
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


@pytest.mark.parametrize("dt", ["e2m3p", "e3m2p"])
@pytest.mark.parametrize("mma,instr", [(32, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                       (16, "v_mfma_scale_f32_16x16x128_f8f6f4")])
def test_block_scaled_fp6_mma_on_gfx950(dt, mma, instr, rng):
    """MXFP6: densely packed FP6 (pk.e2m3p / pk.e3m2p) in both emulators against float64;
    the instruction with FP6 formats (cbsz:2 / 3) and 6-register operands."""
    k = 256
    ca, cb = rng.integers(0, 64, (32, k)), rng.integers(0, 64, (k, 32))
    sa = (2.0 ** rng.integers(-4, 5, (32, k // 32))).astype(pk.e8m0.np)
    sb = (2.0 ** rng.integers(-4, 5, (k // 32, 32))).astype(pk.e8m0.np)
    ref = (_fp6_values(ca, dt) * np.repeat(sa.astype(np.float64), 32, 1)) @ \
        (_fp6_values(cb, dt) * np.repeat(sb.astype(np.float64), 32, 0))
    a, b = _fp6_pack(ca, 1), _fp6_pack(cb, 0)
    bk = 96                                   # 128 values a step, 3 / 4 byte each
    outs = [pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                       target="gfx950", DT=dt, MMA=mma, BK=bk, isa=isa)["c"]
            for isa in (False, True)]
    assert rel_err(outs[0], ref) < 1e-6 and np.array_equal(outs[0], outs[1])
    bad = pk.emulate(mx_gemm, _fp6_pack(ca, 1, msb_first=True), b, sa, sb,
                     np.zeros((32, 32), np.float32), grid=1, target="gfx950", DT=dt, MMA=mma,
                     BK=bk, isa=True)["c"]
    assert rel_err(bad, ref) > 1e-2             # the check sees the packing
    asm = _asm(compiler.llvm_ir(mx_gemm, "gfx950", DT=dt, MMA=mma, BK=bk), "gfx950")
    fmt = {"e2m3p": 2, "e3m2p": 3}[dt]
    ops = re.findall(instr + r" [va]\[\d+:\d+\], [va]\[(\d+):(\d+)\], [va]\[(\d+):(\d+)\].*"
                     rf"cbsz:{fmt} blgp:{fmt}", asm)
    # 6 registers an operand: 32 FP6 values a lane
    assert ops and all(int(h) - int(lo) == 5 for r in ops for lo, h in (r[:2], r[2:])), ops


def test_packed_pairs_are_only_moved_and_multiplied():
    @pk.kernel
    def k(a: pk.gl[pk.e2m1x2, 2], c: pk.gl[pk.f32, 2], WHAT: pk.const = ""):
        t = pk.load(pk.rt((32, 32), pk.e2m1x2), a, (0, 0))
        if WHAT == "cast":
            pk.cast(t, pk.f32)
        elif WHAT == "add":
            t + t
        elif WHAT == "load":
            pk.load(pk.rt((32, 32), pk.f32), a, (0, 0))
        elif WHAT == "exp2":
            pk.exp2(t)

    k.specialize(WHAT="")                              # moving them is fine
    for what, msg in (("cast", "hold packed values"), ("add", "hold packed values"),
                      ("exp2", "hold packed values"), ("load", "cannot convert e2m1x2 to f32")):
        with pytest.raises(pk.KernelError, match=msg):
            k.specialize(WHAT=what)


def test_block_scaled_mma_errors(rng):
    a, b, sa, sb, _ = _mx_operands(rng, pk.e4m3fnuz)
    with pytest.raises(pk.KernelError, match="e8m0 is not supported on gfx942 .E8M0 block "
                                             "scales feed the MX matrix instructions of gfx950"):
        pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                   target="gfx942")

    @pk.kernel
    def missing(a: pk.gl[pk.e4m3, 2]):
        acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
        ta = pk.zeros(pk.rt((32, 64), pk.e4m3, role="a", scaled=True))
        tb = pk.zeros(pk.rt((64, 32), pk.e4m3, "col", role="b", scaled=True))
        pk.mma_AB(acc, ta, tb)

    with pytest.raises(pk.KernelError, match="scaled operand tiles need scale_a= and scale_b="):
        missing.specialize()

    @pk.kernel
    def wrong_shape(a: pk.gl[pk.e4m3, 2]):
        acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
        ta = pk.zeros(pk.rt((32, 64), pk.e4m3, role="a", scaled=True))
        tb = pk.zeros(pk.rt((64, 32), pk.e4m3, "col", role="b", scaled=True))
        s1 = pk.zeros(pk.rt((32, 4), pk.e8m0, role="a_scale"))
        s2 = pk.zeros(pk.rt((2, 32), pk.e8m0, role="b_scale"))
        pk.mma_AB(acc, ta, tb, scale_a=s1, scale_b=s2)

    with pytest.raises(pk.KernelError, match=r"a scales must be pk.rt\(\(32, 2\), pk.e8m0"):
        wrong_shape.specialize()
    with pytest.raises(pk.KernelError, match="hold E8M0 block scales"):
        pk.rt((32, 2), pk.f32, role="a_scale")
