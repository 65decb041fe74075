"""Tensor-parallel linear layers whose collective overlaps the GEMM tile by tile.

All-gather + GEMM (sequence-parallel input, column-parallel weight). Every rank holds Ms
rows of x; out = gather(x) @ W.T over all WORLD * Ms rows. `ag_send` pushes this rank's
rows, CHUNK at a time, into every rank's `gathered` buffer (its own first) and raises
ready[rank, chunk] there; `ag_gemm` computes output tiles starting with this rank's rows
and waits on `ready` before loading each block of another rank's rows. The two run at
once (two streams): the copy moves over the GPUs' links while the tensor cores work.

GEMM + reduce-scatter (row-parallel weight). Rank r's output is rows r * Ms ... of the
sum over ranks of x_s @ W_s.T. `gemm_rs` computes each output tile, the other ranks'
rows first, stores it into its owner's `partials[rank]` (over the link) and raises
done[rank, tile] there; `rs_reduce` sums the ranks' partials of this rank's rows as
their flags come up.

Flags only grow: each call passes the next `epoch` (1, 2, ...); a flag is complete at
epoch x the number of waves that signal it (each publishes its own stores).

These are the portable kernels (every target; 64 x 64 output tiles from 4 waves); the
Hopper library builds (`ag_gemm_ws`, `gemm_rs_ws`) run the same protocol on gemm_ws's
warp-specialised TMA/wgmma pipeline.
"""
import functools

import pykittens as pk

from .gemm import output_tile, ws_pipeline, ws_store

WAVES = 4          # waves of the portable kernels; each signals once per flag


def _cdiv(a, b):
    return (a + b - 1) // b


def shard_tile(t, TMS, TN, first_rank, WORLD):
    """(rank whose rows, row block within that rank's shard, column block) of the t-th
    tile of a walk that takes the shards in rank order from `first_rank` on."""
    per_rank = TMS * TN
    j = t // per_rank
    rest = t % per_rank
    return (first_rank + j) % WORLD, rest // TN, rest % TN


def _product(a, b, sa, sb, m0, n0, m_end, DT, BK):
    """This wave's quadrant of C[m0:, n0:] = A[m0:m_end] @ B[n0:].T, B stored N x K."""
    bm, bn = sa.type.shape[0], sb.type.shape[0]
    wm, wn = pk.wave_id() // 2, pk.wave_id() % 2
    acc = pk.zeros(pk.rt((bm // 2, bn // 2), pk.f32, role="acc"))
    for k in pk.range(_cdiv(a.shape[1], BK)):
        pk.load(sa, a, (m0, k * BK), end=(m_end, None))     # ragged edges read as zero
        pk.load(sb, b, (n0, k * BK))
        pk.barrier()
        ta = pk.load(pk.rt((bm // 2, BK), DT, role="a"), sa, (wm * (bm // 2), 0))
        tb = pk.load(pk.rt((bn // 2, BK), DT, role="b"), sb, (wn * (bn // 2), 0))
        pk.barrier()                                         # the next stage may overwrite
        pk.mma_ABt(acc, ta, tb)
    return acc, wm * (bm // 2), wn * (bn // 2)


@pk.kernel(num_waves=WAVES)
def ag_send(x: pk.gl["DT", 2], gathered: pk.peers["DT", 2, "WORLD"],
            ready: pk.peers[pk.i32, 2, "WORLD"],
            DT: pk.const = None, WORLD: pk.const = None, CHUNK: pk.const = 128,
            BK: pk.const = 128):
    """Workgroup c copies rows [c * CHUNK, (c + 1) * CHUNK) of this rank's x (Ms x K) to
    rows rank * Ms + ... of every rank's `gathered` (WORLD * Ms x K), this rank first,
    then adds 1 per wave to ready[rank, c] there (WORLD x chunks)."""
    me, c = gathered.rank, pk.program_id(0)
    ms = x.shape[0]
    rows = CHUNK // WAVES
    r0 = c * CHUNK + pk.wave_id() * rows
    for j in pk.range(WORLD):
        dst = (me + j) % WORLD
        for k in pk.range(_cdiv(x.shape[1], BK)):
            t = pk.load(pk.rt((rows, BK), DT), x, (r0, k * BK))
            pk.store(gathered.peer(dst), t, (me * ms + r0, k * BK), end=(me * ms + ms, None))
        pk.signal(ready.peer(dst), (me, c), 1, add=True)


@pk.kernel(num_waves=WAVES)
def ag_gemm(gathered: pk.gl["DT", 2], w: pk.gl["DT", 2], out: pk.gl["OUT", 2],
            ready: pk.gl[pk.i32, 2], rank: pk.i32, epoch: pk.i32,
            DT: pk.const = None, OUT: pk.const = None, WORLD: pk.const = None,
            CHUNK: pk.const = 128, BM: pk.const = 64, BN: pk.const = 64, BK: pk.const = 32):
    """out (WORLD * Ms x N) = gathered @ w.T, one BM x BN tile per workgroup, this rank's
    rows first; before loading rows of rank s it waits for ready[s, chunk] to count
    every sending wave of this epoch."""
    sa = pk.empty(pk.st((BM, BK), DT))
    sb = pk.empty(pk.st((BN, BK), DT))
    ms = gathered.shape[0] // WORLD
    src, i, n = shard_tile(pk.program_id(0), _cdiv(ms, BM), _cdiv(w.shape[0], BN), rank,
                           WORLD)
    m0, n0 = src * ms + i * BM, n * BN
    pk.wait_flag(ready, (src, i * BM // CHUNK), WAVES * epoch)
    acc, dm, dn = _product(gathered, w, sa, sb, m0, n0, src * ms + ms, DT, BK)
    pk.store(out, acc, (m0 + dm, n0 + dn), end=(src * ms + ms, None))


@pk.kernel(num_waves=WAVES)
def gemm_rs(x: pk.gl["DT", 2], w: pk.gl["DT", 2], partials: pk.peers["PT", 3, "WORLD"],
            done: pk.peers[pk.i32, 2, "WORLD"], epoch: pk.i32,
            DT: pk.const = None, PT: pk.const = None, WORLD: pk.const = None,
            BM: pk.const = 64, BN: pk.const = 64, BK: pk.const = 32):
    """Tile (m, n) of x @ w.T (x: WORLD * Ms x K this rank's slice of K), stored into
    partials[rank] (WORLD x Ms x N) of the rank that owns rows m, the next rank's first
    and this rank's last; then each wave adds 1 to done[rank, tile] there."""
    sa = pk.empty(pk.st((BM, BK), DT))
    sb = pk.empty(pk.st((BN, BK), DT))
    me = partials.rank
    ms = x.shape[0] // WORLD
    tms, tn = _cdiv(ms, BM), _cdiv(w.shape[0], BN)
    dst, i, n = shard_tile(pk.program_id(0), tms, tn, me + 1, WORLD)
    m0, n0 = dst * ms + i * BM, n * BN
    acc, dm, dn = _product(x, w, sa, sb, m0, n0, dst * ms + ms, DT, BK)
    pk.store(partials.peer(dst), acc, (me, i * BM + dm, n0 + dn), end=(None, ms, None))
    pk.signal(done.peer(dst), (me, i * tn + n), 1, add=True)


@pk.kernel(num_waves=WAVES)
def rs_reduce(partials: pk.peers["PT", 3, "WORLD"], done: pk.peers[pk.i32, 2, "WORLD"],
              out: pk.gl["OUT", 2], epoch: pk.i32,
              PT: pk.const = None, OUT: pk.const = None, WORLD: pk.const = None,
              BM: pk.const = 64, BN: pk.const = 64, SIGNALS: pk.const = WAVES):
    """out (Ms x N) = the sum over ranks s of partials[s] (this rank's buffer), one BM x BN
    tile per workgroup (the GEMM's tiles), each rank's part once done[s, tile] counts
    the SIGNALS waves that stored it this epoch."""
    tn = _cdiv(out.shape[1], BN)
    t = pk.program_id(0)
    rows, cols = BM // WAVES, min(BN, 64)            # a strip at a time: few registers
    r0, n0 = (t // tn) * BM + pk.wave_id() * rows, (t % tn) * BN
    mine, flags = partials.local, done.local
    for s in pk.range(WORLD):
        pk.wait_flag(flags, (s, t), SIGNALS * epoch)
    for c in pk.static_range(BN // cols):
        acc = pk.zeros(pk.rt((rows, cols), pk.f32))
        for s in pk.range(WORLD):
            acc += pk.load(pk.rt((rows, cols), pk.f32), mine, (s, r0, n0 + c * cols))
        pk.store(out, acc, (r0, n0 + c * cols))


# ---- Hopper: the same protocol on gemm_ws's pipeline (128 x BN blocks) --------------------

WS_SIGNALS = 8     # consumer waves of a gemm_ws block, each storing 16 of its 128 rows


def _shard_block(i, TMS, TN, first_rank, WORLD, MAP, BN, TARGET):
    """(row, column) origin of block i of a WORLD x (TMS x TN)-block output: shards in
    rank order from `first_rank`, each shard's blocks in the MAP order (e.g. L2-grouped
    rasterisation)."""
    per_rank = TMS * TN
    src = (first_rank + i // per_rank) % WORLD
    m0, n0 = output_tile(MAP, TMS, TN, 128, BN, TARGET, i % per_rank)
    return src * TMS * 128 + m0, n0


# what a sending wave of ag_gemm_ws moves at a time through its registers (each block then
# signals): 8 x 32 16-bit elements fit the producer warpgroup's budget without spilling;
# each tile is loaded once and stored to every rank (two or four tiles loaded before any
# is stored spilled 56 / 176 bytes a lane in gemm.PRODUCER_REGS' 40 registers)
SEND_ROWS, SEND_COLS = 8, 32


@pk.kernel(num_waves=12)
def ag_gemm_ws(x: pk.gl["DT", 2], gathered: pk.gl["DT", 2],
               to: pk.peers["DT", 2, "WORLD"], ready: pk.peers[pk.i32, 2, "WORLD"],
               w: pk.gl["DT", 2], out: pk.gl["OUT", 2], epoch: pk.i32,
               DT: pk.const = None, OUT: pk.const = None, WORLD: pk.const = None,
               CHUNK: pk.const = 128, BN: pk.const = 256, STAGES: pk.const = 4,
               TMA_STORE: pk.const = 0, MAP: pk.const = "row-major", TMS: pk.const = None,
               TN: pk.const = None, FENCE: pk.const = 1, TARGET: pk.target = None):
    """Hopper all-gather + GEMM in one persistent kernel: out (WORLD * Ms x N) =
    gather(x) @ w.T, x this rank's Ms = 128 TMS rows, N = BN TN. `gathered` is this
    rank's buffer of `to` (the same tensor: the TMA copies read it by its own tensor map).

    The producer warpgroup's three idle waves push x, SEND_ROWS rows at a time, into
    every other rank's `to`, adding 1 to ready[rank, chunk] there after each; the TMA
    wave copies this rank's own rows from x itself (first, at once) and waits for
    another rank's block of rows (CHUNK / SEND_ROWS signals per epoch) before copying
    it from `gathered`. Every workgroup is resident at once (the grid is at most one per
    SM), so waiting never holds up a send."""
    ms, me = TMS * 128, to.rank
    K = x.shape[1]

    def arrived(i, m0):
        with pk.if_(m0 // ms != me):              # (this rank's rows come from x)
            pk.wait_flag(ready.local, (m0 // ms, m0 % ms // CHUNK),
                         CHUNK // SEND_ROWS * epoch, tma=bool(FENCE))

    def send(i, n):
        senders = n * pk.num_programs(0)
        first = pk.program_id(0) * n + i
        jobs = ms // SEND_ROWS
        cols = _cdiv(K, SEND_COLS)
        for t in pk.range((jobs - first + senders - 1) // senders):
            r0 = (first + t * senders) * SEND_ROWS
            for k in pk.range(cols):
                rows = pk.load(pk.rt((SEND_ROWS, SEND_COLS), DT), x, (r0, k * SEND_COLS))
                for d in pk.static_range(1, WORLD):       # every other rank's buffer
                    pk.store(to.peer((me + d) % WORLD), rows, (me * ms + r0, k * SEND_COLS))
            for d in pk.range(1, WORLD):
                pk.signal(ready.peer((me + d) % WORLD), (me, r0 // CHUNK), 1, add=True)

    ws_pipeline(gathered, w, WORLD * TMS * TN,
                lambda i: _shard_block(i, TMS, TN, me, WORLD, MAP, BN, TARGET),
                ws_store(out, OUT, BN, TMA_STORE),
                DT=DT, BN=BN, STAGES=STAGES, PERSISTENT=1, PROMOTE=0, before_loads=arrived,
                side_work=send, a_local=(x, me * ms, ms))


@pk.kernel(num_waves=12)
def gemm_rs_ws(x: pk.gl["DT", 2], w: pk.gl["DT", 2], partials: pk.peers["PT", 3, "WORLD"],
               done: pk.peers[pk.i32, 2, "WORLD"], epoch: pk.i32,
               DT: pk.const = None, PT: pk.const = None, WORLD: pk.const = None,
               BN: pk.const = 256, STAGES: pk.const = 4, PERSISTENT: pk.const = 1,
               MAP: pk.const = "row-major", TMS: pk.const = None, TN: pk.const = None,
               DEFER: pk.const = 1, TARGET: pk.target = None):
    """Hopper gemm_rs: gemm_ws blocks of x @ w.T (Ms = 128 TMS rows per rank, N = BN TN),
    the next rank's rows first; each consumer wave stores its 16 rows into the owner's
    partials[rank] and adds 1 to done[rank, block] there (WS_SIGNALS per block).

    DEFER=1 (persistent): a wave signals a block once it has finished the next block's
    products, so the release, which waits until the stores have reached the other GPU,
    finds them landed instead of stalling the wave."""
    me = partials.rank
    ms = TMS * 128

    def tile_of(i):
        return _shard_block(i, TMS, TN, me + 1, WORLD, MAP, BN, TARGET)

    def signal(i):
        m0, n0 = tile_of(i)
        pk.signal(done.peer(m0 // ms), (me, m0 % ms // 128 * TN + n0 // BN), 1, add=True)

    def store(g, acc, m0, n0, t, i):
        if DEFER:
            with pk.if_(t > 0):
                signal(i - pk.num_programs(0))          # this workgroup's previous block
        r0 = m0 % ms + 64 * g + pk.wave_id() % 4 * 16
        pk.store(partials.peer(m0 // ms), acc, (me, r0, n0))
        if not DEFER:
            signal(i)

    ws_pipeline(x, w, WORLD * TMS * TN, tile_of, store, DT=DT, BN=BN, STAGES=STAGES,
                PERSISTENT=PERSISTENT, PROMOTE=0,
                after_tiles=(lambda g, i: signal(i)) if DEFER else None)


def ws_plan(ms: int, k: int, n: int, itemsize: int, staged_c: bool = True,
            target: str = "sm_90a") -> dict:
    """Constants of ag_gemm_ws (staged_c: C may leave through shared memory and TMA) or
    gemm_rs_ws (staged_c=False: its blocks go to other GPUs' memory from registers) for Ms
    rows per rank (a multiple of 128), K and N (a multiple of 128): 128 x BN blocks, each
    shard's in the order the cache simulator picks for an Ms x N x K product
    (chiplet.auto_mapping), and gemm_ws's launch rule's C (16-bit: every wave's rows
    through shared memory in 64-column pieces, beside 4 ring stages). A new dict each
    call."""
    return dict(_ws_plan(ms, k, n, itemsize, staged_c, target))


def ws_grid(consts: dict, world: int, target: str = "sm_90a") -> tuple[int]:
    """The persistent grid of ws_plan's kernels: at most one workgroup per SM."""
    from ..targets import get
    return (min(world * consts["TMS"] * consts["TN"], get(target).num_cus),)


@functools.lru_cache(maxsize=256)
def _ws_plan(ms, k, n, itemsize, staged_c, target) -> tuple:
    from .. import chiplet
    from ..targets import get
    if ms % 128 or n % 128:
        raise ValueError(f"the Hopper comm kernels take rows per rank and N in multiples of "
                         f"128, got Ms = {ms}, N = {n}")
    bn = 256 if n % 256 == 0 else 128
    op = chiplet.Gemm(ms, n, max(k, 1), bm=128, bn=bn, bk=64)
    spec = chiplet.auto_mapping(op, target=target).spec
    consts = {"TMS": ms // 128, "TN": n // bn, "BN": bn, "MAP": spec,
              "TARGET": get(target).name, "STAGES": 4}
    if staged_c and itemsize == 2:
        # as gemm_ws_launch (TMA_STORE=2): on two H200s (docs/PERF.md, 2026-12-04 seventh
        # session, run VN) all-gather + GEMM of Llama-3-70B's gate and up projections ran
        # 4.8-5.5% faster than with 256-wide blocks staged whole beside 3 ring stages (the
        # QKV projection within the runs' spread)
        consts.update(TMA_STORE=2)
    return tuple(consts.items())


def ag_plan(ms: int, k: int, n: int, world: int, CHUNK: int = 128, BM: int = 64,
            BN: int = 64):
    """Grids of ag_send and ag_gemm for Ms rows per rank, K columns, N outputs, and the
    shape of the ready flags."""
    chunks = _cdiv(ms, CHUNK)
    return {"send_grid": (chunks,), "gemm_grid": (world * _cdiv(ms, BM) * _cdiv(n, BN),),
            "ready": (world, chunks)}


def rs_plan(ms: int, n: int, world: int, BM: int = 64, BN: int = 64):
    """Grids of gemm_rs and rs_reduce for Ms output rows per rank and N columns, and the
    shapes of the partials and done flags."""
    tiles = _cdiv(ms, BM) * _cdiv(n, BN)
    return {"gemm_grid": (world * tiles,), "reduce_grid": (tiles,),
            "partials": (world, ms, n), "done": (world, tiles)}
