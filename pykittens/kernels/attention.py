"""Attention forward (FlashAttention): O = softmax(Q K^T * scale) V per (batch, head), with
the log-sum-exp of each row (LSE, natural log) for the backward pass.

Tensors are (B, H, N, D) views: the library's callers pass (B, N, H, D) tensors transposed,
so any strides for B, N and H work. Heads of K and V are shared by groups of query heads
(GQA/MQA: Hq a multiple of Hkv). Causal masking is bottom-right aligned (query i sees keys
up to i + Nk - Nq, as FlashAttention does); rows that see no key give O = 0, LSE = -inf.
The softmax runs in base 2: scores are scaled by scale * log2(e) once.

One library kernel, `attention_fwd`; its TARGET constant (pk.target: the target being compiled
for) picks the schedule: Hopper's
warp-specialised FlashAttention-3 form or CDNA's 8-wave ping-pong."""
import math

import pykittens as pk
from pykittens.chiplet import mapping as chip

from .attention_cdna import CDNA_TARGETS, cdna_attention, cdna_launch
from .pipeline import consumer_regs

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _causal_blocks(blocks, q_end, offset, bn):
    """Key blocks a query block ending (exclusively) at row q_end needs under a causal mask
    whose diagonal is shifted by `offset` (Nk - Nq)."""
    return pk.maximum(pk.minimum(blocks, (q_end + offset + bn - 1) // bn), 0)


def _online_softmax(s, m, l_, alpha, scale2, row0, col0, nk, offset, masked, CAUSAL, LAZY):
    """One key block of the online softmax on this wave's rows: mask the ragged tail (and
    the causal diagonal) where `masked`, update the running max m (in the base-2 domain:
    scores times scale2 = scale * log2 e) and sum l_, set `alpha`, the factor that rescales
    what was accumulated before, and return P = exp2(s * scale2 - m).

    LAZY=1: the max moves only when some row of the wave would grow by more than 8 (so P
    stays below 2^8, far from overflow); otherwise alpha is 1 and the rescale is skipped."""
    with pk.if_(masked):
        cols = pk.col_index(s, col0)
        keep = cols < nk
        if CAUSAL:
            keep = keep & (cols <= pk.row_index(s, row0 + offset))
        pk.where(keep, s, -math.inf, out=s)
    m_new = pk.max(m, pk.row_max(s) * scale2)                # the scale is positive

    def move():
        base = pk.where(m_new > -math.inf, m_new, 0.0)      # rows with no key so far
        alpha.set(pk.exp2(m - base))
        l_.set(l_ * alpha)
        m.set(m_new)

    if LAZY:
        pk.fill(alpha, 1.0)
        with pk.if_(pk.any(m_new > m + 8.0)):
            move()
    else:
        move()
    p = pk.exp2(pk.fma(s, scale2, -pk.where(m > -math.inf, m, 0.0)))   # one FFMA each
    pk.row_sum(p, into=l_)
    return p


def _finish(acc, m, l_):
    """O = acc / l and LSE = (m + log2 l) ln 2, 0 and -inf for rows that saw no key."""
    seen = l_ > 0.0
    inv = pk.where(seen, l_, 1.0)
    out = acc / inv
    lse = pk.where(seen, (m + pk.log2(inv)) * LN2, -math.inf)
    return out, lse


def hopper_flat_grid(MAP: str) -> bool:
    """Whether the Hopper forward takes a one-dimensional grid decoded in the order MAP
    (the block-first orders); the head-first ones are its (query block, head, batch) grid
    itself, with one L2 for the whole chip (chiplet.mapping.attention_coords with one XCD:
    the swizzled and naive head-first orders coincide)."""
    return chip.attention_order_name(MAP).endswith("block-first")


def _hopper(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, STAGES, PINGPONG, WG, PERSISTENT,
            LAZY, cu_q=None, cu_k=None, MAP="head-first"):
    """FlashAttention-3 form: a producer warpgroup and WG consumer warpgroups. The producer
    (24 registers) has one wave issue TMA copies: a tile's 64 * WG query rows, then its K
    and V blocks into two rings of STAGES stages. Each consumer (the rest of the SM's
    registers) owns 64 query rows: S = Q K^T by wgmma from shared memory, the online softmax
    in registers, P converted in registers into wgmma's A operand for O += P V, and O out
    through shared memory and TMA. The softmax of block j runs while the tensor cores
    compute block j - 1's P V (issued right after block j's Q K^T), and O is rescaled
    under Q K^T.

    PINGPONG=1: the consumers take turns issuing their matrix products, so one's softmax
    runs under another's. PERSISTENT=1 (not causal): a grid of one workgroup per SM walks
    the (query block, head, batch) tiles; the rings run on from tile to tile, so the next
    tile's loads overlap this one's last products and its store. MAP: the order of the
    tiles, one of the NUMA study's (chiplet.mapping.attention_coords, one XCD): head-first
    (the default: a head's query blocks one after another) or block-first (the heads of a
    window of heads one after another, query block by query block).

    With cu_q / cu_k (packed batches): q, o are (Hq, total_q, D), k, v (Hkv, total_k, D),
    lse (Hq, total_q); sequence b holds rows cu[b] .. cu[b + 1] - 1; a consumer's 64 rows of
    O go by TMA where they all lie in the sequence, else from registers, bounded by the
    sequence's end (a TMA box would write the next sequence's rows); LSE from registers."""
    varlen = cu_q is not None
    hdim = 0 if varlen else 1                              # where the head dim sits
    heads, group = q.shape[hdim], q.shape[hdim] // k.shape[hdim]
    bm = 64 * WG
    if PERSISTENT and (CAUSAL or varlen):
        raise ValueError("PERSISTENT=1 needs the same key blocks in every tile: not causal, "
                         "not packed")
    flat = hopper_flat_grid(MAP)
    if varlen and flat:
        raise pk.NotSupportedYet(f"MAP={MAP!r}: packed batches on Hopper take the head-first "
                                 "grid only")
    if not varlen:
        nqb = (q.shape[2] + bm - 1) // bm
    walk = pk.tile_walk(nqb * heads * q.shape[0] if PERSISTENT else 1, persistent=PERSISTENT)

    def tile(t):
        """This workgroup's t-th tile: first query row (in its sequence), head, batch, the
        sequence's first query and key rows, lengths, and the key blocks to visit."""
        if flat:
            i = walk.tile(t) if PERSISTENT else pk.program_id(0)
            b, h, qb = chip.attention_coords(MAP, i, q.shape[0], heads, nqb, group, 1)
            if CAUSAL:
                qb = nqb - 1 - qb                         # the longest rows start first
        elif PERSISTENT:
            i = walk.tile(t)
            qb, h, b = i % nqb, i // nqb % heads, i // nqb // heads
        else:
            qb, h, b = pk.program_id(0), pk.program_id(1), pk.program_id(2)
            if CAUSAL:
                qb = pk.num_programs(0) - 1 - qb          # the longest rows start first
        if varlen:
            qs, ks_ = cu_q[b], cu_k[b]
            nq, nk = cu_q[b + 1] - qs, cu_k[b + 1] - ks_
        else:
            qs, ks_, nq, nk = 0, 0, q.shape[2], k.shape[2]
        blocks = (nk + BN - 1) // BN
        if CAUSAL:
            blocks = _causal_blocks(blocks, qb * bm + bm, nk - nq, BN)
        if varlen:                                       # blocks past a short sequence
            blocks = pk.where(qb * bm < nq, blocks, 0)
        return qb * bm, h, b, qs, ks_, nq, nk, blocks

    def at(b, h, row):
        """Tensor coordinates of `row` of head h (of sequence b's rows, when packed)."""
        return (h, row, 0) if varlen else (b, h, row, 0)

    sq = [pk.empty(pk.st((64, D), DT, swizzle=8)) for _ in range(WG)]
    q_full, q_free = pk.mbarrier(1, count=WG), pk.mbarrier(4, count=WG)
    kv = pk.st((BN, D), DT, swizzle=8)
    ks = pk.Ring(STAGES, fill=1, drain=4 * WG, t=kv)
    vs = pk.Ring(STAGES, fill=1, drain=4 * WG, t=kv)
    # O leaves through each consumer's Q tile once its last Q K^T has retired (persistent:
    # a tile of its own, as the next tile's Q lands meanwhile)
    out = [pk.StagedStore((64, D), DT, tile=None if PERSISTENT else sq[g]) for g in range(WG)]
    turn = pk.mbarrier(4, count=WG) if PINGPONG else None
    with pk.role(0, 4, regs=24):
        with pk.if_(pk.wave_id() == 0):
            for t in walk:
                q0, h, b, qs, ks_, nq, nk, blocks = tile(t)
                for g in pk.static_range(WG):
                    if PERSISTENT:
                        with pk.if_(t > 0):
                            pk.wait(q_free[g], (t - 1) % 2)
                    pk.tma_load(sq[g], q, at(b, h, qs + q0 + 64 * g), q_full[g])
                for j in pk.range(blocks):
                    for ring, src in ((ks, k), (vs, v)):
                        st = ring.acquire(t * blocks + j)
                        pk.tma_load(st.t, src, at(b, h // group, ks_ + j * BN), st.full)
    for g in pk.static_range(WG):
        # 24 a thread for the producer, the rest of the block's shared out (240 / 160)
        with pk.role(4 + 4 * g, 4, regs=consumer_regs(24)):
            acc = pk.empty(pk.rt((16, D), pk.f32, role="acc"))
            m, l_, alpha = (pk.empty(pk.rv(acc, "row")) for _ in range(3))
            s = pk.empty(pk.rt((16, BN), pk.f32, role="acc"))
            pa = pk.empty(pk.rt((16, BN), DT, role="a"))      # P of the previous block
            for t in walk:
                q0, h, b, qs, ks_, nq, nk, blocks = tile(t)
                offset = nk - nq
                row0 = q0 + 64 * g + 16 * (pk.wave_id() % 4)
                step, r0 = t * blocks, t * (blocks + 1)      # ring steps, issue rounds

                def softmax(j):
                    col0 = j * BN
                    masked = col0 + BN > nk
                    if CAUSAL:
                        masked = masked | (col0 + BN > q0 + 64 * g + offset + 1)
                    return _online_softmax(s, m, l_, alpha, scale * LOG2E, row0, col0, nk,
                                           offset, masked, CAUSAL, LAZY)

                def rescale():                      # O *= alpha, skipped where it is all 1
                    if LAZY:
                        with pk.if_(pk.any(alpha < 1.0)):
                            acc.set(acc * alpha)
                    else:
                        acc.set(acc * alpha)

                def my_turn(r):  # PINGPONG: wait until the previous consumer issued round r
                    if PINGPONG and g > 0:        # (consumer 0: the last one's round r - 1)
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

                pk.fill(acc, 0.0)
                pk.fill(m, -math.inf)
                pk.fill(l_, 0.0)
                pk.wait(q_full[g], t % 2)
                with pk.if_(blocks > 0):
                    my_turn(r0)
                    pk.mma_ABt(s, sq[g], ks.wait(step).t, c=0)
                    your_turn()
                    ks.release(step)
                    pk.convert(pa, softmax(0))      # (acc is 0: its alpha does not matter)
                    for j in pk.range(1, blocks):   # Q K_j^T, then P_{j-1} V_{j-1}
                        my_turn(r0 + j)
                        pk.mma_ABt(s, sq[g], ks.wait(step + j).t, c=0, in_flight=1)
                        rescale()                   # under Q K_j^T
                        pk.mma_AB(acc, pa, vs.wait(step + j - 1).t, in_flight=2)
                        your_turn()
                        pk.mma_wait(s, in_flight=1)
                        ks.release(step + j)    # Q K_j^T has retired
                        p = softmax(j)          # under P_{j-1} V_{j-1}
                        pk.mma_wait(acc)
                        vs.release(step + j - 1)
                        pk.convert(pa, p)
                    my_turn(r0 + blocks)
                    rescale()
                    pk.mma_AB(acc, pa, vs.wait(step + blocks - 1).t)
                    your_turn()
                    vs.release(step + blocks - 1)
                if PERSISTENT:
                    pk.arrive(q_free[g])            # its last Q K^T has retired
                res, row_lse = _finish(acc, m, l_)
                if varlen:      # a whole block by TMA; one the sequence ends in from registers
                    with pk.if_(q0 + 64 * (g + 1) <= nq):
                        out[g].store(o, res, (h, qs + q0 + 64 * g, 0), use=t)
                    with pk.else_():
                        pk.store(o, res, (h, qs + row0, 0), end=(None, qs + nq, None))
                    pk.store(lse, row_lse, (h, qs + row0), end=(None, qs + nq))
                else:
                    out[g].store(o, res, (b, h, q0 + 64 * g, 0), use=t)
                    pk.store(lse, row_lse, (b, h, row0))


@pk.kernel(num_waves=12)
def attention_fwd(q: pk.gl["DT", 4], k: pk.gl["DT", 4], v: pk.gl["DT", 4],
                  o: pk.gl["DT", 4], lse: pk.gl[pk.f32, 3], scale: pk.f32,
                  DT: pk.const = None, D: pk.const = 128, CAUSAL: pk.const = 0,
                  BN: pk.const = 128, STAGES: pk.const = 2, PINGPONG: pk.const = 0,
                  WG: pk.const = 2, PERSISTENT: pk.const = 0, LAZY: pk.const = 1,
                  TARGET: pk.target = None, MAP: pk.const = "head-first",
                  PIN: pk.const = ""):
    """q, o: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D); lse: (B, Hq, Nq) f32; grid
    (ceil(Nq / (64 WG)), Hq, B), 4 (WG + 1) waves on Hopper (one dimension of those tiles in
    the order MAP names where it is a block-first one: hopper_flat_grid); on CDNA 8 waves
    and a grid of B Hq ceil(Nq / 256) in the order MAP names (attention_cdna)."""
    if TARGET == "sm_90a":
        _hopper(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, STAGES, PINGPONG, WG, PERSISTENT,
                LAZY, MAP=MAP)
    elif TARGET in CDNA_TARGETS:
        cdna_attention(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, MAP, TARGET, PIN=PIN)
    else:
        raise pk.NotSupportedYet(f"attention_fwd has no schedule for {TARGET} yet")


def hopper_schedules(d: int) -> dict:
    """Named alternatives to the Hopper launch defaults for head dim d (what bench/attention.py
    compares): the inter-warpgroup ping-pong, a persistent grid, three consumers, and a
    third K/V stage."""
    out = {"default": {}, "eager rescale": {"LAZY": 0}, "pingpong": {"PINGPONG": 1}}
    if d == 64:
        out["3 consumers, pingpong"] = {"WG": 3, "num_waves": 16, "PINGPONG": 1}
        out["3 consumers, pingpong, eager"] = {"WG": 3, "num_waves": 16, "PINGPONG": 1,
                                               "LAZY": 0}
    else:
        out["BN=160"] = {"BN": 160}
        out["BN=160, eager"] = {"BN": 160, "LAZY": 0}
    return out


def attention_fwd_launch(i: dict, target, **overrides):
    """(grid, consts) of attention_fwd for inputs `i` (q (B, Hq, Nq, D), k (B, Hkv, Nk, D),
    and the compile-time choice CAUSAL in i or overrides). Checks what the kernels support
    and says so: head dims 64 and 128, Hq a multiple of Hkv, 16-bit element types."""
    from ..targets import get
    t = get(target)
    _need_shapes(i, ("q", "k", "v"), 4, "(B, H, N, D)")
    (b, hq, nq, d), bk = i["q"].shape, i["k"].shape[0]
    if bk != b:
        raise ValueError(f"attention: q {tuple(i['q'].shape)} and k {tuple(i['k'].shape)} "
                         "must agree in batch")
    _check_heads(i["q"].shape, i["k"].shape, i["v"].shape)
    causal = int(overrides.pop("CAUSAL", i.get("CAUSAL", 0)))
    if t.family != "hopper":
        return cdna_launch(b, hq, nq, d, t.name, CAUSAL=causal, **overrides)
    consts = _hopper_consts(d, causal, t.name, {"PERSISTENT": 0, **overrides})
    blocks = -(-nq // (64 * consts["WG"]))
    if consts["PERSISTENT"]:
        return (min(blocks * hq * b, t.num_cus),), consts
    if hopper_flat_grid(consts.get("MAP", "head-first")):
        return (blocks * hq * b,), consts
    return (blocks, hq, b), consts


def _need_shapes(i: dict, names, rank: int, layout: str) -> None:
    """Each of `names` in `i`, with `rank` dims: an error naming the argument otherwise."""
    for name in names:
        if name not in i:
            raise ValueError(f"attention: the inputs need {name!r} (a {layout} tensor)")
        shape = getattr(i[name], "shape", None)
        if shape is None or len(shape) != rank:
            got = f"shape {tuple(shape)}" if shape is not None else type(i[name]).__name__
            raise ValueError(f"attention: {name} must be a {layout} array or tensor, got {got}")


def _check_heads(q_shape, k_shape, v_shape):
    """Head dims 64 or 128, one head dim and (k, v) length, Hq a multiple of Hkv: shapes
    whose last three dims are (H, N, D)."""
    (hq, _, d), (hkv, nk, dk) = q_shape[-3:], k_shape[-3:]
    if d != dk or tuple(v_shape) != tuple(k_shape):
        raise ValueError(f"attention: q {tuple(q_shape)}, k {tuple(k_shape)} and v "
                         f"{tuple(v_shape)} must agree in head dim, and k and v in shape")
    if d not in (64, 128):
        raise ValueError(f"attention: head dim {d} is not supported; the kernels take 64 "
                         "or 128")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention: {hq} query heads are not a multiple of {hkv} key/value "
                         "heads (GQA groups)")


def _hopper_consts(d, causal, target, overrides) -> dict:
    """The Hopper schedule's launch defaults, chosen on the H200 (docs/PERF.md): 64-wide
    head dims take three consumers in ping-pong."""
    wide = {"WG": 3, "PINGPONG": 1, "num_waves": 16} if d == 64 else {}
    return {"D": d, "CAUSAL": causal, "BN": 128, "STAGES": 2, "PINGPONG": 0, "WG": 2,
            "LAZY": 1, "num_waves": 12, "TARGET": target, **wide, **overrides}


@pk.kernel(num_waves=12)
def attention_fwd_varlen(q: pk.gl["DT", 3], k: pk.gl["DT", 3], v: pk.gl["DT", 3],
                         o: pk.gl["DT", 3], lse: pk.gl[pk.f32, 2],
                         cu_seqlens_q: pk.gl[pk.i32, 1], cu_seqlens_k: pk.gl[pk.i32, 1],
                         scale: pk.f32, DT: pk.const = None, D: pk.const = 128,
                         CAUSAL: pk.const = 0, BN: pk.const = 128, STAGES: pk.const = 2,
                         PINGPONG: pk.const = 0, WG: pk.const = 2, LAZY: pk.const = 1,
                         MAP: pk.const = "head-first", PIN: pk.const = "",
                         TARGET: pk.target = None):
    """attention_fwd over a packed batch of B sequences of different lengths: q, o
    (Hq, total_q, D) and k, v (Hkv, total_k, D) are (H, total, D) views of packed
    (total, H, D) tensors, lse is (Hq, total_q) f32, and int32 cu_seqlens_q / cu_seqlens_k
    (B + 1) hold where each sequence starts (sequence b: rows cu[b] .. cu[b + 1]). Causal
    masks are bottom-right aligned per sequence. Grid and constants:
    attention_fwd_varlen_launch."""
    if TARGET == "sm_90a":
        _hopper(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, STAGES, PINGPONG, WG, 0, LAZY,
                cu_seqlens_q, cu_seqlens_k)
    elif TARGET in CDNA_TARGETS:
        cdna_attention(q, k, v, o, lse, scale, DT, D, CAUSAL, BN, MAP, TARGET,
                       cu_seqlens_q, cu_seqlens_k, PIN)
    else:
        raise pk.NotSupportedYet(f"attention_fwd_varlen has no schedule for {TARGET} yet")


def packed_offsets(i: dict) -> tuple[int, dict]:
    """(B, {"cu_seqlens_q": [...], "cu_seqlens_k": [...]}) of packed inputs `i` (q, k as
    (H, total, D)): the int32 offsets (arrays or tensors) read and checked."""
    cu = {}
    for name, total in (("cu_seqlens_q", i["q"].shape[1]), ("cu_seqlens_k", i["k"].shape[1])):
        if name not in i:
            raise ValueError(f"attention: the inputs need {name!r} (B + 1 int32 offsets)")
        raw = i[name].tolist() if hasattr(i[name], "tolist") else list(i[name])
        if any(isinstance(x, bool) or float(x) != int(x) for x in raw):
            raise ValueError(f"attention: {name} must hold integer offsets, got {raw[:8]}")
        c = [int(x) for x in raw]
        if len(c) < 2 or c[0] < 0 or c[-1] > total or any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"attention: {name} must be B + 1 >= 2 non-decreasing offsets "
                             f"from 0 to at most {total}, got {c[:8]}")
        cu[name] = c
    batch = len(cu["cu_seqlens_q"]) - 1
    if len(cu["cu_seqlens_k"]) != batch + 1:
        raise ValueError(f"attention: cu_seqlens_q and cu_seqlens_k hold {batch + 1} and "
                         f"{len(cu['cu_seqlens_k'])} offsets; both must hold B + 1")
    return batch, cu


def longest(cu: list[int]) -> int:
    """The longest sequence of packed offsets."""
    return max(b - a for a, b in zip(cu, cu[1:]))


def _max_length(cu: dict, which: str, given) -> int:
    """The longest q or k sequence of checked offsets `cu`, or the `given` maximum after
    checking it covers them (a smaller one would leave rows uncomputed)."""
    n = longest(cu[f"cu_seqlens_{which}"])
    if given is None:
        return n
    if isinstance(given, bool) or not hasattr(given, "__index__") or given < n:
        raise ValueError(f"attention: max_seqlen_{which}={given!r} is below the longest "
                         f"sequence in cu_seqlens_{which} ({n}); pass at least {n}")
    return int(given)


def attention_fwd_varlen_launch(i: dict, target, max_seqlen_q=None, **overrides):
    """(grid, consts) of attention_fwd_varlen for inputs `i`: q (Hq, total_q, D), k and v
    (Hkv, total_k, D), and cu_seqlens_q, cu_seqlens_k (arrays or tensors, read here to check
    them and to size the grid by the longest query sequence, unless max_seqlen_q is given).
    Hopper: grid (ceil(max_seqlen_q / (64 WG)), Hq, B); CDNA: B Hq ceil(max_seqlen_q / 256)
    workgroups in head-first order."""
    from ..targets import get
    t = get(target)
    _need_shapes(i, ("q", "k", "v"), 3, "(H, total, D)")
    _check_heads(i["q"].shape, i["k"].shape, i["v"].shape)
    hq, _, d = i["q"].shape
    batch, cu = packed_offsets(i)
    max_seqlen_q = _max_length(cu, "q", max_seqlen_q)
    causal = int(overrides.pop("CAUSAL", i.get("CAUSAL", 0)))
    if t.family != "hopper":
        return cdna_launch(batch, hq, max(1, max_seqlen_q), d, t.name, CAUSAL=causal,
                           **overrides)
    consts = _hopper_consts(d, causal, t.name, overrides)
    return (max(1, -(-max_seqlen_q // (64 * consts["WG"]))), hq, batch), consts
