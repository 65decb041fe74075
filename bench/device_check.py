"""Device check on a CUDA GPU (H200): every library kernel at real shapes against a float64
torch reference, the hardware against the emulator at small shapes, and the LayerNorm
bandwidth against a device-to-device copy and torch.nn.functional.layer_norm.

    PYTHONPATH=. python3 bench/device_check.py          # JSON details go to $OUT if set
    PYTHONPATH=. python3 bench/device_check.py performance   # only the named steps
"""
from __future__ import annotations

import sys

import numpy as np
import torch

import pykittens as pk
from pykittens.bench import gpu, run_steps
from pykittens.bench.gpu import copy_ceiling, graph_time
from pykittens.kernels import KERNELS, gemm_ws_launch

DEV = "cuda"


def _measure(fn, outputs, reps=20):
    """(what fn returns, median seconds of a call): `outputs` are poisoned with NaN first,
    so an unwritten element shows in the check that follows."""
    for t in outputs:
        t.fill_(float("nan"))
    got = fn()
    torch.cuda.synchronize()
    return got, graph_time(fn, reps=reps)


def _split(n_max, waves, rows=1, chunk=512):
    return {"SPLIT": 1, "N_MAX": n_max, "CHUNK": chunk, "ROWS": rows, "num_waves": waves}


# (rows, cols) -> schedule constants of the library LayerNorm to compare with its default
LN_VARIANTS = {
    (16384, 8192): {
        "split-w4-rows1-chunk256": _split(8192, 4, chunk=256),
        "split-w4-rows1-chunk1024": _split(8192, 4, chunk=1024),
        "split-w4-rows2-chunk256": _split(8192, 4, rows=2, chunk=256),
        "split-w8-rows1": _split(8192, 8),
        "split-w8-rows2": _split(8192, 8, rows=2),
        "split-w16-rows1": _split(8192, 16),
        "tma-rows-in-smem": {"TMA": 1, "N_MAX": 8192, "CHUNK": 256},
        "rows1-cols1024-prefetch": {"ROWS": 1, "COLS": 1024, "PREFETCH": 1},
    },
    (16384, 4096): {
        "split-w2-rows1": _split(4096, 2),
        "split-w4-rows1": _split(4096, 4),
        "split-w4-rows2": _split(4096, 4, rows=2),
        "rows1-cols1024-prefetch": {"ROWS": 1, "COLS": 1024, "PREFETCH": 1},
    },
    (16384, 2048): {
        "resident": {"RESIDENT": 1, "N_MAX": 2048, "CHUNK": 512},
        "split-w2-rows1": _split(2048, 2),
        "split-w4-rows2": _split(2048, 4, rows=2),
    },
    (4096, 12288): {
        "split-w8-pow2": _split(16384, 8),
        "split-w12-rows1": _split(12288, 12),
        "split-w6-rows2": _split(12288, 6, rows=2),
        "rows1-cols1024-prefetch": {"ROWS": 1, "COLS": 1024, "PREFETCH": 1},
    },
}


def _ln_rows_per_workgroup(consts) -> int:
    """SPLIT: ROWS rows per workgroup; TMA / RESIDENT: a row per wave; else ROWS per wave."""
    if consts.get("SPLIT"):
        return consts.get("ROWS", 4)
    waves = consts.get("num_waves", 4)
    return waves * (1 if consts.get("TMA") or consts.get("RESIDENT") else consts.get("ROWS", 4))


def performance(rows, details):
    """The library LayerNorm (its default schedule and alternatives) against torch and a
    device-to-device copy, bf16, bytes = read x + write y."""
    copy_bw, copy_detail = copy_ceiling(1 << 30)                    # 1 GiB: beats L2
    results = {"copy_bytes_per_s": copy_bw, **copy_detail}
    spec = KERNELS["layernorm"]
    for (m, n), alternatives in LN_VARIANTS.items():
        results[f"{m}x{n}"] = _ln_shape(rows, spec, m, n, alternatives, copy_bw)
    rows.append(["perf", "device copy (read+write)", "bf16", "1 GiB",
                 f"{copy_bw / 1e12:.2f} TB/s", "ceiling"])
    details.append({"check": "layernorm_bandwidth", **results})


def _ln_shape(rows, spec, m, n, alternatives, copy_bw):
    x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    stats = torch.empty(2, m, device=DEV)            # mean, rstd: written with STATS=1
    default_grid, default_consts = spec.launch({"x": np.empty((m, n), np.float16)}, "sm_90a")
    results = {"default": default_consts}
    ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
    variants = {}
    for name, consts in {"library default": default_consts, **alternatives}.items():
        grid = default_grid if name == "library default" else \
            (-(-m // _ln_rows_per_workgroup(consts)),)
        variants[f"pykittens {name}"] = (
            lambda c=consts, g=grid: pk.launch(spec.kernel, x, w, b, out, stats, 1e-5, grid=g, **c))
    variants["torch.layer_norm"] = (
        lambda: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))
    for name, fn in variants.items():
        try:
            _, s = _measure(fn, (out,))
            err = float((out.float() - ref).norm() / ref.norm()) if name.startswith("pyk") \
                else 0.0
        except Exception as e:  # noqa: BLE001 - one variant failing must not hide the rest
            rows.append(["perf", f"layernorm ({name})", "bf16", f"{m}x{n}", "ERROR",
                         str(e)[:60]])
            continue
        bw = 2 * x.numel() * 2 / s                     # read x, write out (bf16)
        results[name] = {"seconds": s, "bytes_per_s": bw, "fraction_of_copy": bw / copy_bw,
                         "rel_err_vs_f32_torch": err}
        bad = name.startswith("pyk") and not err < 1e-2
        rows.append(["perf", f"layernorm ({name})", "bf16", f"{m}x{n}",
                     f"{bw / 1e12:.2f} TB/s", f"{100 * bw / copy_bw:.0f}% of copy"
                     + (f", err {err:.1e}" if err else "") + (" FAIL" if bad else "")])
    return results


def gemm_performance(rows, details):
    """The library GEMMs against cuBLAS (torch.matmul; torch._scaled_mm for fp8), same run."""
    res = {}
    for n in (4096, 8192):
        a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)        # B stored K x N
        bt = b.t().contiguous()                                        # ... and N x K
        c = torch.empty(n, n, device=DEV, dtype=torch.float32)
        c16 = torch.empty(n, n, device=DEV, dtype=torch.bfloat16)
        a8, bt8 = a.to(torch.float8_e4m3fn), bt.to(torch.float8_e4m3fn)
        one = torch.ones((), device=DEV)
        flops = 2 * n ** 3
        ws = KERNELS["gemm_ws"]
        g_ws, k_ws = ws.launch({"a": np.empty((n, n), np.float16),
                                "b": np.empty((n, n), np.float16)}, "sm_90a")
        _, k_ws16 = ws.launch({"a": np.empty((n, n), np.float16),      # TMA-stored C
                               "b": np.empty((n, n), np.float16),
                               "c": np.empty((n, n), np.float16)}, "sm_90a")
        tiles = k_ws16["TM"] * k_ws16["TN"]
        e4 = {"a": np.empty((n, n), pk.e4m3.np), "b": np.empty((n, n), pk.e4m3.np)}
        g8 = gemm_ws_launch({**e4, "c": np.empty((n, n), np.float16)}, "sm_90a")
        f8 = gemm_ws_launch({**e4, "c": np.empty((n, n), np.float16)}, "sm_90a",
                            promote=False)
        g8_32 = gemm_ws_launch(e4, "sm_90a")
        cands = {
            "pykittens gemm_ws (bf16, bf16 out: TMA store, persistent)":
                lambda: pk.launch(ws.kernel, a, bt, c16, grid=g_ws, **k_ws16),
            "pykittens gemm_ws (bf16, bf16 out: TMA store, a block per workgroup)":
                lambda: pk.launch(ws.kernel, a, bt, c16, grid=(tiles,),
                                  **{**k_ws16, "PERSISTENT": 0}),
            "pykittens gemm_ws (bf16, f32 out, persistent)":
                lambda: pk.launch(ws.kernel, a, bt, c, grid=g_ws, **k_ws),
            "torch.matmul (cuBLAS, bf16 out)": lambda: torch.matmul(a, b),
            "pykittens gemm_ws (e4m3, bf16 out: promoted, library default)":
                lambda: pk.launch(ws.kernel, a8, bt8, c16, grid=g8[0], **g8[1]),
            "pykittens gemm_ws (e4m3, bf16 out: fast accumulation)":
                lambda: pk.launch(ws.kernel, a8, bt8, c16, grid=f8[0], **f8[1]),
            "pykittens gemm_ws (e4m3, f32 out: promoted)":
                lambda: pk.launch(ws.kernel, a8, bt8, c, grid=g8_32[0], **g8_32[1]),
            "torch._scaled_mm (cuBLAS, e4m3, bf16 out)":
                lambda: torch._scaled_mm(a8, bt8.t(), one, one, out_dtype=torch.bfloat16),
            "torch._scaled_mm (cuBLAS, e4m3, bf16 out, use_fast_accum)":
                lambda: torch._scaled_mm(a8, bt8.t(), one, one, out_dtype=torch.bfloat16,
                                         use_fast_accum=True),
        }
        if n == 4096:
            spec, wg = KERNELS["gemm_basic"], KERNELS["gemm_wgmma"]
            grid, consts = spec.launch({"a": np.empty((n, n)), "b": np.empty((n, n))},
                                       "sm_90a")
            cands["pykittens gemm_basic (mma.sync)"] = \
                lambda: pk.launch(spec.kernel, a, b, c, grid=grid, **consts)
            cands["pykittens gemm_wgmma"] = \
                lambda: pk.launch(wg.kernel, a, b, c, grid=grid, **consts)
        ref = (a.double() @ b.double())
        ref8 = a8.double() @ bt8.double().t()
        for name, fn in cands.items():
            try:
                got, s = _measure(fn, (c, c16), reps=5)      # torch returns, we write c
            except Exception as e:  # noqa: BLE001 - one failing must not hide the rest
                rows.append(["perf", name, "", f"{n}^3", "ERROR", str(e)[:60]])
                continue
            check, res[f"{name} {n}"] = "", {"seconds": s, "tflops": flops / s / 1e12}
            if name.startswith(("pykittens gemm_ws", "torch._scaled_mm")):   # vs float64
                out = got if got is not None else c if "f32 out" in name else c16
                want = ref8 if "e4m3" in name else ref
                err = float((out.double() - want).norm() / want.norm())
                check = f"err {err:.1e}" + ("" if err < 1e-2 else " FAIL")
                res[f"{name} {n}"]["rel_err_vs_float64"] = err
            rows.append(["perf", name, "", f"{n}^3", f"{flops / s / 1e12:.0f} TFLOP/s", check])
    details.append({"check": "gemm_throughput", **res})


def main() -> int:
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "sms": props.multi_processor_count}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass

    def correctness(rows, details):
        res = gpu.check_library("gpu") + gpu.emulator_agreement()
        details.extend(res)
        rows.extend(gpu.summary_rows(res))

    return run_steps("device_check", {"correctness": correctness, "performance": performance,
                                      "gemm_performance": gemm_performance}, env)


if __name__ == "__main__":
    sys.exit(main())
