"""Attention forward (FlashAttention): O = softmax(Q K^T * scale) V per (batch, head), with
the log-sum-exp of each row (LSE, natural log) for the backward pass.

Tensors are (B, H, N, D) views: the library's callers pass (B, N, H, D) tensors transposed,
so any strides for B, N and H work. Heads of K and V are shared by groups of query heads
(GQA/MQA: Hq a multiple of Hkv). Causal masking is bottom-right aligned (query i sees keys
up to i + Nk - Nq, as FlashAttention does); rows that see no key give O = 0, LSE = -inf.
The softmax runs in base 2: scores are scaled by scale * log2(e) once.

One library kernel, `attention_fwd`; its TARGET constant picks the schedule: Hopper's
warp-specialised FlashAttention-3 form or CDNA's 8-wave ping-pong."""
import math

import pykittens as pk

from .attention_cdna import CDNA_TARGETS, cdna_attention, cdna_launch

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _causal_blocks(blocks, q_end, offset, bn):
    """Key blocks a query block ending (exclusively) at row q_end needs under a causal mask
    whose diagonal is shifted by `offset` (Nk - Nq)."""
    return pk.maximum(pk.minimum(blocks, (q_end + offset + bn - 1) // bn), 0)


def _online_softmax(s, m, l_, scale2, row0, col0, nk, offset, masked, CAUSAL):
    """One key block of the online softmax on this wave's rows: mask the ragged tail (and
    the causal diagonal) where `masked`, update the running max m (in the base-2 domain:
    scores times scale2 = scale * log2 e) and sum l_. Returns P = exp2(s * scale2 - m) and
    the factor alpha that rescales what was accumulated before."""
    with pk.if_(masked):
        cols = pk.col_index(s, col0)
        keep = cols < nk
        if CAUSAL:
            keep = keep & (cols <= pk.row_index(s, row0 + offset))
        pk.where(keep, s, -math.inf, out=s)
    m_new = pk.max(m, pk.row_max(s) * scale2)                # the scale is positive
    base = pk.where(m_new > -math.inf, m_new, 0.0)          # rows with no key so far
    p = pk.exp2(pk.fma(s, scale2, -base))                   # one fused multiply-add each
    alpha = pk.exp2(m - base)
    l_.set(l_ * alpha)
    pk.row_sum(p, into=l_)
    m.set(m_new)
    return p, alpha


def _finish(acc, m, l_):
    """O = acc / l and LSE = (m + log2 l) ln 2, 0 and -inf for rows that saw no key."""
    seen = l_ > 0.0
    inv = pk.where(seen, l_, 1.0)
    out = acc / inv
    lse = pk.where(seen, (m + pk.log2(inv)) * LN2, -math.inf)
    return out, lse


def _hopper(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, STAGES, OVERLAP, PINGPONG, WG):
    """FlashAttention-3 form: a producer warpgroup and WG consumer warpgroups. The producer
    (24 registers) has one wave issue TMA copies: the block's 64 * WG query rows once, then K
    and V blocks into two rings of STAGES stages. Each consumer (the rest of the SM's
    registers) owns 64 query rows: S = Q K^T by wgmma from shared memory, the online softmax
    in registers, P converted in registers into wgmma's A operand for O += P V, and O out
    through shared memory and TMA.

    OVERLAP=1: the softmax of block j runs while the tensor cores compute block j - 1's
    P V (issued right after block j's Q K^T). PINGPONG=1: the consumers take turns issuing
    their matrix products, so one's softmax runs under another's."""
    nq, nk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    bm = 64 * WG
    qb, h, b = pk.program_id(0), pk.program_id(1), pk.program_id(2)
    if CAUSAL:
        qb = pk.num_programs(0) - 1 - qb                 # the longest rows start first
    q0, hk, offset = qb * bm, h // group, nk - nq
    blocks = (nk + BN - 1) // BN
    if CAUSAL:
        blocks = _causal_blocks(blocks, q0 + bm, offset, BN)
    sq = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(WG)]
    q_full = pk.mbarrier(WG)
    kv = pk.st((BN, D), DT, swizzle=8)
    ks = pk.Ring(STAGES, fill=1, drain=4 * WG, t=kv)
    vs = pk.Ring(STAGES, fill=1, drain=4 * WG, t=kv)
    # O leaves through each consumer's Q tile, free once its last Q K^T has retired
    out = [pk.StagedStore((64, D), DT, tile=sq[g]) for g in range(WG)]
    turn = pk.mbarrier(4, count=WG) if PINGPONG else None
    with pk.role(0, 4, regs=24):
        with pk.if_(pk.wave_id() == 0):
            for g in pk.static_range(WG):
                pk.tma_load(sq[g], q, (b, h, q0 + 64 * g, 0), q_full)
            for j in pk.range(blocks):
                for ring, src in ((ks, k), (vs, v)):
                    st = ring.acquire(j)
                    pk.tma_load(st.t, src, (b, hk, j * BN, 0), st.full)
    for g in pk.static_range(WG):
        # the SM's 64K registers: 24 a thread for the producer, the rest shared out
        with pk.role(4 + 4 * g, 4, regs={2: 240, 3: 160}[WG]):
            row0 = q0 + 64 * g + 16 * (pk.wave_id() % 4)
            acc = pk.zeros(pk.rt((16, D), pk.f32, role="acc"))
            m = pk.full(pk.rv(acc, "row"), -math.inf)
            l_ = pk.zeros(pk.rv(acc, "row"))
            s = pk.empty(pk.rt((16, BN), pk.f32, role="acc"))
            scale2 = scale * LOG2E

            def softmax(j):
                col0 = j * BN
                masked = col0 + BN > nk
                if CAUSAL:
                    masked = masked | (col0 + BN > q0 + 64 * g + offset + 1)
                return _online_softmax(s, m, l_, scale2, row0, col0, nk, offset, masked,
                                       CAUSAL)

            def my_turn(r):      # PINGPONG: wait until the previous consumer issued round r
                if PINGPONG and g > 0:            # (consumer 0: the last one's round r - 1)
                    pk.wait(turn[g], r % 2)
                elif PINGPONG and isinstance(r, int):
                    if r > 0:
                        pk.wait(turn[0], (r - 1) % 2)
                elif PINGPONG:
                    with pk.if_(r > 0):
                        pk.wait(turn[0], (r - 1) % 2)

            def your_turn():
                if PINGPONG:
                    pk.arrive(turn[(g + 1) % WG])

            pk.wait(q_full, 0)
            if not OVERLAP:
                for j in pk.range(blocks):
                    my_turn(j)
                    pk.mma_ABt(s, sq[g], ks.wait(j).t, c=0, in_flight=1)
                    your_turn()
                    pk.mma_wait(s)
                    ks.release(j)
                    p, alpha = softmax(j)
                    acc *= alpha
                    pk.mma_AB(acc, pk.convert(pk.rt((16, BN), DT, role="a"), p),
                              vs.wait(j).t)
                    vs.release(j)
            else:
                pa = pk.empty(pk.rt((16, BN), DT, role="a"))     # P of the previous block
                alpha = pk.empty(m.type)                          # ... and its rescale
                with pk.if_(blocks > 0):
                    my_turn(0)
                    pk.mma_ABt(s, sq[g], ks.wait(0).t, c=0)
                    your_turn()
                    ks.release(0)
                    p, _ = softmax(0)
                    pk.convert(pa, p)
                    pk.fill(alpha, 1.0)
                    for j in pk.range(1, blocks):   # Q K_j^T, then P_{j-1} V_{j-1}
                        my_turn(j)
                        pk.mma_ABt(s, sq[g], ks.wait(j).t, c=0, in_flight=1)
                        acc *= alpha                # under Q K_j^T
                        pk.mma_AB(acc, pa, vs.wait(j - 1).t, in_flight=2)
                        your_turn()
                        pk.mma_wait(s, in_flight=1)
                        ks.release(j)           # Q K_j^T has retired
                        p, a_j = softmax(j)     # under P_{j-1} V_{j-1}
                        alpha.set(a_j)
                        pk.mma_wait(acc)
                        vs.release(j - 1)
                        pk.convert(pa, p)
                    my_turn(blocks)
                    acc *= alpha
                    pk.mma_AB(acc, pa, vs.wait(blocks - 1).t)
                    your_turn()
                    vs.release(blocks - 1)
            res, row_lse = _finish(acc, m, l_)
            out[g].store(o, res, (b, h, q0 + 64 * g, 0))
            pk.store(lse, row_lse, (b, h, row0))


@pk.kernel(num_waves=12)
def attention_fwd(q: pk.gl["DT", 4], k: pk.gl["DT", 4], v: pk.gl["DT", 4],
                  o: pk.gl["DT", 4], lse: pk.gl[pk.f32, 3], scale: pk.f32,
                  DT: pk.const = None, D: pk.const = 128, CAUSAL: pk.const = 0,
                  BN: pk.const = 128, STAGES: pk.const = 2, OVERLAP: pk.const = 1,
                  PINGPONG: pk.const = 1, WG: pk.const = 2, TARGET: pk.const = "sm_90a",
                  MAP: pk.const = "head-first", PIN: pk.const = ""):
    """q, o: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D); lse: (B, Hq, Nq) f32; grid
    (ceil(Nq / (64 WG)), Hq, B), 4 (WG + 1) waves on Hopper; on CDNA 8 waves and a grid of
    B Hq ceil(Nq / 256) in the order MAP names (attention_cdna)."""
    if TARGET == "sm_90a":
        _hopper(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, STAGES, OVERLAP, PINGPONG, WG)
    elif TARGET in CDNA_TARGETS:
        cdna_attention(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, MAP, TARGET, PIN=PIN)
    else:
        raise pk.NotSupportedYet(f"attention_fwd has no schedule for {TARGET} yet")


def hopper_schedules(d: int) -> dict:
    """Named alternatives to the Hopper launch defaults for head dim d (what bench/attention.py
    compares): the intra-warpgroup overlap and inter-warpgroup ping-pong on and off, and the
    key block size."""
    out = {"overlap+pingpong": {}, "overlap": {"PINGPONG": 0}, "pingpong": {"OVERLAP": 0},
           "plain": {"OVERLAP": 0, "PINGPONG": 0},
           "overlap+pingpong, 3 stages": {"STAGES": 3},
           "overlap, 3 stages": {"PINGPONG": 0, "STAGES": 3}}
    if d == 64:
        out["3 consumers, overlap+pingpong"] = {"WG": 3, "num_waves": 16}
        out["3 consumers, overlap"] = {"WG": 3, "num_waves": 16, "PINGPONG": 0}
        out["3 consumers, overlap, 3 stages"] = {"WG": 3, "num_waves": 16, "PINGPONG": 0,
                                                 "STAGES": 3}
    return out


def attention_fwd_launch(i: dict, target, **overrides):
    """(grid, consts) of attention_fwd for inputs `i` (q (B, Hq, Nq, D), k (B, Hkv, Nk, D),
    and the compile-time choice CAUSAL in i or overrides). Checks what the kernels support
    and says so: head dims 64 and 128, Hq a multiple of Hkv, 16-bit element types."""
    from ..targets import get
    t = get(target)
    (b, hq, nq, d), (bk, hkv, nk, dk) = i["q"].shape, i["k"].shape
    if d != dk or tuple(i["v"].shape) != (bk, hkv, nk, d) or bk != b:
        raise ValueError(f"attention: q {tuple(i['q'].shape)}, k {tuple(i['k'].shape)} and "
                         f"v {tuple(i['v'].shape)} must agree in batch, head dim and (k, v) "
                         "sequence length")
    if d not in (64, 128):
        raise ValueError(f"attention: head dim {d} is not supported; the kernels take 64 "
                         "or 128")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention: {hq} query heads are not a multiple of {hkv} key/value "
                         "heads (GQA groups)")
    causal = int(overrides.pop("CAUSAL", i.get("CAUSAL", 0)))
    if t.family != "hopper":
        return cdna_launch(b, hq, nq, d, t.name, CAUSAL=causal, **overrides)
    consts = {"D": d, "CAUSAL": causal, "BN": 128, "STAGES": 2, "OVERLAP": 1,
              "PINGPONG": 1, "WG": 2, "num_waves": 12, "TARGET": t.name, **overrides}
    return (-(-nq // (64 * consts["WG"])), hq, b), consts
