"""Tile-level communication between GPUs, run in the emulator: the all-gather + GEMM and
GEMM + reduce-scatter kernels (portable and Hopper) against float64 products, the protocol
bugs the emulator's race and deadlock checks must catch (variants of the kernels with one
thing broken), the flag semantics those checks rest on, the errors for misused peers and
flags, and the ops' torch.distributed fallback in two gloo processes.

(What the code generators emit for peers and flags is tests/test_comm_codegen.py.)"""
import re
import socket

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.emulator.machine import Deadlock, OutOfBounds, Race
from pykittens.kernels import comm
from pykittens.kernels.comm import WAVES, _cdiv, _product, shard_tile

BF16 = ml_dtypes.bfloat16
TARGETS = ("gfx942", "gfx950", "sm_90a")


def rel_err(got, want) -> float:
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def f64(a):
    return np.asarray(a).astype(np.float64)


# ---- drivers: one launch per rank and kernel, as two streams of each GPU would run them ----

def ag_world(xs, wt, gathered, ready, epoch, send=None, gemm=None, chunk=128):
    """Launches of all-gather + GEMM: each rank's ag_send and ag_gemm."""
    send, gemm = send or comm.ag_send, gemm or comm.ag_gemm
    world, (ms, k), n = len(xs), xs[0].shape, wt.shape[0]
    plan = comm.ag_plan(ms, k, n, world, CHUNK=chunk)
    launches = []
    for r in range(world):
        out = np.zeros((world * ms, n), np.float32)
        launches.append((send, (xs[r], pk.Peers(gathered, r), pk.Peers(ready, r)),
                         dict(grid=plan["send_grid"], CHUNK=chunk)))
        launches.append((gemm, (gathered[r], wt, out, ready[r], r, epoch),
                         dict(grid=plan["gemm_grid"], WORLD=world, CHUNK=chunk)))
    return launches


def ag_buffers(world, ms, k, n, chunk=128):
    plan = comm.ag_plan(ms, k, n, world, CHUNK=chunk)
    return ([np.zeros((world * ms, k), BF16) for _ in range(world)],
            [np.zeros(plan["ready"], np.int32) for _ in range(world)])


def rs_world(xs, ws, parts, done, epoch, gemm=None):
    """Launches of GEMM + reduce-scatter: each rank's gemm_rs and rs_reduce."""
    gemm = gemm or comm.gemm_rs
    world, n = len(xs), ws[0].shape[0]
    ms = xs[0].shape[0] // world
    plan = comm.rs_plan(ms, n, world)
    launches = []
    for r in range(world):
        out = np.zeros((ms, n), np.float32)
        launches.append((gemm, (xs[r], ws[r], pk.Peers(parts, r), pk.Peers(done, r), epoch),
                         dict(grid=plan["gemm_grid"])))
        launches.append((comm.rs_reduce, (pk.Peers(parts, r), pk.Peers(done, r), out, epoch),
                         dict(grid=plan["reduce_grid"])))
    return launches


def rs_buffers(world, ms, n):
    plan = comm.rs_plan(ms, n, world)
    return ([np.zeros(plan["partials"], np.float32) for _ in range(world)],
            [np.zeros(plan["done"], np.int32) for _ in range(world)])


# (world, rows per rank, K, N): rows not a multiple of 64 (and, for 2 ranks, more than one
# 128-row chunk of the sends), K and N not multiples of the tiles
SIZES = {2: (136, 80, 100), 4: (40, 48, 72)}


@pytest.mark.parametrize("world", (2, 4))
@pytest.mark.parametrize("target", TARGETS)
def test_all_gather_gemm_two_epochs(target, world):
    ms, k, n = SIZES[world]
    rng = np.random.default_rng(world)
    wt = rand(rng, n, k)
    gathered, ready = ag_buffers(world, ms, k, n)
    for epoch in (1, 2):
        xs = [rand(rng, ms, k) for _ in range(world)]
        res = pk.emulate_world(ag_world(xs, wt, gathered, ready, epoch), target=target)
        want = f64(np.concatenate(xs)) @ f64(wt).T
        for r in range(world):
            assert rel_err(res[2 * r + 1]["out"], want) < 1e-2, (epoch, r)
            assert np.array_equal(f64(res[2 * r]["gathered"][r]), f64(np.concatenate(xs)))
        if epoch == 1:                       # the inputs are not modified
            assert not any(f.any() for f in ready) and not any(g.any() for g in gathered)
        # every sending wave of every rank raised each flag once per epoch
        gathered, ready = res[0]["gathered"], res[0]["ready"]
        assert all((f == WAVES * epoch).all() for f in ready), ready


@pytest.mark.parametrize("world", (2, 4))
@pytest.mark.parametrize("target", TARGETS)
def test_gemm_reduce_scatter_two_epochs(target, world):
    ms, _, n = SIZES[world]
    kl = 40                                   # each rank's slice of the inner dim
    rng = np.random.default_rng(10 + world)
    parts, done = rs_buffers(world, ms, n)
    for epoch in (1, 2):
        xs = [rand(rng, world * ms, kl) for _ in range(world)]
        ws = [rand(rng, n, kl) for _ in range(world)]
        res = pk.emulate_world(rs_world(xs, ws, parts, done, epoch), target=target)
        total = sum(f64(x) @ f64(w).T for x, w in zip(xs, ws))
        for r in range(world):
            assert rel_err(res[2 * r + 1]["out"], total[r * ms:(r + 1) * ms]) < 1e-2, (epoch, r)
        parts, done = res[0]["partials"], res[0]["done"]
        assert all((f == WAVES * epoch).all() for f in done), done


# ---- Hopper: one persistent kernel (send + GEMM), gemm_ws blocks -------------------------

@pytest.mark.parametrize("world,ms,k,n,out_dtype,grid", [
    (2, 256, 128, 512, BF16, 3),              # 8 blocks; bf16 out: TMA stores
    (4, 128, 192, 256, np.float32, 3),        # 4 blocks; f32 out: plain stores
])
def test_hopper_all_gather_gemm(world, ms, k, n, out_dtype, grid):
    consts = comm.ws_plan(ms, k, n, np.dtype(out_dtype).itemsize)
    assert grid < world * consts["TMS"] * consts["TN"]        # persistent: blocks loop
    rng = np.random.default_rng(20 + world)
    xs = [rand(rng, ms, k) for _ in range(world)]
    wt = rand(rng, n, k)
    gathered = [np.zeros((world * ms, k), BF16) for _ in range(world)]
    ready = [np.zeros((world, ms // 128), np.int32) for _ in range(world)]
    launches = [(comm.ag_gemm_ws, (xs[r], gathered[r], pk.Peers(gathered, r),
                                   pk.Peers(ready, r), wt,
                                   np.zeros((world * ms, n), out_dtype), 1),
                 dict(grid=(grid,), WORLD=world, **consts)) for r in range(world)]
    res = pk.emulate_world(launches, target="sm_90a")
    want = f64(np.concatenate(xs)) @ f64(wt).T
    for r in range(world):
        assert rel_err(res[r]["out"], want) < 1e-2, r
        flags = res[r]["ready"][r]      # rank r's: every other rank's chunks arrived,
        for s in range(world):          # its own rows read from x
            assert (flags[s] == (128 // comm.SEND_ROWS if s != r else 0)).all()


def test_hopper_gemm_reduce_scatter():
    world, ms, k, n = 2, 256, 128, 512
    consts = comm.ws_plan(ms, k, n, 2, staged_c=False)   # the blocks go to peers' memory
    tiles = consts["TMS"] * consts["TN"]
    grid = 5
    assert grid < world * tiles
    rng = np.random.default_rng(30)
    xs = [rand(rng, world * ms, k) for _ in range(world)]
    ws = [rand(rng, n, k) for _ in range(world)]
    parts = [np.zeros((world, ms, n), BF16) for _ in range(world)]
    done = [np.zeros((world, tiles), np.int32) for _ in range(world)]
    launches = []
    for r in range(world):
        launches.append((comm.gemm_rs_ws, (xs[r], ws[r], pk.Peers(parts, r),
                                           pk.Peers(done, r), 1),
                         dict(grid=(grid,), **consts)))
        launches.append((comm.rs_reduce, (pk.Peers(parts, r), pk.Peers(done, r),
                                          np.zeros((ms, n), BF16), 1),
                         dict(grid=(tiles,), BM=128, BN=consts["BN"],
                              SIGNALS=comm.WS_SIGNALS)))
    res = pk.emulate_world(launches, target="sm_90a")
    total = sum(f64(x) @ f64(w).T for x, w in zip(xs, ws))
    for r in range(world):
        assert rel_err(res[2 * r + 1]["out"], total[r * ms:(r + 1) * ms]) < 1e-2, r
        assert (res[r * 2]["done"][r] == comm.WS_SIGNALS).all()


# ---- planted bugs: copies of the kernels with one thing changed ----------------------------

def ag_send_variant(index="me", add=True):
    """comm.ag_send; index="dst" signals ready[dst, c] instead of ready[rank, c],
    index="chunk 0" ready[rank, 0]; add=False has each wave store the full count instead
    of adding 1."""
    @pk.kernel(num_waves=WAVES)
    def ag_send_v(x: pk.gl["DT", 2], gathered: pk.peers["DT", 2, "WORLD"],
                  ready: pk.peers[pk.i32, 2, "WORLD"], epoch: pk.i32,
                  DT: pk.const = None, WORLD: pk.const = None, CHUNK: pk.const = 128,
                  BK: pk.const = 128):
        me, c = gathered.rank, pk.program_id(0)
        ms = x.shape[0]
        rows = CHUNK // WAVES
        r0 = c * CHUNK + pk.wave_id() * rows
        for j in pk.range(WORLD):
            dst = (me + j) % WORLD
            for k in pk.range(_cdiv(x.shape[1], BK)):
                t = pk.load(pk.rt((rows, BK), DT), x, (r0, k * BK))
                pk.store(gathered.peer(dst), t, (me * ms + r0, k * BK),
                         end=(me * ms + ms, None))
            at = {"me": (me, c), "dst": (dst, c), "chunk 0": (me, 0)}[index]
            if add:
                pk.signal(ready.peer(dst), at, 1, add=True)
            else:
                pk.signal(ready.peer(dst), at, WAVES * epoch)
    return ag_send_v


def ag_gemm_variant(wait=True, short=0):
    """comm.ag_gemm; wait=False leaves the wait out, short=1 waits for one signal fewer
    (-1: one more)."""
    @pk.kernel(num_waves=WAVES)
    def ag_gemm_v(gathered: pk.gl["DT", 2], w: pk.gl["DT", 2], out: pk.gl["OUT", 2],
                  ready: pk.gl[pk.i32, 2], rank: pk.i32, epoch: pk.i32,
                  DT: pk.const = None, OUT: pk.const = None, WORLD: pk.const = None,
                  CHUNK: pk.const = 128, BM: pk.const = 64, BN: pk.const = 64,
                  BK: pk.const = 32):
        sa = pk.empty(pk.st((BM, BK), DT))
        sb = pk.empty(pk.st((BN, BK), DT))
        ms = gathered.shape[0] // WORLD
        src, i, n = shard_tile(pk.program_id(0), _cdiv(ms, BM), _cdiv(w.shape[0], BN), rank,
                               WORLD)
        m0, n0 = src * ms + i * BM, n * BN
        if wait:
            pk.wait_flag(ready, (src, i * BM // CHUNK), WAVES * epoch - short)
        acc, dm, dn = _product(gathered, w, sa, sb, m0, n0, src * ms + ms, DT, BK)
        pk.store(out, acc, (m0 + dm, n0 + dn), end=(src * ms + ms, None))
    return ag_gemm_v


def gemm_rs_variant(to_owner=True):
    """comm.gemm_rs; to_owner=False stores each tile into this rank's own partials."""
    @pk.kernel(num_waves=WAVES)
    def gemm_rs_v(x: pk.gl["DT", 2], w: pk.gl["DT", 2], partials: pk.peers["PT", 3, "WORLD"],
                  done: pk.peers[pk.i32, 2, "WORLD"], epoch: pk.i32,
                  DT: pk.const = None, PT: pk.const = None, WORLD: pk.const = None,
                  BM: pk.const = 64, BN: pk.const = 64, BK: pk.const = 32):
        sa = pk.empty(pk.st((BM, BK), DT))
        sb = pk.empty(pk.st((BN, BK), DT))
        me = partials.rank
        ms = x.shape[0] // WORLD
        tms, tn = _cdiv(ms, BM), _cdiv(w.shape[0], BN)
        dst, i, n = shard_tile(pk.program_id(0), tms, tn, me + 1, WORLD)
        m0, n0 = dst * ms + i * BM, n * BN
        acc, dm, dn = _product(x, w, sa, sb, m0, n0, dst * ms + ms, DT, BK)
        into = partials.peer(dst) if to_owner else partials.peer(me)
        pk.store(into, acc, (me, i * BM + dm, n0 + dn), end=(None, ms, None))
        pk.signal(done.peer(dst), (me, i * tn + n), 1, add=True)
    return gemm_rs_v


def _ag_bug_world(send, gemm, epoch=1):
    # two 64-row chunks, every sending wave with rows of each to move
    world, ms, k, n, chunk = 2, 100, 48, 64, 64
    rng = np.random.default_rng(40)
    xs = [rand(rng, ms, k) for _ in range(world)]
    wt = rand(rng, n, k)
    gathered, ready = ag_buffers(world, ms, k, n, chunk)
    launches = ag_world(xs, wt, gathered, ready, epoch, send=send, gemm=gemm, chunk=chunk)
    # the variant sends take the epoch too (a plain-store signal needs it)
    launches = [(kern, args + (epoch,) if i % 2 == 0 else args, kw)
                for i, (kern, args, kw) in enumerate(launches)]
    return launches, f64(np.concatenate(xs)) @ f64(wt).T


def _ag_bug(send_kw=None, gemm_kw=None, target="sm_90a"):
    launches, want = _ag_bug_world(ag_send_variant(**(send_kw or {})),
                                   ag_gemm_variant(**(gemm_kw or {})))
    return pk.emulate_world(launches, target=target), want


def test_bug_variants_unchanged_are_right():
    """The copies below, unbroken, pass: each failure is the one change's."""
    res, want = _ag_bug()
    assert rel_err(res[1]["out"], want) < 1e-2 and rel_err(res[3]["out"], want) < 1e-2
    rng = np.random.default_rng(41)
    world, ms, n, kl = 2, 72, 64, 40
    xs = [rand(rng, world * ms, kl) for _ in range(world)]
    ws = [rand(rng, n, kl) for _ in range(world)]
    parts, done = rs_buffers(world, ms, n)
    res = pk.emulate_world(rs_world(xs, ws, parts, done, 1, gemm=gemm_rs_variant()),
                           target="gfx942")
    total = sum(f64(x) @ f64(w).T for x, w in zip(xs, ws))
    assert rel_err(res[1]["out"], total[:ms]) < 1e-2


@pytest.mark.parametrize("target", ("gfx942", "sm_90a"))
def test_bug_gemm_without_wait_is_a_race(target):
    with pytest.raises(Race, match=r"race on global tensor 'gathered"):
        _ag_bug(gemm_kw=dict(wait=False), target=target)


def test_bug_waiting_for_one_signal_fewer_is_a_race():
    """Some sending wave's rows: the wait is sure of only three of the four signals."""
    with pytest.raises(Race, match=r"race on global tensor 'gathered.p0' \(also passed as "
                                   r"'gathered'\): reads element \(\d+, 0\), which ag_send_v "
                                   r"\(rank 0\) \[launch 0\]: workgroup \(\d, 0, 0\), wave \d "
                                   r"writes with no flag ordering the two"):
        _ag_bug(gemm_kw=dict(short=1))


def test_bug_signal_to_the_wrong_index_is_a_race():
    """Every chunk raises ready[rank, 0]: chunk 0's count can be reached by chunk 1's
    signals alone, so its rows are not ordered before the product reads them."""
    with pytest.raises(Race, match=r"race on global tensor 'gathered"):
        _ag_bug(send_kw=dict(index="chunk 0"))


def test_bug_waiting_for_one_signal_too_many_deadlocks():
    """Every flag holds the four signals of its chunk; waiting for five never ends."""
    with pytest.raises(Deadlock) as e:
        _ag_bug(gemm_kw=dict(short=-1))
    msg = str(e.value)
    # names the waiting launch and workgroup, the flag, index and value, what it holds
    for launch, flag in ((1, 0), (3, 1)):
        assert re.search(rf"ag_gemm_v \[launch {launch}\]: workgroup \(\d+, 0, 0\), wave 0 "
                         rf"waits for 'ready.p{flag}' \(also passed as 'ready'\)\[\d, \d\] "
                         r">= 5 \(it holds 4\) \[.*test_comm.py:\d+\]", msg), msg


def test_bug_signal_for_the_receiver_is_a_race():
    """ready[dst, c] instead of ready[rank, c]: a rank's own rows are announced by the
    peer that sent it other rows."""
    with pytest.raises(Race, match=r"race on global tensor 'gathered"):
        _ag_bug(send_kw=dict(index="dst"))


def test_bug_plain_store_signals_are_a_race():
    """Each wave stores the full count: the first store ends the wait, publishing only
    that wave's rows."""
    with pytest.raises(Race, match=r"comm.py:\d+: \[kernel ag_gemm_v\] race on global tensor "
                                   r"'gathered.* wave [1-3] writes with no flag ordering"):
        _ag_bug(send_kw=dict(add=False))


def test_bug_stale_epoch_is_a_race():
    """A second call that waits for the first call's count reads the buffer while this
    call's sends write it."""
    world, ms, k, n = 2, 72, 48, 64
    rng = np.random.default_rng(42)
    wt = rand(rng, n, k)
    gathered, ready = ag_buffers(world, ms, k, n)
    xs = [rand(rng, ms, k) for _ in range(world)]
    res = pk.emulate_world(ag_world(xs, wt, gathered, ready, 1), target="gfx950")
    xs = [rand(rng, ms, k) for _ in range(world)]
    with pytest.raises(Race):
        pk.emulate_world(ag_world(xs, wt, res[0]["gathered"], res[0]["ready"], 1),
                         target="gfx950")


def test_bug_gemm_rs_storing_into_its_own_partials():
    """Every rank's tiles for all owners land in one slot of its own buffer: the tiles for
    different owners write the same elements, with nothing ordering them."""
    world, ms, n, kl = 2, 72, 64, 40
    rng = np.random.default_rng(43)
    xs = [rand(rng, world * ms, kl) for _ in range(world)]
    ws = [rand(rng, n, kl) for _ in range(world)]
    parts, done = rs_buffers(world, ms, n)
    with pytest.raises(Race, match=r"race on global tensor 'partials.p0': writes element "
                                   r"\(0, 0, 0\), which gemm_rs_v \(rank 0\) \[launch 0\]"):
        pk.emulate_world(rs_world(xs, ws, parts, done, 1, gemm=gemm_rs_variant(False)),
                         target="gfx942")


@pk.kernel(num_waves=WAVES)
def handoff(x: pk.gl[pk.f32, 2], y: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2],
            flags: pk.gl[pk.i32, 1], WANT: pk.const = WAVES):
    """Workgroup 1: each wave copies its 16 rows of x into y and adds 1 to flags[0];
    workgroup 0 waits for WANT, then each wave stores the sum of y's four 16-row blocks
    (every wave reads every wave's rows)."""
    rows = pk.wave_id() * 16
    with pk.if_(pk.program_id(0) == 1):
        pk.store(y, pk.load(pk.rt((16, 64), pk.f32), x, (rows, 0)), (rows, 0))
        pk.signal(flags, 0, 1, add=True)
    with pk.else_():
        pk.wait_flag(flags, 0, WANT)
        acc = pk.zeros(pk.rt((16, 64), pk.f32))
        for q in pk.static_range(WAVES):
            acc += pk.load(pk.rt((16, 64), pk.f32), y, (q * 16, 0))
        pk.store(out, acc, (rows, 0))


def _handoff_args():
    x = np.random.default_rng(50).standard_normal((64, 64)).astype(np.float32)
    return x, (x, np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32),
               np.zeros(1, np.int32))


def handoff_want(x):
    return np.tile(x.reshape(WAVES, 16, 64).sum(0), (WAVES, 1))


def test_resident_workgroups_bound_the_waits():
    """Workgroup 0 waits for workgroup 1: with one resident at a time, 1 never starts."""
    x, args = _handoff_args()
    with pytest.raises(Deadlock, match=r"more workgroups at once than 1 per launch"):
        pk.emulate_world([(handoff, args, dict(grid=(2,)))], target="gfx942", resident=1)
    res = pk.emulate_world([(handoff, args, dict(grid=(2,)))], target="gfx942", resident=2)
    assert np.allclose(res[0]["out"], handoff_want(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="resident= must be a positive int"):
        pk.emulate_world([(handoff, args, dict(grid=(2,)))], target="gfx942", resident=0)


# ---- emulator semantics ------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_add_signals_form_a_release_sequence(target):
    """Waiting for all four adds sees all four waves' rows (each wave published only its
    own); waiting for three misses one wave's."""
    x, args = _handoff_args()
    res = pk.emulate_world([(handoff, args, dict(grid=(2,)))], target=target)
    assert np.allclose(res[0]["out"], handoff_want(x), rtol=1e-6, atol=1e-6)
    assert res[0]["flags"][0] == WAVES
    with pytest.raises(Race, match=r"race on global tensor 'y'"):
        pk.emulate_world([(handoff, args, dict(grid=(2,), WANT=WAVES - 1))], target=target)


@pk.kernel(num_waves=1)
def flag_at(flags: pk.gl[pk.i32, 2], i: pk.i32, j: pk.i32, wait: pk.i32):
    with pk.if_(wait == 1):
        pk.wait_flag(flags, (i, j), 1)
    with pk.else_():
        pk.signal(flags, (i, j), 1)


@pytest.mark.parametrize("wait", (0, 1))
def test_flag_index_out_of_range(wait):
    flags = np.ones((2, 3), np.int32)
    res = pk.emulate_world([(flag_at, (flags, 1, 2, wait), dict(grid=1))], target="gfx950")
    assert res[0]["flags"][1, 2] == 1
    with pytest.raises(OutOfBounds, match=r"flag index \(1, 3\) outside 'flags' of shape"):
        pk.emulate_world([(flag_at, (flags, 1, 3, wait), dict(grid=1))], target="gfx950")
    with pytest.raises(OutOfBounds, match=r"flag index \(-1, 0\)"):
        pk.emulate_world([(flag_at, (flags, -1, 0, wait), dict(grid=1))], target="gfx950")


@pk.kernel(num_waves=1)
def put_to(x: pk.gl[pk.f32, 2], y: pk.peers[pk.f32, 2, "W"], r: pk.i32, W: pk.const = None):
    pk.store(y.peer(r), pk.load(pk.rt((16, 64), pk.f32), x, (0, 0)), (0, 0))


@pytest.mark.parametrize("r", (-1, 2))
def test_runtime_peer_outside_the_group(r):
    x = np.ones((16, 64), np.float32)
    ys = [np.zeros((16, 64), np.float32) for _ in range(2)]
    res = pk.emulate_world([(put_to, (x, pk.Peers(ys, 0), 1), dict(grid=1))], target="sm_90a")
    assert res[0]["y"][1].all() and not res[0]["y"][0].any()
    with pytest.raises(OutOfBounds, match=rf"peer\({r}\) of a group of 2 ranks"):
        pk.emulate_world([(put_to, (x, pk.Peers(ys, 0), r), dict(grid=1))], target="sm_90a")


# ---- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("world", (0, -2, 2.0, True, None))
def test_peers_annotation_with_a_bad_world(world):
    with pytest.raises(TypeError, match="pk.peers world must be a positive int or a pk.const"):
        pk.peers[pk.f32, 2, world]
    with pytest.raises(TypeError, match=r"write pk.peers\[dtype, rank or shape, world\]"):
        pk.peers[pk.f32, 2]


def test_peers_world_must_name_a_const():
    with pytest.raises(pk.KernelError, match="takes its world size from 'W', which is not a "
                                             "pk.const parameter"):
        @pk.kernel
        def k1(y: pk.peers[pk.f32, 2, "W"], W: pk.i32):
            pass
    with pytest.raises(pk.KernelError, match="takes its world size from 'NOPE'"):
        @pk.kernel
        def k2(y: pk.peers[pk.f32, 2, "NOPE"]):
            pass


def _zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def test_peers_argument_checks():
    x = _zeros(16, 64)
    ys = [_zeros(16, 64) for _ in range(2)]
    run = lambda y, **kw: pk.emulate(put_to, x, y, 0, grid=1, target="gfx942", **kw)  # noqa
    with pytest.raises(TypeError, match=r"is a pk.peers parameter: pass pk.Peers\(tensors, "
                                        r"rank\).*not ndarray"):
        run(ys[0])
    with pytest.raises(TypeError, match=r"is a pk.peers parameter.*not list"):
        run(ys)
    with pytest.raises(TypeError, match=r"pk.Peers rank must be an int in 0..1"):
        pk.Peers(ys, 2)
    with pytest.raises(TypeError, match=r"pk.Peers rank must be an int in 0..1"):
        pk.Peers(ys, -1)
    with pytest.raises(TypeError, match=r"pk.Peers rank must be an int"):
        pk.Peers(ys, True)
    with pytest.raises(TypeError, match="pk.Peers needs one tensor per rank, got none"):
        pk.Peers([], 0)
    with pytest.raises(TypeError, match="has 2 tensors but the kernel is compiled for a group "
                                        "of 3 ranks"):
        run(pk.Peers(ys, 0), W=3)
    with pytest.raises(TypeError, match=r"rank 1's tensor has shape \(32, 64\).*one shape "
                                        "and layout on every rank"):
        run(pk.Peers([ys[0], _zeros(32, 64)], 0))
    with pytest.raises(TypeError, match=r"rank 1's tensor has shape \(16, 64\) and strides "
                                        r"\(128, 1\), rank 0's \(16, 64\) and \(64, 1\)"):
        run(pk.Peers([ys[0], _zeros(16, 128)[:, :64]], 0))
    with pytest.raises(TypeError, match=r"rank 1's tensor"):
        run(pk.Peers([ys[0], _zeros(16, 64, dtype=np.int32)], 0))
    run(pk.Peers(ys, 1))                      # and right: no error


@pk.kernel(num_waves=1)
def fixed_world(x: pk.gl[pk.f32, 2], y: pk.peers[pk.f32, 2, 3]):
    pk.store(y.peer(1), pk.load(pk.rt((16, 64), pk.f32), x, (0, 0)), (0, 0))


def test_fixed_world_takes_that_many_tensors():
    x = _zeros(16, 64)
    with pytest.raises(TypeError, match="has 2 tensors but the kernel is compiled for a group "
                                        "of 3 ranks"):
        pk.emulate(fixed_world, x, pk.Peers([_zeros(16, 64) for _ in range(2)], 0), grid=1)
    with pytest.raises(TypeError, match="has 4 tensors but the kernel is compiled for a group "
                                        "of 3 ranks"):
        pk.emulate_world([(fixed_world, (x, pk.Peers([_zeros(16, 64)] * 4, 0)), dict(grid=1))])
    res = pk.emulate_world([(fixed_world, (np.ones((16, 64), np.float32),
                                           pk.Peers([_zeros(16, 64) for _ in range(3)], 2)),
                             dict(grid=1))])
    assert [bool(y.any()) for y in res[0]["y"]] == [False, True, False]


def _trace_error(body, match, target="gfx942", **consts):
    """Tracing a kernel whose body is `body(x, y, flags, fl32)` raises KernelError `match`
    (y, flags: pk.peers; fl32 an f32 vector)."""
    @pk.kernel(num_waves=1)
    def k(x: pk.gl[pk.f32, 2], y: pk.peers[pk.f32, 2, "W"], flags: pk.peers[pk.i32, 2, "W"],
          fl32: pk.gl[pk.f32, 1], W: pk.const = 2):
        body(x, y, flags, fl32)
    with pytest.raises(pk.KernelError, match=match):
        k.specialize_for(target, **consts)


def test_a_python_int_peer_outside_the_group():
    _trace_error(lambda x, y, f, g: y.peer(5), r"y.peer\(5\): the group has ranks 0..1")
    _trace_error(lambda x, y, f, g: y.peer(-1), r"y.peer\(-1\): the group has ranks 0..3", W=4)


def test_peer_tensors_are_not_tensors():
    tile = lambda: pk.rt((16, 64), pk.f32)  # noqa: E731
    _trace_error(lambda x, y, f, g: pk.load(tile(), y, (0, 0)),
                 r"load source must be a global tensor parameter or a shared tile, got "
                 r"PeerTensors \(y holds one tensor per rank: pick one with y.local")
    _trace_error(lambda x, y, f, g: pk.load(pk.empty(pk.st((16, 64), pk.f32)), y, (0, 0)),
                 r"load source must be a global tensor .* got PeerTensors")
    _trace_error(lambda x, y, f, g: pk.store(y, pk.load(tile(), x, (0, 0)), (0, 0)),
                 r"store destination must be a global tensor or a shared tile, got PeerTensors "
                 r"\(y holds one tensor per rank")
    _trace_error(lambda x, y, f, g: pk.signal(f, (0, 0), 1),
                 r"pk.signal: flags holds one tensor per rank; pick one with flags.local")
    _trace_error(lambda x, y, f, g: pk.wait_flag(f, (0, 0), 1),
                 r"pk.wait_flag: flags holds one tensor per rank")


def test_flag_tensors_and_indices():
    _trace_error(lambda x, y, f, g: pk.signal(g, 0, 1),
                 r"pk.signal: flags are i32 tensors, fl32 holds f32")
    _trace_error(lambda x, y, f, g: pk.wait_flag(y.local, (0, 0), 1),
                 r"pk.wait_flag: flags are i32 tensors")
    _trace_error(lambda x, y, f, g: pk.wait_flag(f.local, 0, 1),
                 r"pk.wait_flag needs 2 indices into flags.peer\(\.\.\.\) \(one per dim\), got 1")
    _trace_error(lambda x, y, f, g: pk.signal(f.peer(1), (0, 0, 0), 1),
                 r"pk.signal needs 2 indices into flags.peer\(1\) \(one per dim\), got 3")
    _trace_error(lambda x, y, f, g: pk.signal(f.peer(0), (0, 0), 1.5),
                 r"a pk.signal value must be an integer, got 1.5")


def test_tma_load_from_a_runtime_peer_view():
    def body(x, y, f, g):
        bar = pk.mbarrier(arrivals=1)
        s = pk.empty(pk.st((16, 64), pk.f32))
        pk.tma_load(s, y.peer(y.rank), (0, 0), bar)
    _trace_error(body, r"pk.tma_load needs a tensor map made at launch for one tensor, not a "
                       r"rank picked at run time", target="sm_90a")


def test_emulate_world_launch_checks():
    x, args = _handoff_args()
    with pytest.raises(TypeError, match=r"launch 1 of pk.emulate_world must be a \(kernel, "
                                        r"args, kwargs\) triple"):
        pk.emulate_world([(handoff, args, dict(grid=(2,))), (handoff, args)])
    with pytest.raises(TypeError, match=r"launch 0 of pk.emulate_world must be a"):
        pk.emulate_world([handoff])
    with pytest.raises(TypeError, match=r"launch 0 \(handoff\) of pk.emulate_world needs "
                                        r"grid= in its kwargs"):
        pk.emulate_world([(handoff, args, {})])


# ---- the ops' torch.distributed fallback (CPU, gloo) --------------------------------------

def _gloo_available():
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


needs_gloo = pytest.mark.skipif(not _gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank, world, port):
    """One rank: both ops and their gradients against float64 autograd of the whole layer
    (every rank's inputs, gathered)."""
    import torch
    import torch.distributed as dist
    from pykittens.ops.comm import all_gather_linear, linear_reduce_scatter

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        def gather(t):
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.detach().contiguous())
            return [p.double().requires_grad_() for p in parts]

        def close(a, b, what):
            err = ((a.double() - b).norm() / b.norm()).item()
            assert err < 1e-5, f"rank {rank}: {what} off by {err}"

        g = torch.Generator().manual_seed(100 + rank)
        ms, k, n = 6, 10, 7
        # all-gather + linear: x this rank's rows, weight this rank's output columns
        x = torch.randn(ms, k, generator=g).requires_grad_()
        w = torch.randn(n, k, generator=g).requires_grad_()
        dy = torch.randn(world * ms, n, generator=g)
        y = all_gather_linear(x, w)
        (y * dy).sum().backward()
        xs, ws, dys = gather(x), gather(w), gather(dy)
        full = torch.cat(xs)
        ys = [full @ wi.T for wi in ws]
        sum(((yi * di).sum() for yi, di in zip(ys, dys))).backward()
        close(y, ys[rank].detach(), "all_gather_linear")
        close(x.grad, xs[rank].grad, "all_gather_linear dx")
        close(w.grad, ws[rank].grad, "all_gather_linear dweight")

        # linear + reduce-scatter: x every row, this rank's slice of the inner dim
        x = torch.randn(world * ms, k, generator=g).requires_grad_()
        w = torch.randn(n, k, generator=g).requires_grad_()
        dy = torch.randn(ms, n, generator=g)
        y = linear_reduce_scatter(x, w)
        (y * dy).sum().backward()
        xs, ws, dys = gather(x), gather(w), gather(dy)
        total = sum(xi @ wi.T for xi, wi in zip(xs, ws))
        sum(((total[r * ms:(r + 1) * ms] * dys[r]).sum() for r in range(world))).backward()
        close(y, total[rank * ms:(rank + 1) * ms].detach(), "linear_reduce_scatter")
        close(x.grad, xs[rank].grad, "linear_reduce_scatter dx")
        close(w.grad, ws[rank].grad, "linear_reduce_scatter dweight")

        for op, a in ((all_gather_linear, torch.randn(ms, k)),
                      (linear_reduce_scatter, torch.randn(world * ms, k))):
            try:
                op(a, torch.randn(n, k), fused=True)
            except ValueError as e:
                assert "not on a CUDA GPU" in str(e), e
            else:
                raise AssertionError(f"{op.__name__}(fused=True) on the CPU did not raise")
    finally:
        dist.destroy_process_group()


@needs_gloo
def test_ops_fallback_in_two_gloo_processes():
    import torch.multiprocessing as mp
    mp.spawn(_gloo_rank, args=(2, _free_port()), nprocs=2, join=True)


@needs_gloo
def test_ops_need_a_process_group():
    import torch
    import torch.distributed as dist
    from pykittens.ops.comm import all_gather_linear, linear_reduce_scatter
    assert not dist.is_initialized()
    for op in (all_gather_linear, linear_reduce_scatter):
        with pytest.raises(RuntimeError, match=r"init_process_group"):
            op(torch.randn(4, 8), torch.randn(3, 8))


# ---- the library kernels compile clean ----------------------------------------------------------

CDNA_BUILDS = [(comm.ag_send, dict(DT="bf16", WORLD=2)),
               (comm.ag_gemm, dict(DT="bf16", OUT="bf16", WORLD=2)),
               (comm.gemm_rs, dict(DT="bf16", PT="bf16", WORLD=2)),
               (comm.rs_reduce, dict(PT="bf16", OUT="bf16", WORLD=2))]


@pytest.mark.usefixtures("module_cache")
@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
@pytest.mark.parametrize("kernel,consts", CDNA_BUILDS, ids=lambda x: getattr(x, "name", ""))
def test_portable_comm_kernels_compile_for_cdna_without_spills(kernel, consts, target):
    """CDNA: emulated above, and compiled into code objects with no scratch or spills; the
    GEMMs' main loops issue MFMAs."""
    from pykittens import compiler
    from pykittens.analysis import hsaco
    from pykittens.toolchain import amdgpu
    obj = compiler.code_object(kernel, target, **consts)
    rep = hsaco.report(obj, target, num_waves=WAVES)
    assert rep["scratch_bytes"] == 0 and (rep["vgpr_spill"], rep["sgpr_spill"]) == (0, 0), rep
    if kernel in (comm.ag_gemm, comm.gemm_rs):
        insts, labels = hsaco.instructions(amdgpu.disassemble(obj, target), rep["kernel"])
        loop = hsaco.main_loop(insts, labels)
        assert loop is not None and loop.mfma(insts) > 0, rep


@pytest.mark.usefixtures("module_cache")
@pytest.mark.parametrize("kernel,extra", [(comm.ag_gemm_ws, dict(OUT="bf16")),
                                          (comm.gemm_rs_ws, dict(PT="bf16"))],
                         ids=("ag_gemm_ws", "gemm_rs_ws"))
def test_hopper_comm_kernels_have_no_spills(kernel, extra):
    """The library builds the ops launch (ws_plan's constants at a Llama-70B TP=2 shape)."""
    from pykittens import compiler
    consts = dict(comm.ws_plan(2048, 8192, 8192, 2, staged_c=kernel is comm.ag_gemm_ws),
                  DT="bf16", WORLD=2, **extra)
    rep = compiler.report(kernel, "sm_90a", **consts)
    assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, rep
