"""Readers and writers for decoded operands, built once per instruction: each returns a
closure over the wave so that executing an instruction does no parsing.

Vector sources yield one 32-bit value per lane (a uint32 array, or a numpy scalar that
broadcasts: an SGPR or a constant is the same in every lane, CDNA3 ISA "VALU operands");
scalar sources yield Python ints.
"""
from __future__ import annotations

import numpy as np

from .decode import SRC_SCC, Operand, imm_bits
from .state import ISAError

M32 = 0xFFFFFFFF


def const_bits(o: Operand, bits: int = 32, is_float: bool = False) -> int:
    return imm_bits(o, bits, is_float)


def vsrc(o: Operand, bits: int = 32, is_float: bool = False, part: int = 0):
    """Reader of one 32-bit register per lane: register `o.reg + part`, or the constant's
    bits (`bits` = the source's width, which decides how a float constant is encoded; a
    64-bit constant's `part` 1 is its high half)."""
    if o.kind == "v":
        r = o.reg + part
        return lambda w: w.v[r]
    if o.kind == "s":
        r = o.reg + part
        if r == SRC_SCC:
            return lambda w: np.uint32(w.scc)
        return lambda w: np.uint32(w.s[r])
    if o.kind in ("imm", "float"):
        c = np.uint32((const_bits(o, bits, is_float) >> (32 * part)) & M32)
        return lambda w: c
    raise ISAError(f"operand {o.text!r} cannot be a vector source")


def vsrc64(o: Operand, is_float: bool = False):
    """Reader of a 64-bit value per lane (a register pair or a constant) as uint64."""
    if o.kind in ("imm", "float"):
        c = np.uint64(const_bits(o, 64, is_float))
        return lambda w: c
    lo, hi = vsrc(o, 64, is_float, 0), vsrc(o, 64, is_float, 1)
    return lambda w: lo(w).astype(np.uint64) | (np.asarray(hi(w)).astype(np.uint64) << 32)


def ssrc(o: Operand, bits: int = 32):
    """Reader of a scalar source as an int of `bits` bits (64: a register pair)."""
    if o.kind == "s":
        r = o.reg
        if r == SRC_SCC:
            return lambda w: w.scc
        if bits == 64:
            return lambda w: w.s[r] | (w.s[r + 1] << 32)
        return lambda w: w.s[r]
    if o.kind in ("imm", "float"):
        c = const_bits(o, bits, False)
        if bits == 64 and o.kind == "imm" and o.value < 0:
            c = o.value & ((1 << 64) - 1)            # sign-extended inline constant
        return lambda w: c
    raise ISAError(f"operand {o.text!r} cannot be a scalar source")


def sdst(o: Operand, n: int = 1):
    """Writer of an SGPR destination (n registers) from an int."""
    if o.kind != "s":
        raise ISAError(f"operand {o.text!r} cannot be a scalar destination")
    r = o.reg
    if n == 1:
        if r in (126, 127):
            def write1(w, v):
                w.s[r] = v & M32
                w.exec_changed()
            return write1

        def write(w, v):
            w.s[r] = v & M32
        return write

    def write_n(w, v):
        w.write_sgpr(r, v, n)
    return write_n


def to_signed(x: int, bits: int = 32) -> int:
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x
