"""Grid mappings: which work tile each launched workgroup computes.

A mapping is a chain of stages applied to the flat launch index `pid` (the order in which the
hardware dispatches workgroups). Every stage is written only with `+ - * // %` and
`pykittens.lang.values.where/minimum/maximum`, so one mapping evaluates

- vectorized on a numpy array of launch indices (the cache simulator, plots, tests), and
- on traced scalars inside a kernel (`tile_of(mapping, pk.program_id(0))`), where it becomes a
  few scalar ops in the kernel's prologue.

Stages:
    XCDChunk(num_xcds, chunk, n)    launch index -> logical index. CDNA dispatches workgroup i to
                                    XCD i % num_xcds; this inverts that round robin so logical
                                    ids come in runs of `chunk` per XCD (HipKittens Alg. 1, ph. 1)
    Grouped(rows, cols, window)     logical index -> (row, col), walking windows of `window`
                                    rows column by column (Triton GROUP_M, HipKittens Alg. 1,
                                    phase 2; on Hopper this is L2-grouped rasterization)
    Split(shape)                    logical index -> coordinates, last dim fastest (attention:
                                    (batch, head, q_block))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lang.values import minimum, where


# ---- index functions (numpy arrays or traced scalars) ------------------------------------------

def dispatch_xcd(pid, num_xcds: int, round_robin: bool = True):
    """XCD that hardware launch index `pid` runs on: `pid % num_xcds` on CDNA (round robin),
    0 on a monolithic die."""
    if num_xcds == 1 or not round_robin:
        return pid * 0
    return pid % num_xcds


def xcd_chunk(pid, n: int, num_xcds: int, chunk: int):
    """Logical index for launch index `pid` such that logical ids [j*C, (j+1)*C) all run on one
    XCD. The ragged tail (the last n % (num_xcds*C) ids) is split into num_xcds contiguous,
    balanced runs instead, so the map stays a bijection on [0, n) for every n."""
    x = num_xcds
    span = x * chunk
    aligned = (n // span) * span
    xcd = pid % x
    local = pid // x
    chunked = (local // chunk) * span + xcd * chunk + local % chunk
    rest = n - aligned
    base, extra = rest // x, rest % x
    tail = aligned + xcd * base + minimum(xcd, extra) + (pid - aligned) // x
    return where(pid < aligned, chunked, tail)


def grouped(lid, rows: int, cols: int, window: int):
    """(row, col) of logical index `lid`: windows of `window` rows, each walked column by
    column, so consecutive ids reuse both an A row-block and a B column-block. The last window
    may be shorter (rows % window)."""
    per = window * cols
    g = lid // per
    first = g * window
    height = minimum(rows - first, window)
    local = lid - g * per
    return first + local % height, local // height


def split(lid, shape: tuple[int, ...]):
    """Coordinates of `lid` in a row-major grid of `shape` (last dimension fastest)."""
    out = []
    for d in reversed(shape[1:]):
        out.append(lid % d)
        lid = lid // d
    out.append(lid)
    return tuple(reversed(out))


# ---- stages -------------------------------------------------------------------------------------

def _pos(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class XCDChunk:
    num_xcds: int
    chunk: int
    n: int

    def __post_init__(self):
        for f in ("num_xcds", "chunk", "n"):
            _pos(f, getattr(self, f))

    @property
    def size(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __call__(self, pid):
        return (xcd_chunk(pid, self.n, self.num_xcds, self.chunk),)


@dataclass(frozen=True)
class Grouped:
    rows: int
    cols: int
    window: int = 1

    def __post_init__(self):
        for f in ("rows", "cols", "window"):
            _pos(f, getattr(self, f))

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def __call__(self, lid):
        return grouped(lid, self.rows, self.cols, self.window)


@dataclass(frozen=True)
class Split:
    shape: tuple[int, ...]

    def __post_init__(self):
        for d in self.shape:
            _pos("grid dimension", d)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __call__(self, lid):
        return split(lid, self.shape)


@dataclass(frozen=True)
class Mapping:
    """A named chain of stages; the last one yields tile coordinates. Calling it on a launch
    index (numpy array or traced scalar) returns a tuple of coordinates. `params` are the
    knobs that `spec` prints, e.g. (("W", 5), ("C", 25))."""
    name: str
    stages: tuple
    params: tuple = ()

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(self.stages[-1].shape)

    @property
    def size(self) -> int:
        return self.stages[-1].size

    def __call__(self, pid):
        vals = (pid,)
        for st in self.stages:
            vals = st(*vals)
        return vals

    @property
    def spec(self) -> str:
        """The string `parse_mapping` turns back into this mapping (CLI, caches, reports)."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params)

    def __str__(self):
        return self.spec


def compose(name: str, *stages, params: tuple = ()) -> Mapping:
    """Chain stages into a mapping, checking that every stage covers the same ids."""
    if not stages:
        raise ValueError("a mapping needs at least one stage")
    n = stages[-1].size
    for st in stages[:-1]:
        if st.size != n:
            raise ValueError(f"stage {st} covers {st.size} ids but the grid has {n} tiles")
    return Mapping(name, tuple(stages), tuple(params))


def tile_of(mapping: Mapping, pid):
    """Tile coordinates for launch index `pid`: call it in a kernel's prologue with
    `pk.program_id(0)` (traced scalars), or on a numpy array of launch indices."""
    return mapping(pid)


# ---- presets ------------------------------------------------------------------------------------

def gemm_row_major(rows: int, cols: int) -> Mapping:
    """The default launch order: tile (pid // cols, pid % cols)."""
    return compose("row-major", Grouped(rows, cols, 1))


def gemm_grouped(rows: int, cols: int, window: int) -> Mapping:
    """Windowed traversal without XCD remapping (Triton GROUP_M; Hopper's L2-grouped
    rasterization, where there is one L2 and nothing to remap)."""
    return compose("grouped", Grouped(rows, cols, window), params=(("W", window),))


def gemm_xcd(rows: int, cols: int, window: int, chunk: int, num_xcds: int) -> Mapping:
    """XCD chunking, then windowed traversal (HipKittens Algorithm 1)."""
    return compose("xcd", XCDChunk(num_xcds, chunk, rows * cols), Grouped(rows, cols, window),
                   params=(("W", window), ("C", chunk)))


def attention_naive(batch: int, heads: int, q_blocks: int) -> Mapping:
    """The usual flash-attention grid order: q-block fastest, then head, then batch."""
    return compose("naive", Split((batch, heads, q_blocks)))


def attention_head_first(batch: int, heads: int, q_blocks: int, kv_group: int,
                         num_xcds: int, chunk: int | None = None) -> Mapping:
    """Every workgroup that reads one KV head (`kv_group` query heads x `q_blocks`) runs on
    one XCD, so that K/V is fetched into one L2 instead of into all of them. `chunk`
    overrides the run length (default kv_group * q_blocks)."""
    c = kv_group * q_blocks if chunk is None else chunk
    params = () if chunk is None else (("C", chunk),)
    return compose("head-first", XCDChunk(num_xcds, c, batch * heads * q_blocks),
                   Split((batch, heads, q_blocks)), params=params)
