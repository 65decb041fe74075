"""The CDNA schedule of attention forward (gfx942, gfx950): HipKittens' 8-wave ping-pong.

Each workgroup owns 256 query rows of one (batch, head): 8 waves of 32 rows. The work is
done transposed, so that no value ever leaves its lane: S^T = K Q^T puts the queries along
the accumulator's lanes, the softmax reduces columns (`pk.col_max`, `pk.col_sum`), P^T
converts in registers into a krun=4 B operand, O^T += V^T P^T takes V^T from LDS as a krun=4
A operand, and O leaves through `pk.transpose`.

K and V blocks of BN keys go from memory straight into LDS (`direct=True`), each
double-buffered, and are fetched 1.5 blocks ahead. The waves form two groups one barrier
phase apart (`pk.pingpong`); an iteration is four clusters, so that while one group computes
at raised priority the other reads LDS and issues the next fetches:

    compute  S_{j+1} = K_{j+1} Q^T      | O *= alpha_j, l = l alpha_j + colsum P_j, P_j -> DT
    memory   fetch K_{j+3}              | V_j: LDS -> registers
    compute  O += V_j^T P_j^T           | softmax of S_{j+1}: mask, max, alpha_{j+1}, P_{j+1}
    memory   fetch V_{j+2}              | K_{j+2}: LDS -> registers

Each MFMA cluster carries the other block's softmax for the scheduler to interleave (LLVM
places the arithmetic; it may move some of it to where its result is read). The last
iteration's S_{j+1} is of a block past the end, which the mask removes entirely.

The grid is one-dimensional and head-first (chiplet.attention_head_first, the NUMA study's
swizzled head-first) by default: all workgroups that read one KV head are consecutive
logical ids, chunked onto one XCD so its L2 holds that head's K and V; the prologue decodes
(batch, head, q block) from the launch index. MAP picks another of the study's orders
(MAPS, chiplet.mapping.attention_order).

PIN="a0" places O^T on a0.. for the whole kernel (MFMAs as inline asm on the pinned range);
its rescale then goes through v_accvgpr_read/write every block, about twice the VALU work of
leaving O^T to LLVM's allocator, so it is off by default (docs/targets/cdna.md)."""
from __future__ import annotations

import math

import pykittens as pk
from pykittens.chiplet import mapping as chip

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
ROWS = 32            # query rows per wave: the N of one 32x32 MFMA tile of S^T
WAVES = 8            # two ping-pong groups of 4
BLOCK_Q = ROWS * WAVES


def cdna_grid(pid, batch, heads, q_blocks, group, num_xcds, MAP="head-first"):
    """(batch, head, q block) of launch index `pid` (a traced scalar or a numpy array) under
    the grid order MAP, one of MAPS: the NUMA study's four attention orders
    (chiplet.mapping.attention_order: naive-block-first, naive-head-first,
    swizzled-block-first, swizzled-head-first) or their aliases. `head-first` (the default)
    is chiplet.attention_head_first, the paper's swizzled head-first (runs of group *
    q_blocks ids, every workgroup of one KV head, per XCD); `naive` (naive head-first) the q
    block fastest, then head, then batch; `block-first` the head fastest."""
    if MAP not in MAPS:
        raise pk.KernelError(f"attention on CDNA maps its grid in one of {MAPS}, "
                             f"not {MAP!r}")
    return chip.attention_coords(MAP, pid, batch, heads, q_blocks, group, num_xcds)


def _clamp(x, n):
    """x in [0, n): the grid decode guarantees it; clamped, the compiler knows it too and
    drops the range checks on batch and head in every access (masks it would otherwise keep
    in scalar registers through a loop)."""
    return pk.maximum(pk.minimum(x, n - 1), 0)


class _Sequences:
    """Where a workgroup's rows lie: the flat grid decoded (cdna_grid, in the order MAP
    names) into batch b, a head, and a block of that head's rows. By default the heads are
    the query heads (h; its key/value head hk = h // group) and the blocks hold query rows;
    with keys=True they are the key/value heads (hk; h is None, the caller walks the group's
    query heads) and the blocks hold key rows. clamp=True bounds b, the head and the block
    to their ranges (_clamp). Subclasses give the sequence's lengths nq, nk and the
    coordinates of a row of a head in q, o (qo), k, v (kv) and lse (lse); a coordinate
    function's head defaults to the decoded one. Subclasses set group (Hq / Hkv) before
    decoding."""

    def _decode(self, batch, heads, hkv, blocks, MAP, TARGET, keys, clamp):
        self.heads, self.blocks = heads, blocks
        grid_heads, run = (hkv, 1) if keys else (heads, self.group)
        b, head, block = cdna_grid(pk.program_id(0), batch, grid_heads, blocks, run,
                                   _xcds(TARGET), MAP)
        if clamp:
            b, head, block = _clamp(b, batch), _clamp(head, grid_heads), _clamp(block, blocks)
        self.b, self.block = b, block
        self.h, self.hk = (None, head) if keys else (head, head // self.group)


class _Dense(_Sequences):
    """Fixed-length batches: q, o (B, Hq, Nq, D), k, v (B, Hkv, Nk, D), lse (B, Hq, Nq); a
    grid of B H ceil(N / rows) workgroups (N: Nq, or Nk with keys=True)."""
    packed = False

    def __init__(self, q, k, MAP, TARGET, rows=BLOCK_Q, keys=False, clamp=False):
        batch, heads, nq, _ = q.shape
        self.nq, self.nk = nq, k.shape[2]
        self.group = heads // k.shape[1]
        n = self.nk if keys else nq
        self._decode(batch, heads, k.shape[1], (n + rows - 1) // rows, MAP, TARGET, keys,
                     clamp)
        self.end = self.end_lse = self.end_kv = None

    def qo(self, row, h=None):
        return (self.b, self.h if h is None else h, row, 0)

    def kv(self, row):
        return (self.b, self.hk, row, 0)

    def lse(self, row, h=None):
        return (self.b, self.h if h is None else h, row)


class _Packed(_Sequences):
    """Packed variable-length batches: q, o (Hq, total_q, D), k, v (Hkv, total_k, D), lse
    (Hq, total_q); sequence b holds rows cu_q[b]..cu_q[b+1] of q and cu_k[b]..cu_k[b+1] of
    k and v. The grid has a block for each of the longest sequence's blocks (of query rows,
    or of key rows with keys=True); the workgroups past a shorter sequence's end do nothing.
    Rows read past a sequence's end are the next sequence's: the kernels mask them, and
    bound their stores by `end` (q rows), `end_lse` or `end_kv` (k rows)."""
    packed = True

    def __init__(self, q, k, cu_q, cu_k, MAP, TARGET, keys=False, clamp=False):
        heads, hkv = q.shape[0], k.shape[0]
        batch = cu_q.shape[0] - 1
        self.group = heads // hkv
        blocks = pk.num_programs(0) // (batch * (hkv if keys else heads))
        self._decode(batch, heads, hkv, blocks, MAP, TARGET, keys, clamp)
        self.q_start, q_end = cu_q[self.b], cu_q[self.b + 1]
        self.k_start, k_end = cu_k[self.b], cu_k[self.b + 1]
        self.nq, self.nk = q_end - self.q_start, k_end - self.k_start
        self.end_q, self.end_k = q_end, k_end

    def qo(self, row, h=None):
        return (self.h if h is None else h, self.q_start + row, 0)

    def kv(self, row):
        return (self.hk, self.k_start + row, 0)

    def lse(self, row, h=None):
        return (self.h if h is None else h, self.q_start + row)

    @property
    def end(self):
        return (None, self.end_q, None)

    @property
    def end_lse(self):
        return (None, self.end_q)

    @property
    def end_kv(self):
        return (None, self.end_k, None)


def sequences(q, k, MAP, TARGET, cu_q=None, cu_k=None, rows=BLOCK_Q, keys=False,
              clamp=False):
    """This workgroup's _Dense geometry, or _Packed given cu_q / cu_k (its grid sized by the
    launcher, so `rows` is the launcher's business there)."""
    if cu_q is None:
        return _Dense(q, k, MAP, TARGET, rows, keys, clamp)
    return _Packed(q, k, cu_q, cu_k, MAP, TARGET, keys, clamp)


def _xcds(TARGET):
    from pykittens.targets import get
    return get(TARGET).num_xcds


def cdna_attention(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, MAP, TARGET, cu_q=None,
                   cu_k=None, PIN=""):
    """The body of attention_fwd (and attention_fwd_varlen, given cu_q/cu_k) on CDNA."""
    seq = sequences(q, k, MAP, TARGET, cu_q, cu_k)
    nq, nk, offset = seq.nq, seq.nk, seq.nk - seq.nq
    qb = seq.block
    if CAUSAL:
        qb = seq.blocks - 1 - qb                       # the longest rows start first
    q0 = qb * BLOCK_Q
    row0 = q0 + pk.wave_id() * ROWS                      # this wave's first query row
    blocks = (nk + BN - 1) // BN
    if CAUSAL:                                           # the keys the last row sees
        blocks = pk.maximum(pk.minimum(blocks, (q0 + BLOCK_Q + offset + BN - 1) // BN), 0)
    blocks = pk.where(q0 < nq, blocks, 0)                # a workgroup past its sequence
    scale2 = scale * LOG2E

    ks = pk.empty(pk.st((BN, D), DT), count=2)
    vs = pk.empty(pk.st((BN, D), DT), count=2)
    qt = pk.load(pk.rt((ROWS, D), DT, "row", role="b"), q, seq.qo(row0), end=seq.end)
    ot = pk.zeros(pk.rt((D, ROWS), pk.f32, role="acc", pin=PIN or None))  # O^T
    s = pk.empty(pk.rt((BN, ROWS), pk.f32, role="acc"))                # S^T of a block
    kt = pk.empty(pk.rt((BN, D), DT, "row", role="a"))                 # K: A of K Q^T
    vt = pk.empty(pk.rt((BN, D), DT, "col", role="a", krun=4))         # V (K x M): A^T
    p = pk.empty(s.type)                                               # its exponentials
    pt = pk.empty(pk.rt((BN, ROWS), DT, "col", role="b", krun=4))      # P^T: B of V^T P^T
    m = pk.full(pk.rv(s, "col"), -math.inf)      # running max of each query (base 2)
    l_ = pk.zeros(m.type)                        # running sum
    alpha = pk.empty(m.type)                     # rescale of what was summed before

    def fetch(ring, src, j):
        pk.load(ring[j % 2], src, seq.kv(j * BN), direct=True)

    def softmax(j):
        """Block j's scores S^T (in s) masked; the running max m, its rescale alpha and
        the running sum l updated; P^T = exp2(S^T scale2 - m) converted into p."""
        col0 = j * BN
        masked = col0 + BN > nk
        if CAUSAL:
            masked = masked | (col0 + BN > row0 + offset + 1)
        with pk.if_(masked):
            # the first key each query does not see: nk, or its causal limit
            limit = pk.min(pk.col_index(s, row0 + offset + 1), nk) if CAUSAL else nk
            pk.where(pk.row_index(s, col0) - limit < 0, s, -math.inf, out=s)
        m_new = pk.max(m, pk.col_max(s) * scale2)
        base = pk.where(m_new > -math.inf, m_new, 0.0)       # queries with no key yet
        pk.exp2(pk.fma(s, scale2, -base), out=p)
        pk.exp2(m - base, out=alpha)
        m.set(m_new)

    fetch(ks, k, 0)
    fetch(ks, k, 1)
    fetch(vs, v, 0)
    pk.barrier()
    pk.load(kt, ks[0], (0, 0))
    pk.barrier()                              # every wave has read K_0: refill its stage
    fetch(ks, k, 2)
    fetch(vs, v, 1)
    pk.mma_ABt(s, kt, qt, c=0)
    softmax(0)
    pk.load(kt, ks[1], (0, 0))
    pk.barrier()
    with pk.pingpong(fence=True) as pp:
        for j in pk.range(blocks):
            with pp.compute():
                pk.mma_ABt(s, kt, qt, c=0)                # S_{j+1}, under block j's
                ot *= alpha                               # softmax end
                l_.set(l_ * alpha)
                pk.col_sum(p, into=l_)
                pk.convert(pt, p)
            with pp.memory():
                with pk.if_(j + 3 < blocks):
                    fetch(ks, k, j + 3)
                pk.load(vt, vs[j % 2], (0, 0))
            with pp.compute():
                pk.mma_AtB(ot, vt, pt)                    # O += V_j^T P_j^T, under
                softmax(j + 1)                            # block j+1's softmax
            with pp.memory():
                with pk.if_(j + 2 < blocks):
                    fetch(vs, v, j + 2)
                pk.load(kt, ks[j % 2], (0, 0))
    seen = l_ > 0.0
    inv = pk.where(seen, l_, 1.0)
    pk.store(o, pk.transpose(ot / inv), seq.qo(row0), end=seq.end)
    pk.store(lse, pk.where(seen, (m + pk.log2(inv)) * LN2, -math.inf), seq.lse(row0),
             end=seq.end_lse)


CDNA_TARGETS = ("gfx942", "gfx950")
MAPS = ("head-first", "naive") + tuple(
    m for m in chip.ATTENTION_ORDERS + tuple(chip.ATTENTION_ALIASES)
    if m not in ("head-first", "naive"))


# Keys per block: the largest whose code object keeps every value in registers (no scratch,
# no spills) at 8 waves, 2 per SIMD, 256 registers each (tests/test_attention_cdna.py).
# gfx942 reads V^T from LDS one 16-bit element at a time (no transposing LDS read), which
# takes more registers in flight.
BLOCK_KEYS = {("gfx950", 64): 64, ("gfx950", 128): 32, ("gfx942", 64): 32, ("gfx942", 128): 32}


def cdna_launch(batch, heads, nq, d, target, CAUSAL=0, **overrides):
    """(grid, consts) of attention_fwd on a CDNA target: 8 waves, BLOCK_KEYS keys per
    block, a flat grid of batch * heads * ceil(nq / 256) workgroups in head-first order
    (MAP=... one of MAPS for another order)."""
    consts = {"D": d, "CAUSAL": int(CAUSAL), "BN": BLOCK_KEYS[target, d], "MAP": "head-first",
              "PIN": "", "num_waves": WAVES, "TARGET": target, **overrides}
    if consts["MAP"] not in MAPS:
        raise ValueError(f"attention: grid mapping {consts['MAP']!r} is not one of {MAPS}")
    return (batch * heads * -(-nq // BLOCK_Q),), consts
