"""gemm_sk: gemm_ws's persistent walk with its last blocks split in K between workgroups
(pk.stream_walk). Each case is run by the emulator against float64 products; a K step
taken twice or not at all, or a partial sum lost between a block's two workgroups,
shows in the product."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels.gemm import gemm_sk, gemm_ws

from conftest import rel_err

pytestmark = pytest.mark.usefixtures("module_cache")


def _run(rng, m, n, steps, grid, bn=128, c_dtype=pk.bf16.np, tma_store=2,
         wave_order="forward", stages=4):
    k = 64 * steps
    a = rng.standard_normal((m, k)).astype(pk.bf16.np)
    b = rng.standard_normal((n, k)).astype(pk.bf16.np)
    tm, tn = -(-m // 128), -(-n // bn)
    slots = max(1, pk.StreamWalk.slots(tm * tn, grid, steps))
    out = pk.emulate(gemm_sk, grid=(grid,), target="sm_90a", wave_order=wave_order,
                     a=a, b=b, c=np.full((m, n), np.nan, c_dtype),
                     part=np.full((slots * 128, bn), np.nan, np.float32),
                     flags=np.zeros(slots * 8, np.int32), DT="bf16",
                     OUT="f32" if c_dtype == np.float32 else "bf16", BN=bn, TM=tm, TN=tn,
                     TMA_STORE=tma_store, STAGES=stages)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    return rel_err(out["c"], want), out["flags"]


@pytest.mark.parametrize("m, n, steps, grid", [
    (256, 256, 5, 3),      # 4 blocks, every one in the split rounds: 6, 7, 7 steps each
    (384, 384, 3, 2),      # 9 blocks: 3 whole rounds, then 3 blocks split over 2
    (200, 296, 2, 4),      # 6 ragged blocks over 4: one step of a block lent, one owned
    (256, 256, 3, 2),      # 4 blocks over 2: nothing to split
    (128, 384, 2, 5),      # 3 blocks, 5 workgroups: each block's 2 steps shared by 2
    (128, 384, 7, 5),      # split-K: 21 steps over 5, each block's 7 by 2 or 3 workgroups
    (128, 128, 3, 5),      # one block of 3 steps, 5 workgroups: two take none
    (128, 256, 5, 7),      # 2 blocks of 5 steps over 7 workgroups: runs of 1 or 2
    (256, 128, 9, 7),      # 2 blocks, 7 workgroups: 18 steps, runs of 2 or 3
])
def test_every_k_step_of_every_block_once(m, n, steps, grid, rng):
    err, flags = _run(rng, m, n, steps, grid)
    assert err < 1e-2
    assert not flags.any()                      # lowered again for the next launch


def test_split_blocks_with_f32_c_from_registers_consumers_first(rng):
    """C stored from registers (TMA_STORE=0) in f32, so the sum of a block's two halves is
    checked to f32 rounding, with the consumers running first (a flag wait that passes
    early would read the NaNs the lender's slice starts as)."""
    err, flags = _run(rng, 384, 256, 5, 4, bn=128, c_dtype=np.float32, tma_store=0,
                      wave_order="reverse")
    assert err < 1e-6 and not flags.any()


def test_256_wide_blocks_split(rng):
    err, _ = _run(rng, 384, 512, 3, 4, bn=256)
    assert err < 1e-2


def test_64_wide_blocks_split_with_c_from_registers(rng):
    """64-wide blocks (not the launch rule's; C stored from registers): 16 blocks of 9
    steps over 20 workgroups, four lenders' loads at once."""
    err, flags = _run(rng, 256, 512, 9, 20, bn=64, c_dtype=np.float32, tma_store=0)
    assert err < 1e-6 and not flags.any()


def test_the_narrow_split_build_on_even_runs(rng):
    """The launch rule's 64-wide split (kernels.NARROW_SPLIT: eight stages, C from
    registers) on even runs: 4 blocks of 12 steps over 8 workgroups, two runs of 6 a
    block, so the ring wraps within a run."""
    err, flags = _run(rng, 128, 256, 12, 8, bn=64, tma_store=0, stages=8)
    assert err < 1e-2 and not flags.any()


def test_slots():
    assert pk.StreamWalk.slots(512, 132, 64) == 116 + 132   # after whole rounds: one lender
    assert pk.StreamWalk.slots(528, 132, 64) == 0           # whole rounds
    # 32 blocks of 224 steps: runs of 54, so a block has at most 5 lenders
    assert pk.StreamWalk.slots(32, 132, 224) == 32 * 5
    assert pk.StreamWalk.slots(1, 4, 2) == 2                # 2 of 4 workgroups take a step


def test_stream_walk_refusals():
    a = np.zeros((128, 64), pk.bf16.np)
    with pytest.raises(pk.KernelError, match="staged whole block"):
        pk.emulate(gemm_sk, grid=(1,), target="sm_90a", a=a, b=a,
                   c=np.zeros((128, 128), pk.bf16.np), part=np.zeros((128, 128), np.float32),
                   flags=np.zeros(8, np.int32), DT="bf16", OUT="bf16", BN=128, TM=1, TN=1,
                   TMA_STORE=1, STAGES=3)
    with pytest.raises(pk.KernelError, match="number of tiles as a Python int"):
        pk.stream_walk(0, 4)

    @pk.kernel(num_waves=1)
    def segments_without_steps(x: pk.gl[pk.f32, 2]):
        walk = pk.tile_walk(4, persistent=True)
        for t in walk:
            walk.segment(t)
    with pytest.raises(pk.KernelError, match=r"walk.segment needs the K steps a tile: "
                                             r"pk.tile_walk\(..., steps=\)"):
        pk.emulate(segments_without_steps, np.zeros((16, 64), np.float32), grid=1)

    @pk.kernel(num_waves=12)
    def promoted_stream(a: pk.gl[pk.e4m3, 2], b: pk.gl[pk.e4m3, 2], c: pk.gl[pk.bf16, 2],
                        part: pk.gl[pk.f32, 2], flags: pk.gl[pk.i32, 1]):
        from pykittens.kernels.gemm import ws_pipeline, ws_store
        ws_pipeline(a, b, 2, lambda i: (0, 128 * i), ws_store(c, "bf16", 128, 0), DT="e4m3",
                    BN=128, STAGES=3, PERSISTENT=1, PROMOTE=1, stream=(part, flags))
    with pytest.raises(pk.KernelError, match="splits blocks in K .* without PROMOTE"):
        f8 = np.zeros((128, 128), pk.e4m3.np)
        pk.emulate(promoted_stream, f8, f8, np.zeros((128, 256), pk.bf16.np),
                   np.zeros((128, 128), np.float32), np.zeros(8, np.int32), grid=1,
                   target="sm_90a")


def _rule(m, n, k):
    from pykittens.kernels import gemm_ws_launch
    from pykittens.ops.matmul import ws_operands
    return gemm_ws_launch(ws_operands("nt", m, k, n, 2), "sm_90a")[1]


def test_the_launch_rule_splits_few_blocks_with_long_k():
    """Split-K where at most half the SMs would have a block and each workgroup gets at
    least SPLIT_K_MIN_STEPS K steps (as the H200's measured wins), not otherwise."""
    from pykittens.kernels import SPLIT_K_MIN_STEPS, gemm_split_k
    (grid,), consts, slots = gemm_split_k(_rule(128, 4096, 14336), "sm_90a", 14336)
    assert grid == 128 and consts["BN"] == 128 and "PERSISTENT" not in consts
    # 32 blocks of 224 K steps in runs of 56 on 128 workgroups (split_grid): four runs,
    # four slots, a block (on 132, runs of 54 crossing blocks took five)
    assert slots == 32 * 4 and SPLIT_K_MIN_STEPS * 132 <= 32 * 224
    assert gemm_split_k(_rule(128, 4096, 4096), "sm_90a", 4096) is not None  # 15.5 steps
    assert gemm_split_k(_rule(128, 4096, 1024), "sm_90a", 1024) is None      # 3.9 steps
    assert gemm_split_k(_rule(256, 8192, 8192), "sm_90a", 8192) is None      # 128 blocks
    assert gemm_split_k(_rule(4096, 4096, 4096), "sm_90a", 4096) is None


def test_the_launch_rule_narrows_full_row_blocks_that_split_evenly():
    """64-wide split blocks (NARROW_SPLIT) where they split evenly and m fills A's 128-row
    blocks, in the nt layout the H200 measured; 128-wide otherwise."""
    from pykittens.kernels import NARROW_SPLIT, gemm_split_k

    def plan(m, n, k, **over):
        return gemm_split_k({**_rule(m, n, k), **over}, "sm_90a", k, m=m, n=n)
    (grid,), consts, _ = plan(128, 4096, 14336)
    assert grid == 128 and consts["BN"] == 64 and consts["TN"] == 64 and \
        consts["STAGES"] == NARROW_SPLIT["STAGES"] and "TMA_STORE" not in consts
    assert plan(16, 4096, 14336)[1]["BN"] == 128          # rows past m: zeros read
    assert plan(256, 4096, 14336)[1]["BN"] == 128         # 128 narrow blocks: one run each
    assert plan(128, 4096, 14336, LAYOUT="nn")[1]["BN"] == 128
    assert gemm_split_k(_rule(128, 4096, 14336), "sm_90a", 14336)[1]["BN"] == 128  # no m


def test_split_grid_gives_every_block_equal_runs():
    """The split launch's grid: as many runs a block as one workgroup a CU allows, where
    they cut every block's K steps evenly (so no run crosses into the next block); none
    where they do not, or where a block would get one run."""
    from pykittens.kernels import split_grid
    assert split_grid(32, 224, 132) == 128          # 4 runs of 56 a block
    assert split_grid(32, 64, 132) == 128           # 4 runs of 16
    assert split_grid(16, 224, 132) == 128          # 8 runs of 28
    assert split_grid(48, 100, 132) == 96           # 2 runs of 50
    assert split_grid(48, 101, 132) is None         # 2 runs would not be equal
    assert split_grid(10, 90, 132) is None          # 13 runs would not be equal
    assert split_grid(112, 64, 132) is None         # one run a block: nothing splits


def test_linear_splits_k_on_cpu_tensors(monkeypatch):
    """pykittens.ops.linear through gemm_sk (the rule's threshold lowered so a shape the
    emulator runs quickly splits): forward and backward against float64, and the
    workspace's flags left zero."""
    import sys
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    import pykittens.kernels as K
    M = sys.modules["pykittens.ops.matmul"]
    monkeypatch.setattr(K, "SPLIT_K_MIN_STEPS", 0)
    M._plan.cache_clear()
    try:
        kernel, grid, consts, slots = M._plan("sm_90a", "nt", 128, 512, 256, 2)
        assert kernel is M.gemm_sk and grid == (16,) and slots
        g = torch.Generator().manual_seed(0)
        x = torch.randn(128, 512, generator=g).to(torch.bfloat16).requires_grad_()
        w = (torch.randn(256, 512, generator=g) / 8).to(torch.bfloat16).requires_grad_()
        y = pko.linear(x, w)
        want = F.linear(x.double(), w.double())
        assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
        y.double().sum().backward()                    # dY = 1: dX = 1 W, dW = 1^T X
        ones = torch.ones(128, 256, dtype=torch.float64)
        for got, want in ((x.grad, ones @ w.double()), (w.grad, ones.t() @ x.double())):
            assert ((got.double() - want).norm() / want.norm()).item() < 1e-2
    finally:
        M._plan.cache_clear()


def test_the_dram_stream_benchmark_reads_each_workgroups_slab():
    """bench/dram_stream.py's stream_reads (how split-K's reads of B meet DRAM), in the
    emulator: 4 workgroups over a 128 x 512 matrix, 64 rows and half of K each, two copies
    a stage in two stages: each wave's 16 x 64 sum is its rows of the first copy of each
    step (columns k0 + 128 s .. + 64), summed over the steps."""
    import os
    import sys

    import ml_dtypes
    import numpy as np

    import pykittens as pk
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    from dram_stream import stream_reads
    rng = np.random.default_rng(1)
    b = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    a = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    out = np.zeros((4 * 64, 64), np.float32)
    got = pk.emulate(stream_reads, b, a, out, grid=4, K=512, ROWS=64, SPLIT=2, STAGES=2,
                     BOXES=2, A=1, LATE=1, target="sm_90a")["out"]
    bf = b.astype(np.float64)
    for w in range(4):
        r0, k0 = 64 * (w // 2), 256 * (w % 2)
        for wave in range(4):
            rows = slice(r0 + 16 * wave, r0 + 16 * wave + 16)
            want = sum(bf[rows, k0 + 128 * s: k0 + 128 * s + 64] for s in range(2))
            assert np.allclose(got[64 * w + 16 * wave: 64 * w + 16 * wave + 16], want,
                               rtol=1e-6, atol=1e-5)


def test_the_split_timeline_stamps_every_piece_of_the_walk(rng):
    """bench/split_timeline.py's gemm_sk_timeline (gemm_sk with ws_pipeline's `mark`
    stamping): C as gemm_sk's, bit for bit; every piece of every workgroup's walk stamped
    began <= computed <= stored by both consumers; owners (and only they) waited; the
    analysis counts the pieces and owners the walk has."""
    from conftest import bench_script
    st = bench_script("split_timeline")
    m, n, steps, grid = 128, 384, 7, 5          # 3 blocks of 7 steps over 5 workgroups
    k = 64 * steps
    a = rng.standard_normal((m, k)).astype(pk.bf16.np)
    b = rng.standard_normal((n, k)).astype(pk.bf16.np)
    slots = pk.StreamWalk.slots(3, grid, steps)
    args = dict(a=a, b=b, c=np.zeros((m, n), pk.bf16.np),
                part=np.zeros((slots * 128, 128), np.float32),
                flags=np.zeros(slots * 8, np.int32), DT="bf16", OUT="bf16", BN=128,
                TM=1, TN=3, TMA_STORE=2)
    lib = pk.emulate(gemm_sk, grid=(grid,), target="sm_90a", **args)
    got = pk.emulate(st.gemm_sk_timeline, grid=(grid,), target="sm_90a",
                     rec=np.zeros((st.record_rows(grid), 4), np.int32), **args)
    assert np.array_equal(lib["c"].view(np.uint16), got["c"].view(np.uint16))
    t = got["rec"].astype(np.int64)[:, 0].reshape(grid * st.PIECES, len(st.EVENTS), 2)
    began, computed, waited, stored = (t[:, e] for e in range(4))
    live = stored > 0                           # the pieces walked (both consumers)
    assert (live[:, 0] == live[:, 1]).all() and live[::st.PIECES].all()
    assert (began[live] <= computed[live]).all() and (computed[live] < stored[live]).all()
    owners = live & (waited > 0)
    assert (waited[owners] < stored[owners]).all() and (waited[owners] >= computed[owners]).all()
    # every block is split (7 steps, runs of 4 or 5): one owner piece each, the rest lend
    assert owners[:, 0].sum() == 3 and live[:, 0].sum() > 3
    a_ = st.analyse(grid, got["rec"].astype(np.int64), n * k * 2)
    assert (a_["pieces"], a_["owners"]) == (live[:, 0].sum(), 3)
    spans = st.spans(grid, got["rec"].astype(np.int64))
    phases = [s.phase for s in spans]
    assert phases.count("products") == live[:, 0].sum()
    assert phases.count("owner waits for its lenders") == 3
