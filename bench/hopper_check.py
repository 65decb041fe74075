"""Focused H200 check of the Hopper building blocks (TMA loads and stores, mbarriers, wgmma)
on the library's gemm_wgmma and tma_scale: float64 reference, emulator agreement at ragged shapes, and throughput against
cuBLAS (the full sweep is bench/device_check.py).

    PYTHONPATH=. python3 bench/hopper_check.py
"""
import sys

import numpy as np
import torch

import pykittens as pk
from pykittens.bench.gpu import graph_time
from pykittens.kernels import gemm_wgmma as gemm_tma
from pykittens.kernels.spec import rel_err


def main():
    rows, ok = [], True
    rng = np.random.default_rng(0)
    for m, n, k in ((128, 128, 128), (100, 72, 96), (4096, 4096, 4096)):
        a = rng.standard_normal((m, k)).astype(pk.bf16.np)
        b = rng.standard_normal((k, n)).astype(pk.bf16.np)
        ta = torch.from_numpy(a.astype(np.float32)).cuda().bfloat16()
        tb = torch.from_numpy(b.astype(np.float32)).cuda().bfloat16()
        tc = torch.full((m, n), float("nan"), device="cuda")
        grid = (-(-m // 64), -(-n // 64))
        pk.launch(gemm_tma, ta, tb, tc, grid=grid)
        torch.cuda.synchronize()
        ref = ta.double() @ tb.double()
        err = float((tc.double() - ref).norm() / ref.norm())
        rows.append(f"gemm_tma {m}x{n}x{k} vs float64: {err:.2e}")
        ok &= err < 1e-5
        if m < 1000:
            emu = pk.emulate(gemm_tma, a, b, np.zeros((m, n), np.float32), grid=grid,
                             target="sm_90a")["c"]
            d = rel_err(tc.cpu().numpy(), emu)
            rows.append(f"gemm_tma {m}x{n}x{k} vs emulator: {d:.2e}")
            ok &= d < 1e-5
        else:
            s = graph_time(lambda: pk.launch(gemm_tma, ta, tb, tc, grid=grid), reps=5)
            s2 = graph_time(lambda: torch.matmul(ta, tb), reps=5)
            rows.append(f"gemm_tma {m}^3: {2 * m * n * k / s / 1e12:.0f} TFLOP/s; cuBLAS "
                        f"{2 * m * n * k / s2 / 1e12:.0f} TFLOP/s")
    from pykittens.bench import gpu
    for r in gpu.check_library("gpu", names=["tma_scale"]) + \
            gpu.emulator_agreement(names=["tma_scale"]):
        rows.append(f"tma_scale {r['check']} {r['dtype']} {r['shape']}: "
                    f"{r.get('rel_err', r.get('rel_diff')):.2e} {'ok' if r['ok'] else 'FAIL'}")
        ok &= r["ok"]
    print("\n".join(rows))
    print("hopper check:", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
