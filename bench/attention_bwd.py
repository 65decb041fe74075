"""Attention backward on a CUDA GPU (H200): gradients of pykittens.ops.attention against float64
torch autograd at ragged shapes, the deterministic mode's repeatability, then forward+backward
TFLOP/s against torch SDPA (cuDNN) and FlashAttention-4's CuTe-DSL kernels when importable,
all in one run. TFLOP/s of forward+backward = 3.5 x the forward's 4 B Hq Nq Nk D / time
(halved for causal); the backward alone = 2.5 x.

    PYTHONPATH=. python3 bench/attention_bwd.py                 # everything
    PYTHONPATH=. python3 bench/attention_bwd.py correctness     # only the named steps
    PYTHONPATH=. python3 bench/attention_bwd.py passes          # each pass alone, variants
    PYTHONPATH=. python3 bench/attention_bwd.py varlen          # packed batches
    ATTN_BWD_SHAPES="4,16,16,8192,128,0;..." ATTN_BWD_PASS_SHAPES="..." ...  # other shapes
Shapes are "B,Hq,Hkv,N,D,causal", separated by ";" (for `performance` / `passes`; by default
SHAPES and PASS_SHAPES below). Details go to $OUT/attention_bwd.json when OUT is set; a table
is printed last.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys

import torch

from pykittens.bench import run_steps
from pykittens.bench.gpu import attention_peers, graph_time

DEV = "cuda"
# (B, Hq, Hkv, N, D, causal): the shapes the backward is judged on
SHAPES = [(16, 16, 16, 4096, 128, 0), (16, 16, 16, 4096, 128, 1), (16, 32, 8, 4096, 128, 0),
          (16, 32, 8, 4096, 128, 1), (16, 32, 32, 4096, 64, 0)]


def reference(q, k, v, causal):
    """float64 attention on (B, N, H, D) tensors by plain torch ops (GQA by repeating K/V)."""
    qd, kd, vd = (x.transpose(1, 2) for x in (q, k, v))
    g = qd.shape[1] // kd.shape[1]
    kd, vd = kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1)
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    nq, nk = s.shape[-2:]
    if causal:
        keep = torch.arange(nk, device=q.device)[None, :] <= \
            torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ vd).transpose(1, 2)


def _leaves(b, nq, nk, hq, hkv, d, dtype=torch.bfloat16):
    mk = lambda n, h: torch.randn(b, n, h, d, device=DEV, dtype=dtype,  # noqa: E731
                                  requires_grad=True)
    return mk(nq, hq), mk(nk, hkv), mk(nk, hkv)


def correctness(rows, details):
    """dQ, dK, dV of the op against float64 autograd: ragged shapes, causal or not, MHA and
    GQA, both head dims, bf16 and f16, atomics and the deterministic dQ pass."""
    import pykittens.ops as pko
    cases = [(2, 1000, 1000, 4, 4, 128, 0), (2, 1000, 1000, 4, 4, 128, 1),
             (1, 777, 1300, 8, 2, 64, 1), (1, 1300, 777, 8, 2, 64, 1),
             (2, 512, 512, 6, 3, 64, 0), (1, 129, 4000, 2, 1, 128, 0)]
    for dt in (torch.bfloat16, torch.float16):
        for b, nq, nk, hq, hkv, d, causal in cases:
            q, k, v = _leaves(b, nq, nk, hq, hkv, d, dt)
            do = torch.randn(b, nq, hq, d, device=DEV, dtype=dt)
            leaves64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
            want = torch.autograd.grad(reference(*leaves64, causal), leaves64, do.double())
            for det in (False, True):
                got = torch.autograd.grad(pko.attention(q, k, v, causal=bool(causal),
                                                        deterministic=det), (q, k, v), do)
                errs = [float((g.double() - w).norm() / w.norm()) for g, w in zip(got, want)]
                ok = max(errs) < 2e-2
                shape = f"({b},{hq},{hkv},{nq},{nk},{d}){' causal' if causal else ''}"
                _row(rows, "grad", "deterministic" if det else "atomic dQ",
                     str(dt).split(".")[1], shape, " ".join(f"{e:.1e}" for e in errs),
                     "ok" if ok else "FAIL")
                details.append({"check": "gradients", "shape": shape, "dtype": str(dt),
                                "deterministic": det, "rel_err_dq_dk_dv": errs, "ok": ok})
    q, k, v = _leaves(2, 1000, 1000, 8, 2, 128)
    do = torch.randn_like(q)
    runs = [torch.autograd.grad(pko.attention(q, k, v, causal=True, deterministic=True),
                                (q, k, v), do) for _ in range(3)]
    same = all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r))
    rows.append(["grad", "deterministic: 3 runs bitwise equal", "bf16", "(2,8,2,1000,128)",
                 "", "ok" if same else "FAIL"])
    details.append({"check": "deterministic_repeatable", "ok": same})


def _peers():
    """name -> fn(q, k, v, causal) -> O on (B, N, H, D) leaves, for the peers importable."""
    import pykittens.ops as pko
    return {"pykittens": lambda q, k, v, c: pko.attention(q, k, v, causal=bool(c)),
            "pykittens deterministic": lambda q, k, v, c: pko.attention(
                q, k, v, causal=bool(c), deterministic=True),
            **attention_peers()}


def _row(rows, *cells):
    """A table row, also printed at once (a long run shows its progress)."""
    rows.append(list(cells))
    print("  ".join(map(str, cells)), flush=True)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def performance(rows, details):
    peers = _peers()
    for b, hq, hkv, n, d, causal in SHAPES:
        q, k, v = _leaves(b, n, n, hq, hkv, d)
        do = torch.randn(b, n, hq, d, device=DEV, dtype=torch.bfloat16)
        fwd_flops = 4 * b * hq * n * n * d / (2 if causal else 1)
        shape = f"({b},{hq},{hkv},{n},{d}){' causal' if causal else ''}"
        res = {}
        for name, fn in peers.items():
            if isinstance(fn, str):
                _row(rows, "perf", name, "bf16", shape, "-", fn)
                continue

            def fwd(f=fn):
                with torch.no_grad():
                    f(q, k, v, causal)

            def fwd_bwd(f=fn):
                o = _first(f(q, k, v, causal))
                torch.autograd.grad(o, (q, k, v), do)
            try:
                t_fwd, t_all = graph_time(fwd, reps=5), graph_time(fwd_bwd, reps=5)
            except Exception as e:  # noqa: BLE001 - one failing must not hide the rest
                _row(rows, "perf", name, "bf16", shape, "ERROR", str(e)[:60])
                continue
            res[name] = {"fwd_s": t_fwd, "fwd_bwd_s": t_all,
                         "fwd_bwd_tflops": 3.5 * fwd_flops / t_all / 1e12,
                         "bwd_tflops": 2.5 * fwd_flops / max(t_all - t_fwd, 1e-9) / 1e12}
        base = res.get("torch SDPA (cuDNN)", {}).get("fwd_bwd_tflops")
        for name, r in res.items():
            rel = f"{r['fwd_bwd_tflops'] / base:.2f}x cuDNN" if base else ""
            _row(rows, "perf", name, "bf16", shape,
                 f"{r['fwd_bwd_tflops']:.0f} fwd+bwd, {r['bwd_tflops']:.0f} bwd", rel)
        details.append({"check": "attention_fwd_bwd_throughput", "shape": (b, hq, hkv, n, d),
                        "causal": causal, **res})


# packed batches (step "varlen"): 16 sequences of 512 to 4096 tokens (38656 in all), and the
# heads, head dim and causality of each run
VARLEN_LENGTHS = [4096, 1024, 2560, 512, 3584, 2048, 1536, 3072, 4096, 768, 2816, 1280, 3840,
                  2304, 1792, 3328]
VARLEN_HEADS = [(16, 16, 128, 0), (16, 16, 128, 1), (32, 8, 128, 1)]


def _packed(lengths, hq, hkv, d, dtype=torch.bfloat16):
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                      device=DEV)
    n = int(cu[-1])
    q, k, v = (torch.randn(n, h, d, device=DEV, dtype=dtype, requires_grad=True)
               for h in (hq, hkv, hkv))
    return q, k, v, cu


EARLIER = "pykittens, earlier walk"    # without DV_LATE and SPLIT_MASKED (LATE_WALK off)


@contextlib.contextmanager
def late_walk(on: bool):
    """Launches of the block take attention_bwd.LATE_WALK = on (bench/prebuild.py too)."""
    from pykittens.kernels import attention_bwd as ab
    ab.LATE_WALK = on
    try:
        yield
    finally:
        ab.LATE_WALK = True


def varlen(rows, details):
    """Packed batches through pykittens.ops.attention_varlen: gradients per sequence against
    float64 (small batches, dQ both ways), then forward+backward TFLOP/s with dQ added into
    the f32 sum (the default) and by its own pass (deterministic), and FA4's varlen function
    where importable. Timed by CUDA events (the op reads the offsets on the host)."""
    import pykittens.ops as pko
    from pykittens.bench.gpu import event_time
    for hq, hkv, d, causal in ((4, 2, 64, 1), (4, 4, 128, 0)):
        lengths = [100, 0, 300, 257]
        q, k, v, cu = _packed(lengths, hq, hkv, d)
        do = torch.randn_like(q)
        for det in (False, True):
            got = torch.autograd.grad(pko.attention_varlen(
                q, k, v, cu, cu, max(lengths), max(lengths), causal=bool(causal),
                deterministic=det), (q, k, v), do)
            errs = []
            for a, b in itertools.pairwise(cu.tolist()):
                if a == b:
                    continue
                seq = [x.detach()[a:b][None].double().requires_grad_() for x in (q, k, v)]
                want = torch.autograd.grad(reference(*seq, causal), seq,
                                           do[a:b][None].double())
                errs.append(max(float((g[a:b].double() - w[0]).norm() / w[0].norm())
                                for g, w in zip(got, want)))
            ok = max(errs) < 2e-2
            shape = f"{lengths} ({hq},{hkv},{d}){' causal' if causal else ''}"
            _row(rows, "varlen grad", "deterministic" if det else "atomic dQ", "bf16", shape,
                 f"{max(errs):.1e}", "ok" if ok else "FAIL")
            details.append({"check": "varlen_gradients", "shape": shape, "deterministic": det,
                            "rel_err": errs, "ok": ok})
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4
    except Exception as e:  # noqa: BLE001 - the peer is optional
        fa4 = f"not importable: {type(e).__name__}: {e}"[:80]
    lengths, m = VARLEN_LENGTHS, max(VARLEN_LENGTHS)
    for hq, hkv, d, causal in VARLEN_HEADS:
        q, k, v, cu = _packed(lengths, hq, hkv, d)
        do = torch.randn_like(q)
        flops = sum(4 * hq * n * n * d / (2 if causal else 1) for n in lengths)
        shape = f"16 seqs, {sum(lengths)} tokens ({hq},{hkv},{d}){' causal' if causal else ''}"
        op = lambda: pko.attention_varlen(q, k, v, cu, cu, m, m,  # noqa: E731
                                          causal=bool(causal))
        runs = {"pykittens": op, EARLIER: op,           # the same call, timed with either walk
                "pykittens deterministic": lambda: pko.attention_varlen(
                    q, k, v, cu, cu, m, m, causal=bool(causal), deterministic=True)}
        if isinstance(fa4, str):
            _row(rows, "varlen perf", "FA4 (flash_attn.cute)", "bf16", shape, "-", fa4)
        else:
            runs["FA4 (flash_attn.cute)"] = lambda: fa4(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m,
                causal=bool(causal))
        res = {}
        for name, fn in runs.items():
            def fwd(f=fn):
                with torch.no_grad():
                    f()

            def fwd_bwd(f=fn):
                torch.autograd.grad(_first(f()), (q, k, v), do)
            try:
                with late_walk(name != EARLIER):
                    t_fwd = event_time(fwd, reps=3, rounds=5)
                    t = event_time(fwd_bwd, reps=3, rounds=5)
            except Exception as e:  # noqa: BLE001 - one failing must not hide the rest
                _row(rows, "varlen perf", name, "bf16", shape, "ERROR", str(e)[:60])
                continue
            res[name] = {"fwd_s": t_fwd, "fwd_bwd_s": t,
                         "fwd_tflops": flops / t_fwd / 1e12,
                         "fwd_bwd_tflops": 3.5 * flops / t / 1e12,
                         "bwd_tflops": 2.5 * flops / max(t - t_fwd, 1e-9) / 1e12}
        base = res.get("pykittens deterministic", {}).get("fwd_bwd_tflops")
        for name, r in res.items():
            _row(rows, "varlen perf", name, "bf16", shape,
                 f"{r['fwd_bwd_tflops']:.0f} fwd+bwd, {r['fwd_tflops']:.0f} fwd, "
                 f"{r['bwd_tflops']:.0f} bwd",
                 f"{r['fwd_bwd_tflops'] / base:.2f}x deterministic" if base else "")
        details.append({"check": "varlen_fwd_bwd_throughput", "shape": shape, **res})


# schedule variants of the two big passes, timed alone (bench step "passes"), over dq="pass"'s
# launch constants: the main pass without dQ and with it (DQ_ATOMIC, the library's default
# on Hopper), each also with the walk the library used before DV_LATE and SPLIT_MASKED.
# DQ_DIAG builds (timing only, their dQ is wrong or absent; add them here to use them)
# place the time of dQ: 1 leaves out the TMA reductions, 2 the groups' wait for each
# other's dS, 3 both (docs/PERF.md)
EARLIER_WALK = {"DV_LATE": 0, "SPLIT_MASKED": 0}
MAIN_VARIANTS = ({}, EARLIER_WALK, {"DQ_ATOMIC": 1}, {"DQ_ATOMIC": 1, **EARLIER_WALK})
DQ_VARIANTS = ({},)
PASS_SHAPES = [(16, 16, 16, 4096, 128, 0), (16, 16, 16, 4096, 128, 1)]


def _env_shapes(name, default):
    """Shapes from $name ("B,Hq,Hkv,N,D,causal;..."), else `default`: other shapes in one
    run without editing the script (e.g. the same work at other lengths, to place the
    per-workgroup cost)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part]


SHAPES = _env_shapes("ATTN_BWD_SHAPES", SHAPES)
PASS_SHAPES = _env_shapes("ATTN_BWD_PASS_SHAPES", PASS_SHAPES)


def pass_plans(shape, dt="bf16"):
    """(name, kernel, grid, consts) of every pass variant of one (B, Hq, Hkv, N, D, causal)."""
    import numpy as np
    from pykittens.kernels.attention_bwd import (attention_bwd, attention_bwd_dq,
                                                 attention_bwd_dq_finish, attention_bwd_launch,
                                                 attention_bwd_prep)
    b, hq, hkv, n, d, causal = shape
    shapes = {"q": np.empty((b, hq, n, d), np.float16), "k": np.empty((b, hkv, n, d), np.float16)}
    (pg, pc), _, (qg, qc) = attention_bwd_launch(shapes, "sm_90a", dq="pass", CAUSAL=causal)
    out = [("prep", attention_bwd_prep, pg, {"DT": dt, **pc})]
    for o in MAIN_VARIANTS:                 # through the launch: a variant may change the grid
        _, (mg, mc), _ = attention_bwd_launch(shapes, "sm_90a", dq="pass", CAUSAL=causal, **o)
        out.append(("main " + (str(o) if o else "default"), attention_bwd, mg, {"DT": dt, **mc}))
    out += [("dq " + (str(o) if o else "default"), attention_bwd_dq, qg, {"DT": dt, **qc, **o})
            for o in DQ_VARIANTS]
    fg, fc = attention_bwd_launch(shapes, "sm_90a", dq="atomic", CAUSAL=causal)[2]
    return out + [("finish", attention_bwd_dq_finish, fg, {"DT": dt, **fc})]


def passes(rows, details):
    """Each backward pass alone, the default schedule and its variants: where the time goes."""
    import math as m
    import pykittens as pk
    from pykittens.kernels.attention_bwd import attention_bwd_dq_finish, dq_sum_shape
    for shape in PASS_SHAPES:
        b, hq, hkv, n, d, causal = shape
        q = torch.randn(b, hq, n, d, device=DEV, dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, n, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        do, o = torch.randn_like(q), torch.randn_like(q)
        lse = torch.full((b, hq, n), float(m.log(n)), device=DEV)
        delta = torch.zeros(b, hq, n, device=DEV)
        dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
        dq_sum = torch.zeros(dq_sum_shape(*q.shape), device=DEV)
        dq_f32, dq32 = torch.empty(q.shape, device=DEV), torch.zeros(q.shape, device=DEV)
        args = {"prep": (o, do, delta), "dq": (q, k, v, do, lse, delta, dq, 1 / m.sqrt(d)),
                "main": (q, k, v, do, lse, delta, dq_sum, dk, dv, 1 / m.sqrt(d)),
                "finish": (dq_sum, dq)}

        plans = pass_plans(shape)
        finish_grid = next(grid for name, _, grid, _ in plans if name == "finish")

        def dq_of():                        # the f32 dQ a main pass added, in dQ's rows
            pk.launch(attention_bwd_dq_finish, dq_sum, dq_f32, grid=finish_grid, D=d)
            return dq_f32.clone()
        gemm = 2 * b * hq * n * n * d / (2 if causal else 1)       # one n x n x d product
        label = f"({b},{hq},{hkv},{n},{d}){' causal' if causal else ''}"
        first = {}          # the main pass's outputs by its first variant with(out) dQ
        for name, kernel, grid, consts in plans:
            kind = name.split()[0]
            fn = lambda: pk.launch(kernel, *args[kind], grid=grid, **consts)  # noqa: E731
            t = graph_time(fn, reps=10)
            products = {"prep": 0, "main": 5 if consts.get("DQ_ATOMIC") else 4,
                        "dq": 3, "finish": 0}[kind]
            tf = products * gemm / t / 1e12
            agree = ""
            if name.startswith("main") and not consts.get("DQ_DIAG"):
                # one more launch from a zeroed dQ and poisoned dK, dV: each variant computes
                # what the first of its kind does (up to the order of dQ's additions)
                dq_sum.zero_()
                dk.fill_(float("nan"))
                dv.fill_(float("nan"))
                fn()
                outs = [dk.float(), dv.float()] + ([dq_of()] if consts.get("DQ_ATOMIC")
                                                   else [])
                torch.cuda.synchronize()
                ref = first.setdefault(bool(consts.get("DQ_ATOMIC")), outs)
                err = max(float((a - b).norm() / b.norm()) if torch.isfinite(a).all()
                          else math.inf for a, b in zip(outs, ref))
                agree = f"{'ok' if err < 1e-4 else 'FAIL'} (agrees to {err:.1e})"
            _row(rows, "pass", name, "bf16", label, f"{t * 1e3:.3f} ms",
                 f"{tf:.0f} TFLOP/s" if products else "", agree)
            details.append({"check": "pass_time", "shape": shape, "pass": name, "s": t,
                            "tflops": tf, "agreement": agree})
        # what the op adds around the passes with atomic dQ: the f32 sum zeroed (and, beside
        # the finish pass, torch's cast of an f32 dQ in rows: the same bytes)
        for name, fn in (("op: zero dQ f32", lambda: torch.zeros(dq_sum.shape, device=DEV)),
                         ("torch: f32 -> bf16", lambda: dq32.to(torch.bfloat16))):
            t = graph_time(fn, reps=10)
            _row(rows, "pass", name, "bf16", label, f"{t * 1e3:.3f} ms", "", "")
            details.append({"check": "pass_time", "shape": shape, "pass": name, "s": t})


def main() -> int:
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda}
    return run_steps("attention_bwd", {"correctness": correctness, "performance": performance,
                                       "passes": passes, "varlen": varlen}, env)


if __name__ == "__main__":
    sys.exit(main())
