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
    BlockFirst(B, H, QB, window)    logical index -> (batch, head, q_block), windows of `window`
                                    query heads walked q block by q block, head fastest

Attention orders (`attention_order`, `ATTENTION_ORDERS`) are the four of the NUMA study
(Choudhary et al., arXiv:2511.02132) built from these stages; see `attention_order`.
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


def block_first(lid, batch: int, heads: int, q_blocks, window: int):
    """(batch, head, q_block) of logical index `lid` in block-first order: the B*H query heads
    (global head r = batch * H + head) are cut into windows of `window` consecutive heads;
    each window is walked q block by q block with the head fastest, i.e. every head of the
    window computes q block 0, then q block 1, ... The last window may be shorter
    ((B*H) % window). `grouped` with rows = B*H, cols = q_blocks does exactly this."""
    r, q = grouped(lid, batch * heads, q_blocks, window)
    return r // heads, r % heads, q


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
class BlockFirst:
    batch: int
    heads: int
    q_blocks: int
    window: int

    def __post_init__(self):
        for f in ("batch", "heads", "q_blocks", "window"):
            _pos(f, getattr(self, f))

    @property
    def size(self) -> int:
        return self.batch * self.heads * self.q_blocks

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.heads, self.q_blocks)

    def __call__(self, lid):
        return block_first(lid, self.batch, self.heads, self.q_blocks, self.window)


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


# ---- the attention orders of the NUMA study -----------------------------------------------------
#
# Choudhary et al., "Optimizing Attention on GPUs by Exploiting GPU Architectural NUMA Effects",
# arXiv:2511.02132 (MI300X). Their unit is the attention compute cluster (ACC): the workgroups
# that read one K/V head, i.e. the G = H / H_kv query heads of a GQA group times the QB q
# blocks of each (one head for MHA). Notation below: n = B*H*QB launch indices, X XCDs,
# W = G*QB workgroups per ACC, ACC a = b*H_kv + h // G. CDNA dispatches launch index `pid`
# to XCD pid % X (`dispatch_xcd`); the swizzled orders invert that round robin with
# `xcd_chunk`, so that "logical" ids [jC, (j+1)C) run on one XCD.

ATTENTION_ORDERS = ("naive-block-first", "naive-head-first", "swizzled-block-first",
                    "swizzled-head-first")
# Older / shorter names. 'head-first' (attention_head_first) already was the paper's swizzled
# head-first and 'naive' its naive head-first; both keep their exact behaviour and spec.
ATTENTION_ALIASES = {"block-first": "naive-block-first", "naive": "naive-head-first",
                     "head-first": "swizzled-head-first"}


def attention_order_name(order: str) -> str:
    """The canonical name of an attention order or alias; ValueError for anything else."""
    name = ATTENTION_ALIASES.get(order, order)
    if name not in ATTENTION_ORDERS:
        known = ", ".join(ATTENTION_ORDERS + tuple(ATTENTION_ALIASES))
        raise ValueError(f"unknown attention order {order!r}; known: {known}")
    return name


def _check_group(heads: int, kv_group: int) -> int:
    _pos("kv_group", kv_group)
    if heads % kv_group:
        raise ValueError(f"{heads} query heads are not a multiple of kv_group={kv_group}")
    return heads // kv_group


def default_accs_per_window(kv_heads: int, num_xcds: int) -> int:
    """ACCs an XCD walks together under swizzled block-first: one batch's K/V heads shared
    evenly by the XCDs, ceil(H_kv / X) (H/8 heads per XCD for MHA, as in the paper's MHA
    figure; one GQA group at a time when H_kv <= X). Plain arithmetic: `kv_heads` may be
    a traced kernel scalar (>= 1)."""
    return (kv_heads + num_xcds - 1) // num_xcds


def attention_block_first(batch: int, heads: int, q_blocks: int) -> Mapping:
    """Naive block-first: the grid with the head fastest (the Triton/aiter flash-attention
    default), no remap.

        h = pid % H,  q = (pid // H) % QB,  b = pid // (H*QB);   XCD = pid % X

    All heads of a batch compute q block 0, then q block 1, ... When H % X == 0 the XCD is
    h % X for every q block, so an MHA head stays on one XCD by accident, but the G heads
    of a GQA group go to min(G, X) different XCDs (all of them once G >= X) and each XCD
    holds H/X heads' K/V at once; when H % X != 0 the XCD of (h, q) drifts with q and every
    head is spread over several XCDs."""
    return compose("naive-block-first", BlockFirst(batch, heads, q_blocks, heads))


def attention_swizzled_block_first(batch: int, heads: int, q_blocks: int, kv_group: int,
                                   num_xcds: int, accs: int | None = None) -> Mapping:
    """Swizzled block-first: ACCs grouped onto XCDs, each XCD walking its ACCs block-first.

    With k = accs (default `default_accs_per_window`: ceil(H_kv / X)) and C = k*W:

        lid = xcd_chunk(pid, n, X, C)
        (r, q) = grouped(lid, B*H, QB, k*G);   b = r // H,  h = r % H

    Logical window j = ids [jC, (j+1)C) = the k consecutive ACCs jk .. jk+k-1 (their k*G
    query heads); in the aligned region (the first n - n % (X*C) ids) window j runs on XCD
    j % X, which walks it q block by q block, all k*G heads of the window at each q block.
    So an XCD keeps k ACCs' K/V live at once, in lockstep over the keys. The last
    (B*H_kv) % (X*k) ACCs form the ragged tail: X contiguous balanced runs, so such an ACC
    may be split over a few XCDs (as xcd_chunk documents).

    The paper gives this order only as a figure (ACCs co-located per XCD, workgroups per
    XCD ordered block-first); k is our choice: H/X heads per XCD as in its MHA figure, and
    one KV group at a time for GQA with H_kv <= X (the block-first layout AMD's aiter
    'spatial' GQA kernel uses). `accs` overrides it (spec parameter K)."""
    kv = _check_group(heads, kv_group)
    k = default_accs_per_window(kv, num_xcds) if accs is None else _pos("accs", accs)
    params = () if accs is None else (("K", k),)
    n = batch * heads * q_blocks
    return compose("swizzled-block-first", XCDChunk(num_xcds, k * kv_group * q_blocks, n),
                   BlockFirst(batch, heads, q_blocks, k * kv_group), params=params)


def attention_order(order: str, batch: int, heads: int, q_blocks: int, kv_group: int = 1,
                    num_xcds: int = 8) -> Mapping:
    """The mapping of one of ATTENTION_ORDERS (or an alias) for a (B, H, QB) grid:

    naive-block-first   `attention_block_first`: h fastest, then q, then b; no remap
    naive-head-first    `attention_naive` (alias 'naive'): q fastest, then h, then b, no
                        remap; XCD = pid % X scatters a head's q blocks over min(QB, X)
                        XCDs and an ACC over all X once W >= X
    swizzled-block-first `attention_swizzled_block_first`
    swizzled-head-first `attention_head_first` (alias 'head-first', the existing order):
                        lid = xcd_chunk(pid, n, X, W); (b, h, q) = split(lid, (B, H, QB)).
                        In the aligned region ACC a runs entirely on XCD a % X, which walks
                        its ACCs a, a+X, ... one after another, each head-first (all q
                        blocks of one query head, then the next head of the group), so one
                        K/V head is live per XCD at a time; the last (B*H_kv) % X ACCs are
                        the ragged tail (balanced contiguous runs, an ACC on ~X/rest XCDs).

    Where the paper is loose we chose: "head-first" = the head is the outer index (all q
    blocks of a head before the next head), "block-first" = the q block is the outer index,
    as the authors' aiter code (PR ROCm/aiter#864, #3936) uses the words; the ACC -> XCD
    assignment is strided (ACC a on XCD a % X), which differs from contiguous ranges of ACCs
    per XCD only by relabelling ACCs that share no data. The mappings returned for the
    aliases keep their old names ('naive', 'head-first'), so `spec` still round-trips
    through parse_mapping."""
    name = attention_order_name(order)
    if name == "naive-block-first":
        return attention_block_first(batch, heads, q_blocks)
    if name == "naive-head-first":
        return attention_naive(batch, heads, q_blocks)
    _check_group(heads, kv_group)
    if name == "swizzled-block-first":
        return attention_swizzled_block_first(batch, heads, q_blocks, kv_group, num_xcds)
    return attention_head_first(batch, heads, q_blocks, kv_group, num_xcds)


def attention_coords(order: str, pid, batch: int, heads: int, q_blocks, kv_group: int,
                     num_xcds: int):
    """(batch, head, q block) of launch index `pid` under `order`, computed with the stage
    functions only, so that `pid` and `q_blocks` may be traced kernel scalars (a varlen grid
    knows its q blocks only at launch; the head counts may be traced too). No validation
    here: equal to attention_order(...)(pid), which checks the sizes, for int sizes."""
    name = attention_order_name(order)
    if name == "naive-block-first":
        return block_first(pid, batch, heads, q_blocks, heads)
    if name == "naive-head-first":
        return split(pid, (batch, heads, q_blocks))
    n = batch * heads * q_blocks
    if name == "swizzled-block-first":
        k = default_accs_per_window(heads // kv_group, num_xcds)
        lid = xcd_chunk(pid, n, num_xcds, k * kv_group * q_blocks)
        return block_first(lid, batch, heads, q_blocks, k * kv_group)
    lid = xcd_chunk(pid, n, num_xcds, kv_group * q_blocks)
    return split(lid, (batch, heads, q_blocks))
