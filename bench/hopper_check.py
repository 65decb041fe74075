"""Focused H200 check of the Hopper building blocks (TMA + mbarrier + wgmma) on one GEMM:
float64 reference, emulator agreement at ragged shapes, and throughput against cuBLAS.

    PYTHONPATH=. python3 bench/hopper_check.py
"""
import sys

import numpy as np
import torch

import pykittens as pk
from pykittens.bench.gpu import graph_time
from pykittens.kernels.spec import rel_err


@pk.kernel(num_waves=4)
def gemm_tma(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
             DT: pk.const = None, OUT: pk.const = None, BK: pk.const = 64):
    sb = pk.empty(pk.st((BK, 64), DT, swizzle=8))
    full = pk.mbarrier(1)
    m0 = pk.program_id(0) * 64 + pk.wave_id() * 16
    n0 = pk.program_id(1) * 64
    acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
    for k in pk.range((a.shape[1] + BK - 1) // BK):
        with pk.if_(pk.wave_id() == 0):
            pk.tma_load(sb, b, (k * BK, n0), full)
        pk.wait(full, k % 2)
        ta = pk.load(pk.rt((16, BK), DT, role="a"), a, (m0, k * BK))
        pk.mma_AB(acc, ta, sb)
        pk.barrier()
    pk.store(c, acc, (m0, n0))


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
    print("\n".join(rows))
    print("hopper check:", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
