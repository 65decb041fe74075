"""Launch the backward's main pass once per build for Nsight Compute: one launch each, in the
order of bench/attention_bwd.py's MAIN_VARIANTS or of the indices given, at
(B, Hq, Hkv, N, D) = (16, 16, 16, 4096, 128), non-causal unless --causal. On the GPU machine
(repo root, PTX prebuilt: bench/prebuild.py attention_bwd_passes):

    ncu --clock-control none --set full --import-source no -k regex:'^attention_bwd$' \
        -o $OUT/bwd python3 bench/attention_bwd_profile.py 1 0
    ncu -i $OUT/bwd.ncu-rep --page details              # sections
    ncu -i $OUT/bwd.ncu-rep --page raw --csv            # every metric
    ncu -i $OUT/bwd.ncu-rep --page source --csv --print-source sass   # stalls per instruction
(launch 0 = MAIN_VARIANTS[1], with dQ; launch 1 = MAIN_VARIANTS[0], without)."""
from __future__ import annotations

import math
import sys

import torch

import attention_bwd as bench            # bench/, this script's directory
import pykittens as pk


def main(argv) -> int:
    causal = int("--causal" in argv)
    picks = [int(a) for a in argv if not a.startswith("--")] or range(len(bench.MAIN_VARIANTS))
    b, hq, hkv, n, d = 16, 16, 16, 4096, 128
    dev = "cuda"
    q = torch.randn(b, hq, n, d, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    lse = torch.full((b, hq, n), float(math.log(n)), device=dev)
    delta = torch.zeros(b, hq, n, device=dev)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq32 = torch.zeros(q.shape, device=dev)
    plans = [p for p in bench.pass_plans((b, hq, hkv, n, d, causal)) if p[0].startswith("main")]
    for i in picks:
        name, kernel, grid, consts = plans[i]
        pk.launch(kernel, q, k, v, do, lse, delta, dq32, dk, dv, 1 / math.sqrt(d), grid=grid,
                  **consts)
        torch.cuda.synchronize()
        print(f"launched {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
