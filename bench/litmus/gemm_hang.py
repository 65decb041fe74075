"""gemm_ws with one 128-wide block per workgroup and C stored through shared memory by the
TMA unit (PERSISTENT=0, TMA_STORE=1, BN=128) hung the H200 at 1024³ and larger while 256³
and 512³ finished: this launches it at the shapes and ring depths given, each in a child
process with a time limit (gemm_ws refuses the configuration that hangs; this script's
children build it anyway: pykittens.kernels.gemm.REFUSE_KNOWN_HANG off).

    python3 bench/litmus/gemm_hang.py --prebuild          # no GPU: PTX into $PYKITTENS_CACHE
    PYTHONPATH=. python3 bench/litmus/gemm_hang.py        # on the GPU
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# (M, N, K, STAGES, BN, PERSISTENT). On 2026-12-01 (docs/PERF.md) the first two hung and
# every other finished: four stages, a block per workgroup, 16 or more K steps
CASES = [(512, 512, 1024, 4, 128, 0), (512, 512, 2048, 4, 128, 0),
         (1024, 1024, 512, 4, 128, 0), (2048, 256, 512, 4, 128, 0),
         (1024, 1024, 1024, 2, 128, 0), (1024, 1024, 1024, 3, 128, 0),
         (512, 512, 4096, 3, 128, 0), (512, 512, 4096, 2, 128, 0),
         (512, 512, 4096, 3, 256, 0), (512, 512, 4096, 4, 128, 1),
         (512, 512, 1024, 4, 128, 1)]
LIMIT_S = 20


def allow_the_hang():
    """gemm_ws builds the configuration it refuses, in this process."""
    import importlib
    importlib.import_module("pykittens.kernels.gemm").REFUSE_KNOWN_HANG = False


def consts(m, n, k, stages, bn, persistent):
    import gemm_sweep as g
    plan = g._plan("nt", m, n, k, bn=bn)[1]
    return {**plan, "PERSISTENT": persistent, "TMA_STORE": 1, "STAGES": stages}


def one(spec) -> int:
    import torch
    import torch.nn.functional as F
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    allow_the_hang()
    m, n, k = spec[:3]
    c = consts(*spec)
    x, w = (torch.randn(s, device="cuda").bfloat16() for s in ((m, k), (n, k)))
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(gemm_ws, grid=gemm_ws_grid(c, "sm_90a"), a=x, b=w, c=y, **c)
    torch.cuda.synchronize()
    ref = F.linear(x.float(), w.float())
    print(json.dumps({"rel_err": float((y.float() - ref).norm() / ref.norm())}))
    return 0


def main() -> int:
    if "--prebuild" in sys.argv:
        from pykittens import compiler
        from pykittens.kernels.gemm import gemm_ws
        allow_the_hang()
        from pykittens.toolchain import nvptx
        for case in CASES:
            ir = compiler.llvm_ir(gemm_ws, "sm_90a", aligned=True, DT="bf16", OUT="bf16",
                                  **consts(*case))
            nvptx.compile_ptx(ir, "sm_90a")
        return 0
    if "--one" in sys.argv:
        return one(json.loads(sys.argv[sys.argv.index("--one") + 1]))
    for case in CASES:
        try:
            r = subprocess.run([sys.executable, __file__, "--one", json.dumps(case)],
                               capture_output=True, text=True, timeout=LIMIT_S)
            out = (r.stdout.strip().splitlines() or [r.stderr.strip()[-200:]])[-1]
        except subprocess.TimeoutExpired:
            out = f"no result in {LIMIT_S} s (hung)"
        print(f"M N K {case[:3]} STAGES {case[3]} BN {case[4]} PERSISTENT {case[5]}: {out}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
