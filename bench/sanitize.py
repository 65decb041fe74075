"""compute-sanitizer over library kernels at small shapes (H200): memcheck, racecheck,
synccheck and initcheck, one process per tool, a table of what each reports.

    PYTHONPATH=. python3 bench/sanitize.py [library attention attention_bwd rows_staged linear
                                            clusters split decode litmus]
    PYTHONPATH=. python3 bench/sanitize.py --inner attention   # the kernels once (what the
                                                               # tools run)
    SANITIZE_TOOLS=racecheck,initcheck ... # only these tools
`library` is every kernel of pykittens.kernels.KERNELS built for sm_90a, at its small
(ragged) shapes, checked against float64 as it runs. `litmus` compiles bench/litmus/handoff.cu
(nvcc) and runs each of its shared-memory hand-offs plainly (mismatches seen by the consumer)
and under racecheck: what the tool reports for a correct mbarrier hand-off, beside a
__syncthreads control and a real race.

memcheck runs with --report-api-errors no: the host side's CUDA API noise (e.g. torch probing
for features) is not a kernel's memory error. initcheck looks at pykittens' kernels only:
torch's own kernels reading an output the TMA unit wrote were reported as reads of
uninitialised memory."""
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
         "initcheck": ["--tool", "initcheck", "--print-limit", "1000"]}


def _pykittens_kernels(name: str) -> list[str]:
    """initcheck's filter: the entry names of the family's kernels."""
    if name == "rows_staged":
        return ["--kernel-name",
                "regex=^(layernorm|rmsnorm|add_rmsnorm|layernorm_bwd|rmsnorm_bwd|column_sum|"
                "softmax|softmax_bwd)$"]
    if name in ("linear", "clusters"):
        return ["--kernel-name", "regex=^gemm_ws$"]
    if name == "split":
        return ["--kernel-name", "regex=^gemm_sk$"]
    if name == "decode":
        return ["--kernel-name", "regex=^(gemm_ws|gemm_sk)$"]
    if name != "library":
        return ["--kernel-name", "kns=attention"]
    from pykittens.kernels import KERNELS
    names = sorted({s.kernel.name for s in KERNELS.values() if "sm_90a" in s.targets})
    return ["--kernel-name", "regex=^(" + "|".join(names) + ")$"]


def run_library():
    """Every library kernel for sm_90a at its small (ragged) shapes against its float64
    numpy reference. Only copies touch the buffers besides the kernel (inputs and NaN-poisoned
    outputs go up by memcpy, results come down the same way), so initcheck sees every
    initialisation and no other kernel's reads."""
    import numpy as np
    import torch
    from pykittens.bench.gpu import library_cases, to_torch
    from pykittens.ir.types import dtype_of
    from pykittens.kernels.spec import rel_err
    from pykittens.runtime.launch import launch

    rng, wrong = np.random.default_rng(0), []
    for spec, dt, shape in library_cases("sm_90a", None, "shapes"):
        inputs = spec.make_inputs(shape, dtype_of(dt), rng)
        for name in spec.outputs:
            inputs[name] = np.full_like(inputs[name], np.nan)
        grid, consts = spec.launch(inputs, "sm_90a")
        t = to_torch(inputs)
        launch(spec.kernel, grid=grid, **t, **consts)
        torch.cuda.synchronize()
        ref = spec.reference(inputs)
        for name in spec.outputs:
            got = t[name].cpu().double().numpy()
            if name in getattr(spec, "partials", ()):
                got = got.sum(axis=0)
            err = rel_err(got, ref[name])
            if not err <= spec.tolerance(dt):
                wrong.append((spec.name, dt, shape, name, err))
    for w in wrong:
        print("WRONG:", *w)
    print(f"library: {len(wrong)} wrong results")
    if wrong:
        raise SystemExit(1)


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
    not, GQA, both head dims, f32-atomic and deterministic dQ; and attention_varlen's on a
    packed batch (a sequence without tokens among them). dO comes up by a copy (so
    initcheck sees it initialised)."""
    import torch
    import pykittens.ops as pko
    for b, hq, hkv, nq, nk, d, causal, det in (
            (1, 2, 1, 130, 200, 64, 1, False), (1, 2, 2, 256, 256, 128, 0, False),
            (1, 4, 2, 200, 130, 128, 1, True)):
        q = torch.randn(b, nq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        do = torch.randn(b, nq, hq, d, dtype=torch.bfloat16).to("cuda")
        torch.autograd.grad(pko.attention(q, k, v, causal=bool(causal), deterministic=det),
                            (q, k, v), do)
    cu = torch.tensor([0, 100, 100, 357], dtype=torch.int32, device="cuda")   # packed
    for causal in (0, 1):
        q, k, v = (torch.randn(357, h, 128, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for h in (4, 2, 2))
        do = torch.randn(357, 4, 128, dtype=torch.bfloat16).to("cuda")
        torch.autograd.grad(pko.attention_varlen(q, k, v, cu, cu, 257, 257,
                                                 causal=bool(causal)), (q, k, v), do)
    torch.cuda.synchronize()


def run_attention_bwd_prep():
    """attention_bwd_prep alone on O and dO brought up by copies: what initcheck says when
    O was not written by the forward's TMA stores."""
    import torch
    import pykittens as pk
    from pykittens.kernels.attention_bwd import attention_bwd_launch, attention_bwd_prep
    for b, h, n, d in ((1, 2, 130, 64), (2, 4, 256, 128)):
        o, do = (torch.randn(b, h, n, d, dtype=torch.bfloat16).to("cuda") for _ in range(2))
        delta = torch.empty(b, h, n, device="cuda")
        (grid, consts), _, _ = attention_bwd_launch({"q": o, "k": o}, "sm_90a")
        pk.launch(attention_bwd_prep, o, do, delta, grid=grid, **consts)
    torch.cuda.synchronize()


def run_rows_staged():
    """The norms' backward passes through pykittens.ops' autograd where they take the staged
    walk (rows in shared memory by TMA, rows.Feed): shapes whose grid walks several steps
    (700 x 4096: 3 workgroups per SM; 300 x 12288: 1), each checked against float32
    torch; rows of exactly the held width, so the forward and backward windows are
    promised inside (EXACT: no bounds checked on the GPU), softmax's too."""
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    wrong = 0
    for m, n in ((700, 4096), (300, 12288)):
        x, r, dy = (torch.randn(m, n, dtype=torch.bfloat16).to("cuda") for _ in range(3))
        w = (torch.rand(n) + 0.5).to(torch.bfloat16).to("cuda")
        b = torch.randn(n, dtype=torch.bfloat16).to("cuda")
        cases = [(lambda x, w, b: pko.layer_norm(x, (n,), w, b),
                  lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b)),
                 (lambda x, w: pko.rms_norm(x, (n,), w, 1e-6),
                  lambda x, w: F.rms_norm(x, (n,), w, 1e-6), (x, w)),
                 (lambda x, r, w: pko.add_rms_norm(x, r, w, 1e-6)[0],
                  lambda x, r, w: F.rms_norm(x + r, (n,), w, 1e-6), (x, r, w)),
                 (pko.softmax, lambda x: torch.softmax(x, -1), (x,))]
        for mine, ref, inputs in cases:
            wrong += _wrong_vs_float32(mine, ref, inputs, dy, (m, n))
    _verdict("rows_staged", wrong, "wrong gradients")


def run_linear():
    """pykittens.ops.linear forward and backward where gemm_ws reads every operand as stored
    (LAYOUT nt, nn, tn; 256- and 128-wide blocks, C staged or from registers): ragged
    shapes against float32 torch."""
    _verdict("linear", _linear_checks(((1000, 776, 1528), (264, 512, 40000))),
             "wrong results")


def _linear_checks(shapes) -> int:
    """How many of pykittens.ops.linear's outputs and gradients are wrong against float32
    torch on random bf16 operands of each (m, k, n)."""
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    wrong = 0
    for m, k, n in shapes:
        x = torch.randn(m, k, dtype=torch.bfloat16).to("cuda")
        w = (torch.randn(n, k) / k ** 0.5).to(torch.bfloat16).to("cuda")
        dy = torch.randn(m, n, dtype=torch.bfloat16).to("cuda")
        wrong += _wrong_vs_float32(pko.linear, F.linear, (x, w), dy, (m, k, n), outputs=True)
    return wrong


def run_clusters():
    """gemm_ws in clusters of two (CLUSTER=2: each workgroup multicasts half of B's block
    into both and releases stages on both workgroups' barriers), ragged shapes, persistent
    grids of every, two and one cluster, against float32 torch."""
    import torch
    import torch.nn.functional as F
    from pykittens.kernels import gemm_ws_grid, gemm_ws_launch
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    wrong = 0
    for m, k, n in ((1000, 776, 1528), (500, 512, 600)):
        x = torch.randn(m, k, dtype=torch.bfloat16).to("cuda")
        w = (torch.randn(n, k) / k ** 0.5).to(torch.bfloat16).to("cuda")
        want = F.linear(x.float(), w.float())
        _, consts = gemm_ws_launch({"a": x, "b": w, "c": want.bfloat16()}, "sm_90a")
        consts = {**consts, "CLUSTER": 2}
        for grid in (gemm_ws_grid(consts, "sm_90a")[0], 4, 2):
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch(gemm_ws, grid=(grid,), a=x, b=w, c=y, **consts)
            err = float((y.float() - want).norm() / want.norm())
            if not err < 2e-2:
                print("WRONG:", (m, k, n), grid, err)
                wrong += 1
    _verdict("clusters", wrong, "wrong results")


def run_split():
    """gemm_sk: blocks split in K between workgroups — split-K over fewer blocks than SMs
    (each block's steps shared by 2 to 14 workgroups) and stream-K after a whole round —
    ragged shapes, each launched twice on one workspace (the flags lowered by the first
    launch are raised again by the second), against float32 torch."""
    wrong = _split_twice(((256, 2048, 640), (1000, 776, 1528), (2304, 512, 2048),
                          (128, 8192, 512)))
    _verdict("split", wrong, "wrong results")


def _split_twice(shapes) -> int:
    """run_split's launches: gemm_sk on each (m, k, n) as gemm_sk_plan splits the launch
    rule's blocks, twice on one workspace; how many were wrong or left a flag raised."""
    import torch
    import torch.nn.functional as F
    from pykittens.kernels import gemm_sk_plan, gemm_ws_launch
    from pykittens.kernels.gemm import gemm_sk
    from pykittens.runtime.launch import launch
    wrong = 0
    for m, k, n in shapes:
        x = torch.randn(m, k, dtype=torch.bfloat16).to("cuda")
        w = (torch.randn(n, k) / k ** 0.5).to(torch.bfloat16).to("cuda")
        want = F.linear(x.float(), w.float())
        _, rule = gemm_ws_launch({"a": x, "b": w, "c": want.bfloat16()}, "sm_90a")
        grid, consts, slots = gemm_sk_plan(rule, "sm_90a", k)
        part = torch.empty(128 * slots, consts["BN"], device="cuda")
        # zeros copied up (a memcpy, which initcheck sees; a fill kernel it does not)
        flags = torch.zeros(8 * slots, dtype=torch.int32).to("cuda")
        for _ in range(2):
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch(gemm_sk, grid=grid, a=x, b=w, c=y, part=part, flags=flags, **consts)
            err = float((y.float() - want).norm() / want.norm())
            if not err < 2e-2:
                print("WRONG:", (m, k, n), grid, err)
                wrong += 1
        if flags.any():
            print("FLAGS LEFT RAISED:", (m, k, n))
            wrong += 1
    return wrong


def run_decode():
    """A few rows of A (A_ROWS): pykittens.ops.linear forward and backward at ragged decode
    shapes (gemm_ws copying 8, 16 and 64 rows of A; 48- and 32-wide blocks over a short K,
    kernels.DECODE_SHORT_K), then gemm_sk splitting 5 and 16 rows' blocks in K as run_split
    does; against float32 torch."""
    wrong = _linear_checks(((5, 776, 1528), (40, 512, 6144), (12, 1000, 2560)))
    wrong += _split_twice(((5, 4096, 1000), (16, 8192, 512)))
    _verdict("decode", wrong, "wrong results")


def _wrong_vs_float32(mine, ref, inputs, dy, what, outputs=False) -> int:
    """How many of mine's gradients for `dy` (and, with outputs, its output) are 2e-2 or
    more (relative) from float32 torch's `ref` on the same inputs; each printed with
    `what`."""
    import torch
    a = [t.clone().requires_grad_() for t in inputs]
    f = [t.float().requires_grad_() for t in inputs]
    y, y_ref = mine(*a), ref(*f)
    got = torch.autograd.grad(y, a, dy)
    want = torch.autograd.grad(y_ref, f, dy.float())
    if outputs:
        got, want = (y,) + got, (y_ref,) + want
    wrong = 0
    for g, e in zip(got, want):
        err = float((g.float() - e).norm() / e.norm())
        if not err < 2e-2:
            wrong += 1
            print("WRONG:", *what, err)
    return wrong


def _verdict(name: str, wrong: int, what: str) -> None:
    """Print the count once the GPU is done; exit 1 when anything was wrong."""
    import torch
    torch.cuda.synchronize()
    print(f"{name}: {wrong} {what}")
    if wrong:
        raise SystemExit(1)


KERNELS = {"library": run_library, "attention": run_attention, "rows_staged": run_rows_staged,
           "linear": run_linear, "clusters": run_clusters, "split": run_split,
           "decode": run_decode,
           "attention_bwd": run_attention_bwd, "attention_bwd_prep": run_attention_bwd_prep}
LITMUS = {0: "syncthreads", 1: "every-lane", 2: "warp-sync-lane0 (pk.arrive)",
          3: "lane0-only", 4: "none (a real race)"}


def litmus(sanitizer: str, out: str | None) -> list[tuple]:
    """Rows (variant, plain run's mismatches, racecheck's verdict) of bench/litmus/handoff.cu."""
    here = os.path.dirname(os.path.abspath(__file__))
    exe = "/tmp/handoff"
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    subprocess.run([nvcc, "-O2", "-arch=sm_90a", "-o", exe,
                    os.path.join(here, "litmus", "handoff.cu")], check=True)
    rows = []
    for v, what in LITMUS.items():
        plain = subprocess.run([exe, str(v), "4096", "264"], capture_output=True, text=True)
        seen = re.search(r"(\d+) mismatches", plain.stdout)
        p = subprocess.run([sanitizer, "--tool", "racecheck", exe, str(v), "64", "4"],
                           capture_output=True, text=True, timeout=600)
        if out:
            with open(os.path.join(out, f"litmus-{v}-racecheck.log"), "w") as f:
                f.write(p.stdout + p.stderr)
        rows.append((f"litmus {v}", what, seen.group(1) if seen else plain.stdout.strip(),
                     summary(p.stdout + p.stderr)))
    return rows


def summary(log: str) -> str:
    """The tool's verdict line, e.g. 'ERROR SUMMARY: 0 errors', and the kernels its printed
    reports point at."""
    found = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: \d+ \w+(?: displayed \([^)]*\))?", log)
    verdict = "; ".join(found) if found else "no summary (see log)"
    where = sorted(set(re.findall(r"(?:^=========\s+|access )at (\w+)(?:\(|\+0x)", log, re.M)))
    host = len(re.findall(r"Host API memory access error", log))
    return verdict + (f" in {', '.join(where)}" if where else "") + \
        (f" ({host} host-side)" if host else "")


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--inner":
        for name in args[1:] or KERNELS:
            KERNELS[name]()
        return 0
    names = list(args or [*KERNELS, "litmus"])
    sanitizer = os.environ.get("COMPUTE_SANITIZER", "/usr/local/cuda/bin/compute-sanitizer")
    out = os.environ.get("OUT")
    rows, bad = [], False
    if "litmus" in names:
        names.remove("litmus")
        for r in litmus(sanitizer, out):
            print(f"{r[0]:10} {r[1]:28} mismatches {r[2]:>6}  racecheck: {r[3]}", flush=True)
    for name in names:
        for tool, flags in TOOLS.items():
            if os.environ.get("SANITIZE_TOOLS") and \
                    tool not in os.environ["SANITIZE_TOOLS"].split(","):
                continue
            if tool == "initcheck":
                flags = flags + _pykittens_kernels(name)
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
