"""Row ops' kernels one by one, bf16. Two modes:

Nsight Compute (default): launch layer_norm (weight, bias), rms_norm (weight) and softmax
forward once each at one shape (default 4096 x 12288); with --bwd, then layer_norm's and
rms_norm's gradients (their backward kernels and the column sums of dw, db). On the GPU
machine (repo root, PTX prebuilt: bench/ops_bandwidth.py --prebuild):

    ncu --clock-control none --set full --import-source no \\
        -k regex:'^(layernorm|rmsnorm|softmax)$' -o $OUT/rows python3 bench/rows_profile.py
    ncu -i $OUT/rows.ncu-rep --page details     # sections, per launch
    python3 bench/rows_profile.py 16384 8192    # another shape (M N)

--times: each norm's backward at the ops bench's shapes (or the one given), with the
weight's (and bias's) gradients and with the inputs' only, run CALLS times under the torch
profiler; prints every kernel's mean duration (µs) and its share of the device copy's
bandwidth for the bytes the backward must move (x, dy, [ds,] dx), and writes
$OUT/rows_times.json where $OUT is set.
"""
from __future__ import annotations

import json
import os
import sys

import torch

import pykittens.ops as pko

SHAPES = ((16384, 8192), (16384, 4096), (4096, 12288))
CALLS = 20


def main(argv) -> int:
    sizes = [a for a in argv if not a.startswith("--")]
    shape = tuple(int(a) for a in sizes[:2]) if len(sizes) >= 2 else None
    if "--times" in argv:
        return times([shape] if shape else SHAPES)
    m, n = shape or (4096, 12288)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        for run in (lambda: pko.layer_norm(x, (n,), w, b, 1e-5),
                    lambda: pko.rms_norm(x, (n,), w, 1e-5),
                    lambda: pko.softmax(x, -1)):
            run()
            torch.cuda.synchronize()
    if "--bwd" in argv:
        dy = torch.randn_like(x)
        xs, ws, bs = (t.detach().requires_grad_() for t in (x, w, b))
        for y, leaves in ((pko.layer_norm(xs, (n,), ws, bs, 1e-5), (xs, ws, bs)),
                          (pko.rms_norm(xs, (n,), ws, 1e-5), (xs, ws))):
            torch.autograd.grad(y, leaves, dy)
            torch.cuda.synchronize()
    return 0


def _backwards(m, n):
    """(op, weight grads?, tensors the backward moves, closure) of each case at (m, n)."""
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dy, ds = torch.randn_like(x), torch.randn_like(x)
    cases = []
    for weights in (True, False):
        xs, rs = x.detach().requires_grad_(), r.detach().requires_grad_()
        ws, bs = (t.detach().requires_grad_(weights) for t in (w, b))
        y = pko.layer_norm(xs, (n,), ws, bs, 1e-5)
        cases.append(("layer_norm", weights, 3, y, [xs] + [ws, bs] * weights, [dy]))
        y = pko.rms_norm(xs, (n,), ws, 1e-5)
        cases.append(("rms_norm", weights, 3, y, [xs] + [ws] * weights, [dy]))
        y, s = pko.add_rms_norm(xs, rs, ws, 1e-5)
        cases.append(("add_rms_norm", weights, 4, (y, s), [xs, rs] + [ws] * weights,
                      [dy, ds]))
    return [(op, weights, tensors, lambda y=y, leaves=leaves, g=g:
             torch.autograd.grad(y, leaves, g, retain_graph=True))
            for op, weights, tensors, y, leaves, g in cases]


def times(shapes) -> int:
    from torch.profiler import ProfilerActivity, profile
    from pykittens.bench.gpu import copy_ceiling
    copy = copy_ceiling()[0] / 1e12
    rows = []
    for m, n in shapes:
        for op, weights, tensors, fn in _backwards(m, n):
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(CALLS):
                    fn()
                torch.cuda.synchronize()
            kernels = {e.key: e.device_time_total / e.count
                       for e in prof.key_averages() if e.device_time_total > 0}
            moved = tensors * m * n * 2
            total = sum(kernels.values())
            rows.append({"op": op, "shape": [m, n], "weight_grads": weights,
                         "kernels_us": kernels, "total_us": total,
                         "of_copy": moved / (total * 1e-6) / 1e12 / copy})
            print(f"{op:13s} {m}x{n} {'w' if weights else '-'} "
                  f"{rows[-1]['of_copy']:.3f} of copy, {total:7.1f} µs: " +
                  ", ".join(f"{k[:28]} {v:.1f}" for k, v in kernels.items()), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "rows_times.json"), "w") as f:
            json.dump({"copy_tbs": copy, "calls": CALLS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
