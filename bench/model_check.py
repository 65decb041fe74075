"""The performance model (`pykittens model`, pykittens/analysis/model.py) against the H200: every
Hopper library kernel family timed in one run, and the model's figure for each beside it.

    PYKITTENS_CACHE=$PWD/.pkc_m PYTHONPATH=.:bench python3 bench/model_check.py --prebuild  # here
    PYKITTENS_CACHE=$PWD/.pkc_m PYTHONPATH=.:bench python3 bench/model_check.py      # on the H200
    PYKITTENS_CACHE=$PWD/.pkc_m PYTHONPATH=.:bench python3 bench/model_check.py --clocks  # H200
    PYTHONPATH=.:bench python3 bench/model_check.py --table docs/perf/model-check-....json

The GPU run, in order: the tensor cores' rate per clock with nothing else to do, the TMA
unit's reductions and a fenced arrive's clocks (bench/gpu_clock.py, for the record: the
model does not take them unless its target file does); gemm_ws as the library launches it
(bf16 and e4m3 promoted, medians of CUDA-graph replays); pykittens.ops.attention (the
forward's kernel alone); the row ops forward and backward through pykittens.ops
(bench/ops_bandwidth.py's `copy` and `ops` steps). Details go to $OUT/model_check.json.
`--table` prints measured against modeled for a saved run, with the error (model -
measured) / measured of each; it needs the toolchain (ptxas, cuobjdump) but no GPU.
`--clocks`: the SM clock and power under cuBLAS, gemm_ws, attention and rms_norm, a few
seconds each; `--only F,G`: those families of rate, gemm, attention, attention_bwd, rows
($OUT/model_check_more.json for either)."""
from __future__ import annotations

import sys
import time

GEMMS = [(4096, 4096, 4096, "bf16"), (8192, 8192, 8192, "bf16"), (16384, 16384, 16384, "bf16"),
         (8192, 28672, 8192, "bf16"), (16384, 4096, 4096, "bf16"), (4096, 4096, 4096, "e4m3"),
         (8192, 8192, 8192, "e4m3")]
# (B, Hq, Hkv, N, D, causal): the attention bench's shapes (docs/PERF.md run A)
ATTENTION = [(16, 16, 16, 4096, 128, 0), (16, 16, 16, 4096, 128, 1), (16, 32, 32, 4096, 64, 0),
             (4, 16, 16, 16384, 128, 0), (16, 32, 8, 4096, 128, 0)]
# a row op and direction -> the kernels it launches (pykittens.ops), the second adding up the
# partial column sums of the weight's (and bias's) gradient
ROW_KERNELS = {("layer_norm", "fwd"): ("layernorm",), ("layer_norm", "bwd"): ("layernorm_bwd",),
               ("rms_norm", "fwd"): ("rmsnorm",), ("rms_norm", "bwd"): ("rmsnorm_bwd",),
               ("add_rms_norm", "fwd"): ("add_rmsnorm",),
               ("add_rms_norm", "bwd"): ("add_rmsnorm_bwd",),
               ("softmax", "fwd"): ("softmax",), ("softmax", "bwd"): ("softmax_bwd",),
               ("rope", "fwd"): ("rope",), ("rope", "bwd"): ("rope",)}


def _gemm_plan(m, n, k, dtype):
    from pykittens.cli import library_plan
    out = "bf16"
    lp = library_plan("gemm_ws", "sm_90a", m, n, k, dtype, out)
    return lp.grid, {**lp.consts, "DT": dtype, "OUT": out}


def builds():
    """(kernel, consts) of every build the GPU run launches beyond bench/ops_bandwidth.py's."""
    import numpy as np
    from gpu_clock import wgmma_loop
    from pykittens.kernels.attention import attention_fwd, attention_fwd_launch
    from pykittens.kernels.attention_bwd import attention_bwd_launch
    from pykittens.kernels.gemm import gemm_ws
    from gpu_clock import FENCE_FORMS, TMA_REDUCE_SHARES, WGMMA_FORMS, fence_loop, \
        tma_reduce_loop
    for dt, n, a_smem, warpgroups in WGMMA_FORMS:
        yield wgmma_loop, {"DT": dt, "N": n, "A_SMEM": a_smem, "num_waves": 4 * warpgroups}
    for share in TMA_REDUCE_SHARES:
        yield tma_reduce_loop, {"SHARE": share}
    for _, mma, in_flight, store, arrive in FENCE_FORMS:
        yield fence_loop, {"MMA": mma, "IN_FLIGHT": in_flight, "STORE": store,
                           "ARRIVE": arrive}
    for m, n, k, dt in GEMMS:
        yield gemm_ws, _gemm_plan(m, n, k, dt)[1]
    for b, hq, hkv, n, d, causal in ATTENTION:
        i = {x: np.empty((b, h, n, d), np.float16) for x, h in (("q", hq), ("k", hkv), ("v", hkv))}
        yield attention_fwd, {"DT": "bf16", **attention_fwd_launch(i, "sm_90a",
                                                                   CAUSAL=causal)[1]}
        for kernel, plan in zip(_bwd_kernels(), attention_bwd_launch(i, "sm_90a",
                                                                     CAUSAL=causal)):
            yield kernel, {"DT": "bf16", **plan[1]}


def _bwd_kernels():
    """The backward's passes as pykittens.ops.attention launches them (sm_90a's default dQ)."""
    from pykittens.kernels import attention_bwd as ab
    from pykittens.targets import get
    third = ab.attention_bwd_dq_finish if ab._dq_of(None, get("sm_90a")) == "atomic" else \
        ab.attention_bwd_dq
    return ab.attention_bwd_prep, ab.attention_bwd, third


def prebuild() -> int:
    import ops_bandwidth
    from pykittens import compiler
    from pykittens.toolchain import nvptx
    t0 = time.time()
    for kernel, consts in builds():
        nvptx.compile_ptx(compiler.llvm_ir(kernel, "sm_90a", aligned=True, **consts), "sm_90a")
    ops_bandwidth.prebuild_all(verbose=False)
    print(f"prebuilt in {time.time() - t0:.0f} s")
    return 0


def measure(families=("rate", "gemm", "attention", "attention_bwd", "ramp", "rows")
            ) -> list[dict]:
    """The GPU run: each family of `families` timed (module docstring)."""
    import torch

    import gpu_clock
    import ops_bandwidth
    import pykittens.ops as pko
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    from pykittens.tune import graph_time
    out = [{"family": "wgmma loop", **gpu_clock.wgmma_rate(*form)}
           for form in gpu_clock.WGMMA_FORMS if "rate" in families]
    out += [{"family": "tma reduce", **gpu_clock.tma_reduce_rate(share)}
            for share in gpu_clock.TMA_REDUCE_SHARES if "rate" in families]
    out += [{"family": "fence", **r} for r in gpu_clock.fence_cost()] \
        if "rate" in families else []
    for m, n, k, dt in GEMMS if "gemm" in families else ():
        grid, consts = _gemm_plan(m, n, k, dt)
        a, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        if dt == "e4m3":
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        else:
            a, b = a.bfloat16(), b.bfloat16()
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        sec = graph_time(lambda: launch(gemm_ws, grid=grid, a=a, b=b, c=c, **consts), 10)
        out.append({"family": "gemm_ws", "shape": [m, n, k], "dtype": dt, "s": sec,
                    "tflops": 2 * m * n * k / sec / 1e12})
        print(f"gemm_ws {m}x{n}x{k} {dt}: {out[-1]['tflops']:.0f} TFLOP/s", flush=True)
        del a, b, c
    for bsz, hq, hkv, n, d, causal in ATTENTION:
        if "attention" not in families and "attention_bwd" not in families:
            break
        q = torch.randn(bsz, n, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(bsz, n, hkv, d, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        sec = graph_time(lambda: pko.attention(q, k, v, causal=bool(causal)), 10)
        flops = 4 * bsz * hq * n * n * d * (0.5 if causal else 1)
        if "attention" in families:
            out.append({"family": "attention_fwd", "shape": [bsz, hq, hkv, n, d],
                        "causal": causal, "s": sec, "tflops": flops / sec / 1e12})
            print(f"attention {bsz}x{hq}x{hkv}x{n}x{d} causal={causal}: "
                  f"{out[-1]['tflops']:.0f} TFLOP/s", flush=True)
        if "attention_bwd" in families:       # forward and backward, less the forward
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            do = torch.randn_like(q)

            def both():
                torch.autograd.grad(pko.attention(*leaves, causal=bool(causal)), leaves, do)
            t_all = graph_time(both, 5)
            out.append({"family": "attention_bwd", "shape": [bsz, hq, hkv, n, d],
                        "causal": causal, "s": t_all - sec,
                        "tflops": 2.5 * flops / (t_all - sec) / 1e12})
            print(f"attention backward {bsz}x{hq}x{hkv}x{n}x{d} causal={causal}: "
                  f"{out[-1]['tflops']:.0f} TFLOP/s", flush=True)
    if "ramp" in families:
        from pykittens.bench.gpu import copy_ramp
        r = copy_ramp()
        out.append({"family": "ramp", **r})
        pts = ", ".join(f"{p['bytes'] >> 20} MiB {p['s'] * 1e6:.1f} µs" for p in r["points"])
        print(f"copy: {r['fixed_s'] * 1e6:.2f} µs + bytes / {r['bytes_per_s'] / 1e12:.3f} "
              f"TB/s ({pts})", flush=True)
    if "rows" not in families:
        return out
    ops_bandwidth._state.update(t0=time.time(), results=[])
    rows, details = [], []
    ops_bandwidth.step_copy(rows, details)
    ops_bandwidth.step_ops(rows, details)
    for r in details:
        if r.get("contender") == "pykittens" and "error" not in r and r["op"] != "linear":
            for mode in ("fwd", "bwd"):
                out.append({"family": "rows", "op": r["op"], "mode": mode,
                            "shape": list(r["shape"]), "s": r[f"{mode}_s"],
                            "bytes_per_s": r[f"{mode}_bytes_per_s"],
                            "of_copy": r.get(f"{mode}_of_copy")})
    out.append({"family": "copy", "bytes_per_s": ops_bandwidth._state["copy"]})
    return out


def clocks() -> list[dict]:
    """The SM clock and power while each family runs back to back for a few seconds
    (bench/gpu_clock.py's sampling): the model runs every kernel at one clock measured under
    cuBLAS, and this says how far each family's own clock is from it."""
    import torch

    import gpu_clock
    import pykittens.ops as pko
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    m = 8192
    a, b = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    grid, consts = _gemm_plan(m, m, m, "bf16")
    q, k, v = (torch.randn(16, 4096, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(8192, device="cuda", dtype=torch.bfloat16)
    runs = {"cuBLAS 8192^3 bf16": lambda: torch.nn.functional.linear(a, b),
            "gemm_ws 8192^3 bf16": lambda: launch(gemm_ws, grid=grid, a=a, b=b, c=c, **consts),
            "attention_fwd 16x16x16x4096x128": lambda: pko.attention(q, k, v),
            "rms_norm 16384x8192": lambda: pko.rms_norm(x, (8192,), w, 1e-5)}
    out = []
    for name, fn in runs.items():
        r = {"family": "clock", "what": name, **gpu_clock.sample(fn)}
        out.append(r)
        print(f"{name}: SM clock median {r['clock_mhz_median']:.0f} MHz (min "
              f"{r['clock_mhz_min']:.0f}, max {r['clock_mhz_max']:.0f}), "
              f"{r['power_w_median']:.0f} W, {','.join(r['throttle_reasons'])}", flush=True)
    return out


def _row_model(op, mode, shape) -> float:
    """Modeled seconds of a row op: its kernels' (and column_sum's over the partial sums a
    norm's backward leaves, or the fused kernel where the op takes it: rows.fuses_sums)."""
    from pykittens.analysis import model as perf
    from pykittens.cli import library_plan
    from pykittens.kernels.rows import fuses_sums
    total = 0.0
    for kernel in ROW_KERNELS[op, mode]:
        walk = library_plan(kernel, "sm_90a", shape, "bf16")
        if walk.partial_sums and fuses_sums(walk.grid[0], walk.consts, "sm_90a"):
            kernel += "_fused"
        res = perf.model(kernel, "sm_90a", shape, "bf16", plan=library_plan)
        total += res["time_s"]
        if res["partial_sums"]:
            total += perf.model("column_sum", "sm_90a", res["partial_sums"], "bf16",
                                plan=library_plan)["time_s"]
    return total


def table(results) -> str:
    from pykittens.analysis import model as perf
    from pykittens.bench import text_table
    from pykittens.cli import library_plan
    rows, errs = [], []
    for r in results:
        fam = r["family"]
        if fam == "gemm_ws":
            mod = perf.model("gemm_ws", "sm_90a", r["shape"], r["dtype"], plan=library_plan)
            got, want, unit = r["tflops"], mod["modeled_tflops"], "TFLOP/s"
            what, bound = f"gemm_ws {'x'.join(map(str, r['shape']))} {r['dtype']}", mod["bound"]
        elif fam in ("attention_fwd", "attention_bwd"):
            mod = perf.model(fam, "sm_90a", r["shape"], "bf16", plan=library_plan,
                             causal=bool(r["causal"]))
            got, want, unit = r["tflops"], mod["modeled_tflops"], "TFLOP/s"
            what = (f"{fam} " + "x".join(map(str, r["shape"]))
                    + (" causal" if r["causal"] else ""))
            bound = mod["bound"]
        elif fam == "rows":
            sec = _row_model(r["op"], r["mode"], tuple(r["shape"]))
            got, want, unit = r["bytes_per_s"] / 1e12, r["bytes_per_s"] * r["s"] / sec / 1e12, \
                "TB/s"
            what, bound = f"{r['op']} {r['mode']} {'x'.join(map(str, r['shape']))}", "dram"
        else:
            continue
        err = (want - got) / got
        errs.append(err)
        rows.append([what, f"{got:.2f}" if unit == "TB/s" else f"{got:.0f}",
                     f"{want:.2f}" if unit == "TB/s" else f"{want:.0f}", unit, bound,
                     f"{err:+.1%}"])
    within = sum(abs(e) <= 0.15 for e in errs)
    foot = [f"within 15%: {within} of {len(errs)}"]
    for rate in (r for r in results if r["family"] == "wgmma loop"):
        foot.append(f"wgmma loop {rate['shape']}: {rate['tflops']:.0f} TFLOP/s at "
                    f"{rate['clock_mhz_median']:.0f} MHz = {rate['flops_per_clk_per_sm']:.0f} "
                    "FLOPs an SM a clock")
    for ramp in (r for r in results if r["family"] == "ramp"):
        foot.append(f"copy in a CUDA graph: {ramp['fixed_s'] * 1e6:.2f} µs + bytes / "
                    f"{ramp['bytes_per_s'] / 1e12:.3f} TB/s")
    fence = {r["shape"]: r["clk_per_step"] for r in results if r["family"] == "fence"}
    if fence:
        foot.append("fenced arrive: {:.0f} clocks with its group waited, {:.0f} with one in "
                    "flight".format(fence["waited, store, fenced arrive"] - fence["waited, store"],
                                    fence["in flight, store, fenced arrive"]
                                    - fence["in flight, store"]))
    for rate in (r for r in results if r["family"] == "tma reduce"):
        foot.append(f"{rate['shape']}: {rate['bytes_per_s'] / 1e12:.2f} TB/s at "
                    f"{rate['clock_mhz_median']:.0f} MHz = {rate['bytes_per_clk_per_sm']:.1f} "
                    "bytes an SM a clock")
    return text_table(rows, ["kernel", "measured", "modeled", "unit", "bound", "error"]) + \
        "\n" + "\n".join(foot)


def main() -> int:
    from chiplet_l2 import offline, write_results      # bench/
    if "--prebuild" in sys.argv:
        return prebuild()
    done = offline(None, table)
    if done is not None:
        return done
    import torch
    if not torch.cuda.is_available():
        print("bench/model_check.py needs the H200 (or --prebuild / --table FILE here)",
              file=sys.stderr)
        return 1
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    results = clocks() if "--clocks" in sys.argv else []
    if "--clocks" not in sys.argv or only:
        results += measure(*([only] if only else []))
    write_results("model_check_more" if only or "--clocks" in sys.argv else "model_check",
                  results)
    if any(r["family"] != "clock" for r in results):
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
