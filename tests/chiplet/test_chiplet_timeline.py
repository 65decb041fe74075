"""Measured schedules in the cache simulator (sim.Schedule) and bench/chiplet_timeline.py
without a GPU: replaying the model's own dispatch as a schedule gives the model's result;
bad schedules are refused; the timeline build of gemm_ws multiplies as gemm_ws does and
stamps every block in the emulator; and the timeline's analysis reads back the step, the
spread and the start skew of a synthetic timeline built with known ones."""
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from conftest import bench_script
from pykittens import chiplet, targets
from pykittens.chiplet import sim
from pykittens.kernels import gemm_ws_launch


@pytest.fixture(scope="module")
def tl():
    return bench_script("chiplet_timeline")


@pytest.mark.parametrize("persistent", [None, 132])
def test_replaying_the_models_own_dispatch_gives_the_models_result(persistent):
    op = chiplet.Gemm(4096, 4096, 4096, bm=128, bn=256, bk=64)
    m = chiplet.parse_mapping("grouped:W=8", op, "sm_90a")
    _, place, exact = sim._schedule(m.size, op.steps, sim.Machine.of("sm_90a"), sim.Timing(),
                                    persistent)
    modeled = chiplet.simulate(op, m, "sm_90a", persistent=persistent)
    replay = chiplet.simulate(op, m, "sm_90a", persistent=persistent,
                              schedule=chiplet.Schedule(exact, place))
    assert (replay.l2_hit_rate, replay.hbm_read_bytes) == \
        (modeled.l2_hit_rate, modeled.hbm_read_bytes)


def test_a_schedule_changes_the_result_where_it_changes_the_dispatch():
    op = chiplet.Gemm(8192, 8192, 8192, bm=128, bn=256, bk=64)
    m = chiplet.parse_mapping("row-major", op, "sm_90a")
    n, steps = m.size, op.steps
    # every tile on its own, one after another: nothing is shared in flight, the L2 holds
    # what the previous tiles left
    serial = chiplet.Schedule(np.arange(n) * float(steps), np.zeros(n, np.int64))
    together = chiplet.Schedule(np.zeros(n), np.zeros(n, np.int64))
    a = chiplet.simulate(op, m, "sm_90a", schedule=serial)
    b = chiplet.simulate(op, m, "sm_90a", schedule=together)
    assert a.l2_hit_rate != b.l2_hit_rate


def test_bad_schedules_are_refused():
    op = chiplet.Gemm(1024, 1024, 1024, bm=128, bn=256, bk=64)
    m = chiplet.parse_mapping("row-major", op, "sm_90a")
    with pytest.raises(ValueError, match="a start and a place"):
        chiplet.Schedule(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match=">= 0"):
        chiplet.Schedule(np.array([-1.0]), np.zeros(1))
    with pytest.raises(ValueError, match="the schedule has 3 tiles, the launch 32"):
        chiplet.simulate(op, m, "sm_90a", schedule=chiplet.Schedule(np.zeros(3),
                                                                    np.zeros(3)))
    with pytest.raises(ValueError, match="closed_loop"):
        chiplet.simulate(op, m, "sm_90a", timing=sim.Timing(closed_loop=True),
                         schedule=chiplet.Schedule(np.zeros(32), np.zeros(32)))


def test_the_timeline_build_multiplies_and_stamps_every_block(tl):
    rng = np.random.default_rng(0)
    m, n, k = 384, 512, 256
    a = (rng.random((m, k)) - 0.5).astype(ml_dtypes.bfloat16)
    b = (rng.random((n, k)) - 0.5).astype(ml_dtypes.bfloat16)
    c = np.zeros((m, n), ml_dtypes.bfloat16)
    (grid,), consts = gemm_ws_launch({"a": a, "b": b, "c": c}, "sm_90a")
    consts = {**consts, "DT": "bf16", "OUT": "bf16", "MAP": "grouped:W=2"}
    blocks = consts["TM"] * consts["TN"]
    r = pk.emulate(tl.gemm_ws_timeline, a, b, c, np.full((3 * blocks, 4), -1, np.int32),
                   grid=grid, target="sm_90a", **consts)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(r["c"].astype(np.float64) - ref).max() < 2e-2 * np.abs(ref).max()
    rec = r["rec"].astype(np.int64)
    assert (rec != -1).all()                              # three rows for every block
    start, end, sm = tl.blocks_of(rec)
    assert (end > start).all() and start.min() == 0
    # the emulator's place: workgroup w on SM w; a persistent walk's block i on i % grid
    assert (sm == np.arange(blocks) % grid).all()
    sched = tl.schedule(k, consts["PERSISTENT"], rec)
    side = np.asarray(targets.get("sm_90a").sm_l2_partition)
    assert (sched.place == side[sm]).all()
    spans = tl.spans(consts["PERSISTENT"], rec)
    assert len(spans) == blocks and all(s.end >= s.start for s in spans)


def _synthetic(tl, sms, per_sm, steps, step_ns, jitter, skew_ns, seed=0):
    """A persistent walk's record: SM s starts s x skew_ns late and runs per_sm blocks of
    steps x step_ns x (1 + jitter x u) each, its producer starting a block's copies a
    quarter block before the block before ends."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((sms * per_sm, tl.ROWS_PER_BLOCK, 4), np.int64)
    lengths = steps * step_ns * (1 + jitter * rng.random((sms, per_sm)))
    for s in range(sms):
        t = s * skew_ns
        for j in range(per_sm):
            i = j * sms + s                              # the walk's block order
            rows[i, 0, 0] = max(s * skew_ns, t - lengths[s, j] / 4)
            t += lengths[s, j]
            rows[i, 1:, 0] = [t - 5, t]
            rows[i, :, 2] = s
    rows[:, :, 1] = rows[:, :, 0] >> 32
    rows[:, :, 0] &= 0xFFFFFFFF
    return rows.reshape(-1, 4), lengths


def test_the_analysis_reads_back_a_known_timeline(tl):
    steps, step_ns, jitter, skew = 128, 800.0, 0.1, 300.0
    rec, lengths = _synthetic(tl, sms=64, per_sm=40, steps=steps, step_ns=step_ns,
                              jitter=jitter, skew_ns=skew)
    s = tl.summary(steps * tl.BK, 1, rec)
    assert s["sms"] == 64
    # the median block: steps x step x (1 + jitter / 2)
    assert s["step_ns"] == pytest.approx(step_ns * (1 + jitter / 2), rel=0.01)
    # the spread of lengths drawn uniformly over (1, 1 + jitter): 2nd to 98th percentile
    lo, hi = np.percentile(lengths, [2, 98])
    assert s["jitter"] == pytest.approx((hi - lo) / lo, rel=0.02)
    assert 0.8 * jitter < s["jitter"] < jitter
    # the last SM starts 63 skews after the first
    assert s["start_skew_steps"] == pytest.approx(63 * skew / s["step_ns"], rel=0.01)


def test_reach_brackets_each_case_by_the_dispatch_grid(tl, monkeypatch):
    monkeypatch.setattr(tl, "REACH_GRID", {"tile_jitter": (0.0, 0.4), "walk_jitter": (0.0,),
                                           "launch_skew": (0.0, 0.1)})
    hit, _, _ = tl.modeled(4096, "row-major", 0, sim.Timing(tile_jitter=0.4))
    near = {"size": 4096, "order": "row-major", "persistent": 0, "l2_hit_ncu": hit}
    far = {**near, "l2_hit_ncu": hit - 0.5}
    out = tl.reach([near, far])
    assert out.splitlines()[-1] == "within 5 points of some dispatch: 1 of 2"
