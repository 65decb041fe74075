"""out = 2 * x through a warp-specialised pipeline (Hopper): warpgroup 0 produces 32 x C
blocks into a ring of shared tiles, warpgroup 1 consumes them; `full` / `empty` mbarriers
hand each slot over, and each role sets its register budget (setmaxnreg: producers shrink
to 40; with two warpgroups the entry cap is already 248, so consumers stay at 232 — with a
third warpgroup the cap drops and the producers' registers let consumers grow).
A small, checkable example of the producer/consumer structure that larger Hopper kernels
(TMA-fed GEMM and attention) are built on."""
import pykittens as pk


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
