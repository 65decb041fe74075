"""C = A @ B with bf16/f16/fp8 operands and f32 accumulation: each workgroup stages a BM x BK
block of A and a BK x BN block of B in shared memory, and each of its 2 x 2 waves multiplies
its quadrant with the target's matrix instructions (MFMA on CDNA, mma.sync on Hopper).

Workgroups find their output tile through a chiplet-aware grid mapping (MAP, over a TM x TN
tile grid on TARGET): the launcher picks it with the cache simulator (chiplet.auto_mapping),
e.g. XCD chunking with a window on CDNA, L2-grouped rasterisation on Hopper."""
import pykittens as pk
from pykittens import chiplet


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
def gemm(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
         DT: pk.const = None, OUT: pk.const = None,
         BM: pk.const = 64, BN: pk.const = 64, BK: pk.const = 32,
         MAP: pk.const = "row-major", TM: pk.const = 0, TN: pk.const = 0,
         TARGET: pk.const = "gfx950"):
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
               TN: pk.const = 0, TARGET: pk.const = "sm_90a"):
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
            STAGES: pk.const = 4, TMA_STORE: pk.const = 0, IN_FLIGHT: pk.const = 1,
            PERSISTENT: pk.const = 0, PROMOTE: pk.const = 0, MAP: pk.const = "row-major",
            TM: pk.const = 0,
            TN: pk.const = 0, TARGET: pk.const = "sm_90a"):
    """Hopper: C = A @ B.T (B stored N x K, as a linear layer's weight), bf16/f16 or fp8
    (e4m3/e5m2) operands, f32 accumulation, 128 x BN output blocks.

    Warp-specialised: warpgroup 0 is the producer (40 registers a thread): one wave has the
    TMA unit copy each K step's two 64-row blocks of A and the BN-row block of B into a
    ring of STAGES 128B-swizzled shared stages, completing on `full[s]`. Warpgroups 1 and
    2 are consumers (232 registers): each multiplies its 64 rows of A by B with wgmma,
    both operands read from shared memory by descriptor, leaving IN_FLIGHT (1) groups
    running, and releases a stage on `empty[s]` once the group reading it has retired (the
    previous step's, with IN_FLIGHT=1). A K step is one 128-byte row of each operand (64
    bf16 or 128 fp8).

    PERSISTENT=1: a grid of at most one workgroup per SM walks the TM x TN blocks (tile
    pid, pid + grid, ...); the ring runs on across blocks, so the producer loads the next
    block while the consumers store this one.

    PROMOTE=1 (fp8): Hopper's fp8 wgmma accumulates with fewer bits than f32 (about 1e-3
    relative at K = 4096); each K step's products go to a fresh accumulator instead, added
    to the f32 one in registers (twice the accumulator registers: BN = 128).

    TMA_STORE=1 (16-bit C): each consumer writes its block through shared memory (stmatrix
    into 64 x 64 swizzled tiles, an mbarrier for the warpgroup's 4 waves) and one wave has
    the TMA unit store it; otherwise every wave stores its rows of C from registers."""
    bk = 128 // pk.dtype_of(DT).bytes                               # one 128-byte row
    sa = [[pk.empty(pk.st((64, bk), DT, swizzle=8)) for _ in range(2)] for _ in range(STAGES)]
    sb = [pk.empty(pk.st((BN, bk), DT, swizzle=8)) for _ in range(STAGES)]
    full = [pk.mbarrier(3) for _ in range(STAGES)]           # three TMA copies per stage
    empty = [pk.mbarrier(8) for _ in range(STAGES)]          # every consumer wave
    if TMA_STORE:
        sc = [[pk.empty(pk.st((64, 64), OUT, swizzle=8)) for _ in range(BN // 64)]
              for _ in range(2)]
        stored = [pk.mbarrier(4) for _ in range(2)]          # a consumer warpgroup's waves
        drained = [pk.mbarrier(1) for _ in range(2)]         # its TMA stores read sc
    steps = (a.shape[1] + bk - 1) // bk
    if PERSISTENT:
        if not TM:
            raise ValueError("PERSISTENT=1 walks a TM x TN tile grid: give TM and TN")
        grid, first = pk.num_programs(0), pk.program_id(0)
        mine = (TM * TN - first + grid - 1) // grid               # this workgroup's blocks

    def blocks():
        """The block loop: over this workgroup's blocks, or (not persistent) no loop."""
        return pk.range(mine) if PERSISTENT else (0,)

    def ring_step(t, i):
        """The ring's step count at K step i of block t (it runs on across blocks)."""
        return t * steps + i if PERSISTENT else i

    def block_origin(t):
        if PERSISTENT:
            return output_tile(MAP, TM, TN, 128, BN, TARGET, index=first + t * grid)
        return output_tile(MAP, TM, TN, 128, BN, TARGET)

    def each_stage(k, body):
        """body(s) for the ring stage s that ring step k uses (stages are static tiles)."""
        for s in pk.static_range(STAGES):
            with pk.if_(k % STAGES == s):
                body(s)

    with pk.role(0, 4, regs=40):
        with pk.if_(pk.wave_id() == 0):
            for t in blocks():
                m0, n0 = block_origin(t)
                for i in pk.range(steps):
                    k = ring_step(t, i)
                    def produce(s):
                        with pk.if_(k >= STAGES):              # wait for the stage to drain
                            pk.wait(empty[s], (k // STAGES + 1) % 2)
                        for g in pk.static_range(2):
                            pk.tma_load(sa[s][g], a, (m0 + 64 * g, i * bk), full[s])
                        pk.tma_load(sb[s], b, (n0, i * bk), full[s])
                    each_stage(k, produce)
    for g in pk.static_range(2):
        with pk.role(4 + 4 * g, 4, regs=232):
            w = pk.wave_id() % 4
            acc = pk.zeros(pk.rt((16, BN), pk.f32, role="acc"))
            if PROMOTE:
                part = pk.zeros(acc.type)                      # one K step's products
            for t in blocks():
                m0, n0 = block_origin(t)
                if PERSISTENT:
                    pk.fill(acc, 0.0)
                for i in pk.range(steps):
                    k = ring_step(t, i)
                    def consume(s):
                        pk.wait(full[s], (k // STAGES) % 2)
                        if PROMOTE:                    # products of this step, then f32
                            pk.fill(part, 0.0)
                            pk.mma_ABt(part, sa[s][g], sb[s])
                            pk.arrive(empty[s])
                            pk.add(acc, part, out=acc)
                            return
                        pk.mma_ABt(acc, sa[s][g], sb[s], in_flight=IN_FLIGHT)
                        if IN_FLIGHT:                  # step k - 1's group has retired
                            with pk.if_(k > 0):
                                pk.arrive(empty[(s - 1) % STAGES])
                        else:
                            pk.arrive(empty[s])
                    each_stage(k, consume)
                pk.mma_wait(acc)
                if TMA_STORE:
                    out = acc.cast(OUT)
                    if PERSISTENT:
                        with pk.if_(t > 0):            # the last block's stores read sc
                            pk.wait(drained[g], (t - 1) % 2)
                    for j in pk.static_range(BN // 64):
                        pk.store(sc[g][j], pk.subtile(out, (0, 64 * j), (16, 64)),
                                 (w * 16, 0))
                    pk.arrive(stored[g])
                    with pk.if_(w == 0):
                        pk.wait(stored[g], t % 2)
                        for j in pk.static_range(BN // 64):
                            pk.tma_store(c, sc[g][j], (m0 + 64 * g, n0 + 64 * j))
                        pk.arrive(drained[g])
                else:
                    pk.store(c, acc, (m0 + 64 * g + w * 16, n0))
