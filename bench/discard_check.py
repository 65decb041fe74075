"""pk.discard on the H200: column_sum with DISCARD=1 over partial rows laid inside a larger
buffer, so that the windows' first and last lines are shared with data around them. The
sums must match float64, and every element outside the windows must keep its bits (a line
dropped that was not wholly inside a window would lose them). Then what the drop saves:
partial rows written, added up by column_sum with and without DISCARD, and 64 MiB copied
after (which evicts the rows from L2: written back to memory unless dropped), timed in
CUDA graphs (the norms' own backward passes: bench/ops_bandwidth.py's variants step).

    PYTHONPATH=. python3 bench/discard_check.py          # on the GPU
"""
from __future__ import annotations

import json
import os
import sys

import torch

import pykittens as pk
from pykittens.bench.gpu import graph_time
from pykittens.kernels.rows import column_sum, column_sum_launch

# (partial rows, columns, columns before the window in each buffer row, after it)
CASES = ((264, 4096, 8, 24), (128, 24576, 0, 32), (256, 4096, 3, 5), (100, 1000, 17, 11))
SENTINEL = -7.25


def check(parts: int, n: int, before: int, after: int) -> tuple[float, int]:
    """(relative error of the sums, elements outside the windows that changed)."""
    width = before + n + after
    buf = torch.full((parts, width), SENTINEL, device="cuda")
    part = buf[:, before:before + n]
    part.copy_(torch.randn(parts, n, device="cuda"))
    ref = part.double().sum(0)
    outside = torch.cat([buf[:, :before], buf[:, before + n:]], 1).clone()
    out = torch.empty(n, device="cuda")
    grid, consts = column_sum_launch(n, parts, DISCARD=1)
    pk.launch(column_sum, part=part, out=out, grid=grid, **consts)
    torch.cuda.synchronize()
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    now = torch.cat([buf[:, :before], buf[:, before + n:]], 1)
    changed = int((now.view(torch.int32) != outside.view(torch.int32)).sum())
    return err, changed


def timed(parts: int, n: int) -> dict:
    """µs of column_sum over fresh partial rows written just before (a copy kernel stands
    in for the backward pass that writes them), with and without DISCARD, and a 64 MiB
    copy after, in CUDA graphs of 20 calls."""
    src = torch.randn(parts, n, device="cuda")
    part = torch.empty_like(src)
    out = torch.empty(n, device="cuda")
    stream_a = torch.empty(16 * 2**20, device="cuda")
    stream_b = torch.empty_like(stream_a)
    res = {}
    for discard in (0, 1):
        grid, consts = column_sum_launch(n, parts, DISCARD=discard)

        def call():
            part.copy_(src)
            pk.launch(column_sum, part=part, out=out, grid=grid, **consts)
            stream_b.copy_(stream_a)
        res[f"discard={discard}"] = graph_time(call, 20) * 1e6
    return res


def main() -> int:
    ok, rows, details = True, [], []
    for parts, n, before, after in CASES:
        err, changed = check(parts, n, before, after)
        ok &= err < 1e-5 and changed == 0
        rows.append(f"column_sum DISCARD=1 {parts}x{n} (+{before}/+{after} around): "
                    f"sums {err:.1e}, elements outside changed: {changed}")
        details.append({"case": [parts, n, before, after], "err": err, "changed": changed})
    for parts, n in ((264, 4096), (128, 24576), (256, 8192)):
        t = timed(parts, n)
        rows.append(f"partial rows {parts}x{n} written, summed, 64 MiB copied: "
                    + ", ".join(f"{k} {v:.1f} µs" for k, v in t.items()))
        details.append({"timed": [parts, n], **t})
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}")
    print("\n".join(rows))
    print("ok" if ok else "FAILED")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "discard_check.json"), "w") as f:
            json.dump(details, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
