"""The SM clock an H200 holds under a long dense GEMM: nvidia-smi samples the SM clock, the
power draw and the active throttle reasons every 50 ms while cuBLAS (F.linear) and the
library GEMM (pykittens.ops.linear: gemm_ws) run back to back for a few seconds each, bf16,
4096³ and 8192³. The performance model (pykittens/analysis/model.py) takes cuBLAS's median as the
clock of a kernel bound by the tensor cores (targets/sm90a.py, load_clock_hz).

    PYTHONPATH=. python3 bench/gpu_clock.py          # on the GPU

Prints one row per (shape, contender) and the idle clocks; writes $OUT/gpu_clock.json."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import torch

import pykittens.ops as pko

SECONDS = 5.0
SKIP = 4                      # samples before the clock settles


def sample(fn, seconds=SECONDS) -> dict:
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
         "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t0, calls = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        calls += 20
    elapsed = time.time() - t0
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.strip()]
    rows = rows[SKIP:]
    clock = [float(r[0]) for r in rows]
    return {"clock_mhz_median": statistics.median(clock), "clock_mhz_min": min(clock),
            "clock_mhz_max": max(clock),
            "power_w_median": statistics.median(float(r[1]) for r in rows),
            "throttle_reasons": sorted({r[2] for r in rows}), "calls_per_s": calls / elapsed}


def main() -> int:
    out = []
    for m in (4096, 8192):
        a, b = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for name, fn in (("cuBLAS", lambda: torch.nn.functional.linear(a, b)),
                         ("pykittens", lambda: pko.linear(a, b))):
            r = {"shape": m, "contender": name, **sample(fn)}
            r["tflops"] = 2 * m ** 3 * r["calls_per_s"] / 1e12
            out.append(r)
            print(f"{m}³ bf16 {name:10s} SM clock median {r['clock_mhz_median']:.0f} MHz "
                  f"(min {r['clock_mhz_min']:.0f}, max {r['clock_mhz_max']:.0f}), "
                  f"{r['power_w_median']:.0f} W, throttle {','.join(r['throttle_reasons'])}, "
                  f"{r['tflops']:.0f} TFLOP/s (host loop)", flush=True)
    idle = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.limit",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout
    print(f"idle: {idle.strip()}  (SM clock, max SM clock, power limit)")
    with open(os.path.join(os.environ.get("OUT", "."), "gpu_clock.json"), "w") as f:
        json.dump({"runs": out, "idle": idle.strip()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
