"""Operand layouts of gfx950's f8f6f4 MFMAs, checked against the documentation rather than
against the tables the lowering, the renderer and the lane emulator share.

The CDNA4 ISA's F8F6F4 operand layout for fp8 data (the same in AMD's ROCm blog "Matrix Core
Programming on AMD CDNA3 and CDNA4", fp8 32x32x64 example, and in Triton's AMD backend,
"for mxfp6/mxfp8, there are 2 16-consecutive elements blocks"): lane l holds row (A) /
column (B) l % M and 32 K values, registers 0-3 K = 16 * (l // M) + 0..15, registers 4-7 the
same plus K / 2. Scales: lane l's scale register holds (byte 0) the E8M0 scale of row / column
l % M for the 32-element K block l // M."""
import dataclasses

import llvmlite.binding as llvm
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, targets
from pykittens.emulator import machine
from pykittens.targets import cdna
from test_mma import gemm

G950 = targets.get("gfx950")

# (M, K) -> {lane: (row of A, the K values of its 32 operand bytes, in register order)},
# written out from the documentation for a few lanes of each lane group.
DOC_LANES = {
    (32, 64): {0: (0, [*range(0, 16), *range(32, 48)]),
               5: (5, [*range(0, 16), *range(32, 48)]),
               33: (1, [*range(16, 32), *range(48, 64)]),
               63: (31, [*range(16, 32), *range(48, 64)])},
    (16, 128): {0: (0, [*range(0, 16), *range(64, 80)]),
                17: (1, [*range(16, 32), *range(80, 96)]),
                34: (2, [*range(32, 48), *range(96, 112)]),
                63: (15, [*range(48, 64), *range(112, 128)])},
}


def f8f6f4(m: int, scaled: bool, ab: str = "e4m3"):
    return next(i for i in G950.mma if i.m == m and i.ab_dtype == ab and i.scaled == scaled
                and (scaled or i.no_scale))


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("mk", sorted(DOC_LANES))
def test_operand_lanes_are_the_documented_ones(mk, scaled):
    m, k = mk
    ins = f8f6f4(m, scaled)
    assert (ins.m, ins.k) == (m, k)
    ar, ac = ins.a_layout.coords()
    br, bc = ins.b_layout.coords()
    for lane, (row, ks) in DOC_LANES[mk].items():
        assert [int(x) for x in ar[lane]] == [row] * 32
        assert [int(x) for x in ac[lane]] == ks
        assert [int(x) for x in bc[lane]] == [row] * 32        # B: column l % N, K rows
        assert [int(x) for x in br[lane]] == ks


# FP4 (pk.e2m1x2, two values a byte, K counted in bytes): lane l holds row / column l % M and
# K = 32 (l // M) .. + 31 in 16 consecutive bytes (AMD ROCm blog, the fp4 32x32x64 example:
# lane l loads bytes 16 (l / 32) .. + 15 of row l % 32)
DOC_FP4_LANES = {
    (32, 32): {0: (0, [*range(0, 16)]), 31: (31, [*range(0, 16)]), 33: (1, [*range(16, 32)])},
    (16, 64): {0: (0, [*range(0, 16)]), 17: (1, [*range(16, 32)]),
               63: (15, [*range(48, 64)])},
}


@pytest.mark.parametrize("mk", sorted(DOC_FP4_LANES))
def test_fp4_operand_bytes_are_the_documented_ones(mk):
    m, kbytes = mk
    ins = f8f6f4(m, True, "e2m1x2")
    assert (ins.m, ins.k) == (m, kbytes) and ins.name.endswith(f"x{2 * kbytes}_f8f6f4")
    ar, ac = ins.a_layout.coords()
    br, bc = ins.b_layout.coords()
    for lane, (row, ks) in DOC_FP4_LANES[mk].items():
        assert [int(x) for x in ar[lane]] == [row] * 16 and [int(x) for x in ac[lane]] == ks
        assert [int(x) for x in bc[lane]] == [row] * 16 and [int(x) for x in br[lane]] == ks
    assert cdna.F8F6F4_FORMAT["e2m1x2"] == 4            # CDNA4 ISA: CBSZ / BLGP 4 = FP4


@pytest.mark.parametrize("m,blocks", [(32, 2), (16, 4)])
def test_scale_lanes_are_the_documented_ones(m, blocks):
    ins = f8f6f4(m, True)
    for lay, dims in ((ins.scale_a_layout, (0, 1)), (ins.scale_b_layout, (1, 0))):
        c = lay.coords()
        for lane in range(64):
            mn, blk = int(c[dims[0]][lane][0]), int(c[dims[1]][lane][0])
            assert (mn, blk) == (lane % m, lane // m)
        assert lay.nslots == 1 and blocks == 64 // m


# ---- what the hardware computes, from the documented layouts ----------------------------------

def doc_operand(regs: np.ndarray, m: int, k: int) -> np.ndarray:
    """The (m, k) matrix a wave's 32 operand bytes per lane hold, by the documentation."""
    out = np.zeros((m, k), np.float64)
    for lane in range(64):
        g = lane // m
        for s in range(32):
            kk = 16 * g + s if s < 16 else k // 2 + 16 * g + s - 16
            out[lane % m, kk] = regs[lane, s]
    return out


def doc_acc(m: int):
    """(row, col) of accumulator slot s of lane l (CDNA3/CDNA4 ISA, the same for all f32
    accumulators): 32x32: col l % 32, row 8 * (s // 4) + 4 * (l // 32) + s % 4; 16x16: col
    l % 16, row 4 * (l // 16) + s."""
    lanes, slots = np.arange(64)[:, None], np.arange(m * m // 64)[None, :]
    if m == 32:
        rows = 8 * (slots // 4) + 4 * (lanes // 32) + slots % 4
    else:
        rows = 4 * (lanes // 16) + slots
    return rows, np.broadcast_to(lanes % m, rows.shape)


def hardware_mma(self, w, op):
    """x_mma as the documentation says the hardware does it: operand bytes (the listed slots,
    in register order) placed by the documented layouts, scales by lane, K blocks of 32."""
    ins = op.attrs["instr"]
    if not (ins.scaled or ins.no_scale):
        return ORIGINAL(self, w, op)
    m, k = ins.m, ins.k
    a, b, c = (self.get(w, s) for s in op.srcs[:3])
    A = doc_operand(a[:, list(op.attrs["a_slots"])].astype(np.float64), m, k)
    Bt = doc_operand(b[:, list(op.attrs["b_slots"])].astype(np.float64), m, k)   # (n, k)
    if ins.scaled:
        sa, sb = (self.get(w, s) for s in op.srcs[3:5])
        ea = sa[:, op.attrs["sa_slots"][0]].astype(np.float64)       # the values 2^(e-127)
        eb = sb[:, op.attrs["sb_slots"][0]].astype(np.float64)
        for lane in range(64):
            blk = slice(32 * (lane // m), 32 * (lane // m + 1))
            A[lane % m, blk] *= ea[lane]
            Bt[lane % m, blk] *= eb[lane]
    rows, cols = doc_acc(m)
    cs = list(op.attrs["c_slots"])
    D = c[:, cs].astype(np.float64) + (A @ Bt.T)[rows, cols]
    out = c.copy()
    out[:, cs] = D.astype(np.float32)
    w.regs[op.dst] = out


ORIGINAL = machine._Machine.x_mma


@pk.kernel(num_waves=1)
def mx_gemm(a: pk.gl[pk.e4m3, 2], b: pk.gl[pk.e4m3, 2], sa: pk.gl[pk.e8m0, 2],
            sb: pk.gl[pk.e8m0, 2], c: pk.gl[pk.f32, 2], MMA: pk.const = 32,
            SCALED: pk.const = 1, BK: pk.const = 128):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", mma=MMA))
    for k in pk.range(a.shape[1] // BK):
        ta = pk.load(pk.rt((32, BK), pk.e4m3, role="a", mma=MMA, scaled=bool(SCALED)), a,
                     (0, k * BK))
        tb = pk.load(pk.rt((BK, 32), pk.e4m3, "col", role="b", mma=MMA, scaled=bool(SCALED)),
                     b, (k * BK, 0))
        if SCALED:
            s_a = pk.load(pk.rt((32, BK // 32), pk.e8m0, role="a_scale", mma=MMA), sa,
                          (0, k * (BK // 32)))
            s_b = pk.load(pk.rt((BK // 32, 32), pk.e8m0, role="b_scale", mma=MMA), sb,
                          (k * (BK // 32), 0))
            pk.mma_AB(acc, ta, tb, scale_a=s_a, scale_b=s_b)
        else:
            pk.mma_AB(acc, ta, tb)
    pk.store(c, acc)


def operands(rng, k=256):
    """Scales that differ per 32-K block (and per row / column), every block different from
    its neighbours, so a product paired with the wrong block's scale shows."""
    a = rng.standard_normal((32, k)).astype(pk.e4m3.np)
    b = rng.standard_normal((k, 32)).astype(pk.e4m3.np)
    ea = rng.integers(-6, 7, (32, k // 32))
    ea[:, 1::2] = ea[:, ::2] + 5                       # neighbours always differ
    eb = rng.integers(-6, 7, (k // 32, 32))
    eb[1::2] = eb[::2] - 4
    sa, sb = (2.0 ** ea).astype(pk.e8m0.np), (2.0 ** eb).astype(pk.e8m0.np)
    ref = (a.astype(np.float64) * np.repeat(2.0 ** ea, 32, 1)) @ \
        (b.astype(np.float64) * np.repeat(2.0 ** eb, 32, 0))
    return a, b, sa, sb, ref


def run(target, rng, mma, scaled=True):
    a, b, sa, sb, ref = operands(rng)
    if not scaled:
        ref = a.astype(np.float64) @ b.astype(np.float64)
    out = pk.emulate(mx_gemm, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                     target=target, MMA=mma, SCALED=int(scaled))["c"]
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("mma", [32, 16])
def test_block_scales_pair_with_their_products_on_the_documented_hardware(monkeypatch, rng,
                                                                         mma, scaled):
    """The lowering's registers, multiplied the way the documentation says the MFMA does,
    match a float64 reference with a different scale for every 32-K block."""
    monkeypatch.setattr(machine._Machine, "x_mma", hardware_mma)
    assert run("gfx950", rng, mma, scaled) < 1e-6


@pytest.mark.parametrize("mma", [32, 16])
def test_the_old_layout_pairs_products_with_the_wrong_scales(monkeypatch, rng, mma):
    """Mutation check: with 32 consecutive K per lane (the layout before the fix) the
    documented hardware pairs half (32x32x64) or three quarters (16x16x128) of the products
    with another block's scale; uniform scales would hide it (the same permutation of K on A
    and B leaves the dot product alone)."""
    monkeypatch.setattr(machine._Machine, "x_mma", hardware_mma)
    old = dataclasses.replace(G950, mma=tuple(
        dataclasses.replace(i, a_layout=cdna.mfma_a(i.m, i.k), b_layout=cdna.mfma_b(i.n, i.k))
        if i.scaled or i.no_scale else i for i in G950.mma))
    assert run(old, rng, mma) > 0.1
    assert run(old, rng, mma, scaled=False) < 1e-6


# ---- plain fp8 on the f8f6f4 instructions -------------------------------------------------------

@pytest.mark.parametrize("dt,mods", [("e4m3", ""), ("e5m2", " cbsz:1 blgp:1")])
@pytest.mark.parametrize("mma,k,instr", [(32, 64, "v_mfma_f32_32x32x64_f8f6f4"),
                                         (16, 128, "v_mfma_f32_16x16x128_f8f6f4")])
def test_plain_fp8_runs_on_the_unscaled_f8f6f4_mfma(dt, mods, mma, k, instr):
    """The renderer passes constant-zero scale operands; both LLVMs (AMD's, which builds
    inline-asm kernels, and llvmlite's) must select the instruction without scales, not
    v_mfma_scale with a zero (2^-127) scale register."""
    asm = compiler.assembly(gemm, "gfx950", DT=dt, MMA=mma, BK=k)
    got = {ln.split("//")[0].strip() for ln in asm.splitlines() if "v_mfma" in ln}
    assert got and all(g.startswith(instr + " ") and g.endswith("]" + mods) for g in got), got
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = llvm.parse_assembly(compiler.llvm_ir(gemm, "gfx950", DT=dt, MMA=mma, BK=k))
    tm = llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu="gfx950",
                                                                           opt=3)
    text = tm.emit_assembly(mod)
    assert instr in text and "v_mfma_scale" not in text
