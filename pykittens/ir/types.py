"""Element types and the types of tile-IR values."""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    kind: str              # 'float' or 'int'
    np: type               # numpy (ml_dtypes) storage type
    packed: int | Fraction = 1   # values per stored element (e2m1x2: two FP4 values a byte;
                                 # e2m3p / e3m2p: four FP6 values in three bytes)

    @property
    def bytes(self) -> int:
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_fp8(self) -> bool:
        return self.is_float and self.bits == 8 and self.packed == 1

    def __repr__(self) -> str:
        return self.name


f32 = DType("f32", 32, "float", np.float32)
bf16 = DType("bf16", 16, "float", ml_dtypes.bfloat16)
f16 = DType("f16", 16, "float", np.float16)
e4m3 = DType("e4m3", 8, "float", ml_dtypes.float8_e4m3fn)          # OCP E4M3 (gfx950, sm_90a)
e5m2 = DType("e5m2", 8, "float", ml_dtypes.float8_e5m2)            # OCP E5M2
e4m3fnuz = DType("e4m3fnuz", 8, "float", ml_dtypes.float8_e4m3fnuz)  # gfx942 FNUZ E4M3
e5m2fnuz = DType("e5m2fnuz", 8, "float", ml_dtypes.float8_e5m2fnuz)  # gfx942 FNUZ E5M2
e8m0 = DType("e8m0", 8, "float", ml_dtypes.float8_e8m0fnu)         # OCP MX block scale 2^(e-127)
# OCP MX FP4 (E2M1), two a byte: element 2i in bits 3:0, 2i + 1 in bits 7:4 (torch's
# float4_e2m1fn_x2). Tiles of it count bytes: a row of K values is K / 2 columns. Only
# moved (loads, stores) and multiplied (gfx950's block-scaled MFMAs), never computed on.
e2m1x2 = DType("e2m1x2", 8, "float", np.uint8, packed=2)
# OCP MX FP6, E2M3 and E3M2, packed densely: a row is one little-endian bit string, value j
# in bits 6j .. 6j + 5 (four values in three bytes; gfx950's MFMAs read them so from their
# registers). Tiles of it count bytes, a row of K values 3K / 4 columns; held in uint8
# arrays, which bind as e2m1x2 unless the kernel's DT (given, or its default) names FP6
# (runtime.args.bind_args). Only moved and multiplied, like e2m1x2.
e2m3p = DType("e2m3p", 8, "float", np.uint8, packed=Fraction(4, 3))
e3m2p = DType("e3m2p", 8, "float", np.uint8, packed=Fraction(4, 3))
i8 = DType("i8", 8, "int", np.int8)
i32 = DType("i32", 32, "int", np.int32)
boolean = DType("i1", 1, "int", np.bool_)

DTYPES = {d.name: d for d in (f32, bf16, f16, e4m3, e5m2, e4m3fnuz, e5m2fnuz, e8m0, e2m1x2,
                              e2m3p, e3m2p, i8, i32)}
FP6 = (e2m3p, e3m2p)
_NP = {np.dtype(d.np): d for d in DTYPES.values() if d not in FP6}   # uint8: e2m1x2


def same_storage(got: DType, want: DType) -> bool:
    """Whether an array holding `got` may be passed where `want` is declared: the same type,
    or bytes of one packed format where another is (an uint8 array holds any of them)."""
    return got == want or (got.packed != 1 and want.packed != 1 and got.np is want.np)


def dtype_of(x) -> DType:
    """DType from a DType, its name, or a numpy/torch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in DTYPES:
        return DTYPES[x]
    name = str(x).replace("torch.", "")
    torch_names = {"float32": f32, "bfloat16": bf16, "float16": f16, "float8_e4m3fn": e4m3,
                   "float8_e5m2": e5m2, "float8_e4m3fnuz": e4m3fnuz,
                   "float8_e5m2fnuz": e5m2fnuz, "float8_e8m0fnu": e8m0,
                   "float4_e2m1fn_x2": e2m1x2, "int8": i8,
                   "int32": i32}
    if name in torch_names:
        return torch_names[name]
    try:
        return _NP[np.dtype(x)]
    except (TypeError, KeyError):
        raise TypeError(f"unsupported element type {x!r}; pykittens supports "
                        f"{', '.join(DTYPES)}") from None


def fp8_max(d: DType) -> float:
    return float(ml_dtypes.finfo(d.np).max)


# ---- value types -------------------------------------------------------------------------

@dataclass(frozen=True)
class ScalarType:
    """A value uniform across the wave (lives in an SGPR on CDNA)."""
    dtype: DType

    def __str__(self) -> str:
        return str(self.dtype)


@dataclass(frozen=True)
class GlobalType:
    """A tensor in global memory; None dims are known only at launch."""
    dtype: DType
    shape: tuple[int | None, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"gl<{self.dtype}>[{dims}]"


ROLES = (None, "a", "b", "acc", "a_scale", "b_scale")


@dataclass(frozen=True)
class RegTileType:
    """A per-wave register tile. `layout` says whether lanes sweep rows ('row') or columns
    ('col'); `role` ties the tile to a matrix-instruction operand layout (a, b, acc)."""
    dtype: DType
    shape: tuple[int, int]
    layout: str = "row"
    role: str | None = None
    pin: tuple[str, int] | None = None        # ('v'|'a', first register) for pinned tiles
    mma: int | None = None                    # matrix-instruction M/N (16 or 32) of a role tile
    scaled: bool = False                      # operand of a block-scaled (MX) instruction
    krun: int | None = None                   # CDNA operand: K held in runs of krun per lane

    def __str__(self) -> str:
        extra = f",{self.role}" if self.role else ""
        extra += f",mma{self.mma}" if self.mma else ""
        extra += ",scaled" if self.scaled else ""
        extra += f",krun{self.krun}" if self.krun else ""
        pin = f" @{self.pin[0]}{self.pin[1]}" if self.pin else ""
        return f"rt<{self.dtype}>[{self.shape[0]}x{self.shape[1]},{self.layout}{extra}]{pin}"

    @property
    def mn_dims(self) -> tuple[int, ...]:
        """The dims of a role tile that run along its matrix instruction's M or N (not K)."""
        if self.role == "acc":
            return self.shape
        if self.role == "b_scale":                 # K/32 x N
            return (self.shape[1],)
        if self.role == "a_scale":                 # M x K/32
            return (self.shape[0],)
        return (self.shape[0],) if self.layout == "row" else (self.shape[1],)   # a, b


@dataclass(frozen=True)
class RegVecType:
    """A per-wave vector holding one value per row (axis='row') or per column (axis='col')
    of a register tile of type `of`; it broadcasts along that axis."""
    dtype: DType
    of: RegTileType
    axis: str

    @property
    def length(self) -> int:
        return self.of.shape[0 if self.axis == "row" else 1]

    def __str__(self) -> str:
        return f"rv<{self.dtype}>[{self.length},{self.axis} of {self.of}]"


@dataclass(frozen=True)
class SharedTileType:
    """A workgroup-shared tile in LDS / shared memory, row-major, optionally swizzled:
    swizzle=n XORs the 16-byte chunk index of a row with (row % n) to spread banks."""
    dtype: DType
    shape: tuple[int, int]
    swizzle: int = 0

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.bytes

    @property
    def atoms(self) -> int:
        """128-byte column blocks: a swizzle=8 tile with rows wider than 128 bytes is stored
        as that many (rows x 128-byte) blocks one after another, the hardware's 128B-swizzle
        atoms (TMA boxes and wgmma descriptors address them); 1 for any other tile."""
        row = self.shape[1] * self.dtype.bytes
        return row // 128 if self.swizzle == 8 and row > 128 and row % 128 == 0 else 1

    def __str__(self) -> str:
        sw = f",swz{self.swizzle}" if self.swizzle else ""
        return f"st<{self.dtype}>[{self.shape[0]}x{self.shape[1]}{sw}]"


@dataclass(frozen=True)
class MBarrierType:
    """A memory barrier in shared memory that completes a phase after `arrivals` waves
    arrived (Hopper mbarrier): point-to-point producer/consumer synchronisation."""
    arrivals: int

    @property
    def nbytes(self) -> int:
        return 8

    def __str__(self) -> str:
        return f"mbarrier[{self.arrivals}]"


@dataclass(frozen=True)
class StagesType:
    """`count` shared tiles (or mbarriers) of one type, one after another in shared memory,
    picked by a runtime index: the stages of a producer/consumer pipeline."""
    of: SharedTileType | MBarrierType
    count: int

    @property
    def nbytes(self) -> int:
        return self.count * self.of.nbytes

    def __str__(self) -> str:
        return f"{self.of}x{self.count}"


def is_tile(t) -> bool:
    return isinstance(t, (RegTileType, RegVecType, SharedTileType))
