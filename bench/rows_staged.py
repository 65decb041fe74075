"""The row kernels' schedules against each other on the GPU: the register schedules
(rows.plan / rows.walk_plan) and the staged walk (rows.staged_plan: rows copied into shared
memory by the TMA unit, STAGES - 1 steps ahead) over its choices of waves, stages and
workgroups per SM for the backward passes, and the split-row schedules (columns per wave)
for the forward passes, at the shapes of
bench/ops_bandwidth.py, bf16, each as bytes moved per second against a device copy. (The
library stages the backward passes; forward passes stay in registers, where staging
measured slower.)

    PYKITTENS_CACHE=$PWD/.pkc_rows python3 bench/rows_staged.py --prebuild   # no GPU: PTX
    PYKITTENS_CACHE=$PWD/.pkc_rows PYTHONPATH=. python3 bench/rows_staged.py    # on the GPU

Name kernels (e.g. softmax_bwd) to run only those.

Kernels are launched directly (pk.launch), without the ops' column sums of the weight
gradient. Every variant's outputs are compared with the register schedule's (the schedule
the op tests check against float64). Writes $OUT/rows_staged.json; prints a table last:
each kernel's register schedule, the staged plan's default, and the best variant."""
from __future__ import annotations

import itertools
import json
import os
import sys
import time

from pykittens.kernels import rows
from pykittens.kernels.layernorm import layernorm, layernorm_bwd
from pykittens.kernels.rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_bwd
from pykittens.kernels.softmax import softmax_bwd

SHAPES = ((16384, 8192), (16384, 4096), (4096, 12288))
TARGET = "sm_90a"
EPS = 1e-5

# name: (kernel, staged inputs, bytes moved in units of M x N elements, constants)
CASES = {
    "layer_norm": (layernorm, ("x",), 2, {"STATS": 1}),
    "rms_norm": (rmsnorm, ("x",), 2, {"STATS": 1}),
    "add_rms_norm": (add_rmsnorm, ("x", "residual"), 4, {"STATS": 1}),
    "layer_norm_bwd": (layernorm_bwd, ("x", "dy"), 3, {}),
    "rms_norm_bwd": (rmsnorm_bwd, ("x", "dy"), 3, {"RESIDUAL": 0}),
    "add_rms_norm_bwd": (rmsnorm_bwd, ("x", "dy", "ds"), 4, {"RESIDUAL": 1}),
    "softmax_bwd": (softmax_bwd, ("y", "dy"), 3, {}),
}
BACKWARD = {"layer_norm_bwd", "rms_norm_bwd", "add_rms_norm_bwd", "softmax_bwd"}
SUMS = {"layer_norm_bwd": 2, "rms_norm_bwd": 1, "add_rms_norm_bwd": 1}   # per-column sums


def register_plan(name, m, n):
    """The register schedule the library's launch rule takes with staging off."""
    from pykittens.kernels import (Operand, ln_grad_launch, ln_launch, rms_grad_launch,
                                   row_launch)
    i = {"x": Operand((m, n), 2)}
    launch = {
        "layer_norm": lambda: ln_launch(i, TARGET),
        "rms_norm": lambda: row_launch(i, TARGET),
        "add_rms_norm": lambda: row_launch(i, TARGET, row_bytes=4),
        "layer_norm_bwd": lambda: ln_grad_launch(i, TARGET),
        "rms_norm_bwd": lambda: rms_grad_launch(i, TARGET, residual=False),
        "add_rms_norm_bwd": lambda: rms_grad_launch(i, TARGET, residual=True),
        "softmax_bwd": lambda: row_launch({"y": i["x"]}, TARGET, x="y", row_bytes=4),
    }[name]
    was, rows.STAGED = rows.STAGED, False
    try:
        return launch()
    finally:
        rows.STAGED = was


def variants(name, m, n):
    """(label, grid, consts) of every schedule timed for one kernel and shape."""
    _, staged, _, extra = CASES[name]
    grid, consts = register_plan(name, m, n)
    out = [("registers", grid, {**consts, **extra})]
    if name not in SUMS:              # split rows: a share of 512 to 2048 columns per wave
        for share in (512, 1024, 2048):
            nw = -(-n // share)
            split = {"SPLIT": 1, "ROWS": 1, "N_MAX": nw * share, "CHUNK": 512,
                     "num_waves": nw, **extra}
            if nw <= 32:
                out.append((f"split w{nw}", (m,), split))
    if name not in BACKWARD:
        return out
    sums = SUMS.get(name, 0)
    default = rows.staged_plan(m, n, TARGET, 2, len(staged), sums)
    if default is None:
        return out
    out.append(("staged", default[0], {**default[1], **extra}))
    nw = default[1]["num_waves"]
    for waves, stages, programs in itertools.product((nw, 2 * nw), (2, 3), (1, 2, 3)):
        plan = rows.staged_plan(m, n, TARGET, 2, len(staged), sums, waves=waves,
                                stages=stages, programs=programs)
        if plan is not None and waves <= 32 and (plan[0], plan[1]) != default:
            out.append((f"w{waves} s{stages} p{programs}", plan[0], {**plan[1], **extra}))
    return out


def builds():
    """(kernel, constants) of every build the GPU run makes."""
    for (m, n), name in itertools.product(SHAPES, _selected()):
        seen = set()
        for _, _, consts in variants(name, m, n):
            key = tuple(sorted(consts.items()))
            if key not in seen:
                seen.add(key)
                yield CASES[name][0], {**consts, "DT": "bf16"}


def prebuild() -> int:
    from pykittens import compiler
    from pykittens.toolchain import nvptx
    t0, count = time.time(), 0
    for kernel, consts in builds():
        nvptx.compile_ptx(compiler.llvm_ir(kernel, TARGET, aligned=True, **consts), TARGET)
        count += 1
    print(f"{count} builds in {time.time() - t0:.0f} s")
    return 0


# ---- on the GPU -------------------------------------------------------------------------

def _inputs(name, m, n, grid, consts):
    import torch
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(m + n)

    def rand(*shape, scale=1.0, offset=0.0, dtype=bf):
        return (torch.randn(*shape, device=dev, generator=g) * scale + offset).to(dtype)

    x, w = rand(m, n, offset=0.5), rand(n, scale=0.1, offset=1.0)
    if name == "layer_norm":
        return dict(x=x, w=w, b=rand(n, scale=0.1), out=torch.empty_like(x),
                    stats=torch.empty(2, m, device=dev), eps=EPS), ("out", "stats")
    if name == "rms_norm":
        return dict(x=x, w=w, out=torch.empty_like(x), rstd=torch.empty(m, device=dev),
                    eps=EPS), ("out", "rstd")
    if name == "add_rms_norm":
        return dict(x=x, residual=rand(m, n), w=w, out=torch.empty_like(x),
                    s=torch.empty_like(x), rstd=torch.empty(m, device=dev), eps=EPS), \
            ("out", "s")
    if name == "softmax_bwd":
        y = torch.softmax(rand(m, n, scale=3.0).float(), -1).to(bf)
        return dict(y=y, dy=rand(m, n), dx=torch.empty_like(y)), ("dx",)
    part_rows = rows.ColumnSums.partial_rows(grid[0], consts)
    xf = x.float()
    if name == "layer_norm_bwd":
        mu, var = xf.mean(1), xf.var(1, unbiased=False)
        stats = torch.stack([mu, (var + EPS).rsqrt()])
        part = torch.zeros(part_rows, 2 * n, device=dev)
        return dict(x=x, dy=rand(m, n), w=w, stats=stats, dx=torch.empty_like(x),
                    part=part), ("dx",)
    rstd = ((xf * xf).mean(1) + EPS).rsqrt()
    return dict(x=x, dy=rand(m, n), w=w, rstd=rstd, ds=rand(m, n), dx=torch.empty_like(x),
                dw_part=torch.zeros(part_rows, n, device=dev)), ("dx",)


def _selected():
    """The kernels named on the command line (all by default)."""
    names = [a for a in sys.argv[1:] if not a.startswith("-")]
    return names or list(CASES)


def run_gpu() -> int:
    import torch
    import pykittens as pk
    from pykittens.bench.gpu import copy_ceiling, graph_time
    copy, _ = copy_ceiling()
    results, failures = [], 0
    for (m, n), name in itertools.product(SHAPES, _selected()):
        kernel, _, units, _ = CASES[name]
        moved = units * m * n * 2
        ref = None
        for label, grid, consts in variants(name, m, n):
            args, outs = _inputs(name, m, n, grid, consts)
            try:
                pk.launch(kernel, grid=grid, **args, **consts)
                torch.cuda.synchronize()
                got = {k: args[k].float().clone() for k in outs}
                if ref is None:
                    ref = got
                err = max(float((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30))
                          for k in outs)
                sec = graph_time(lambda: pk.launch(kernel, grid=grid, **args, **consts), 20)
            except Exception as e:   # noqa: BLE001 - report the variant, go on
                failures += 1
                results.append(dict(op=name, shape=[m, n], variant=label, error=repr(e)))
                print(f"{name} {m}x{n} {label}: {e!r}", flush=True)
                continue
            if err > 1e-2:
                failures += 1
            row = dict(op=name, shape=[m, n], variant=label, grid=list(grid), consts=consts,
                       ms=sec * 1e3, bytes_per_s=moved / sec, of_copy=moved / sec / copy,
                       rel_diff=err)
            results.append(row)
            print(f"{name:17s} {m}x{n:<6d} {label:14s} {sec * 1e3:7.3f} ms "
                  f"{row['of_copy']:6.1%} of copy  diff {err:.1e}", flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "rows_staged.json"), "w") as f:
        json.dump({"copy_bytes_per_s": copy, "results": results}, f, indent=1)
    print(f"\ncopy {copy / 1e12:.2f} TB/s; fraction of copy: registers | staged default | "
          "best variant")
    for (m, n), name in itertools.product(SHAPES, _selected()):
        mine = [r for r in results if r["op"] == name and r["shape"] == [m, n] and "ms" in r]
        if not mine:
            continue
        by = {r["variant"]: r["of_copy"] for r in mine}
        best = max(mine, key=lambda r: r["of_copy"])
        print(f"{name:17s} {m}x{n:<6d} {by.get('registers', 0):6.1%} | "
              f"{by.get('staged', 0):6.1%} | {best['of_copy']:6.1%} ({best['variant']})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(prebuild() if "--prebuild" in sys.argv else run_gpu())
