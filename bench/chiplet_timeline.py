"""Timelines of gemm_ws on the H200, for the cases bench/chiplet_l2.py measures: when the
producer starts copying each block's operands, when each consumer warpgroup has stored
its half, and on which SM (pk.timestamp in the kernel) — the dispatch the cache simulator
models with fitted constants (sim.Timing), measured instead:

- the step: a block's K steps over its time on the SM (a persistent walk: from the SM's
  previous block's end);
- the spread of the blocks' times, as Timing's tile_jitter / walk_jitter read it (a block
  takes steps x (1 + jitter x u), u uniform in [0, 1)): (98th - 2nd percentile) / 2nd;
- the launch's start skew: how far apart the first blocks start, in steps;
- the simulator replaying each measured schedule (sim.Schedule: every block's start and its
  SM's L2 partition) beside ncu's L2 hit rate and DRAM bytes from chiplet_l2 runs, and
  beside the library's modeled dispatch: what of the model's error is its dispatch and
  what its caches.

    PYKITTENS_CACHE=$PWD/.pkc_tl PYTHONPATH=.:bench python3 bench/chiplet_timeline.py --prebuild
    PYKITTENS_CACHE=$PWD/.pkc_tl PYTHONPATH=.:bench python3 bench/chiplet_timeline.py   # H200
    PYTHONPATH=.:bench python3 bench/chiplet_timeline.py --table TIMELINE.npz RUN.json ...
    PYTHONPATH=.:bench python3 bench/chiplet_timeline.py --reach RUN.json ...
                          # no GPU: the L2 hit rates any dispatch gives, against ncu's

CHIPLET_L2_SIZES picks sizes as in chiplet_l2.py; CHIPLET_TIMELINE_ROUNDS (default 2)
timelines a case, each after one warm launch (the caches warm, as in a run of layers; ncu's
are flushed). Writes $OUT/chiplet_timeline.npz (the stamps) and chiplet_timeline.json (the
summary), the summary table last."""
from __future__ import annotations

import os
import sys

import numpy as np

import pykittens as pk
import timelines
from chiplet_l2 import L2_POINTS, PERSISTENT_GRID, Tally, cases, modeled, plan
from pykittens.kernels.gemm import output_tile, ws_pipeline, ws_store

ROUNDS = int(os.environ.get("CHIPLET_TIMELINE_ROUNDS", "2"))
BK = 64                       # gemm_ws's K step for 16-bit operands (one 128-byte row)
# a record's rows: each block i has three, its loads' start and its two halves' stores
ROWS_PER_BLOCK = 3


@pk.kernel(num_waves=12)
def gemm_ws_timeline(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
                     rec: pk.gl[pk.i32, (None, 4)], DT: pk.const = None,
                     OUT: pk.const = None, BN: pk.const = 256, STAGES: pk.const = 4,
                     TMA_STORE: pk.const = 0, PERSISTENT: pk.const = 0,
                     PROMOTE: pk.const = 0, MAP: pk.const = "row-major", TM: pk.const = 0,
                     TN: pk.const = 0, TARGET: pk.target = None):
    """gemm_ws (B stored N x K, no clusters) stamping every block i: row 3i when the
    producer wave starts copying its operands, rows 3i + 1 and 3i + 2 when the first wave
    of consumer warpgroup 0 / 1 has stored its 64 rows."""
    def stored(event, g, t, tile):                  # ws_pipeline's mark
        if event == "stored":
            with pk.if_(pk.wave_id() == 4 + 4 * g):
                pk.timestamp(rec, ROWS_PER_BLOCK * tile + 1 + g)
    ws_pipeline(a, b, TM * TN, lambda i: output_tile(MAP, TM, TN, 128, BN, TARGET, i),
                ws_store(c, OUT, BN, TMA_STORE), DT=DT, BN=BN, STAGES=STAGES,
                PERSISTENT=PERSISTENT, PROMOTE=PROMOTE,
                before_loads=lambda i, m0: pk.timestamp(rec, ROWS_PER_BLOCK * i),
                mark=stored)


def builds():
    """(kernel, constants) of every case (bench/prebuild.py's form)."""
    for case in cases():
        yield gemm_ws_timeline, plan(*case)[1]


def measure() -> dict:
    """Every case's timelines: {key: int64 array (rounds, rows, 4)} (stamps as taken)."""
    from chiplet_l2 import _tensors
    out, last = {}, None
    for size, order, persistent in cases():
        if size != last:
            t, last = _tensors(size), size
        grid, consts = plan(size, order, persistent)
        rec = timelines.record(ROWS_PER_BLOCK * consts["TM"] * consts["TN"])
        launch = lambda: pk.launch(gemm_ws_timeline, *t, rec, grid=grid, **consts)  # noqa: E731
        rounds = timelines.stamped_rounds(launch, rec, ROUNDS)
        out[key(size, order, persistent)] = np.stack(rounds)
        if os.environ.get("OUT"):
            from pykittens.bench.timeline import chart
            grid_name = "persistent" if persistent else "per-tile"
            chart(spans(persistent, rounds[-1]), f"gemm_ws {size}³ {order}, {grid_name}",
                  os.path.join(os.environ["OUT"], f"chiplet-timeline-{size}-"
                               f"{order.replace(':', '-').replace('=', '')}-{grid_name}.png"))
        print(f"{size}³ {order} {'persistent' if persistent else 'per tile'}: "
              f"{summary(size, persistent, rounds[-1])}", flush=True)
    return out


def key(size, order, persistent) -> str:
    return f"{size}|{order}|{persistent}"


def unkey(k: str):
    size, order, persistent = k.split("|")
    return int(size), order, int(persistent)


def blocks_of(rec: np.ndarray):
    """(start ns, end ns, SM) of every block, from the launch's first start: start when the
    producer began its copies, end when the later of its two halves was stored."""
    rows = rec.reshape(-1, ROWS_PER_BLOCK, 4)
    t = timelines.times(rows)
    t0 = t[:, 0].min()
    return t[:, 0] - t0, t[:, 1:].max(axis=1) - t0, rows[:, 0, 2]


def walks(sm, end) -> tuple[np.ndarray, np.ndarray]:
    """(the block before it on its SM or -1, its place in its SM's walk) of every block,
    the blocks of an SM in the order they ended."""
    before, place = np.full(len(sm), -1), np.zeros(len(sm), np.int64)
    for s in np.unique(sm):
        mine = np.flatnonzero(sm == s)
        mine = mine[np.argsort(end[mine])]
        before[mine[1:]] = mine[:-1]
        place[mine] = np.arange(len(mine))
    return before, place


def block_times(start, end, sm, persistent: bool) -> np.ndarray:
    """Each block's time on its SM: from its start, or in a persistent walk from the end of
    the SM's block before (the producer starts a block's copies while the consumers still
    work on the one before)."""
    times = end - start
    if persistent:
        before = walks(sm, end)[0]
        later = before >= 0
        times[later] = end[later] - end[before[later]]
    return times


def spans(persistent: int, rec: np.ndarray) -> list:
    """The timeline's blocks as chart spans (pykittens.bench.timeline): each block from
    its start (in a persistent walk: its SM's block before ending) to its end, on its SM,
    a walk's consecutive blocks in alternating colours."""
    from pykittens.bench.timeline import Span
    start, end, sm = blocks_of(rec)
    begin = end - block_times(start, end, sm, bool(persistent))
    return [Span(int(u), b / 1e3, e / 1e3, ("even", "odd")[k % 2] + " blocks of an SM")
            for u, b, e, k in zip(sm, begin, end, walks(sm, end)[1])]


def summary(size: int, persistent: int, rec: np.ndarray) -> dict:
    """The dispatch constants one timeline measures (module docstring)."""
    start, end, sm = blocks_of(rec)
    times = block_times(start, end, sm, bool(persistent))
    steps = -(-size // BK)
    step_ns = float(np.median(times)) / steps
    lo, hi = np.percentile(times, [2, 98])
    first = np.sort(start[np.unique(sm, return_index=True)[1]]) if persistent else \
        np.sort(start)[:min(len(start), PERSISTENT_GRID)]
    return {"step_ns": round(step_ns, 1), "jitter": round(float((hi - lo) / lo), 4),
            "start_skew_steps": round(float(first[-1] - first[0]) / step_ns, 3),
            "sms": int(len(np.unique(sm))), "ms": round(float(end.max()) / 1e6, 3)}


def schedule(size: int, persistent: int, rec: np.ndarray):
    """The simulator's Schedule of a timeline: each block's start in steps of the
    timeline's own step, beside the L2 partition of its SM (targets/sm90a.py)."""
    from pykittens import chiplet, targets
    start, end, sm = blocks_of(rec)
    step_ns = summary(size, persistent, rec)["step_ns"]
    side = np.asarray(targets.get("sm_90a").sm_l2_partition)
    return chiplet.Schedule(start / step_ns, side[sm])


def replayed(size, order, persistent, rec):
    """(L2 hit rate, DRAM bytes read) of the simulator replaying the measured schedule."""
    from pykittens import chiplet
    op = chiplet.Gemm(size, size, size, bm=128, bn=256, bk=BK)
    r = chiplet.simulate(op, chiplet.parse_mapping(order, op, "sm_90a"), "sm_90a",
                         persistent=PERSISTENT_GRID if persistent else None,
                         schedule=schedule(size, persistent, rec))
    return r.l2_hit_rate, r.hbm_read_bytes


def table(stamps: dict, runs: list[dict]) -> str:
    """Each timed case's dispatch constants, and where chiplet_l2 runs measured the case,
    ncu's L2 hit rate and DRAM bytes beside the simulator's under the library's modeled
    dispatch and under the measured one (the timeline's last round)."""
    from pykittens.bench import text_table
    ncu = {(d["size"], d["order"], d["persistent"]): d for d in runs}
    rows, close = [], {"modeled": Tally(), "measured": Tally()}
    for k, rounds in stamps.items():
        size, order, persistent = unkey(k)
        s = [summary(size, persistent, r) for r in rounds]
        row = [f"{size}³", order, "persistent" if persistent else "per tile",
               f"{s[-1]['ms']:.3f}", f"{s[-1]['step_ns']:.0f}",
               " / ".join(f"{x['jitter']:.3f}" for x in s),
               " / ".join(f"{x['start_skew_steps']:.2f}" for x in s)]
        d = ncu.get((size, order, persistent))
        if d is None:
            rows.append(row + ["", "", "", "", "", ""])
            continue
        model = modeled(size, order, persistent)[:2]
        replay = replayed(size, order, persistent, rounds[-1])
        for name, (l2, dram) in (("modeled", model), ("measured", replay)):
            close[name].add(d, l2, dram)
        rows.append(row + [f"{d['l2_hit_ncu']:.1%}", f"{model[0]:.1%}", f"{replay[0]:.1%}",
                           f"{d['dram_read_ncu'] / 1e6:.0f}", f"{model[1] / 1e6:.0f}",
                           f"{replay[1] / 1e6:.0f}"])
    foot = "\n".join(f"simulator, {name} dispatch: {v}" for name, v in close.items()
                     if v.cases)
    return text_table(rows, ["shape", "order", "grid", "ms", "step ns", "jitter (rounds)",
                             "start skew (steps)", "L2 ncu", "L2 modeled dispatch",
                             "L2 measured dispatch", "DRAM MB ncu", "DRAM MB modeled",
                             "DRAM MB measured"]) + ("\n" + foot if foot else "")


# --reach's grid of dispatch constants (sim.Timing): the tiles' and walks' jitter and the
# launch skew, from none to well past what chiplet_l2.py's fit found
REACH_GRID = {"tile_jitter": (0.0, 0.05, 0.2, 0.4), "walk_jitter": (0.0, 0.05, 0.2),
              "launch_skew": (0.0, 0.04, 0.1)}


def reach(runs: list[dict]) -> str:
    """For each measured case, the L2 hit rates the simulator gives over REACH_GRID's
    dispatch constants, and whether ncu's lies within 5 points of that range: a case no
    dispatch brings within 5 points is an error of the cache model (how it counts
    lookups), which measuring the dispatch cannot mend."""
    import itertools
    from pykittens.bench import text_table
    from pykittens.chiplet.sim import Timing
    timings = [Timing(**dict(zip(REACH_GRID, v)))
               for v in itertools.product(*REACH_GRID.values())]
    rows, reachable = [], 0
    for d in runs:
        hits = [modeled(d["size"], d["order"], d["persistent"], t)[0] for t in timings]
        lo, hi = min(hits), max(hits)
        ok = lo - L2_POINTS <= d["l2_hit_ncu"] <= hi + L2_POINTS
        reachable += ok
        rows.append([f"{d['size']}³", d["order"], "persistent" if d["persistent"] else
                     "per tile", f"{d['l2_hit_ncu']:.1%}", f"{lo:.1%} .. {hi:.1%}",
                     "yes" if ok else "no"])
    return text_table(rows, ["shape", "order", "grid", "L2 ncu", "L2 simulated, any dispatch",
                             "within 5 points"]) + \
        f"\nwithin 5 points of some dispatch: {reachable} of {len(runs)}"


def load(path: str) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def main() -> int:
    import json
    if "--table" in sys.argv or "--reach" in sys.argv:
        flag = "--table" if "--table" in sys.argv else "--reach"
        paths = sys.argv[sys.argv.index(flag) + 1:]
        runs = []
        for p in paths[flag == "--table":]:
            with open(p) as f:
                runs += [d for d in json.load(f)["results"] if "l2_hit_ncu" in d]
        print(table(load(paths[0]), runs) if flag == "--table" else reach(runs))
        return 0
    stamps = {}

    def measured():
        stamps.update(measure())
        return {k: [summary(*unkey(k)[::2], r) for r in v] for k, v in stamps.items()}, stamps
    return timelines.main("chiplet_timeline", builds, measured, lambda _: table(stamps, []))

if __name__ == "__main__":
    sys.exit(main())
