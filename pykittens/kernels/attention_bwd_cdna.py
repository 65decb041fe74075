"""The CDNA schedule of the attention backward (gfx942, gfx950): 4 waves a workgroup, each
wave's matrix products interleaved with its exponentials and memory traffic.

`attention_bwd` (cdna_bwd): one workgroup per block of 128 keys of one key/value head and
batch walks every 32-row query block of the whole group of query heads that share them.
Wave w owns keys 32w..32w+31 of the block and keeps dK^T and dV^T (D x 32, f32) in AGPRs for
the whole walk, so the group's sum never leaves registers. It computes the products
non-transposed, S = Q K^T (queries x keys): the MFMA accumulator then holds one key per lane
and the queries in runs of 4, which is the krun=4 B operand of dV^T += dO^T P and
dK^T += Q^T dS, whose A operands (dO^T, Q^T) are read from LDS with krun=4: P and dS never
move between lanes. The backward needs no reduction over keys (delta = rowsum(dO O) comes
from attention_bwd_prep), so the forward's reason for S^T does not apply here. A step:

    memory    Q_i, dO_i: LDS -> registers            | fetch Q_{i+1}, dO_{i+1} into LDS
    compute   S = Q_i K^T, dP = dO_i V^T             | LSE_i, delta_i
    (mask)    P = exp2(S scale log2 e - LSE log2 e), zero past the causal diagonal / Nk
    compute   dV^T += dO_i^T P, dK^T += Q_i^T dS     | dS = P (dP - delta), Q^T, dO^T: LDS
    dQ        (atomic schedule) dS -> LDS; dQ_i[:, 32w/64w..] += dS K, added into f32 dq

With DQ_ATOMIC=0, dQ is left to `attention_bwd_dq` (cdna_bwd_dq): one workgroup per 128
query rows of one head, 32 rows a wave, walks the key blocks in order in the transposed form
of the forward: S^T = K Q^T and dP^T = V dO^T put the queries along the lanes, so dS^T is the
krun=4 B operand of dQ^T += K^T dS^T (K^T from LDS with krun=4), and dQ is stored once."""
from __future__ import annotations

import contextlib
import math

import pykittens as pk

from .attention import _causal_blocks
from .attention_cdna import LOG2E, _xcds, cdna_grid

WAVES = 4
KEYS_PER_WAVE = 32             # the N of one 32x32 MFMA tile of S
BLOCK_KEYS = WAVES * KEYS_PER_WAVE
BLOCK_Q = 32                   # query rows per step of the walk (the M of S)
DQ_ROWS = 32                   # query rows per wave of the dQ pass
DQ_BLOCK_KEYS = 32             # keys per block of the dQ pass


@contextlib.contextmanager
def _compute():
    """Matrix products at raised priority, their instructions kept together (a wave on
    the same SIMD issues its memory work meanwhile)."""
    pk.sched_barrier()
    pk.setprio(1)
    yield
    pk.setprio(0)
    pk.sched_barrier()


def cdna_bwd(q, k, v, do, lse, delta, dq, dk, dv, scale, DT, D, CAUSAL, BM, DQ_ATOMIC, MAP,
             TARGET):
    """The body of attention_bwd on CDNA. Grid: B Hkv ceil(Nk / 128) workgroups, head-first
    (the workgroups of one key/value head, which read the same Q and dO, run on one XCD)."""
    if BM != BLOCK_Q:
        raise pk.KernelError(f"attention_bwd on CDNA walks {BLOCK_Q}-row query blocks, "
                             f"not BM={BM}")
    batch, hq, nq, _ = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    k_blocks = (nk + BLOCK_KEYS - 1) // BLOCK_KEYS
    b, hk, kb = cdna_grid(pk.program_id(0), batch, hkv, k_blocks, 1, _xcds(TARGET), MAP)
    # in range by construction; clamped, the compiler knows it, and drops the range checks
    # of every access (the loop then keeps no mask of them in scalar registers)
    b = pk.maximum(pk.minimum(b, batch - 1), 0)
    hk = pk.maximum(pk.minimum(hk, hkv - 1), 0)
    offset, k0 = nk - nq, kb * BLOCK_KEYS
    w = pk.wave_id()
    key0 = k0 + w * KEYS_PER_WAVE                      # this wave's first key
    # query blocks of one head that see a key of this block: causal, from the diagonal on
    first = pk.maximum(k0 - offset, 0) // BM if CAUSAL else 0
    per_head = pk.maximum((nq + BM - 1) // BM - first, 1)
    steps = pk.where(nq > 0, group * per_head, 0)
    scale2 = scale * LOG2E

    def block(step):
        """(query head, first query row) of a step of the walk."""
        h = pk.maximum(pk.minimum(hk * group + step // per_head, hq - 1), 0)   # (clamped)
        return h, (first + step % per_head) * BM

    qs = pk.empty(pk.st((BM, D), DT), count=2)
    dos = pk.empty(pk.st((BM, D), DT), count=2)
    dq_cols = D // WAVES                               # dQ columns per wave (atomic)
    dq_mma = 16 if dq_cols < 32 else None
    sds = pk.empty(pk.st((BM, BLOCK_KEYS), DT)) if DQ_ATOMIC else None

    def fetch(step):
        h, q0 = block(step)
        pk.load(qs[step % 2], q, (b, h, q0, 0), direct=True)
        pk.load(dos[step % 2], do, (b, h, q0, 0), direct=True)

    s_t = pk.rt((BM, KEYS_PER_WAVE), pk.f32, role="acc")           # queries x keys
    dk_t = pk.zeros(pk.rt((D, KEYS_PER_WAVE), pk.f32, role="acc", pin="a0"))
    dv_t = pk.zeros(pk.rt((D, KEYS_PER_WAVE), pk.f32, role="acc", pin=f"a{D // 2}"))
    k_b = pk.load(pk.rt((KEYS_PER_WAVE, D), DT, "row", role="b"), k, (b, hk, key0, 0))
    v_b = pk.load(pk.rt((KEYS_PER_WAVE, D), DT, "row", role="b"), v, (b, hk, key0, 0))
    k_dq = []                        # (atomic) the block's 128 keys, this wave's columns
    for c in pk.static_range(WAVES if DQ_ATOMIC else 0):
        # through LDS, 32 keys at a time (a gather from memory holds a lane mask per element)
        pk.load(qs[1], k, (b, hk, k0 + c * KEYS_PER_WAVE, 0), direct=True)
        pk.barrier()
        k_dq.append(pk.load(pk.rt((KEYS_PER_WAVE, dq_cols), DT, "col", role="b", mma=dq_mma),
                            qs[1], (0, w * dq_cols)))
        pk.barrier()
    operand_t = pk.rt((BM, KEYS_PER_WAVE), DT, "col", role="b", krun=4)
    transposed_t = pk.rt((BM, D), DT, "col", role="a", krun=4)        # Q^T, dO^T (K x M)
    operand_a = pk.rt((BM, D), DT, "row", role="a")                   # Q, dO
    fetch(0)
    for step in pk.range(steps):
        h, q0 = block(step)
        st = step % 2
        pk.barrier()                       # step's Q, dO landed; the other stage is free
        with pk.if_(step + 1 < steps):
            fetch(step + 1)
        lse_r = pk.load(pk.rv(s_t, "row"), lse, (b, h, q0), fill=math.inf)
        delta_r = pk.load(pk.rv(s_t, "row"), delta, (b, h, q0))
        with _compute():
            s = pk.mma_ABt(pk.empty(s_t), pk.load(operand_a, qs[st], (0, 0)), k_b, c=0)
            dp = pk.mma_ABt(pk.empty(s_t), pk.load(operand_a, dos[st], (0, 0)), v_b, c=0)
            pk.interleave([("ds_read", 2), ("mfma", 1)], repeat=2 * D // 8)
        # rows past Nq read LSE = +inf: P = 0 there
        p = pk.exp2(pk.fma(s, scale2, -(lse_r * LOG2E)))
        masked = key0 + KEYS_PER_WAVE > nk
        if CAUSAL:
            masked = masked | (key0 + KEYS_PER_WAVE - 1 > q0 + offset)
        with pk.if_(masked):               # rows seeing no key have LSE = -inf: masked here
            keys, queries = pk.col_index(s_t, key0), pk.row_index(s_t, q0)
            keep = keys < nk
            if CAUSAL:
                keep = keep & (keys <= queries + offset)
            pk.where(keep, p, 0.0, out=p)
        ds = p * (dp - delta_r)
        with _compute():
            pk.mma_AtB(dv_t, pk.load(transposed_t, dos[st], (0, 0)), pk.convert(operand_t, p))
            pk.mma_AtB(dk_t, pk.load(transposed_t, qs[st], (0, 0)), pk.convert(operand_t, ds))
            pk.interleave([("ds_read", 4), ("mfma", 1)], repeat=2 * D // 8)
        if DQ_ATOMIC:
            pk.store(sds, ds.cast(DT), (0, w * KEYS_PER_WAVE))
            pk.barrier()
            part = pk.empty(pk.rt((BM, dq_cols), pk.f32, role="acc", mma=dq_mma))
            with _compute():
                for c in pk.static_range(WAVES):
                    ds_a = pk.load(pk.rt((BM, KEYS_PER_WAVE), DT, "row", role="a", mma=dq_mma),
                                   sds, (0, c * KEYS_PER_WAVE))
                    pk.mma_AB(part, ds_a, k_dq[c], c=0 if c == 0 else None)
            pk.atomic_add(dq, part * scale, (b, h, q0, w * dq_cols))
    pk.store(dk, pk.transpose(dk_t * scale).cast(DT), (b, hk, key0, 0))
    pk.store(dv, pk.transpose(dv_t).cast(DT), (b, hk, key0, 0))


def cdna_bwd_dq(q, k, v, do, lse, delta, dq, scale, DT, D, CAUSAL, BN, MAP, TARGET):
    """The body of attention_bwd_dq on CDNA. Grid: B Hq ceil(Nq / 128) workgroups in the
    forward's head-first order."""
    if BN != DQ_BLOCK_KEYS:
        raise pk.KernelError(f"attention_bwd_dq on CDNA walks {DQ_BLOCK_KEYS}-key blocks, "
                             f"not BN={BN}")
    batch, heads, nq, _ = q.shape
    nk = k.shape[2]
    group = heads // k.shape[1]
    block_q = DQ_ROWS * WAVES
    q_blocks = (nq + block_q - 1) // block_q
    b, h, qb = cdna_grid(pk.program_id(0), batch, heads, q_blocks, group, _xcds(TARGET), MAP)
    b = pk.maximum(pk.minimum(b, batch - 1), 0)        # (clamped: see cdna_bwd)
    h = pk.maximum(pk.minimum(h, heads - 1), 0)
    qb = pk.maximum(pk.minimum(qb, q_blocks - 1), 0)
    hk, offset = h // group, nk - nq
    if CAUSAL:
        qb = q_blocks - 1 - qb                         # the longest rows start first
    row0 = qb * block_q + pk.wave_id() * DQ_ROWS
    blocks = (nk + BN - 1) // BN
    if CAUSAL:                                         # the keys the workgroup's last row sees
        blocks = _causal_blocks(blocks, qb * block_q + block_q, offset, BN)
    scale2 = scale * LOG2E

    ks = pk.empty(pk.st((BN, D), DT), count=2)
    vs = pk.empty(pk.st((BN, D), DT), count=2)

    def fetch(j):
        pk.load(ks[j % 2], k, (b, hk, j * BN, 0), direct=True)
        pk.load(vs[j % 2], v, (b, hk, j * BN, 0), direct=True)

    t_t = pk.rt((BN, DQ_ROWS), pk.f32, role="acc")                    # keys x queries
    q_b = pk.load(pk.rt((DQ_ROWS, D), DT, "row", role="b"), q, (b, h, row0, 0))
    do_b = pk.load(pk.rt((DQ_ROWS, D), DT, "row", role="b"), do, (b, h, row0, 0))
    lse2 = pk.load(pk.rv(t_t, "col"), lse, (b, h, row0), fill=math.inf) * LOG2E
    delta_c = pk.load(pk.rv(t_t, "col"), delta, (b, h, row0))
    dq_t = pk.zeros(pk.rt((D, DQ_ROWS), pk.f32, role="acc", pin="a0"))   # dQ^T, in AGPRs
    fetch(0)
    for j in pk.range(blocks):
        st = j % 2
        pk.barrier()
        with pk.if_(j + 1 < blocks):
            fetch(j + 1)
        operand_a = pk.rt((BN, D), DT, "row", role="a")
        with _compute():
            s_t = pk.mma_ABt(pk.empty(t_t), pk.load(operand_a, ks[st], (0, 0)), q_b, c=0)
            dp_t = pk.mma_ABt(pk.empty(t_t), pk.load(operand_a, vs[st], (0, 0)), do_b, c=0)
            pk.interleave([("ds_read", 2), ("mfma", 1)], repeat=2 * D // 8)
        p_t = pk.exp2(pk.fma(s_t, scale2, -lse2))
        masked = j * BN + BN > nk
        if CAUSAL:
            masked = masked | (j * BN + BN - 1 > row0 + offset)
        with pk.if_(masked):
            # the first key each query does not see: Nk, or its causal limit
            limit = pk.min(pk.col_index(t_t, row0 + offset + 1), nk) if CAUSAL else nk
            pk.where(pk.row_index(t_t, j * BN) - limit < 0, p_t, 0.0, out=p_t)
        ds_t = pk.convert(pk.rt((BN, DQ_ROWS), DT, "col", role="b", krun=4),
                          p_t * (dp_t - delta_c))
        with _compute():                                                  # dQ^T += K^T dS^T
            pk.mma_AtB(dq_t, pk.load(pk.rt((BN, D), DT, "col", role="a", krun=4), ks[st],
                                     (0, 0)), ds_t)
            pk.interleave([("ds_read", 4), ("mfma", 1)], repeat=D // 8)
    pk.store(dq, pk.transpose(dq_t * scale).cast(DT), (b, h, row0, 0))


def cdna_bwd_launch(batch, hq, hkv, nq, nk, d, target, dq, causal, overrides):
    """(main, dq) plans of attention_bwd_launch on a CDNA target: 4 waves, flat head-first
    grids; the dQ pass's plan is None with dq="atomic"."""
    from .attention_cdna import MAPS
    mapping = overrides.pop("MAP", "head-first")
    if mapping not in MAPS:
        raise ValueError(f"attention backward: grid mapping {mapping!r} is not one of {MAPS}")
    common = {"D": d, "CAUSAL": causal, "MAP": mapping, "num_waves": WAVES, "TARGET": target}
    main = ((batch * hkv * -(-nk // BLOCK_KEYS),),
            {**common, "BM": BLOCK_Q, "DQ_ATOMIC": int(dq == "atomic"), **overrides})
    dq_plan = ((batch * hq * -(-nq // (DQ_ROWS * WAVES)),), {**common, "BN": DQ_BLOCK_KEYS}) \
        if dq == "pass" else None
    return main, dq_plan
