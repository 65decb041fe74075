"""Hopper thread-block clusters: pk.cluster, multicast TMA copies, arrivals on another
workgroup's mbarrier and the cluster barrier — in the emulator (results, and the races and
deadlocks of clusters done wrong), in the PTX, and gemm_ws's pairs of blocks sharing B."""
import re

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels import KERNELS, gemm_ws_grid, gemm_ws_launch
from pykittens.lang import pipeline

from conftest import rel_err

pytestmark = pytest.mark.usefixtures("module_cache")
ORDERS = ("forward", "reverse")


@pk.kernel(num_waves=4)
def share_block(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.bf16, 2], N: pk.const = 2,
                BLOCKS: pk.const = 1, FIRST_SYNC: pk.const = True,
                LAST_SYNC: pk.const = True, REMOTE: pk.const = True):
    """A cluster of N reads BLOCKS blocks of x (128 x 64) through one shared tile, each
    workgroup copying its 128 / N rows of a block into all of them; every workgroup stores
    each block at its own rows of y (block j of workgroup p at rows 128 (p BLOCKS + j)).
    The tile is refilled once every workgroup's waves released it (REMOTE; else each
    releases only its own barrier, the race of a stage refilled while another reads it)."""
    pk.cluster(N)
    t = pk.empty(pk.st((128, 64), pk.bf16, swizzle=8))
    full = pk.mbarrier(1)
    empty = pk.mbarrier(4 * N if REMOTE else 4)
    r = pk.cluster_rank()
    part = 128 // N
    w = pk.wave_id()
    if FIRST_SYNC:
        pk.cluster_sync()
    for j in pk.range(BLOCKS):
        with pk.if_(w == 0):
            with pk.if_(j > 0):
                pk.wait(empty, (j - 1) % 2)
            pk.tma_load(t, x, (128 * j + part * r, 0), full, rows=part, at=part * r,
                        multicast=True)
        pk.wait(full, j % 2)
        v = pk.load(pk.rt((32, 64), pk.bf16), t, (32 * w, 0))
        if REMOTE:
            for c in pk.static_range(N):
                pk.arrive(empty, cta=c)
        else:
            pk.arrive(empty)
        pk.store(y, v, (128 * (pk.program_id(0) * BLOCKS + j) + 32 * w, 0))
    if LAST_SYNC:
        pk.cluster_sync()


def _blocks(rng, blocks):
    return rng.standard_normal((128 * blocks, 64)).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("order", ORDERS)
def test_multicast_copies_land_in_every_workgroup_of_the_cluster(n, order, rng):
    x = _blocks(rng, 3)
    grid = 2 * n                                          # two clusters
    y = np.zeros((128 * 3 * grid, 64), x.dtype)
    got = pk.emulate(share_block, x, y, grid=grid, target="sm_90a", wave_order=order, N=n,
                     BLOCKS=3)["y"]
    assert np.array_equal(got, np.tile(x, (grid, 1)))


def test_a_stage_refilled_while_another_workgroup_reads_it_is_a_race(rng):
    """Each workgroup releases the tile only to its own barrier: the other's copy of the
    next block lands while this one's waves may still read the last."""
    x = _blocks(rng, 3)
    with pytest.raises(pk.KernelError, match="shared memory of workgroup"):
        for order in ORDERS:
            pk.emulate(share_block, x, np.zeros((768, 64), x.dtype), grid=2,
                       target="sm_90a", wave_order=order, BLOCKS=3, REMOTE=False)


def test_reaching_a_workgroup_outside_the_cluster_barriers_is_an_error(rng):
    x = _blocks(rng, 1)
    y = np.zeros((256, 64), x.dtype)
    with pytest.raises(pk.KernelError, match="before any pk.cluster_sync"):
        pk.emulate(share_block, x, y, grid=2, target="sm_90a", FIRST_SYNC=False)
    # without the last cluster barrier one workgroup may end while the other still
    # arrives on its barrier: caught where the emulator finishes a workgroup first
    with pytest.raises(pk.KernelError, match="after it ended"):
        for order in ORDERS:
            pk.emulate(share_block, x, y, grid=2, target="sm_90a", wave_order=order,
                       LAST_SYNC=False)


def test_cluster_barrier_every_wave_must_reach(rng):
    @pk.kernel(num_waves=4)
    def half_sync(y: pk.gl[pk.f32, 1]):
        pk.cluster(2)
        with pk.if_(pk.wave_id() < 2):
            pk.cluster_sync()

    with pytest.raises(pk.KernelError, match="cluster_sync"):
        pk.emulate(half_sync, np.zeros(4, np.float32), grid=2, target="sm_90a")


def test_cluster_ptx():
    asm = compiler.assembly(share_block, "sm_90a", N=2, BLOCKS=2)
    assert ".explicitcluster" in asm and ".reqnctapercluster 2, 1, 1" in asm
    assert "mov.u32" in asm and "%cluster_ctarank" in asm
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::"
                     r"complete_tx::bytes\.multicast::cluster \[[^]]+\], \[[^]]+\], "
                     r"\[[^]]+\], %rs\d+;", asm)
    # the arrival expects both halves: 128 rows x 128 bytes
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in asm
    assert "mapa.shared::cluster.u32" in asm
    assert "mbarrier.arrive.shared::cluster.b64" in asm
    assert asm.count("barrier.cluster.arrive.release.aligned;") == 2
    assert "fence.mbarrier_init.release.cluster;" in asm
    assert ".reqnctapercluster" not in compiler.assembly(KERNELS["gemm_ws"].kernel, "sm_90a",
                                                         DT="bf16", OUT="bf16", TM=2, TN=1)


def test_multicast_expects_every_part(rng):
    """The emulator's barrier completes only once every workgroup's part landed: with the
    copy issued by workgroup 0 alone, workgroup 0's waves never see their phase."""
    @pk.kernel(num_waves=4)
    def lonely(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.bf16, 2]):
        pk.cluster(2)
        t = pk.empty(pk.st((128, 64), pk.bf16, swizzle=8))
        full = pk.mbarrier(1)
        pk.cluster_sync()
        with pk.if_((pk.wave_id() == 0) & (pk.cluster_rank() == 0)):
            pk.tma_load(t, x, (0, 0), full, rows=64, multicast=True)
        with pk.if_(pk.cluster_rank() == 0):
            pk.wait(full, 0)
            pk.store(y, pk.load(pk.rt((32, 64), pk.bf16), t, (32 * pk.wave_id(), 0)),
                     (32 * pk.wave_id(), 0))
        pk.cluster_sync()

    x = _blocks(rng, 1)
    with pytest.raises(pk.KernelError, match="deadlock"):
        pk.emulate(lonely, x, np.zeros_like(x), grid=2, target="sm_90a")


def test_cluster_errors():
    @pk.kernel(num_waves=4)
    def k(y: pk.gl[pk.f32, 1], N: pk.const = 3, WHAT: pk.const = "size"):
        if WHAT == "size":
            pk.cluster(N)
        elif WHAT == "rank":
            pk.cluster_rank()
        elif WHAT == "arrive":
            pk.arrive(pk.mbarrier(1), cta=1)
        elif WHAT == "ring":
            pk.Ring(2, fill=1, drain=4, cluster=2, t=pk.st((32, 64), pk.bf16))
        elif WHAT == "nested":
            with pk.if_(pk.wave_id() == 0):
                pk.cluster(2)

    y = np.zeros(4, np.float32)
    for what, msg in (("size", "pk.cluster takes one of"), ("rank", "pk.cluster\\(n\\)"),
                      ("arrive", "launch the kernel in clusters"),
                      ("ring", "Ring\\(cluster=2\\)"), ("nested", "top level")):
        with pytest.raises(pk.KernelError, match=msg):
            pk.emulate(k, y, grid=2, target="sm_90a", WHAT=what)
    with pytest.raises(pk.KernelError, match="multiple of 2, not 3"):
        pk.emulate(k, y, grid=3, target="sm_90a", N=2)
    with pytest.raises(pk.NotSupportedYet, match="Hopper feature"):
        pk.emulate(k, y, grid=2, target="gfx950", N=2)


# ---- gemm_ws in clusters of two --------------------------------------------------------

def _gemm_inputs(rng, m, n, k, c_dtype=pk.bf16.np):
    spec = KERNELS["gemm_ws"]
    inputs = spec.make_inputs((m, n, k), pk.bf16, rng)
    inputs["c"] = np.full((m, n), np.nan, c_dtype)
    return spec, inputs


@pytest.mark.parametrize("bn,c_dtype", [(256, pk.bf16.np), (128, np.float32)])
def test_gemm_ws_pairs_of_blocks_share_b(bn, c_dtype, rng):
    """CLUSTER=2: ragged M, N and K, the pairs walked by every persistent grid of whole
    clusters from one pair at a time to all of them and one workgroup per block; bitwise
    the product of the same launch without clusters (same sums in the same order)."""
    m, n, k = 500, 600, 328
    spec, inputs = _gemm_inputs(rng, m, n, k, c_dtype)
    (grid,), rule = gemm_ws_launch(inputs, "sm_90a", bn=bn)
    alone = pk.emulate(spec.kernel, grid=(grid,), target="sm_90a", **inputs, **rule)["c"]
    assert rel_err(alone, spec.reference(inputs)["c"]) < (1e-6 if c_dtype == np.float32
                                                           else 1e-2)
    pairs = {**rule, "CLUSTER": 2}
    assert rule["TM"] == 4 and gemm_ws_grid(pairs, "sm_90a") == (4 * rule["TN"],)
    for g, order in ((gemm_ws_grid(pairs, "sm_90a")[0], "forward"), (4, "reverse"),
                     (2, "forward"), (2, "reverse")):
        got = pk.emulate(spec.kernel, grid=(g,), target="sm_90a", wave_order=order,
                         **inputs, **pairs)["c"]
        assert np.array_equal(got, alone, equal_nan=True), (g, order)
    blocks = {**pairs, "PERSISTENT": 0}
    got = pk.emulate(spec.kernel, grid=gemm_ws_grid(blocks, "sm_90a"), target="sm_90a",
                     **inputs, **blocks)["c"]
    assert np.array_equal(got, alone, equal_nan=True)
    asm = compiler.assembly(spec.kernel, "sm_90a", DT="bf16", OUT=rule.get("OUT", "bf16"),
                            **pairs)
    assert ".reqnctapercluster 2, 1, 1" in asm
    # B's part (LLVM may copy the loop's body): every other copy is this workgroup's own
    copies = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::"
                        r"complete_tx::bytes(\.multicast::cluster)?", asm)
    assert 0 < copies.count(".multicast::cluster") < len(copies)


@pytest.mark.parametrize("drain", ["doubled", "own"])
def test_gemm_ws_pairs_release_stages_in_both_workgroups(drain, rng, monkeypatch):
    """Planted: consumers release a stage only in their own workgroup (the ring's empty
    barrier still expecting both workgroups' waves: a deadlock; or only its own: the other
    workgroup's copy of its half of B overwrites a stage still being read, a race)."""
    spec, inputs = _gemm_inputs(rng, 500, 600, 512)
    _, rule = gemm_ws_launch(inputs, "sm_90a", bn=256)
    monkeypatch.setattr(pipeline.Ring, "release",
                        lambda self, step: pk.arrive(self.empty[step % self.stages]))
    if drain == "own":
        init = pipeline.Ring.__init__

        def own_drain(self, stages, *, fill, drain, cluster=1, **tiles):
            init(self, stages, fill=fill, drain=drain, **tiles)
            self.cluster = cluster
        monkeypatch.setattr(pipeline.Ring, "__init__", own_drain)
    spec.kernel._cache.clear()
    try:
        for order in ORDERS:
            with pytest.raises(pk.KernelError, match="deadlock" if drain == "doubled"
                               else "race: writes the shared memory of workgroup"):
                pk.emulate(spec.kernel, grid=(2,), target="sm_90a", wave_order=order,
                           **inputs, **{**rule, "CLUSTER": 2})
    finally:
        spec.kernel._cache.clear()


def test_gemm_ws_cluster_refusals():
    base = {"DT": "bf16", "OUT": "bf16", "TM": 2, "TN": 1, "CLUSTER": 2}
    for extra, msg in (({"TM": 3}, "even number of block rows"),
                       ({"LAYOUT": "nn"}, "LAYOUT 'nt'"),
                       ({"CLUSTER": 4}, "CLUSTER is 1, or 2"),
                       ({"BN": 128, "PINGPONG": 1}, "not with PINGPONG"),
                       ({"DT": "e4m3", "PROMOTE": 1}, "256-wide promoted")):
        with pytest.raises(pk.KernelError, match=msg):
            compiler.assembly(KERNELS["gemm_ws"].kernel, "sm_90a", **{**base, **extra})
