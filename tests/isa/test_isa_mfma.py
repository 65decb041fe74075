"""MFMA semantics: operands are placed in registers entry by entry as AMD documents them
(CDNA3 ISA ch. 7 and the Matrix Instruction Calculator's register layouts; CDNA4 ISA 7.1,
11.4 for the doubled-K and block-scaled f8f6f4 forms), the instruction runs, and D must
be A @ B + C computed by numpy in float64."""
import ml_dtypes
import numpy as np
import pytest

from pykittens.isa import ISAError
from isa_helpers import execute

FP8 = {"gfx942": {"fp8": ml_dtypes.float8_e4m3fnuz, "bf8": ml_dtypes.float8_e5m2fnuz},
       "gfx950": {"fp8": ml_dtypes.float8_e4m3fn, "bf8": ml_dtypes.float8_e5m2}}


def encode(x: np.ndarray, kind: str, target: str) -> tuple[np.ndarray, int]:
    """(unsigned element bits, bits per element) of the values, in the operand's format."""
    if kind == "bf16":
        return x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint64), 16
    if kind == "f16":
        return x.astype(np.float16).view(np.uint16).astype(np.uint64), 16
    return x.astype(FP8[target][kind]).view(np.uint8).astype(np.uint64), 8


def decode(bits: np.ndarray, kind: str, target: str) -> np.ndarray:
    dt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}.get(kind) or FP8[target][kind]
    return bits.astype({16: np.uint16, 8: np.uint8}[np.dtype(dt).itemsize * 8]).view(dt) \
        .astype(np.float64)


def place_operand(mat_bits, rows, k, nregs, bits, transpose):
    """Registers of an A (rows x k, entry [i, kk]) or B (k x rows, entry [kk, i]) operand:
    the entry for row/col i and k index kk lives in lane i + rows * (kk // per) as its
    (kk % per)-th element, elements packed from bit 0 up (calculator: `A[i][k]` is
    `v{reg}{lane}.[hi:lo]`)."""
    per = k // (64 // rows)
    regs = np.zeros((nregs, 64), np.uint64)
    for i in range(rows):
        for kk in range(k):
            v = mat_bits[kk, i] if transpose else mat_bits[i, kk]
            lane, j = i + rows * (kk // per), kk % per
            regs[(j * bits) // 32, lane] |= v << np.uint64((j * bits) % 32)
    return regs.astype(np.uint32)


def place_f8f6f4(mat_bits, rows, k, transpose):
    """Registers of an 8-bit f8f6f4 operand (CDNA4; AMD ROCm blog "Matrix Core Programming
    on AMD CDNA3 and CDNA4", 32x32x64 fp8 example): lane group g holds two runs of 16 K
    values, K = 16 g .. 16 g + 15 as bytes 0..15 and K/2 + 16 g .. as bytes 16..31."""
    regs = np.zeros((8, 64), np.uint64)
    for i in range(rows):
        for kk in range(k):
            v = mat_bits[kk, i] if transpose else mat_bits[i, kk]
            half, r = divmod(kk, k // 2)
            lane, j = i + rows * (r // 16), 16 * half + r % 16
            regs[j // 4, lane] |= v << np.uint64(8 * (j % 4))
    return regs.astype(np.uint32)


def acc_entry(i, j, m):
    """(register, lane) of D[i][j] (calculator: rows in runs of 4 per lane group)."""
    groups = 64 // m
    return (i // (4 * groups)) * 4 + i % 4, j + m * ((i // 4) % groups)


CASES = [
    ("gfx942", "v_mfma_f32_32x32x8_bf16", 32, 8, "bf16"),
    ("gfx942", "v_mfma_f32_16x16x16_f16", 16, 16, "f16"),
    ("gfx942", "v_mfma_f32_32x32x16_fp8_fp8", 32, 16, "fp8"),
    ("gfx942", "v_mfma_f32_16x16x32_bf8_bf8", 16, 32, "bf8"),
    ("gfx950", "v_mfma_f32_32x32x16_bf16", 32, 16, "bf16"),
    ("gfx950", "v_mfma_f32_16x16x32_f16", 16, 32, "f16"),
    ("gfx950", "v_mfma_f32_32x32x16_bf8_bf8", 32, 16, "bf8"),
    ("gfx950", "v_mfma_f32_16x16x32_fp8_fp8", 16, 32, "fp8"),
]


@pytest.mark.parametrize("target,op,m,k,kind", CASES)
@pytest.mark.parametrize("c_zero", [False, True])
def test_mfma_computes_a_b_plus_c(target, op, m, k, kind, c_zero, rng):
    a = decode(encode(rng.standard_normal((m, k)), kind, target)[0], kind, target)
    b = decode(encode(rng.standard_normal((k, m)), kind, target)[0], kind, target)
    c = rng.standard_normal((m, m)).astype(np.float32)
    abits, bits = encode(a, kind, target)
    bbits, _ = encode(b, kind, target)
    nab = k * bits // (64 // m) // 32 if k * bits // (64 // m) >= 32 else 1
    ra = place_operand(abits, m, k, nab, bits, False)
    rb = place_operand(bbits, m, k, nab, bits, True)
    nacc = m * m // 64
    acc = np.zeros((nacc, 64), np.uint32)
    for i in range(m):
        for j in range(m):
            r, lane = acc_entry(i, j, m)
            acc[r, lane] = c[i, j].view(np.uint32)
    v = {r: ra[r] for r in range(nab)}
    v.update({8 + r: rb[r] for r in range(nab)})
    v.update({256 + r: acc[r] for r in range(nacc)})
    srcc = "0" if c_zero else f"a[0:{nacc - 1}]"
    w = execute([f"{op} a[0:{nacc - 1}], v[0:{nab - 1}], v[8:{8 + nab - 1}], {srcc}"],
                target, v=v)
    got = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            r, lane = acc_entry(i, j, m)
            got[i, j] = w.v[256 + r, lane].view(np.float32)
    want = a @ b + (0 if c_zero else c.astype(np.float64))
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_calculator_spot_checks():
    """Entries the Matrix Instruction Calculator prints for CDNA3: 32x32x8 bf16
    A[1][4] = v0{33}.[15:0], A[0][3] = v1{0}.[31:16]; 32x32x16 fp8 B[2][5] = v0{5}.[23:16];
    D[5][3] = v1{35} (a one-hot A and B make D one-hot)."""
    v = {0: np.zeros(64, np.uint32), 1: np.zeros(64, np.uint32)}
    v[0][33] = 0x3F80                     # A[1][4] = 1.0 (bf16)
    v[8] = np.zeros(64, np.uint32)
    v[9] = np.zeros(64, np.uint32)
    v[8][3 + 32] = 0x3F80                 # B[4][3] = 1.0: B[k][n] = v{k//4 % 2 ...}
    w = execute(["v_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[8:9], 0"], "gfx942", v=v)
    d = w.v[256:272].view(np.float32)
    assert d.sum() == 1 and d[1, 3] == 1          # D[1][3] = A[1][4] * B[4][3]: v1{3}
    v = {0: np.zeros(64, np.uint32), 1: np.zeros(64, np.uint32), 8: np.zeros(64, np.uint32),
         9: np.zeros(64, np.uint32)}
    v[1][0] = 0x3F80 << 16                 # A[0][3]
    v[9][5] = 0x3F80 << 16                 # B[3][5]
    w = execute(["v_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[8:9], 0"], "gfx942", v=v)
    assert w.v[256, 5].view(np.float32) == 1      # D[0][5] = v0{5}
    v = {r: np.zeros(64, np.uint32) for r in (0, 1, 8, 9)}
    one = int(np.float32(1).astype(ml_dtypes.float8_e4m3fnuz).view(np.uint8))
    v[8][5] = one << 16                    # B[2][5] = v0{5}.[23:16]
    v[0][5] = one << 16                    # A[5][2] = v0{5}.[23:16]
    w = execute(["v_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[8:9], 0"], "gfx942", v=v)
    assert w.v[256 + 1, 32 + 5].view(np.float32) == 1    # D[5][5] = v1{37}


def scaled_product(op, m, regs, operands, ea, eb, mods, junk=0):
    """D of one block-scaled MFMA from A's and B's registers (`operands`: {register: lanes},
    A from v0, B from v8, `regs` each), lane l's E8M0 scales of A (ea[l % m, l // m], with
    `junk` in the scale register's other bytes) and B in v20 / v21."""
    lane = np.arange(64)
    v = dict(operands)
    v[20] = ea[lane % m, lane // m].astype(np.uint32) | junk
    v[21] = eb[lane // m, lane % m].astype(np.uint32)
    nacc = m * m // 64
    w = execute([f"{op} a[0:{nacc - 1}], v[0:{regs - 1}], v[8:{7 + regs}], 0, v20, v21 "
                 f"op_sel_hi:[0,0,0] {mods}"], "gfx950", v=v)
    got = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            r, ln = acc_entry(i, j, m)
            got[i, j] = w.v[256 + r, ln].view(np.float32)
    return got


def scaled_reference(a, b, ea, eb):
    """(a scaled by its blocks' powers of two) @ (b scaled likewise), float64."""
    return (a * np.repeat(2.0 ** (ea - 127), 32, 1)) @ (b * np.repeat(2.0 ** (eb - 127), 32, 0))


@pytest.mark.parametrize("m,k,op", [(32, 64, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                    (16, 128, "v_mfma_scale_f32_16x16x128_f8f6f4")])
@pytest.mark.parametrize("kind_a,kind_b", [("fp8", "fp8"), ("bf8", "fp8"), ("fp8", "bf8")])
def test_block_scaled_mfma(m, k, op, kind_a, kind_b, rng):
    """CDNA4 V_MFMA_SCALE_F32_*_F8F6F4: two runs of 16 K per lane (place_f8f6f4), CBSZ /
    BLGP the A / B format (0 FP8, 1 BF8), lane l's E8M0 scale (byte 0 of its scale VGPR)
    scaling K block l // M of row (A) or column (B) l % M."""
    t = "gfx950"
    a = decode(encode(rng.standard_normal((m, k)), kind_a, t)[0], kind_a, t)
    b = decode(encode(rng.standard_normal((k, m)), kind_b, t)[0], kind_b, t)
    ea = rng.integers(120, 134, (m, k // 32))
    eb = rng.integers(120, 134, (k // 32, m))
    ra = place_f8f6f4(encode(a, kind_a, t)[0], m, k, False)
    rb = place_f8f6f4(encode(b, kind_b, t)[0], m, k, True)
    fmt = {"fp8": 0, "bf8": 1}
    mods = " ".join(x for x in (f"cbsz:{fmt[kind_a]}" if fmt[kind_a] else "",
                                f"blgp:{fmt[kind_b]}" if fmt[kind_b] else "") if x)
    got = scaled_product(op, m, 8, {**{r: ra[r] for r in range(8)},
                                    **{8 + r: rb[r] for r in range(8)}}, ea, eb, mods,
                         junk=0xAB00)                # junk in the scale's other bytes
    np.testing.assert_allclose(got, scaled_reference(a, b, ea, eb), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m,k,op", [(32, 64, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                    (16, 128, "v_mfma_scale_f32_16x16x128_f8f6f4")])
def test_block_scaled_fp4_mfma(m, k, op, rng):
    """CBSZ = BLGP = 4 (FP4 E2M1): 4 registers an operand, lane l holding K = 32 (l // M)
    .. + 31 of row (A) / column (B) l % M, element j in bits 4 (j % 2) .. + 3 of byte j // 2
    (the ROCm blog's fp4 example); values from ml_dtypes, placed here by hand."""
    ca, cb = rng.integers(0, 16, (m, k)), rng.integers(0, 16, (k, m))
    val = lambda c: c.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # noqa: E731
    ea = rng.integers(120, 134, (m, k // 32))
    eb = rng.integers(120, 134, (k // 32, m))
    lane = np.arange(64)
    v = {}
    for base, codes in ((0, ca), (8, cb.T)):             # B by column: its K runs down
        run = codes[lane % m]                                # (64, k): each lane's row
        ks = 32 * (lane // m)[:, None] + np.arange(32)[None, :]
        nib = np.take_along_axis(run, ks, axis=1).astype(np.uint32)      # (64, 32)
        words = np.zeros((64, 4), np.uint32)
        for j in range(32):
            words[:, j // 8] |= nib[:, j] << (4 * (j % 8))
        v.update({base + r: words[:, r] for r in range(4)})
    got = scaled_product(op, m, 4, v, ea, eb, "cbsz:4 blgp:4")
    np.testing.assert_allclose(got, scaled_reference(val(ca), val(cb), ea, eb), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("fmt,dtype", [(2, ml_dtypes.float6_e2m3fn),
                                       (3, ml_dtypes.float6_e3m2fn)])
@pytest.mark.parametrize("m,k,op", [(32, 64, "v_mfma_scale_f32_32x32x64_f8f6f4"),
                                    (16, 128, "v_mfma_scale_f32_16x16x128_f8f6f4")])
def test_block_scaled_fp6_mfma(m, k, op, fmt, dtype, rng):
    """CBSZ = BLGP = 2 (FP6 E2M3) / 3 (BF6 E3M2): 6 registers an operand, lane l holding
    the 8-bit layout's two runs of 16 K values (K = 16 (l // M) + s and K/2 + 16 (l // M) +
    s) of row (A) / column (B) l % M, value j in bits 6j .. 6j + 5 of the six registers
    taken as one little-endian bit string, so values 5, 10, 21 and 26 straddle two
    registers (gem5's PackedReg, Composable Kernel's f6x32_pk_t); values from ml_dtypes,
    placed here by hand with Python integers."""
    ca, cb = rng.integers(0, 64, (m, k)), rng.integers(0, 64, (k, m))
    val = lambda c: c.astype(np.uint8).view(dtype).astype(np.float64)  # noqa: E731
    ea = rng.integers(120, 134, (m, k // 32))
    eb = rng.integers(120, 134, (k // 32, m))
    v = {}
    for base, codes in ((0, ca), (8, cb.T)):             # B by column: its K runs down
        words = np.zeros((6, 64), np.uint32)
        for ln in range(64):
            g = ln // m
            ks = [16 * g + s for s in range(16)] + [k // 2 + 16 * g + s for s in range(16)]
            stream = sum(int(codes[ln % m, kk]) << (6 * j) for j, kk in enumerate(ks))
            for r in range(6):
                words[r, ln] = (stream >> (32 * r)) & 0xFFFFFFFF
        v.update({base + r: words[r] for r in range(6)})
    got = scaled_product(op, m, 6, v, ea, eb, f"cbsz:{fmt} blgp:{fmt}")
    np.testing.assert_allclose(got, scaled_reference(val(ca), val(cb), ea, eb), rtol=1e-6,
                               atol=1e-6)


def test_fp6_code_tables_agree_with_ml_dtypes():
    """The emulator's FP6 values come from the OCP MX bit fields; ml_dtypes' are another
    implementation of the same specification: all 64 codes of both formats agree."""
    from pykittens.isa.mfma import FP6
    codes = np.arange(64, dtype=np.uint8)
    for fmt, dtype in ((2, ml_dtypes.float6_e2m3fn), (3, ml_dtypes.float6_e3m2fn)):
        np.testing.assert_array_equal(FP6[fmt], codes.view(dtype).astype(np.float64))
    assert FP6[2].max() == 7.5 and FP6[3].max() == 28.0           # the formats' largest


def test_unsupported_forms_are_named():
    with pytest.raises(ISAError, match="not one of FP8, BF8, FP6, BF6, FP4"):
        execute(["v_mfma_scale_f32_32x32x64_f8f6f4 a[0:15], v[0:5], v[8:13], 0, v20, v21 "
                 "op_sel_hi:[0,0,0] cbsz:5 blgp:5"], "gfx950")
    with pytest.raises(ISAError, match="format 2 takes 6 registers, not 8"):
        execute(["v_mfma_scale_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], 0, v20, v21 "
                 "op_sel_hi:[0,0,0] cbsz:2 blgp:2"], "gfx950")
    with pytest.raises(ISAError, match="format 4 takes 4 registers, not 8"):
        execute(["v_mfma_scale_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], 0, v20, v21 "
                 "op_sel_hi:[0,0,0] cbsz:4 blgp:4"], "gfx950")
