"""Scalar and vector ALU semantics on hand-computed values (CDNA3 ISA ch. 12 pseudocode;
CDNA4 for the gfx950 additions). Each test runs a few instructions on one wave."""
import ml_dtypes
import numpy as np
import pytest

from pykittens.isa import ISAError
from isa_helpers import LANE, execute, f32, i32, mask, sgpr64, u32

M32 = 0xFFFFFFFF


# ---- scalar ALU ---------------------------------------------------------------------------------

def test_scalar_carries_and_overflow():
    w = execute(["s_add_u32 s2, s0, s1", "s_addc_u32 s3, 0, 0", "s_add_i32 s4, s5, 1",
                 "s_cselect_b32 s6, 7, 9", "s_sub_u32 s7, 0, 1", "s_subb_u32 s8, 5, 0"],
                s={0: M32, 1: 1, 5: 0x7FFFFFFF})
    assert (w.s[2], w.s[3]) == (0, 1)                 # carry out, then carried in
    assert w.s[4] == 0x80000000 and w.s[6] == 7       # signed overflow sets SCC
    assert w.s[7] == M32 and w.s[8] == 4              # borrow out, then borrowed


@pytest.mark.parametrize("text,s0,s1,want,scc", [
    ("s_min_i32 s2, s0, s1", -5, 3, -5, 1),
    ("s_max_u32 s2, s0, s1", -5, 3, -5, 1),             # 0xfffffffb > 3 unsigned
    ("s_ashr_i32 s2, s0, s1", -64, 36, -4, 1),          # shift amount is S1[4:0] = 4
    ("s_lshr_b32 s2, s0, s1", -64, 28, 15, 1),
    ("s_bfe_u32 s2, s0, s1", 0b1011000, 3 | (3 << 16), 0b011, 1),   # offset 3, width 3
    ("s_bfe_i32 s2, s0, s1", 0b1011000, 4 | (3 << 16), -3, 1),      # 0b101 sign-extended
    ("s_mul_hi_i32 s2, s0, s1", -3, 1 << 31, 1, None),
    ("s_mul_hi_u32 s2, s0, s1", -1, -1, -2, None),
    ("s_andn2_b32 s2, s0, s1", 0b1100, 0b1010, 0b0100, 1),
    ("s_xor_b32 s2, s0, s1", 5, 5, 0, 0),
])
def test_scalar_ops(text, s0, s1, want, scc):
    w = execute([text], s={0: s0, 1: s1}, scc=0 if scc is None else 1 - scc)
    assert w.s[2] == want & M32
    if scc is not None:
        assert w.scc == scc


def test_scalar_compares_and_sopk():
    w = execute(["s_cmp_lt_i32 s0, s1", "s_cselect_b32 s2, 1, 0", "s_cmp_lt_u32 s0, s1",
                 "s_cselect_b32 s3, 1, 0", "s_movk_i32 s4, 0xfff0", "s_mulk_i32 s4, 0x3",
                 "s_cmpk_lg_i32 s4, 0xffd0", "s_cselect_b32 s5, 1, 0", "s_bitset1_b32 s6, 9",
                 "s_bitcmp0_b32 s6, 9", "s_cselect_b32 s7, 1, 0", "s_abs_i32 s8, s0",
                 "s_ff1_i32_b64 s9, s[10:11]", "s_bcnt1_i32_b64 s12, s[10:11]"],
                s={0: -1, 1: 1, 6: 0, 10: 0, 11: 0b1100})
    assert (w.s[2], w.s[3]) == (1, 0)            # -1 < 1 signed, not unsigned
    assert w.s[4] == (-48) & M32 and w.s[5] == 0  # sext(0xfff0) * 3 = -48 == sext(0xffd0)
    assert w.s[6] == 1 << 9 and w.s[7] == 0 and w.s[8] == 1
    assert w.s[9] == 34 and w.s[12] == 2


def test_saveexec_and_branches():
    """s_and_saveexec_b64 D = EXEC, EXEC &= S0, SCC = EXEC != 0; s_cbranch_* offsets are
    words from the next instruction (a loop that adds 3 five times)."""
    w = execute(["s_and_saveexec_b64 s[2:3], s[0:1]", "s_cselect_b32 s4, 1, 0",
                 "s_andn2_saveexec_b64 s[6:7], s[2:3]",
                 "s_mov_b32 s8, 0", "s_mov_b32 s9, 5",
                 "s_add_i32 s8, s8, 3", "s_sub_i32 s9, s9, 1", "s_cmp_lg_u32 s9, 0",
                 "s_cbranch_scc1 -4"],
                s={0: 0xF0, 1: 0}, exec_mask=(1 << 64) - 1)
    assert sgpr64(w, 2) == (1 << 64) - 1 and w.s[4] == 1
    assert sgpr64(w, 6) == 0xF0                          # EXEC was 0xf0
    assert w.exec_bits == ((1 << 64) - 1) & ~0xF0        # S0 & ~EXEC
    assert w.s[8] == 15


# ---- vector ALU ---------------------------------------------------------------------------------

X = (np.arange(64, dtype=np.float32) - 31.5) / 4


def test_float_ops_modifiers_and_exec():
    w = execute(["v_fma_f32 v2, -v0, v1, 1.0", "v_max_f32_e64 v3, |v0|, 2.0 clamp",
                 "v_mul_f32_e64 v4, v0, v1 mul:2", "v_sub_f32_e32 v5, v0, v1"],
                v={0: X, 1: np.float32(3), 5: np.float32(-7)}, exec_mask=mask(range(0, 64, 2)))
    on = LANE % 2 == 0
    assert np.array_equal(f32(w, 2)[on], (1 - 3 * X)[on])
    assert np.all(f32(w, 3)[on] == 1)                    # clamp to [0, 1]
    assert np.array_equal(f32(w, 4)[on], (X * 6)[on])
    assert np.all(f32(w, 5)[~on] == -7)                  # lanes outside EXEC keep their value


def test_select_with_float_modifiers():
    """VOP3 v_cndmask_b32 takes abs/neg on its sources (as LLVM uses it for fneg/fabs
    selects): the sign bit cleared, then flipped."""
    w = execute(["v_cndmask_b32_e64 v2, -v0, |v1|, s[4:5]"],
                v={0: np.float32(2), 1: np.float32(-3)}, s={4: 0xF, 5: 0})
    assert np.array_equal(f32(w, 2), np.where(LANE < 4, 3, -2).astype(np.float32))


def test_max_min_nan_and_signed_zero():
    a = np.array([np.nan, 1, 0.0, -0.0] * 16, np.float32)
    b = np.array([1, np.nan, -0.0, 0.0] * 16, np.float32)
    w = execute(["v_max_f32_e32 v2, v0, v1", "v_min_f32_e32 v3, v0, v1"], v={0: a, 1: b})
    assert list(f32(w, 2)[:4][:2]) == [1, 1] and list(f32(w, 3)[:2]) == [1, 1]
    assert not np.signbit(f32(w, 2)[2]) and not np.signbit(f32(w, 2)[3])   # max(+0, -0) = +0
    assert np.signbit(f32(w, 3)[2]) and np.signbit(f32(w, 3)[3])


def test_compares_write_exec_lanes_only_and_cndmask():
    w = execute(["v_cmp_gt_f32_e32 vcc, v0, v1", "s_nop 1",
                 "v_cndmask_b32_e32 v2, v0, v1, vcc", "v_cmp_lt_i32_e64 s[4:5], v0, 0"],
                v={0: np.arange(64) - 10, 1: np.float32(0)}, exec_mask=(1 << 64) - 2)
    x = (np.arange(64) - 10).astype(np.float32)
    want = mask(i for i in range(1, 64) if np.int32(i - 10).view(np.float32) > 0)
    assert sgpr64(w, 106) == want                        # lane 0 (no EXEC) reads 0
    gt = (np.int32(np.arange(64) - 10).view(np.float32) > 0)
    assert np.array_equal(u32(w, 2)[1:], np.where(gt, 0, (np.arange(64) - 10) & M32)[1:])
    assert sgpr64(w, 4) == mask(range(1, 10))


def test_cmpx_writes_exec_and_class():
    vals = np.array([-np.inf, -1, -1e-40, -0.0, 0.0, 1e-40, 1, np.inf, np.nan], np.float32)
    x = np.resize(vals, 64)
    w = execute(["v_cmp_class_f32_e64 s[2:3], v0, v1", "v_cmpx_lt_f32_e64 s[4:5], v0, 0"],
                v={0: x, 1: 0b1000100100})                # classes 2 (-inf), 5 (-0), 9 (+inf)
    cls = {0: 2, 1: 3, 2: 4, 3: 5, 4: 6, 5: 7, 6: 8, 7: 9, 8: 1}   # ISA class number per value
    want = mask(i for i in range(64) if (0b1000100100 >> cls[i % 9]) & 1)
    assert sgpr64(w, 2) == want
    neg = mask(i for i in range(64) if x[i] < 0)
    assert w.exec_bits == neg and sgpr64(w, 4) == neg


@pytest.mark.parametrize("text,a,b,want", [
    ("v_add_u32_e32 v2, v0, v1", M32, 2, 1),
    ("v_mul_lo_u32 v2, v0, v1", 0x10001, 0x10001, 0x20001),
    ("v_mul_hi_u32 v2, v0, v1", M32, M32, 0xFFFFFFFE),
    ("v_mul_hi_i32 v2, v0, v1", -5, 1 << 30, (-5 << 30) >> 32),
    ("v_lshlrev_b32_e32 v2, v0, v1", 33, 3, 6),              # shift is S0[4:0]
    ("v_ashrrev_i32_e32 v2, v0, v1", 4, -256, -16),
    ("v_subrev_u32_e32 v2, v0, v1", 5, 3, -2),
    ("v_bfe_u32 v2, v0, 4, 8", 0xABCDEF, 0, 0xDE),
    ("v_bfe_i32 v2, v0, 4, 8", 0xABCDEF, 0, -34),
    ("v_bfi_b32 v2, v0, v1, 0", 0xFF00FF00, 0x12345678, 0x12005600),
    ("v_alignbit_b32 v2, v0, v1, 8", 0xAABBCCDD, 0x11223344, 0xDD112233),
    ("v_lshl_add_u32 v2, v0, 4, v1", 3, 5, 53),
    ("v_add_lshl_u32 v2, v0, v1, 2", 3, 5, 32),
    ("v_and_or_b32 v2, v0, v1, 0x100", 0xF0F0, 0xFF00, 0xF100),
    ("v_med3_i32 v2, v0, v1, 7", -4, 20, 7),
    ("v_bfrev_b32_e32 v2, v0", 1, 0, 1 << 31),
    ("v_perm_b32 v2, v0, v1, 0x5040100", 0xAABBCCDD, 0x11223344, 0xCCDD3344),
    ("v_perm_b32 v2, v0, v1, 0xd0c0801", 0xAABBCCDD, 0x1122B344, 0xFF00FFB3),
    ("v_lshlrev_b16_e32 v2, v0, v1", 4, 0x12345678, 0x6780),  # 16-bit: high half zero
    ("v_ashrrev_i16_e32 v2, v0, v1", 4, 0x1234F678, 0xFF67),
])
def test_integer_ops(text, a, b, want):
    w = execute([text], v={0: a, 1: b})
    assert np.all(u32(w, 2) == np.uint32(want & M32)), hex(int(u32(w, 2)[0]))


def test_bitop3_truth_table():
    """V_BITOP3_B32 (CDNA4): result bit = TTBL[a << 2 | b << 1 | c]; 0x78 is a ^ (b & c)."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    w = execute(["v_bitop3_b32 v3, v0, v1, v2 bitop3:0x78",
                 "v_bitop3_b16 v4, v0, v1, v2 bitop3:0xe8"], v={0: a, 1: b, 2: c})
    assert np.array_equal(u32(w, 3), a ^ (b & c))
    assert np.array_equal(u32(w, 4), ((a & b) | (a & c) | (b & c)) & 0xFFFF)   # majority


def test_carry_chains_and_mad64():
    lo0, lo1 = np.full(64, M32, np.uint32), np.uint32(1)
    w = execute(["v_add_co_u32_e32 v4, vcc, v0, v1", "s_nop 1",
                 "v_addc_co_u32_e32 v5, vcc, v2, v3, vcc",
                 "v_mad_u64_u32 v[6:7], s[2:3], v0, v0, v[8:9]"],
                v={0: lo0, 1: lo1, 2: 7, 3: 0, 8: M32, 9: M32})
    assert np.all(u32(w, 4) == 0) and np.all(u32(w, 5) == 8)
    assert sgpr64(w, 106) == 0                        # no carry out of the high word
    # 0xffffffff^2 + 0xffffffffffffffff = 0x1_fffffffe_00000000
    assert np.all(u32(w, 6) == 0) and np.all(u32(w, 7) == 0xFFFFFFFE)
    assert sgpr64(w, 2) == (1 << 64) - 1


def test_conversions_round_truncate_saturate():
    x = np.resize(np.array([-1.7, 2.5, 3.5, -2.5, 3e9, -3e9, np.nan, 0.49999997], np.float32), 64)
    w = execute(["v_cvt_i32_f32_e32 v1, v0", "v_cvt_u32_f32_e32 v2, v0",
                 "v_rndne_f32_e32 v3, v0", "v_cvt_f32_i32_e32 v4, v1"], v={0: x})
    assert list(i32(w, 1)[:8]) == [-1, 2, 3, -2, 2**31 - 1, -2**31, 0, 0]   # toward zero
    assert list(u32(w, 2)[:8]) == [0, 2, 3, 0, 3000000000, 0, 0, 0]
    assert list(f32(w, 3)[:6]) == [-2, 2, 4, -2, 3e9, -3e9]                # ties to even


def test_bf16_f16_packing():
    """V_CVT_PK_BF16_F32 rounds to nearest even: 0x3f808000 is halfway between bf16
    0x3f80 and 0x3f81 (-> 0x3f80), 0x3f818000 between 0x3f81 and 0x3f82 (-> 0x3f82)."""
    a = np.resize(np.array([0x3F808000, 0x3F818000, 0x7FC00001, 0x3F800001], np.uint32), 64)
    w = execute(["v_cvt_pk_bf16_f32 v2, v0, v1", "v_cvt_f16_f32_e32 v3, v1",
                 "v_cvt_f32_f16_e32 v4, v3", "v_pack_b32_f16 v5, v3, v3"],
                v={0: a, 1: np.float32(1 / 3)})
    lo = u32(w, 2) & 0xFFFF
    assert (lo[0], lo[1], lo[3]) == (0x3F80, 0x3F82, 0x3F80)
    assert np.isnan(np.uint16(u32(w, 2)[2] & 0xFFFF).view(ml_dtypes.bfloat16))
    assert np.all(u32(w, 2) >> 16 == 0x3EAB)             # bf16(1/3) = 0x3eab
    assert np.all(u32(w, 3) == 0x3555)                   # f16(1/3), high half zero
    assert np.all(f32(w, 4) == np.float32(np.float16(1 / 3)))
    assert np.all(u32(w, 5) == 0x35553555)


def test_division_sequence_is_correctly_rounded():
    """LLVM's f32 division (v_div_scale, v_rcp, Newton steps, v_div_fmas, v_div_fixup),
    as the softmax kernel has it, gives 1 / x correctly rounded, and the IEEE special
    cases through v_div_fixup."""
    x = np.resize(np.array([3, -7, 1e-30, 1e30, 0.0, -0.0, np.inf, np.nan, 1.5e-38, 3.4e38],
                           np.float32), 64)
    x[10:] = np.random.default_rng(0).standard_normal(54).astype(np.float32) * 10
    w = execute(["v_div_scale_f32 v0, s[0:1], v8, v8, 1.0", "v_rcp_f32_e32 v1, v0",
                 "s_nop 2",
                 "v_fma_f32 v2, -v0, v1, 1.0", "v_fmac_f32_e32 v1, v2, v1",
                 "v_div_scale_f32 v2, vcc, 1.0, v8, 1.0", "v_mul_f32_e32 v3, v2, v1",
                 "v_fma_f32 v4, -v0, v3, v2", "v_fmac_f32_e32 v3, v4, v1",
                 "v_fma_f32 v0, -v0, v3, v2", "v_div_fmas_f32 v0, v0, v1, v3",
                 "v_div_fixup_f32 v8, v0, v8, 1.0"], v={8: x})
    with np.errstate(all="ignore"):
        want = np.float32(1) / x
    got = f32(w, 8)
    assert np.array_equal(got, want, equal_nan=True), (got[:10], want[:10])


def test_transcendentals():
    w = execute(["v_exp_f32_e32 v1, v0", "v_log_f32_e32 v2, v1", "v_sqrt_f32_e32 v3, v1",
                 "v_ldexp_f32 v4, v0, -3", "v_rcp_f32_e32 v5, v0"], v={0: np.float32(3)})
    assert np.all(f32(w, 1) == 8) and np.all(f32(w, 2) == 3)
    assert np.allclose(f32(w, 3), np.sqrt(8)) and np.all(f32(w, 4) == 0.375)
    assert np.allclose(f32(w, 5), 1 / 3, rtol=2 ** -23)


def test_packed_f32_op_sel():
    """VOP3P packed f32: op_sel picks each source's half for the low result, op_sel_hi
    for the high one (default op_sel 0, op_sel_hi 1)."""
    w = execute(["v_pk_mul_f32 v[4:5], s[2:3], v[0:1] op_sel_hi:[0,1]",
                 "v_pk_add_f32 v[6:7], v[0:1], v[0:1] op_sel:[1,0] op_sel_hi:[0,1]"],
                v={0: X, 1: 2 * X}, s={2: np.float32(3).view(np.uint32),
                                       3: np.float32(5).view(np.uint32)})
    assert np.array_equal(f32(w, 4), 3 * X) and np.array_equal(f32(w, 5), 3 * 2 * X)
    assert np.array_equal(f32(w, 6), 2 * X + X) and np.array_equal(f32(w, 7), X + 2 * X)


def test_lane_ops():
    vals = (LANE * 10).astype(np.uint32)
    w = execute(["v_readfirstlane_b32 s2, v0", "v_readlane_b32 s3, v0, s4",
                 "v_writelane_b32 v1, s5, s6", "v_accvgpr_write_b32 a3, v0", "s_nop 2",
                 "v_accvgpr_read_b32 v2, a3", "v_mov_b64_e32 v[6:7], v[0:1]"],
                v={0: vals, 1: 0}, s={4: 42, 5: 99, 6: 3}, exec_mask=mask([5, 9]))
    assert (w.s[2], w.s[3]) == (50, 420)                # first active lane; any lane
    assert u32(w, 1)[3] == 99                            # v_writelane ignores EXEC
    assert u32(w, 2)[5] == 50 and u32(w, 2)[0] == 0
    assert u32(w, 6)[9] == 90 and u32(w, 6)[0] == 0


# ---- DPP and SDWA -------------------------------------------------------------------------------

@pytest.mark.parametrize("ctrl,src", [
    ("quad_perm:[3,2,1,0]", lambda i: (i & ~3) + 3 - (i & 3)),
    ("quad_perm:[1,0,3,2]", lambda i: i ^ 1),
    ("row_shr:1", lambda i: i - 1 if i % 16 else None),
    ("row_shl:3", lambda i: i + 3 if i % 16 < 13 else None),
    ("row_ror:4", lambda i: (i & ~15) + ((i - 4) & 15)),
    ("row_mirror", lambda i: (i & ~15) + 15 - (i & 15)),
    ("row_half_mirror", lambda i: (i & ~7) + 7 - (i & 7)),
    ("wave_shr:1", lambda i: i - 1 if i else None),
    ("row_bcast:15", lambda i: (i & ~15) - 1 if i >= 16 else None),
    ("row_bcast:31", lambda i: 31 if i >= 32 else None),
])
@pytest.mark.parametrize("bound_ctrl", [0, 1])
def test_dpp_sources(ctrl, src, bound_ctrl):
    """CDNA3 ISA 6.3: each lane reads src0 from the lane the control names; a lane with no
    source keeps its old value (BOUND_CTRL clear: not printed) or reads 0 (bound_ctrl:1)."""
    bc = " bound_ctrl:1" if bound_ctrl else ""
    w = execute([f"v_mov_b32_dpp v1, v0 {ctrl} row_mask:0xf bank_mask:0xf{bc}"],
                v={0: LANE + 100, 1: 7})
    for i in range(64):
        s = src(i)
        want = (s + 100) if s is not None else (0 if bound_ctrl else 7)
        assert u32(w, 1)[i] == want, (ctrl, i)


def test_dpp_masks_and_two_operand_form():
    w = execute(["v_add_f32_dpp v2, v0, v1 quad_perm:[0,0,0,0] row_mask:0x5 bank_mask:0x2"],
                v={0: X, 1: np.float32(1), 2: np.float32(-1)})
    on = np.isin(LANE >> 4, [0, 2]) & (((LANE & 15) >> 2) == 1)     # rows 0, 2; bank 1
    want = np.where(on, X[LANE & ~3] + 1, -1)
    assert np.array_equal(f32(w, 2), want.astype(np.float32))


def test_sdwa_selects():
    w = execute(["v_or_b32_sdwa v2, v0, v1 dst_sel:DWORD dst_unused:UNUSED_PAD "
                 "src0_sel:BYTE_2 src1_sel:DWORD",
                 "v_cvt_f32_i32_sdwa v3, sext(v0) dst_sel:DWORD dst_unused:UNUSED_PAD "
                 "src0_sel:WORD_0",
                 "v_mov_b32_sdwa v4, v1 dst_sel:WORD_1 dst_unused:UNUSED_PRESERVE "
                 "src0_sel:WORD_0",
                 "v_cvt_f32_f16_sdwa v5, v0 dst_sel:DWORD dst_unused:UNUSED_PAD "
                 "src0_sel:WORD_1"],
                v={0: 0x3C00FF85, 1: 0x12345678, 4: 0xAAAABBBB})
    assert np.all(u32(w, 2) == (0x00 | 0x12345678))          # byte 2 of 0x3c00ff85 is 0x00
    assert np.all(f32(w, 3) == -123)                        # sext(0xff85)
    assert np.all(u32(w, 4) == 0x5678BBBB)
    assert np.all(f32(w, 5) == 1.0)                          # f16 0x3c00


def test_unknown_instruction_is_a_clear_error():
    with pytest.raises(ISAError, match=r"does not implement v_sin_f32_e32 \(at 0x0"):
        execute(["v_sin_f32_e32 v1, v0"])


@pytest.mark.parametrize("target,one,minus_two,bf8_one,sat", [
    ("gfx942", 0x40, 0xC8, 0x40, 0x7F),     # FNUZ: e4m3 bias 8, e5m2 bias 16; max 240
    ("gfx950", 0x38, 0xC0, 0x3C, 0x7E)])    # OCP: e4m3 bias 7, e5m2 bias 15; max 448
def test_fp8_conversions(target, one, minus_two, bf8_one, sat):
    """V_CVT_PK_FP8_F32 packs two values (rounded to nearest even: 1.0625 is halfway
    between 1 and 1.125 -> 1) into the low or, with op_sel[3], high half; clamp
    saturates; V_CVT_F32_FP8 / V_CVT_PK_F32_BF8 unpack the selected byte / word."""
    w = execute(["v_cvt_pk_fp8_f32 v2, v0, v1", "v_cvt_pk_bf8_f32 v2, v0, v0 op_sel:[0,0,0,1]",
                 "v_cvt_pk_fp8_f32 v3, v4, v1 clamp", "v_cvt_f32_fp8_sdwa v5, v2 src0_sel:BYTE_1",
                 "v_cvt_pk_f32_bf8_sdwa v[6:7], v2 src0_sel:WORD_1"], target,
                v={0: np.float32(1.0625), 1: np.float32(-2), 4: np.float32(1e4)})
    assert np.all(u32(w, 2) == one | minus_two << 8 | bf8_one << 16 | bf8_one << 24)
    assert np.all(u32(w, 3) == sat | minus_two << 8)
    assert np.all(f32(w, 5) == -2) and np.all(f32(w, 6) == 1) and np.all(f32(w, 7) == 1)
