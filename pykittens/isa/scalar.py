"""Scalar ALU and program control: SOP1, SOP2, SOPK, SOPC and SOPP.

Semantics follow the instruction pseudocode of the AMD Instinct MI300 (CDNA3) ISA
Reference Guide, chapter "Instructions" (the SOP2, SOPK, SOP1, SOPC and SOPP lists);
the CDNA4 guide has the same scalar instructions. Each entry computes
(D, SCC) from its sources; SCC None means the instruction leaves SCC alone.
"""
from __future__ import annotations

from ..targets import cdna
from .operands import sdst, ssrc, to_signed

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1
END, BARRIER = -1, -2


def _nz(d):
    return d, int(d != 0)


def _cmp_pair(bits, signed, pred):
    def f(a, b, scc):
        if signed:
            a, b = to_signed(a, bits), to_signed(b, bits)
        return None, int(pred(a, b))
    return f


_PRED = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
         "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def _bfe(a, b, signed, bits):
    off, width = b & (bits - 1), (b >> 16) & 0x7F
    d = (a >> off) & ((1 << width) - 1) if width else 0
    if signed and width and (d >> (width - 1)) & 1:
        d -= 1 << width
    return d & ((1 << bits) - 1)


# SOP2 (two sources) and SOP1 (one source, b ignored): name -> (bits, fn(a, b, scc)).
# Add/sub set SCC to the carry or signed overflow; logic ops and shifts to
# D != 0; min/max to the comparison; moves, multiplies and selects leave it.
def _add_i32(a, b, scc):
    t = (a + b) & M32
    return t, int((a >> 31) == (b >> 31) and (a >> 31) != (t >> 31))


def _sub_i32(a, b, scc):
    t = (a - b) & M32
    return t, int((a >> 31) != (b >> 31) and (a >> 31) != (t >> 31))


OPS = {
    "s_add_u32": (32, lambda a, b, c: ((a + b) & M32, int(a + b > M32))),
    "s_sub_u32": (32, lambda a, b, c: ((a - b) & M32, int(b > a))),
    "s_addc_u32": (32, lambda a, b, c: ((a + b + c) & M32, int(a + b + c > M32))),
    "s_subb_u32": (32, lambda a, b, c: ((a - b - c) & M32, int(b + c > a))),
    "s_add_i32": (32, _add_i32),
    "s_sub_i32": (32, _sub_i32),
    "s_min_i32": (32, lambda a, b, c: (a, 1) if to_signed(a) < to_signed(b) else (b, 0)),
    "s_max_i32": (32, lambda a, b, c: (a, 1) if to_signed(a) > to_signed(b) else (b, 0)),
    "s_min_u32": (32, lambda a, b, c: (a, 1) if a < b else (b, 0)),
    "s_max_u32": (32, lambda a, b, c: (a, 1) if a > b else (b, 0)),
    "s_cselect_b32": (32, lambda a, b, c: (a if c else b, None)),
    "s_cselect_b64": (64, lambda a, b, c: (a if c else b, None)),
    "s_mul_i32": (32, lambda a, b, c: ((to_signed(a) * to_signed(b)) & M32, None)),
    "s_mul_hi_u32": (32, lambda a, b, c: ((a * b) >> 32, None)),
    "s_mul_hi_i32": (32, lambda a, b, c: (((to_signed(a) * to_signed(b)) >> 32) & M32, None)),
    "s_lshl_b32": (32, lambda a, b, c: _nz((a << (b & 31)) & M32)),
    "s_lshl_b64": (64, lambda a, b, c: _nz((a << (b & 63)) & M64)),
    "s_lshr_b32": (32, lambda a, b, c: _nz(a >> (b & 31))),
    "s_lshr_b64": (64, lambda a, b, c: _nz(a >> (b & 63))),
    "s_ashr_i32": (32, lambda a, b, c: _nz((to_signed(a) >> (b & 31)) & M32)),
    "s_ashr_i64": (64, lambda a, b, c: _nz((to_signed(a, 64) >> (b & 63)) & M64)),
    "s_lshl1_add_u32": (32, lambda a, b, c: (((a << 1) + b) & M32, int((a << 1) + b > M32))),
    "s_lshl2_add_u32": (32, lambda a, b, c: (((a << 2) + b) & M32, int((a << 2) + b > M32))),
    "s_lshl3_add_u32": (32, lambda a, b, c: (((a << 3) + b) & M32, int((a << 3) + b > M32))),
    "s_lshl4_add_u32": (32, lambda a, b, c: (((a << 4) + b) & M32, int((a << 4) + b > M32))),
    "s_bfe_u32": (32, lambda a, b, c: _nz(_bfe(a, b, False, 32))),
    "s_bfe_i32": (32, lambda a, b, c: _nz(_bfe(a, b, True, 32))),
    "s_bfe_u64": (64, lambda a, b, c: _nz(_bfe(a, b, False, 64))),
    "s_bfm_b32": (32, lambda a, b, c: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None)),
    "s_absdiff_i32": (32, lambda a, b, c: _nz(abs(to_signed(a) - to_signed(b)) & M32)),
    "s_pack_ll_b32_b16": (32, lambda a, b, c: ((a & 0xFFFF) | ((b & 0xFFFF) << 16), None)),
    "s_pack_lh_b32_b16": (32, lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None)),
    "s_pack_hh_b32_b16": (32, lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None)),
    # SOP1
    "s_mov_b32": (32, lambda a, b, c: (a, None)),
    "s_mov_b64": (64, lambda a, b, c: (a, None)),
    "s_not_b32": (32, lambda a, b, c: _nz(~a & M32)),
    "s_not_b64": (64, lambda a, b, c: _nz(~a & M64)),
    "s_brev_b32": (32, lambda a, b, c: (int(f"{a:032b}"[::-1], 2), None)),
    "s_abs_i32": (32, lambda a, b, c: _nz(abs(to_signed(a)) & M32)),
    "s_sext_i32_i8": (32, lambda a, b, c: (to_signed(a, 8) & M32, None)),
    "s_sext_i32_i16": (32, lambda a, b, c: (to_signed(a, 16) & M32, None)),
    "s_bcnt1_i32_b32": (32, lambda a, b, c: _nz(bin(a).count("1"))),
    "s_bcnt1_i32_b64": (64, lambda a, b, c: _nz(bin(a).count("1"))),
    "s_ff1_i32_b32": (32, lambda a, b, c: ((a & -a).bit_length() - 1 & M32, None)),
    "s_ff1_i32_b64": (64, lambda a, b, c: ((a & -a).bit_length() - 1 & M32, None)),
    "s_flbit_i32_b32": (32, lambda a, b, c: ((32 - a.bit_length()) if a else M32, None)),
}
for _w, _m in ((32, M32), (64, M64)):
    OPS.update({
        f"s_and_b{_w}": (_w, lambda a, b, c: _nz(a & b)),
        f"s_or_b{_w}": (_w, lambda a, b, c: _nz(a | b)),
        f"s_xor_b{_w}": (_w, lambda a, b, c: _nz(a ^ b)),
        f"s_andn2_b{_w}": (_w, lambda a, b, c, m=_m: _nz(a & ~b & m)),
        f"s_orn2_b{_w}": (_w, lambda a, b, c, m=_m: _nz((a | ~b) & m)),
        f"s_nand_b{_w}": (_w, lambda a, b, c, m=_m: _nz(~(a & b) & m)),
        f"s_nor_b{_w}": (_w, lambda a, b, c, m=_m: _nz(~(a | b) & m)),
        f"s_xnor_b{_w}": (_w, lambda a, b, c, m=_m: _nz(~(a ^ b) & m)),
    })
# SOPC: s_cmp_<pred>_<type>; s_bitcmp{0,1}_b{32,64}
for _p, _f in _PRED.items():
    OPS[f"s_cmp_{_p}_i32"] = (32, _cmp_pair(32, True, _f))
    OPS[f"s_cmp_{_p}_u32"] = (32, _cmp_pair(32, False, _f))
OPS["s_cmp_eq_u64"] = (64, _cmp_pair(64, False, _PRED["eq"]))
OPS["s_cmp_lg_u64"] = (64, _cmp_pair(64, False, _PRED["lg"]))
OPS["s_bitcmp0_b32"] = (32, lambda a, b, c: (None, int(not (a >> (b & 31)) & 1)))
OPS["s_bitcmp1_b32"] = (32, lambda a, b, c: (None, int((a >> (b & 31)) & 1)))
OPS["s_bitcmp0_b64"] = (64, lambda a, b, c: (None, int(not (a >> (b & 63)) & 1)))
OPS["s_bitcmp1_b64"] = (64, lambda a, b, c: (None, int((a >> (b & 63)) & 1)))

# S_*_SAVEEXEC_B64: D = EXEC; EXEC = f(S0, EXEC); SCC = EXEC != 0
SAVEEXEC = {
    "s_and_saveexec_b64": lambda s, e: s & e,
    "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e,
    "s_andn2_saveexec_b64": lambda s, e: s & ~e & M64,
    "s_orn2_saveexec_b64": lambda s, e: (s | ~e) & M64,
    "s_nand_saveexec_b64": lambda s, e: ~(s & e) & M64,
    "s_nor_saveexec_b64": lambda s, e: ~(s | e) & M64,
    "s_xnor_saveexec_b64": lambda s, e: ~(s ^ e) & M64,
}

# SOPK: s_<op>k_<type> sdst, simm16 ; the immediate is sign-extended for _i32.
SOPK_CMP = {f"s_cmpk_{p}_{t}": (t == "i32", f) for p, f in _PRED.items() for t in ("i32", "u32")}

BRANCH = {"s_branch": None,
          "s_cbranch_scc0": lambda w: w.scc == 0, "s_cbranch_scc1": lambda w: w.scc == 1,
          "s_cbranch_vccz": lambda w: (w.s[106] | w.s[107]) == 0,
          "s_cbranch_vccnz": lambda w: (w.s[106] | w.s[107]) != 0,
          "s_cbranch_execz": lambda w: w.exec_bits == 0,
          "s_cbranch_execnz": lambda w: w.exec_bits != 0}

# SOPP instructions with no architectural effect here: timing, priority and cache hints.
NO_EFFECT = {"s_nop", "s_sleep", "s_setprio", "s_sethalt", "s_trap", "s_icache_inv",
             "s_dcache_wb", "s_dcache_inv", "s_ttracedata", "s_sched_barrier"}


def branch_target(inst) -> int:
    """SOPP branches: PC of the next instruction + 4 * simm16 (S_BRANCH)."""
    imm = int(inst.text.split(" ", 1)[1].split(",")[-1], 0) & 0xFFFF
    if imm >= 0x8000:
        imm -= 0x10000
    return inst.addr + 4 + 4 * imm


def compile_scalar(inst, ctx):
    op = inst.op
    if op in OPS:
        bits, f = OPS[op]
        srcs = [o for o in inst.ops]
        if op.startswith(("s_cmp_", "s_bitcmp")):
            a, b = ssrc(srcs[0], bits), ssrc(srcs[1], 32 if "bitcmp" in op else bits)

            def cmp(w):
                w.scc = f(a(w), b(w), w.scc)[1]
            return cmp
        d = sdst(srcs[0], bits // 32)
        one = len(srcs) == 2
        sb = 32 if op.startswith(("s_lsh", "s_ashr", "s_bfe_u64")) else bits
        a = ssrc(srcs[1], bits)
        b = (lambda w: 0) if one else ssrc(srcs[2], sb)

        def alu(w):
            r, scc = f(a(w), b(w), w.scc)
            d(w, r)
            if scc is not None:
                w.scc = scc
        return alu
    if op in SAVEEXEC:
        f = SAVEEXEC[op]
        d, a = sdst(inst.ops[0], 2), ssrc(inst.ops[1], 64)

        def saveexec(w):
            old = w.exec_bits
            new = f(a(w), old)
            w.set_exec(new)
            d(w, old)
            w.scc = int(new != 0)
        return saveexec
    if op == "s_bitset1_b32" or op == "s_bitset0_b32":
        d, r, a = sdst(inst.ops[0]), inst.ops[0].reg, ssrc(inst.ops[1])
        on = op == "s_bitset1_b32"

        def bitset(w):
            bit = 1 << (a(w) & 31)
            d(w, (w.s[r] | bit) if on else (w.s[r] & ~bit))
        return bitset
    if op == "s_movk_i32" or op in ("s_mulk_i32", "s_addk_i32"):
        d, r = sdst(inst.ops[0]), inst.ops[0].reg
        k = to_signed(inst.ops[1].value, 16)
        if op == "s_movk_i32":
            return lambda w: d(w, k & M32)
        if op == "s_mulk_i32":
            return lambda w: d(w, (to_signed(w.s[r]) * k) & M32)

        def addk(w):
            t = (w.s[r] + (k & M32)) & M32
            w.scc = int((w.s[r] >> 31) == ((k & M32) >> 31) and (t >> 31) != (w.s[r] >> 31))
            d(w, t)
        return addk
    if op in SOPK_CMP:
        signed, f = SOPK_CMP[op]
        a = ssrc(inst.ops[0])
        k = inst.ops[1].value & 0xFFFF
        k = to_signed(k, 16) if signed else k

        def cmpk(w):
            x = a(w)
            w.scc = int(f(to_signed(x) if signed else x, k))
        return cmpk
    if op in BRANCH:
        target = ctx.index_of(branch_target(inst), inst)
        cond = BRANCH[op]
        if cond is None:
            return lambda w: target
        return lambda w: target if cond(w) else None
    if op.startswith("s_endpgm"):
        return lambda w: END
    if op == "s_barrier":
        return lambda w: BARRIER
    if op == "s_setprio":
        prio = inst.ops[0].value if inst.ops else 0

        def setprio(w):
            w.prio = prio
        return setprio
    if op == "s_waitcnt":
        vm, lgkm = inst.mods.get("vmcnt", 63), inst.mods.get("lgkmcnt", 15)
        if "simm16" in inst.mods:
            imm = inst.mods["simm16"]
            vm, lgkm = (imm & 0xF) | ((imm >> 14) & 3) << 4, (imm >> 8) & 0xF

        def waitcnt(w):
            w.wg.waits.wait(w, vm, lgkm)
        return waitcnt
    if op == "s_getreg_b32":
        return _getreg(inst)
    if op in NO_EFFECT:
        return lambda w: None
    return None


def _getreg(inst):
    """S_GETREG_B32 sdst, hwreg: `size` bits of a hardware register from bit `offset`.
    The registers pk.timestamp reads, with the emulators' placement of the wave
    (Target.emulated_place): HW_ID and XCC_ID."""
    d = sdst(inst.ops[0])
    reg, offset, size = cdna.hwreg_fields(inst.ops[1].value)
    hw_id = reg == cdna.HW_REG_IDS["HW_REG_HW_ID"]

    def getreg(w):
        unit, xcc = w.wg.run.prog_target.emulated_place(w.wg.index, w.id)
        full = unit if hw_id else xcc
        d(w, (full >> offset) & ((1 << size) - 1))
    return getreg
