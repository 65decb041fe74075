"""mbarriers and warp roles: a warp-specialised producer/consumer kernel, its ordering
(races), its deadlocks, and what it compiles to on Hopper."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.emulator import BarrierMismatch, EmulatorError, Race
from pykittens.kernels import ws_scale

from conftest import needs_ptxas


@pytest.mark.parametrize("shape", [(150, 64), (37, 100), (256, 128)])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_pipeline_is_correct(shape, stages, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    out = pk.emulate(ws_scale, x, np.full_like(x, np.nan), grid=(-(-shape[1] // 64),),
                     target="sm_90a", STAGES=stages)["out"]
    np.testing.assert_array_equal(out, 2 * x)


@pk.kernel(num_waves=8)
def handoff(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], WAIT: pk.const = True,
            PARITY: pk.const = 0):
    s = pk.empty(pk.st((32, 64), pk.f32))
    full = pk.mbarrier(4)
    w = pk.wave_id() % 4
    with pk.role(0, 4):
        pk.store(s, pk.load(pk.rt((8, 64), pk.f32), x, (w * 8, 0)), (w * 8, 0))
        pk.arrive(full)
    with pk.role(4, 4):
        if WAIT:
            pk.wait(full, PARITY)  # MARK-wait
        pk.store(out, pk.load(pk.rt((8, 64), pk.f32), s, (w * 8, 0)), (w * 8, 0))  # MARK-read


def test_a_wait_orders_the_handoff(rng):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    out = pk.emulate(handoff, x, np.zeros_like(x), grid=1, target="sm_90a")["out"]
    np.testing.assert_array_equal(out, x)
    with pytest.raises(Race, match="race: reads shared memory that wave 0 wrote") as e:
        pk.emulate(handoff, x, np.zeros_like(x), grid=1, target="sm_90a", WAIT=False)
    assert "test_hopper_sync.py" in str(e.value)


def test_a_wait_that_never_completes_is_a_deadlock(rng):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    with pytest.raises(BarrierMismatch, match=r"deadlock: waves \[4, 5, 6, 7\] wait on mbarrier "
                                              r"\w+ \(phase parity 1\)") as e:
        pk.emulate(handoff, x, np.zeros_like(x), grid=1, target="sm_90a", PARITY=1)
    assert "test_hopper_sync.py" in str(e.value)


def _fill(ring, x, step, w):
    """Producer wave w: 8 rows of 32 x 64 step `step` of x into the ring."""
    st = ring.acquire(step)
    pk.store(st.s, pk.load(pk.rt((8, 64), pk.f32), x, (32 * step + 8 * w, 0)), (8 * w, 0))
    pk.arrive(st.full)


def _drain(ring, out, step, w):
    """Consumer wave w: its 8 rows of step `step` from the ring into out."""
    st = ring.wait(step)
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), st.s, (8 * w, 0)), (32 * step + 8 * w, 0))
    ring.release(step)


@pk.kernel(num_waves=12)
def alternate(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], TURNS: pk.const = 0):
    """Four blocks of two 32 x 64 steps through a two-stage ring, two consumer warpgroups
    taking alternate blocks (as gemm_ws's ping-pong does); TURNS=1 orders them (each
    starts a block once the other has waited for every step of the block before)."""
    ring = pk.Ring(2, fill=4, drain=4, s=pk.st((32, 64), pk.f32))
    turns = [pk.mbarrier(4) for _ in range(2)]
    w = pk.wave_id() % 4
    with pk.role(0, 4):
        for step in pk.static_range(8):
            _fill(ring, x, step, w)
    for g in pk.static_range(2):
        with pk.role(4 + 4 * g, 4):
            for block in pk.static_range(g, 4, 2):
                if TURNS and block > 0:
                    pk.wait(turns[g], ((block - 1) // 2) % 2)
                for step in pk.static_range(2 * block, 2 * block + 2):
                    _drain(ring, out, step, w)
                if TURNS:
                    pk.arrive(turns[1 - g])


def test_a_wait_for_a_phase_two_ahead_is_caught_in_reverse_wave_order(rng):
    """An mbarrier wait tells a stage's current phase only from the one before: consumer 1
    waiting for step 2 of a two-stage ring passes at once if the stage has not completed
    step 0 yet (phase parity 0 looks like "phase -1 done"). Forward order (the producer
    first) hides it; running the consumers first shows it."""
    x = rng.standard_normal((256, 64)).astype(np.float32)

    def run(order, **c):
        return pk.emulate(alternate, x, np.zeros_like(x), grid=1, target="sm_90a",
                          wave_order=order, **c)["out"]
    np.testing.assert_array_equal(run("forward"), x)           # hidden
    with pytest.raises(pk.KernelError, match="shared memory") as e:
        run("reverse")
    assert "test_hopper_sync.py" in str(e.value)
    for order in ("forward", "reverse"):                         # ordered: right either way
        np.testing.assert_array_equal(run(order, TURNS=1), x)
    with pytest.raises(ValueError, match="wave_order is one of forward, reverse"):
        run("random")


@pk.kernel(num_waves=8)
def one_stage(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    """Four 32 x 64 steps through a ring of one stage, indexed by a runtime step."""
    ring = pk.Ring(1, fill=4, drain=4, s=pk.st((32, 64), pk.f32))
    w = pk.wave_id() % 4
    with pk.role(0, 4):
        for step in pk.range(4):
            _fill(ring, x, step, w)
    with pk.role(4, 4):
        for step in pk.range(4):
            _drain(ring, out, step, w)


def test_a_ring_of_one_stage(rng):
    """The single stage of a ring is its barriers' and tile's region itself (its mbarrier
    was once initialised under another name than the one its waits used)."""
    x = rng.standard_normal((128, 64)).astype(np.float32)
    for order in ("forward", "reverse"):
        got = pk.emulate(one_stage, x, np.zeros_like(x), grid=1, target="sm_90a",
                         wave_order=order)["out"]
        np.testing.assert_array_equal(got, x)


@needs_ptxas
def test_hopper_ptx_and_cubin():
    res = compiler.code_object(ws_scale, "sm_90a", DT="bf16")
    ptx = res["ptx"]
    for needle in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                   "mbarrier.try_wait.parity.shared::cta.b64", "setmaxnreg.dec.sync.aligned.u32 40",
                   # 256 threads start capped at 248 registers, so 232 is a decrease too
                   "setmaxnreg.dec.sync.aligned.u32 232", ".maxnreg 248"):
        assert needle in ptx, needle
    assert res["cubin"] is not None and "0 bytes spill stores" in res["ptxas_log"]


def test_sync_errors():
    with pytest.raises(pk.NotSupportedYet, match="mbarriers are a Hopper feature"):
        compiler.lane_ir(handoff, "gfx942")

    @pk.kernel(num_waves=8)
    def half(x: pk.gl[pk.f32, 2]):
        with pk.role(0, 2, regs=40):
            pass

    with pytest.raises(pk.KernelError, match="whole warpgroups"):
        compiler.lane_ir(half, "sm_90a")
    compiler.lane_ir(half, "gfx950")                   # budgets are a Hopper notion

    @pk.kernel(num_waves=4)
    def no_arrivals(x: pk.gl[pk.f32, 2]):
        pk.mbarrier(0)

    with pytest.raises(pk.KernelError, match="arrivals must be a positive int"):
        no_arrivals.specialize()
    with pytest.raises(pk.KernelError, match="takes a pk.mbarrier"):
        @pk.kernel
        def bad(x: pk.gl[pk.f32, 2]):
            pk.arrive(x)
        bad.specialize()


@pk.kernel(num_waves=4)
def _partial_wgmma(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
                   ONLY: pk.const = 4):
    sb = pk.empty(pk.st((16, 64), pk.bf16, swizzle=8))
    pk.load(sb, b)
    pk.barrier()
    acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
    with pk.if_(pk.wave_id() < ONLY):
        pk.mma_AB(acc, pk.load(pk.rt((16, 16), pk.bf16, role="a"), a, (pk.wave_id() * 16, 0)),
                  sb)  # MARK-wg
    pk.store(c, acc, (pk.wave_id() * 16, 0))


def test_wgmma_needs_the_whole_warpgroup(rng):
    a = rng.standard_normal((64, 16)).astype(pk.bf16.np)
    b = rng.standard_normal((16, 64)).astype(pk.bf16.np)
    out = pk.emulate(_partial_wgmma, a, b, np.zeros((64, 64), np.float32), grid=1,
                     target="sm_90a")["c"]
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(BarrierMismatch, match=r"wgmma is warpgroup-wide, but of warpgroup "
                                              r"waves \[0, 1, 2, 3\] only \[0, 1\] reached"):
        pk.emulate(_partial_wgmma, a, b, np.zeros((64, 64), np.float32), grid=1,
                   target="sm_90a", ONLY=2)


@pk.kernel(num_waves=12)
def three_roles(out: pk.gl[pk.f32, 2], OVERLAP: pk.const = 0):
    """Each role adds its number into the rows of its waves; with OVERLAP the last role
    covers waves 0..7, overlapping the first."""
    t = pk.rt((1, 64), pk.f32)
    row = pk.wave_id()
    with pk.role(0, 4, regs=24):
        pk.store(out, pk.load(t, out, (row, 0)) + 1.0, (row, 0))
    with pk.role(4, 4, regs=240):
        pk.store(out, pk.load(t, out, (row, 0)) + 2.0, (row, 0))
    with pk.role(0, 8) if OVERLAP else pk.role(8, 4):
        pk.store(out, pk.load(t, out, (row, 0)) + 4.0, (row, 0))


@pytest.mark.parametrize("overlap", [0, 1])
def test_roles_over_other_waves_chain_as_else_branches(overlap):
    """Disjoint roles nest as if/else (each later role in the else branch of the ones before
    it); a role overlapping an earlier one is a branch of its own. Either way each wave runs
    exactly the roles that name it."""
    got = pk.emulate(three_roles, np.zeros((12, 64), np.float32), grid=1, target="sm_90a",
                     OVERLAP=overlap)["out"][:, 0]
    want = [1 + 4 * overlap] * 4 + [2 + 4 * overlap] * 4 + [0 if overlap else 4] * 4
    np.testing.assert_array_equal(got, want)
    top = compiler.tile_ir(three_roles, OVERLAP=overlap).body.ops
    roles = [op for op in top if op.kind == "if"]
    assert len(roles) == (2 if overlap else 1)
    assert len(roles[0].regions) == 2                         # role 2 (and 3) in its else


def test_atom_and_reducing_tma_store_errors():
    @pk.kernel(num_waves=4)
    def bad_atom(x: pk.gl[pk.bf16, 2]):
        pk.empty(pk.st((64, 128), pk.bf16, swizzle=8)).atom(2)

    with pytest.raises(pk.KernelError, match=r"atom\(2\): .* has 2 column block\(s\)"):
        compiler.tile_ir(bad_atom)

    @pk.kernel(num_waves=4)
    def bad_add(x: pk.gl[pk.i32, 2]):
        pk.tma_store(x, pk.empty(pk.st((8, 64), pk.i32)), (0, 0), add=True)

    with pytest.raises(pk.KernelError, match="adds f32, f16 or bf16 tiles, not i32"):
        compiler.tile_ir(bad_add)


@pk.kernel(num_waves=4)
def tma_after_a_barrier(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    """An unswizzled tile allocated right after an 8-byte mbarrier, filled and written back
    by TMA."""
    full = pk.mbarrier(1)
    t = pk.empty(pk.st((8, 64), pk.f32))
    with pk.if_(pk.wave_id() == 0):
        pk.tma_load(t, x, (0, 0), full)
    pk.wait(full, 0)
    with pk.if_(pk.wave_id() == 0):
        pk.tma_store(out, t, (0, 0))


def test_tma_tiles_start_on_128_byte_boundaries(rng, monkeypatch):
    """Bulk tensor copies need 128-byte-aligned shared addresses (the GPU stops with
    "misaligned address" otherwise): the lowering places every tile a TMA box could copy
    there on Hopper, and the emulator refuses a box that is not."""
    import importlib
    from pykittens.emulator import Misaligned
    lower = importlib.import_module("pykittens.lower.lower")
    x = rng.standard_normal((8, 64)).astype(np.float32)
    out = pk.emulate(tma_after_a_barrier, x, np.zeros_like(x), grid=1, target="sm_90a")["out"]
    np.testing.assert_array_equal(out, x)
    monkeypatch.setattr(lower, "TMA_ALIGN", lower.LDS_ALIGN)     # the rule left out
    with pytest.raises(Misaligned, match="not a multiple of 128"):
        pk.emulate(tma_after_a_barrier, x, np.zeros_like(x), grid=1, target="sm_90a")


@pk.kernel(num_waves=4)
def deferred_copies(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], ROUNDS: pk.const = 3,
                    PLAN: pk.const = "wait"):
    """Wave 0 copies a shared tile out ROUNDS times without waiting; every wave rewrites
    it each round. PLAN: "wait" (wave 0 waits for the copy, then lets the others write),
    "no wait" (the others write once wave 0 has only issued the copy), "never" (wave 0
    never waits)."""
    t = pk.empty(pk.st((32, 64), pk.f32))
    written, drained = pk.mbarrier(4), pk.mbarrier(1)
    w = pk.wave_id()
    for r in pk.static_range(ROUNDS):
        if r > 0:
            with pk.if_(w == 0):
                if PLAN == "wait":
                    pk.tma_store_wait()
                pk.arrive(drained)
            pk.wait(drained, (r - 1) % 2)
        rows = pk.load(pk.rt((8, 64), pk.f32), x, (32 * r + 8 * w, 0))
        pk.store(t, rows, (8 * w, 0))
        pk.arrive(written)
        with pk.if_(w == 0):
            pk.wait(written, r % 2)
            pk.tma_store(out, t, (32 * r, 0), wait=False)
    if PLAN != "never":
        with pk.if_(w == 0):
            pk.tma_store_wait()


def test_a_deferred_tma_store_reads_its_tile_until_the_wait(rng):
    x = rng.standard_normal((96, 64)).astype(np.float32)
    out = pk.emulate(deferred_copies, x, np.full_like(x, np.nan), grid=1,
                     target="sm_90a")["out"]
    np.testing.assert_array_equal(out, x)
    with pytest.raises(Race, match="may still be reading"):
        pk.emulate(deferred_copies, x, np.zeros_like(x), grid=1, target="sm_90a",
                   PLAN="no wait")
    with pytest.raises(EmulatorError, match="ends before its pk.tma_store"):
        pk.emulate(deferred_copies, x, np.zeros_like(x), grid=1, target="sm_90a",
                   PLAN="never", ROUNDS=1)
    asm = compiler.assembly(deferred_copies, "sm_90a")
    # the three pk.tma_store_wait()s, none after a copy
    assert asm.count("cp.async.bulk.commit_group") == 3
    assert asm.count("cp.async.bulk.wait_group.read 0") == 3


@pk.kernel(num_waves=12)
def _budgeted_roles(out: pk.gl[pk.f32, 2], PRODUCER: pk.const = 40, CONSUMER: pk.const = 232):
    with pk.role(0, 4, regs=PRODUCER):
        pk.store(out, pk.zeros(pk.rt((1, 64), pk.f32)), (pk.wave_id(), 0))
    for g in pk.static_range(2):
        with pk.role(4 + 4 * g, 4, regs=CONSUMER):
            pk.store(out, pk.zeros(pk.rt((1, 64), pk.f32)), (pk.wave_id(), 0))


def test_role_registers_within_what_the_workgroup_starts_with():
    """setmaxnreg moves registers between warpgroups of a block that starts with ptxas's
    cap (168 a thread for 384 threads): 40 + 2 x 232 and 24 + 2 x 240 fit exactly; 32 +
    2 x 240 asks for the SM's whole file (65536, 1024 more than the block holds), which
    on the H200 left the consumers' raise waiting forever."""
    from pykittens.targets import get
    assert get("sm_90a").entry_register_cap(384) == 168
    for producer, consumer in ((40, 232), (24, 240)):
        compiler.lane_ir(_budgeted_roles, "sm_90a", PRODUCER=producer, CONSUMER=consumer)
    with pytest.raises(pk.KernelError, match="starts with 168 a thread.*waits forever"):
        compiler.lane_ir(_budgeted_roles, "sm_90a", PRODUCER=32, CONSUMER=240)
