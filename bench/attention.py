"""Attention forward on a CUDA GPU (H200): correctness of the library kernel against a float64
torch reference (and against the emulator at small shapes), then TFLOP/s against torch SDPA
(cuDNN and flash backends) and FlashAttention-4's CuTe-DSL kernels when importable, all in one
run. TFLOP/s = 4 B Hq Nq Nk D / time, halved for causal.

    PYTHONPATH=. python3 bench/attention.py                 # everything
    PYTHONPATH=. python3 bench/attention.py correctness     # only the named steps
    PYTHONPATH=. python3 bench/attention.py performance --variants   # + kernel variants
Details go to $OUT/attention.json when OUT is set; a table is printed last.
"""
from __future__ import annotations

import math
import sys

import numpy as np
import torch

import pykittens as pk
from pykittens.bench import run_steps
from pykittens.bench.gpu import attention_peers, graph_time
from pykittens.kernels.attention import attention_fwd, attention_fwd_launch, hopper_schedules

DEV = "cuda"
# (B, Hq, Hkv, N, D, causal): the shapes the library is judged on
CHECKED = ("default", "eager rescale", "3 consumers, pingpong", "BN=160")   # checked
SHAPES = [(16, 16, 16, 4096, 128, 0), (16, 16, 16, 4096, 128, 1), (16, 32, 32, 4096, 64, 0),
          (4, 16, 16, 16384, 128, 0), (16, 32, 8, 4096, 128, 0), (16, 32, 8, 4096, 128, 1)]


def pk_attention(q, k, v, causal, scale=None, **over):
    """pykittens attention_fwd on (B, N, H, D) tensors: (O, LSE (B, H, N))."""
    b, nq, hq, d = q.shape
    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))        # (B, H, N, D) views
    o = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, device=q.device, dtype=torch.float32)
    grid, consts = attention_fwd_launch({"q": qv, "k": kv, "v": vv}, "sm_90a",
                                        CAUSAL=int(causal), **over)
    pk.launch(attention_fwd, qv, kv, vv, o.transpose(1, 2), lse,
              scale if scale is not None else 1 / math.sqrt(d), grid=grid, **consts)
    return o, lse


def reference(q, k, v, causal, scale=None):
    """float64 attention on (B, N, H, D) tensors (GQA by repeating K/V heads), and LSE."""
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = (x.repeat_interleave(hq // hkv, dim=1) for x in (kd, vd))
    s = qd @ kd.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if causal:
        keep = torch.arange(nk, device=q.device)[None, :] <= \
            torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vd).transpose(1, 2), lse


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def correctness(rows, details):
    """The library kernel (each variant) against float64 at ragged shapes, causal or not,
    MHA and GQA, both head dims, bf16 and f16."""
    cases = [(2, 4, 4, 1000, 1000, 128, 0), (2, 4, 4, 1000, 1000, 128, 1),
             (1, 8, 2, 777, 1300, 64, 1), (1, 8, 2, 1300, 777, 64, 1),
             (2, 6, 3, 512, 512, 64, 0), (1, 2, 1, 129, 4000, 128, 0)]
    for dt in (torch.bfloat16, torch.float16):
        for b, hq, hkv, nq, nk, d, causal in cases:
            q, k, v = _rand(b, nq, hq, d, dtype=dt), _rand(b, nk, hkv, d, dtype=dt), \
                _rand(b, nk, hkv, d, dtype=dt)
            ref_o, ref_lse = reference(q, k, v, causal)
            for name, over in hopper_schedules(d).items():
                if causal and over.get("PERSISTENT") or name not in CHECKED:
                    continue
                try:
                    o, lse = pk_attention(q, k, v, causal, **over)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - report, go on
                    rows.append(["attention", name, str(dt)[6:], f"{(b, hq, hkv, nq, nk, d)}",
                                 "ERROR", str(e)[:60]])
                    continue
                err = float((o.double() - ref_o).norm() / ref_o.norm())
                finite = torch.isfinite(ref_lse)
                lse_err = float((lse.double() - ref_lse)[finite].abs().max())
                ok = err < 1e-2 and lse_err < 1e-3 and bool(torch.isfinite(o).all()) and \
                    bool(torch.equal(torch.isinf(lse), ~finite))
                details.append({"check": "attention_vs_float64", "variant": name,
                                "dtype": str(dt), "shape": (b, hq, hkv, nq, nk, d),
                                "causal": causal, "rel_err": err, "lse_max_abs_err": lse_err,
                                "ok": ok})
                if name == "default" or not ok:
                    rows.append(["attention", name, str(dt)[6:],
                                 f"{(b, hq, hkv, nq, nk, d)}{' causal' if causal else ''}",
                                 f"{err:.1e} / lse {lse_err:.1e}", "ok" if ok else "FAIL"])
    # the hardware against the emulator on one small ragged case
    q, k, v = _rand(1, 130, 2, 64), _rand(1, 200, 1, 64), _rand(1, 200, 1, 64)
    o, lse = pk_attention(q, k, v, 1)
    qv, kv, vv = (x.transpose(1, 2).float().cpu().numpy().astype(pk.bf16.np) for x in (q, k, v))
    grid, consts = attention_fwd_launch({"q": qv, "k": kv, "v": vv}, "sm_90a", CAUSAL=1)
    emu = pk.emulate(attention_fwd, qv, kv, vv, np.zeros_like(qv),
                     np.zeros((1, 2, 130), np.float32), 1 / 8, grid=grid, target="sm_90a",
                     **consts)
    hw = o.transpose(1, 2).double().cpu().numpy()
    diff = float(np.linalg.norm(hw - emu["o"].astype(np.float64)) / np.linalg.norm(hw))
    ok = diff < 1e-2
    rows.append(["attention", "gpu vs emulator", "bf16", "(1,2,1,130,200,64) causal",
                 f"{diff:.1e}", "ok" if ok else "FAIL"])
    details.append({"check": "attention_gpu_vs_emulator", "rel_diff": diff, "ok": ok})


def op(rows, details):
    """pykittens.ops.attention (the torch operator) on GPU tensors, eager and compiled."""
    import pykittens.ops as pko
    q, k, v = _rand(2, 300, 8, 128), _rand(2, 400, 2, 128), _rand(2, 400, 2, 128)
    want, want_lse = reference(q, k, v, True)
    o, lse = pko.attention(q, k, v, causal=True, return_lse=True)
    compiled = torch.compile(lambda a, b, c: pko.attention(a, b, c, causal=True),
                             fullgraph=True)(q, k, v)
    for name, got in (("eager", o), ("torch.compile(fullgraph=True)", compiled)):
        err = float((got.double() - want).norm() / want.norm())
        ok = err < 1e-2
        rows.append(["op", f"pykittens.ops.attention ({name})", "bf16",
                     "(2,8,2,300,400,128) causal", f"{err:.1e}", "ok" if ok else "FAIL"])
        details.append({"check": f"op_{name}", "rel_err": err, "ok": ok})


def performance(rows, details, variants=False):
    peers = attention_peers(("CUDNN_ATTENTION", "FLASH_ATTENTION"))
    for b, hq, hkv, n, d, causal in SHAPES:
        q, k, v = _rand(b, n, hq, d), _rand(b, n, hkv, d), _rand(b, n, hkv, d)
        flops = 4 * b * hq * n * n * d / (2 if causal else 1)
        shape = f"({b},{hq},{hkv},{n},{d}){' causal' if causal else ''}"
        cands = {f"pykittens {name}": (lambda o=over: pk_attention(q, k, v, causal, **o))
                 for name, over in (hopper_schedules(d).items() if variants else
                                    [("library default", {})])
                 if not (causal and over.get("PERSISTENT"))}
        for name, fn in peers.items():
            if isinstance(fn, str):
                rows.append(["perf", name, "bf16", shape, "-", fn])
                continue
            cands[name] = (lambda f=fn: f(q, k, v, causal))
        res = {}
        for name, fn in cands.items():
            try:
                fn()
                torch.cuda.synchronize()
                s = graph_time(fn, reps=10)
            except Exception as e:  # noqa: BLE001 - one failing must not hide the rest
                rows.append(["perf", name, "bf16", shape, "ERROR", str(e)[:60]])
                continue
            res[name] = {"seconds": s, "tflops": flops / s / 1e12}
        base = res.get("torch SDPA (cuDNN)", {}).get("tflops")
        for name, r in res.items():
            rel = f"{r['tflops'] / base:.2f}x cuDNN" if base else ""
            rows.append(["perf", name, "bf16", shape, f"{r['tflops']:.0f} TFLOP/s", rel])
        details.append({"check": "attention_throughput", "shape": (b, hq, hkv, n, d),
                        "causal": causal, **res})


def main() -> int:
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda}
    return run_steps("attention", {
        "correctness": correctness, "op": op,
        "performance": lambda rows, details: performance(rows, details,
                                                         variants="--variants" in sys.argv)},
        env)


if __name__ == "__main__":
    sys.exit(main())
