"""The decoder: LLVM's AMDGPU syntax -> mnemonic, encoding, operands and modifiers; inline
constants encoded per operand width (CDNA3 ISA, "Inline constants")."""
import pytest

from pykittens.isa.decode import AGPR_BASE, DecodeError, float_bits, imm_bits, parse, parse_operand
from pykittens.isa.memory import _swizzle_offset


def test_registers_and_modifiers():
    x = parse(0x100, 8, "v_max_f32_e64 v1, |v2|, -|s3| clamp mul:2")
    assert (x.op, x.enc, x.addr, x.size) == ("v_max_f32", "e64", 0x100, 8)
    d, a, b = x.ops
    assert (d.kind, d.reg, d.n) == ("v", 1, 1)
    assert a.abs and not a.neg
    assert (b.kind, b.reg, b.neg, b.abs) == ("s", 3, True, True)
    assert x.mods == {"clamp": True, "mul": 2}
    assert parse_operand("a[4:7]").reg == AGPR_BASE + 4 and parse_operand("a[4:7]").n == 4
    assert (parse_operand("vcc").reg, parse_operand("vcc").n) == (106, 2)
    assert (parse_operand("exec").reg, parse_operand("m0").reg) == (126, 124)


def test_dpp_sdwa_buffer_and_waitcnt_forms():
    x = parse(0, 8, "v_add_f32_dpp v0, v1, v2 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0x5 "
                    "bound_ctrl:1")
    assert x.enc == "dpp" and x.mods["quad_perm"] == (1, 0, 3, 2) and x.mods["bank_mask"] == 5
    x = parse(0, 8, "v_cvt_f32_i32_sdwa v0, sext(v3) dst_sel:DWORD dst_unused:UNUSED_PAD "
                    "src0_sel:WORD_1")
    assert x.ops[1].sext and x.mods["src0_sel"] == "WORD_1"
    x = parse(0, 8, "buffer_load_dwordx4 v[2:5], v6, s[24:27], 0 offen offset:32")
    assert [o.text for o in x.ops] == ["v[2:5]", "v6", "s[24:27]", "0"]
    assert x.mods == {"offen": True, "offset": 32}
    assert parse(0, 4, "s_waitcnt vmcnt(3) lgkmcnt(0)").mods == {"vmcnt": 3, "lgkmcnt": 0}
    with pytest.raises(DecodeError, match="cannot parse operand 'q7'"):
        parse(0, 4, "v_mov_b32_e32 v1, q7")


def test_inline_constants_per_width():
    assert float_bits("1.0", 32) == 0x3F800000
    assert float_bits("-0.5", 16) == 0xB800
    assert float_bits("2.0", 64) == 0x4000000000000000
    assert float_bits("0.15915494", 32) == 0x3E22F983        # 1/(2 pi)
    assert float_bits("-0.15915494", 16) == 0xB118
    assert imm_bits(parse_operand("-16")) == 0xFFFFFFF0
    assert imm_bits(parse_operand("0x3fb8aa3b")) == 0x3FB8AA3B


def test_swizzle_macros_to_offsets():
    """ds_swizzle offsets (CDNA3 ISA 12.13 DS_SWIZZLE_B32): bit mode and/or/xor masks in
    [4:0]/[9:5]/[14:10]; QUAD_PERM sets bit 15."""
    assert _swizzle_offset("swizzle(SWAP,16)") == 0x1F | (16 << 10)
    assert _swizzle_offset("swizzle(REVERSE,8)") == 0x1F | (7 << 10)
    assert _swizzle_offset("swizzle(QUAD_PERM,1,0,3,2)") == 0x8000 | 1 | 0 << 2 | 3 << 4 | 2 << 6
    assert _swizzle_offset("swizzle(BROADCAST,4,1)") == (0x1F & ~3) | (1 << 5)
    want = 0b00111 | (0b01000 << 5) | (0b00010 << 10)          # and, or, xor masks
    assert _swizzle_offset('swizzle(BITMASK_PERM,"01pip")') == want
