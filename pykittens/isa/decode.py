"""Instruction text -> operands: the emulator's decoder.

AMD's LLVM disassembles the code object (`toolchain.amdgpu.instructions`: address, size and
text of every instruction); this module parses that text, in LLVM's AMDGPU assembler syntax
(AMDGPUUsage, "AMDGPU Instruction Syntax"), into a mnemonic, its encoding suffix, the
operands and the trailing modifiers. It knows the syntax, not what instructions do.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from ..targets import cdna

# SGPR-file operands by their encoded numbers (CDNA3 ISA, "Scalar ALU Operands"): the
# emulator keeps them in one array so that e.g. `s_mov_b64 exec, s[4:5]` is an ordinary
# 64-bit write.
SPECIAL = {"flat_scratch_lo": 102, "flat_scratch_hi": 103, "flat_scratch": 102,
           "xnack_mask_lo": 104, "xnack_mask_hi": 105, "xnack_mask": 104,
           "vcc_lo": 106, "vcc_hi": 107, "vcc": 106, "m0": 124,
           "exec_lo": 126, "exec_hi": 127, "exec": 126}
WIDE = {"flat_scratch", "xnack_mask", "vcc", "exec"}
VCC, M0, EXEC = 106, 124, 126
SRC_SCC = 253                      # scc as a VALU/SALU source operand
AGPR_BASE = 256                    # a0 is row 256 of the unified vector register file

_REG = re.compile(r"^([vsa])(?:(\d+)|\[(\d+):(\d+)\])$")
_TTMP = re.compile(r"^ttmp(?:(\d+)|\[(\d+):(\d+)\])$")
_INV_2PI = "0.15915494"


@dataclass(frozen=True)
class Operand:
    """One operand. kind: 'v' (vector register, VGPR or AGPR: `reg` indexes the unified
    file, a0 = 256), 's' (SGPR file by encoded number, incl. vcc/exec/m0), 'imm' (an
    integer: inline constant or literal, `value` as written), 'float' (an inline float
    constant, `text` as written; its bits depend on the operand's type), 'off' (no
    register), 'hwreg' (s_getreg_b32's register: `value` its simm16, cdna.hwreg's
    encoding). `n` counts 32-bit registers."""
    kind: str
    reg: int = 0
    n: int = 1
    value: int = 0
    text: str = ""
    neg: bool = False
    abs: bool = False
    sext: bool = False

    @property
    def is_reg(self) -> bool:
        return self.kind in ("v", "s")

    @property
    def regs(self) -> range:
        return range(self.reg, self.reg + self.n)

    def __str__(self) -> str:
        return self.text


@dataclass
class Inst:
    """A decoded instruction: `op` is the mnemonic without its encoding suffix (`enc`:
    '', 'e32', 'e64', 'dpp' or 'sdwa'); `mods` the trailing modifiers (flags map to True,
    `key:value` to an int, a tuple of ints or the text)."""
    addr: int
    size: int
    text: str
    op: str
    enc: str
    ops: tuple
    mods: dict = field(default_factory=dict)

    @property
    def mnemonic(self) -> str:
        return self.text.split(" ", 1)[0]

    def where(self) -> str:
        return f"{self.mnemonic} at 0x{self.addr:x}"


class DecodeError(ValueError):
    pass


# s_getreg_b32's registers the emulator reads (pk.timestamp's), by the disassembler's names
HWREGS = cdna.HW_REG_IDS
_HWREG = re.compile(r"hwreg\((\w+)(?:,\s*(\d+),\s*(\d+))?\)")


def parse_operand(tok: str) -> Operand:
    text = tok
    neg = ab = sext = False
    if tok.startswith("sext(") and tok.endswith(")"):
        sext, tok = True, tok[5:-1]
    if tok.startswith("-") and not _is_number(tok):
        neg, tok = True, tok[1:]
    if tok.startswith("|") and tok.endswith("|"):
        ab, tok = True, tok[1:-1]
    elif tok.startswith("abs(") and tok.endswith(")"):
        ab, tok = True, tok[4:-1]
    if tok.startswith("neg(") and tok.endswith(")"):
        neg, tok = True, tok[4:-1]
    m = _REG.match(tok)
    if m:
        f, one, lo, hi = m.groups()
        first, last = (int(one), int(one)) if one is not None else (int(lo), int(hi))
        base = AGPR_BASE if f == "a" else 0
        return Operand("s" if f == "s" else "v", base + first, last - first + 1, text=text,
                       neg=neg, abs=ab, sext=sext)
    m = _TTMP.match(tok)
    if m:
        one, lo, hi = m.groups()
        first, last = (int(one), int(one)) if one is not None else (int(lo), int(hi))
        return Operand("s", 108 + first, last - first + 1, text=text)
    if tok in SPECIAL:
        return Operand("s", SPECIAL[tok], 2 if tok in WIDE else 1, text=text, neg=neg,
                       abs=ab)
    if tok in ("scc", "src_scc"):
        return Operand("s", SRC_SCC, 1, text=text)
    if tok == "off":
        return Operand("off", text=text)
    m = _HWREG.fullmatch(tok)
    if m:
        name, offset, size = m.group(1), int(m.group(2) or 0), int(m.group(3) or 32)
        if name not in HWREGS and not name.isdigit():
            raise DecodeError(f"hardware register {name} is not one the emulator reads "
                              f"({', '.join(HWREGS)})")
        reg = int(name) if name.isdigit() else HWREGS[name]
        return Operand("hwreg", value=cdna.hwreg(reg, offset, size), text=text)
    if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
        return Operand("imm", value=int(tok, 0), text=text, neg=neg, abs=ab, sext=sext)
    if re.fullmatch(r"-?\d+\.\d+(e[-+]?\d+)?", tok):
        return Operand("float", text=tok, neg=neg, abs=ab)
    raise DecodeError(f"cannot parse operand {text!r}")


def _is_number(tok: str) -> bool:
    return bool(re.fullmatch(r"-(0x[0-9a-fA-F]+|\d+(\.\d+)?(e[-+]?\d+)?)", tok))


def _mod_value(v: str):
    if v.startswith("[") and v.endswith("]"):
        return tuple(int(x, 0) for x in v[1:-1].split(",") if x.strip())
    try:
        return int(v, 0)
    except ValueError:
        return v


def parse(addr: int, size: int, text: str) -> Inst:
    mnem, _, rest = text.partition(" ")
    op, enc = mnem, ""
    for suf in ("_e32", "_e64", "_dpp", "_sdwa"):
        if mnem.endswith(suf):
            op, enc = mnem[:-len(suf)], suf[1:]
            break
    rest = rest.strip()
    mods: dict = {}
    if op == "s_waitcnt" or op.startswith("s_waitcnt_"):
        for part in rest.split():
            m = re.fullmatch(r"(\w+)\((\d+)\)", part)
            if m:
                mods[m.group(1)] = int(m.group(2))
        if rest and not mods:             # the raw simm16
            mods["simm16"] = int(rest.split()[0], 0)
        return Inst(addr, size, text, op, enc, (), mods)
    if not rest:
        return Inst(addr, size, text, op, enc, ())
    toks = rest.split(", ")
    tail = toks[-1].split(" ")
    operands = toks[:-1] + [tail[0]]
    for m in tail[1:]:
        k, sep, v = m.partition(":")
        mods[k] = _mod_value(v) if sep else True
    try:
        ops = tuple(parse_operand(t) for t in operands)
    except DecodeError as e:
        raise DecodeError(f"{e} in {text!r} at 0x{addr:x}") from None
    return Inst(addr, size, text, op, enc, ops, mods)


# ---------------------------------------------------------------------------- constants

def float_bits(text: str, bits: int) -> int:
    """The encoding of an inline float constant for an operand of `bits` bits (CDNA3 ISA,
    "Inline constants": 0.5, 1.0, 2.0, 4.0, their negations and 1/(2*pi), each in the
    operand's own format)."""
    neg = text.startswith("-")
    if text.lstrip("-") == _INV_2PI:
        v = {16: 0x3118, 32: 0x3E22F983, 64: 0x3FC45F306DC9C882}[bits]
        sign = 1 << (bits - 1)
        return v | sign if neg else v
    x = float(text)
    if bits == 16:
        import numpy as np
        return int(np.float16(x).view(np.uint16))
    if bits == 32:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def imm_bits(o: Operand, bits: int = 32, is_float: bool = False) -> int:
    """An immediate operand's bits for a source of `bits` bits. Integer text is the value
    (negatives two's complement); a float constant is encoded per `bits` (and a 32-bit
    float literal for a 64-bit float source sits in the high half, ISA "Literal
    constants")."""
    if o.kind == "float":
        return float_bits(o.text, bits)
    v = o.value & ((1 << bits) - 1)
    if is_float and bits == 64 and not -16 <= o.value <= 64:
        v = (o.value & 0xFFFFFFFF) << 32
    return v
