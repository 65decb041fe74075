"""Which integer registers are known multiples of what: lets a run of adjacent elements be
one aligned vector access (16-byte `ld.global.v4` needs the address to be provably aligned).

Flow-insensitive: a register written in several places gets the gcd of all of them, iterated
to a fixed point so loop-carried values are covered. Divisor 0 means "not yet constrained"
(gcd(0, x) = x); per-lane registers keep one divisor per slot.
"""
from __future__ import annotations

from math import gcd

from ..ir.nodes import walk

CAP = 1 << 20


def _bc(d, n):
    return d if len(d) == n else d * n if len(d) == 1 else d


def _cap(x):
    return min(x, CAP) if x else 0


def analyze(prog, stride_divisor: int = 1) -> dict:
    """{register: tuple of per-slot divisors}. Non-last tensor strides are assumed to be
    multiples of `stride_divisor` (the launcher checks this before picking such a build)."""
    d: dict = {}

    def get(r):
        return d.get(r, (0,))

    def rule(op):
        k = op.kind
        s = [get(x) for x in op.srcs] if op.srcs else []
        if k == "const":
            v = op.attrs["value"]
            return (abs(int(v)),) if isinstance(v, int) else None
        if k in ("special", "arg", "dim"):
            return (1,)
        if k == "stride":
            gl = op.srcs[0]
            return (1,) if op.attrs["axis"] == gl.type.rank - 1 else (stride_divisor,)
        if k == "coord":
            lay, dim = op.attrs["layout"], op.attrs["dim"]
            g = 0
            for dd, st in lay.lane_bits:
                if dd == dim:
                    g = gcd(g, st)
            return tuple(gcd(g, sl[dim]) for sl in lay.slots)
        if k in ("mov", "cvt") and not op.dst.type.dtype.is_float:
            return _bc(s[0], op.dst.type.nslots)
        if k == "bin" and not op.dst.type.dtype.is_float:
            n = op.dst.type.nslots
            a, b = _bc(s[0], n), _bc(s[1], n)
            o = op.attrs["op"]
            if o in ("add", "sub"):
                return tuple(gcd(x, y) for x, y in zip(a, b))
            if o == "mul":
                return tuple(_cap(x * y) for x, y in zip(a, b))
            if o == "shl" and op.srcs[1] in consts:
                return tuple(_cap(x << consts[op.srcs[1]]) for x in a)
            return (1,) * n
        if k == "select" and not op.dst.type.dtype.is_float:
            n = op.dst.type.nslots
            a, b = _bc(s[1], n), _bc(s[2], n)
            return tuple(gcd(x, y) for x, y in zip(a, b))
        if k == "slots" and not op.dst.type.dtype.is_float:
            return tuple(_bc(s[0], max(op.attrs["index"]) + 1)[i] for i in op.attrs["index"])
        if k == "peer":                      # a tensor view: no number to track
            return None
        if k == "for":
            return (gcd(s[0][0], abs(op.attrs["step"])),)
        if op.dst is not None and not op.dst.type.dtype.is_float:
            return (1,) * op.dst.type.nslots
        return None

    consts = {op.dst: int(op.attrs["value"]) for op in walk(prog.body)
              if op.kind == "const" and isinstance(op.attrs["value"], int)}
    changed = True
    while changed:
        changed = False
        for op in walk(prog.body):
            if op.dst is None:
                continue
            new = rule(op)
            if new is None:
                continue
            old = d.get(op.dst)
            merged = new if old is None else tuple(
                gcd(x, y) for x, y in zip(_bc(old, len(new)), _bc(new, len(old))))
            if merged != old:
                d[op.dst] = merged
                changed = True
    return d


def alignment(divs: dict, reg, slot: int, esz: int, limit: int = 16) -> int:
    """Provable byte alignment of element offset `reg[slot]` (base pointers are 16-aligned)."""
    g = _bc(divs.get(reg, (1,)), slot + 1)[slot] if reg in divs else 1
    if g == 0:
        return limit
    p = g & -g                                # largest power of two dividing g
    return max(esz, min(limit, p * esz))
