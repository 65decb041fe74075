"""Timelines of the norms' backward kernels on the H200 (pk.timestamp): where the time of
LayerNorm's and RMSNorm's backward goes at 16384x8192, 16384x4096 and 4096x12288 bf16.
Each workgroup's first wave stamps the start of its walk, the end of each step (one group
of rows), the end of the walk and the end of its partial rows' store (the weight's
gradient, summed later by column_sum), with the SM it runs on. Per launch:

- span: the first workgroup's start to the last one's end (the kernel less its launch);
- ramp: the first workgroup's start to the last one's (workgroups starting late);
- step: a step's median time (a workgroup's rows at once, all SMs streaming);
- sums: the partial rows' store, median over workgroups;
- tail: the median workgroup's end to the last one's (the SMs idle at the end);
- with the column sums fused into the kernel (rows.FUSED_SUMS; timed as "... fused" where
  the whole grid is resident): each workgroup's wait at the barrier and its column slices.

Beside them, the library kernel's own time (CUDA graphs) and column_sum's over its partial
rows: what the stamps cost, and the weight gradient's second pass.

    PYKITTENS_CACHE=$PWD/.pkc_rt PYTHONPATH=.:bench python3 bench/rows_timeline.py --prebuild
    PYKITTENS_CACHE=$PWD/.pkc_rt PYTHONPATH=.:bench python3 bench/rows_timeline.py   # H200

The timeline kernels are the library's bodies (kernels/layernorm.py, kernels/rmsnorm.py)
stamping through their `mark`; tests/test_rows_timeline.py checks they compute what the
library's kernels do.
ROWS_TIMELINE_SHAPES="MxN,..." picks other shapes. Writes $OUT/rows_timeline.json (the
summaries) and rows_timeline.npz (the stamps); the table last."""
from __future__ import annotations

import os
import sys

import numpy as np

import pykittens as pk
import timelines
from pykittens.kernels import ln_grad_launch, rms_grad_launch
from pykittens.kernels.layernorm import (dbias_column, layernorm_backward,
                                        layernorm_backward_fused)
from pykittens.kernels.rmsnorm import rmsnorm_backward, rmsnorm_backward_fused
from pykittens.kernels.rows import ColumnSums, all_resident

SHAPES = tuple(tuple(int(v) for v in s.split("x")) for s in
               os.environ["ROWS_TIMELINE_SHAPES"].split(",")) \
    if os.environ.get("ROWS_TIMELINE_SHAPES") else ((16384, 8192), (16384, 4096), (4096, 12288))
# a record's rows past the data rows, a block of the grid's size each: the walk's start,
# its end, the partial rows stored, and with the sums fused (rows.fused_column_sums) the
# workgroups met at the barrier and their column slices summed
EVENTS = ("started", "walked", "stored", "met", "summed")


def _marks(rec):
    """The backward bodies' mark (kernels/layernorm.py): the workgroup's first wave stamps
    the walk's start, each step (row r0 of the record: the step's first row), the walk's end
    and the partial rows' store (the record's rows past the data rows: a block of the
    grid's size an event of EVENTS), and with the sums fused the barrier and the slices."""
    def mark(event, rows):
        if event == "stepped":
            with pk.if_((pk.wave_id() == 0) & (rows.r0 < rows.m)):
                pk.timestamp(rec, rows.r0)
            return
        with pk.if_(pk.wave_id() == 0):
            pk.timestamp(rec, rows.m + EVENTS.index(event) * pk.num_programs(0) +
                         pk.program_id(0))
    return mark


@pk.kernel(num_waves=4)
def layernorm_bwd_timeline(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                           stats: pk.gl[pk.f32, 2], dx: pk.gl["DT", 2],
                           part: pk.gl[pk.f32, 2], rec: pk.gl[pk.i32, (None, 4)],
                           DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                           RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                           CHUNK: pk.const = 512, SPLIT: pk.const = 0,
                           WEIGHT: pk.const = 1, DW: pk.const = 1, DB: pk.const = 1,
                           STAGES: pk.const = 0, PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """layernorm_bwd (kernels/layernorm.py), stamped (module docstring)."""
    layernorm_backward(x, dy, w, stats, dx, part, ROWS, COLS, RESIDENT, N_MAX, CHUNK, SPLIT,
                       WEIGHT, DW, DB, STAGES, PROGRAMS, EXACT, mark=_marks(rec))


@pk.kernel(num_waves=4)
def rmsnorm_bwd_timeline(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                         rstd: pk.gl[pk.f32, 1], ds: pk.gl["DT", 2], dx: pk.gl["DT", 2],
                         dw_part: pk.gl[pk.f32, 2], rec: pk.gl[pk.i32, (None, 4)],
                         DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                         RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                         CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
                         DW: pk.const = 1, RESIDUAL: pk.const = 0, STAGES: pk.const = 0,
                         PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """rmsnorm_bwd (kernels/rmsnorm.py), stamped (module docstring)."""
    rmsnorm_backward(x, dy, w, rstd, ds, dx, dw_part, ROWS, COLS, RESIDENT, N_MAX, CHUNK,
                     SPLIT, WEIGHT, DW, RESIDUAL, STAGES, PROGRAMS, EXACT, mark=_marks(rec))


@pk.kernel(num_waves=4)
def layernorm_bwd_fused_timeline(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                                 stats: pk.gl[pk.f32, 2], dx: pk.gl["DT", 2],
                                 part: pk.gl[pk.f32, 2], dweight: pk.gl["DT", 1],
                                 dbias: pk.gl["DT", 1], flags: pk.gl[pk.i32, 1],
                                 rec: pk.gl[pk.i32, (None, 4)], DT: pk.const = None,
                                 ROWS: pk.const = 1, COLS: pk.const = 1024,
                                 RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                                 CHUNK: pk.const = 512, SPLIT: pk.const = 0,
                                 WEIGHT: pk.const = 1, DW: pk.const = 1, DB: pk.const = 1,
                                 STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
                                 EXACT: pk.const = 0):
    """layernorm_bwd_fused (kernels/layernorm.py), stamped (module docstring)."""
    layernorm_backward_fused(x, dy, w, stats, dx, part, dweight, dbias, flags, ROWS, COLS,
                             RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, DW, DB, STAGES, PROGRAMS,
                             EXACT, mark=_marks(rec))


@pk.kernel(num_waves=4)
def rmsnorm_bwd_fused_timeline(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                               rstd: pk.gl[pk.f32, 1], ds: pk.gl["DT", 2],
                               dx: pk.gl["DT", 2], dw_part: pk.gl[pk.f32, 2],
                               dweight: pk.gl["DT", 1], flags: pk.gl[pk.i32, 1],
                               rec: pk.gl[pk.i32, (None, 4)], DT: pk.const = None,
                               ROWS: pk.const = 1, COLS: pk.const = 1024,
                               RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                               CHUNK: pk.const = 512, SPLIT: pk.const = 0,
                               WEIGHT: pk.const = 1, RESIDUAL: pk.const = 0,
                               STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
                               EXACT: pk.const = 0):
    """rmsnorm_bwd_fused (kernels/rmsnorm.py), stamped (module docstring)."""
    rmsnorm_backward_fused(x, dy, w, rstd, ds, dx, dw_part, dweight, flags, ROWS, COLS,
                           RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, RESIDUAL, STAGES, PROGRAMS,
                           EXACT, mark=_marks(rec))


def launches(m, n, tensors):
    """(name, timeline kernel, library kernel, grid, constants, arguments) of each backward
    as pykittens.ops launches it: LayerNorm's (both sums), RMSNorm's and add_rms_norm's
    (ds added); `tensors` makes the arguments (torch on the GPU, numpy in the tests)."""
    from pykittens.kernels.layernorm import layernorm_bwd, layernorm_bwd_fused
    from pykittens.kernels.rmsnorm import rmsnorm_bwd, rmsnorm_bwd_fused
    t = tensors
    grid, consts = ln_grad_launch({"x": t["x"], "dy": t["dy"]}, "sm_90a", True, True)
    args = {"x": t["x"], "dy": t["dy"], "w": t["w"], "stats": t["stats"], "dx": t["dx"],
            "part": t["part"](ColumnSums.partial_rows(grid[0], consts), dbias_column(n) + n)}
    yield "layer_norm", layernorm_bwd_timeline, layernorm_bwd, grid, consts, args
    if all_resident(grid[0], consts, "sm_90a"):     # the sums fused, as FUSED_SUMS has it
        yield ("layer_norm fused", layernorm_bwd_fused_timeline, layernorm_bwd_fused, grid,
               consts, {**args, "dweight": t["vec"](n), "dbias": t["vec"](n),
                        "flags": t["flags"]()})
    for name, residual in (("rms_norm", 0), ("add_rms_norm", 1)):
        grid, consts = rms_grad_launch({"x": t["x"], "dy": t["dy"],
                                        "ds": t["ds"] if residual else None},
                                       "sm_90a", bool(residual), True)
        args = {"x": t["x"], "dy": t["dy"], "w": t["w"], "rstd": t["stats"][1], "ds": t["ds"],
                "dx": t["dx"], "dw_part": t["part"](ColumnSums.partial_rows(grid[0], consts), n)}
        yield name, rmsnorm_bwd_timeline, rmsnorm_bwd, grid, consts, args
        if all_resident(grid[0], consts, "sm_90a"):
            fused = {k: v for k, v in consts.items() if k != "DW"}
            yield (f"{name} fused", rmsnorm_bwd_fused_timeline, rmsnorm_bwd_fused, grid, fused,
                   {**args, "dweight": t["vec"](n), "flags": t["flags"]()})


def record_rows(m: int, grid: int) -> int:
    return m + len(EVENTS) * grid


def rows_per_step(consts: dict) -> int:
    """Rows a workgroup takes a step (rows.Rows.per_program): its first wave's first row
    r0 = (workgroup + step x grid) x this."""
    waves = consts.get("num_waves", 4)
    if consts.get("SPLIT"):
        return consts.get("ROWS", 1)
    return waves if consts.get("RESIDENT") else waves * consts.get("ROWS", 1)


def analyse(m: int, grid: int, per: int, rec: np.ndarray) -> dict:
    """The launch's span, ramp, step, sums and tail in µs (module docstring), from a
    record (int64 words) of `grid` workgroups taking `per` rows a step."""
    t = timelines.times(rec)
    started, walked, stored, met, summed = _events(t, m, grid)
    stepped = np.flatnonzero(t[:m] > 0)                  # the steps' first rows
    owner = (stepped // per) % grid
    step = []
    for w in range(grid):
        mine = np.sort(t[stepped[owner == w]])
        step.append(np.diff(np.concatenate([[started[w]], mine])))
    step = np.concatenate(step) if step else np.zeros(1)
    t0, us = started.min(), 1e-3
    fused = bool(summed.any())
    end = summed if fused else stored
    return {"span_us": float(end.max() - t0) * us,
            "ramp_us": float(started.max() - t0) * us,
            "step_us": float(np.median(step)) * us,
            "sums_us": float(np.median(stored - walked)) * us,
            "tail_us": float(stored.max() - np.median(stored)) * us,
            # fused: each workgroup's wait at the barrier, and its column slices' sums
            "barrier_us": float(np.median(met - stored)) * us if fused else 0.0,
            "slices_us": float(np.median(summed - met)) * us if fused else 0.0,
            "steps": int(len(stepped)), "sms": int(len(np.unique(rec[m:m + grid, 2])))}


def _events(t: np.ndarray, m: int, grid: int) -> list[np.ndarray]:
    """Each event of EVENTS's times, a workgroup each (zeros for events not stamped)."""
    return [t[m + k * grid:m + (k + 1) * grid] for k in range(len(EVENTS))]


def spans(m: int, grid: int, rec: np.ndarray) -> list:
    """Each workgroup's walk and its partial rows' store as chart spans
    (pykittens.bench.timeline), on a row of its own beside the other workgroups of its SM."""
    from pykittens.bench.timeline import Span
    t = timelines.times(rec)
    started, walked, stored, met, summed = _events(t, m, grid)
    sm = rec[m:m + grid, 2]
    seen: dict = {}
    out = []
    for w in range(grid):
        row = int(sm[w]) * 8 + seen.setdefault(int(sm[w]), [0])[0]
        seen[int(sm[w])][0] += 1
        out += [Span(row, started[w] / 1e3, walked[w] / 1e3, "rows (the walk)"),
                Span(row, walked[w] / 1e3, stored[w] / 1e3, "partial rows stored")]
        if summed.any():
            out += [Span(row, stored[w] / 1e3, met[w] / 1e3, "waiting for the others"),
                    Span(row, met[w] / 1e3, summed[w] / 1e3, "column sums")]
    return out


def measure() -> tuple[list[dict], dict]:
    import torch
    from pykittens.bench.gpu import graph_time
    from pykittens.kernels.rows import column_sum, column_sum_launch
    details, stamps = [], {}
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        t = {"x": x, "dy": torch.randn_like(x), "ds": torch.randn_like(x),
             "dx": torch.empty_like(x), "w": torch.randn(n, device="cuda", dtype=x.dtype),
             "stats": torch.rand(2, m, device="cuda") + 0.5,
             "vec": lambda k: torch.empty(k, device="cuda", dtype=torch.bfloat16),
             "flags": lambda: torch.zeros(2, device="cuda", dtype=torch.int32),
             "part": lambda r, c: torch.empty(r, c, device="cuda")}
        for name, timed, library, grid, consts, args in launches(m, n, t):
            rec = timelines.record(record_rows(m, grid[0]))
            stamped = lambda: pk.launch(timed, grid=grid, rec=rec, **args, **consts)  # noqa
            plain = lambda: pk.launch(library, grid=grid, **args, **consts)  # noqa: E731
            part = args.get("part", args.get("dw_part"))
            (cgrid,), cconsts = column_sum_launch(part.shape[1], part.shape[0])
            out = torch.empty(part.shape[1], device="cuda")
            summed = None if "flags" in args else \
                (lambda: pk.launch(column_sum, part, out, grid=cgrid, **cconsts))  # (fused: none)
            rounds = timelines.stamped_rounds(stamped, rec)
            stamps[f"{name}|{m}x{n}"] = np.stack(rounds)
            if os.environ.get("OUT"):
                from pykittens.bench.timeline import chart
                chart(spans(m, grid[0], rounds[-1]), f"{name} backward {m}x{n}",
                      os.path.join(os.environ["OUT"], f"rows-timeline-{name}-{m}x{n}.png"),
                      rows="workgroup, by SM")
            a = [analyse(m, grid[0], rows_per_step(consts), r) for r in rounds]
            d = {"op": name, "shape": [m, n], "grid": grid[0], "consts": consts,
                 "kernel_us": graph_time(plain, reps=20) * 1e6,
                 "stamped_us": graph_time(stamped, reps=20) * 1e6,
                 "column_sum_us": graph_time(summed, reps=20) * 1e6 if summed else 0.0,
                 "rounds": a, **timelines.medians(a)}
            details.append(d)
            print(f"{name} {m}x{n}: kernel {d['kernel_us']:.1f} µs (stamped "
                  f"{d['stamped_us']:.1f}), " + ", ".join(f"{k} {d[k]:.1f}" for k in a[0]),
                  flush=True)
    return details, stamps


def table(details) -> str:
    from pykittens.bench import text_table
    rows = [[d["op"], "x".join(map(str, d["shape"])), str(d["grid"]),
             f"{d['kernel_us']:.1f}", f"{d['stamped_us']:.1f}", f"{d['span_us']:.1f}",
             f"{d['ramp_us']:.1f}", f"{d['step_us']:.2f}", f"{d['sums_us']:.1f}",
             f"{d['tail_us']:.1f}", f"{d['barrier_us']:.1f}", f"{d['slices_us']:.1f}",
             f"{d['column_sum_us']:.1f}"] for d in details]
    return text_table(rows, ["op (backward)", "shape", "grid", "kernel µs", "stamped µs",
                             "span µs", "ramp µs", "step µs", "sums µs", "tail µs",
                             "barrier µs", "slices µs", "column_sum µs"])


def builds():
    """(kernel, constants) of every timeline and library launch (bench/prebuild.py's form)."""
    for m, n in SHAPES:
        t = {"x": np.empty((m, n), np.float16), "dy": np.empty((m, n), np.float16),
             "ds": np.empty((m, n), np.float16), "dx": None, "w": None, "stats": [None] * 2,
             "part": lambda r, c: None, "vec": lambda k: None, "flags": lambda: None}
        for _, timed, library, _, consts, _ in launches(m, n, t):
            for kernel in (timed, library):
                yield kernel, {"DT": "bf16", **consts}


def main() -> int:
    return timelines.main("rows_timeline", builds, measure, table)

if __name__ == "__main__":
    sys.exit(main())
