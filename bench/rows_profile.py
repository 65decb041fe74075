"""Launch row ops once each for Nsight Compute, bf16, at one shape (default 4096 x 12288):
layer_norm (weight, bias), rms_norm (weight), softmax forward; with --bwd, then layer_norm's
and rms_norm's gradients (their backward kernels and the column sums of dw, db). On the GPU
machine (repo root, PTX prebuilt: bench/ops_bandwidth.py --prebuild):

    ncu --clock-control none --set full --import-source no \\
        -k regex:'^(layernorm|rmsnorm|softmax)$' -o $OUT/rows python3 bench/rows_profile.py
    ncu -i $OUT/rows.ncu-rep --page details     # sections, per launch
    python3 bench/rows_profile.py 16384 8192    # another shape (M N)
"""
from __future__ import annotations

import sys

import torch

import pykittens.ops as pko


def main(argv) -> int:
    sizes = [a for a in argv if not a.startswith("--")]
    m, n = (int(a) for a in sizes[:2]) if len(sizes) >= 2 else (4096, 12288)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
