"""pk.cluster_sum: a vector summed over the workgroups of a cluster through each other's
shared memory (Hopper's distributed shared memory) — in the emulator against numpy, with
the waves and workgroups in either order, and in the PTX."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler

pytestmark = pytest.mark.usefixtures("module_cache")


@pk.kernel(num_waves=4)
def column_sums(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], N: pk.const = 2,
                RANK: pk.const = -1):
    """Workgroup p takes rows 32 p .. 32 p + 31 of x (its waves 8 rows each) and each wave
    sums its rows by column; the cluster adds them up (pk.cluster_sum); the workgroup of
    rank RANK (-1: each) stores its wave's sums at row (program, wave) of out."""
    if N > 1:
        pk.cluster(N)
    w = pk.wave_id()
    t = pk.load(pk.rt((8, 64), pk.f32), x, (32 * pk.program_id(0) + 8 * w, 0))
    v = pk.cluster_sum(pk.col_sum(t))
    row = pk.program_id(0) * 4 + w
    if RANK < 0:
        pk.store(out, v, (row, 0))
    else:
        with pk.if_(pk.cluster_rank() == RANK):
            pk.store(out, v, (row, 0))


def _expected(x, n, grid):
    """Each workgroup's per-wave column sums, then their sums over its cluster."""
    sums = x.reshape(grid, 4, 8, 64).astype(np.float64).sum(axis=2)     # (grid, 4, 64)
    clusters = sums.reshape(grid // n, n, 4, 64).sum(axis=1)
    return np.repeat(clusters, n, axis=0).reshape(grid * 4, -1)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_every_workgroup_gets_its_clusters_sum(n, order, rng):
    grid = 2 * n if n > 1 else 3
    x = rng.standard_normal((32 * grid, 64)).astype(np.float32)
    out = np.zeros((4 * grid, 64), np.float32)
    got = pk.emulate(column_sums, x, out, grid=grid, target="sm_90a", wave_order=order,
                     N=n)["out"]
    np.testing.assert_allclose(got, _expected(x, n, grid), rtol=1e-5, atol=1e-5)
    # the same bits in every workgroup of a cluster (added in rank order)
    for c in range(grid // n):
        block = got[4 * n * c:4 * n * (c + 1)].reshape(n, 4, 64)
        assert all(np.array_equal(block[0], block[r]) for r in range(n))


def test_one_rank_stores_the_partial_row_of_its_cluster(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    out = np.zeros((16, 64), np.float32)
    got = pk.emulate(column_sums, x, out, grid=4, target="sm_90a", N=2, RANK=0)["out"]
    want = _expected(x, 2, 4)
    for p in range(4):
        rows = slice(4 * p, 4 * p + 4)
        np.testing.assert_allclose(got[rows], want[rows] if p % 2 == 0 else 0, atol=1e-5)


def test_it_reads_the_other_workgroups_shared_memory():
    asm = compiler.assembly(column_sums, "sm_90a", N=2)
    assert ".reqnctapercluster 2, 1, 1" in asm
    assert "mapa.shared::cluster" in asm and "ld.shared::cluster" in asm
    assert asm.count("barrier.cluster.arrive.release.aligned;") == 2
    alone = compiler.assembly(column_sums, "sm_90a", N=1)
    assert "shared::cluster" not in alone and "barrier.cluster" not in alone


def test_it_takes_a_register_vector():
    @pk.kernel(num_waves=4)
    def tile_sum(y: pk.gl[pk.f32, 2]):
        pk.cluster(2)
        pk.cluster_sum(pk.zeros(pk.rt((16, 16), pk.f32)))

    with pytest.raises(pk.KernelError, match="cluster_sum: takes a register vector"):
        pk.emulate(tile_sum, np.zeros((16, 16), np.float32), grid=2, target="sm_90a")
