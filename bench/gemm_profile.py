"""Launch gemm_ws (the launch rule) and cuBLAS (F.linear) once each on one product for
Nsight Compute, so their speed-of-light and pipe figures can be read side by side. On the
GPU machine (repo root, PTX prebuilt: bench/gemm_sweep.py --prebuild store):

    ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis -k regex:'gemm|nvjet|xmma|cutlass' \
        python3 bench/gemm_profile.py 8192 8192 8192

M N K on the command line (default 8192³), bf16, C = X W^T. With --fp8: e4m3 operands,
bf16 C, the launch rule's promoted gemm_ws (PTX: bench/gemm_sweep.py --prebuild fp8) and
torch._scaled_mm with its default accumulation (-k regex:'gemm|nvjet|xmma|cutlass|sm90').
With --op: pykittens.ops.linear as users call it (gemm_sk where the launch rule splits K;
PTX: bench/gemm_sweep.py --prebuild split_op for its shapes) and F.linear."""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def main(argv) -> int:
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    import gemm_sweep                                  # bench/, this script's directory
    fp8, op = "--fp8" in argv, "--op" in argv
    argv = [a for a in argv if a not in ("--fp8", "--op")]
    m, n, k = (int(a) for a in argv) if argv else (8192, 8192, 8192)
    if fp8:
        return _fp8(m, n, k)
    if op:
        return _op(m, n, k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 4
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 4
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    consts = gemm_sweep._plan("nt", m, n, k)[1]
    launch(gemm_ws, grid=gemm_ws_grid(consts, gemm_sweep.TARGET), a=x, b=w, c=y, **consts)
    ref = F.linear(x, w)
    torch.cuda.synchronize()
    err = gemm_sweep._rel(y, ref)
    print(f"gemm_ws {consts} against cuBLAS: relative difference {err:.1e}")
    return 0 if err < 1e-2 else 1


def _op(m, n, k) -> int:
    """pykittens.ops.linear (the kernel its launch rule picks) and F.linear, once each."""
    import gemm_sweep
    import pykittens.ops as pko
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 4
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 4
    y = pko.linear(x, w)
    ref = F.linear(x, w)
    torch.cuda.synchronize()
    err = gemm_sweep._rel(y, ref)
    kernel = sys.modules["pykittens.ops.matmul"]._plan("sm_90a", "nt", m, k, n, 2)[0].name
    print(f"pykittens.ops.linear ({kernel}) against cuBLAS: relative difference {err:.1e}")
    return 0 if err < 1e-2 else 1


def _fp8(m, n, k) -> int:
    """The promoted e4m3 gemm_ws (launch rule) and _scaled_mm's default accumulation."""
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    import gemm_sweep
    a = (torch.randn(m, k, device="cuda") / 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") / 4).to(torch.float8_e4m3fn)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    grid, consts = gemm_sweep._plan("nt", m, n, k, 1, promote=True)
    launch(gemm_ws, grid=grid, a=a, b=b, c=c, **consts)
    one = torch.ones((), device="cuda")
    ref = torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=False)
    torch.cuda.synchronize()
    err = gemm_sweep._rel(c, ref)
    print(f"gemm_ws e4m3 {consts} against _scaled_mm: relative difference {err:.1e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
