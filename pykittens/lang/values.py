"""Proxies that stand for IR values while a kernel is traced, so kernels read like numpy."""
from __future__ import annotations

import numpy as np

from ..ir import types as T
from .trace import current, error, new_value

_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
        "max": "max", "min": "min"}
_CMP = ("lt", "le", "gt", "ge", "eq", "ne")


def _py_scalar_dtype(x) -> T.DType:
    if isinstance(x, (bool, np.bool_)):
        raise error("booleans are not kernel values; compare scalars instead")
    return T.i32 if isinstance(x, (int, np.integer)) else T.f32


def as_scalar(x, dtype: T.DType | None = None) -> "Scalar":
    """A Scalar from a Scalar or a Python number (constant), cast to dtype if given."""
    if isinstance(x, Scalar):
        return x if dtype is None or x.dtype == dtype else x.cast(dtype)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        d = dtype or _py_scalar_dtype(x)
        v = new_value(T.ScalarType(d))
        current().emit("const", v, value=(float(x) if d.is_float else int(x)))
        return Scalar(v)
    raise error(f"expected a scalar or a number, got {type(x).__name__}")


def as_index(x, what: str = "a coordinate") -> "Scalar":
    """An i32 scalar for a coordinate, index, bound or stage: integers only. A float (from
    `/`, or a float operand) is never rounded silently: that is how `pid * 3 / 2` would
    address the wrong element."""
    if isinstance(x, Scalar):
        if x.dtype.is_float:
            raise error(f"{what} must be an integer, but this traced scalar is {x.dtype} (made "
                        "by `/` or by a float operand): use `//` for integer division, or "
                        ".cast(pk.i32) to truncate on purpose")
        if x.dtype == T.boolean:
            raise error(f"{what} must be an integer, not a condition")
        return x if x.dtype == T.i32 else x.cast(T.i32)
    if isinstance(x, (float, np.floating)) and not float(x).is_integer():
        raise error(f"{what} must be an integer, got {x!r}: use `//` for integer division")
    if isinstance(x, (float, np.floating)):
        x = int(x)
    if not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_)):
        raise error(f"{what} must be an integer (a Python int or a traced integer scalar), "
                    f"not {type(x).__name__}")
    return as_scalar(x, T.i32)


class Scalar:
    """A wave-uniform scalar (program id, loop index, kernel argument, ...)."""
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    @property
    def dtype(self) -> T.DType:
        return self.v.type.dtype

    def cast(self, dtype) -> "Scalar":
        d = T.dtype_of(dtype)
        out = new_value(T.ScalarType(d))
        current().emit("scast", out, (self.v,))
        return Scalar(out)

    def _bin(self, op, other, reverse=False):
        if isinstance(other, Tile):
            return NotImplemented
        o = as_scalar(other) if not isinstance(other, Scalar) else other
        a, b = (o, self) if reverse else (self, o)
        # `/` is true division (an f32 quotient, as in Python); such a value is refused
        # where an integer is needed (as_index), so it can never round into a coordinate
        d = T.f32 if (a.dtype.is_float or b.dtype.is_float or op == "div") else T.i32
        if op in ("and", "or") and a.dtype == b.dtype == T.boolean:
            d = T.boolean              # `(c1) & (c2)` stays a condition for pk.if_
        a, b = as_scalar(a, d), as_scalar(b, d)
        if op in _CMP:
            out = new_value(T.ScalarType(T.boolean))
        else:
            out = new_value(T.ScalarType(d))
        current().emit("sbin", out, (a.v, b.v), op=op)
        return Scalar(out)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("floordiv", o)
    def __rfloordiv__(self, o): return self._bin("floordiv", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __rmod__(self, o): return self._bin("mod", o, True)
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def __neg__(self): return self._bin("sub", 0, True)

    def __eq__(self, o): return self._bin("eq", o)     # type: ignore[override]
    def __ne__(self, o): return self._bin("ne", o)     # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self):
        raise error("a traced scalar has no Python truth value: branch with "
                    "`with pk.if_(cond):`, loop with `pk.range`, or make it a pk.const")

    def __index__(self):
        raise error("a traced scalar cannot be used where Python needs an int (e.g. "
                    "range() or a shape): use pk.range, or pass a pk.const")

    def __repr__(self):
        return f"Scalar({self.v!r}: {self.dtype})"


def where(cond, a, b, out=None):
    """Select for scalars; works on traced scalars and on numpy arrays alike, so one
    function can describe e.g. a grid mapping both in a kernel and in a simulator. With a
    boolean tile (a comparison of tiles) it selects elementwise between tiles or scalars
    (into `out` if given): how index masks are applied, e.g.
    `pk.where(pk.col_index(s, k0) <= pk.row_index(s, q0), s, -math.inf)`."""
    if isinstance(cond, Tile):
        from . import ops
        return ops.select(cond, a, b, out)
    if isinstance(cond, (bool, np.bool_)):          # decided at trace time
        return a if cond else b
    if any(isinstance(x, Scalar) for x in (cond, a, b)):
        c = as_scalar(cond) if not isinstance(cond, Scalar) else cond
        d = T.f32 if any(isinstance(x, Scalar) and x.dtype.is_float or isinstance(x, float)
                         for x in (a, b)) else T.i32
        a, b = as_scalar(a, d), as_scalar(b, d)
        out = new_value(T.ScalarType(d))
        current().emit("sselect", out, (c.v, a.v, b.v))
        return Scalar(out)
    return np.where(cond, a, b)


def minimum(a, b):
    if isinstance(a, Scalar) or isinstance(b, Scalar):
        return (a if isinstance(a, Scalar) else as_scalar(a))._bin("min", b)
    return np.minimum(a, b)


def maximum(a, b):
    if isinstance(a, Scalar) or isinstance(b, Scalar):
        return (a if isinstance(a, Scalar) else as_scalar(a))._bin("max", b)
    return np.maximum(a, b)


# ---- tiles --------------------------------------------------------------------------------

class Tile:
    """Base of the tile proxies: storage that ops write in place."""
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    @property
    def type(self):
        return self.v.type

    @property
    def dtype(self) -> T.DType:
        return self.v.type.dtype

    def __bool__(self):
        raise error("a tile has no Python truth value")


class RT(Tile):
    """Per-wave register tile."""

    @property
    def shape(self):
        return self.type.shape

    def _bin(self, op, other, dst=None, reverse=False):
        from . import ops
        return ops._binary(op, self, other, dst=dst, reverse=reverse)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, reverse=True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, reverse=True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, reverse=True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, reverse=True)
    def __neg__(self): return self._bin("mul", -1.0)
    # comparisons give boolean tiles (for pk.where); == and != stay Python's identity
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def __iadd__(self, o): return self._bin("add", o, dst=self)
    def __isub__(self, o): return self._bin("sub", o, dst=self)
    def __imul__(self, o): return self._bin("mul", o, dst=self)
    def __itruediv__(self, o): return self._bin("div", o, dst=self)

    def cast(self, dtype) -> "RT":
        from . import ops
        return ops.cast(self, dtype)

    @property
    def T(self) -> "RT":
        """pk.transpose(self): the same registers viewed transposed."""
        from . import ops
        return ops.transpose(self)

    def set(self, src) -> "RT":
        """Copy `src` (a tile of the same shape, or a scalar) into this tile."""
        from . import ops
        return ops.copy(self, src)


class RV(RT):
    """Per-wave vector along the rows or the columns of a register tile."""

    @property
    def shape(self):
        return (self.type.length,)

    # `tile < vector`: Python asks the right operand first when its class derives from the
    # left one's, so a vector would compare itself against the tile. Decline, and the tile's
    # own comparison broadcasts the vector.
    def _cmp(self, op, o):
        if isinstance(o, RT) and not isinstance(o, RV):
            return NotImplemented
        return self._bin(op, o)

    def __lt__(self, o): return self._cmp("lt", o)
    def __le__(self, o): return self._cmp("le", o)
    def __gt__(self, o): return self._cmp("gt", o)
    def __ge__(self, o): return self._cmp("ge", o)


class ST(Tile):
    """Workgroup-shared tile (LDS / shared memory)."""

    @property
    def shape(self):
        return self.type.shape

    def atom(self, j: int) -> "ST":
        """Column block j of a swizzle=8 tile stored as 128-byte column blocks (rows wider
        than 128 bytes): a (rows, 128 bytes) tile of its own, e.g. one half of a (64, 128)
        bf16 tile, for an mma that takes 64 of its columns."""
        t = self.type
        if not isinstance(j, int) or not 0 <= j < t.atoms:
            raise error(f"atom({j!r}): {t} has {t.atoms} column block(s) of 128 bytes; "
                        f"j is a Python int below that")
        out = new_value(T.SharedTileType(t.dtype, (t.shape[0], 128 // t.dtype.bytes), 8))
        current().emit("atom", out, (self.v,), index=j)
        return ST(out)


class Stages:
    """`count` shared tiles or mbarriers allocated together (pk.empty(type, count=n),
    pk.mbarrier(arrivals, count=n)); `stages[i]` is stage i, for a Python int or a traced
    scalar (e.g. `k % n` in a pipeline loop), usable wherever one tile or mbarrier is."""

    def __init__(self, v, wrap):
        self.v, self._wrap = v, wrap

    @property
    def count(self) -> int:
        return self.v.type.count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)) and not 0 <= i < self.count:
            raise error(f"stage {i} of {self.count}: index out of range")
        out = new_value(self.v.type.of)
        current().emit("stage", out, (self.v, as_index(i, "a stage index").v))
        return self._wrap(out)

    def __iter__(self):
        return (self[i] for i in range(self.count))


class GL:
    """A global-memory tensor parameter. `shape[i]` is a Python int for static dims and a
    traced scalar for dims known only at launch."""

    def __init__(self, v, name, view: bool = False):
        self.v, self.name = v, name
        self.view = view            # a rank's tensor picked at run time from a pk.peers

    @property
    def type(self) -> T.GlobalType:
        return self.v.type

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def rank(self):
        return self.type.rank

    @property
    def shape(self):
        return tuple(self.dim(i) for i in range(self.rank))

    def __getitem__(self, index) -> Scalar:
        """One element as a traced scalar (uniform across the wave): `cu_seqlens[b]`, one
        index per dim; outside the tensor it reads 0."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.rank:
            raise error(f"{self.name}[...] needs {self.rank} indices (one per dim), got "
                        f"{len(index)}")
        out = new_value(T.ScalarType(self.dtype))
        current().emit("sload", out, (self.v,) + tuple(as_index(i, f"an index of {self.name}").v
                                                      for i in index))
        return Scalar(out)

    def dim(self, i: int):
        if self.type.shape[i] is not None:
            return self.type.shape[i]
        out = new_value(T.ScalarType(T.i32), f"{self.name}_d{i}")
        current().emit("dim", out, (self.v,), axis=i)
        return Scalar(out)


class PeerTensors:
    """A pk.peers parameter inside a kernel: one tensor per rank of the group. Pick one with
    `peer(r)` (a Python int or a traced scalar) or `local`; loads, stores and flags then
    take it like any pk.gl tensor. Peer memory is reached over the GPUs' links (NVLink,
    Infinity Fabric); order accesses between ranks with pk.signal / pk.wait_flag."""

    def __init__(self, name, members, rank_v):
        self.name, self.members, self._rank = name, members, rank_v

    @property
    def world(self) -> int:
        return len(self.members)

    @property
    def rank(self) -> "Scalar":
        """This rank's index in the group (the pk.Peers' rank at launch)."""
        return Scalar(self._rank)

    @property
    def type(self) -> T.GlobalType:
        return self.members[0].type

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self):
        return GL(self.members[0], self.name).shape

    def peer(self, r) -> GL:
        """Rank r's tensor. A Python int picks it at trace time; a traced scalar at run
        time (a rank outside 0..world-1 reads as rank 0's tensor in compiled code and is
        an error in the emulator)."""
        if isinstance(r, (int, np.integer)) and not isinstance(r, bool):
            if not 0 <= r < self.world:
                raise error(f"{self.name}.peer({r}): the group has ranks 0..{self.world - 1}")
            return GL(self.members[int(r)], f"{self.name}.peer({int(r)})")
        out = new_value(self.type, self.members[0].name)
        current().emit("peer", out, (*self.members, as_index(r, "a rank").v))
        return GL(out, f"{self.name}.peer(...)", view=True)

    @property
    def local(self) -> GL:
        """This rank's own tensor."""
        return self.peer(self.rank)

    def __getitem__(self, index):
        raise error(f"{self.name} holds one tensor per rank: index one of them, e.g. "
                    f"{self.name}.local[...] or {self.name}.peer(r)[...]")

    def __getattr__(self, item):
        if item in ("v", "dim"):
            raise error(f"{self.name} is a pk.peers tensor (one per rank): pick one with "
                        f"{self.name}.local or {self.name}.peer(r) first")
        raise AttributeError(item)
