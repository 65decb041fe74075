"""Does the last, partial round of a persistent GEMM cost time? gemm_ws's launch rule and
cuBLAS at shapes whose 128 x 256 blocks are a multiple of 128 (the sweep's: 132 SMs then
take ceil(T / 132) rounds where T / 132 would do) beside shapes a few rows taller whose
blocks are a multiple of 132, and the rule launched on 128 workgroups instead of 132.
Medians of five interleaved rounds.

    PYKITTENS_CACHE=$PWD/.pkc_tail PYTHONPATH=.:bench python3 bench/gemm_tail.py --prebuild
    PYKITTENS_CACHE=$PWD/.pkc_tail PYTHONPATH=.:bench python3 bench/gemm_tail.py   # GPU"""
import sys

import gemm_sweep as G

PAIRS = [((4096, 4096, 4096), (4224, 4096, 4096)),
         ((8192, 14336, 4096), (8448, 14336, 4096)),
         ((8192, 8192, 8192), (8448, 8192, 8192)),
         ((16384, 4096, 4096), (16896, 4096, 4096))]


def builds():
    for pair in PAIRS:
        for m, n, k in pair:
            yield G._plan("nt", m, n, k)[1]


def prebuild():
    from pykittens import compiler
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.toolchain import nvptx
    for c in builds():
        nvptx.compile_ptx(compiler.llvm_ir(gemm_ws, G.TARGET, aligned=True,
                                           **{**c, "DT": "bf16", "OUT": "bf16"}), G.TARGET)


def main():
    import torch
    import torch.nn.functional as F
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    for pair in PAIRS:
        for m, n, k in pair:
            flops = 2 * m * n * k
            x, w = G._rand(m, k), G._rand(n, k)
            ref = F.linear(x, w)
            grid, c = G._plan("nt", m, n, k)
            y = torch.empty_like(ref)
            launch(gemm_ws, grid=grid, a=x, b=w, c=y, **c)
            err = G._rel(y, ref)
            fns = [lambda: F.linear(x, w),
                   lambda: launch(gemm_ws, grid=grid, a=x, b=w, c=y, **c),
                   lambda: launch(gemm_ws, grid=(128,), a=x, b=w, c=y, **c)]
            t = G.interleaved(fns, G._reps(flops), rounds=5)
            blocks = c["TM"] * c["TN"]
            print(f"{m}x{n}x{k} blocks {blocks} ({blocks / 132:.2f} of 132) grid {grid}: "
                  f"cuBLAS {flops / t[0] / 1e12:.0f}  rule {flops / t[1] / 1e12:.0f}  "
                  f"rule on 128 {flops / t[2] / 1e12:.0f} TFLOP/s  ratio {t[0] / t[1]:.3f}"
                  f"  err {err:.1e}", flush=True)


if __name__ == "__main__":
    prebuild() if "--prebuild" in sys.argv else main()
