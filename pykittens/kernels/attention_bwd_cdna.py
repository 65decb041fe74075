"""The CDNA schedule of the attention backward (gfx942, gfx950): 4 waves a workgroup, one
per SIMD, each wave's matrix products interleaved with its exponentials, elementwise work
and LDS reads (HipKittens' 4-wave interleave).

`attention_bwd` (cdna_bwd): one workgroup per block of 128 keys of one key/value head and
batch walks every 32-row query block of the whole group of query heads that share them.
Wave w owns keys 32w..32w+31 of the block and keeps dK^T and dV^T (D x 32, f32) pinned in
AGPRs for the whole walk, so the group's sum never leaves registers; K and V of its keys
stay in VGPRs. The products are not transposed, S = Q K^T (queries x keys): the MFMA
accumulator then holds one key per lane and the queries in runs of 4, which is the krun=4 B
operand of dV^T += dO^T P and dK^T += Q^T dS, whose A operands dO^T and Q^T are read from
LDS with krun=4 (ds_read_b64_tr_b16 on gfx950): P and dS never move between lanes. (The
forward transposes to keep its softmax reductions in lanes; the backward reduces nothing
over keys, delta = rowsum(dO O) coming from attention_bwd_prep.) A step:

    memory    fetch Q_{i+1}, dO_{i+1} into LDS (direct), LSE_i and delta_i into registers
    compute   S = Q_i K^T                    | Q_i: LDS -> registers
              dP = dO_i V^T                  | dO_i: LDS; P = exp2(S scale log2 e - LSE log2 e)
    (mask)    P = 0 past the causal diagonal and past Nk, on the blocks that reach them
    compute   dV^T += dO_i^T P               | dO_i^T: LDS; dS = P (dP - delta)
              dK^T += Q_i^T dS               | Q_i^T: LDS

dQ has its own pass, `attention_bwd_dq` (cdna_bwd_dq): one workgroup per 128 query rows of
one head, 32 rows a wave, walks the key blocks in order in the forward's transposed form:
S^T = K Q^T and dP^T = V dO^T put the queries along the lanes, so dS^T is the krun=4 B
operand of dQ^T += K^T dS^T (K^T from LDS with krun=4), dQ^T stays in AGPRs and is stored
once: a fixed order of additions, deterministic. Adding dQ into an f32 tensor from the main
pass instead (dq="atomic") is not offered on CDNA: with dQ's product and atomics beside dK
and dV, that pass needs more scalar registers than a wave has, and LLVM spills them.

Packed batches (attention_bwd_varlen, attention_bwd_dq_varlen) run the same two bodies over
the forward's packed geometry (attention_cdna._Packed, given cu_q / cu_k): a sequence's
rows start at its offsets, the rows read past its end (the next sequence's) are masked,
and the stores stop at its end."""
from __future__ import annotations

import contextlib
import math

import pykittens as pk

from .attention import _causal_blocks
from .attention_cdna import LOG2E, MAPS, _clamp, sequences

WAVES = 4
KEYS_PER_WAVE = 32             # the N of one 32x32 MFMA tile of S
BLOCK_KEYS = WAVES * KEYS_PER_WAVE
BLOCK_Q = 32                   # query rows per step of the walk (the M of S)
DQ_ROWS = 32                   # query rows per wave of the dQ pass
DQ_BLOCK_KEYS = 32             # keys per block of the dQ pass
ATOMIC_DQ_UNSUPPORTED = (
    "dq='atomic' is not available on {target}: its main pass, with dQ's product and f32 "
    "atomics beside dK and dV, needs more scalar registers than a wave has (LLVM spills "
    "them); use dq='pass', the default (deterministic)")


class _Interleave:
    """The 4-wave interleave of a 32x32 product of D / K MFMAs (K or M of the product = D,
    16-bit operands): per MFMA the LDS reads of its operand slice, the MFMA, then some
    elementwise work. The read counts come from the target's facts: the MFMA's K, and
    whether LDS reads transpose (four 16-bit values a read) or must read K runs that go
    down a column one element at a time."""

    def __init__(self, TARGET, DT, D):
        from pykittens.targets import get
        t = get(TARGET)
        self.k = next(i.k for i in t.mma if (i.m, i.n, i.ab_dtype) ==
                      (32, 32, pk.dtype_of(DT).name))
        self.mfmas = D // self.k                       # of one product with K or M = D
        # a lane's K / 2 values of one MFMA: in 16-byte reads from a row operand; from a
        # K x M one, four a transposing read, else one a read
        self.rows = max(1, self.k // 16)
        self.cols = self.k // 8 if t.lds_read_tr16 else self.k // 2

    def __call__(self, reads, valu=0, trans=0):
        group = [("ds_read", reads), ("mfma", 1)]
        group += [("valu", valu)] if valu else []
        group += [("trans", trans)] if trans else []
        pk.interleave(group, repeat=self.mfmas)


@contextlib.contextmanager
def _compute():
    """A cluster of matrix products at raised priority, kept together by sched_barriers."""
    pk.sched_barrier()
    pk.setprio(1)
    yield
    pk.setprio(0)
    pk.sched_barrier()


def cdna_bwd(q, k, v, do, lse, delta, dk, dv, scale, DT, D, CAUSAL, BM, DQ_ATOMIC, MAP,
             TARGET, cu_q=None, cu_k=None):
    """The body of attention_bwd on CDNA (dK, dV). Grid: B Hkv ceil(Nk / 128) workgroups,
    head-first (those of one key/value head read the same Q and dO: one XCD's L2).

    With cu_q / cu_k, the body of attention_bwd_varlen: the packed geometry of the forward
    (attention_cdna._Packed) over B Hkv ceil(longest Nk / 128) workgroups, those past a
    shorter sequence's keys idle. The query blocks of the walk then read on past the
    sequence's last query into the next sequence's rows: their LSE reads stop at the
    sequence's end (+inf past it, so P = 0 there, as past Nq), and dK, dV are stored up to
    the sequence's last key."""
    if DQ_ATOMIC:
        raise pk.NotSupportedYet("attention_bwd: " + ATOMIC_DQ_UNSUPPORTED.format(
            target=TARGET))
    if BM != BLOCK_Q:
        raise pk.KernelError(f"attention_bwd on CDNA walks {BLOCK_Q}-row query blocks, "
                             f"not BM={BM}")
    seq = sequences(q, k, MAP, TARGET, cu_q, cu_k, rows=BLOCK_KEYS, keys=True, clamp=True)
    nq, nk, group, hk = seq.nq, seq.nk, seq.group, seq.hk
    offset, k0 = nk - nq, seq.block * BLOCK_KEYS
    key0 = k0 + pk.wave_id() * KEYS_PER_WAVE           # this wave's first key
    # per head, the query blocks that see a key of this block: causal, from the diagonal on
    first = pk.maximum(k0 - offset, 0) // BM if CAUSAL else 0
    per_head = pk.maximum((nq + BM - 1) // BM - first, 1)
    live = nq > 0
    if seq.packed:                                     # key blocks past a shorter sequence
        live = live & (k0 < nk)
    steps = pk.where(live, group * per_head, 0)
    scale2 = scale * LOG2E
    interleave = _Interleave(TARGET, DT, D)

    def block(step):
        """(query head, first query row) of a step of the walk."""
        return _clamp(hk * group + step // per_head, seq.heads), \
            (first + step % per_head) * BM

    qs = pk.empty(pk.st((BM, D), DT), count=2)
    dos = pk.empty(pk.st((BM, D), DT), count=2)

    def fetch(step):
        h, q0 = block(step)
        pk.load(qs[step % 2], q, seq.qo(q0, h), direct=True)
        pk.load(dos[step % 2], do, seq.qo(q0, h), direct=True)

    s_t = pk.rt((BM, KEYS_PER_WAVE), pk.f32, role="acc")           # queries x keys
    dk_t = pk.zeros(pk.rt((D, KEYS_PER_WAVE), pk.f32, role="acc", pin="a0"))
    dv_t = pk.zeros(pk.rt((D, KEYS_PER_WAVE), pk.f32, role="acc", pin=f"a{D // 2}"))
    k_b = pk.load(pk.rt((KEYS_PER_WAVE, D), DT, "row", role="b"), k, seq.kv(key0))
    v_b = pk.load(pk.rt((KEYS_PER_WAVE, D), DT, "row", role="b"), v, seq.kv(key0))
    row_a = pk.rt((BM, D), DT, "row", role="a")                       # Q, dO
    col_a = pk.rt((BM, D), DT, "col", role="a", krun=4)               # Q^T, dO^T (K x M)
    col_b = pk.rt((BM, KEYS_PER_WAVE), DT, "col", role="b", krun=4)   # P, dS (K x N)
    fetch(0)
    for step in pk.range(steps):
        h, q0 = block(step)
        st = step % 2
        pk.barrier()                       # step's Q, dO landed; the other stage is free
        with pk.if_(step + 1 < steps):
            fetch(step + 1)
        # rows past Nq read LSE = +inf, so P = 0 there; packed, the rows past the
        # sequence's end too (the next sequence's: the query mask), while their delta,
        # finite, meets P = 0
        lse2 = pk.load(pk.rv(s_t, "row"), lse, seq.lse(q0, h), fill=math.inf,
                       end=seq.end_lse) * LOG2E
        delta_r = pk.load(pk.rv(s_t, "row"), delta, seq.lse(q0, h))
        with _compute():
            s = pk.mma_ABt(pk.empty(s_t), pk.load(row_a, qs[st], (0, 0)), k_b, c=0)
            interleave(interleave.rows)
            dp = pk.mma_ABt(pk.empty(s_t), pk.load(row_a, dos[st], (0, 0)), v_b, c=0)
            p = pk.exp2(pk.fma(s, scale2, -lse2))                         # under dP's MFMAs
            interleave(interleave.rows, valu=1, trans=2)
        masked = key0 + KEYS_PER_WAVE > nk
        if CAUSAL:
            masked = masked | (key0 + KEYS_PER_WAVE - 1 > q0 + offset)
        with pk.if_(masked):               # rows seeing no key have LSE = -inf: masked here
            keys, queries = pk.col_index(s_t, key0), pk.row_index(s_t, q0)
            keep = keys < nk
            if CAUSAL:
                keep = keep & (keys <= queries + offset)
            pk.where(keep, p, 0.0, out=p)
        with _compute():
            pk.mma_AtB(dv_t, pk.load(col_a, dos[st], (0, 0)), pk.convert(col_b, p))
            ds = pk.convert(col_b, p * (dp - delta_r))                    # under dV's MFMAs
            interleave(interleave.cols, valu=3)
            pk.mma_AtB(dk_t, pk.load(col_a, qs[st], (0, 0)), ds)
            interleave(interleave.cols)
    pk.store(dk, pk.transpose(dk_t * scale).cast(DT), seq.kv(key0), end=seq.end_kv)
    pk.store(dv, pk.transpose(dv_t).cast(DT), seq.kv(key0), end=seq.end_kv)


def cdna_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, MAP, TARGET,
                cu_q=None, cu_k=None):
    """The body of attention_bwd_dq on CDNA. Grid: B Hq ceil(Nq / 128) workgroups in the
    forward's head-first order, causal ones longest rows first. With cu_q / cu_k, the body
    of attention_bwd_dq_varlen (the forward's packed geometry, B Hq ceil(longest Nq / 128)
    workgroups): keys past the sequence's end are masked as past Nk, queries past it read
    LSE = +inf (P = 0) as past Nq, and dQ is stored up to the sequence's end."""
    if BN != DQ_BLOCK_KEYS:
        raise pk.KernelError(f"attention_bwd_dq on CDNA walks {DQ_BLOCK_KEYS}-key blocks, "
                             f"not BN={BN}")
    block_q = DQ_ROWS * WAVES
    seq = sequences(q, k, MAP, TARGET, cu_q, cu_k, rows=block_q, clamp=True)
    nq, nk, qb, hk = seq.nq, seq.nk, seq.block, seq.hk
    offset = nk - nq
    if CAUSAL:
        qb = seq.blocks - 1 - qb
    row0 = qb * block_q + pk.wave_id() * DQ_ROWS        # this wave's first query row
    blocks = (nk + BN - 1) // BN
    if CAUSAL:                                          # the keys the last row sees
        blocks = _causal_blocks(blocks, qb * block_q + block_q, offset, BN)
    if seq.packed:                                      # query blocks past a short sequence
        blocks = pk.where(qb * block_q < nq, blocks, 0)
    scale2 = scale * LOG2E
    interleave = _Interleave(TARGET, DT, D)

    ks = pk.empty(pk.st((BN, D), DT), count=2)
    vs = pk.empty(pk.st((BN, D), DT), count=2)

    def fetch(j):
        pk.load(ks[j % 2], k, seq.kv(j * BN), direct=True)
        pk.load(vs[j % 2], v, seq.kv(j * BN), direct=True)

    t_t = pk.rt((BN, DQ_ROWS), pk.f32, role="acc")                    # keys x queries
    q_b = pk.load(pk.rt((DQ_ROWS, D), DT, "row", role="b"), q, seq.qo(row0))
    do_b = pk.load(pk.rt((DQ_ROWS, D), DT, "row", role="b"), do, seq.qo(row0))
    # rows past Nq read LSE = +inf, so P = 0 there; packed, the rows past the sequence's
    # end too (the next sequence's, whose dQ is dropped: no inf or NaN in their columns)
    lse2 = pk.load(pk.rv(t_t, "col"), lse, seq.lse(row0), fill=math.inf,
                   end=seq.end_lse) * LOG2E
    delta_c = pk.load(pk.rv(t_t, "col"), delta, seq.lse(row0))
    dq_t = pk.zeros(pk.rt((D, DQ_ROWS), pk.f32, role="acc", pin="a0"))   # dQ^T
    row_a = pk.rt((BN, D), DT, "row", role="a")                          # K, V
    col_a = pk.rt((BN, D), DT, "col", role="a", krun=4)                  # K^T (K x M)
    fetch(0)
    for j in pk.range(blocks):
        st = j % 2
        pk.barrier()                       # block j landed; the other stage is free
        with pk.if_(j + 1 < blocks):
            fetch(j + 1)
        with _compute():
            s_t = pk.mma_ABt(pk.empty(t_t), pk.load(row_a, ks[st], (0, 0)), q_b, c=0)
            interleave(interleave.rows)
            dp_t = pk.mma_ABt(pk.empty(t_t), pk.load(row_a, vs[st], (0, 0)), do_b, c=0)
            p_t = pk.exp2(pk.fma(s_t, scale2, -lse2))                   # under dP^T's MFMAs
            interleave(interleave.rows, valu=1, trans=2)
        masked = j * BN + BN > nk
        if CAUSAL:
            masked = masked | (j * BN + BN - 1 > row0 + offset)
        with pk.if_(masked):
            # the first key each query does not see: Nk, or its causal limit
            limit = pk.min(pk.col_index(t_t, row0 + offset + 1), nk) if CAUSAL else nk
            pk.where(pk.row_index(t_t, j * BN) - limit < 0, p_t, 0.0, out=p_t)
        ds_t = pk.convert(pk.rt((BN, DQ_ROWS), DT, "col", role="b", krun=4),
                          p_t * (dp_t - delta_c))
        with _compute():
            pk.mma_AtB(dq_t, pk.load(col_a, ks[st], (0, 0)), ds_t)        # dQ^T += K^T dS^T
            interleave(interleave.cols)
    pk.store(dq, pk.transpose(dq_t * scale).cast(DT), seq.qo(row0), end=seq.end)


def cdna_bwd_launch(batch, hq, hkv, nq, nk, d, target, dq, causal, overrides, packed=False):
    """(main, dq) plans of attention_bwd_launch on a CDNA target: 4 waves, flat head-first
    grids of B Hkv ceil(Nk / 128) and B Hq ceil(Nq / 128) workgroups. packed=True: those of
    attention_bwd_varlen_launch, Nq and Nk the longest sequences' (whose main plan leaves
    DQ_ATOMIC at the packed kernel's default, 0). Only dq="pass": the atomic schedule is
    refused here for both."""
    if dq != "pass":
        raise ValueError("attention backward: " + ATOMIC_DQ_UNSUPPORTED.format(target=target))
    mapping = overrides.pop("MAP", "head-first")
    if mapping not in MAPS:
        raise ValueError(f"attention backward: grid mapping {mapping!r} is not one of {MAPS}")
    common = {"D": d, "CAUSAL": causal, "MAP": mapping, "num_waves": WAVES, "TARGET": target}
    main = ((batch * hkv * -(-nk // BLOCK_KEYS),),
            {**common, "BM": BLOCK_Q, **({} if packed else {"DQ_ATOMIC": 0}), **overrides})
    dq_plan = ((batch * hq * -(-nq // (DQ_ROWS * WAVES)),), {**common, "BN": DQ_BLOCK_KEYS})
    return main, dq_plan
