"""`pykittens bench`: the torch ops of pykittens.ops against their peers on the GPU present —
torch eager, torch.compile, cuBLAS / cuDNN through torch, and QuACK where it is importable —
one family of shapes at a time. Each result is checked against torch before it is timed;
each family writes a JSON file, a Markdown table and a PNG chart.

Timing: the median of 10 replays of a CUDA graph of `reps` calls (pykittens.bench.gpu
.graph_time), so host launch gaps are left out; where a contender cannot be captured in a
graph, CUDA events around `reps` calls instead (the table says which)."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

GB = 1e9
DEVICE = "cuda"


@dataclass(frozen=True)
class Family:
    """Shapes, contenders and the measure of one op. `make(shape, dtype)` gives the inputs
    (CUDA tensors); each contender maps them to the output; `work(shape, dtype, mode)` is
    the bytes moved (memory-bound ops) or the FLOPs of one call."""
    name: str
    shapes: tuple
    quick: tuple
    make: Callable
    contenders: Callable                      # () -> {name: fn(*inputs)}, peers that exist
    work: Callable
    unit: str                                 # "GB/s" or "TFLOP/s"
    modes: tuple = ("fwd", "fwd+bwd")
    dtypes: tuple = ("bf16",)
    notes: str = ""
    grad_inputs: tuple = (0,)                 # which inputs take gradients in fwd+bwd


def _torch():
    import torch
    return torch


def _rand(*shape, dtype="bf16", scale=1.0):
    torch = _torch()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    return (torch.randn(*shape, device=DEVICE) * scale).to(dt)


def _quack(name):
    """quack.<name> where QuACK (quack-kernels) is installed, else None."""
    try:
        import quack
    except Exception:   # noqa: BLE001 - not installed, or its CuTe-DSL cannot load
        return None
    return getattr(quack, name, None)


def _compiled(fn):
    return _torch().compile(fn, dynamic=False)


def _norm_family(name, make, pk_fn, torch_fn, quack_fn, moved):
    """A row op over (M, N) inputs that reads and writes `moved` = (forward, backward)
    tensors of M x N elements (the weights are negligible)."""
    def contenders():
        out = {"pykittens": pk_fn, "torch": torch_fn, "torch.compile": _compiled(torch_fn)}
        if quack_fn is not None:
            out["quack"] = quack_fn
        return out

    def work(shape, dtype, mode):
        m, n = shape
        esz = 4 if dtype == "f32" else 2
        return m * n * esz * (moved[0] + (moved[1] if mode == "fwd+bwd" else 0))
    return Family(name, NORM_SHAPES, NORM_QUICK, make, contenders, work, "GB/s",
                  dtypes=("bf16", "f32"))


NORM_SHAPES = ((32768, 256), (16384, 1024), (16384, 4096), (8192, 8192), (4096, 16384),
               (2048, 32768), (1024, 65536))
NORM_QUICK = ((16384, 1024), (8192, 8192))


def _families() -> dict[str, Family]:
    import torch.nn.functional as F

    import pykittens.ops as pko
    torch = _torch()

    def rows(shape, dtype, weight=True, residual=False):
        m, n = shape
        xs = [_rand(m, n, dtype=dtype)]
        if residual:
            xs.append(_rand(m, n, dtype=dtype))
        if weight:
            xs.append(_rand(n, dtype=dtype))
        return xs

    q_rms, q_softmax = _quack("rmsnorm"), _quack("softmax")
    fams = [
        _norm_family(
            "layer_norm", lambda s, d: rows(s, d) + [_rand(s[1], dtype=d)],
            lambda x, w, b: pko.layer_norm(x, (x.shape[-1],), w, b),
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), None, (2, 3)),
        _norm_family(
            "rms_norm", rows, lambda x, w: pko.rms_norm(x, (x.shape[-1],), w, 1e-6),
            lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
            None if q_rms is None else (lambda x, w: q_rms(x, w, eps=1e-6)), (2, 3)),
        _norm_family(
            "add_rms_norm", lambda s, d: rows(s, d, residual=True),
            lambda x, r, w: pko.add_rms_norm(x, r, w, 1e-6)[0],
            lambda x, r, w: F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), None, (4, 3)),
        _norm_family(
            "softmax", lambda s, d: rows(s, d, weight=False), pko.softmax,
            lambda x: torch.softmax(x, -1), q_softmax, (2, 3)),
    ]

    def rope_make(shape, dtype):
        b, s, h, d = shape
        ang = torch.rand(s, d // 2, device=DEVICE) * 6
        return [_rand(b, s, h, d, dtype=dtype), ang.cos(), ang.sin()]

    def rope_torch(x, cos, sin):
        half = cos.shape[-1]
        c, sn = cos[None, :, None, :], sin[None, :, None, :]
        lo, hi = x[..., :half].float(), x[..., half:].float()
        return torch.cat([lo * c - hi * sn, hi * c + lo * sn], -1).to(x.dtype)

    fams.append(Family(
        "rope", ((4, 4096, 32, 128), (8, 2048, 8, 128), (1, 8192, 64, 128)),
        ((4, 4096, 32, 128),), rope_make,
        lambda: {"pykittens": pko.rope, "torch": rope_torch,
                 "torch.compile": _compiled(rope_torch)},
        lambda s, d, mode: 2 * math.prod(s) * 2 * (2 if mode == "fwd+bwd" else 1), "GB/s"))

    def linear_make(shape, dtype):
        m, k, n = shape
        return [_rand(m, k, dtype=dtype), _rand(n, k, dtype=dtype, scale=k ** -0.5)]

    fams.append(Family(
        # (M, K, N); the last two a decode step's 16 tokens, weights larger than L2
        "linear", ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336),
                   (16384, 14336, 4096), (16, 8192, 8192), (16, 14336, 4096)),
        ((4096, 4096, 4096),), linear_make,
        lambda: {"pykittens": pko.linear, "torch (cuBLAS)": F.linear},
        lambda s, d, mode: 2 * math.prod(s) * (3 if mode == "fwd+bwd" else 1), "TFLOP/s",
        grad_inputs=(0, 1)))

    def attn_make(shape, dtype):
        b, n, h, d = shape
        return [_rand(b, n, h, d, dtype=dtype) for _ in range(3)]

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                           is_causal=True)
        return o.transpose(1, 2)

    fams.append(Family(
        "attention", ((16, 1024, 16, 128), (4, 4096, 16, 128), (1, 16384, 16, 128),
                      (4, 4096, 32, 64)), ((4, 4096, 16, 128),), attn_make,
        lambda: {"pykittens": lambda q, k, v: pko.attention(q, k, v, causal=True),
                 "torch SDPA": sdpa},
        lambda s, d, mode: 2 * s[0] * s[2] * s[1] ** 2 * s[3] * (3.5 if mode == "fwd+bwd"
                                                                else 1),
        "TFLOP/s", grad_inputs=(0, 1, 2), notes="causal; FLOPs 4 B H N^2 D / 2"))
    return {f.name: f for f in fams}


FAMILY_NAMES = ("layer_norm", "rms_norm", "add_rms_norm", "softmax", "rope", "linear",
                "attention")


@dataclass
class Result:
    family: str
    shape: tuple
    dtype: str
    mode: str
    contender: str
    ms: float | None = None
    rate: float | None = None                 # GB/s or TFLOP/s
    rel_err: float | None = None              # against torch's result
    timing: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = max(total, 1), 0, stream or sys.stderr

    def step(self, what: str) -> None:
        self.done += 1
        width = 30
        fill = width * self.done // self.total
        self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                          f"{what[:60]:<60}")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def _time(fn, reps: int) -> tuple[float, str]:
    """Seconds of one call: CUDA graph replay, else events around reps calls."""
    torch = _torch()
    from .gpu import event_time, graph_time
    try:
        return graph_time(fn, reps), "cuda graph"
    except Exception:   # noqa: BLE001 - not capturable: time it eagerly
        torch.cuda.synchronize()
    return event_time(fn, reps), "events"


def _call(fam: Family, fn, inputs, mode):
    """The timed work: the op, or the op and its backward (gradients of grad_inputs)."""
    torch = _torch()
    if mode == "fwd":
        return lambda: fn(*inputs)
    leaves = [x.detach().requires_grad_(i in fam.grad_inputs) for i, x in enumerate(inputs)]
    wanted = [x for i, x in enumerate(leaves) if i in fam.grad_inputs]
    dy = torch.randn_like(fn(*inputs))
    return lambda: torch.autograd.grad(fn(*leaves), wanted, dy)


def run_family(fam: Family, dtypes, quick: bool, reps: int, progress: Progress | None):
    torch = _torch()
    contenders = fam.contenders()
    results = []
    for dtype in dtypes:
        for shape in fam.quick if quick else fam.shapes:
            inputs = fam.make(shape, dtype)
            with torch.no_grad():
                want = contenders[next(c for c in contenders if c.startswith("torch"))](*inputs)
            for mode in fam.modes:
                for name, fn in contenders.items():
                    r = Result(fam.name, tuple(shape), dtype, mode, name)
                    try:
                        if mode == "fwd":
                            got = fn(*inputs)
                            r.rel_err = float((got.double() - want.double()).norm() /
                                              want.double().norm())
                        s, r.timing = _time(_call(fam, fn, inputs, mode), reps)
                        r.ms = s * 1e3
                        w = fam.work(shape, dtype, mode)
                        r.rate = w / s / (GB if fam.unit == "GB/s" else 1e12)
                    except Exception as e:  # noqa: BLE001 - one failure must not hide the rest
                        r.error = f"{type(e).__name__}: {e}"[:200]
                    results.append(r)
                    if progress:
                        progress.step(f"{fam.name} {dtype} {'x'.join(map(str, shape))} {mode} "
                                      f"{name}")
            del inputs
            torch.cuda.empty_cache()
    return results


def count_steps(fam: Family, dtypes, quick: bool, n_contenders: int) -> int:
    return len(dtypes) * len(fam.quick if quick else fam.shapes) * len(fam.modes) * n_contenders


# ---- reports ---------------------------------------------------------------------------------

def markdown(results: list[Result], unit: str, env: str = "") -> str:
    """One row per (dtype, shape, mode), one column per contender (its rate and time), and
    pykittens' speed against the first torch contender."""
    names = list(dict.fromkeys(r.contender for r in results))
    keys = list(dict.fromkeys((r.dtype, r.shape, r.mode) for r in results))
    by = {(r.dtype, r.shape, r.mode, r.contender): r for r in results}
    peer = next((n for n in names if n.startswith("torch")), None)
    head = ["dtype", "shape", "mode"] + [f"{n} ({unit})" for n in names] + \
        ([f"pykittens / {peer}"] if peer and "pykittens" in names else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        cells = [k[0], "x".join(map(str, k[1])), k[2]]
        for n in names:
            r = by.get(k + (n,))
            if r is None or r.error:
                cells.append("error" if r is not None else "")
            else:
                bad = r.rel_err is not None and not r.rel_err < 2e-2
                cells.append(f"{r.rate:.3g} ({r.ms:.3f} ms)" + (" FAIL" if bad else ""))
        if len(head) > len(cells):
            a, b = by.get(k + ("pykittens",)), by.get(k + (peer,))
            ok = a is not None and b is not None and a.ms and b.ms
            cells.append(f"{b.ms / a.ms:.2f}x" if ok else "")
        lines.append("| " + " | ".join(cells) + " |")
    errors = [r for r in results if r.error]
    notes = [f"- {r.contender} {r.dtype} {'x'.join(map(str, r.shape))} {r.mode}: {r.error}"
             for r in errors]
    timing = sorted({r.timing for r in results if r.timing})
    foot = [f"\nTiming: {', '.join(timing)}." if timing else ""] + \
        ([f"\n{env}"] if env else []) + (["\nErrors:"] + notes if notes else [])
    return "\n".join(lines) + "\n" + "\n".join(x for x in foot if x) + "\n"


def chart(results: list[Result], unit: str, title: str, path: str) -> None:
    """Grouped bars: one group per (dtype, shape, mode), one bar per contender."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    names = list(dict.fromkeys(r.contender for r in results))
    keys = list(dict.fromkeys((r.dtype, r.shape, r.mode) for r in results))
    by = {(r.dtype, r.shape, r.mode, r.contender): r for r in results}
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys) * max(1, len(names)) / 2), 4.5))
    x = np.arange(len(keys))
    w = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        vals = [(by.get(k + (n,)).rate or 0) if by.get(k + (n,)) else 0 for k in keys]
        ax.bar(x + i * w - 0.4 + w / 2, vals, w, label=n)
    ax.set_xticks(x, [f"{k[0]} {'x'.join(map(str, k[1]))}\n{k[2]}" for k in keys], fontsize=7)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_family(name: str, results: list[Result], unit: str, out_dir: str,
                 env: dict | None = None) -> list[str]:
    """{name}.json, {name}.md, {name}.png in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    env = env or {}
    with open(base + ".json", "w") as f:
        json.dump({"family": name, "unit": unit, "environment": env,
                   "results": [r.__dict__ for r in results]}, f, indent=2, default=str)
    env_line = ", ".join(f"{k}: {v}" for k, v in env.items())
    with open(base + ".md", "w") as f:
        f.write(f"# {name}\n\n" + markdown(results, unit, env_line))
    chart(results, unit, f"{name} ({env.get('gpu', 'GPU')})", base + ".png")
    return [base + ".json", base + ".md", base + ".png"]


def environment() -> dict:
    torch = _torch()
    import datetime
    out = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0)}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:   # noqa: BLE001
        pass
    out["quack"] = "yes" if _quack("rmsnorm") is not None else "not installed"
    return out


NEEDS_GPU = ("pykittens bench: needs a GPU that torch can use (a CUDA build of torch on an "
             "H100/H200, or ROCm on an MI300X/MI355X); torch.cuda.is_available() is False "
             "here, so nothing was run")


def gpu_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def main(families, out_dir: str, quick: bool = False, dtypes=None, reps: int = 20) -> int:
    """Run `families` (names; all when empty) and write their reports; 1 without a GPU."""
    unknown = [f for f in families if f not in FAMILY_NAMES]
    if unknown:
        print(f"pykittens bench: unknown famil{'y' if len(unknown) == 1 else 'ies'} "
              f"{', '.join(unknown)}; choose from {', '.join(FAMILY_NAMES)}", file=sys.stderr)
        return 2
    if not gpu_present():
        print(NEEDS_GPU, file=sys.stderr)
        return 1
    fams = _families()
    chosen = [fams[f] for f in (families or FAMILY_NAMES)]
    plans = [(f, [d for d in (dtypes or f.dtypes) if d in f.dtypes]) for f in chosen]
    total = sum(count_steps(f, d, quick, len(f.contenders())) for f, d in plans)
    progress, env, written = Progress(total), environment(), []
    for fam, dts in plans:
        results = run_family(fam, dts, quick, reps, progress)
        written += write_family(fam.name, results, fam.unit, out_dir, env)
    print("\n".join(written))
    return 0
