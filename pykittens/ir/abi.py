"""The kernel-argument ABI: how a kernel's parameters become its arguments. Lowering (tensor
maps), code generation (the LLVM function's parameters), the launchers (the argument buffer)
and the ISA emulator (the argument segment) all read it here, below all of them.

Each kernel parameter becomes, in order:
  gl tensor of rank r -> a global pointer (8 bytes), then r i32 sizes, then r i32 strides
                         (in elements)
  scalar              -> its own type (i32 or f32, 4 bytes)
  TMA descriptor (Hopper) -> a 128-byte CUtensorMap by value, before all parameters (one
                         per tensor / box / swizzle a kernel's TMA loads use), 64-byte
                         aligned in the constant bank (the first at parameter offset 48)
Arguments are packed at their natural alignment, as the AMDGPU and NVPTX calling
conventions for kernel arguments do.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .. import targets


@dataclass(frozen=True)
class KernArg:
    name: str           # e.g. "x", "x.size0", "x.stride1", "alpha"
    param: str          # the kernel parameter it belongs to
    kind: str           # 'ptr', 'size', 'stride', 'scalar', 'tmap'
    dtype: str          # 'ptr', 'i32', 'f32', 'tmap'
    size: int
    axis: int = -1
    align: int = 0      # 0: the size (natural alignment)
    tma: object = None  # the TMADesc of a 'tmap' argument


@dataclass(frozen=True)
class TMADesc:
    """A tensor map the launcher encodes: which tensor, the shared-tile box it copies, and
    whether the box lands 128B-swizzled (the pattern of pk.st(..., swizzle=8) with 128-byte
    rows)."""
    name: str
    param: str
    box: tuple[int, int]          # (rows, cols) of the shared tile
    swizzle128: bool


def kernel_args(params, tmaps=()) -> list[KernArg]:
    out: list[KernArg] = [KernArg(t.name, t.param, "tmap", "tmap", 128, align=64, tma=t)
                          for t in tmaps]
    for p in params:
        if p.kind == "gl":
            out.append(KernArg(p.name, p.name, "ptr", "ptr", 8))
            r = p.type.rank
            out += [KernArg(f"{p.name}.size{i}", p.name, "size", "i32", 4, i) for i in range(r)]
            out += [KernArg(f"{p.name}.stride{i}", p.name, "stride", "i32", 4, i)
                    for i in range(r)]
        else:
            d = p.type.dtype
            if d.name not in ("i32", "f32"):
                raise TypeError(f"scalar parameter {p.name!r} of type {d} is not supported; "
                                "use pk.i32 or pk.f32")
            out.append(KernArg(p.name, p.name, "scalar", d.name, 4))
    return out


def offsets(args: list[KernArg]) -> list[int]:
    """Byte offset of each argument in the packed buffer (natural alignment; tensor maps
    aligned in the Hopper constant bank, where parameters start at its param_bank_base)."""
    bank = targets.get("sm_90a").param_bank_base     # tensor maps exist on Hopper only
    offs, pos = [], 0
    for a in args:
        al = a.align or a.size
        base = bank if a.kind == "tmap" else 0
        pos = -(-(base + pos) // al) * al - base
        offs.append(pos)
        pos += a.size
    return offs


FORMAT = {"ptr": "<Q", "i32": "<i", "f32": "<f"}     # struct format of each scalar kind


def tensor_value(a: KernArg, t) -> int:
    """A gl parameter's pointer, size or stride argument, read from its tensor (anything
    with data_ptr(), shape and stride(), e.g. a torch tensor)."""
    if a.kind == "ptr":
        return int(t.data_ptr())
    if a.kind == "size":
        return int(t.shape[a.axis])
    return int(t.stride(a.axis))


def pack_arg(buf: bytearray, a: KernArg, off: int, v) -> None:
    """Write argument `a` = `v` at byte `off` of `buf`, after checking that `v` is of the
    argument's kind and fits it (128 bytes for a tensor map)."""
    if a.dtype == "tmap":
        if not isinstance(v, (bytes, bytearray)) or len(v) != 128:
            raise TypeError(f"kernel argument {a.name!r} must be a 128-byte tensor map")
        buf[off:off + 128] = v
        return
    if a.dtype not in FORMAT:
        raise TypeError(f"kernel argument {a.name!r} has unsupported type {a.dtype!r}; "
                        f"the ABI has {', '.join(FORMAT)}")
    if a.dtype == "f32":
        if isinstance(v, bool) or not hasattr(v, "__float__"):
            raise TypeError(f"kernel argument {a.name!r} must be a number (f32), not "
                            f"{type(v).__name__}")
        v = float(v)
    else:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"kernel argument {a.name!r} must be an integer ({a.dtype}), not "
                            f"{type(v).__name__}")
        v = int(v)
        lo, hi = (0, 2**64) if a.dtype == "ptr" else (-2**31, 2**31)
        if not lo <= v < hi:
            raise OverflowError(f"kernel argument {a.name!r} = {v} does not fit {a.dtype}")
    struct.pack_into(FORMAT[a.dtype], buf, off, v)
