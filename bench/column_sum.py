"""column_sum, the norms' backward's last step, on its own: schedules against each other on
the partial sums the backward kernels leave at the ops bench's shapes (f32, bf16 out), the
partials resident in L2 as they are when the backward kernel has just written them.

    PYKITTENS_CACHE=$PWD/.pkc_cs python3 bench/column_sum.py --prebuild      # no GPU: PTX
    PYTHONPATH=. PYKITTENS_CACHE=$PWD/.pkc_cs python3 bench/column_sum.py     # on the GPU

Prints µs per launch (median of CUDA-graph replays over three interleaved rounds) and the
effective bandwidth over the partials' bytes; details to $OUT/column_sum.json."""
from __future__ import annotations

import sys

# (op, shape) -> (partial rows, columns of partials): the backward launches' grids at the
# ops bench's shapes (layer_norm adds dbias's sums beside dweight's)
CASES = {"layer_norm 16384x8192": (132, 16384), "layer_norm 16384x4096": (396, 8192),
         "layer_norm 4096x12288": (132, 24576), "rms_norm 16384x8192": (132, 8192),
         "rms_norm 16384x4096": (264, 4096), "rms_norm 4096x12288": (132, 12288)}
# name -> (launch overrides, unrolled over the known number of rows)
SCHEDULES = {"32x32, 4 waves (looped)": ({}, False),
             "32x32, 4 waves": ({"ROWS": 32, "num_waves": 4}, True),
             "16x32, 8 waves (the ops' rule)": ({}, True),
             "8x32, 16 waves": ({"ROWS": 8, "num_waves": 16}, True),
             "32x64, 8 waves": ({"ROWS": 32, "COLS": 64, "num_waves": 8}, True),
             "16x64, 16 waves": ({"COLS": 64, "num_waves": 16}, True)}


def plans():
    from pykittens.kernels.rows import column_sum_launch
    for case, (p, n) in CASES.items():
        for name, (over, unrolled) in SCHEDULES.items():
            grid, consts = column_sum_launch(n, p if unrolled else None, **over)
            yield case, name, p, n, grid, {"PT": "f32", "DT": "bf16", **consts}


def prebuild() -> int:
    from prebuild import ptx                     # bench/, this script's directory
    from pykittens.kernels.rows import column_sum
    return ptx((column_sum, consts) for *_, consts in plans())


def main() -> int:
    import json
    import os
    import statistics
    import torch
    from pykittens.bench import text_table
    from pykittens.bench.gpu import graph_time
    from pykittens.kernels.rows import column_sum
    from pykittens.runtime.launch import launch
    rows, details = [], []
    by_case: dict = {}
    for case, name, p, n, grid, consts in plans():
        by_case.setdefault((case, p, n), []).append((name, grid, consts))
    for (case, p, n), runs in by_case.items():
        part = torch.randn(p, n, device="cuda")
        out = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        ref = part.sum(0)
        fns = []
        for name, grid, consts in runs:
            out.fill_(float("nan"))
            launch(column_sum, grid=grid, part=part, out=out, **consts)
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            assert err < 1e-2, (case, name, err)
            fns.append(lambda grid=grid, consts=consts: launch(
                column_sum, grid=grid, part=part, out=out, **consts))
        times = [[] for _ in fns]
        for _ in range(3):
            for ts, fn in zip(times, fns):
                ts.append(graph_time(fn, reps=20))
        for (name, grid, consts), ts in zip(runs, times):
            us = statistics.median(ts) * 1e6
            details.append({"case": case, "parts": p, "cols": n, "schedule": name,
                            "grid": list(grid), "us": us})
            rows.append([case, f"{p}x{n}", name, f"{us:.2f}",
                         f"{p * n * 4 / us / 1e6:.2f}"])
            print(f"{case} {name}: {us:.2f} us", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "column_sum.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": details}, f,
                      indent=2)
    print(text_table(rows, ["case", "partials", "schedule", "µs", "TB/s"]))
    return 0


if __name__ == "__main__":
    sys.exit(prebuild() if "--prebuild" in sys.argv else main())
