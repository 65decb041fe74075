"""Every op of pykittens.ops, forward and backward, at the activation shapes of a large
transformer — 16384x8192, 16384x4096 and 4096x12288, bfloat16 — against the device's own copy
bandwidth measured in the same run, torch eager, and QuACK where `quack` is importable; then
the host time of one cached call, and a CUDA graph capturing a block of ops forward and
backward, replayed against eager execution.

    PYKITTENS_CACHE=$PWD/.pkcache python3 bench/ops_bandwidth.py --prebuild    # here, no GPU
    PYKITTENS_CACHE=$PWD/.pkcache PYTHONPATH=. python3 bench/ops_bandwidth.py   # on the GPU

--prebuild runs every op call the GPU run makes on CPU tensors of the same shapes with the
launches replaced by builds, so the code-object cache holds the PTX (and, where ptxas is
installed, the cubin) of each; carry .pkcache to the GPU machine and the run there only
traces and lowers (milliseconds per kernel) and loads. Its first row says how many PTX
builds it still had to make.

Steps (name some on the command line to run only those): copy, ops, host, graph, variants, report.
  copy    device-to-device copy bandwidth: the ceiling the row ops are measured against
  ops     each op at each shape: forward and gradients against torch in float32, then the
          forward and forward+backward timed as CUDA graph replays (backward = the
          difference); pykittens, torch eager, QuACK (rms_norm, softmax) where importable
  host    microseconds of host time per cached call on tiny inputs (pykittens and torch;
          the median of 5 rounds of 200 calls),
          and pk.launch's fast path against its checked path
  host_profile  each op's replayed call with the garbage collector on and off, and the
          functions its host time goes to (cProfile)
  graph   add_rms_norm -> linear -> rope -> layer_norm -> softmax forward and backward
          captured in one CUDA graph, replayed on new inputs, compared with eager
  variants  ops under the launch rule and under other schedules (VARIANTS: forward row
          ops; ROPE_VARIANTS: rope's grid order; BWD_VARIANTS: the norms' backward walks,
          and each asked for its inputs' gradients only; every op launched without early
          launch), as fractions of the copy; OPS_VARIANTS="name|..." times only those
  report  $OUT/ops_bandwidth.md and $OUT/ops_bandwidth.png (the JSON is written in any case)
A short table is printed last; the exit status is 1 when a result disagrees with torch or a
step fails. It stops timing after BUDGET_S seconds (the rows say what was skipped).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

import pykittens.ops as pko
from pykittens.bench import per_call_us

SHAPES = ((16384, 8192), (16384, 4096), (4096, 12288))
HEAD_DIM = 128                 # rope: an (M, N) activation is (1, M, N / 128, 128)
EPS = 1e-5
TOL = 2e-2                     # relative error against float32 torch (bfloat16 results)
BUDGET_S = 420                 # timing stops after this many seconds of the run
HOST_CALLS, HOST_ROUNDS = 200, 5
DT = torch.bfloat16
DEVICE = "cuda"                # (the CPU test of this script runs the ops step on "cpu")

_state = {"t0": time.time(), "copy": None, "results": [], "prebuild": False}


# ---- the ops ----------------------------------------------------------------------------------

def _rand(*shape, dtype=DT, scale=1.0, offset=0.0):
    if _state["prebuild"]:                            # values do not matter for a build
        return torch.empty(*shape, dtype=dtype, device="cpu")
    return (torch.randn(*shape, device=DEVICE) * scale + offset).to(dtype)


def _tables(m):
    """cos, sin (m, HEAD_DIM / 2) float32 of the GPT-NeoX rotation."""
    if _state["prebuild"]:
        return [torch.empty(m, HEAD_DIM // 2) for _ in range(2)]
    freq = 10000.0 ** (-torch.arange(HEAD_DIM // 2, device=DEVICE) / (HEAD_DIM // 2))
    ang = torch.arange(m, device=DEVICE)[:, None] * freq[None, :]
    return [ang.cos(), ang.sin()]


def _rope_torch(x, cos, sin):
    half = cos.shape[-1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    lo, hi = x[..., :half].float(), x[..., half:2 * half].float()
    return torch.cat([lo * c - hi * s, hi * c + lo * s], -1).to(x.dtype)


def _add_rms_torch(x, r, w):
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), w, EPS), s


class Op:
    """An op: `make(shape)` its inputs (grads: the indices that take gradients),
    `pykittens` / `torch` the two implementations (torch's also the float32 reference),
    `moved(shape)` the bytes of one forward and one backward (None: a matrix product, whose
    `flops(shape)` count instead)."""

    def __init__(self, name, make, pykittens, torch_fn, grads, moved=None, flops=None,
                 quack=None):
        self.name, self.make, self.pykittens, self.torch = name, make, pykittens, torch_fn
        self.grads, self.moved, self.flops, self.quack = grads, moved, flops, quack


def _quack(name):
    try:
        import quack
    except Exception:   # noqa: BLE001 - not installed, or its CuTe DSL cannot load
        return None
    return getattr(quack, name, None)


def _ops() -> list[Op]:
    def norm_inputs(shape, residual=False, bias=False):
        m, n = shape
        xs = [_rand(m, n)] + ([_rand(m, n)] if residual else [])
        xs.append(_rand(n, scale=0.1, offset=1.0))
        return xs + ([_rand(n, scale=0.1)] if bias else [])

    def rows(k):                                 # k tensors of M x N bf16 elements
        return lambda s: k * s[0] * s[1] * 2

    def rope_inputs(shape):
        m, n = shape
        return [_rand(1, m, n // HEAD_DIM, HEAD_DIM)] + _tables(m)

    def rope_bytes(s):
        return 2 * s[0] * s[1] * 2 + 2 * s[0] * HEAD_DIM // 2 * 4     # x in, out; cos, sin

    q_rms, q_soft = _quack("rmsnorm"), _quack("softmax")
    return [
        Op("layer_norm", lambda s: norm_inputs(s, bias=True),
           lambda x, w, b: pko.layer_norm(x, (x.shape[-1],), w, b, EPS),
           lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS), (0, 1, 2),
           moved=(rows(2), rows(3))),
        Op("rms_norm", norm_inputs, lambda x, w: pko.rms_norm(x, (x.shape[-1],), w, EPS),
           lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS), (0, 1),
           moved=(rows(2), rows(3)),
           quack=None if q_rms is None else (lambda x, w: q_rms(x, w, eps=EPS))),
        Op("add_rms_norm", lambda s: norm_inputs(s, residual=True),
           lambda x, r, w: pko.add_rms_norm(x, r, w, EPS), _add_rms_torch, (0, 1, 2),
           moved=(rows(4), rows(4))),
        Op("softmax", lambda s: [_rand(*s, scale=3.0)], pko.softmax,
           lambda x: torch.softmax(x, -1), (0,), moved=(rows(2), rows(3)), quack=q_soft),
        Op("rope", rope_inputs, pko.rope, _rope_torch, (0,), moved=(rope_bytes, rope_bytes)),
        Op("linear", lambda s: [_rand(*s), _rand(s[1], s[1], scale=s[1] ** -0.5)],
           pko.linear, F.linear, (0, 1),
           flops=(lambda s: 2 * s[0] * s[1] ** 2, lambda s: 4 * s[0] * s[1] ** 2)),
    ]


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _fwd_bwd(op, fn, inputs, grads=None):
    """(the forward as a closure, forward+backward as a closure): the backward takes the
    gradients of `grads` (indices of inputs; default op.grads) under fixed random output
    gradients."""
    grads = op.grads if grads is None else grads
    leaves = [x.detach().requires_grad_(i in grads) for i, x in enumerate(inputs)]
    wanted = [x for i, x in enumerate(leaves) if i in grads]
    dys = [_rand(*o.shape, dtype=o.dtype) for o in _tuple(fn(*leaves))]
    return (lambda: fn(*inputs),
            lambda: torch.autograd.grad(_tuple(fn(*leaves)), wanted, dys))


# ---- steps ------------------------------------------------------------------------------------

def _left() -> float:
    return BUDGET_S - (time.time() - _state["t0"])


def step_copy(rows, details):
    from pykittens.bench import gpu
    bw, parts = gpu.copy_ceiling()
    _state["copy"] = bw
    rows.append(["copy", "device copy (read+write)", f"{bw / 1e12:.2f} TB/s", "", "", "ceiling"])
    details.append({"step": "copy", "bytes_per_s": bw, **parts})


def _rel(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check(op, fn, inputs):
    """Worst relative error of fn's outputs and gradients against op.torch in float32."""
    ref_in = [x.detach().float().requires_grad_(i in op.grads) for i, x in enumerate(inputs)]
    got_in = [x.detach().requires_grad_(i in op.grads) for i, x in enumerate(inputs)]
    ref, got = _tuple(op.torch(*ref_in)), _tuple(fn(*got_in))
    dys = [torch.randn_like(r) for r in ref]
    gref = torch.autograd.grad(ref, [ref_in[i] for i in op.grads], dys)
    ggot = torch.autograd.grad(got, [got_in[i] for i in op.grads], [d.to(g.dtype) for d, g
                                                                    in zip(dys, got)])
    return max(_rel(g, r) for g, r in zip(got + ggot, ref + gref))


def _contenders(op):
    out = {"pykittens": op.pykittens, "torch": op.torch}
    if op.quack is not None:
        out["quack"] = op.quack
    return out


def step_ops(rows, details):
    from pykittens.bench.ops import _time
    copy = _state["copy"]
    for shape in SHAPES:
        for op in _ops():
            if _left() < 0:
                rows.append([op.name, "x".join(map(str, shape)), "skipped: time budget"])
                continue
            inputs = op.make(shape)
            reps = 5 if op.flops else 20
            for name, fn in _contenders(op).items():
                r = {"op": op.name, "shape": shape, "contender": name}
                try:
                    t0 = time.time()
                    r["rel_err"] = _check(op, fn, inputs)
                    r["check_s"] = time.time() - t0     # pykittens: first calls (trace, build)
                    fwd, both = _fwd_bwd(op, fn, inputs)
                    (r["fwd_s"], r["timing"]), (r["fwd_bwd_s"], _) = _time(fwd, reps), \
                        _time(both, reps)
                    r["bwd_s"] = max(r["fwd_bwd_s"] - r["fwd_s"], 1e-9)
                    for mode, i in (("fwd", 0), ("bwd", 1)):
                        s = r[f"{mode}_s"]
                        if op.flops:
                            r[f"{mode}_tflops"] = op.flops[i](shape) / s / 1e12
                        else:
                            r[f"{mode}_bytes_per_s"] = op.moved[i](shape) / s
                            if copy:
                                r[f"{mode}_of_copy"] = r[f"{mode}_bytes_per_s"] / copy
                except Exception as e:  # noqa: BLE001 - one failure must not hide the rest
                    r["error"] = f"{type(e).__name__}: {e}"[:300]
                _state["results"].append(r)
                details.append({"step": "ops", **r})
            del inputs
            torch.cuda.empty_cache()
    rows.extend(_summary_rows(_state["results"]))


# ops under schedules other than their launch rules', as settings of modules
# ("rows.STAGED_STAGES": pykittens.kernels.rows.STAGED_STAGES, ...), patched for the call:
# forward row ops at the shapes of VARIANTS, rope at every shape, the norms' backward
# passes (timed as forward+backward less forward) under other choices of the staged walk,
# and linear's backward; each also "launched as usual" (runtime.cuda.EARLY_LAUNCH off)
USUAL = "launched as usual"
USUAL_LAUNCH = {USUAL: {"cuda.EARLY_LAUNCH": False}}
VARIANTS = {shape: USUAL_LAUNCH for shape in SHAPES}
VARIANT_OPS = ("layer_norm", "rms_norm", "add_rms_norm", "softmax")
ROPE_VARIANTS = {"token groups first": {"rope.HEADS_FIRST": 0}, **USUAL_LAUNCH}
BWD_VARIANTS = {**USUAL_LAUNCH, "3 stages": {"rows.STAGED_STAGES": 3},
                "2 stages alone on an SM": {"rows.STAGED_STAGES_ALONE": 2},
                **{f"{c} columns a wave, {w} warps an SM": {
                    "rows.STAGED_SHARES": {s: ((c, w),) for s in (0, 1, 2)}}
                   for c, w in ((512, 16), (1024, 12), (1024, 16))},
                "as many workgroups as the SMs hold": {"rows.STAGED_FULL_STEPS": False},
                "full steps only as many as the SMs' workgroups take": {
                    "rows.STAGED_EXTRA_STEPS": 0},
                "partial sums written back (no discard)": {"rows.DISCARD_PARTS": False},
                "column sums in the walk's kernel": {"rows.FUSED_SUMS": True}}
BWD_VARIANT_OPS = ("layer_norm", "rms_norm", "add_rms_norm")
# backward passes asked for the inputs' gradients alone: no per-column sums, no column_sum
# (what the weight's and bias's gradients cost on top)
INPUT_GRADS = {"layer_norm": (0,), "rms_norm": (0,), "add_rms_norm": (0, 1)}
INPUT_GRADS_ONLY = "input gradients only"


def _variant_calls():
    """(shape, variant, op, mode, closures) of step "variants": closures that pick their
    schedule when called (replay off: every call takes the launch rule): the forward's
    (mode "fwd"), or the forward's and forward+backward's (mode "bwd")."""
    import importlib
    from pykittens.ops import replay
    mods = {n: importlib.import_module(f"pykittens.kernels.{n}") for n in ("rows", "rope")}
    mods["cuda"] = importlib.import_module("pykittens.runtime.cuda")
    only = [v for v in os.environ.get("OPS_VARIANTS", "").split("|") if v]
    ops = {op.name: op for op in _ops()}

    def under(settings, fn, inputs):
        patches = []
        for name, v in settings.items():
            mod, attr = name.split(".")
            patches.append((mods[mod], attr, v))

        def call():
            saved = [(m, a, getattr(m, a)) for m, a, _ in patches]
            enabled, replay.ENABLED = replay.ENABLED, False
            try:
                for m, a, v in patches:
                    setattr(m, a, v)
                return fn(*inputs)
            finally:
                replay.ENABLED = enabled
                for m, a, v in saved:
                    setattr(m, a, v)
        return call

    cases = [(shape, name, variants, "fwd") for shape, variants in VARIANTS.items()
             for name in VARIANT_OPS]
    cases += [(shape, "rope", ROPE_VARIANTS, "fwd") for shape in SHAPES]
    cases += [(shape, name, BWD_VARIANTS, "bwd") for shape in SHAPES
              for name in BWD_VARIANT_OPS]
    cases += [(shape, "linear", USUAL_LAUNCH, "bwd") for shape in SHAPES]
    for shape, name, variants, mode in cases:
        op = ops[name]
        inputs = op.make(shape)
        if mode == "bwd" and name in INPUT_GRADS:
            variants = {**variants, INPUT_GRADS_ONLY: {},
                        f"{INPUT_GRADS_ONLY}, {USUAL}": USUAL_LAUNCH[USUAL]}
        for variant, setting in {"launch rule": {}, **variants}.items():
            if only and variant != "launch rule" and variant not in only:
                continue
            if mode == "fwd":
                yield shape, variant, op, mode, [under(setting, op.pykittens, inputs)]
                continue
            grads = INPUT_GRADS[name] if variant.startswith(INPUT_GRADS_ONLY) else op.grads
            fwd, both = _fwd_bwd(op, op.pykittens, inputs, grads)
            yield shape, variant, op, mode, [under(setting, fwd, ()),
                                             under(setting, both, ())]


def step_variants(rows, details):
    """The ops under each variant (_variant_calls), three interleaved rounds of CUDA-graph
    timings (medians; a backward: forward+backward less forward in each round), as
    fractions of the device copy."""
    from pykittens.bench.gpu import graph_time
    if _state["copy"] is None:
        step_copy(rows, details)
    calls = list(_variant_calls())
    times = {i: [] for i in range(len(calls))}
    graphs = {i: [] for i in range(len(calls))}       # each graph's time (fwd; fwd+bwd)
    for _ in range(3):
        for i, (shape, variant, op, mode, fns) in enumerate(calls):
            t = [graph_time(fn, 20) for fn in fns]
            graphs[i].append(t)
            times[i].append(t[0] if mode == "fwd" else t[1] - t[0])
    for i, (shape, variant, op, mode, fns) in enumerate(calls):
        t = sorted(times[i])[1]
        if op.flops:                                   # linear: TFLOP/s
            rate = op.flops[mode == "bwd"](shape) / t / 1e12
            value, text = {"tflops": rate}, f"{rate:.0f} TFLOP/s"
        else:
            frac = op.moved[mode == "bwd"](shape) / t / _state["copy"]
            value, text = {"of_copy": frac}, f"{100 * frac:.1f}% of copy"
        details.append({"step": "variants", "op": op.name, "mode": mode, "shape": shape,
                        "variant": variant, "s": times[i], "graphs_s": graphs[i], **value})
        rows.append(["variants", f"{op.name} {mode}", "x".join(map(str, shape)), variant,
                     text])


def _cell(by, op, shape, mode):
    """'pk/torch[/quack]' as % of copy (row ops) or TFLOP/s (linear)."""
    vals = []
    for name in ("pykittens", "torch", "quack"):
        r = by.get((op, shape, name))
        if r is None:
            continue
        if "error" in r:
            vals.append("err")
        elif f"{mode}_tflops" in r:
            vals.append(f"{r[f'{mode}_tflops']:.0f}")
        elif f"{mode}_of_copy" in r:
            vals.append(f"{100 * r[f'{mode}_of_copy']:.0f}")
        else:
            vals.append(f"{r[f'{mode}_bytes_per_s'] / 1e9:.0f}GB/s")
    return "/".join(vals)


def _summary_rows(results):
    by = {(r["op"], tuple(r["shape"]), r["contender"]): r for r in results}
    names = list(dict.fromkeys(r["op"] for r in results))
    out = [["op", "mode"] + [f"{m}x{n}" for m, n in SHAPES] + ["pk err"]]
    for op in names:
        for mode in ("fwd", "bwd"):
            errs = [by[(op, s, "pykittens")].get("rel_err", math.inf) for s in SHAPES
                    if (op, s, "pykittens") in by]
            worst = max(errs) if errs else math.inf
            bad = any("error" in by[(op, s, "pykittens")] for s in SHAPES
                      if (op, s, "pykittens") in by) or not worst <= TOL
            unit = "TFLOP/s" if op == "linear" else "% of copy"
            out.append([op, f"{mode} {unit}"] + [_cell(by, op, s, mode) for s in SHAPES] +
                       [f"{worst:.1e}" + (" FAIL" if bad else "")])
    out.append(["", "(cells: pykittens/torch[/quack])"])
    return out


def _host_us(fn, calls=HOST_CALLS, rounds=HOST_ROUNDS) -> float:
    """Host microseconds per call: calls issued back to back, the GPU work (tiny inputs)
    never the bottleneck; the median over `rounds` rounds of `calls` calls."""
    return per_call_us(fn, calls, rounds, sync=torch.cuda.synchronize)


def _warm_gpu(seconds: float = 1.0) -> None:
    """Matrix products for `seconds`: the GPU's clocks up before host times are taken (an
    idle GPU runs the first calls' tiny kernels slowly enough to pace their launches)."""
    a = torch.randn(4096, 4096, device=DEVICE, dtype=DT)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def _host_inputs():
    return {"layer_norm": (8, 1024), "rms_norm": (8, 1024), "add_rms_norm": (8, 1024),
            "softmax": (8, 1024), "rope": (8, 1024), "linear": (8, 1024)}


def _raw_launch_call():
    """The library rmsnorm kernel launched directly (pk.launch) on tiny tensors."""
    from pykittens.kernels import KERNELS, stats_launch
    x = _rand(8, 1024)
    args = (x, _rand(1024), torch.empty_like(x), torch.empty(8, device=x.device), EPS)
    grid, consts = stats_launch({"x": x}, "sm_90a")
    return KERNELS["rmsnorm"].kernel, args, grid, consts


def step_host(rows, details):
    import pykittens as pk
    from pykittens.runtime import launch as launch_mod
    shapes = _host_inputs()
    _warm_gpu()
    for op in _ops():
        _host_row(rows, details, op.name, shapes[op.name], op.pykittens, op.torch,
                  op.make(shapes[op.name]))
    q, k, v = (_rand(1, 128, 8, HEAD_DIM) for _ in range(3))      # a decode-sized call

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                              is_causal=True).transpose(1, 2)
    _host_row(rows, details, "attention", tuple(q.shape),
              lambda q, k, v: pko.attention(q, k, v, causal=True), sdpa, (q, k, v))
    _replay_pieces(rows, details)
    kernel, args, grid, consts = _raw_launch_call()
    us = {}
    for fast in (True, False):
        launch_mod.FAST_PATH = fast
        try:
            us[fast] = _host_us(lambda: pk.launch(kernel, *args, grid=grid, **consts))
        finally:
            launch_mod.FAST_PATH = True
    details.append({"step": "host", "op": "pk.launch rmsnorm", "fast_us": us[True],
                    "checked_us": us[False]})
    rows.append(["host", "pk.launch rmsnorm", f"fast path {us[True]:.1f} us",
                 f"checked {us[False]:.1f} us", f"{us[False] / us[True]:.1f}x less host time"])


def step_host_profile(rows, details):
    """Where a replayed call's host time goes, op by op: its time with Python's garbage
    collector on and off, and the functions that take it (cProfile over HOST_CALLS calls,
    the top ones by own time in the details)."""
    import cProfile
    import gc
    import pstats
    shapes = _host_inputs()
    _warm_gpu()
    ops = [(op.name, op.pykittens, op.make(shapes[op.name])) for op in _ops()]
    ops.append(ops[1])                         # rms_norm again, last: does its place matter?
    for name, fn, inputs in ops:
        us = {"gc on": _host_us(lambda: fn(*inputs))}
        gc.disable()
        try:
            us["gc off"] = _host_us(lambda: fn(*inputs))
        finally:
            gc.enable()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(HOST_CALLS):
            fn(*inputs)
        prof.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(prof)
        top = sorted(((v[2] / HOST_CALLS * 1e6, v[1] // HOST_CALLS, f"{k[0].split('/')[-1]}:"
                       f"{k[1]}({k[2]})") for k, v in st.stats.items()), reverse=True)[:12]
        details.append({"step": "host_profile", "op": name, "us": us,
                        "top_own_us_per_call": [list(t) for t in top]})
        rows.append(["host profile", name, f"gc on {us['gc on']:.1f} us, off "
                     f"{us['gc off']:.1f} us",
                     ", ".join(f"{t[2]} {t[0]:.1f}" for t in top[:3]), ""])


def _host_row(rows, details, name, shape, pykittens, peer, inputs):
    """Host time per cached call of one op: replayed, on the full path, and torch's; and
    whether the replayed result equals the full path's."""
    from pykittens.ops import replay
    us = {who: _host_us(lambda fn=fn: fn(*inputs)) for who, fn in
          (("pykittens", pykittens), ("torch", peer))}
    replayed = _tuple(pykittens(*inputs))
    replay.ENABLED = False                 # the op's whole path on every call
    try:
        us["pykittens, no replay"] = _host_us(lambda: pykittens(*inputs))
        same = all(torch.equal(a, b) for a, b in zip(replayed, _tuple(pykittens(*inputs))))
    finally:
        replay.ENABLED = True
    details.append({"step": "host", "op": name, "shape": shape, "us_per_call": us,
                    "replay_matches_full_path": same})
    rows.append(["host", name, f"pykittens {us['pykittens']:.1f} us",
                 f"torch {us['torch']:.1f} us",
                 f"per cached forward call ({us['pykittens, no replay']:.1f} us "
                 "without replay)" + ("" if same else ": replay differs FAIL")])


def _replay_pieces(rows, details):
    """Where a replayed rms_norm call's host time goes: its signature, one output
    allocation, one launch of its plan, against the whole call."""
    from pykittens.ops import replay
    from pykittens.runtime import cuda
    x, w = _rand(8, 1024), _rand(1024)
    args = (x, (1024,), w, EPS)
    for _ in range(3):                              # seen, recorded, replayed
        pko.rms_norm(*args)
    entry = pko.rms_norm.replay_calls[replay._signature(args, {})[0]]   # this call's
    assert type(entry) is replay._Replay, entry
    plan, template, addressed = entry.launches[0]
    vals = list(template)
    handle = cuda.stream_handle(None, 0)
    raw, h = cuda._raw_driver(), int(plan.function.handle)
    out = torch.empty_like(x)
    for i, b, nbytes in addressed:                  # rms_norm's arguments: addresses
        vals[i] = [x, w, out][b].data_ptr() + nbytes    # (inputs, then its output)
    us = {"whole": _host_us(lambda: pko.rms_norm(*args)),
          "signature": _host_us(lambda: replay._signature(args, {})),
          "allocation": _host_us(lambda: torch.empty_like(x)),
          "launch": _host_us(lambda: plan.launch(vals, None)),
          "overlap check": _host_us(lambda: replay._overlapping(
              [x.data_ptr(), w.data_ptr()], entry.spans)),
          "stream": _host_us(lambda: cuda.stream_handle(None, 0)),
          "context check": _host_us(lambda: cuda._raw_driver().current()),
          "launcher": _host_us(lambda: plan.launcher(handle)),
          "checked driver launch": _host_us(lambda: plan.function.launch_checked(
              plan.grid, plan.block, plan.buf, plan.shared, handle)),
          "bare cuLaunchKernel": _host_us(lambda: raw.cuLaunchKernel(
              h, *plan.grid, *plan.block, plan.shared, handle, None, plan.buf.extra)),
          "torch.softmax": _host_us(lambda: torch.softmax(x, -1))}
    details.append({"step": "host", "op": "rms_norm replay pieces", "us": us})
    rows.append(["host", "rms_norm replayed, pieces", f"whole {us['whole']:.1f} us",
                 f"signature {us['signature']:.1f} us, an allocation "
                 f"{us['allocation']:.1f} us", f"launch {us['launch']:.1f} us (torch.softmax "
                 f"{us['torch.softmax']:.1f} us on this host)"])
    rows.append(["host", "rms_norm replayed, launch", f"launcher {us['launcher']:.1f} us",
                 f"typed cuLaunchKernel {us['bare cuLaunchKernel']:.1f} us (checked "
                 f"{us['checked driver launch']:.1f} us, context check "
                 f"{us['context check']:.1f} us)", f"stream {us['stream']:.1f} us, overlap "
                 f"check {us['overlap check']:.1f} us"])


BLOCK = (4096, 4096)           # the graph step's activations (heads of HEAD_DIM columns)


def _block_inputs():
    m, n = BLOCK
    cos, sin = _tables(m)
    w = [_rand(m, n), _rand(m, n), _rand(n, scale=0.1, offset=1.0),
         _rand(n, n, scale=n ** -0.5), _rand(n, scale=0.1, offset=1.0), _rand(n, scale=0.1)]
    return [t.requires_grad_() for t in w], cos, sin


def _block(leaves, cos, sin, grads_out):
    """add_rms_norm -> linear -> rope -> layer_norm -> softmax; outputs and every gradient."""
    x, r, wn, wp, wl, bl = leaves
    m, n = x.shape
    h, s = pko.add_rms_norm(x, r, wn, EPS)
    q = pko.rope(pko.linear(h, wp).view(1, m, n // HEAD_DIM, HEAD_DIM), cos, sin).view(m, n)
    p = pko.softmax(pko.layer_norm(q, (n,), wl, bl, EPS))
    return (p, s) + torch.autograd.grad((p, s), leaves, grads_out)


def step_graph(rows, details):
    from pykittens.runtime import cuda
    leaves, cos, sin = _block_inputs()
    gouts = [_rand(*leaves[0].shape), _rand(*leaves[0].shape)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                          # warm up: build, plan, allocate
        for _ in range(3):
            _block(leaves, cos, sin, gouts)
    torch.cuda.current_stream().wait_stream(side)
    # every kernel launch passes through one of these: a plan's launcher (replayed calls,
    # pk.launch's fast path) or the checked launch (a launcher whose launch the driver
    # refused retries there, counted twice: none does here, the context being current)
    launches, real = [], (cuda.Function.launch_checked, cuda.Launcher.__call__)
    cuda.Function.launch_checked = lambda *a, **k: launches.append(1) or real[0](*a, **k)
    cuda.Launcher.__call__ = lambda *a, **k: launches.append(1) or real[1](*a, **k)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = _block(leaves, cos, sin, gouts)
    finally:
        cuda.Function.launch_checked, cuda.Launcher.__call__ = real
    with torch.no_grad():                                   # new inputs, in place
        for t in leaves:
            t.copy_(_rand(*t.shape, scale=0.1 if t.dim() == 1 else 1.0,
                          offset=1.0 if t.dim() == 1 else 0.0))
    g.replay()
    eager = _block(leaves, cos, sin, gouts)
    torch.cuda.synchronize()
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(static, eager))
    rel = max(_rel(a, b) for a, b in zip(static, eager))

    from pykittens.bench.gpu import event_time
    replay, eager_ms = (event_time(fn) * 1e3 for fn in
                        (g.replay, lambda: _block(leaves, cos, sin, gouts)))
    ok = len(launches) > 0 and rel <= 1e-3              # the kernels add in a fixed order
    details.append({"step": "graph", "launches_captured": len(launches), "max_abs_diff": diff,
                    "max_rel_diff": rel, "replay_ms": replay, "eager_ms": eager_ms, "ok": ok})
    rows.append(["graph", "add_rms_norm>linear>rope>layer_norm>softmax fwd+bwd "
                 f"{BLOCK[0]}x{BLOCK[1]}",
                 f"{len(launches)} launches captured",
                 f"replay {replay:.2f} ms, eager {eager_ms:.2f} ms",
                 "replay == eager, bitwise" if diff == 0 else f"vs eager: rel {rel:.1e}",
                 "ok" if ok else "FAIL"])


def step_report(rows, details):
    out = os.environ.get("OUT")
    if not out or not _state["results"]:
        return
    path = os.path.join(out, "ops_bandwidth")
    copy = _state["copy"]
    lines = ["# pykittens.ops on the GPU", "",
             f"Device copy: {copy / 1e12:.2f} TB/s (read + write)." if copy else "", "",
             "| op | shape | contender | fwd ms | fwd | bwd ms | bwd | rel err |",
             "|---|---|---|---|---|---|---|---|"]
    for r in _state["results"]:
        if "error" in r:
            lines.append(f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['contender']} "
                         f"| error: {r['error'][:80]} | | | | |")
            continue
        cells = []
        for mode in ("fwd", "bwd"):
            if f"{mode}_tflops" in r:
                rate = f"{r[f'{mode}_tflops']:.0f} TFLOP/s"
            else:
                rate = f"{r[f'{mode}_bytes_per_s'] / 1e9:.0f} GB/s"
                if f"{mode}_of_copy" in r:
                    rate += f" ({100 * r[f'{mode}_of_copy']:.0f}% of copy)"
            cells += [f"{r[f'{mode}_s'] * 1e3:.3f}", rate]
        lines.append(f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['contender']} | "
                     + " | ".join(cells) + f" | {r['rel_err']:.1e} |")
    lines += ["", "Forward and forward+backward are each the median of CUDA graph replays "
              "(host launch gaps left out); backward is their difference. Bytes: the M x N "
              "tensors each pass reads and writes (weights left out). Errors: the worst over "
              "the outputs and gradients against torch in float32 on the same inputs."]
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    _chart(path + ".png")
    rows.append(["report", path + ".md", path + ".png"])


def _chart(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = [r for r in _state["results"] if "error" not in r and "fwd_of_copy" in r]
    names = list(dict.fromkeys(r["contender"] for r in res))
    keys = list(dict.fromkeys((r["op"], tuple(r["shape"])) for r in res))
    by = {(r["op"], tuple(r["shape"]), r["contender"]): r for r in res}
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.7 * len(keys) * len(names)), 7))
    w = 0.8 / max(1, len(names))
    for ax, mode in zip(axes, ("fwd", "bwd")):
        for i, n in enumerate(names):
            vals = [100 * by[k + (n,)][f"{mode}_of_copy"] if k + (n,) in by else 0 for k in keys]
            ax.bar([j + i * w - 0.4 + w / 2 for j in range(len(keys))], vals, w, label=n)
        ax.set_xticks(range(len(keys)), [f"{o}\n{m}x{c}" for o, (m, c) in keys], fontsize=7)
        ax.set_ylabel(f"{mode}: % of device copy")
        ax.axhline(100, color="gray", lw=0.5)
        ax.legend(fontsize=8)
    axes[0].set_title("pykittens.ops, bfloat16: bandwidth as a fraction of the device's copy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- prebuild ---------------------------------------------------------------------------------

def launch_key(kernel, args: dict, consts: dict):
    """(kernel name, constants as pk.launch keys them, aligned build) of a library launch of
    pykittens.ops (ops.run.run's arguments), and the constants in full (the element types
    bound from the tensors)."""
    from pykittens.lang.kernel import const_key
    from pykittens.runtime.args import bind_args
    from pykittens.runtime.launch import _aligned
    _, full = bind_args(kernel, (), {**args, **consts}, device="cpu", what="prebuild")
    tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    return (kernel.name, const_key(full), _aligned(tensors)), full


@contextlib.contextmanager
def builds_not_launches(verbose=True):
    """Within: the ops' library launches on CPU tensors build the kernel for sm_90a (same
    constants and alignment as the GPU run's launch) instead of emulating it, and the
    attention op's launch nothing (its outputs keep what they were allocated with; its
    builds: bench/prebuild.py attention_bwd). Yields ({launch_key: seconds} of the builds
    made, the build function)."""
    import importlib
    from pykittens import compiler
    from pykittens.lower import lower
    from pykittens.ops import run as ops_run
    attn = importlib.import_module("pykittens.ops.attention")     # the module, not the op
    _state["prebuild"] = True
    target, ops_run.EMULATE_TARGET = ops_run.EMULATE_TARGET, "sm_90a"  # the GPU run's plans
    built = {}

    def build(kernel, args, grid, consts, outputs=()):
        key, full = launch_key(kernel, args, consts)
        if key not in built:
            t = time.time()
            compiler.compile_lane(lower(kernel.specialize(**full), "sm_90a"), aligned=key[2])
            built[key] = time.time() - t
            if verbose:
                print(f"  {kernel.name} {len(built)}: {built[key]:.1f} s", flush=True)

    def skip(*args, **kwargs):          # attention: its outputs stay as allocated
        return None

    mods = [importlib.import_module(f"pykittens.ops.{n}")    # the modules, not the ops
            for n in ("matmul", "norms", "rope", "softmax", "attention")]
    saved = [m.run for m in mods]
    try:
        for m in mods:
            m.run = skip if m is attn else build
        yield built, build
    finally:
        for m, r in zip(mods, saved):
            m.run = r
        ops_run.EMULATE_TARGET = target
        _state["prebuild"] = False


def prebuild_all(verbose=True) -> dict:
    """Every op call of the GPU run on CPU tensors (empty: values do not matter), with the
    library launches replaced by builds (builds_not_launches): {launch_key: seconds}."""
    with builds_not_launches(verbose) as (built, build):
        host = _host_inputs()
        for op in _ops():
            for shape in SHAPES + (host[op.name],):
                _fwd_bwd(op, op.pykittens, op.make(shape))[1]()
        leaves, cos, sin = _block_inputs()
        _block(leaves, cos, sin, [torch.empty(leaves[0].shape, dtype=DT)] * 2)
        for *_, calls in _variant_calls():
            for call in calls:
                call()
        kernel, args, grid, consts = _raw_launch_call()
        build(kernel, dict(zip(kernel.param_names, args)), grid, consts)
    return built


def prebuild() -> int:
    t0 = time.time()
    built = prebuild_all()
    print(f"{len(built)} builds in {time.time() - t0:.0f} s into the cache at "
          f"{os.environ.get('PYKITTENS_CACHE') or '(the default cache)'}")
    return 0


# ---- main -------------------------------------------------------------------------------------

def main() -> int:
    if "--prebuild" in sys.argv:
        return prebuild()
    if not torch.cuda.is_available():
        print("bench/ops_bandwidth.py needs a CUDA GPU (an H100/H200); run it with "
              "--prebuild here to fill the code-object cache", file=sys.stderr)
        return 1
    from pykittens.bench import run_steps
    from pykittens.toolchain import cache
    misses, lookup = [], cache.lookup

    def counting(kind, key):                       # PTX builds the run had to make
        hit = lookup(kind, key)
        if hit is None and kind == "ptx":
            misses.append(key)
        return hit
    cache.lookup = counting
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "quack": "yes" if _quack("rmsnorm") else "not importable",
           "cache": os.environ.get("PYKITTENS_CACHE", "(default)")}
    steps = {"copy": step_copy, "ops": step_ops, "host": step_host,
             "host_profile": step_host_profile, "graph": step_graph,
             "variants": step_variants, "report": step_report}

    def builds(rows, details):
        details.append({"step": "builds", "ptx_built_at_run_time": len(misses)})
        rows.insert(0, ["builds", f"{len(misses)} PTX builds at run time",
                        "" if not misses else "(prebuild with --prebuild and carry the cache)"])
    steps["builds"] = builds
    return run_steps("ops_bandwidth", steps, env)


if __name__ == "__main__":
    sys.exit(main())
