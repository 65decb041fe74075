"""Vector ALU: VOP1, VOP2, VOP3, VOPC and VOP3P, with the DPP and SDWA operand forms, and
the cross-lane moves (readlane, readfirstlane, writelane, accvgpr moves).

Semantics follow the pseudocode of the AMD Instinct MI300 (CDNA3) ISA Reference Guide,
chapter "Instructions" (the VOP2, VOP1, VOPC, VOP3P and VOP3 lists), and for the gfx950
additions (v_bitop3_b16/b32, v_cvt_pk_bf16_f32, v_cvt_pk_f16_f32) the AMD Instinct CDNA4
ISA Reference Guide, same chapter. Operand forms: chapter "Vector ALU Operations" (source
modifiers, DPP, SDWA, packed math). Every op runs on
all 64 lanes with numpy; only the lanes in EXEC are written.

Floating point: numpy's IEEE float32/float16 arithmetic (round to nearest even,
denormals kept: the mode a kernel descriptor sets by default). The transcendental ops
(v_exp_f32, v_log_f32, v_rcp_f32, v_rsq_f32, v_sqrt_f32) are correctly rounded here where
the hardware allows 1 ulp; fused multiply-adds are computed in float64 (exact product)
and rounded once more to float32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .decode import Operand
from .operands import const_bits, sdst, ssrc, vsrc, vsrc64
from .state import LANES, ISAError, bits_of, lanes_of

F32, U32, I32 = np.float32, np.uint32, np.int32
_LANE = np.arange(LANES)


# ----------------------------------------------------------------------------- helpers

def f32(x):
    return np.asarray(x, U32).view(F32)


def bits32(x):
    a = np.asarray(x)
    if a.dtype == F32:
        return a.view(U32)
    if a.dtype == np.float64:
        return a.astype(F32).view(U32)
    return a.astype(U32, copy=False) if a.dtype != U32 else a


def f16_of(x):
    return (np.asarray(x, U32) & 0xFFFF).astype(np.uint16).view(np.float16)


def bits16(h):
    return np.asarray(h, np.float16).view(np.uint16).astype(U32)


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even, NaN kept quiet (12.11
    V_CVT_PK_BF16_F32: f32_to_bf16 in round-to-nearest-even mode)."""
    return np.asarray(x, F32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(U32)


def fma32(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64)
            + np.asarray(c, np.float64)).astype(F32)


def _fmax(a, b):
    """V_MAX_F32: a NaN operand yields the other; +0 > -0."""
    r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.where(a >= b, a, b)))
    zero = (a == 0) & (b == 0)
    if np.any(zero):
        r = np.where(zero, (f32(bits32(a) & bits32(b))), r)
    return r.astype(F32)


def _fmin(a, b):
    r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.where(a <= b, a, b)))
    zero = (a == 0) & (b == 0)
    if np.any(zero):
        r = np.where(zero, (f32(bits32(a) | bits32(b))), r)
    return r.astype(F32)


def _med3(a, b, c, mx, mn):
    return mx(mn(a, b), mn(mx(a, b), c))


def _cvt_f32_int(x, lo, hi, out):
    """f32 -> integer, rounding toward zero, saturating, NaN -> 0 (V_CVT_I32_F32)."""
    x = np.asarray(x, np.float64)
    r = np.where(np.isnan(x), 0, np.clip(np.trunc(np.nan_to_num(x, nan=0.0)), lo, hi))
    return r.astype(out)


def _perm(s0, s1, sel):
    """V_PERM_B32: each byte of S2 picks a byte of {S0, S1} (S1 the low word): 0-7
    a byte, 8-11 the sign of byte 1/3/5/7 spread to 8 bits, 12 0x00, 13 and up 0xff."""
    lo = np.broadcast_to(np.asarray(s1, U32), (LANES,)).astype("<u4")
    hi = np.broadcast_to(np.asarray(s0, U32), (LANES,)).astype("<u4")
    b = np.stack([lo, hi], 1).view(np.uint8)                        # (64, 8)
    sign = np.where(b[:, 1::2] >> 7, np.uint8(0xFF), np.uint8(0))   # bytes 1, 3, 5, 7
    table = np.concatenate([b, sign, np.zeros((LANES, 1), np.uint8),
                            np.full((LANES, 1), 0xFF, np.uint8)], 1)   # (64, 14)
    sel = np.broadcast_to(np.asarray(sel, U32), (LANES,)).astype("<u4")
    idx = np.minimum(sel.view(np.uint8).reshape(LANES, 4), 13)
    return np.ascontiguousarray(np.take_along_axis(table, idx, 1)).view("<u4")[:, 0].astype(U32)


def _bitop3(ttbl, a, b, c, mask):
    """V_BITOP3_B32/B16 (CDNA4 ISA): bit i of the result is TTBL[(a_i << 2) |
    (b_i << 1) | c_i]."""
    a, b, c = (np.asarray(x, U32) for x in (a, b, c))
    r = np.zeros(np.broadcast(a, b, c).shape, U32)
    for idx in range(8):
        if ttbl >> idx & 1:
            ta = a if idx & 4 else ~a
            tb = b if idx & 2 else ~b
            tc = c if idx & 1 else ~c
            r |= ta & tb & tc
    return r & U32(mask)


def _div_scale(s0, s1, s2):
    """V_DIV_SCALE_F32: scale the operands of a division so that its Newton
    iteration neither overflows nor underflows; VCC says the quotient must be rescaled
    (by V_DIV_FMAS). The pseudocode's "1/S1 is an f64 denormal" tests cannot hold for an
    f32 S1 and are kept for the record. Returns (D, vcc)."""
    s0, s1, s2 = np.broadcast_arrays(*(np.asarray(x, F32) for x in (s0, s1, s2)))
    e1 = ((s1.view(U32) >> 23) & 0xFF).astype(np.int64)
    e2 = ((s2.view(U32) >> 23) & 0xFF).astype(np.int64)
    tiny32, tiny64 = np.finfo(F32).tiny, np.finfo(np.float64).tiny
    with np.errstate(all="ignore"):
        inv = np.abs(1.0 / s1.astype(np.float64))
        quo = np.abs((s2 / s1).astype(F32))
    inv_denorm = (inv > 0) & (inv < tiny64)
    quo_denorm = (quo > 0) & (quo < tiny32)
    up, down = np.ldexp(s0, 64).astype(F32), np.ldexp(s0, -64).astype(F32)
    d = s0.copy()
    vcc = np.zeros(s0.shape, bool)
    done = np.zeros(s0.shape, bool)
    for cond, value, sets_vcc, only_if in (
            ((s2 == 0) | (s1 == 0), np.float32(np.nan), False, None),
            (e2 - e1 >= 96, up, True, s0 == s1),          # N / D near the f32 maximum
            ((e1 == 0) & (s1 != 0), up, False, None),     # D denormal
            (inv_denorm & quo_denorm, up, True, s0 == s1),
            (inv_denorm, down, False, None),
            (quo_denorm, up, True, s0 == s2),             # quotient denormal: scale N
            (e2 <= 23, up, False, None)):                 # N tiny
        c = cond & ~done
        vcc |= c & sets_vcc
        apply = c if only_if is None else c & only_if
        d = np.where(apply, value, d)
        done |= c
    return d, np.broadcast_to(vcc, (LANES,))


def _div_fixup(s0, s1, s2):
    """V_DIV_FIXUP_F32: the special cases of S2 / S1 around the quotient S0."""
    s0, s1, s2 = np.broadcast_arrays(*(np.asarray(x, F32) for x in (s0, s1, s2)))
    sign = np.signbit(s1) ^ np.signbit(s2)
    e1 = (s1.view(U32) >> 23) & 0xFF
    e2 = (s2.view(U32) >> 23) & 0xFF
    inf, nan_bits = np.float32(np.inf), np.uint32(0xFFC00000)
    r = np.where(sign, -np.abs(s0), np.abs(s0)).astype(F32)
    conds = [
        (np.isnan(s2), s2),
        (np.isnan(s1), s1),
        ((s1 == 0) & (s2 == 0), nan_bits.view(F32)),
        (np.isinf(s1) & np.isinf(s2), nan_bits.view(F32)),
        ((s1 == 0) | np.isinf(s2), np.where(sign, -inf, inf)),
        (np.isinf(s1) | (s2 == 0), np.where(sign, F32(-0.0), F32(0.0))),
        (e2.astype(np.int64) - e1.astype(np.int64) < -150,
         np.where(sign, -np.finfo(F32).tiny, np.finfo(F32).tiny)),
        (e1 == 255, np.where(sign, -np.finfo(F32).max, np.finfo(F32).max)),
    ]
    for cond, val in reversed(conds):
        r = np.where(cond, val, r)
    return r.astype(F32)


def _class(x, mask):
    """V_CMP_CLASS_F32: bit of S1 for the class of S0: 0 signalling NaN, 1 quiet
    NaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf."""
    b = np.broadcast_to(np.asarray(x, F32), (LANES,)).view(U32)
    exp, man, neg = (b >> 23) & 0xFF, b & 0x7FFFFF, (b >> 31) == 1
    cls = np.where(exp == 255,
                   np.where(man == 0, np.where(neg, 2, 9), np.where(man >> 22, 1, 0)),
                   np.where(exp > 0, np.where(neg, 3, 8),
                            np.where(man > 0, np.where(neg, 4, 7), np.where(neg, 5, 6))))
    return (np.broadcast_to(np.asarray(mask, U32), (LANES,)) >> cls.astype(U32)) & 1 == 1


# ----------------------------------------------------------------------------- op tables
# name -> (source types, result type, fn). Types: f32/f16 (float, source modifiers
# apply), u32/i32/b32, u16/i16 (low half, or the half op_sel picks), u64/f64 (register
# pairs). fn gets numpy values of those types and returns the result's.

_REV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], U32)


def _brev32(x):
    x = np.asarray(x, U32)
    return ((_REV8[x & U32(0xFF)] << U32(24)) | (_REV8[(x >> U32(8)) & U32(0xFF)] << U32(16))
            | (_REV8[(x >> U32(16)) & U32(0xFF)] << U32(8)) | _REV8[x >> U32(24)])


def _sh(x):
    return np.asarray(x, U32) & U32(31)


def _u24(x):
    return np.asarray(x, U32) & U32(0xFFFFFF)


def _i24(x):
    x = np.asarray(x, U32).astype(np.int64) & 0xFFFFFF
    return np.where(x >= 1 << 23, x - (1 << 24), x)


OPS = {
    # VOP2 / VOP3 float
    "v_add_f32": (("f32", "f32"), "f32", lambda a, b: a + b),
    "v_sub_f32": (("f32", "f32"), "f32", lambda a, b: a - b),
    "v_subrev_f32": (("f32", "f32"), "f32", lambda a, b: b - a),
    "v_mul_f32": (("f32", "f32"), "f32", lambda a, b: a * b),
    "v_max_f32": (("f32", "f32"), "f32", _fmax),
    "v_min_f32": (("f32", "f32"), "f32", _fmin),
    "v_ldexp_f32": (("f32", "i32"), "f32",
                    lambda a, b: np.ldexp(a, np.clip(np.asarray(b, np.int64), -300, 300)
                                          .astype(np.int32)).astype(F32)),
    "v_fma_f32": (("f32", "f32", "f32"), "f32", fma32),
    "v_mad_f32": (("f32", "f32", "f32"), "f32", lambda a, b, c: (a * b + c).astype(F32)),
    "v_max3_f32": (("f32",) * 3, "f32", lambda a, b, c: _fmax(_fmax(a, b), c)),
    "v_min3_f32": (("f32",) * 3, "f32", lambda a, b, c: _fmin(_fmin(a, b), c)),
    "v_med3_f32": (("f32",) * 3, "f32", lambda a, b, c: _med3(a, b, c, _fmax, _fmin)),
    # VOP1 float
    "v_mov_b32": (("b32",), "b32", lambda a: a),
    "v_exp_f32": (("f32",), "f32", lambda a: np.exp2(a)),
    "v_log_f32": (("f32",), "f32", lambda a: np.log2(a)),
    "v_rcp_f32": (("f32",), "f32", lambda a: F32(1) / a),
    "v_rcp_iflag_f32": (("f32",), "f32", lambda a: F32(1) / a),
    "v_rsq_f32": (("f32",), "f32", lambda a: F32(1) / np.sqrt(a)),
    "v_sqrt_f32": (("f32",), "f32", lambda a: np.sqrt(a)),
    "v_rndne_f32": (("f32",), "f32", lambda a: np.rint(a)),
    "v_floor_f32": (("f32",), "f32", lambda a: np.floor(a)),
    "v_ceil_f32": (("f32",), "f32", lambda a: np.ceil(a)),
    "v_trunc_f32": (("f32",), "f32", lambda a: np.trunc(a)),
    "v_fract_f32": (("f32",), "f32", lambda a: np.minimum(a - np.floor(a), F32(0.99999994))),
    "v_cvt_f32_i32": (("i32",), "f32", lambda a: np.asarray(a, I32).astype(F32)),
    "v_cvt_f32_u32": (("u32",), "f32", lambda a: np.asarray(a, U32).astype(F32)),
    "v_cvt_i32_f32": (("f32",), "i32", lambda a: _cvt_f32_int(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f32": (("f32",), "u32", lambda a: _cvt_f32_int(a, 0, 2**32 - 1, U32)),
    "v_cvt_f32_f16": (("f16",), "f32", lambda a: np.asarray(a, np.float16).astype(F32)),
    "v_cvt_f16_f32": (("f32",), "f16", lambda a: np.asarray(a, F32).astype(np.float16)),
    # integer
    "v_add_u32": (("u32", "u32"), "u32", lambda a, b: a + b),
    "v_sub_u32": (("u32", "u32"), "u32", lambda a, b: a - b),
    "v_subrev_u32": (("u32", "u32"), "u32", lambda a, b: b - a),
    "v_and_b32": (("u32", "u32"), "u32", lambda a, b: a & b),
    "v_or_b32": (("u32", "u32"), "u32", lambda a, b: a | b),
    "v_xor_b32": (("u32", "u32"), "u32", lambda a, b: a ^ b),
    "v_not_b32": (("u32",), "u32", lambda a: ~np.asarray(a, U32)),
    "v_bfrev_b32": (("u32",), "u32", lambda a: _brev32(a)),
    "v_lshlrev_b32": (("u32", "u32"), "u32", lambda a, b: b << _sh(a)),
    "v_lshrrev_b32": (("u32", "u32"), "u32", lambda a, b: b >> _sh(a)),
    "v_ashrrev_i32": (("u32", "i32"), "i32", lambda a, b: b >> _sh(a).astype(I32)),
    "v_mul_lo_u32": (("u32", "u32"), "u32",
                     lambda a, b: (np.asarray(a, np.uint64) * np.asarray(b, np.uint64))
                     .astype(U32)),
    "v_mul_hi_u32": (("u32", "u32"), "u32",
                     lambda a, b: ((np.asarray(a, np.uint64) * np.asarray(b, np.uint64))
                                   >> np.uint64(32)).astype(U32)),
    "v_mul_hi_i32": (("i32", "i32"), "i32",
                     lambda a, b: ((np.asarray(a, np.int64) * np.asarray(b, np.int64))
                                   >> 32).astype(I32)),
    "v_mul_u32_u24": (("u32", "u32"), "u32", lambda a, b: (_u24(a).astype(np.uint64)
                                                            * _u24(b)).astype(U32)),
    "v_mul_i32_i24": (("u32", "u32"), "u32", lambda a, b: (_i24(a) * _i24(b)).astype(U32)),
    "v_mad_u32_u24": (("u32", "u32", "u32"), "u32",
                      lambda a, b, c: (_u24(a).astype(np.uint64) * _u24(b) + c).astype(U32)),
    "v_max_i32": (("i32", "i32"), "i32", np.maximum),
    "v_min_i32": (("i32", "i32"), "i32", np.minimum),
    "v_max_u32": (("u32", "u32"), "u32", np.maximum),
    "v_min_u32": (("u32", "u32"), "u32", np.minimum),
    "v_med3_i32": (("i32",) * 3, "i32", lambda a, b, c: _med3(a, b, c, np.maximum, np.minimum)),
    "v_med3_u32": (("u32",) * 3, "u32", lambda a, b, c: _med3(a, b, c, np.maximum, np.minimum)),
    "v_max3_i32": (("i32",) * 3, "i32", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i32": (("i32",) * 3, "i32", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_add3_u32": (("u32",) * 3, "u32", lambda a, b, c: a + b + c),
    "v_lshl_add_u32": (("u32",) * 3, "u32", lambda a, b, c: (a << _sh(b)) + c),
    "v_add_lshl_u32": (("u32",) * 3, "u32", lambda a, b, c: (a + b) << _sh(c)),
    "v_lshl_or_b32": (("u32",) * 3, "u32", lambda a, b, c: (a << _sh(b)) | c),
    "v_and_or_b32": (("u32",) * 3, "u32", lambda a, b, c: (a & b) | c),
    "v_or3_b32": (("u32",) * 3, "u32", lambda a, b, c: a | b | c),
    "v_xad_u32": (("u32",) * 3, "u32", lambda a, b, c: (a ^ b) + c),
    "v_bfe_u32": (("u32",) * 3, "u32",
                  lambda a, b, c: (a >> _sh(b)) & ((U32(1) << _sh(c)) - U32(1))),
    "v_bfe_i32": (("i32", "u32", "u32"), "i32",
                  lambda a, b, c: np.where(_sh(c) == 0, 0, (np.asarray(a, np.int64) << (
                      32 - _sh(b).astype(np.int64) - _sh(c))).astype(I32) >> (
                      32 - _sh(c)).astype(I32))),
    "v_bfi_b32": (("u32",) * 3, "u32", lambda a, b, c: (a & b) | (~np.asarray(a, U32) & c)),
    "v_alignbit_b32": (("u32",) * 3, "u32",
                       lambda a, b, c: (((np.asarray(a, np.uint64) << np.uint64(32))
                                         | np.asarray(b, np.uint64))
                                        >> _sh(c).astype(np.uint64)).astype(U32)),
    "v_perm_b32": (("u32",) * 3, "u32", _perm),
    # 16-bit: the low half is written, the high half zeroed (see module note)
    "v_lshlrev_b16": (("u16", "u16"), "u16", lambda a, b: b << (a & 15)),
    "v_lshrrev_b16": (("u16", "u16"), "u16", lambda a, b: b >> (a & 15)),
    "v_ashrrev_i16": (("u16", "i16"), "i16", lambda a, b: b >> (a & 15).astype(np.int16)),
    "v_add_u16": (("u16", "u16"), "u16", lambda a, b: a + b),
    "v_sub_u16": (("u16", "u16"), "u16", lambda a, b: a - b),
    "v_mul_lo_u16": (("u16", "u16"), "u16", lambda a, b: a * b),
    "v_add_f16": (("f16", "f16"), "f16", lambda a, b: a + b),
    "v_mul_f16": (("f16", "f16"), "f16", lambda a, b: a * b),
    "v_pack_b32_f16": (("f16", "f16"), "b32", lambda a, b: bits16(a) | (bits16(b) << 16)),
    "v_cvt_pk_bf16_f32": (("f32", "f32"), "b32", lambda a, b: bf16_bits(a) | (bf16_bits(b) << 16)),
    "v_cvt_pk_f16_f32": (("f32", "f32"), "b32",
                         lambda a, b: bits16(np.asarray(a, F32).astype(np.float16))
                         | (bits16(np.asarray(b, F32).astype(np.float16)) << 16)),
}

# 12.9 VOPC: v_cmp_<pred>_<type>; floats: NaN compares false except the negated (n*)
# predicates, o (ordered), u (unordered) and tru.
_FCMP = {"f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
         "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
         "lg": lambda a, b: (a < b) | (a > b), "ge": np.greater_equal,
         "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
         "u": lambda a, b: np.isnan(a) | np.isnan(b),
         "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)),
         "ngt": lambda a, b: ~(a > b), "nle": lambda a, b: ~(a <= b),
         "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
         "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool)}
_ICMP = {"f": _FCMP["f"], "lt": np.less, "eq": np.equal, "le": np.less_equal,
         "gt": np.greater, "ne": np.not_equal, "lg": np.not_equal, "ge": np.greater_equal,
         "t": _FCMP["tru"]}

SDWA_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
            "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}


# ----------------------------------------------------------------------------- DPP

def dpp_sources(mods) -> tuple[np.ndarray, np.ndarray]:
    """(source lane of each lane, lane has a source) for a DPP control (ISA, DPP_CTRL):
    quad_perm, row_shl/shr/ror (within rows of 16), wave_shl/shr/rol/ror by one,
    row_mirror, row_half_mirror, row_bcast:15/31, row_newbcast:n (gfx90a+, lane n of
    the row)."""
    lane = _LANE
    row, r16 = lane & ~15, lane & 15
    if "quad_perm" in mods:
        p = np.array(mods["quad_perm"])
        return (lane & ~3) + p[lane & 3], np.ones(LANES, bool)
    for k, fn in (("row_shl", lambda n: (lane + n, r16 + n < 16)),
                  ("row_shr", lambda n: (lane - n, r16 - n >= 0)),
                  ("row_ror", lambda n: (row + ((r16 - n) & 15), np.ones(LANES, bool))),
                  ("row_newbcast", lambda n: (row + n, np.ones(LANES, bool))),
                  ("wave_shl", lambda n: (lane + 1, lane < 63)),
                  ("wave_shr", lambda n: (lane - 1, lane > 0)),
                  ("wave_rol", lambda n: ((lane + 1) & 63, np.ones(LANES, bool))),
                  ("wave_ror", lambda n: ((lane - 1) & 63, np.ones(LANES, bool)))):
        if k in mods:
            src, ok = fn(int(mods[k]))
            return np.where(ok, src, lane) & 63, ok
    if "row_mirror" in mods:
        return row + 15 - r16, np.ones(LANES, bool)
    if "row_half_mirror" in mods:
        return (lane & ~7) + 7 - (lane & 7), np.ones(LANES, bool)
    if "row_bcast" in mods:
        n = int(mods["row_bcast"])
        if n == 15:
            return np.maximum(row - 1, 0), row > 0
        if n == 31:
            return np.full(LANES, 31), lane >= 32
    raise ISAError(f"unknown DPP control in {mods}")


def _dpp_lane_mask(mods) -> np.ndarray:
    """Lanes row_mask/bank_mask let the instruction write (ISA, DPP): bit r of row_mask
    enables lanes 16r..16r+15, bit b of bank_mask lanes with (lane % 16) // 4 == b."""
    rm, bm = int(mods.get("row_mask", 15)), int(mods.get("bank_mask", 15))
    return ((rm >> (_LANE >> 4)) & 1).astype(bool) & ((bm >> ((_LANE & 15) >> 2)) & 1).astype(bool)


# ----------------------------------------------------------------------------- compile

class _Ctx:
    """What compiling one VALU instruction needs to know about it."""

    def __init__(self, inst):
        self.inst = inst
        self.mods = inst.mods
        self.dpp = inst.enc == "dpp"
        self.sdwa = inst.enc == "sdwa"
        self.op_sel = tuple(inst.mods.get("op_sel", (0, 0, 0, 0)))
        self.op_sel_hi = inst.mods.get("op_sel_hi")


def _source(ctx, o: Operand, typ: str, idx: int):
    """Reader of source `idx` converted to `typ`, with its modifiers: DPP (src0 only),
    SDWA byte/word selects (and sext), op_sel halves, abs/neg for floats."""
    bits = {"f16": 16, "u16": 16, "i16": 16, "u64": 64, "f64": 64}.get(typ, 32)
    is_f = typ.startswith("f")
    if typ in ("u64", "f64"):
        rd64 = vsrc64(o, is_f)
        if typ == "f64":
            return _float_mods(lambda w: rd64(w).view(np.float64), o)
        return rd64
    rd = vsrc(o, bits, is_f)
    if ctx.dpp and idx == 0:
        src, ok = dpp_sources(ctx.mods)
        # BOUND_CTRL set: LLVM prints `bound_ctrl:1` (older versions `bound_ctrl:0`, which
        # its assembler still reads as set); a clear bit is not printed
        zero = "bound_ctrl" in ctx.mods
        base = rd

        def rd(w, base=base, src=src, ok=ok):
            v = np.broadcast_to(base(w), (LANES,))[src]
            valid = ok & w.exec[src]
            w._dpp_valid = valid
            return np.where(valid, v, 0).astype(U32) if zero else v
    if ctx.sdwa:
        sel = ctx.mods.get(f"src{idx}_sel", "DWORD")
        shift, width = SDWA_SEL[sel]
        if width < 32:
            base, sext = rd, o.sext

            def rd(w, base=base, shift=shift, width=width, sext=sext):
                v = (np.asarray(base(w), U32) >> U32(shift)) & U32((1 << width) - 1)
                if sext:
                    v = ((v.astype(np.int64) ^ (1 << (width - 1))) - (1 << (width - 1)))
                    v = v.astype(np.int64).astype(U32)
                return v
    if bits == 16 and idx < len(ctx.op_sel) and ctx.op_sel[idx]:
        base16 = rd
        rd = lambda w, base=base16: np.asarray(base(w), U32) >> U32(16)
    if typ == "f32":
        return _float_mods(lambda w, r=rd: f32(r(w)), o)
    if typ == "f16":
        return _float_mods(lambda w, r=rd: f16_of(r(w)), o)
    if (o.neg or o.abs) and bits == 32 and not is_f:   # float modifiers on a select/move:
        base32 = rd                             # sign bit cleared (abs), then flipped (neg)
        keep = U32(0x7FFFFFFF if o.abs else 0xFFFFFFFF)
        flip = U32(0x80000000 if o.neg else 0)
        rd = lambda w, base=base32: (np.asarray(base(w), U32) & keep) ^ flip
    if typ == "i32":
        return lambda w, r=rd: np.asarray(r(w), U32).view(I32)
    if typ == "u16":
        return lambda w, r=rd: np.asarray(r(w), U32) & U32(0xFFFF)
    if typ == "i16":
        return lambda w, r=rd: (np.asarray(r(w), U32) & U32(0xFFFF)).astype(np.uint16) \
            .view(np.int16)
    return rd


def _float_mods(rd, o: Operand):
    if o.abs and o.neg:
        return lambda w: -np.abs(rd(w))
    if o.abs:
        return lambda w: np.abs(rd(w))
    if o.neg:
        return lambda w: -rd(w)
    return rd


def _result_bits(typ, r):
    if typ == "f32":
        return bits32(np.asarray(r, F32))
    if typ == "f16":
        return bits16(r)
    if typ in ("u16", "i16"):
        return np.asarray(r).astype(np.uint16).astype(U32)
    if typ == "i32":
        return np.asarray(r).astype(I32).view(U32)
    return np.asarray(r).astype(U32)


def _writer(ctx, dst: Operand, typ: str):
    """Writer of the 32-bit result: output modifiers (clamp, omod) for floats, the SDWA
    destination select, op_sel[3] for 16-bit results, then EXEC (and DPP's row/bank
    masks and invalid sources) decide the lanes."""
    mods = ctx.mods
    r = dst.reg
    post = None
    if typ == "f32":
        scale = 2.0 if mods.get("mul") == 2 else 4.0 if mods.get("mul") == 4 else \
            0.5 if mods.get("div") == 2 else None
        clamp = bool(mods.get("clamp"))
        if scale or clamp:
            def post(v, scale=scale, clamp=clamp):
                x = f32(v)
                if scale:
                    x = (x * F32(scale)).astype(F32)
                if clamp:
                    x = np.where(np.isnan(x), F32(0), np.clip(x, F32(0), F32(1))).astype(F32)
                return bits32(x)
    hi16 = typ in ("f16", "u16", "i16") and len(ctx.op_sel) > 3 and ctx.op_sel[3]
    dsel = mods.get("dst_sel", "DWORD") if ctx.sdwa else "DWORD"
    unused = mods.get("dst_unused", "UNUSED_PAD")
    lane_mask = _dpp_lane_mask(mods) if ctx.dpp else None
    dpp_drop = ctx.dpp and "bound_ctrl" not in mods

    def write(w, v):
        v = np.asarray(v, U32)
        if post is not None:
            v = post(v)
        if hi16:
            v = (w.v[r] & U32(0xFFFF)) | ((v & U32(0xFFFF)) << U32(16))
        elif dsel != "DWORD":
            shift, width = SDWA_SEL[dsel]
            field = ((1 << width) - 1) << shift
            v = (v & U32((1 << width) - 1)) << U32(shift)
            if unused == "UNUSED_PRESERVE":
                v = (w.v[r] & U32(~field & 0xFFFFFFFF)) | v
            elif unused == "UNUSED_SEXT" and shift + width < 32:
                top = (v >> U32(shift + width - 1)) & U32(1)
                v = v | (top * U32((0xFFFFFFFF << (shift + width)) & 0xFFFFFFFF))
        if lane_mask is None:
            w.write_v(r, v)
            return
        m = w.exec & lane_mask
        if dpp_drop:
            m = m & w._dpp_valid
        np.copyto(w.v[r], np.broadcast_to(v, (LANES,)), where=m, casting="unsafe")
    return write


def _write_mask_sgpr(ctx, dst_reg: int):
    """VOPC result: one bit per lane into an SGPR pair; lanes outside EXEC get 0."""
    def write(w, m):
        bits = bits_of(np.broadcast_to(m, (LANES,)) & w.exec)
        w.write_sgpr(dst_reg, bits, 2)
    return write


def compile_vector(inst, prog):
    op = inst.op
    ops = inst.ops
    c = _Ctx(inst)
    if op in ("v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32", "v_cvt_f32_fp8", "v_cvt_f32_bf8",
              "v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8"):
        return _compile_fp8(inst, c, prog.target)
    if op in ("v_nop",):
        return lambda w: None
    if op == "v_readfirstlane_b32":
        d, rd = sdst(ops[0]), vsrc(ops[1])

        def readfirstlane(w):
            lane = (w.exec_bits & -w.exec_bits).bit_length() - 1 if w.exec_bits else 0
            d(w, int(np.broadcast_to(rd(w), (LANES,))[lane]))
        return readfirstlane
    if op == "v_readlane_b32":
        d, rd, sel = sdst(ops[0]), vsrc(ops[1]), ssrc(ops[2])
        return lambda w: d(w, int(np.broadcast_to(rd(w), (LANES,))[sel(w) & 63]))
    if op == "v_writelane_b32":
        r, val, sel = ops[0].reg, ssrc(ops[1]), ssrc(ops[2])

        def writelane(w):                       # ignores EXEC (V_WRITELANE_B32)
            w.v[r, sel(w) & 63] = val(w)
        return writelane
    if op in ("v_accvgpr_read_b32", "v_accvgpr_write_b32", "v_accvgpr_mov_b32"):
        rd = vsrc(ops[1])
        r = ops[0].reg
        return lambda w: w.write_v(r, rd(w))
    if op == "v_mov_b64":
        rd = vsrc64(ops[1])
        r = ops[0].reg

        def mov64(w):
            v = np.asarray(rd(w), np.uint64)
            w.write_v(r, (v & np.uint64(0xFFFFFFFF)).astype(U32))
            w.write_v(r + 1, (v >> np.uint64(32)).astype(U32))
        return mov64
    if op.startswith(("v_cmp_", "v_cmpx_")):
        return _compile_cmp(inst, c)
    if op in ("v_cndmask_b32",):                 # D = mask[lane] ? S1 : S0
        d = _writer(c, ops[0], "u32")
        s0, s1 = _source(c, ops[1], "b32", 0), _source(c, ops[2], "b32", 1)
        sel = ssrc(ops[3], 64)
        return lambda w: d(w, np.where(lanes_of(sel(w)), s1(w), s0(w)))
    if op in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_addc_co_u32",
              "v_subb_co_u32", "v_subbrev_co_u32"):
        return _compile_carry(inst, c)
    if op == "v_mad_u64_u32" or op == "v_mad_i64_i32":
        return _compile_mad64(inst)
    if op == "v_div_scale_f32":
        d = _writer(c, ops[0], "f32")
        carry = sdst(ops[1], 2) if ops[1].kind == "s" else None
        s0, s1, s2 = (_source(c, o, "f32", i) for i, o in enumerate(ops[2:5]))

        def div_scale(w):
            r, vcc = _div_scale(s0(w), s1(w), s2(w))
            d(w, bits32(r))
            if carry:
                carry(w, bits_of(vcc & w.exec))
        return div_scale
    if op == "v_div_fmas_f32":
        d = _writer(c, ops[0], "f32")
        s0, s1, s2 = (_source(c, o, "f32", i) for i, o in enumerate(ops[1:4]))

        def div_fmas(w):
            # V_DIV_FMAS_F32: fma(S0, S1, S2), rescaled where VCC is set. The
            # guide's pseudocode says 2^32; the hardware undoes V_DIV_SCALE's 2^64: by
            # 2^+64 when S2 (the scaled quotient) has an exponent above 127 (|S2| >= 2),
            # else by 2^-64 (measured on RDNA3/GCN parts; the division sequence is only
            # correct that way).
            a, b, c = s0(w), s1(w), s2(w)
            r = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
            up = ((np.asarray(c, F32).view(U32) >> 23) & 0xFF) > 127
            scale = np.where(w.vcc_mask(), np.where(up, 2.0 ** 64, 2.0 ** -64), 1.0)
            d(w, bits32((r * scale).astype(F32)))
        return div_fmas
    if op == "v_div_fixup_f32":
        d = _writer(c, ops[0], "f32")
        s0, s1, s2 = (_source(c, o, "f32", i) for i, o in enumerate(ops[1:4]))
        return lambda w: d(w, bits32(_div_fixup(s0(w), s1(w), s2(w))))
    if op in ("v_fmac_f32", "v_mac_f32"):
        d = _writer(c, ops[0], "f32")
        s0, s1 = _source(c, ops[1], "f32", 0), _source(c, ops[2], "f32", 1)
        acc = vsrc(ops[0])
        if op == "v_fmac_f32":
            return lambda w: d(w, bits32(fma32(s0(w), s1(w), f32(acc(w)))))
        return lambda w: d(w, bits32((s0(w) * s1(w) + f32(acc(w))).astype(F32)))
    if op == "v_cmp_class_f32":
        return _compile_cmp(inst, c)
    if op.startswith(("v_bitop3_b32", "v_bitop3_b16")):
        ttbl = int(inst.mods.get("bitop3", 0))
        mask = 0xFFFFFFFF if op.endswith("b32") else 0xFFFF
        d = _writer(c, ops[0], "u32")
        s = [vsrc(o) for o in ops[1:4]]
        return lambda w: d(w, _bitop3(ttbl, s[0](w), s[1](w), s[2](w), mask))
    if op.startswith("v_pk_"):
        return _compile_packed(inst, c)
    if op in ("v_lshlrev_b64", "v_lshrrev_b64", "v_ashrrev_i64"):
        r = ops[0].reg
        sh, val = vsrc(ops[1]), vsrc64(ops[2])

        def shift64(w):
            s = (np.asarray(sh(w), np.uint64) & np.uint64(63))
            v = np.asarray(val(w), np.uint64)
            if op == "v_lshlrev_b64":
                out = v << s
            elif op == "v_lshrrev_b64":
                out = v >> s
            else:
                out = (v.view(np.int64) >> s.astype(np.int64)).view(np.uint64)
            w.write_v(r, (out & np.uint64(0xFFFFFFFF)).astype(U32))
            w.write_v(r + 1, (out >> np.uint64(32)).astype(U32))
        return shift64
    if op in OPS:
        types, rtype, fn = OPS[op]
        if len(ops) - 1 != len(types):
            raise ISAError(f"{inst.where()}: expected {len(types)} sources")
        if inst.mods.get("clamp") and rtype != "f32":
            raise ISAError(f"{inst.where()}: integer or 16-bit clamping is not emulated")
        d = _writer(c, ops[0], rtype)
        srcs = [_source(c, o, t, i) for i, (o, t) in enumerate(zip(ops[1:], types))]
        if len(srcs) == 1:
            s0 = srcs[0]
            return lambda w: d(w, _result_bits(rtype, fn(s0(w))))
        if len(srcs) == 2:
            s0, s1 = srcs
            return lambda w: d(w, _result_bits(rtype, fn(s0(w), s1(w))))
        s0, s1, s2 = srcs
        return lambda w: d(w, _result_bits(rtype, fn(s0(w), s1(w), s2(w))))
    return None


def _compile_fp8(inst, c, target):
    """8-bit float conversions (V_CVT_PK_FP8_F32 & co.): FP8 is E4M3 and BF8 E5M2, FNUZ
    on gfx942, OCP on gfx950. Packing rounds to nearest even into bytes 0 and 1 of the
    low (op_sel[3] = 0) or high half, keeping the other half; with clamp, magnitudes
    saturate at the format's largest finite value. Unpacking takes the byte (word, for
    the packed forms) the SDWA source select names, byte 0 by default."""
    from .mfma import FP8_FORMATS
    op, ops = inst.op, inst.ops
    kind = "bf8" if "bf8" in op else "fp8"
    fmt = FP8_FORMATS[target][kind]
    r = ops[0].reg
    if op.startswith("v_cvt_pk_") and op.endswith("_f32"):
        a, b = _source(c, ops[1], "f32", 0), _source(c, ops[2], "f32", 1)
        hi = len(c.op_sel) > 3 and c.op_sel[3]
        top = float(ml_dtypes.finfo(fmt).max) if inst.mods.get("clamp") else None

        def enc(x):
            x = np.asarray(x, F32)
            if top is not None:
                x = np.clip(x, -top, top)
            return x.astype(fmt).view(np.uint8).astype(U32)

        def cvt_pk_f8(w):
            pair = enc(a(w)) | (enc(b(w)) << U32(8))
            old = w.v[r]
            w.write_v(r, ((old & U32(0xFFFF)) | (pair << U32(16))) if hi else
                      ((old & U32(0xFFFF0000)) | pair))
        return cvt_pk_f8
    if inst.mods.get("op_sel"):
        raise ISAError(f"{inst.where()}: op_sel byte selects of 8-bit conversions are not "
                       "emulated")
    sel = inst.mods.get("src0_sel", "BYTE_0" if "pk" not in op else "WORD_0")
    shift = SDWA_SEL[sel][0]
    src = vsrc(ops[1])
    dec = lambda bits: np.asarray(bits, np.uint8).view(fmt).astype(F32).view(U32)

    def cvt_f32_f8(w):
        v = np.asarray(src(w), U32) >> U32(shift)
        w.write_v(r, dec(v & U32(0xFF)))
        if "pk" in op:
            w.write_v(r + 1, dec((v >> U32(8)) & U32(0xFF)))
    return cvt_f32_f8


def _compile_cmp(inst, c):
    op, ops = inst.op, inst.ops
    exec_too = op.startswith("v_cmpx_")
    name = op[len("v_cmpx_" if exec_too else "v_cmp_"):]
    pred, typ = name.rsplit("_", 1)
    dst, srcs = ops[0], ops[1:]                    # vcc (e32) or an SGPR pair
    if pred == "class":
        s0, s1 = _source(c, srcs[0], "f32", 0), _source(c, srcs[1], "u32", 1)
        test = lambda w: _class(s0(w), s1(w))
    else:
        t = {"f32": "f32", "f16": "f16", "i32": "i32", "u32": "u32", "i16": "i16",
             "u16": "u16", "f64": "f64", "u64": "u64", "i64": "u64"}[typ]
        table = _FCMP if typ.startswith("f") else _ICMP
        f = table[pred]
        s0, s1 = _source(c, srcs[0], t, 0), _source(c, srcs[1], t, 1)
        if typ == "i64":
            test = lambda w: f(np.asarray(s0(w), np.uint64).view(np.int64),
                               np.asarray(s1(w), np.uint64).view(np.int64))
        else:
            test = lambda w: f(s0(w), s1(w))
    write = _write_mask_sgpr(c, dst.reg)

    def cmp(w):
        m = np.broadcast_to(test(w), (LANES,))
        write(w, m)
        if exec_too:                                 # V_CMPX: EXEC = result too
            w.set_exec(bits_of(m & w.exec))
    return cmp


def _compile_carry(inst, c):
    """V_ADD_CO_U32 & co.: 32-bit add/subtract with carry out (and in) in VCC or an
    SGPR pair, per lane."""
    op, ops = inst.op, inst.ops
    dst, cout = ops[0], ops[1].reg               # the carry out: vcc (e32) or an SGPR pair
    srcs = ops[2:]
    a, b = vsrc(srcs[0]), vsrc(srcs[1])
    has_cin = op in ("v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32")
    cin_reg = srcs[2].reg if has_cin else None
    d = _writer(c, dst, "u32")
    write_c = _write_mask_sgpr(c, cout)

    def carry(w):
        x, y = np.asarray(a(w), np.int64), np.asarray(b(w), np.int64)
        cin = lanes_of(w.sgpr64(cin_reg)).astype(np.int64) if has_cin else 0
        if op in ("v_add_co_u32", "v_addc_co_u32"):
            t = x + y + cin
            co = t > 0xFFFFFFFF
        elif op in ("v_sub_co_u32", "v_subb_co_u32"):
            t = x - y - cin
            co = t < 0
        else:
            t = y - x - cin
            co = t < 0
        d(w, (t & 0xFFFFFFFF).astype(U32))
        write_c(w, co)
    return carry


def _compile_mad64(inst):
    """V_MAD_U64_U32: {carry, D.u64} = S0.u32 * S1.u32 + S2.u64."""
    ops = inst.ops
    r = ops[0].reg
    carry = sdst(ops[1], 2) if ops[1].kind == "s" else None
    a, b, c64 = vsrc(ops[2]), vsrc(ops[3]), vsrc64(ops[4])
    signed = inst.op == "v_mad_i64_i32"

    def mad64(w):
        x, y = np.asarray(a(w), U32), np.asarray(b(w), U32)
        c = np.broadcast_to(np.asarray(c64(w), np.uint64), (LANES,))
        if signed:
            p = (x.view(I32).astype(np.int64) * y.view(I32).astype(np.int64)).view(np.uint64)
            t = p + c
            co = np.zeros(LANES, bool)
        else:
            p = x.astype(np.uint64) * y.astype(np.uint64)
            t = p + c
            co = t < p                                  # carry out of bit 63
        t = np.broadcast_to(t, (LANES,))
        w.write_v(r, (t & np.uint64(0xFFFFFFFF)).astype(U32))
        w.write_v(r + 1, (t >> np.uint64(32)).astype(U32))
        if carry:
            carry(w, bits_of(np.broadcast_to(co, (LANES,)) & w.exec))
    return mad64


def _compile_packed(inst, c):
    """VOP3P: two independent halves. For the packed-f32 ops (v_pk_add_f32,
    v_pk_mul_f32, v_pk_fma_f32, v_pk_mov_b32) each source is a 64-bit register pair (or
    a scalar/constant) and op_sel / op_sel_hi pick which 32-bit half of each source
    feeds the low / high result (defaults: op_sel 0, op_sel_hi 1); neg_lo / neg_hi
    negate per half."""
    op, ops = inst.op, inst.ops
    n = len(ops) - 1
    op_sel = tuple(inst.mods.get("op_sel", (0,) * n))
    op_sel_hi = tuple(inst.mods.get("op_sel_hi", (1,) * n))
    neg_lo = tuple(inst.mods.get("neg_lo", (0,) * n))
    neg_hi = tuple(inst.mods.get("neg_hi", (0,) * n))
    r = ops[0].reg
    if op in ("v_pk_add_f32", "v_pk_mul_f32", "v_pk_fma_f32", "v_pk_mov_b32"):
        halves = []
        for i, o in enumerate(ops[1:]):
            if o.kind in ("imm", "float"):
                k = np.uint32(const_bits(o, 32, op != "v_pk_mov_b32"))
                halves.append((lambda w, k=k: k, lambda w, k=k: k))
            else:
                halves.append((vsrc(o, part=0), vsrc(o, part=1)))
        f = {"v_pk_add_f32": lambda a, b: a + b, "v_pk_mul_f32": lambda a, b: a * b,
             "v_pk_fma_f32": fma32}.get(op)

        def pick(w, i, hi_result):
            sel = (op_sel_hi if hi_result else op_sel)[i]
            v = halves[i][sel](w)
            if op == "v_pk_mov_b32":
                return v
            x = f32(v)
            return -x if (neg_hi if hi_result else neg_lo)[i] else x

        def packed(w):
            if op == "v_pk_mov_b32":      # D.lo = S0[op_sel[0]], D.hi = S1[op_sel[1]]
                lo, hi = halves[0][op_sel[0]](w), halves[1][op_sel[1]](w)
            else:
                lo = bits32(f(*(pick(w, i, False) for i in range(n))))
                hi = bits32(f(*(pick(w, i, True) for i in range(n))))
            w.write_v(r, lo)
            w.write_v(r + 1, hi)
        return packed
    raise ISAError(f"{inst.where()}: packed op not supported by the emulator")
