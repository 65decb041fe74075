"""Everything a kernel body calls: ids, tile constructors, memory, math, reductions, mma,
control flow and scheduling. Each function checks its arguments and emits one tile-IR op."""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import math
import sys

import numpy as np

from ..ir import types as T
from ..ir.nodes import Block
from .trace import current, error, new_value
from .values import GL, RT, RV, ST, Scalar, Stages, Tile, as_index, as_scalar

# ---- types --------------------------------------------------------------------------------


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def rt(shape, dtype, layout: str = "row", role: str | None = None, pin=None,
       mma: int | None = None, scaled: bool = False, krun: int | None = None) -> T.RegTileType:
    """Register tile type: (rows, cols), element type, 'row'/'col' lane layout and an optional
    matrix role ('a', 'b', 'acc') whose lanes follow the matrix instruction's operand layout.
    `mma=16|32` picks the instruction family (its M) of a role tile; by default the target
    picks (CDNA: 32 when the tile's M/N dims allow it, else 16; Hopper: 16).
    `pin="a0"` places the tile on explicit registers (CDNA). `scaled=True` makes an a/b tile
    an operand of the block-scaled (MX) instructions (gfx950), whose E8M0 scales live in
    tiles of role 'a_scale' (M x K/32) and 'b_scale' (K/32 x N).
    `krun=4` (CDNA operands) holds each lane's K values in runs of 4, the row pattern of an
    accumulator, so an accumulator converts into this operand without moving data between
    lanes (pk.convert); both operands of an mma must use the same krun."""
    shape = tuple(int(s) for s in shape)
    # role tiles are whole matrix-instruction tiles: multiples of 16 (e.g. 176 keys)
    ok = _pow2 if role is None else (lambda n: n > 0 and n % 16 == 0 or _pow2(n))
    if len(shape) != 2 or not all(ok(s) for s in shape):
        raise error(f"register tile shape {shape} must be two powers of two (rows, cols) "
                    "(tiles with a role: multiples of 16); ragged problem sizes are handled "
                    "by bounds on load/store, not by the tile")
    if layout not in ("row", "col"):
        raise error(f"register tile layout must be 'row' or 'col', not {layout!r}")
    if role not in T.ROLES:
        raise error(f"register tile role must be one of 'a', 'b', 'acc', 'a_scale', "
                    f"'b_scale' or None, not {role!r}")
    if pin is not None:
        if not (isinstance(pin, str) and pin[:1] in ("v", "a") and pin[1:].isdigit()):
            raise error(f"pin={pin!r}: write the first register as 'v<N>' or 'a<N>', e.g. 'a0'")
        pin = (pin[0], int(pin[1:]))
    if mma is not None and (role is None or mma not in (16, 32)):
        raise error("mma=16 or mma=32 applies to tiles with a role ('a', 'b', 'acc')")
    if role in ("a_scale", "b_scale") and layout != "row":
        raise error(f"{role} tiles use the row layout (the matrix unit's own layout)")
    if krun is not None and (role not in ("a", "b") or not isinstance(krun, int) or
                             not _pow2(krun)):
        raise error("krun= applies to operand tiles (role 'a' or 'b') and is a power of two")
    if scaled and role not in ("a", "b"):
        raise error("scaled=True applies to operand tiles (role 'a' or 'b')")
    if role in ("a_scale", "b_scale"):
        if T.dtype_of(dtype).name != "e8m0":
            raise error(f"{role} tiles hold E8M0 block scales: use pk.e8m0, not {dtype}")
        return T.RegTileType(T.dtype_of(dtype), shape, layout, role, pin, mma)
    t = T.RegTileType(T.dtype_of(dtype), shape, layout, role, pin, mma, bool(scaled), krun)
    if role is not None and any(d % (mma or 16) for d in t.mn_dims):
        raise error(f"a {role!r} tile of shape {shape} cannot be built from {mma or 16}-wide "
                    "matrix-instruction tiles; make its M/N dims multiples of 16")
    return t


def rv(of: T.RegTileType | RT, axis: str = "row", dtype=None) -> T.RegVecType:
    """Vector type with one value per row (axis='row') or column (axis='col') of tile `of`."""
    of = of.type if isinstance(of, RT) else of
    if not isinstance(of, T.RegTileType):
        raise error("pk.rv(of=...) needs a register tile type or tile")
    if axis not in ("row", "col"):
        raise error(f"vector axis must be 'row' or 'col', not {axis!r}")
    return T.RegVecType(T.dtype_of(dtype) if dtype is not None else of.dtype, of, axis)


def st(shape, dtype, swizzle: int = 0) -> T.SharedTileType:
    """Shared tile type (LDS on CDNA, shared memory on Hopper)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or not _pow2(shape[1]) or not (_pow2(shape[0]) or
                                                      shape[0] > 0 and shape[0] % 8 == 0):
        raise error(f"shared tile shape {shape} must be (rows, cols) with cols a power of two "
                    "and rows a power of two or a multiple of 8")
    if swizzle and not _pow2(swizzle):
        raise error(f"swizzle={swizzle} must be a power of two (rows in the XOR pattern)")
    return T.SharedTileType(T.dtype_of(dtype), shape, swizzle)


def _wrap(v):
    t = v.type
    if isinstance(t, T.RegVecType):
        return RV(v)
    if isinstance(t, T.RegTileType):
        return RT(v)
    return ST(v)


def empty(type_, count: int | None = None):
    """Allocate a tile of `type_` (contents undefined until written). With count=n, n shared
    tiles of that type one after another: `tiles[i]` picks one by a runtime index (the
    stages of a pipeline, see pk.Ring)."""
    if not T.is_tile(type_):
        raise error(f"pk.empty needs a tile type from pk.rt / pk.rv / pk.st, got {type_!r}")
    if isinstance(type_, T.SharedTileType) and len(current().blocks) > 1:
        raise error("shared tiles must be allocated at the top of the kernel, outside loops "
                    "and branches, so their LDS offsets are static")
    if count is not None:
        if not isinstance(type_, T.SharedTileType):
            raise error("count= allocates stages of a shared tile (pk.st)")
        return _stages(type_, count, ST)
    v = new_value(type_)
    current().emit("alloc", v)
    return _wrap(v)


def _stages(type_, count, wrap) -> Stages:
    if not isinstance(count, int) or count < 1:
        raise error(f"count={count!r}: the number of stages is a positive int")
    v = new_value(T.StagesType(type_, count))
    current().emit("alloc", v)
    return Stages(v, wrap)


def full(type_, value) -> Tile:
    t = empty(type_)
    fill(t, value)
    return t


def zeros(type_) -> Tile:
    return full(type_, 0.0)


def fill(dst: Tile, value) -> Tile:
    _need_reg(dst, "fill")
    current().emit("fill", dst.v, (as_scalar(value, dst.dtype).v,))
    return dst


def _need_reg(t, what):
    if not isinstance(t, RT):
        raise error(f"{what} works on register tiles/vectors, got {type(t).__name__}")


def _same_packing(src, dst, what):
    """A packed type converts to nothing and nothing converts to it."""
    ds, dd = src.dtype, dst.dtype
    if ds != dd and (ds.packed != 1 or dd.packed != 1):
        raise error(f"{what} cannot convert {ds} to {dd}: packed values (FP4 pairs, FP6) "
                    f"move as they are; make both {ds if ds.packed != 1 else dd}")


def _need_values(d: T.DType, what):
    """Packed types (pk.e2m1x2, pk.e2m3p, pk.e3m2p) are moved and multiplied only: their
    bytes hold parts of values (two FP4 a byte, four FP6 in three bytes)."""
    if d.packed != 1:
        raise error(f"{what}: {d} tiles hold packed values (FP4 pairs, FP6), which are only "
                    "loaded, stored and multiplied (block-scaled mma); nothing computes on "
                    "them")


def _dst_of(dst):
    """`dst` may be a tile (written in place) or a tile type (a new tile is allocated)."""
    if isinstance(dst, Tile):
        return dst
    if T.is_tile(dst):
        return empty(dst)
    raise error(f"expected a tile or a tile type as destination, got {type(dst).__name__}")


# ---- ids ----------------------------------------------------------------------------------

def _special(name, axis=0) -> Scalar:
    if axis not in (0, 1, 2):
        raise error(f"axis must be 0, 1 or 2, not {axis!r}")
    out = new_value(T.ScalarType(T.i32), name)
    current().emit("special", out, name=name, axis=axis)
    return Scalar(out)


def program_id(axis: int = 0) -> Scalar:
    """Index of this workgroup in the launch grid along `axis`."""
    return _special("program_id", axis)


def num_programs(axis: int = 0) -> Scalar:
    return _special("num_programs", axis)


def wave_id() -> Scalar:
    """Index of this wave (warp on Hopper) inside the workgroup."""
    return _special("wave_id")


def lane_id(type_) -> RT:
    """A new i32 register tile of `type_`'s shape and layout whose every element holds the
    index of the lane that owns it: a way to see a layout (`pk.emulate` it and print)."""
    if not isinstance(type_, T.RegTileType):
        raise error("pk.lane_id takes a register tile type, e.g. pk.rt((16, 16), pk.i32)")
    if type_.role in ("a", "b"):
        raise error("pk.lane_id shows plain and accumulator tiles; an operand tile's lanes "
                    "depend on its element type: see pykittens.lower.layouts.tile_layout")
    dst = empty(dataclasses.replace(type_, dtype=T.i32, pin=None))
    current().emit("lane_id", dst.v)
    return dst


def num_waves() -> int:
    """Waves per workgroup: a compile-time constant of the kernel."""
    return current().num_waves


# ---- memory -------------------------------------------------------------------------------

def _coords(coord, n, what):
    if coord is None:                      # the origin, in as many dims as the tensor has
        coord = (0,) * n
    if not isinstance(coord, (tuple, list)):
        coord = (coord,)
    if len(coord) != n:
        raise error(f"{what} needs {n} coordinates (one per tensor dim), got {len(coord)}")
    return tuple(as_index(c, f"{what}: a coordinate").v for c in coord)


def _check_window(tile_t, mem_t, what):
    need = 1 if isinstance(tile_t, T.RegVecType) else 2
    if mem_t.rank < need:
        raise error(f"{what}: a {need}-D tile needs a global tensor of rank >= {need}, "
                    f"got rank {mem_t.rank}")


def _ends(end, gl, what):
    """`end=`: one exclusive upper bound per tensor dim (None: the tensor's size), for the
    dims a window covers; elements at or past it read as `fill` / are not written, as
    outside the tensor (e.g. a sequence's end inside a packed batch)."""
    if end is None:
        return None
    if not isinstance(end, (tuple, list)) or len(end) != gl.rank:
        raise error(f"{what}: end= needs one bound per tensor dim ({gl.rank}), None for "
                    "the tensor's own size")
    return tuple(None if e is None else as_index(e, f"{what}: an end= bound").v for e in end)


def _inside(inside) -> dict:
    """The attribute of a window promised inside its tensor (absent otherwise)."""
    if not isinstance(inside, bool):
        raise error(f"inside= is True or False (a promise made when the kernel is built), "
                    f"got {inside!r}")
    return {"inside": True} if inside else {}


def load(dst, src, coord=None, fill: float = 0.0, direct: bool = False, end=None,
         inside: bool = False) -> Tile:
    """Load into `dst` (a tile, or a tile type to allocate) from `src` at element `coord`.

    global -> register/shared: `coord` has one entry per tensor dim and the tile covers the
    last one (vectors) or two (tiles) dims; elements outside the tensor read as `fill`.
    shared -> register: `coord` is the (row, col) of the sub-tile inside the shared tile; a
    vector reads a (1, length) window (column vector) or a (length, 1) window (row vector)
    there, e.g. per-query statistics a producer staged with the query block.
    Element types convert on the way (e.g. bf16 in memory, f32 in registers).

    end=(...): per tensor dim, an exclusive bound (or None) below the tensor's size: elements
    past it read as `fill` too (global -> register/shared).
    inside=True (global -> register): a promise that the whole window lies inside the
    tensor (and before end=), so the code checks no bounds; the emulator checks the
    promise and reports a window that breaks it. For launch rules that know their windows
    fit (rows of exactly the held width, a grid that covers the rows exactly).
    direct=True (global -> shared): on CDNA the data goes from memory straight into LDS
    (buffer_load ... lds: 4 bytes per lane on gfx942, 16 on gfx950) without passing through
    registers; when a launch's shapes do not allow it (last dim or column origin not a
    multiple of the per-lane chunk) the ordinary path runs instead. Other targets always
    take the ordinary path. Elements outside the tensor read as 0.
    """
    dst = _dst_of(dst)
    tr = current()
    if isinstance(src, (GL, ST)):
        _same_packing(src, dst, "load")
    if direct and not (isinstance(src, GL) and isinstance(dst, ST)):
        raise error("direct=True applies to global -> shared loads")
    if direct and fill != 0.0:
        raise error("direct loads fill elements outside the tensor with 0; drop fill= or "
                    "use the ordinary load")
    if isinstance(src, GL):
        _check_window(dst.type, src.type, "load")
        if isinstance(dst, ST) and src.dtype != dst.dtype:
            raise error(f"global->shared load copies bytes and cannot convert "
                        f"{src.dtype} to {dst.dtype}; make the shared tile {src.dtype}")
        if end is not None and direct:
            raise error("direct loads are bounded by the tensor only; drop end= or direct=")
        promise = _inside(inside)
        if promise and not isinstance(dst, RT):
            raise error("inside=True promises a register window inside the tensor; drop it "
                        "for loads into shared tiles")
        tr.emit("load", dst.v, (src.v,) + _coords(coord, src.rank, "load"), fill=float(fill),
                direct=bool(direct), end=_ends(end, src, "load"), **promise)
    elif isinstance(src, ST):
        if end is not None or _inside(inside):
            raise error(f"{'end=' if end is not None else 'inside='} applies to a window of "
                        "a global tensor, not of a shared tile")
        if not isinstance(dst, RT):
            raise error("shared tiles load into register tiles (pk.rt) or vectors (pk.rv)")
        _check_subtile(_window_shape(dst), src.type.shape, coord, "load")
        tr.emit("load", dst.v, (src.v,) + _coords(coord, 2, "load"), fill=float(fill))
    else:
        raise error(f"load source must be a global tensor parameter or a shared tile, "
                    f"got {type(src).__name__}{_peers_hint(src)}")
    return dst


def store(dst, src: Tile, coord=None, end=None, inside: bool = False) -> None:
    """Store tile `src` into `dst` (global tensor or shared tile) at element `coord`;
    elements outside a global tensor (or past `end`, an exclusive bound per tensor dim,
    None for its size) are not written. inside=True: a register window promised inside
    the tensor (as pk.load's)."""
    if not isinstance(src, Tile):
        raise error(f"store source must be a tile, got {type(src).__name__}")
    tr = current()
    if isinstance(dst, (GL, ST)):
        _same_packing(src, dst, "store")
    if isinstance(dst, GL):
        _check_window(src.type, dst.type, "store")
        if isinstance(src, ST) and src.dtype != dst.dtype:
            raise error(f"shared->global store cannot convert {src.dtype} to {dst.dtype}")
        promise = _inside(inside)
        if promise and not isinstance(src, RT):
            raise error("inside=True promises a register window inside the tensor; drop it "
                        "for stores of shared tiles")
        tr.emit("store", dst.v, (src.v,) + _coords(coord, dst.rank, "store"),
                end=_ends(end, dst, "store"), **promise)
    elif isinstance(dst, ST):
        if end is not None or _inside(inside):
            raise error(f"{'end=' if end is not None else 'inside='} applies to a window of "
                        "a global tensor, not of a shared tile")
        if not isinstance(src, RT) or isinstance(src, RV):
            raise error("only register tiles store into shared tiles")
        _check_subtile(src.type.shape, dst.type.shape, coord, "store")
        tr.emit("store", dst.v, (src.v,) + _coords(coord, 2, "store"))
    else:
        raise error(f"store destination must be a global tensor or a shared tile, "
                    f"got {type(dst).__name__}{_peers_hint(dst)}")


def _peers_hint(v) -> str:
    """How to get a tensor out of a pk.peers parameter, when `v` is one."""
    from .values import PeerTensors
    if isinstance(v, PeerTensors):
        return (f" ({v.name} holds one tensor per rank: pick one with {v.name}.local or "
                f"{v.name}.peer(r))")
    return ""


def atomic_add(dst, src: Tile, coord=None, end=None) -> None:
    """dst[window] += src, element by element atomically (f32 tensors): how workgroups that
    each hold part of a sum add it into one tensor (e.g. attention's dQ over key blocks).
    Elements outside the tensor (or past `end=`) are not touched. The order of the additions
    between workgroups is not fixed, so the result can differ in its last bits run to run."""
    if not isinstance(dst, GL) or not isinstance(src, RT) or isinstance(src, RV):
        raise error("pk.atomic_add adds a register tile (pk.rt) into a global tensor")
    if dst.dtype != T.f32:
        raise error(f"pk.atomic_add adds into f32 tensors, not {dst.dtype}")
    _check_window(src.type, dst.type, "atomic_add")
    current().emit("atomic_add", dst.v, (src.v,) + _coords(coord, dst.rank, "atomic_add"),
                   end=_ends(end, dst, "atomic_add"))


def discard(dst, window, coord=None, end=None) -> None:
    """The tensor window that `window` (a register tile, vector or tile type) covers at
    `coord` holds data nothing will read again (a scratch partial sum, once added up): its
    contents become undefined, and a cache may drop them unwritten. On Hopper every
    128-byte line wholly inside the window (and the tensor, and before `end`) leaves L2
    without its write-back to memory (discard.global.L2); other targets emit nothing. The
    emulator poisons the window (NaN; an integer's largest value), so a read after the
    discard shows. Reads of the window by this wave are ordered before it; reads by other
    waves or workgroups must be ordered by a barrier or flag first."""
    like = _dst_of(window)
    if not isinstance(dst, GL):
        raise error(f"pk.discard drops a window of a global tensor, not of "
                    f"{type(dst).__name__}{_peers_hint(dst)}")
    if not isinstance(like, RT):
        raise error("pk.discard takes the window's shape from a register tile or vector "
                    "(or its type), as pk.load places one")
    _check_window(like.type, dst.type, "discard")
    current().emit("discard", dst.v, (like.v,) + _coords(coord, dst.rank, "discard"),
                   end=_ends(end, dst, "discard"))


def _window_shape(t: RT) -> tuple[int, int]:
    """The 2-D window a register tile covers in a shared tile: a vector's along its axis (a
    column vector: one row of `length` columns)."""
    if isinstance(t, RV):
        return (t.type.length, 1) if t.type.axis == "row" else (1, t.type.length)
    return t.type.shape


def _check_subtile(tshape, sshape, coord, what):
    if tshape[0] > sshape[0] or tshape[1] > sshape[1]:
        raise error(f"{what}: register tile {tshape} does not fit in shared tile {sshape}")
    if isinstance(coord, (tuple, list)) and all(isinstance(c, int) for c in coord):
        if any(c < 0 or c + t > s for c, t, s in zip(coord, tshape, sshape)):
            raise error(f"{what}: sub-tile at {tuple(coord)} of size {tshape} falls outside "
                        f"the shared tile {sshape}")


def subtile(t: RT, origin, shape) -> RT:
    """A copy of the static window t[r0:r0+R, c0:c0+C] as a tile of its own: a register-only
    slot selection, valid when the window's elements sit in the same lanes as a fresh
    (R, C) tile would hold them (e.g. column blocks of a row that are multiples of a wave's
    sweep, or whole matrix-instruction tiles of a role tile, which keeps its role). How a
    kernel keeps a whole row in registers and works on it in pieces."""
    _need_reg(t, "subtile")
    if isinstance(t, RV):
        raise error("subtile takes a 2-D register tile")
    if not (isinstance(origin, (tuple, list)) and len(origin) == 2 and
            all(isinstance(o, int) for o in origin)):
        raise error("subtile origin must be two Python ints (a static window)")
    st_ = t.type
    sub_t = rt(shape, st_.dtype, st_.layout, role=st_.role, mma=st_.mma, scaled=st_.scaled,
               krun=st_.krun)
    if any(o < 0 or o + n > m for o, n, m in zip(origin, sub_t.shape, st_.shape)):
        raise error(f"subtile {sub_t.shape} at {tuple(origin)} falls outside the tile "
                    f"{st_.shape}")
    dst = empty(sub_t)
    current().emit("subtile", dst.v, (t.v,), origin=tuple(origin))
    return dst


def xor_cols(t: RT, mask: int) -> RT:
    """A new tile whose element (r, c) is t's (r, c ^ mask): columns exchanged in groups of
    2 * mask (mask=1 swaps each even column with the odd one after it, as GPT-J's rotary
    embedding pairs them). Register slots only, so each exchanged pair must sit in one lane,
    which the compiler checks: in a "row" tile a lane holds runs of 8 consecutive columns
    (fewer when the tile has fewer than 8 elements per lane), and masks inside a run
    qualify."""
    _need_reg(t, "xor_cols")
    if isinstance(t, RV):
        raise error("xor_cols takes a 2-D register tile")
    if not (isinstance(mask, int) and _pow2(mask) and mask < t.shape[1]):
        raise error(f"xor_cols mask {mask!r} must be a power of two below the tile's "
                    f"{t.shape[1]} columns")
    dst = _result_like(t)
    current().emit("xor_cols", dst.v, (t.v,), mask=mask)
    return dst


def convert(dst, src: RT) -> RT:
    """dst <- src held in another register layout (and element type): e.g. an accumulator
    (P = softmax(S)) becoming the A operand of the next mma. Only register slots are picked,
    so every element must already sit in the lane that holds it in `dst`'s layout, which the
    compiler checks: on Hopper an accumulator converts to an `a` tile as it is; on CDNA an
    accumulator converts to operands made with krun=4 (see pk.rt), or to the operand of the
    transposed product (compute S^T = K Q^T). `dst` is a tile or a tile type."""
    _need_reg(src, "convert")
    dst = _dst_of(dst)
    _need_reg(dst, "convert")
    ts, td = src.type, dst.type
    if isinstance(ts, T.RegVecType) != isinstance(td, T.RegVecType):
        raise error("pk.convert turns a tile into a tile and a vector into a vector")
    if tuple(src.shape) != tuple(dst.shape) or getattr(ts, "axis", None) != getattr(td, "axis", None):
        raise error(f"pk.convert keeps the shape: {ts} -> {td}; use pk.transpose to swap "
                    "rows and columns")
    current().emit("convert", dst.v, (src.v,))
    return dst


def relabel(dst, src: RT) -> RT:
    """dst <- src's registers as they are, read in dst's layout: slot s of lane l of the
    result is slot s of lane l of `src`, whatever elements the two layouts say they hold.
    Nothing moves; what changes is the (row, col) each register stands for. It moves a tile
    through memory in the order its lanes hold it: an accumulator relabelled as a generic
    tile is stored in 16-byte runs a lane (where its own layout's pairs meet in shared-memory
    banks), and whoever reads the buffer back relabels it with the same two layouts. Same
    element type and element count on both sides, and the same slots per lane on the target
    (the compiler checks). `dst` is a tile type or a tile to write."""
    _need_reg(src, "relabel")
    dst = _dst_of(dst)
    _need_reg(dst, "relabel")
    if isinstance(src, RV) or isinstance(dst, RV):
        raise error("pk.relabel reads a tile's registers as another tile; vectors follow "
                    "their tile (pk.rv)")
    if src.dtype != dst.dtype:
        raise error(f"pk.relabel keeps the element type: {src.type} -> {dst.type}; "
                    "pk.cast first")
    if math.prod(src.shape) != math.prod(dst.shape):
        raise error(f"pk.relabel keeps the number of elements: {src.type} holds "
                    f"{math.prod(src.shape)}, {dst.type} {math.prod(dst.shape)}")
    current().emit("convert", dst.v, (src.v,), relabel=True)
    return dst


def transpose(t: RT) -> RT:
    """The tile's transpose as a view of the same registers: the element (r, c) of the result
    is t's (c, r); a 'row' layout becomes 'col' and the other way round (an accumulator too),
    a row vector of t becomes a column vector of the transpose. No data moves, so storing
    pk.transpose(acc) writes a product computed transposed (O^T) the right way round."""
    _need_reg(t, "transpose")
    flip = {"row": "col", "col": "row"}
    if isinstance(t, RV):
        v = t.type
        of = v.of
        new = T.RegVecType(v.dtype, dataclasses.replace(of, shape=of.shape[::-1],
                                                        layout=flip[of.layout], pin=None),
                           flip[v.axis])
    else:
        if t.type.role in ("a_scale", "b_scale"):
            raise error("block-scale tiles have one layout; transpose their operands instead")
        _need_values(t.dtype, "transpose")         # a pair would straddle the new rows
        new = dataclasses.replace(t.type, shape=t.shape[::-1], layout=flip[t.type.layout],
                                  pin=None)
    dst = empty(new)
    current().emit("convert", dst.v, (t.v,), transpose=True)
    return dst


def _index(t, dim, start):
    tt = t.type if isinstance(t, RT) else t
    if not isinstance(tt, T.RegTileType) or tt.role in ("a", "b", "a_scale", "b_scale"):
        raise error("index tiles take the layout of a plain or accumulator register tile "
                    "(operand layouts depend on the element type: convert afterwards)")
    dst = empty(dataclasses.replace(tt, dtype=T.i32, pin=None))
    current().emit("index", dst.v, (as_index(start, "an index tile's start").v,), dim=dim)
    return dst


def any_(cond: RT) -> Scalar:
    """Whether any element of the boolean tile or vector `cond` is true, in any lane of the
    wave: a wave-uniform condition for pk.if_ (a vote across lanes), e.g. to skip work no
    row of the wave needs."""
    _need_reg(cond, "any")
    if cond.dtype != T.boolean:
        raise error(f"pk.any takes a boolean tile or vector (a comparison), got {cond.type}")
    out = new_value(T.ScalarType(T.boolean))
    current().emit("any", out, (cond.v,))
    return Scalar(out)


def row_index(t, start=0) -> RT:
    """An i32 tile in the layout of tile (or tile type) `t` whose element (r, c) is
    start + r: its row in the whole problem, for masks (`pk.where(cols <= rows, s, -inf)`)."""
    return _index(t, 0, start)


def col_index(t, start=0) -> RT:
    """An i32 tile in the layout of `t` whose element (r, c) is start + c (see row_index)."""
    return _index(t, 1, start)


def select(cond: RT, a, b, out=None) -> RT:
    """Elementwise cond ? a : b for a boolean tile `cond` (from tile comparisons) and tiles or
    scalars a, b of its layout; pk.where(cond, a, b) calls this for tiles."""
    _need_reg(cond, "where")
    if cond.dtype != T.boolean:
        raise error(f"pk.where needs a boolean tile (a comparison of tiles), got {cond.type}")
    tiles = [x for x in (a, b) if isinstance(x, Tile)]
    if not tiles:
        raise error("pk.where on a boolean tile needs a tile among its two values")
    like = tiles[0]
    _need_reg(like, "where")
    for x in tiles:
        _same_shape(like, x, "where")
        if x.dtype != like.dtype:
            raise error(f"where: {like.dtype} with {x.dtype}; cast one with pk.cast")
    if isinstance(like, RV) != isinstance(cond, RV) or (
            _lay(dataclasses.replace(cond.type, dtype=like.dtype)) != _lay(like.type)
            if not isinstance(like, RV) else cond.shape != like.shape):
        raise error(f"where: condition {cond.type} and values {like.type} differ in shape "
                    "or layout")
    vals = [x.v if isinstance(x, Tile) else as_scalar(x, like.dtype).v for x in (a, b)]
    dst = _result_like(like, out)
    current().emit("select", dst.v, (cond.v, *vals))
    return dst


# ---- math ---------------------------------------------------------------------------------

_UNARY = ("exp2", "log2", "rsqrt", "abs", "neg", "sqrt", "recip")


def _result_like(a: RT, dst=None, dtype=None) -> RT:
    if dst is not None:
        return dst
    t = a.type
    if dtype is not None:
        t = T.RegVecType(dtype, t.of, t.axis) if isinstance(t, T.RegVecType) else \
            dataclasses.replace(t, dtype=dtype, pin=None)
    elif t.__class__ is T.RegTileType and t.pin is not None:
        t = dataclasses.replace(t, pin=None)
    return empty(t)


def _unary(op, a, out=None):
    _need_reg(a, op)
    _need_values(a.dtype, op)
    if not a.dtype.is_float:
        raise error(f"{op} needs a float tile, got {a.dtype}")
    dst = _result_like(a, out)
    _same_shape(dst, a, op)
    current().emit("unary", dst.v, (a.v,), op=op)
    return dst


def exp2(a, out=None): return _unary("exp2", a, out)
def log2(a, out=None): return _unary("log2", a, out)
def rsqrt(a, out=None): return _unary("rsqrt", a, out)
def sqrt(a, out=None): return _unary("sqrt", a, out)
def abs(a, out=None): return _unary("abs", a, out)  # noqa: A001


def _same_shape(x: RT, y: RT, what):
    tx, ty = x.type, y.type
    if type(tx) is not type(ty):
        raise error(f"{what}: cannot combine {tx} with {ty}")
    if isinstance(tx, T.RegVecType):
        # vectors of different tiles combine when their lanes agree (checked on lowering)
        if (tx.length, tx.axis) != (ty.length, ty.axis):
            raise error(f"{what}: vectors {tx} and {ty} differ in length or axis")
    elif _lay(tx) != _lay(ty):
        raise error(f"{what}: tiles {tx} and {ty} differ in shape, layout or role; "
                    "change one's layout with pk.convert (or pk.transpose)")


def _lay(t: T.RegTileType):
    return (t.shape, t.layout, t.role, t.mma, t.scaled, t.krun)


_CMP = ("lt", "le", "gt", "ge")


def _binary(op, a: RT, b, dst=None, reverse=False):
    """a <op> b where b is a tile of the same shape, a vector broadcast along its axis, or a
    scalar. The result has a's type (a boolean tile of a's layout for comparisons). A vector
    broadcasts over any tile whose rows (columns) sit in the lanes of the tile it came from:
    the lowering checks this for the target."""
    _need_reg(a, op)
    _need_values(a.dtype, op)
    if isinstance(b, RV) and not isinstance(a, RV):
        dim = 0 if b.type.axis == "row" else 1
        if b.type.length != a.shape[dim]:
            raise error(f"{op}: a {b.type.axis} vector of length {b.type.length} cannot "
                        f"broadcast over the {b.type.axis}s of tile {a.type}")
        if b.dtype != a.dtype:
            raise error(f"{op}: {a.dtype} tile with {b.dtype} vector; cast one with pk.cast")
        bcast, bv = b.type.axis, b.v
    elif isinstance(b, RT):
        _same_shape(a, b, op)
        if b.dtype != a.dtype:
            raise error(f"{op}: {a.dtype} with {b.dtype}; cast one with pk.cast")
        bcast, bv = "tile", b.v
    elif isinstance(b, Tile):
        raise error(f"{op}: shared tiles are not operands of math; load them into registers")
    else:
        bcast, bv = "scalar", as_scalar(b, a.dtype).v
    if op in _CMP:
        if a.type.__class__ is T.RegTileType and a.type.role in ("a", "b"):
            raise error(f"{op}: compare plain or accumulator tiles (operand layouts depend on "
                        "the element type)")
        out = _result_like(a, dst, dtype=T.boolean)
    else:
        if op in ("and", "or") and a.dtype != T.boolean:
            raise error(f"&, | combine boolean tiles (comparisons), not {a.dtype}")
        out = _result_like(a, dst)
    current().emit("binary", out.v, (a.v, bv), op=op, bcast=bcast, reverse=reverse)
    return out


def fma(a: RT, b, c, out=None) -> RT:
    """a * b + c rounded once (a fused multiply-add): a is a float tile; b and c are tiles of
    its layout, vectors broadcast along their axis, or scalars. How a kernel asks for the
    hardware's FFMA / v_fma where a product feeds a sum, e.g. exp2(fma(s, scale, -max))."""
    _need_reg(a, "fma")
    _need_values(a.dtype, "fma")
    if not a.dtype.is_float:
        raise error(f"fma needs a float tile, got {a.dtype}")
    ops_ = []
    for x in (b, c):
        if isinstance(x, RV) and not isinstance(a, RV):
            dim = 0 if x.type.axis == "row" else 1
            if x.type.length != a.shape[dim] or x.dtype != a.dtype:
                raise error(f"fma: {x.type} does not broadcast over tile {a.type}")
            ops_.append((x.type.axis, x.v))
        elif isinstance(x, RT):
            _same_shape(a, x, "fma")
            if x.dtype != a.dtype:
                raise error(f"fma: {a.dtype} with {x.dtype}; cast one with pk.cast")
            ops_.append(("tile", x.v))
        elif isinstance(x, Tile):
            raise error("fma: shared tiles are not operands of math; load them into registers")
        else:
            ops_.append(("scalar", as_scalar(x, a.dtype).v))
    dst = _result_like(a, out)
    current().emit("fma", dst.v, (a.v, ops_[0][1], ops_[1][1]),
                   bcast=(ops_[0][0], ops_[1][0]))
    return dst


def add(a, b, out=None): return _binary("add", a, b, out)
def sub(a, b, out=None): return _binary("sub", a, b, out)
def mul(a, b, out=None): return _binary("mul", a, b, out)
def div(a, b, out=None): return _binary("div", a, b, out)
def max(a, b, out=None): return _binary("max", a, b, out)  # noqa: A001
def min(a, b, out=None): return _binary("min", a, b, out)  # noqa: A001


def copy(dst: RT, src) -> RT:
    """dst <- src, converting the element type (and broadcasting a scalar)."""
    _need_reg(dst, "copy")
    if isinstance(src, RT):
        _same_shape(dst, src, "copy")
        _same_packing(src, dst, "copy")
        current().emit("copy", dst.v, (src.v,))
    else:
        fill(dst, src)
    return dst


def cast(a: RT, dtype) -> RT:
    """A new tile with a's values converted to `dtype` (round to nearest even; fp8 and int8
    saturate to their largest finite value)."""
    _need_reg(a, "cast")
    _need_values(a.dtype, "cast")
    _need_values(T.dtype_of(dtype), "cast")
    out = _result_like(a, dtype=T.dtype_of(dtype))
    current().emit("copy", out.v, (a.v,))
    return out


def mask_outside(t: RT, origin, extent, value: float = 0.0, out=None) -> RT:
    """Replace elements whose global position `origin + (row, col)` lies outside
    [0, extent[0]) x [0, extent[1]) by `value`: how ragged edges are neutralised before a
    reduction."""
    _need_reg(t, "mask_outside")
    if isinstance(t, RV):
        raise error("mask_outside works on 2-D register tiles")
    o, e = _coords(origin, 2, "mask_outside origin"), _coords(extent, 2, "mask_outside extent")
    dst = _result_like(t, out)
    current().emit("mask", dst.v, (t.v,) + o + e, value=float(value))
    return dst


# ---- reductions ---------------------------------------------------------------------------

def _reduce(op, axis, t: RT, into=None):
    _need_reg(t, f"{axis}_{op}")
    _need_values(t.dtype, f"{axis}_{op}")
    if isinstance(t, RV):
        raise error("reductions take a 2-D register tile")
    if into is None:
        dst, acc = empty(rv(t.type, axis)), False
    else:
        dim = 0 if axis == "row" else 1
        if not isinstance(into, RV) or into.type.axis != axis or \
                into.type.length != t.shape[dim]:
            raise error(f"into= must be a {axis} vector of length {t.shape[dim]} (made for a "
                        f"tile whose {axis}s sit in the lanes of {t.type}'s)")
        dst, acc = into, True
    if dst.dtype != t.dtype:
        raise error(f"{axis}_{op}: vector is {dst.dtype} but tile is {t.dtype}")
    current().emit("reduce", dst.v, (t.v,), op=op, axis=axis, accumulate=acc)
    return dst


def row_max(t, into=None):
    """Max of each row (a 'row' vector). With into=v, v <- max(v, row max)."""
    return _reduce("max", "row", t, into)


def row_sum(t, into=None):
    return _reduce("add", "row", t, into)


def col_max(t, into=None):
    return _reduce("max", "col", t, into)


def col_sum(t, into=None):
    return _reduce("add", "col", t, into)


def _workgroup_reduce(op, v):
    if not isinstance(v, RV):
        raise error(f"workgroup_{'sum' if op == 'add' else op}: takes a register vector "
                    f"(e.g. from pk.row_sum), got {type(v).__name__}")
    dst = empty(v.type)
    current().emit("wg_reduce", dst.v, (v.v,), op=op)
    return dst


def workgroup_sum(v):
    """The sum of vector `v` over all waves of the workgroup, returned to every wave (the
    same bits in each: waves are added in wave order). Combines the per-wave partial
    reductions of a row split across waves. It synchronises the workgroup through shared
    memory, so every wave must call it, like pk.barrier()."""
    return _workgroup_reduce("add", v)


def workgroup_max(v):
    """The elementwise max of vector `v` over all waves of the workgroup (see
    workgroup_sum)."""
    return _workgroup_reduce("max", v)


def cluster_sum(v):
    """The sum of vector `v` over the workgroups of the cluster (pk.cluster): each wave gets
    its own `v` plus the `v` of the wave with its index in every other workgroup of the
    cluster, added in rank order (the same bits in each). Per-workgroup partial sums
    become one per cluster, read from each other's shared memory. It meets the cluster's
    barrier twice, so every wave of every workgroup must call it, like pk.cluster_sync();
    outside clusters it returns `v`."""
    if not isinstance(v, RV):
        raise error(f"cluster_sum: takes a register vector (e.g. from pk.col_sum), got "
                    f"{type(v).__name__}")
    dst = empty(v.type)
    current().emit("cluster_reduce", dst.v, (v.v,), op="add")
    return dst


# ---- matrix multiply ----------------------------------------------------------------------

def _mma(trans, d: RT, a: RT, b: RT, c: RT | None, scale_a=None, scale_b=None,
         in_flight=0):
    if isinstance(b, ST):
        return _mma_shared_b(trans, d, a, b, c, in_flight)
    if in_flight:
        raise error("in_flight= applies to the warpgroup MMA (b a shared tile, Hopper)")
    for x, nm in ((d, "d"), (a, "a"), (b, "b")):
        if not isinstance(x, RT) or isinstance(x, RV):
            raise error(f"mma operand {nm} must be a register tile")
    am, ak = a.shape if trans[0] == "N" else a.shape[::-1]
    bk, bn = b.shape if trans[1] == "N" else b.shape[::-1]
    if ak != bk or d.shape != (am, bn):
        raise error(f"mma_{_TNAME[trans]}: shapes d{d.shape} a{a.shape} b{b.shape} do not "
                    f"form (M x K) @ (K x N) -> (M x N)")
    if a.dtype != b.dtype:
        raise error(f"mma: a is {a.dtype} but b is {b.dtype}")
    if d.dtype != T.f32:
        raise error(f"mma accumulates in f32; make d an f32 tile, not {d.dtype}")
    want = {"a": "row" if trans[0] == "N" else "col", "b": "col" if trans[1] == "N" else "row"}
    name = f"mma_{_TNAME[trans]}"
    if d.type.role != "acc" or d.type.layout != "row":
        raise error(f"{name}: d must be an accumulator tile in the row layout: "
                    "pk.rt(..., role='acc') (pk.transpose views it the other way afterwards)")
    if a.type.krun != b.type.krun:
        raise error(f"{name}: a (krun={a.type.krun}) and b (krun={b.type.krun}) must hold K "
                    "in the same order: give both the same krun=")
    for x, role in ((a, "a"), (b, "b")):
        if x.type.role != role or x.type.layout != want[role]:
            raise error(f"{name}: operand {role} must be pk.rt({x.shape}, {x.dtype}, "
                        f"role={role!r}, layout={want[role]!r}); got {x.type}")
    if len({d.type.mma, a.type.mma, b.type.mma} - {None}) > 1:
        raise error(f"{name}: d, a and b use different matrix-instruction sizes "
                    f"({d.type.mma}, {a.type.mma}, {b.type.mma}); give them the same mma=")
    c, zero = _addend(d, c)
    scales = _check_scales(name, a, b, scale_a, scale_b, am, ak, bn)
    current().emit("mma", d.v, (a.v, b.v, c.v) + scales, trans=trans, zero=zero)
    return d


def _addend(d, c):
    """(c tile, zero): c defaults to d (accumulate); c=0 starts d from zero without reading
    it (the matrix unit's own zero: MFMA's C = 0, wgmma's scale-d = 0)."""
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        if c != 0:
            raise error("mma c= is a tile, or 0 to start from zero")
        return d, True
    c = d if c is None else c
    _same_shape(d, c, "mma accumulator")
    return c, False


WGMMA_DTYPES = ("bf16", "f16", "e4m3", "e5m2")    # wgmma operand types (fp8: k32, K-major)


def _check_in_flight(n):
    if not isinstance(n, int) or not 0 <= n <= 7:
        raise error("in_flight must be an int in 0..7 (wgmma groups left running)")


def _mma_shared_b(trans, d: RT, a, b: ST, c, in_flight=0):
    """d <- a @ b + c (mma_AB, b stored K x N), a @ b.T + c (mma_ABt, b stored N x K) or
    a.T @ b + c (mma_AtB, a stored K x 64 in shared memory, b stored K x N) with b read
    straight from shared memory: Hopper's warpgroup wgmma. `a` is this wave's (16, K)
    register tile (role 'a'), or a shared tile holding the warpgroup's 64 rows: (64, K)
    K-major, or (K, 64) MN-major for mma_AtB (16-bit types), 128-byte rows, swizzle=8; each
    wave gets its 16 rows of d."""
    if trans not in ("NN", "NT", "TN"):
        raise error("mma with b in shared memory is mma_AB (b stored K x N), mma_ABt "
                    "(b stored N x K) or mma_AtB (a shared K x 64, b stored K x N)")
    name = f"mma_{_TNAME[trans]}"
    if not isinstance(d, RT) or d.type.role != "acc" or d.dtype != T.f32:
        raise error(f"{name}: d must be an f32 accumulator tile: pk.rt(..., pk.f32, role='acc')")
    if trans == "TN" and not isinstance(a, ST):
        raise error("mma_AtB with b in shared memory reads a from shared memory too: a "
                    "(K, 64) shared tile holding the warpgroup's 64 columns of a")
    if isinstance(a, ST):
        rows, k = a.shape if trans[0] == "N" else a.shape[::-1]
        if rows != 64:
            raise error(f"{name}: a shared a holds the warpgroup's 64 rows: "
                        f"{'(64, K)' if trans[0] == 'N' else '(K, 64)'}, got {a.shape}")
        m = 16
    elif isinstance(a, RT) and a.type.role == "a" and a.type.layout == "row":
        m, k = a.shape
    else:
        raise error(f"{name} with shared b: a must be pk.rt((16, K), dtype, role='a') or a "
                    "shared (64, K) tile")
    bk, n = b.shape if trans[1] == "N" else b.shape[::-1]
    if bk != k or d.shape != (m, n):
        raise error(f"{name}: shapes d{d.shape} a{a.shape} b{b.shape} do not form "
                    "(M x K) @ (K x N) -> (M x N), M = 16 rows per wave")
    if a.dtype != b.dtype and not (a.dtype.is_fp8 and b.dtype.is_fp8):
        raise error(f"mma: a is {a.dtype} but b is {b.dtype}")
    if b.dtype.name not in WGMMA_DTYPES:
        raise error(f"{name}: wgmma multiplies {', '.join(WGMMA_DTYPES)}, not {b.dtype}")
    c, zero = _addend(d, c)
    _check_in_flight(in_flight)
    if in_flight and c is not d:
        raise error("an mma left in flight accumulates into d: drop c= (or give c=0)")
    current().emit("mma", d.v, (a.v, b.v, c.v), trans=trans, in_flight=in_flight, zero=zero)
    return d


def mma_wait(*accs, in_flight: int = 0) -> None:
    """Hopper: wait until at most `in_flight` of this warpgroup's wgmma groups are still
    running. `accs` are the accumulator tiles those groups write: they may be read (or
    stored) only after the wait that retires their last group. See mma_AB's in_flight=."""
    if not accs or not all(isinstance(a, RT) and a.type.role == "acc" for a in accs):
        raise error("pk.mma_wait takes the accumulator tiles its groups write")
    _check_in_flight(in_flight)
    current().emit("mma_wait", None, tuple(a.v for a in accs), in_flight=in_flight)


def _check_scales(name, a, b, scale_a, scale_b, m, k, n):
    """Block-scaled mma: both operands scaled=True and E8M0 scale tiles of the right shape."""
    if scale_a is None and scale_b is None:
        if a.type.scaled or b.type.scaled:
            raise error(f"{name}: scaled operand tiles need scale_a= and scale_b=")
        return ()
    if scale_a is None or scale_b is None:
        raise error(f"{name}: give both scale_a= and scale_b= (E8M0 tiles)")
    if not (a.type.scaled and b.type.scaled):
        raise error(f"{name} with scales needs operand tiles made with scaled=True")
    k = int(k * a.dtype.packed)               # K in values (FP4: two a column, FP6: 4 in 3)
    for t, role, shape in ((scale_a, "a_scale", (m, k // 32)), (scale_b, "b_scale", (k // 32, n))):
        if not isinstance(t, RT) or t.type.role != role or tuple(t.shape) != shape:
            raise error(f"{name}: {role.replace('_', ' ')}s must be pk.rt({shape}, pk.e8m0, "
                        f"role={role!r}) (one E8M0 scale per 32 K-elements)")
    return (scale_a.v, scale_b.v)


_TNAME = {"NN": "AB", "NT": "ABt", "TN": "AtB"}


def mma_AB(d, a, b, c=None, *, scale_a=None, scale_b=None, in_flight=0):
    """d <- a @ b + c (c defaults to d; c=0 starts from zero, d's old contents unread). With scale_a/scale_b (E8M0 per 32 K-elements, the
    MX formats' block scales): d <- (a * 2^(sa-127)) @ (b * 2^(sb-127)) + c.
    `b` may be a shared tile (K x N, 128-byte rows, swizzle=8) on Hopper: warpgroup wgmma
    with a from registers, each wave contributing its own 16 rows. By default the call
    returns when the product is done; in_flight=n returns once at most n of the
    warpgroup's wgmma groups (this one included) are still running, so the tensor cores
    keep working while the waves go on: d and the shared tiles this group reads stay
    busy until a later mma or pk.mma_wait retires it."""
    return _mma("NN", d, a, b, c, scale_a, scale_b, in_flight)


def mma_ABt(d, a, b, c=None, *, scale_a=None, scale_b=None, in_flight=0):
    """d <- a @ b.T + c: b is stored N x K (as in attention's Q @ K^T, a linear layer's
    weight). `b` may be a shared tile (N x K, N a multiple of 16 up to 256, 128-byte rows,
    swizzle=8) on Hopper: warpgroup wgmma (bf16/f16 k16, fp8 k32), with `a` from this
    wave's registers or a shared (64, K) tile of the warpgroup's rows (in_flight= as in
    mma_AB)."""
    return _mma("NT", d, a, b, c, scale_a, scale_b, in_flight)


def mma_AtB(d, a, b, c=None, *, scale_a=None, scale_b=None, in_flight=0):
    """d <- a.T @ b + c: a is stored K x M. On Hopper `a` and `b` may both be shared tiles
    (a K x 64 holding the warpgroup's 64 columns, b K x N; 16-bit types, 128-byte rows,
    swizzle=8): warpgroup wgmma reading both MN-major (in_flight= as in mma_AB)."""
    return _mma("TN", d, a, b, c, scale_a, scale_b, in_flight)


# ---- control flow -------------------------------------------------------------------------

def range(start, stop=None, step=1):  # noqa: A001
    """A real loop in the IR (not unrolled): the body is traced once with a symbolic index.
    Tiles written in the body are loop-carried; scalars are not (derive them from the
    index)."""
    if stop is None:
        start, stop = 0, start
    if isinstance(step, (float, np.floating)) and float(step).is_integer():
        step = int(step)
    if not isinstance(step, (int, np.integer)) or isinstance(step, (bool, np.bool_)) \
            or step == 0:
        raise error(f"pk.range step must be a non-zero Python int, not {step!r}")
    tr = current()
    idx = new_value(T.ScalarType(T.i32), "i")
    body = Block()
    tr.emit("for", idx, (as_index(start, "a pk.range bound").v,
                         as_index(stop, "a pk.range bound").v),
            regions=[body], step=int(step))
    caller = sys._getframe(1)                 # the kernel body that runs `for ... in pk.range`
    before = {n: (v.v if isinstance(v, (Tile, Scalar)) else v)
              for n, v in caller.f_locals.items() if _carriable(v)}
    tr.blocks.append(body)
    try:
        yield Scalar(idx)
    finally:
        tr.blocks.pop()
    _check_carried(body, before, caller.f_locals, _loop_targets(caller.f_code))


_LOOP_TARGETS: dict = {}


def _loop_targets(code) -> frozenset:
    """Names a `for` statement of `code` binds (e.g. the variable of a pk.static_range loop
    inside a pk.range body): a Python number those change is expected to change."""
    got = _LOOP_TARGETS.get(code)
    if got is None:
        import dis
        names, ins = set(), list(dis.get_instructions(code))
        for i, x in enumerate(ins):
            if x.opname != "FOR_ITER":
                continue
            j, want = i + 1, 1
            while j < len(ins) and want:
                y = ins[j]
                if y.opname.startswith("UNPACK_"):
                    want += (y.argval if isinstance(y.argval, int) else 1) - 1
                elif y.opname.startswith("STORE_"):
                    names.add(y.argval)
                    want -= 1
                elif y.opname not in ("NOP", "EXTENDED_ARG", "CACHE"):
                    break
                j += 1
        got = _LOOP_TARGETS[code] = frozenset(n for n in names if isinstance(n, str))
    return got


def _carriable(v) -> bool:
    return isinstance(v, (Tile, Scalar)) or (isinstance(v, (int, float, np.integer, np.floating))
                                            and not isinstance(v, (bool, np.bool_)))


def _check_carried(body: Block, before: dict, after: dict,
                   loop_targets: frozenset = frozenset()) -> None:
    """The body is traced once: a name that read a tile or scalar from before the loop and
    was then rebound to a value made in the loop (`acc = acc + t`, `off = off + 64`) does
    not carry anything from one iteration to the next, and a Python number the body
    changes (`k0 += 64`) changed once, at trace time. Say so rather than compute the first
    or last iteration only."""
    from ..ir.nodes import walk
    used, made, allocated = set(), set(), set()
    for op in walk(body):
        used.update(id(s) for s in op.srcs)
        if op.dst is not None:
            made.add(id(op.dst))
        if op.kind == "alloc":
            allocated.add(id(op.dst))
    for name, old in before.items():
        new = after.get(name)
        if isinstance(new, Tile) and new.v is not old and id(new.v) in allocated and \
                id(old) in used:
            raise error(f"`{name}` is read in this pk.range body and then rebound to a new "
                        f"tile, so the loop does not carry it (the body is traced once): "
                        f"update it in place (`{name} += ...`, `{name}.set(...)`, "
                        "`into=`/`out=`)")
        if isinstance(new, Scalar) and hasattr(old, "type") and new.v is not old and \
                id(new.v) in made and id(old) in used:
            raise error(f"`{name}` is rebound in this pk.range body to a value computed from "
                        f"its value before the loop, but scalars are not loop-carried (the "
                        f"body is traced once, so every iteration would see the first "
                        f"value): compute it from the loop index instead (e.g. "
                        f"`{name} = start + i * step`)")
        if not hasattr(old, "type") and not isinstance(new, (Tile, Scalar)) and \
                _carriable(new) and new != old and name not in loop_targets:
            raise error(f"`{name}` is a Python number that this pk.range body changes "
                        f"({old!r} -> {new!r}); the body is traced once, so the loop would "
                        f"use {old!r} in every iteration: compute it from the loop index "
                        f"instead (e.g. `{name} = start + i * step`)")


def static_range(*args):
    """Unrolled at trace time: bounds must be Python ints."""
    for a in args:
        if isinstance(a, Scalar):
            raise error("pk.static_range needs Python ints; use pk.range for runtime bounds")
    return builtins.range(*args)


@contextlib.contextmanager
def if_(cond):
    """`with pk.if_(cond):` — a branch on a wave-uniform condition."""
    if not isinstance(cond, Scalar) or cond.dtype != T.boolean:
        raise error("pk.if_ needs a comparison of traced scalars (e.g. pk.wave_id() == 0); "
                    "for Python values use a plain `if`")
    tr = current()
    then = Block()
    tr.emit("if", None, (cond.v,), regions=[then])
    tr.blocks.append(then)
    try:
        yield
    finally:
        tr.blocks.pop()


@contextlib.contextmanager
def else_():
    """`with pk.else_():` right after a `with pk.if_(...)` block."""
    tr = current()
    ops = tr.blocks[-1].ops
    if not ops or ops[-1].kind != "if" or len(ops[-1].regions) != 1:
        raise error("pk.else_ must directly follow a `with pk.if_(...)` block")
    blk = Block()
    ops[-1].regions.append(blk)
    tr.blocks.append(blk)
    try:
        yield
    finally:
        tr.blocks.pop()


# ---- synchronisation and scheduling -------------------------------------------------------

def barrier() -> None:
    """Workgroup barrier: every wave must reach the same barrier."""
    current().emit("barrier")


def programs_per_cu(n: int) -> None:
    """Build the kernel so that n of its workgroups fit on one CU / SM at once: the compiler
    keeps each lane's registers within that share (Hopper: ptxas' .minnctapersm; CDNA:
    amdgpu-waves-per-eu). Where the kernel needs more, it spills (the report shows it).
    For kernels whose speed comes from several resident workgroups rather than from
    registers per lane; call it once, at the top level."""
    tr = current()
    if not isinstance(n, int) or n < 1:
        raise error(f"programs_per_cu takes a positive int, not {n!r}")
    if len(tr.blocks) > 1:
        raise error("pk.programs_per_cu applies to the whole kernel: call it at the top "
                    "level, outside loops and branches")
    tr.programs_per_cu = n


CLUSTER_SIZES = (1, 2, 4)      # workgroups per cluster pykittens launches (Hopper allows 8)


def cluster(n: int) -> None:
    """Launch the workgroups in clusters of n (Hopper thread-block clusters): program_ids
    n * c .. n * c + n - 1 along axis 0 form cluster c, run at the same time on one GPC,
    and reach each other's shared memory: a TMA copy can land in all of them at once
    (pk.tma_load(multicast=True)) and a wave can arrive on another's mbarrier
    (pk.arrive(bar, cta=r)); pk.cluster_rank() tells them apart and pk.cluster_sync() is
    their barrier. The grid's first dimension must be a multiple of n. Call it once, at the
    top level."""
    tr = current()
    if n not in CLUSTER_SIZES or isinstance(n, bool):
        raise error(f"pk.cluster takes one of {CLUSTER_SIZES} workgroups, not {n!r}")
    if len(tr.blocks) > 1:
        raise error("pk.cluster applies to the whole kernel: call it at the top level, "
                    "outside loops and branches")
    tr.cluster = n


def kernel_cluster(cluster, what: str) -> int:
    """A `cluster=` argument of a pipeline piece (pk.Ring, pk.tile_walk): 1, or the
    kernel's own cluster size."""
    if cluster not in (1, current().cluster):
        raise error(f"{what}(cluster={cluster!r}) works on the kernel's clusters: "
                    f"pk.cluster({cluster}) at the kernel's top first, or cluster=1")
    return cluster


def cluster_rank() -> Scalar:
    """This workgroup's rank in its cluster (pk.cluster): program_id(0) % n."""
    if current().cluster < 2:
        raise error("pk.cluster_rank() is for kernels launched in clusters: call "
                    "pk.cluster(n) at the kernel's top first")
    return _special("cluster_rank")


def setprio(level: int) -> None:
    """Wave priority for instruction issue (CDNA `s_setprio`, 0..3)."""
    if not isinstance(level, int) or not 0 <= level <= 3:
        raise error("setprio level must be an int in 0..3")
    current().emit("setprio", level=level)


def log2_e() -> float:
    """log2(e), for exp(x) = exp2(x * log2_e()): the form the hardware computes."""
    return math.log2(math.e)
