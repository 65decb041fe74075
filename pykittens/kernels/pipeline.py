"""out = 2 * x through a warp-specialised pipeline (Hopper): warpgroup 0 produces 32 x C
blocks into a ring of shared tiles, warpgroup 1 consumes them; `full` / `empty` mbarriers
hand each slot over, and each role sets its register budget (setmaxnreg: producers shrink
to 40; with two warpgroups the entry cap is already 248, so consumers stay at 232 — with a
third warpgroup the cap drops and the producers' registers let consumers grow).
A small, checkable example of the producer/consumer structure that larger Hopper kernels
(TMA-fed GEMM and attention) are built on."""
import pykittens as pk


def consumer_regs(producer_regs: int) -> int:
    """pk.role's regs= for each consumer warpgroup of a Hopper kernel whose first
    warpgroup, its producer, takes `producer_regs`: the block starts with ptxas's entry
    cap for its size (Target.entry_register_cap) and setmaxnreg only moves
    registers between warpgroups, so the consumers share what the producer leaves, a
    multiple of 8 (12 waves: 24 -> 240, 40 -> 232; 16 waves: 24 -> 160)."""
    from pykittens.targets import get
    t = get("sm_90a")
    threads, producer = pk.num_waves() * t.wave_size, 4 * t.wave_size
    rest = t.entry_register_cap(threads) * threads - producer_regs * producer
    return min(256, rest // (threads - producer) // 8 * 8)


@pk.kernel(num_waves=8)
def ws_scale(x: pk.gl["DT", 2], out: pk.gl["DT", 2], DT: pk.const = None,
             COLS: pk.const = 64, STAGES: pk.const = 2):
    ring = [pk.empty(pk.st((32, COLS), DT)) for _ in range(STAGES)]
    full = [pk.mbarrier(4) for _ in range(STAGES)]         # producers -> consumers
    empty = [pk.mbarrier(4) for _ in range(STAGES)]        # consumers -> producers
    blocks = (x.shape[0] + 31) // 32
    c0 = pk.program_id(0) * COLS
    w = pk.wave_id() % 4                                   # wave within its warpgroup
    tile = pk.rt((8, COLS), pk.f32)
    with pk.role(0, 4, regs=40):                           # producers
        for i in pk.range(blocks):
            for s in pk.static_range(STAGES):
                with pk.if_(i % STAGES == s):
                    with pk.if_(i >= STAGES):              # slot free again?
                        pk.wait(empty[s], (i // STAGES + 1) % 2)
                    pk.store(ring[s], pk.load(tile, x, (i * 32 + w * 8, c0)), (w * 8, 0))
                    pk.arrive(full[s])
    with pk.role(4, 4, regs=232):                          # consumers
        for i in pk.range(blocks):
            for s in pk.static_range(STAGES):
                with pk.if_(i % STAGES == s):
                    pk.wait(full[s], (i // STAGES) % 2)
                    t = pk.load(tile, ring[s], (w * 8, 0))
                    pk.arrive(empty[s])
                    pk.store(out, t * 2.0, (i * 32 + w * 8, c0))


@pk.kernel(num_waves=4)
def tma_scale(x: pk.gl["DT", 2], out: pk.gl["DT", 2], DT: pk.const = None):
    """out = 2 * x in 64 x 64 tiles moved by the TMA unit both ways: a TMA load completing
    on an mbarrier, math in registers, a TMA store of the shared tile (clipped to out)."""
    s = pk.empty(pk.st((64, 64), DT))
    landed = pk.mbarrier(1)
    r0, c0 = pk.program_id(0) * 64, pk.program_id(1) * 64
    with pk.if_(pk.wave_id() == 0):
        pk.tma_load(s, x, (r0, c0), landed)
    pk.wait(landed, 0)
    t = pk.load(pk.rt((16, 64), pk.f32), s, (pk.wave_id() * 16, 0))
    pk.barrier()                                     # every wave has read its rows
    pk.store(s, t * 2.0, (pk.wave_id() * 16, 0))
    pk.barrier()                                     # every wave has written its rows
    with pk.if_(pk.wave_id() == 0):
        pk.tma_store(out, s, (r0, c0))
