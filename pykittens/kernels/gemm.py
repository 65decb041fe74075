"""gemm_basic: C = A @ B with bf16/f16/fp8 operands and f32 accumulation: each workgroup
stages a BM x BK block of A and a BK x BN block of B in shared memory, and each of its 2 x 2
waves multiplies its quadrant with the target's matrix instructions (MFMA on CDNA, mma.sync
on Hopper). Then the Hopper GEMMs (gemm_wgmma, gemm_ws and its warp-specialised pipeline).

Workgroups find their output tile through a chiplet-aware grid mapping (MAP, over a TM x TN
tile grid on TARGET, the pk.target constant: the target being compiled for): the launcher picks it with the cache simulator (chiplet.auto_mapping),
e.g. XCD chunking with a window on CDNA, L2-grouped rasterisation on Hopper."""
import contextlib

import pykittens as pk
from pykittens import chiplet

from .pipeline import consumer_regs


def output_tile(MAP, TM, TN, BM, BN, TARGET, index=None):
    """(row, col) of an output tile: the flat launch index (or `index`, a persistent
    workgroup's tile number) through the mapping over a TM x TN tile grid, or, with
    TM = 0, straight from a 2-D grid."""
    if not TM:
        return pk.program_id(0) * BM, pk.program_id(1) * BN
    grid = chiplet.Gemm(TM * BM, TN * BN, BM, bm=BM, bn=BN, bk=BM)
    tm, tn = chiplet.tile_of(chiplet.parse_mapping(MAP, grid, TARGET),
                             pk.program_id(0) if index is None else index)
    return tm * BM, tn * BN


@pk.kernel(num_waves=4)
def gemm_basic(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
               DT: pk.const = None, OUT: pk.const = None,
               BM: pk.const = 64, BN: pk.const = 64, BK: pk.const = 32,
               MAP: pk.const = "row-major", TM: pk.const = 0, TN: pk.const = 0,
               TARGET: pk.target = None):
    """The basic tiled GEMM: 64 x 64 output blocks, 4 waves, A and B staged in shared
    memory once per K step (no prefetch). An example of the language, and the library's
    product where the pipelined GEMMs do not apply (operands gemm_ws's TMA cannot read);
    the library's GEMMs are gemm_ws (Hopper) and gemm_pingpong (CDNA)."""
    sa = pk.empty(pk.st((BM, BK), DT))
    sb = pk.empty(pk.st((BK, BN), DT))
    wm, wn = pk.wave_id() // 2, pk.wave_id() % 2
    m0, n0 = output_tile(MAP, TM, TN, BM, BN, TARGET)
    acc = pk.zeros(pk.rt((BM // 2, BN // 2), pk.f32, role="acc"))
    for k in pk.range((a.shape[1] + BK - 1) // BK):
        pk.load(sa, a, (m0, k * BK))                     # ragged edges read as zero
        pk.load(sb, b, (k * BK, n0))
        pk.barrier()
        ta = pk.load(pk.rt((BM // 2, BK), DT, role="a"), sa, (wm * (BM // 2), 0))
        tb = pk.load(pk.rt((BK, BN // 2), DT, "col", role="b"), sb, (0, wn * (BN // 2)))
        pk.barrier()                                     # the next stage may overwrite
        pk.mma_AB(acc, ta, tb)
    pk.store(c, acc, (m0 + wm * (BM // 2), n0 + wn * (BN // 2)))


@pk.kernel(num_waves=4)
def gemm_wgmma(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
               DT: pk.const = None, OUT: pk.const = None, BK: pk.const = 64,
               TMA: pk.const = 1, MAP: pk.const = "row-major", TM: pk.const = 0,
               TN: pk.const = 0, TARGET: pk.target = None):
    """Hopper: a 64 x 64 block per warpgroup. Each K step, wave 0 has the TMA unit copy the
    BK x 64 block of B into a 128B-swizzled shared tile (completing on `full`); every wave
    multiplies its 16 rows of A (from registers) by it with wgmma. TMA=0 stages B with
    ordinary loads instead (B rows that are not a multiple of 16 bytes)."""
    sb = pk.empty(pk.st((BK, 64), DT, swizzle=8))
    full = pk.mbarrier(1)
    tile_m, n0 = output_tile(MAP, TM, TN, 64, 64, TARGET)
    m0 = tile_m + pk.wave_id() * 16
    acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
    for k in pk.range((a.shape[1] + BK - 1) // BK):
        if TMA:
            with pk.if_(pk.wave_id() == 0):
                pk.tma_load(sb, b, (k * BK, n0), full)
            pk.wait(full, k % 2)
        else:
            pk.load(sb, b, (k * BK, n0))
            pk.barrier()
        ta = pk.load(pk.rt((16, BK), DT, role="a"), a, (m0, k * BK))
        pk.mma_AB(acc, ta, sb)
        pk.barrier()                                     # the next copy may overwrite
    pk.store(c, acc, (m0, n0))


@pk.kernel(num_waves=12)
def gemm_ws(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
            DT: pk.const = None, OUT: pk.const = None, BN: pk.const = 256,
            STAGES: pk.const = 4, TMA_STORE: pk.const = 0, PERSISTENT: pk.const = 0,
            PROMOTE: pk.const = 0, MAP: pk.const = "row-major", TM: pk.const = 0,
            TN: pk.const = 0, LAYOUT: pk.const = "nt", PINGPONG: pk.const = 0,
            CLUSTER: pk.const = 1, A_ROWS: pk.const = 128, TARGET: pk.target = None):
    """Hopper: C = A @ B.T (B stored N x K, as a linear layer's weight), bf16/f16 or fp8
    (e4m3/e5m2) operands, f32 accumulation, 128 x BN output blocks.

    LAYOUT names how A and B are stored, as BLAS does for C = op(A) op(B): "nt" (the
    default) A M x K, B N x K; "nn" B K x N (C = A @ B); "tn" A K x M too (C = A.T @ B).
    The tensor cores read MN-major operands from shared memory as they are (16-bit types
    only), so neither is copied transposed first: a linear layer's backward (dX = dY W,
    dW = dY^T X) runs on the tensors autograd holds.

    Warp-specialised: warpgroup 0 is the producer (40 registers a thread): one wave has the
    TMA unit copy each K step's two 64-row blocks of A and the BN-row block of B into a
    ring of STAGES 128B-swizzled shared stages. Warpgroups 1 and 2 are consumers (232
    registers): each multiplies its 64 rows of A by B with wgmma, both operands read from
    shared memory, leaving one group running, and releases a stage once the group reading
    it has retired (the previous step's). A K step is one 128-byte row of each operand (64
    bf16 or 128 fp8).

    PERSISTENT=1: a grid of at most one workgroup per SM walks the TM x TN blocks; the ring
    runs on across blocks, so the producer loads the next block while the consumers store
    this one.

    PROMOTE=n (fp8): Hopper's fp8 wgmma accumulates with fewer bits than f32 (about 1e-3
    relative at K = 4096); the products of n K steps at a time go to a second accumulator
    instead, added to the f32 one in registers once its groups have retired. PROMOTE=1
    with BN = 128: two product accumulators take turns, so each K step's group runs while
    the one before is added (promote_in_flight); BN = 256 (B stored N x K): B's stage in
    two 128-row halves, each half's products added after its group (the registers hold no
    second product). PROMOTE=n > 1 (BN = 128): added after the n steps' groups, while the
    tensor cores idle unless the other consumer has a group queued.

    TMA_STORE=1 (16-bit C): each consumer writes its 64 x BN block through shared memory
    (stmatrix) and one wave has the TMA unit store it; otherwise every wave stores its rows
    of C from registers. TMA_STORE=2: every wave stages its 16 rows in 64-column pieces
    through two tiles of its own and has the TMA unit copy each out, waiting only before
    it reuses a tile (32 KiB in all instead of 64 KiB, which leaves the ring its fourth
    stage beside 256-wide blocks; no wave waits for another).

    PINGPONG=1 (BN = 128, C from registers, not PROMOTE): the consumer warpgroups take
    turns over whole 128 x 128 blocks, so one stores its block while the other multiplies
    (ws_pipeline's pingpong_consumer).

    CLUSTER=2 (LAYOUT "nt", TM even): workgroups run in clusters of two taking the two
    128-row blocks of one 256 x BN pair (the pairs in MAP's order over a TM / 2 x TN grid);
    they read the same block of B, so each has the TMA unit copy half of it into both
    (multicast), halving what B's blocks cost the L2. On the H200 that ran 1% slower than
    the same launch without clusters (docs/PERF.md, run FB): the launch rule does not take
    it.

    A_ROWS (a multiple of 8 up to 64; A stored M x K, TM = 1): A has at most that many rows,
    as a decode step's tokens. The producer copies only those rows each K step, and only
    the first consumer warpgroup multiplies: copies past the tensor's rows, which the TMA
    unit fills with zeros, slowed the copies of B beside them by a quarter to two fifths
    on the H200 (docs/PERF.md, run UL). Rows of A past A_ROWS would be left out of C."""
    if PINGPONG and (BN != 128 or TMA_STORE):
        raise pk.KernelError(f"gemm_ws PINGPONG=1 holds two 128-wide accumulators a "
                             f"warpgroup and stores C from registers: BN=128, TMA_STORE=0 "
                             f"(got BN={BN}, TMA_STORE={TMA_STORE})")
    if REFUSE_KNOWN_HANG and TMA_STORE and not PERSISTENT and BN == 128 and STAGES >= 4:
        raise pk.KernelError(
            "gemm_ws with one 128-wide block per workgroup, C staged for the TMA unit and 4 "
            "ring stages hangs the H200 once a block has 16 or more K steps (three stages, "
            "persistent launches and 256-wide blocks do not; the emulator finds no race in "
            "it: bench/litmus/gemm_hang.py). Use PERSISTENT=1, STAGES=3 or TMA_STORE=0")
    if CLUSTER not in (1, 2) or CLUSTER == 2 and (LAYOUT != "nt" or TM % 2):
        raise pk.KernelError(f"gemm_ws CLUSTER is 1, or 2 with LAYOUT 'nt' and an even "
                             f"number of block rows TM (got CLUSTER={CLUSTER!r}, "
                             f"LAYOUT={LAYOUT!r}, TM={TM})")
    if CLUSTER == 2:                    # this workgroup's half of pair i
        def tile_of(i):
            m0, n0 = output_tile(MAP, TM // 2, TN, 256, BN, TARGET, i)
            return m0 + 128 * pk.cluster_rank(), n0
    else:
        def tile_of(i):
            return output_tile(MAP, TM, TN, 128, BN, TARGET, i)
    ws_pipeline(a, b, TM * TN // CLUSTER, tile_of, ws_store(c, OUT, BN, TMA_STORE),
                DT=DT, BN=BN, STAGES=STAGES, PERSISTENT=PERSISTENT, PROMOTE=PROMOTE,
                LAYOUT=LAYOUT, PINGPONG=PINGPONG, CLUSTER=CLUSTER,
                A_ROWS=few_rows(A_ROWS, TM))


@pk.kernel(num_waves=12)
def gemm_sk(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
            part: pk.gl[pk.f32, 2], flags: pk.gl[pk.i32, 1],
            DT: pk.const = None, OUT: pk.const = None, BN: pk.const = 256,
            STAGES: pk.const = 4, TMA_STORE: pk.const = 0, MAP: pk.const = "row-major",
            TM: pk.const = 0, TN: pk.const = 0, LAYOUT: pk.const = "nt",
            A_ROWS: pk.const = 128, TARGET: pk.target = None):
    """gemm_ws, persistent, whose last blocks are split in K between workgroups
    (pk.stream_walk): every workgroup takes the same number of K steps, where gemm_ws's
    grid of G workgroups takes ceil(T / G) rounds of T blocks (and where the blocks are
    fewer than the workgroups, split-K: each block's steps are shared by several). A split
    block's workgroups meet through `part` (f32, 128 rows a lender's slot, BN columns:
    its partial sums) and `flags` (i32, 8 a slot: counters of lenders, zero before the
    launch and left zero after it): pk.StreamWalk.slots(T, G, K steps) slots. The
    workgroups of the grid must all be running at once (at most one per SM, as the launch
    rule's grid). Constants as gemm_ws's (16-bit operands, TMA_STORE 0 or 2)."""
    ws_pipeline(a, b, TM * TN, lambda i: output_tile(MAP, TM, TN, 128, BN, TARGET, i),
                ws_store(c, OUT, BN, TMA_STORE), DT=DT, BN=BN, STAGES=STAGES, PERSISTENT=1,
                PROMOTE=0, LAYOUT=LAYOUT, stream=(part, flags), A_ROWS=few_rows(A_ROWS, TM))


def few_rows(a_rows, tm) -> int:
    """gemm_ws's A_ROWS, checked: 128 (a block's two 64-row halves), or a multiple of 8 up
    to 64 where there is one row of blocks (TM = 1)."""
    if a_rows != 128 and not (isinstance(a_rows, int) and 8 <= a_rows <= 64 and
                              a_rows % 8 == 0 and tm == 1):
        raise pk.KernelError(f"gemm_ws A_ROWS is 128, or a multiple of 8 up to 64 where A "
                             f"has no more rows (one row of blocks, TM = 1); got "
                             f"A_ROWS={a_rows!r} with TM={tm}")
    return a_rows


# TMA_STORE=2's pieces: each wave's 16 rows x 64 columns (one 128-byte swizzled row of
# 16-bit C), through two tiles of its own taking turns (so a block has an even number: the
# next block's first piece then goes to the tile whose copy is the older one)
STORE_PIECE = 64


def ws_store(c, OUT, BN, TMA_STORE):
    """ws_pipeline's `store` that writes each consumer warpgroup's 64 x BN block into C:
    through shared memory and the TMA unit (TMA_STORE=1: the group's whole block through
    one tile; 2: every wave on its own, its 16 rows in pieces of 64 columns through two
    tiles of its own taking turns — no wave waits for another, and a tile is only waited
    for before its next piece), or every wave its 16 rows from registers (0). Allocates
    the staging tiles, so call it once, before ws_pipeline."""
    if TMA_STORE not in (0, 1, 2):
        raise pk.KernelError(f"gemm_ws TMA_STORE is 0 (C from registers), 1 (the whole block "
                             f"staged) or 2 (staged in 64-column pieces), not {TMA_STORE!r}")
    if TMA_STORE == 2 and BN % (2 * STORE_PIECE):
        raise pk.KernelError(f"gemm_ws TMA_STORE=2 stores pairs of {STORE_PIECE}-column "
                             f"pieces: BN must be a multiple of {2 * STORE_PIECE}, not {BN}")
    whole = [pk.StagedStore((64, BN), OUT) for _ in range(2)] if TMA_STORE == 1 else None
    # two tiles for each of the 8 consumer waves (32 KiB for 16-bit C), side by side
    mine = pk.empty(pk.st((16, STORE_PIECE), OUT, swizzle=8), count=16) \
        if TMA_STORE == 2 else None

    def store(g, acc, m0, n0, t, i, plus=None):
        """acc: columns n0 .. of the block (all of them, or a half of an even number of
        pieces). plus(piece, c0): an f32 tile like `piece` to add to acc's columns c0 ..
        (a block's partial sums from elsewhere), added piece by piece as C leaves, so no
        second accumulator's registers are held."""
        row = m0 + 64 * g + pk.wave_id() % 4 * 16

        def piece(j):                 # acc's j-th 64 columns, plus what is added there
            p = pk.subtile(acc, (0, j * STORE_PIECE), (16, STORE_PIECE))
            return p if plus is None else p + plus(p, j * STORE_PIECE)
        if plus is not None and TMA_STORE == 1:
            raise pk.KernelError("gemm_ws adds partial sums to C stored from registers or "
                                 "in pieces (TMA_STORE 0 or 2), not to a staged whole block")
        if TMA_STORE == 0 and plus is None:
            pk.store(c, acc, (row, n0))
        elif TMA_STORE == 0:
            for j in pk.static_range(acc.shape[1] // STORE_PIECE):
                pk.store(c, piece(j), (row, n0 + j * STORE_PIECE))
        elif TMA_STORE == 1:
            if acc.shape[1] != BN:
                raise pk.KernelError("gemm_ws TMA_STORE=1 stages whole blocks")
            whole[g].store(c, acc, (m0 + 64 * g, n0), use=t)
        else:
            mine0 = (g * 4 + pk.wave_id() % 4) * 2
            for j in pk.static_range(acc.shape[1] // STORE_PIECE):
                # the copy two pieces back (this tile's) has read it; the one before goes
                # on (none waits at the wave's first two pieces)
                pk.tma_store_wait(pending=1)
                tile = mine[mine0 + j % 2]
                pk.store(tile, piece(j), (0, 0))
                pk.tma_store(c, tile, (row, n0 + j * STORE_PIECE), wait=False)

    def finish(g):                  # after the walk: the last pieces have left the tiles
        if TMA_STORE == 2:
            pk.tma_store_wait()
    store.finish = finish
    store.each_wave = TMA_STORE != 1          # no wave waits for another's rows
    return store


# gemm_ws refuses the configuration that hung the H200 (see the check); the litmus script
# that reproduces the hang turns this off in its own process
REFUSE_KNOWN_HANG = True

# the producer warpgroup's registers (its idle waves' side work included); its two
# consumer warpgroups take what it leaves of the block's (pipeline.consumer_regs: 232)
PRODUCER_REGS = 40


# gemm_ws's operand layouts (BLAS's C = op(A) op(B)) -> the warpgroup MMA reading them
LAYOUTS = {"nt": pk.mma_ABt, "nn": pk.mma_AB, "tn": pk.mma_AtB}


def ws_pipeline(a, b, tiles, tile_of, store, *, DT, BN, STAGES, PERSISTENT, PROMOTE,
                LAYOUT="nt", PINGPONG=0, CLUSTER=1, before_loads=None, side_work=None,
                after_tiles=None, stream=None, A_ROWS=128, a_local=None, mark=None):
    """gemm_ws's warp-specialised pipeline over `tiles` 128 x BN output blocks, for kernels
    that differ only in which block a tile is and what becomes of it: `tile_of(i)` gives
    block i's origin (m0, n0); the producer wave calls `before_loads(i, m0)` before
    copying block i's operands (e.g. to wait until they have arrived); each consumer
    warpgroup g hands its finished 64 x BN accumulator to `store(g, acc, m0, n0, t, i)`,
    t counting this workgroup's blocks (i = block t's index; fp8 promoted on 256-wide
    blocks: each 128-column half, n0 its first column), and after its last block
    calls `store.finish(g)` where the store has one; persistent, each consumer wave
    then calls `after_tiles(g, i)` with its last block's index, if it had any. The producer
    warpgroup's other three waves, idle otherwise, run `side_work(i, 3)` (i = 0, 1, 2)
    alongside, e.g. moving data between GPUs. LAYOUT: how A and B are stored (gemm_ws).

    PINGPONG=1: the consumer warpgroups take turns over whole blocks instead of sharing
    each one (see `pingpong_consumer`).

    CLUSTER=n: workgroups in clusters of n walk `tiles` items together, item i being
    block tile_of(i) of each (e.g. n blocks one below the other); the blocks share B's
    block (B stored N x K), which each workgroup loads 1/n of into all of them.

    stream=(part, flags): the persistent walk splits the last blocks in K (pk.stream_walk)
    so every workgroup takes the same number of K steps; a split block's workgroups meet
    through `part` and `flags` (stream_finish).

    A_ROWS < 128 (gemm_ws's, checked by few_rows): each K step copies that many rows of A,
    into the first consumer's half of the stage, and the second consumer warpgroup, whose
    rows lie past A, does nothing.

    a_local=(tensor, first, rows): the blocks of A's rows first .. first + rows - 1 are
    copied from `tensor` instead, its rows from 0 (A stored M x K), e.g. an all-gather's
    own rows, which need not wait to arrive in the gathered buffer.

    mark(event, g, t, tile): every wave of consumer warpgroup g calls it where it reaches
    `event` of its t-th piece of the walk (block `tile`): "began", "computed" (its
    products retired), "stored" (stored, or lent to the block's owner) and, owning a block
    split in K, "waited" (its lenders all counted). For timelines (pk.timestamp:
    bench/chiplet_timeline.py, bench/split_timeline.py); not with PINGPONG."""
    if LAYOUT not in LAYOUTS:
        raise pk.KernelError(f"gemm_ws LAYOUT is one of {', '.join(LAYOUTS)}, not {LAYOUT!r}")
    if PINGPONG and (PROMOTE or after_tiles is not None or mark is not None):
        raise pk.KernelError("gemm_ws PINGPONG=1 takes neither PROMOTE, after_tiles nor mark")
    mark = mark or (lambda event, g, t, tile: None)
    mma, a_kmajor, b_kmajor = LAYOUTS[LAYOUT], LAYOUT[0] == "n", LAYOUT[1] == "t"
    bk = 128 // pk.dtype_of(DT).bytes                               # one 128-byte row
    a_t = pk.st((64, bk) if a_kmajor else (bk, 64), DT, swizzle=8)
    # promoting 256-wide blocks: B in two 128-row halves, each half's products promoted on
    # their own (one 128-wide product accumulator beside the two halves of C's)
    halves = 2 if PROMOTE and BN == 256 else 1
    if halves == 2 and (PROMOTE != 1 or not b_kmajor):
        raise pk.KernelError("gemm_ws promotes 256-wide blocks every K step (PROMOTE=1) "
                             "with B stored N x K; use BN=128 otherwise")
    if CLUSTER > 1 and (halves == 2 or PINGPONG or not b_kmajor or BN % (8 * CLUSTER)):
        raise pk.KernelError("gemm_ws in clusters shares whole blocks of B stored N x K, "
                             "split in parts of whole 8-row swizzle atoms: not with "
                             "PINGPONG, nor 256-wide promoted blocks")
    # consumer warpgroups with rows of A: one where A has no more than its 64; its waves
    # whose 16 rows all lie past A store (or lend) nothing where each wave stores alone
    consumers = 2 if A_ROWS == 128 else 1
    rows_alone = consumers == 1 and A_ROWS < 64 and getattr(store, "each_wave", False)
    if consumers == 1 and (not a_kmajor or PINGPONG or CLUSTER > 1):
        raise pk.KernelError("gemm_ws copies fewer rows of A (A_ROWS < 128) from A stored "
                             "M x K, without PINGPONG or clusters")
    if a_local is not None and (not a_kmajor or CLUSTER > 1 or consumers == 1):
        raise pk.KernelError("ws_pipeline copies rows of A from a second tensor (a_local) "
                             "for A stored M x K, without clusters or A_ROWS")
    if CLUSTER > 1:
        pk.cluster(CLUSTER)
    bw = BN // halves
    b_t = pk.st((bw, bk) if b_kmajor else (bk, bw), DT, swizzle=8)
    ring = pk.Ring(STAGES, fill=consumers + halves,
                   drain=4 if PINGPONG or consumers == 1 else 8, a=[a_t] * consumers,
                   b=[b_t] * halves, cluster=CLUSTER)
    if consumers == 1:
        # the stages' rows of A past A_ROWS, never copied, are zeros before any copy
        # starts: the first consumer's 64-row products past A's rows read zeros
        zeros = pk.empty(pk.rt((16, bk), DT))
        pk.fill(zeros, 0.0)
        with pk.if_(pk.wave_id() < 4):
            for j in pk.static_range(STAGES):
                pk.store(ring.stage(j).a[0], zeros, (16 * pk.wave_id(), 0))
        pk.barrier()
    steps = (a.shape[1 if a_kmajor else 0] + bk - 1) // bk
    in_flight = PROMOTE == 1 and halves == 1          # promote_in_flight's two products
    if in_flight:
        # promote_in_flight takes K steps in runs of PROMOTE_RUN, at least one: the last
        # is made whole with steps past K, which the TMA unit fills with zeros
        steps = pk.maximum(1, (steps + PROMOTE_RUN - 1) // PROMOTE_RUN) * PROMOTE_RUN

    def at(kmajor, row, k):           # a block's origin in its operand as stored
        return (row, k) if kmajor else (k, row)

    def load_a(s, src, row, i):       # K step i of the block at `row` of src, both halves
        for g in pk.static_range(2):
            pk.tma_load(s.a[g], src, at(a_kmajor, row + 64 * g, i * bk), s.full)

    if stream is not None and (not PERSISTENT or PROMOTE or PINGPONG or CLUSTER > 1 or
                               after_tiles is not None):
        raise pk.KernelError("gemm_ws splits blocks in K (stream=) in a persistent walk "
                             "without PROMOTE, PINGPONG, clusters or after_tiles")
    walk = pk.stream_walk(tiles, steps) if stream is not None else \
        pk.tile_walk(tiles, persistent=PERSISTENT, cluster=CLUSTER, steps=steps)
    # ping-pong: consumer g's turn[g] completes when the other has issued its block's
    # mainloop, so that no consumer waits for a ring step two phases ahead of the stage
    turns = [pk.mbarrier(4) for _ in range(2)] if PINGPONG else None
    if CLUSTER > 1:                   # every workgroup's barriers are set up
        pk.cluster_sync()
    # promoting with two products in turn, the consumers take 8 more registers from a
    # producer of 24 (240 each: at 232 some of the block loop's values spill)
    producer_regs = 24 if in_flight and side_work is None else PRODUCER_REGS
    with pk.role(0, 4, regs=producer_regs):
        with pk.if_(pk.wave_id() == 0):
            for t in walk:
                seg = walk.segment(t)
                m0, n0 = tile_of(seg.tile)
                if before_loads is not None:
                    before_loads(seg.tile, m0)
                for i in seg.steps():
                    s = ring.acquire(seg.ring(i))
                    if consumers == 1:
                        pk.tma_load(s.a[0], a, (m0, i * bk), s.full, rows=A_ROWS)
                    elif a_local is not None:
                        src, first, count = a_local
                        with pk.if_((m0 >= first) & (m0 < first + count)):
                            load_a(s, src, m0 - first, i)
                        with pk.else_():
                            load_a(s, a, m0, i)
                    else:
                        load_a(s, a, m0, i)
                    if CLUSTER > 1:            # this workgroup's part, into all of them
                        part = bw // CLUSTER
                        r = pk.cluster_rank()
                        pk.tma_load(s.b[0], b, (n0 + part * r, i * bk), s.full, rows=part,
                                    at=part * r, multicast=True)
                    else:
                        for h in pk.static_range(halves):
                            pk.tma_load(s.b[h], b, at(b_kmajor, n0 + bw * h, i * bk), s.full)
        if side_work is not None:
            with pk.if_(pk.wave_id() > 0):
                side_work(pk.wave_id() - 1, 3)
    for g in pk.static_range(consumers):
        with pk.role(4 + 4 * g, 4, regs=consumer_regs(producer_regs)):
            if PINGPONG:
                pingpong_consumer(g, walk, tile_of, store, ring, steps, BN, mma, turns)
                continue
            accs = [pk.empty(pk.rt((16, bw), pk.f32, role="acc")) for _ in range(halves)]
            acc = accs[0]
            part = pk.empty(acc.type) if PROMOTE else None   # PROMOTE steps' products
            if PROMOTE:
                pk.fill(part, 0.0)
            # promoting every K step of a whole block: two products taking turns
            parts = [part, pk.empty(acc.type)] if in_flight else None
            for t in walk:
                seg = walk.segment(t)
                m0, n0 = tile_of(seg.tile)
                mark("began", g, t, seg.tile)
                for x in accs:
                    pk.fill(x, 0.0)

                def step(k, into):                           # ring step k
                    s = ring.wait(k)
                    mma(into, s.a[g], s.b[0], in_flight=1)
                    with pk.if_(k > 0):                      # step k - 1's group retired
                        ring.release(k - 1)

                if parts is not None:
                    promote_in_flight(acc, parts, t * steps, steps, g, ring, mma)
                elif halves == 2:
                    # each half's products of the step alone, then added to its half of C
                    for i in pk.range(steps):
                        k = t * steps + i
                        s = ring.wait(k)
                        for h in pk.static_range(2):
                            mma(part, s.a[g], s.b[h], c=0)
                            accs[h] += part
                        ring.release(k)
                elif PROMOTE:
                    # whole intervals unrolled, then the rest: no wgmma wait in a branch
                    # (ptxas serializes every wgmma of a kernel that has one)
                    whole = steps // PROMOTE
                    for j in pk.range(whole):
                        for h in pk.static_range(PROMOTE):
                            step(seg.ring(j * PROMOTE + h), part)
                        promote(acc, part)
                    for i in pk.range(whole * PROMOTE, steps):
                        step(seg.ring(i), part)
                    promote(acc, part)                       # (zeros when none were left)
                else:
                    for i in seg.steps():
                        step(seg.ring(i), acc)
                    pk.mma_wait(acc)
                mark("computed", g, t, seg.tile)
                with pk.if_(pk.wave_id() % 4 * 16 < A_ROWS) if rows_alone else \
                        contextlib.nullcontext():    # a wave whose rows lie past A's: none
                    if stream is not None:
                        stream_finish(g, acc, seg, walk, stream, store, m0, n0, t, mark)
                    else:
                        for h in pk.static_range(halves):  # (two halves where promoted so)
                            store(g, accs[h], m0, n0 + bw * h, t, seg.tile)
                mark("stored", g, t, seg.tile)
            if hasattr(store, "finish"):
                store.finish(g)
            if after_tiles is not None and PERSISTENT:
                with pk.if_(walk.mine > 0):
                    after_tiles(g, walk.tile(walk.mine - 1))
    if CLUSTER > 1:            # no workgroup ends while the others may still reach it
        pk.cluster_sync()


# lenders' partial sums a stream walk's owner loads at once, by block width (all in
# flight together beside the accumulator: a load of 16 x 64 f32 is 32 registers a lane)
LENT_AT_ONCE = {64: 4, 128: 2, 256: 1}


def stream_finish(g, acc, seg, walk, stream, store, m0, n0, t, mark) -> None:
    """The end of a stream walk's piece for consumer warpgroup g: a whole block is stored;
    a block's later K steps (lent) leave their sums in `part` (f32, 128 rows a lender's
    slot, walk.lend_slot; one 16-row slice per consumer wave) and the wave counts itself
    in the block's counter in `flags` (i32, 8 a block: one per consumer wave, at the
    block's first slot); a block's first steps (owned) wait until every lender has counted
    itself, add the lenders' sums to theirs in order while storing C (LENT_AT_ONCE
    lenders' loads in flight at once), and zero the counter for the next launch. (The
    lenders' sums stay in L2 once added: dropping them, pk.discard, put the drops on the
    owners' last steps and was slower on the H200, docs/PERF.md run WD.)"""
    part, flags = stream
    wave = pk.wave_id() % 4
    at_once = LENT_AT_ONCE[acc.shape[1]]

    def row(slot):                    # this wave's slice of a slot's partial block
        return slot * 128 + 64 * g + 16 * wave
    counter = walk.slot(seg, 0) * 8 + 4 * g + wave

    def lent(lenders, piece, c0):     # the lenders' sums of acc's columns c0 ..
        total = pk.zeros(piece.type)
        past = walk.slot(seg, lenders) * 128     # (rows of lenders past the last read 0)
        for j in pk.range(0, lenders, at_once):
            for u in pk.static_range(at_once):
                total += pk.load(piece.type, part, (row(walk.slot(seg, j + u)), c0),
                                 **({"end": (past, None)} if u else {"inside": True}))
        return total
    with pk.if_(walk.lends(seg)):
        pk.store(part, acc, (row(walk.lend_slot(seg)), 0), inside=True)
        pk.signal(flags, counter, 1, add=True, scope="gpu")
    with pk.else_():
        with pk.if_(walk.owns_split(seg)):
            lenders = walk.lenders(seg)
            pk.wait_flag(flags, counter, lenders, tma=False, scope="gpu")
            mark("waited", g, t, seg.tile)
            store(g, acc, m0, n0, t, seg.tile,
                  plus=lambda piece, c0: lent(lenders, piece, c0))
            pk.signal(flags, counter, 0, scope="gpu")
        with pk.else_():
            store(g, acc, m0, n0, t, seg.tile)


# K steps per unrolled run of promote_in_flight (even: the two products take turns; on
# the H200 runs of 4 ran 5-11% faster than runs of 2, and runs of 8 spill in the loop)
PROMOTE_RUN = 4


def promote_in_flight(acc, parts, k0, steps, g, ring, mma) -> None:
    """acc += every K step's products of one 128-wide block, each step's wgmma group
    writing one of the two `parts` in turn (c=0) so that every group runs while the one
    before it is added (added as they come, each add waits for its group and the tensor
    cores idle unless the other consumer has one queued). Steps go in unrolled runs of
    PROMOTE_RUN (`steps` a multiple, at least one run: ws_pipeline pads it with steps of
    zeros past K), each run's last group waited for at its end: ptxas serializes every
    wgmma of a loop whose back edge carries a group in flight while another accumulator
    is read (C7514). parts[1] starts at zero, so the first add changes nothing; a run has
    an even number of steps, so each ends in parts[1]. k0: the ring step of the block's
    first K step. Releases each stage once its group has retired."""
    pk.fill(parts[1], 0.0)
    for i in pk.range(0, steps, PROMOTE_RUN):
        for h in pk.static_range(PROMOTE_RUN):
            into, done = parts[h % 2], parts[1 - h % 2]
            s = ring.wait(k0 + i + h)
            mma(into, s.a[g], s.b[0], c=0, in_flight=1)
            pk.mma_wait(done, in_flight=1)       # (the same wait, naming what it retired)
            acc += done                          # step i + h - 1's products
            with pk.if_(i + h > 0):
                ring.release(k0 + i + h - 1)
        pk.mma_wait(*parts)                      # nothing in flight across the back edge
    acc += parts[1]                              # the last step's
    ring.release(k0 + steps - 1)


def promote(acc, part) -> None:
    """acc += part once part's wgmma groups have retired; part starts again from zero."""
    pk.mma_wait(part)
    acc += part
    pk.fill(part, 0.0)


def pingpong_consumer(g, walk, tile_of, store, ring, steps, BN, mma, turns) -> None:
    """Consumer warpgroup g of 2 taking every other block of the walk whole (both 64-row
    halves, two accumulators) instead of half of every block. The producer fills the ring
    in block order, so warpgroup g's next block streams in while it stores its last one
    and the other warpgroup's mainloop keeps the tensor cores busy: the store overlaps the
    other's products (CUTLASS's ping-pong). The mainloops take turns explicitly: block t's
    starts once the other warpgroup has waited for every step of block t - 1 (turns[g]),
    since an mbarrier wait tells only a stage's current phase from the one before — a
    consumer running a whole block ahead would take a stage's earlier fill for its own.
    Each stage is released by the one warpgroup that read it."""
    accs = [pk.empty(pk.rt((16, BN), pk.f32, role="acc")) for _ in range(2)]
    for t in walk.share(g, 2):
        m0, n0 = tile_of(walk.tile(t))
        for acc in accs:
            pk.fill(acc, 0.0)
        with pk.if_(t > 0):             # the other's block t - 1: its ((t - 1) // 2)-th turn
            pk.wait(turns[g], ((t - 1) // 2) % 2)
        for i in pk.range(steps):
            k = t * steps + i
            s = ring.wait(k)
            mma(accs[0], s.a[0], s.b[0], in_flight=3)
            mma(accs[1], s.a[1], s.b[0], in_flight=2)       # step k - 1's two groups retired
            with pk.if_(i > 0):
                ring.release(k - 1)
        pk.arrive(turns[1 - g])                           # every step waited for
        pk.mma_wait(*accs)
        ring.release(t * steps + steps - 1)
        for h in pk.static_range(2):
            store(h, accs[h], m0, n0, t, walk.tile(t))
