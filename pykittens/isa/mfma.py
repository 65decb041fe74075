"""Matrix instructions (MFMA): D = A x B + C on one M x N x K block per wave, and the
block-scaled f8f6f4 family of gfx950.

Operand layouts are written here from AMD's documentation, independently of
`pykittens.targets` (an oracle that shared those tables would prove nothing):
- CDNA3 ISA Reference Guide, chapter "Matrix Arithmetic Instructions" (dense MFMA),
  and the AMD Matrix Instruction Calculator's register layouts for CDNA3
  (`--register-layout` of v_mfma_f32_32x32x8_bf16, _16x16x16_bf16, _32x32x16_fp8_fp8,
  _16x16x32_fp8_fp8): with G = 64 / M lane groups and k = K / G values per lane, lane l
  holds A[l % M][k * (l // M) + j] and B[k * (l // N) + j][l % N], j = 0..k-1, packed
  little-endian (element j in the lowest bits first) across consecutive registers;
  D register r of lane l is D[(r // 4) * 4G + 4 (l // N) + r % 4][l % N].
- CDNA4 ISA Reference Guide, the same chapter and "MFMA Transpose Load from LDS": the
  doubled-K 16-bit MFMAs keep that rule with 8 consecutive K values per lane (the
  transpose loads fill K = 0..3 and 8..11, then 4..7 and 12..15, of a 32x32x16 operand).
  V_MFMA_[SCALE_]F32_{32X32X64,16X16X128}_F8F6F4 with 8-bit operands hold 32 K values per
  lane in two runs of 16, K/2 apart: lane group g = l // M holds K = 16 g .. 16 g + 15 and
  K/2 + 16 g .. (AMD ROCm blog "Matrix Core Programming on AMD CDNA3 and CDNA4", the
  32x32x64 fp8 example; Triton's AMD backend: "2 16-consecutive elements blocks" for
  mxfp8). Lane l's E8M0 scale (2^(e - 127)) multiplies K block l // M (32 elements) of
  row (A) or column (B) l % M, wherever those elements sit. CBSZ / BLGP give A's / B's format:
  0 FP8 (E4M3), 1 BF8 (E5M2), 4 FP4 (E2M1: 4 registers, lane l holding K = 32 (l // M) ..
  + 31 consecutively, element j in bits 4 (j % 2) .. + 3 of byte j // 2; the same blog's
  fp4 32x32x64 example); 2 FP6 (E2M3) and 3 BF6 (E3M2): 6 registers, the 8-bit operands'
  two runs of 16 K values, each value 6 bits wide and packed densely, value j of the lane
  in bits 6j .. 6j + 5 of its registers read as one little-endian bit string (a value may
  straddle two registers; gem5's PackedReg for the CDNA3 MXFP6 operands and Composable
  Kernel's f6x32_pk_t pack them so). OP_SEL / OP_SEL_HI bit 0 (A)
  and 1 (B) select the scale's byte (op_sel is the low bit).

Arithmetic: products of the decoded inputs summed in float64, plus C, rounded once to
float32 (the hardware's internal order is not specified; results agree to f32 rounding).
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from .state import LANES, ISAError

U32 = np.uint32

# 8-bit float formats by target (CDNA3 ISA: FP8/BF8 are the FNUZ variants on gfx942;
# CDNA4: the OCP E4M3 / E5M2 formats)
FP8_FORMATS = {"gfx942": {"fp8": ml_dtypes.float8_e4m3fnuz, "bf8": ml_dtypes.float8_e5m2fnuz},
       "gfx950": {"fp8": ml_dtypes.float8_e4m3fn, "bf8": ml_dtypes.float8_e5m2}}


def _table(dtype) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)


# OCP MX specification, FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; code ->
# value (no inf or NaN)
_E2M1 = np.array([s * m * 2.0 ** e for s in (1, -1)
                  for e, m in ((0, 0.0), (0, 0.5), (0, 1.0), (0, 1.5), (1, 1.0), (1, 1.5),
                               (2, 1.0), (2, 1.5))])
FP4 = 4           # the CBSZ / BLGP code of FP4 operands


def _fp6_values(exp_bits: int) -> np.ndarray:
    """OCP MX specification, FP6: code -> value for E2M3 (exp_bits 2, bias 1) or E3M2
    (exp_bits 3, bias 3): sign bit 5, then the exponent, then the mantissa; exponent 0 is
    subnormal (2^(1 - bias) x 0.m); no inf or NaN."""
    man_bits = 5 - exp_bits
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(64)
    for code in range(64):
        sign = -1.0 if code >> 5 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        frac = (code & ((1 << man_bits) - 1)) / (1 << man_bits)
        out[code] = sign * (2.0 ** (e - bias) * (1 + frac) if e else 2.0 ** (1 - bias) * frac)
    return out


FP6 = {2: _fp6_values(2), 3: _fp6_values(3)}    # CBSZ / BLGP code -> FP6 / BF6 values


_F8_TABLES = {t: {k: _table(v) for k, v in d.items()} for t, d in FP8_FORMATS.items()}

# MFMA passes (4 cycles each), for the hazard rules: the CDNA3 and CDNA4 guides' tables of
# dense MFMAs (the Matrix Instruction Calculator's cycle counts / 4); the scaled
# f8f6f4 MFMAs take 16 (32x32x64) / 8 (16x16x128) passes with an 8-bit operand and half
# that with both operands FP4 (the MI355X data sheet's MXFP4 rate is twice MXFP8's; LLVM's
# gfx950 model, as ROCm 7.2's compiler pads a 16x16x128 FP4 result for 4 passes).
PASSES = {(32, 32): 8, (16, 16): 4}
SCALED_PASSES = {(32, 32): 16, (16, 16): 8}

_NAME = re.compile(r"v_mfma_(scale_)?f32_(\d+)x(\d+)x(\d+)_?(bf16|f16|fp8_fp8|fp8_bf8|"
                   r"bf8_fp8|bf8_bf8|f8f6f4)(_1k)?")


def parse_name(op: str):
    """(scaled, m, n, k, input kinds) of an MFMA mnemonic, or None."""
    m = _NAME.fullmatch(op)
    if not m:
        return None
    scaled, kind = m.group(1), m.group(5)
    mm, nn, kk = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if kind in ("bf16", "f16"):
        kinds = (kind, kind)
    elif kind == "f8f6f4":
        kinds = ("f8f6f4", "f8f6f4")
    else:
        kinds = tuple(kind.split("_"))
    return bool(scaled), mm, nn, kk, kinds


def passes(op: str, mods=None) -> int:
    p = parse_name(op)
    if p is None:
        raise ISAError(f"{op} is not a known MFMA")
    scaled, m, n, k, kinds = p
    table = SCALED_PASSES if kinds[0] == "f8f6f4" else PASSES
    if (m, n) not in table:
        raise ISAError(f"{op}: MFMA shape {m}x{n} is not in the emulator's pass table")
    mods = mods or {}
    narrow = (FP4, *FP6)          # 4- and 6-bit data: the MI355X data sheet's MXFP4 and
    # MXFP6 rates are both twice MXFP8's
    half = kinds[0] == "f8f6f4" and int(mods.get("cbsz", 0)) in narrow and \
        int(mods.get("blgp", 0)) in narrow
    return table[(m, n)] // (2 if half else 1)


def operand_index(m: int, k: int, f8f6f4: bool = False, fp4: bool = False):
    """(row/col, k) index arrays of shape (64, k/G): what each lane's j-th element of the
    A (rows) or B (cols) operand is (f8f6f4: two runs of 16, K/2 apart; with FP4 data one
    run of 32)."""
    groups = LANES // m
    per = k // groups
    lane = np.arange(LANES)[:, None]
    j = np.arange(per)[None, :]
    if f8f6f4 and not fp4:
        kk = (j // 16) * (k // 2) + 16 * (lane // m) + j % 16
    else:
        kk = per * (lane // m) + j
    return np.broadcast_to(lane % m, (LANES, per)), kk


def acc_index(m: int, n: int):
    """(row, col) of D/C register r (axis 1) of lane l (axis 0)."""
    groups = LANES // n
    regs = m * n // LANES
    lane = np.arange(LANES)[:, None]
    r = np.arange(regs)[None, :]
    return (r // 4) * 4 * groups + 4 * (lane // n) + r % 4, np.broadcast_to(lane % n, (LANES, regs))


def _decode(raw_regs: np.ndarray, kind: str, per: int, target: str, fmt: int = 0) -> np.ndarray:
    """(regs, 64) uint32 -> (64, per) float64 elements of the operand."""
    words = np.ascontiguousarray(raw_regs.T.astype("<u4"))          # (64, regs)
    if kind in ("bf16", "f16"):
        h = words.view("<u2")[:, :per]
        dt = ml_dtypes.bfloat16 if kind == "bf16" else np.float16
        return h.view(dt).astype(np.float64)
    if kind == "f8f6f4" and fmt == FP4:             # two a byte, low nibble first
        b = words.view(np.uint8)[:, :per // 2]
        return _E2M1[np.stack([b & 15, b >> 4], axis=2).reshape(LANES, per)]
    if kind == "f8f6f4" and fmt in FP6:             # 6 bits each, packed across registers
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
        codes = bits[:, :6 * per].reshape(LANES, per, 6) @ (1 << np.arange(6))
        return FP6[fmt][codes]
    b = words.view(np.uint8)[:, :per]
    if kind == "f8f6f4":
        if fmt not in (0, 1):
            raise ISAError(f"f8f6f4 format code {fmt} is not one of FP8, BF8, FP6, BF6, FP4")
        kind = "fp8" if fmt == 0 else "bf8"
    return _F8_TABLES[target][kind][b]


def compile_mfma(inst, ctx):
    parsed = parse_name(inst.op)
    if parsed is None:
        return None
    scaled, m, n, k, kinds = parsed
    if m != n or m not in (16, 32):
        raise ISAError(f"{inst.where()}: MFMA shape {m}x{n}x{k} is not emulated")
    if inst.mods.get("cbsz") and not scaled or inst.mods.get("abid") or (
            inst.mods.get("blgp") and not scaled):
        raise ISAError(f"{inst.where()}: CBSZ/ABID/BLGP broadcasts are not emulated")
    target = ctx.target
    ops = inst.ops
    d, a, b, c = ops[:4]
    f8f6f4 = kinds[0] == "f8f6f4"
    fmt_a = int(inst.mods.get("cbsz", 0)) if scaled else 0
    fmt_b = int(inst.mods.get("blgp", 0)) if scaled else 0
    rows, ka = operand_index(m, k, f8f6f4, fmt_a == FP4)
    cols, kb = operand_index(n, k, f8f6f4, fmt_b == FP4)
    per = ka.shape[1]
    ri, ci = acc_index(m, n)
    nacc = m * n // LANES
    if d.n != nacc:
        raise ISAError(f"{inst.where()}: D has {d.n} registers, {inst.op} writes {nacc}")
    for o, fmt in ((a, fmt_a), (b, fmt_b)):
        if fmt not in (0, 1, FP4, *FP6):
            raise ISAError(f"{inst.where()}: f8f6f4 format code {fmt} is not one of FP8, BF8, "
                           "FP6, BF6, FP4")
        bits = 4 if fmt == FP4 else 6 if fmt in FP6 else 8
        want = per * bits // 32 if f8f6f4 else o.n
        if o.n != want:
            raise ISAError(f"{inst.where()}: an operand of format {fmt} takes {want} "
                           f"registers, not {o.n}")
    op_sel = tuple(inst.mods.get("op_sel", (0, 0, 0)))
    op_sel_hi = tuple(inst.mods.get("op_sel_hi", (0, 0, 0)))
    sel = lambda t, i: t[i] if len(t) > i else 0
    byte_a = sel(op_sel, 0) | sel(op_sel_hi, 0) << 1
    byte_b = sel(op_sel, 1) | sel(op_sel_hi, 1) << 1
    c_const = c.kind in ("imm", "float")
    if c_const and (c.kind == "float" or c.value != 0):
        raise ISAError(f"{inst.where()}: only 0 is emulated as a constant C")
    if scaled:
        from .operands import vsrc
        sa, sb = vsrc(ops[4]), vsrc(ops[5])

    def regs(w, o):
        return w.v[o.reg:o.reg + o.n]

    def mfma(w):
        av = _decode(regs(w, a), kinds[0], per, target, fmt_a)        # (64, per)
        bv = _decode(regs(w, b), kinds[1], per, target, fmt_b)
        A = np.zeros((m, k))
        B = np.zeros((k, n))
        A[rows, ka] = av
        B[kb, cols] = bv
        if scaled:
            ea = (np.broadcast_to(np.asarray(sa(w), U32), (LANES,)) >> U32(8 * byte_a)) & U32(0xFF)
            eb = (np.broadcast_to(np.asarray(sb(w), U32), (LANES,)) >> U32(8 * byte_b)) & U32(0xFF)
            sA = np.zeros((m, k // 32))
            sB = np.zeros((k // 32, n))
            blk_a = np.arange(LANES) // m                 # the K block of lane l's scale
            blk_b = np.arange(LANES) // n
            sA[rows[:, 0], blk_a] = _e8m0(ea)
            sB[blk_b, cols[:, 0]] = _e8m0(eb)
            A = A * np.repeat(sA, 32, axis=1)
            B = B * np.repeat(sB, 32, axis=0)
        acc = A @ B
        if not c_const:
            cv = regs(w, c).T.view(np.float32).astype(np.float64)       # (64, nacc)
            C = np.zeros((m, n))
            C[ri, ci] = cv
            acc = acc + C
        out = acc[ri, ci].astype(np.float32).view(U32)                  # (64, nacc)
        for r in range(nacc):
            w.write_v(d.reg + r, out[:, r])
    return mfma


def _e8m0(e: np.ndarray) -> np.ndarray:
    """E8M0 scale: 2^(e - 127); 0xFF is NaN (OCP MX specification, CDNA4 ISA 7.1)."""
    e = e.astype(np.float64)
    return np.where(e == 255, np.nan, np.exp2(e - 127))
