"""The partitioned-L2 model of Hopper and persistent launches: invariants of the model, not
its calibration points (those are in docs/chiplet.md, against Nsight Compute)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykittens import chiplet
from pykittens.chiplet import mapping as M
from pykittens.chiplet.sim import Machine, Timing, partitioned_replay, simulate

LOCKSTEP = Timing(launch_skew=0.0, phase_jitter=0.0, tile_jitter=0.0, walk_jitter=0.0)


def hopper(l2_bytes=None):
    return Machine.of("sm_90a", l2_bytes=l2_bytes)


def compulsory(op):
    return (op.m + op.n) * op.k * 2          # bf16 A and B, every row a whole number of lines


def test_machine_of_hopper_reads_the_partitions_from_the_target():
    m = Machine.of("sm_90a")
    assert m.l2_partitions == 2 and m.l2_bytes == 60_000_000 and m.llc_bytes == 0
    assert Machine.of("gfx950").l2_partitions == 1
    with pytest.raises(ValueError, match="l2_partitions"):
        Machine.of("sm_90a", l2_partitions=0)
    with pytest.raises(ValueError, match="one die"):
        Machine.of("gfx950", l2_partitions=2)
    with pytest.raises(ValueError, match="persistent"):
        simulate(chiplet.Gemm(512, 512, 512), M.gemm_row_major(2, 2), "sm_90a", persistent=0)


def test_slots_sit_beside_the_partition_of_the_sm_the_dispatcher_gives_them():
    """The H200's measured placement (targets/sm90a.py): workgroups 0-7 on SMs 124-131, the
    rest in the dispatcher's cycle; 66 SMs beside each partition, in pairs; consecutive
    slots on the same side in runs, not alternating."""
    from pykittens.targets import get
    t, m = get("sm_90a"), Machine.of("sm_90a")
    assert sorted(t.dispatch_sms) == list(range(132)) and t.dispatch_sms[:8] == tuple(
        range(124, 132))
    assert sorted(t.sm_l2_partition) == [0] * 66 + [1] * 66
    assert all(t.sm_l2_partition[2 * i] == t.sm_l2_partition[2 * i + 1] for i in range(66))
    assert m.slot_partition == tuple(t.sm_l2_partition[s] for s in t.dispatch_sms)
    assert len(set(m.slot_partition[:8])) == 1
    assert Machine.of("sm_90a", wgs_per_cu=2).slot_partition == m.slot_partition * 2
    changes = sum(a != b for a, b in zip(m.slot_partition, m.slot_partition[1:]))
    assert changes < 20                      # runs (alternating would change 131 times)


def test_the_slots_sides_decide_where_requests_look_first():
    """Every slot beside partition 0: partition 1 gets no request of its own (its hit rate
    is None) and every DRAM read is of a unit partition 0 missed; the measured sides spread
    requests over both (32 tiles would not: the first 32 slots are all on one side)."""
    op = chiplet.Gemm(4096, 4096, 256, bm=128, bn=256, bk=64)
    mp = M.gemm_row_major(*op.grid)
    one_side = dataclasses.replace(hopper(), slot_partition=(0,) * 132)
    r = simulate(op, mp, machine=one_side)
    assert r.xcd_l2_hit_rates[0] is not None and r.xcd_l2_hit_rates[1] is None
    both = simulate(op, mp, machine=hopper())
    assert all(h is not None for h in both.xcd_l2_hit_rates)
    few = simulate(chiplet.Gemm(1024, 1024, 256, bm=128, bn=256, bk=64),
                   M.gemm_row_major(8, 4), machine=hopper())
    assert sum(h is None for h in few.xcd_l2_hit_rates) == 1


def test_replay_counts_both_lookups_of_a_far_miss():
    # unit 7 homed on partition 1, requested from partition 0 twice, then from partition 1
    lookups, hits, dram, near, req = partitioned_replay(
        np.array([7, 7, 7]), np.array([0, 0, 1]), np.array([1, 1, 1]), 4, 2)
    # 1st: near miss + home miss (2 lookups, DRAM); 2nd: near hit; 3rd: home is near: hit
    assert (lookups, hits, dram, near, req) == (4, 2, 1, [1, 1], [2, 1])


@settings(max_examples=12, deadline=None)
@given(w=st.integers(1, 6), size=st.sampled_from([512, 1024, 1536]),
       persistent=st.sampled_from([None, 5, 16]))
def test_dram_reads_at_least_the_compulsory_bytes_and_exactly_them_with_a_huge_l2(
        w, size, persistent):
    op = chiplet.Gemm(size, size, size, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, w)
    small = simulate(op, mp, machine=hopper(1 << 20), persistent=persistent)
    huge = simulate(op, mp, machine=hopper(1 << 32), persistent=persistent)
    assert huge.hbm_read_bytes == compulsory(op)
    assert small.hbm_read_bytes >= compulsory(op)
    assert 0.0 <= small.l2_hit_rate <= huge.l2_hit_rate <= 1.0


def test_persistent_and_per_tile_read_the_same_compulsory_bytes():
    op = chiplet.Gemm(2048, 2048, 1024, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, 4)
    per_tile = simulate(op, mp, machine=hopper(1 << 32))
    walk = simulate(op, mp, machine=hopper(1 << 32), persistent=13)
    assert per_tile.hbm_read_bytes == walk.hbm_read_bytes == compulsory(op)
    assert per_tile.l2_request_bytes == walk.l2_request_bytes


@settings(max_examples=10, deadline=None)
@given(a=st.integers(1 << 20, 16 << 20), b=st.integers(1 << 20, 16 << 20),
       w=st.integers(1, 8), persistent=st.sampled_from([None, 24]))
def test_more_l2_never_lowers_the_hit_rate_or_raises_dram(a, b, w, persistent):
    lo, hi = sorted((a, b))
    op = chiplet.Gemm(2048, 2048, 1024, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, w)
    r_lo = simulate(op, mp, machine=hopper(lo), persistent=persistent)
    r_hi = simulate(op, mp, machine=hopper(hi), persistent=persistent)
    assert r_hi.l2_hit_rate >= r_lo.l2_hit_rate - 1e-12
    assert r_hi.hbm_read_bytes <= r_lo.hbm_read_bytes


def test_same_tiles_in_the_same_order_give_the_same_result():
    # windows of all rows, or of more rows than there are: both walk column-major
    op = chiplet.Gemm(1024, 2048, 1024, bm=128, bn=256, bk=64)
    rows, cols = op.grid
    a = simulate(op, M.gemm_grouped(rows, cols, rows), machine=hopper(4 << 20), persistent=20)
    b = simulate(op, M.gemm_grouped(rows, cols, 3 * rows), machine=hopper(4 << 20),
                 persistent=20)
    assert (a.l2_hit_rate, a.hbm_read_bytes, a.l2_lookup_bytes) == \
        (b.l2_hit_rate, b.hbm_read_bytes, b.l2_lookup_bytes)


def test_without_jitter_a_per_tile_launch_is_the_persistent_walk():
    # all slots free at once and every tile equally long: the slot that frees first is
    # the next one in order, so tile i runs on slot i % R either way
    op = chiplet.Gemm(2048, 2048, 512, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, 2)
    per_tile = simulate(op, mp, machine=hopper(2 << 20), timing=LOCKSTEP)
    walk = simulate(op, mp, machine=hopper(2 << 20), timing=LOCKSTEP, persistent=132)
    assert per_tile.l2_hit_rate == walk.l2_hit_rate
    assert per_tile.hbm_read_bytes == walk.hbm_read_bytes


def test_jitter_separates_persistent_from_per_tile():
    # with tile lengths jittered, a persistent walk's workgroups drift apart while a
    # dynamic launch keeps its running tiles a window of the launch order
    op = chiplet.Gemm(4096, 4096, 2048, bm=128, bn=256, bk=64)
    mp = M.gemm_row_major(*op.grid)
    t = Timing(tile_jitter=0.3, walk_jitter=0.3)
    per_tile = simulate(op, mp, machine=hopper(8 << 20), timing=t)
    walk = simulate(op, mp, machine=hopper(8 << 20), timing=t, persistent=40)
    assert per_tile.hbm_read_bytes != walk.hbm_read_bytes


def test_each_launch_kind_takes_its_own_jitter():
    op = chiplet.Gemm(4096, 4096, 2048, bm=128, bn=256, bk=64)
    mp = M.gemm_row_major(*op.grid)
    m = hopper(8 << 20)
    for kind in (None, 40):
        base = simulate(op, mp, machine=m, timing=LOCKSTEP, persistent=kind)
        own, other = ("walk_jitter", "tile_jitter") if kind else ("tile_jitter", "walk_jitter")
        t_own, t_other = (dataclasses.replace(LOCKSTEP, **{f: 0.3}) for f in (own, other))
        assert simulate(op, mp, machine=m, timing=t_other, persistent=kind) == base
        assert simulate(op, mp, machine=m, timing=t_own, persistent=kind) != base


def test_requests_for_a_line_in_flight_merge_with_its_miss():
    """Timed replay (window 0.5 steps): unit 7, homed on partition 0, missed at 0, asked
    for at 0.3 (in flight: merged, uncounted) and at 1.0 (a hit); unit 9, homed on 1,
    missed from partition 0 at 0 (two lookups), asked for from partition 1 at 0.2 (the
    home line in flight: merged) and 0.6 (a hit)."""
    keys, part, home = np.array([7, 9, 7, 9, 9, 7]), np.array([0, 0, 0, 1, 1, 0]), \
        np.array([0, 1, 0, 1, 1, 0])
    when = np.array([0.0, 0.0, 0.3, 0.2, 0.6, 1.0])
    order = np.argsort(when, kind="stable")
    mask = np.zeros(6, bool)
    got = partitioned_replay(keys[order], part[order], home[order], 4, 2, mask, when[order],
                             0.5)
    # lookups: 7 (miss), 9 near + home (misses), 9 from 1 at 0.6 (hit), 7 at 1.0 (hit)
    assert got == (5, 2, 2, [1, 1], [3, 1])     # near lookups: 7, 9, 7 on 0; 9 on 1
    assert mask.sum() == 2
    # untimed, every repeat is a lookup that hits
    assert partitioned_replay(keys[order], part[order], home[order], 4, 2)[:3] == (7, 4, 2)


@settings(max_examples=8, deadline=None)
@given(w=st.integers(1, 6), window=st.sampled_from([0.25, 1.0, 4.0]),
       persistent=st.sampled_from([None, 16]))
def test_merged_requests_read_nothing_more(w, window, persistent):
    """With a miss window, a huge L2 still reads each byte once, and every lookup the
    timed replay counts is one the untimed one counts too (merges only remove lookups;
    C's stores, which the timed one adds, aside)."""
    op = chiplet.Gemm(1024, 1024, 1024, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, w)
    timed = simulate(op, mp, machine=hopper(1 << 32), persistent=persistent,
                     timing=Timing(miss_window=window))
    plain = simulate(op, mp, machine=hopper(1 << 32), persistent=persistent)
    assert timed.hbm_read_bytes == plain.hbm_read_bytes == compulsory(op)
    assert timed.l2_lookup_bytes - op.output_bytes <= plain.l2_lookup_bytes
    assert timed.l2_request_bytes == plain.l2_request_bytes


def test_mirror_image_orders_need_not_tie():
    # row-major and column-major over a square grid of 128 x 256 tiles: A and B blocks
    # differ in size, so swapping the roles of rows and columns changes the traffic
    op = chiplet.Gemm(2048, 4096, 1024, bm=128, bn=256, bk=64)
    rows, cols = op.grid
    assert rows == cols
    rm = simulate(op, M.gemm_row_major(rows, cols), machine=hopper(4 << 20), persistent=32)
    cm = simulate(op, M.gemm_grouped(rows, cols, rows), machine=hopper(4 << 20),
                  persistent=32)
    assert (rm.l2_hit_rate, rm.hbm_read_bytes) != (cm.l2_hit_rate, cm.hbm_read_bytes)


def test_cdna_ignores_the_hopper_timing_and_persistence_only_sets_the_slots():
    op = chiplet.Gemm(4096, 4096, 1024)
    mp = M.gemm_xcd(*op.grid, 4, 32, 8)
    base = simulate(op, mp, "gfx950")
    assert simulate(op, mp, "gfx950", timing=Timing(tile_jitter=0.9)) == base
    assert simulate(op, mp, "gfx950", persistent=256).hbm_read_bytes == base.hbm_read_bytes


def test_closed_loop_dispatch_follows_the_dram_time_of_each_tile():
    """Timing(closed_loop=True): a tile lasts at least its DRAM reads' time at its slot's
    share of the bandwidth. Unbounded bandwidth leaves the open-loop replay as it was; a
    starved one slows the tiles that miss, the walk drifts, and the traffic changes. The
    round-robin CDNA model has no such dispatch and ignores it."""
    import dataclasses
    op = chiplet.Gemm(2048, 4096, 1024, bm=128, bn=256, bk=64)
    mp = M.gemm_grouped(*op.grid, 4)
    closed = Timing(closed_loop=True)
    base = hopper(8 << 20)
    assert base.slot_dram_bytes_per_s > 0 and base.slot_flops_per_s > 0
    for persistent in (None, 32):
        open_loop = simulate(op, mp, machine=base, persistent=persistent)
        fast = dataclasses.replace(base, slot_dram_bytes_per_s=1e30)
        assert simulate(op, mp, machine=fast, timing=closed, persistent=persistent) == \
            dataclasses.replace(open_loop, target=fast.name)
        starved = dataclasses.replace(base, slot_dram_bytes_per_s=1e6)
        slow = simulate(op, mp, machine=starved, timing=closed, persistent=persistent)
        assert (slow.l2_hit_rate, slow.hbm_read_bytes) != \
            (open_loop.l2_hit_rate, open_loop.hbm_read_bytes)
    cdna = chiplet.Gemm(4096, 4096, 1024)
    xm = M.gemm_xcd(*cdna.grid, 4, 32, 8)
    assert simulate(cdna, xm, "gfx950", timing=closed) == simulate(cdna, xm, "gfx950")
