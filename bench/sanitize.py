"""compute-sanitizer over library kernels at small shapes (H200): memcheck, racecheck,
synccheck and initcheck, one process per tool, a table of what each reports.

    PYTHONPATH=. python3 bench/sanitize.py [attention attention_bwd]   # tools over the kernels
    PYTHONPATH=. python3 bench/sanitize.py --inner attention   # the kernels once (what the
                                                               # tools run)
memcheck runs with --report-api-errors no: the host side's CUDA API noise (e.g. torch probing
for features) is not a kernel's memory error."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

TOOLS = {"memcheck": ["--tool", "memcheck", "--report-api-errors", "no"],
         "racecheck": ["--tool", "racecheck"],
         "synccheck": ["--tool", "synccheck"],
         # pykittens' kernels only: torch's reductions over an output the TMA unit wrote
         # were reported as reads of uninitialised memory
         "initcheck": ["--tool", "initcheck", "--kernel-name", "kns=attention"]}


def run_attention():
    """attention_fwd: ragged, causal and not, GQA, both head dims, persistent too."""
    import torch
    import pykittens as pk
    from pykittens.kernels.attention import attention_fwd, attention_fwd_launch
    for b, hq, hkv, nq, nk, d, causal, over in (
            (1, 2, 1, 130, 200, 64, 1, {}), (1, 2, 2, 256, 256, 128, 0, {}),
            (1, 2, 1, 200, 130, 128, 1, {}), (2, 2, 1, 192, 192, 128, 0, {"PERSISTENT": 1})):
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        o = torch.empty_like(q)
        lse = torch.empty(b, hq, nq, device="cuda")
        grid, consts = attention_fwd_launch({"q": q, "k": k, "v": v}, "sm_90a", CAUSAL=causal,
                                            **over)
        pk.launch(attention_fwd, q, k, v, o, lse, 1 / math.sqrt(d), grid=grid, **consts)
    torch.cuda.synchronize()


def run_attention_bwd():
    """The backward passes through pykittens.ops.attention's autograd: ragged, causal and
    not, GQA, both head dims, f32-atomic and deterministic dQ."""
    import torch
    import pykittens.ops as pko
    for b, hq, hkv, nq, nk, d, causal, det in (
            (1, 2, 1, 130, 200, 64, 1, False), (1, 2, 2, 256, 256, 128, 0, False),
            (1, 4, 2, 200, 130, 128, 1, True)):
        q = torch.randn(b, nq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        pko.attention(q, k, v, causal=bool(causal), deterministic=det).sum().backward()
    torch.cuda.synchronize()


KERNELS = {"attention": run_attention, "attention_bwd": run_attention_bwd}


def summary(log: str) -> str:
    """The tool's verdict line, e.g. 'ERROR SUMMARY: 0 errors'."""
    found = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: [^\n]*", log)
    return "; ".join(found) if found else "no summary (see log)"


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--inner":
        for name in args[1:] or KERNELS:
            KERNELS[name]()
        return 0
    names = args or list(KERNELS)
    sanitizer = os.environ.get("COMPUTE_SANITIZER", "/usr/local/cuda/bin/compute-sanitizer")
    out = os.environ.get("OUT")
    rows, bad = [], False
    for name in names:
        for tool, flags in TOOLS.items():
            p = subprocess.run([sanitizer, *flags, sys.executable, __file__, "--inner", name],
                               capture_output=True, text=True, timeout=900)
            log = p.stdout + p.stderr
            if out:
                with open(os.path.join(out, f"sanitize-{name}-{tool}.log"), "w") as f:
                    f.write(log)
            verdict = summary(log)
            clean = p.returncode == 0 and bool(re.search(r"SUMMARY: 0 (errors|hazards)",
                                                         verdict))
            bad |= not clean
            rows.append((name, tool, verdict, "clean" if clean else "REPORTED"))
    w = max(len(r[2]) for r in rows)
    for r in rows:
        print(f"{r[0]:10} {r[1]:10} {r[2]:{w}}  {r[3]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
