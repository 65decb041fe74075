"""Attention backward (FlashAttention): from O, dO and the forward's LSE, the gradients
dQ, dK, dV of O = softmax(Q K^T * scale) V, on the same (B, H, N, D) views as the forward
(GQA: dK and dV summed over each key/value head's group of query heads; causal aligned to
the bottom right; ragged lengths).

Three passes (four with atomic dQ), each a library kernel:
- `attention_bwd_prep`: delta = rowsum(dO * O) per query row (f32);
- `attention_bwd`: one workgroup per block of keys (and key/value head, batch) walks every
  query block of the group's heads, recomputes P from Q K^T and the LSE, and accumulates
  dV = P^T dO and dK = dS^T Q in registers; with dq="atomic" (Hopper's default) it also
  adds each query block's dQ = dS K into an f32 sum (TMA reductions: the order of
  additions varies between runs), which `attention_bwd_dq_finish` then casts to dQ;
- `attention_bwd_dq` (dq="pass": deterministic; CDNA's only schedule): one workgroup per
  query block walks the key blocks in order and accumulates dQ in registers (it recomputes
  S and dP: two more products).
with dS = P * (dP - delta), dP = dO V^T, all in the base-2 domain of the forward."""
import functools
import math
import operator

import pykittens as pk
from pykittens.chiplet import mapping as chip

from .attention import (LOG2E, _causal_blocks, _check_heads, _max_length, _need_shapes,
                        packed_offsets)
from .attention_bwd_cdna import cdna_bwd, cdna_bwd_dq, cdna_bwd_launch
from .attention_cdna import CDNA_TARGETS
from .pipeline import consumer_regs

# (B, H, N, D) views whose head dim is the const D: static, so bounds on it fold away
HEAD = (None, None, None, "D")


@pk.kernel(num_waves=4)
def attention_bwd_prep(o: pk.gl["DT", 4], do: pk.gl["DT", 4], delta: pk.gl[pk.f32, 3],
                       DT: pk.const = None, D: pk.const = 128):
    """delta[b, h, i] = sum_d O[b, h, i, d] * dO[b, h, i, d]; grid (ceil(N / 64), H, B),
    16 rows per wave."""
    row = pk.program_id(0) * 64 + pk.wave_id() * 16
    h, b = pk.program_id(1), pk.program_id(2)
    t = pk.rt((16, D), pk.f32)
    prod = pk.load(t, o, (b, h, row, 0)) * pk.load(t, do, (b, h, row, 0))
    pk.store(delta, pk.row_sum(prod), (b, h, row))


@pk.kernel(num_waves=12)
def attention_bwd(q: pk.gl["DT", HEAD], k: pk.gl["DT", HEAD], v: pk.gl["DT", HEAD],
                  do: pk.gl["DT", HEAD], lse: pk.gl[pk.f32, 3], delta: pk.gl[pk.f32, 3],
                  dq: pk.gl[pk.f32, 4], dk: pk.gl["DT", HEAD], dv: pk.gl["DT", HEAD],
                  scale: pk.f32, DT: pk.const = None, D: pk.const = 128,
                  CAUSAL: pk.const = 0, BM: pk.const = 64, STAGES: pk.const = 2,
                  DQ_ATOMIC: pk.const = 1, TARGET: pk.target = None,
                  MAP: pk.const = "head-first", DQ_DIAG: pk.const = 0,
                  STATS_TMA: pk.const = 0, STATS_IN_ACC: pk.const = 3,
                  LONGEST_FIRST: pk.const = 0, DV_LATE: pk.const = 0,
                  SPLIT_MASKED: pk.const = 0):
    """dK, dV (and with DQ_ATOMIC, dQ added into the f32 sum `dq`, zeroed, of shape
    dq_sum_shape: attention_bwd_dq_finish makes dQ of it) of one block of keys per
    workgroup: q, do (B, Hq, Nq, D); k, v, dk, dv (B, Hkv, Nk, D); lse, delta (B, Hq, Nq).
    Grid and constants: attention_bwd_launch. DQ_DIAG (Hopper, timing only; 0 in every
    library launch): 1 leaves out dQ's TMA reductions, 2 the consumers' wait for each
    other's dS (a race: wrong dQ) - variants for bench/attention_bwd.py, to place the time.
    STATS_TMA (Hopper): LSE and delta are copied by TMA, which needs rows of a multiple of 4
    elements (attention_bwd_launch sets it when Nq is such a multiple); otherwise a producer
    wave copies them. STATS_IN_ACC (Hopper): bit 1 starts S^T from -LSE / scale, bit 2 dP^T
    from -delta; a clear bit starts the product from zero and subtracts after it (LSE or
    delta read from shared memory under the products). The launch takes the faster on the
    H200: 3 at D=128, 0 at D=64 (docs/PERF.md). DV_LATE (Hopper): dV's product is issued
    once dS is stored rather than before dP^T's wait, so the tensor cores have it while the
    two groups wait for each other's dS (in loops without a mask). SPLIT_MASKED (Hopper,
    causal): the query blocks the mask cuts are walked first, in a loop of their own, so
    the rest runs without the mask (and with DV_LATE). The launch sets both
    where they are faster on the H200 (_walk_consts)."""
    if TARGET == "sm_90a":
        _hopper_bwd(q, k, v, do, lse, delta, dq, dk, dv, scale, DT, D, CAUSAL, BM, STAGES,
                    DQ_ATOMIC, diag=DQ_DIAG, stats_tma=STATS_TMA, in_acc=STATS_IN_ACC,
                    longest_first=LONGEST_FIRST, dv_late=DV_LATE,
                    split=SPLIT_MASKED)
    elif TARGET in CDNA_TARGETS:
        cdna_bwd(q, k, v, do, lse, delta, dk, dv, scale, DT, D, CAUSAL, BM, DQ_ATOMIC, MAP,
                 TARGET)
    else:
        raise pk.NotSupportedYet(f"attention_bwd has no schedule for {TARGET} yet")


# dQ's f32 sum (the atomic schedule) is kept in the order the consumers' accumulators hold
# it: each wave's (16 queries, 64 columns) block of dQ, relabelled (pk.relabel) as a generic
# (32, 32) tile, is 32 rows of 128 bytes. So it goes to shared memory in 16-byte runs a lane
# without bank conflicts (the accumulator's pairs of columns meet two rows to a bank) and
# reaches global memory as one TMA box per 64 columns; attention_bwd_dq_finish reads the
# blocks back and relabels them. Query block q0's columns 64j.. start at row
# _dq_sum_row(q0, j, D) of its head, wave w's rows 32 w further.
DQ_SUM_WAVE = (32, 32)
DQ_PART = pk.rt((16, 64), pk.f32, role="acc")        # a wave's block of dQ, as computed
DQ_SUM_STAGE = pk.st((4 * DQ_SUM_WAVE[0], DQ_SUM_WAVE[1]), pk.f32, swizzle=8)  # 4 waves'


def _dq_sum_row(q0, j, D):
    return (q0 // 64 * (D // 64) + j) * DQ_SUM_STAGE.shape[0]


def dq_sum_shape(b: int, hq: int, nq: int, d: int) -> tuple:
    """The shape of the zeroed f32 sum attention_bwd adds dQ into (atomic schedule)."""
    return (b, hq, _dq_sum_row(-(-nq // 64) * 64, 0, d), DQ_SUM_WAVE[1])  # blocks' rows


def _zero_unless(t, conditions: list):
    """t where every condition (a boolean tile of its shape) holds, 0 elsewhere; t itself
    where there is none."""
    return pk.where(functools.reduce(operator.and_, conditions), t, 0.0) if conditions else t


def _sequence(q, k, b, cu_q, cu_k):
    """Sequence b's first query and key rows, its lengths, and the coordinates of a row of
    head h in the (B, H, N, D) tensors and the (B, H, N) row vectors — or, packed (cu_q /
    cu_k given), in the (H, total, D) tensors and (H, total) row vectors."""
    if cu_q is None:
        return (0, 0, q.shape[2], k.shape[2], lambda h, row: (b, h, row, 0),
                lambda h, row: (b, h, row))
    qs, ks_ = cu_q[b], cu_k[b]
    return (qs, ks_, cu_q[b + 1] - qs, cu_k[b + 1] - ks_, lambda h, row: (h, row, 0),
            lambda h, row: (h, row))


class _Walk:
    """A key block's walk over query blocks: segments of each head's blocks, every head of
    the GQA group in turn (`group` heads from head h0), each segment a loop of its own.
    parts: (whole, first block, end) per segment (_walk_parts); whole segments need no
    mask."""

    class Segment:
        def __init__(self, whole, lo, first, n):
            self.whole, self.lo, self.first, self.n = whole, lo, first, n

    def __init__(self, h0, group, BM, parts):
        self.h0, self.group, self.BM, self.segments, lo = h0, group, BM, [], 0
        for whole, a, end in parts:
            n = pk.maximum(end - a, 0)
            self.segments.append(self.Segment(whole, lo, a, n))
            lo = lo + group * n

    def block(self, step, seg):
        """(query head, first query row) of step `step` (in segment seg)."""
        i, n = step - seg.lo, pk.maximum(seg.n, 1)
        return self.h0 + i // n, (seg.first + i % n) * self.BM

    def run(self, role_step):
        """role_step(step, segment) over every step of the walk, segment by segment."""
        for seg in self.segments:
            for step in pk.range(seg.lo, seg.lo + self.group * seg.n):
                role_step(step, seg)


def _walk_parts(split, CAUSAL, varlen, BM, k0, nk, nq, offset, first, last):
    """The segments of a key block's walk (k0: its first key) as (whole, first, end): with
    `split` the query blocks that need a mask (the causal mask cuts them; packed: a key or
    query row of the block lies past the sequence's end, where the next sequence's rows
    are) walk in loops of their own, so the rest run without the mask's registers."""
    if not split or not (CAUSAL or varlen):
        return [(not (CAUSAL or varlen), first, last)]
    w0 = pk.minimum(pk.maximum((k0 + 127 - offset + BM - 1) // BM, first), last) \
        if CAUSAL else first                       # the first block every key sees whole
    if not varlen:
        return [(False, first, w0), (True, w0, last)]
    w1 = pk.maximum(pk.minimum(nq // BM, last), w0)     # past the last block inside
    inside = k0 + 128 <= nk                              # every key row of the block
    w0, w1 = pk.where(inside, w0, last), pk.where(inside, w1, last)
    return [(False, first, w0), (True, w0, w1), (False, w1, last)]


def _hopper_bwd(q, k, v, do, lse, delta, dq, dk, dv, scale, DT, D, CAUSAL, BM, STAGES,
                DQ_ATOMIC, cu_q=None, cu_k=None, diag=0, stats_tma=0, in_acc=3,
                longest_first=0, dv_late=0, split=0):
    """Hopper: a producer warpgroup has one wave copy the block's 128 keys and values once
    (64 per consumer) and then each query block's Q, dO, LSE and delta into a ring; two consumer
    warpgroups, 64 keys each, compute S^T = K Q^T and dP^T = V dO^T by wgmma from shared
    memory, P^T and dS^T in registers, and dV += P^T dO, dK += dS^T Q with the converted
    registers as wgmma's A operand. With DQ_ATOMIC, dS goes through shared memory into
    dQ = dS K (wgmma, A and B from shared memory), 64 columns at a time, issued before dK's
    product and staged in shared memory while the tensor cores compute dK, then added into
    the f32 `dq` (scaled) by TMA reductions that a second producer wave issues.
    Each workgroup walks its key block's query blocks, for every query head of its group, in
    segments (_Walk): with `split`, the blocks that need a mask in loops apart from those
    that need none, which issue dV's product late (dv_late; attention_bwd's DV_LATE).
    Grid (ceil(Nk / 128), Hkv, B); longest_first (causal launches): a flat grid in
    block-first order over windows of 4 key/value heads (chiplet.mapping.block_first): the
    key blocks in order of their work (the first key block, which every query block sees, of
    each of the 4 heads, then the second...), so the grid's last workgroups are short ones
    (1.5-1.8% faster than a head's key blocks one after another on the H200,
    docs/PERF.md), while 4 heads' Q, dO and dQ stay in L2.

    With cu_q / cu_k (packed batches): (H, total, D) tensors, lse and delta (Hq, total_q);
    queries past the sequence's end are masked (their rows belong to the next sequence) and
    dK, dV are stored up to the sequence's end; dQ's sum (DQ_ATOMIC) is per sequence,
    (B, Hq, ...) as for a dense batch of the longest sequences."""
    if longest_first:       # the NUMA study's block-first order, key blocks for query blocks
        b, hk, kb = chip.block_first(pk.program_id(0), k.shape[0], k.shape[1],
                                     (k.shape[2] + 127) // 128, 4)
    else:
        kb, hk, b = pk.program_id(0), pk.program_id(1), pk.program_id(2)
    qs, ks_, nq, nk, at, row_at = _sequence(q, k, b, cu_q, cu_k)
    group = q.shape[-3] // k.shape[-3]
    offset, k0 = nk - nq, kb * 128
    nqb = (nq + BM - 1) // BM
    first = pk.maximum(k0 - offset, 0) // BM if CAUSAL else 0    # blocks that see these keys
    varlen = cu_q is not None
    last = pk.where(k0 < nk, nqb, first) if varlen else nqb   # past a short sequence: none
    kt = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(2)]
    vt = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(2)]
    kv_full = pk.mbarrier(4)
    qo = pk.st((BM, D), DT, swizzle=8)
    # a query block's LSE and delta travel with it, read from shared memory as the step
    # starts (loaded into registers a step ahead they stayed live across it: slower,
    # docs/PERF.md): by TMA (rows past the end read 0: their Q and dO rows are 0 too, so
    # P^T dO and dS^T Q add nothing) or, for rows TMA cannot copy, by a producer wave
    stat = pk.st((1, BM), pk.f32)
    ring = pk.Ring(STAGES, fill=4 if stats_tma else 3, drain=8, q=qo, do=qo, lse=stat,
                   delta=stat)
    # dS of a step (queries x keys: group g's 64 keys in sds[g]); two buffers by step
    # parity, so that storing the next step's never overwrites one a slower wave still reads
    sds = [pk.empty(pk.st((BM, 64), DT, swizzle=8), count=2) for _ in range(2)]
    ds_ready = pk.mbarrier(8)
    # dQ's 64-column blocks leave through shared memory: the consumers write a block (in
    # their registers' order, DQ_SUM_WAVE), a producer wave has the TMA unit add it into
    # `dq` and waits for the copy to read it, so the consumers go on (the tile is free again
    # long before the next step's block)
    if DQ_ATOMIC:
        if BM != 64:
            raise ValueError("the atomic dQ schedule keeps 64-row query blocks (BM=64)")
        dq_stage = [pk.empty(DQ_SUM_STAGE) for _ in range(D // 64)]
        dq_ready = [pk.mbarrier(4) for _ in range(D // 64)]
        dq_free = [pk.mbarrier(1) for _ in range(D // 64)]
    scale2 = scale * LOG2E
    walk = _Walk(hk * group, group, BM, _walk_parts(split, CAUSAL, varlen, BM, k0, nk, nq,
                                                    offset, first, last))

    with pk.role(0, 4, regs=24):
        with pk.if_(pk.wave_id() == 0):
            for g in pk.static_range(2):
                pk.tma_load(kt[g], k, at(hk, ks_ + k0 + 64 * g), kv_full)
                pk.tma_load(vt[g], v, at(hk, ks_ + k0 + 64 * g), kv_full)

            def load(step, seg):
                h, q0 = walk.block(step, seg)
                st = ring.acquire(step)
                pk.tma_load(st.q, q, at(h, qs + q0), st.full)
                pk.tma_load(st.do, do, at(h, qs + q0), st.full)
                if stats_tma:
                    pk.tma_load(st.lse, lse, row_at(h, qs + q0), st.full)
                    pk.tma_load(st.delta, delta, row_at(h, qs + q0), st.full)
            walk.run(load)
        if not stats_tma:
            with pk.if_(pk.wave_id() == 2):   # LSE and delta by a wave

                def stats(step, seg):
                    h, q0 = walk.block(step, seg)
                    st = ring.acquire(step)
                    pk.store(st.lse, pk.load(pk.rt((1, BM), pk.f32), lse, row_at(h, qs + q0),
                                             fill=math.inf), (0, 0))    # past the end: P = 0
                    pk.store(st.delta, pk.load(pk.rt((1, BM), pk.f32), delta,
                                               row_at(h, qs + q0)), (0, 0))
                    pk.arrive(st.full)
                walk.run(stats)
        if DQ_ATOMIC:
            with pk.if_(pk.wave_id() == 1):              # dQ's writer

                def write(step, seg):
                    h, q0 = walk.block(step, seg)
                    for j in pk.static_range(D // 64):
                        pk.wait(dq_ready[j], step % 2)
                        if not diag & 1:
                            pk.tma_store(dq, dq_stage[j], (b, h, _dq_sum_row(q0, j, D), 0),
                                         add=True)
                        pk.arrive(dq_free[j])
                walk.run(write)
    for g in pk.static_range(2):
        with pk.role(4 + 4 * g, 4, regs=consumer_regs(24)):
            w = pk.wave_id() % 4
            key0 = k0 + 64 * g + 16 * w                 # this wave's 16 keys
            t_t = pk.rt((16, BM), pk.f32, role="acc")   # keys x queries
            acc_t = pk.rt((16, D), pk.f32, role="acc")
            dk_acc, dv_acc = pk.zeros(acc_t), pk.zeros(acc_t)
            mine = list(range(g, D // 64, 2)) if DQ_ATOMIC else []  # this group's dQ columns
            pk.wait(kv_full, 0)

            def consume(step, seg):
                h, q0 = walk.block(step, seg)
                s = ring.wait(step)
                # dV's product issued once dS is stored (late), so that it runs under the
                # wait for the other group's dS, in loops without a mask (whose registers
                # would spill more); else under the wait for dP^T
                late = dv_late and seg.whole
                # S^T starts from -LSE / scale (P^T = exp2(scale2 S^T)) and dP^T from -delta
                # (bits 1 and 2 of in_acc), or from zero, LSE and delta subtracted after
                col = pk.rv(t_t, "col")                 # per query: columns
                if in_acc & 1:
                    st0 = pk.zeros(t_t) - pk.load(col, s.lse, (0, 0)) * (1 / scale)
                    st_ = pk.mma_ABt(st0, kt[g], s.q, in_flight=1)     # S^T = K Q^T
                else:
                    st_ = pk.mma_ABt(pk.empty(t_t), kt[g], s.q, c=0, in_flight=1)
                if in_acc & 2:
                    dpt = pk.mma_ABt(pk.zeros(t_t) - pk.load(col, s.delta, (0, 0)), vt[g],
                                     s.do, in_flight=1)                 # dP^T = V dO^T
                else:
                    dpt = pk.mma_ABt(pk.empty(t_t), vt[g], s.do, c=0, in_flight=1)
                if in_acc & 1:
                    p_t = pk.exp2(st_ * scale2)
                else:                                   # LSE loaded under the products
                    p_t = pk.exp2(pk.fma(st_, scale2, -(pk.load(col, s.lse, (0, 0)) * LOG2E)))
                # Keys past the end need no mask: their K and V rows read 0, so they add
                # nothing to dQ, and their dK, dV rows are not stored (packed: they are the
                # next sequence's, as are the queries past the end)
                keys, queries = pk.row_index(t_t, key0), pk.col_index(t_t, q0)
                keep = []
                if not seg.whole:
                    keep = [keys < nk, queries < nq] if varlen else []
                    if CAUSAL:
                        keep.append(keys <= queries + offset)
                p_t = _zero_unless(p_t, keep)
                p_a = pk.convert(pk.rt((16, BM), DT, role="a"), p_t)
                if not late:
                    pk.mma_AB(dv_acc, p_a, s.do, in_flight=2)           # dV += P^T dO
                pk.mma_wait(dpt, in_flight=0 if late else 1)
                ds_t = p_t * (dpt if in_acc & 2 else dpt - pk.load(col, s.delta, (0, 0)))
                if DQ_ATOMIC:                      # dS^T (this group's 64 keys), transposed
                    pk.store(sds[g][step % 2], pk.transpose(ds_t).cast(DT), (0, 16 * w))
                ds_a = pk.convert(pk.rt((16, BM), DT, role="a"), ds_t)
                if late:
                    pk.mma_AB(dv_acc, p_a, s.do, in_flight=1)
                if DQ_ATOMIC:      # every wave waits: none may arrive for the next phase early
                    pk.arrive(ds_ready)
                    if not diag & 2:
                        pk.wait(ds_ready, step % 2)
                parts = {j: pk.empty(DQ_PART) for j in mine}
                for j, dq_part in parts.items():   # dQ = dS K over both groups' keys
                    pk.mma_AB(dq_part, sds[0][step % 2], kt[0].atom(j), c=0, in_flight=2)
                    pk.mma_AB(dq_part, sds[1][step % 2], kt[1].atom(j), in_flight=2)
                # dK += dS^T Q, issued after dQ's product: it runs while dQ is staged
                pk.mma_AB(dk_acc, ds_a, s.q, in_flight=1)
                for j, dq_part in parts.items():
                    with pk.if_(step >= 1):         # the writer has read the tile
                        pk.wait(dq_free[j], (step - 1) % 2)
                    pk.store(dq_stage[j], pk.relabel(pk.rt(DQ_SUM_WAVE, pk.f32),
                                                     dq_part * scale),
                             (DQ_SUM_WAVE[0] * w, 0))
                    pk.arrive(dq_ready[j])
                pk.mma_wait(dk_acc)
                ring.release(step)
            walk.run(consume)
            end = (None, ks_ + nk, None) if varlen else None
            pk.store(dk, (dk_acc * scale).cast(DT), at(hk, ks_ + key0), end=end)
            pk.store(dv, dv_acc.cast(DT), at(hk, ks_ + key0), end=end)


@pk.kernel(num_waves=12)
def attention_bwd_dq(q: pk.gl["DT", HEAD], k: pk.gl["DT", HEAD], v: pk.gl["DT", HEAD],
                     do: pk.gl["DT", HEAD], lse: pk.gl[pk.f32, 3], delta: pk.gl[pk.f32, 3],
                     dq: pk.gl["DT", HEAD], scale: pk.f32, DT: pk.const = None,
                     D: pk.const = 128, CAUSAL: pk.const = 0, BN: pk.const = 64,
                     STAGES: pk.const = 2, TARGET: pk.target = None,
                     MAP: pk.const = "head-first"):
    """dQ of one block of query rows per workgroup, the key blocks in order (deterministic).
    Grid and constants: attention_bwd_launch."""
    if TARGET == "sm_90a":
        _hopper_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, STAGES)
    elif TARGET in CDNA_TARGETS:
        cdna_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, MAP, TARGET)
    else:
        raise pk.NotSupportedYet(f"attention_bwd_dq has no schedule for {TARGET} yet")


def _hopper_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, STAGES,
                   cu_q=None, cu_k=None):
    """Hopper: a workgroup per 128 query rows, the key blocks in order, dQ accumulated in
    registers: S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
    Grid (ceil(Nq / 128), Hq, B). With cu_q / cu_k (packed batches), dQ is stored up to the
    sequence's end (the rows after it, the next sequence's, are computed and dropped)."""
    qb, h, b = pk.program_id(0), pk.program_id(1), pk.program_id(2)
    qs, ks_, nq, nk, at, row_at = _sequence(q, k, b, cu_q, cu_k)
    group = q.shape[-3] // k.shape[-3]
    q0, offset = qb * 128, nk - nq
    blocks = (nk + BN - 1) // BN
    if CAUSAL:
        blocks = _causal_blocks(blocks, q0 + 128, offset, BN)
    if cu_q is not None:                              # query blocks past a short sequence
        blocks = pk.where(q0 < nq, blocks, 0)
    sq = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(2)]
    sdo = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(2)]
    q_full = pk.mbarrier(4)
    kv = pk.st((BN, D), DT, swizzle=8)
    ring = pk.Ring(STAGES, fill=2, drain=8, k=kv, v=kv)
    scale2 = scale * LOG2E
    with pk.role(0, 4, regs=24):
        with pk.if_(pk.wave_id() == 0):
            for g in pk.static_range(2):
                pk.tma_load(sq[g], q, at(h, qs + q0 + 64 * g), q_full)
                pk.tma_load(sdo[g], do, at(h, qs + q0 + 64 * g), q_full)
            for j in pk.range(blocks):
                st = ring.acquire(j)
                pk.tma_load(st.k, k, at(h // group, ks_ + j * BN), st.full)
                pk.tma_load(st.v, v, at(h // group, ks_ + j * BN), st.full)
    for g in pk.static_range(2):
        with pk.role(4 + 4 * g, 4, regs=consumer_regs(24)):
            row0 = q0 + 64 * g + 16 * (pk.wave_id() % 4)
            s_t = pk.rt((16, BN), pk.f32, role="acc")
            acc = pk.zeros(pk.rt((16, D), pk.f32, role="acc"))
            s, dp = pk.empty(s_t), pk.empty(s_t)
            pk.wait(q_full, 0)
            # packed: rows past the sequence's end read +inf (P = 0) rather than the next's
            rows_end = (None, qs + nq) if cu_q is not None else None
            lse_r = pk.load(pk.rv(acc, "row"), lse, row_at(h, qs + row0), fill=math.inf,
                            end=rows_end) * LOG2E
            delta_r = pk.load(pk.rv(acc, "row"), delta, row_at(h, qs + row0))
            for j in pk.range(blocks):
                st = ring.wait(j)
                pk.mma_ABt(s, sq[g], st.k, c=0, in_flight=1)
                pk.mma_ABt(dp, sdo[g], st.v, c=0, in_flight=1)        # S has retired
                cols, rows = pk.col_index(s_t, j * BN), pk.row_index(s_t, row0)
                # keys past the end: K and V rows of 0 add nothing (packed: the next
                # sequence's, masked)
                keep = [cols < nk] if cu_q is not None else []
                if CAUSAL:
                    keep.append(cols <= rows + offset)
                p = _zero_unless(pk.exp2(pk.fma(s, scale2, -lse_r)), keep)  # under dO V^T
                pk.mma_wait(dp)
                ds = pk.convert(pk.rt((16, BN), DT, role="a"), p * (dp - delta_r))
                pk.mma_AB(acc, ds, st.k)
                ring.release(j)
            end = (None, qs + nq, None) if cu_q is not None else None
            pk.store(dq, (acc * scale).cast(DT), at(h, qs + row0), end=end)


@pk.kernel(num_waves=4)
def attention_bwd_dq_finish(dq_sum: pk.gl[pk.f32, 4], dq: pk.gl["DT", HEAD],
                            DT: pk.const = None, D: pk.const = 128,
                            TARGET: pk.target = None):
    """dQ (B, Hq, Nq, D) from attention_bwd's f32 sum (atomic schedule, dq_sum_shape), one
    64-row query block per workgroup (_finish_block), written cast to a shared tile that
    TMA stores (rows past Nq are not written): every global access is a whole box. Grid
    (ceil(Nq / 64), Hq, B)."""
    _need_hopper_sum(TARGET)
    q0, h, b = pk.program_id(0) * 64, pk.program_id(1), pk.program_id(2)
    out = pk.empty(pk.st((64, D), DT, swizzle=8))
    _finish_staged(dq_sum, _finish_tiles(D), out, dq, b, h, q0, D, DT, (b, h, q0, 0))


def _need_hopper_sum(target):
    if target != "sm_90a":
        raise pk.NotSupportedYet(f"attention_bwd's atomic dQ schedule is Hopper's; {target} "
                                 "takes dQ by its own pass (dq='pass')")


def _finish_tiles(D):
    """The shared tiles _finish_block reads a query block's sums into, and their barrier
    (allocated at the kernel's top)."""
    return [pk.empty(DQ_SUM_STAGE) for _ in range(D // 64)], pk.mbarrier(D // 64)


def _finish_staged(dq_sum, tiles, out, dq, b, h, q0, D, DT, at):
    """_finish_block's 64 rows cast into the shared tile `out`, which TMA stores to `dq` at
    `at` (every wave of the workgroup takes part)."""
    _finish_block(dq_sum, tiles, b, h, q0, D, lambda j, part: pk.store(
        out, part.cast(DT), (16 * pk.wave_id(), 64 * j)))
    pk.barrier()
    with pk.if_(pk.wave_id() == 0):
        pk.tma_store(dq, out, at)


def _finish_block(dq_sum, tiles, b, h, q0, D, store):
    """Query block q0 of head h, sequence b, of dQ's f32 sum: its blocks come by TMA (into
    `tiles`, _finish_tiles) as the main pass's stage held them, each wave reads its 16
    rows' back in register order and relabels them as the accumulators that added them;
    store(j, part) takes the wave's (16, 64) f32 block of columns 64 j.. Then the wave
    drops those rows of the sum (pk.discard: dead once read)."""
    w = pk.wave_id()
    sums, full = tiles
    with pk.if_(w == 0):
        for j in pk.static_range(D // 64):
            pk.tma_load(sums[j], dq_sum, (b, h, _dq_sum_row(q0, j, D), 0), full)
    pk.wait(full, 0)
    for j in pk.static_range(D // 64):
        part = pk.load(pk.rt(DQ_SUM_WAVE, pk.f32), sums[j], (DQ_SUM_WAVE[0] * w, 0))
        store(j, pk.relabel(DQ_PART, part))
        # the sums are in shared memory now and read nowhere else: L2 drops them unwritten
        pk.discard(dq_sum, part, (b, h, _dq_sum_row(q0, j, D) + DQ_SUM_WAVE[0] * w, 0))


# (H, total, D) views of packed (total, H, D) tensors, head dim the const D
PACKED = (None, None, "D")


@pk.kernel(num_waves=12)
def attention_bwd_varlen(q: pk.gl["DT", PACKED], k: pk.gl["DT", PACKED],
                         v: pk.gl["DT", PACKED], do: pk.gl["DT", PACKED],
                         lse: pk.gl[pk.f32, 2], delta: pk.gl[pk.f32, 2],
                         dq: pk.gl[pk.f32, 4], dk: pk.gl["DT", PACKED],
                         dv: pk.gl["DT", PACKED], cu_seqlens_q: pk.gl[pk.i32, 1],
                         cu_seqlens_k: pk.gl[pk.i32, 1], scale: pk.f32, DT: pk.const = None,
                         D: pk.const = 128, CAUSAL: pk.const = 0, BM: pk.const = 64,
                         STAGES: pk.const = 2, TARGET: pk.target = None,
                         MAP: pk.const = "head-first", STATS_TMA: pk.const = 0,
                         DQ_ATOMIC: pk.const = 0, DV_LATE: pk.const = 0,
                         SPLIT_MASKED: pk.const = 0):
    """attention_bwd's dK and dV over a packed batch, as attention_fwd_varlen lays it out:
    q, do (Hq, total_q, D), k, v, dk, dv (Hkv, total_k, D), lse, delta (Hq, total_q), int32
    cu_seqlens_q / cu_seqlens_k (B + 1). Causal masks are bottom-right aligned per
    sequence; a sequence with no queries or no keys gets dK = dV = 0, and rows outside
    every sequence are never written. dQ: attention_bwd_dq_varlen, or with DQ_ATOMIC
    (Hopper) added into the zeroed f32 sum `dq` of dq_sum_shape(B, Hq, longest Nq, D) for
    attention_bwd_dq_finish_varlen. Hopper's schedule on sm_90a, the dense CDNA schedule
    (attention_bwd_cdna) on gfx942 and gfx950, each over the forward's packed geometry.
    DV_LATE, SPLIT_MASKED (Hopper): as attention_bwd's, SPLIT_MASKED also walking apart the
    blocks with a key or query row past the sequence's end. Grid and constants:
    attention_bwd_varlen_launch."""
    if TARGET == "sm_90a":
        _hopper_bwd(q, k, v, do, lse, delta, dq, dk, dv, scale, DT, D, CAUSAL, BM, STAGES,
                    DQ_ATOMIC, cu_seqlens_q, cu_seqlens_k, stats_tma=STATS_TMA,
                    dv_late=DV_LATE, split=SPLIT_MASKED)
    elif TARGET in CDNA_TARGETS:
        cdna_bwd(q, k, v, do, lse, delta, dk, dv, scale, DT, D, CAUSAL, BM, DQ_ATOMIC, MAP,
                 TARGET, cu_seqlens_q, cu_seqlens_k)
    else:
        raise pk.NotSupportedYet(f"attention_bwd_varlen has no schedule for {TARGET} yet")


@pk.kernel(num_waves=12)
def attention_bwd_dq_varlen(q: pk.gl["DT", PACKED], k: pk.gl["DT", PACKED],
                            v: pk.gl["DT", PACKED], do: pk.gl["DT", PACKED],
                            lse: pk.gl[pk.f32, 2], delta: pk.gl[pk.f32, 2],
                            dq: pk.gl["DT", PACKED], cu_seqlens_q: pk.gl[pk.i32, 1],
                            cu_seqlens_k: pk.gl[pk.i32, 1], scale: pk.f32,
                            DT: pk.const = None, D: pk.const = 128, CAUSAL: pk.const = 0,
                            BN: pk.const = 64, STAGES: pk.const = 2,
                            TARGET: pk.target = None, MAP: pk.const = "head-first"):
    """attention_bwd_dq over a packed batch (layouts and targets: attention_bwd_varlen):
    dQ of one block of a sequence's query rows per workgroup, stored up to the sequence's
    end; rows of a sequence with no keys get dQ = 0."""
    if TARGET == "sm_90a":
        _hopper_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, STAGES,
                       cu_seqlens_q, cu_seqlens_k)
    elif TARGET in CDNA_TARGETS:
        cdna_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, MAP, TARGET,
                    cu_seqlens_q, cu_seqlens_k)
    else:
        raise pk.NotSupportedYet(f"attention_bwd_dq_varlen has no schedule for {TARGET} yet")


@pk.kernel(num_waves=4)
def attention_bwd_dq_finish_varlen(dq_sum: pk.gl[pk.f32, 4], dq: pk.gl["DT", PACKED],
                                   cu_seqlens_q: pk.gl[pk.i32, 1], DT: pk.const = None,
                                   D: pk.const = 128, TARGET: pk.target = None):
    """attention_bwd_dq_finish over a packed batch: dQ (Hq, total_q, D) from
    attention_bwd_varlen's sum (DQ_ATOMIC), sequence by sequence: a block inside its
    sequence by TMA as the dense pass, the one the sequence ends in from registers, up to
    the end (rows after it are the next sequence's). Grid (ceil(longest Nq / 64), Hq, B)."""
    _need_hopper_sum(TARGET)
    q0, h, b = pk.program_id(0) * 64, pk.program_id(1), pk.program_id(2)
    qs = cu_seqlens_q[b]
    end = cu_seqlens_q[b + 1]
    out = pk.empty(pk.st((64, D), DT, swizzle=8))
    tiles = _finish_tiles(D)
    with pk.if_(qs + q0 + 64 <= end):
        _finish_staged(dq_sum, tiles, out, dq, b, h, q0, D, DT, (h, qs + q0, 0))
    with pk.else_():
        with pk.if_(qs + q0 < end):                # not a block past a short sequence
            _finish_block(dq_sum, tiles, b, h, q0, D, lambda j, part: pk.store(
                dq, part.cast(DT), (h, qs + q0 + 16 * pk.wave_id(), 64 * j),
                end=(None, end, None)))


def attention_bwd_varlen_launch(i: dict, target, max_seqlen_q=None, max_seqlen_k=None,
                                rows: int | None = None, dq: str | None = None,
                                **overrides):
    """(prep, main, dq) launch plans of the packed backward for inputs `i`: q (Hq, total_q,
    D), k (Hkv, total_k, D), cu_seqlens_q, cu_seqlens_k (read here to check them; the
    longest lengths, when given, must cover every sequence). prep runs attention_bwd_prep
    on (1, Hq, total_q, D) views of O and dO (delta does not depend on the sequences);
    main is attention_bwd_varlen; dq="pass" (deterministic): dq plans
    attention_bwd_dq_varlen; dq="atomic" (Hopper): the main pass adds dQ into an f32 sum
    and dq plans attention_bwd_dq_finish_varlen; None: the target's faster one. Hopper:
    grids (ceil(longest Nk / 128), Hkv, B) and (ceil(longest Nq / 128), Hq, B) (the finish:
    64-row blocks); CDNA: the dense schedule's flat head-first grids
    (attention_bwd_cdna.cdna_bwd_launch) for the longest sequences, dQ by its pass. rows:
    the row stride of lse and delta (default total_q)."""
    from ..targets import get
    t = get(target)
    dq = _dq_of(dq, t)
    _need_shapes(i, ("q", "k"), 3, "(H, total, D)")
    (hq, tq, d), (hkv, _, _) = i["q"].shape, i["k"].shape
    _check_heads(i["q"].shape, i["k"].shape, i["k"].shape)
    batch, cu = packed_offsets(i)
    max_seqlen_q = _max_length(cu, "q", max_seqlen_q)
    max_seqlen_k = _max_length(cu, "k", max_seqlen_k)
    causal = int(overrides.pop("CAUSAL", i.get("CAUSAL", 0)))
    prep = ((-(-tq // 64), hq, 1), {"D": d})
    if t.family == "cdna":
        return prep, *cdna_bwd_launch(batch, hq, hkv, max(1, max_seqlen_q),
                                      max(1, max_seqlen_k), d, t.name, dq, causal,
                                      overrides, packed=True)
    common = {"D": d, "CAUSAL": causal, "STAGES": 2, "TARGET": t.name, **overrides}
    main = ((max(1, -(-max_seqlen_k // 128)), hkv, batch),
            {"BM": 64, "STATS_TMA": stats_tma(rows or tq), "DQ_ATOMIC": int(dq == "atomic"),
             **_walk_consts(dq, d), **common})
    if dq == "atomic":
        return prep, main, _finish_plan(batch, hq, max_seqlen_q, d, t.name)
    return prep, main, ((max(1, -(-max_seqlen_q // 128)), hq, batch), {**common, "BN": 64})


DQ_SCHEDULES = ("pass", "atomic")


def default_dq(target) -> str:
    """The faster dQ schedule of a target: on Hopper the main pass's f32 TMA reductions
    (issued by a producer wave) measured faster than dQ by its own pass (docs/PERF.md); CDNA
    has only the pass."""
    from ..targets import get
    return "atomic" if get(target).family == "hopper" else "pass"


def _dq_of(dq: str | None, target) -> str:
    """A launch's dQ schedule: `dq` checked, or the target's faster one for None."""
    dq = default_dq(target) if dq is None else dq
    if dq not in DQ_SCHEDULES:
        raise ValueError(f"attention backward: dq={dq!r}; choose one of {DQ_SCHEDULES}")
    return dq


def stats_rows(n: int) -> int:
    """The row length to allocate LSE / delta of `n` queries with (viewing the first n) so
    that attention_bwd copies them by TMA, which wants 16-byte row strides: n rounded up to
    4 f32."""
    return -(-n // 4) * 4


def stats_tma(rows: int) -> int:
    """Whether attention_bwd's LSE and delta rows (of `rows` f32 elements, contiguous) can be
    copied by TMA: 2% faster than a producer wave's copy on the H200 (docs/PERF.md)."""
    return int(stats_rows(rows) == rows)


def attention_bwd_launch(i: dict, target, dq: str | None = None, rows: int | None = None,
                         **overrides):
    """(prep, main, dq) launch plans for inputs `i` (q (B, Hq, Nq, D), k (B, Hkv, Nk, D)):
    each (grid, consts). dq="pass": the main pass leaves dQ to `attention_bwd_dq` (a fixed
    order of additions: deterministic), which the third plan launches; dq="atomic": the
    main pass adds dQ into a zeroed f32 sum (dq_sum_shape; its consts say DQ_ATOMIC=1) and
    the third plan launches `attention_bwd_dq_finish`; None: the target's faster one
    (default_dq). rows: the row stride of lse and delta (default Nq; stats_rows(Nq) lets
    TMA copy them). CAUSAL in i or overrides."""
    from ..targets import get
    from .attention import _need_shapes
    t = get(target)
    dq = _dq_of(dq, t)
    _need_shapes(i, ("q", "k"), 4, "(B, H, N, D)")
    (b, hq, nq, d), (_, hkv, nk, _) = i["q"].shape, i["k"].shape
    if d not in (64, 128):
        raise ValueError(f"attention backward: head dim {d} is not supported; 64 or 128")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention backward: {hq} query heads are not a multiple of {hkv} "
                         "key/value heads (GQA groups)")
    causal = int(overrides.pop("CAUSAL", i.get("CAUSAL", 0)))
    prep = ((-(-nq // 64), hq, b), {"D": d})
    if t.family == "cdna":
        return prep, *cdna_bwd_launch(b, hq, hkv, nq, nk, d, t.name, dq, causal, overrides)
    consts = {"D": d, "CAUSAL": causal, "BM": 64, "STAGES": 2,
              "DQ_ATOMIC": int(dq == "atomic"), "TARGET": t.name,
              "STATS_TMA": stats_tma(rows or nq), "STATS_IN_ACC": 3 if d == 128 else 0,
              **_walk_consts(dq, d),
              "LONGEST_FIRST": causal, **overrides}
    if consts["LONGEST_FIRST"] and not causal:
        raise ValueError("attention backward: LONGEST_FIRST orders causal launches")
    main = ((-(-nk // 128) * hkv * b,) if consts["LONGEST_FIRST"] else (-(-nk // 128), hkv, b),
            consts)
    if dq == "atomic":
        return prep, main, _finish_plan(b, hq, nq, d, t.name)
    return prep, main, ((-(-nq // 128), hq, b), {"D": d, "CAUSAL": causal, "BN": 64,
                                                 "STAGES": 2, "TARGET": t.name})


LATE_WALK = True     # False: every launch takes the walk without DV_LATE and SPLIT_MASKED
                     # (bench/attention_bwd.py compares the two through the ops)


def _walk_consts(dq: str, d: int) -> dict:
    """DV_LATE and SPLIT_MASKED of a Hopper launch: on with dQ's atomic schedule (3.0-5.3%
    faster dense main passes on the H200) and at D=64 (2-4%); the deterministic schedule's
    D=128 main pass, which has no dS to wait for, ran 0.3-1.6% slower with them
    (docs/PERF.md)."""
    on = int(LATE_WALK and (dq == "atomic" or d == 64))
    return {"DV_LATE": on, "SPLIT_MASKED": on}


def _finish_plan(b, hq, nq, d, target):
    """(grid, consts) of attention_bwd_dq_finish(_varlen): 64-row query blocks."""
    return (max(1, -(-nq // 64)), hq, b), {"D": d, "TARGET": target}

