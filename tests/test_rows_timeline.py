"""bench/rows_timeline.py without a GPU: its stamped backward kernels compute bit for bit
what the library's do (dx and the partial rows), under the launch rules' schedules and
under a walk of several steps a workgroup; every workgroup stamps its start, each of its
steps and its ends, on the rows the analysis reads them from; and the analysis reads back
a synthetic timeline built with known times."""
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from conftest import bench_script


@pytest.fixture(scope="module")
def rt():
    return bench_script("rows_timeline")


def _tensors(m, n, seed=0):
    rng = np.random.default_rng(seed)
    bf = ml_dtypes.bfloat16
    return {"x": rng.standard_normal((m, n)).astype(bf),
            "dy": rng.standard_normal((m, n)).astype(bf),
            "ds": rng.standard_normal((m, n)).astype(bf), "dx": np.zeros((m, n), bf),
            "w": rng.standard_normal(n).astype(bf),
            "stats": (rng.random((2, m)) + 0.5).astype(np.float32),
            "part": lambda r, c: np.zeros((r, c), np.float32),
            "vec": lambda k: np.zeros(k, bf), "flags": lambda: np.zeros(2, np.int32)}


def _both(rt, timed, library, grid, consts, args, m):
    kw = {k: v for k, v in consts.items() if k != "num_waves"}
    if "num_waves" in consts:
        kw["num_waves"] = consts["num_waves"]
    lib = pk.emulate(library, **args, grid=grid, target="sm_90a", **kw)
    rec = np.zeros((rt.record_rows(m, grid[0]), 4), np.int32)
    got = pk.emulate(timed, **args, rec=rec, grid=grid, target="sm_90a", **kw)
    for k in lib:
        assert np.array_equal(np.asarray(lib[k]).view(np.uint8),
                              np.asarray(got[k]).view(np.uint8)), k
    return got["rec"].astype(np.int64)


@pytest.mark.parametrize("shape", [(40, 1024), (10, 4096)])
def test_stamped_kernels_compute_what_the_library_does(rt, shape):
    m, n = shape
    names = []
    for name, timed, library, grid, consts, args in rt.launches(m, n, _tensors(m, n)):
        names.append(name)
        rec = _both(rt, timed, library, grid, consts, args, m)
        g, events = grid[0], 5 if name.endswith("fused") else 3
        assert (rec[m:m + events * g, 0] > 0).sum() >= events * g - 1   # the first is 0
        a = rt.analyse(m, g, rt.rows_per_step(consts), rec)
        assert a["steps"] == m and a["sms"] == g, name
        assert (a["slices_us"] > 0) == name.endswith("fused")
        spans = rt.spans(m, g, rec)
        assert len(spans) == (events - 1) * g and all(s.end >= s.start for s in spans)
    # the staged plan (10 x 4096) builds its workgroups to be resident: the fused sums too
    assert ("layer_norm fused" in names) == (shape == (10, 4096))


def test_a_walk_of_several_steps_stamps_each_step(rt):
    m, n, grid = 40, 1024, (8,)
    t = _tensors(m, n, seed=1)
    name, timed, library, _, consts, args = next(
        x for x in rt.launches(m, n, t) if x[0] == "rms_norm")
    from pykittens.kernels.rows import ColumnSums
    args["dw_part"] = np.zeros((ColumnSums.partial_rows(grid[0], consts), n), np.float32)
    rec = _both(rt, timed, library, grid, consts, args, m)
    per = rt.rows_per_step(consts)
    t_all = rec[:, 0] + (rec[:, 1] << 32)
    for w in range(grid[0]):                        # rows w, w + 8, ...: after its start
        mine = t_all[[r for r in range(m) if (r // per) % grid[0] == w]]
        assert len(mine) == m // grid[0] and (np.diff(mine) > 0).all()
        assert mine[0] > t_all[m + w]                             # after its start
        assert t_all[m + grid[0] + w] > mine[-1]                  # walked after its steps
        assert t_all[m + 2 * grid[0] + w] > t_all[m + grid[0] + w]   # then stored


def test_a_timeline_chart_of_an_emulated_record(rt, tmp_path):
    from pykittens.bench.timeline import chart
    m, n = 40, 1024
    name, timed, library, grid, consts, args = next(rt.launches(m, n, _tensors(m, n)))
    rec = _both(rt, timed, library, grid, consts, args, m)
    chart(rt.spans(m, grid[0], rec), name, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_the_analysis_reads_back_known_times(rt):
    m, grid, per = 32, 4, 1
    rec = np.zeros((rt.record_rows(m, grid), 4), np.int64)
    step_ns, sums_ns = 1000, 300
    starts = np.array([0, 50, 100, 400])                 # ramp 400 ns
    for w in range(grid):
        t = starts[w]
        for i in range(m // grid):
            t += step_ns
            rec[w + i * grid, 0] = t
        rec[m + w, 0], rec[m + grid + w, 0] = starts[w], t
        rec[m + 2 * grid + w, 0] = t + sums_ns
        rec[m + w, 2] = 10 + w
    a = rt.analyse(m, grid, per, rec)
    assert a["ramp_us"] == pytest.approx(0.4) and a["step_us"] == pytest.approx(1.0)
    assert a["sums_us"] == pytest.approx(0.3) and a["sms"] == 4 and a["steps"] == m
    ends = starts + 8 * step_ns + sums_ns
    assert a["span_us"] == pytest.approx(ends.max() / 1e3)
    assert a["tail_us"] == pytest.approx((ends.max() - np.median(ends)) / 1e3)
