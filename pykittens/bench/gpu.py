"""Library kernels on a CUDA GPU: correctness against float64 torch, agreement with the
emulator, and timing helpers. Imports torch; call only where a GPU exists."""
from __future__ import annotations

import numpy as np
import torch

from ..emulator.launch import emulate
from ..ir.types import dtype_of
from ..kernels import KERNELS
from ..kernels.spec import rel_err
from ..runtime.launch import launch
from ..tune import graph_time  # noqa: F401 (the timing the bench scripts use)

DEV = "cuda"
TORCH_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def to_torch(inputs: dict) -> dict:
    """numpy inputs -> CUDA tensors of the same element types (scalars pass through),
    converted on the host and copied up (so compute-sanitizer's initcheck sees each
    tensor initialised by the copy)."""
    def one(v):
        if not isinstance(v, np.ndarray):
            return v
        if v.dtype.kind in "iu":                                  # positions, offsets
            return torch.from_numpy(v).to(DEV)
        return torch.from_numpy(v.astype(np.float32)).to(TORCH_DT[v.dtype.name]).to(DEV)
    return {k: one(v) for k, v in inputs.items()}


def run_gpu(spec, t: dict, grid, consts):
    out = t[spec.outputs[0]]
    out.fill_(float("nan"))                            # poison: unwritten elements show
    launch(spec.kernel, grid=grid, **t, **consts)
    torch.cuda.synchronize()
    return out


def float64_reference(spec, t: dict):
    """The kernel's reference on float64 copies of its inputs, on the GPU."""
    ref = spec.torch_reference({k: (v.double() if torch.is_tensor(v) else v)
                                for k, v in t.items()})
    return ref[spec.outputs[0]]


def library_cases(target: str, names, shapes: str):
    """(spec, dtype, shape) for every library kernel meant for `target` (or only `names`),
    at its `shapes` attribute: 'shapes' (small, ragged) or 'gpu_shapes' (real)."""
    for spec in KERNELS.values():
        if (names and spec.name not in names) or target not in spec.targets:
            continue
        for dt in spec.dtypes:
            for shape in getattr(spec, shapes):
                yield spec, dt, shape


def check_library(shapes: str = "gpu", target: str = "sm_90a", rng=None,
                  names=None) -> list[dict]:
    """Every library kernel (or `names`) at its GPU shapes ('gpu') or its small emulator
    shapes ('small') against float64."""
    rng = rng or np.random.default_rng(0)
    out = []
    which = "gpu_shapes" if shapes == "gpu" else "shapes"
    for spec, dt, shape in library_cases(target, names, which):
        inputs = spec.make_inputs(shape, dtype_of(dt), rng)
        grid, consts = spec.launch(inputs, target)
        t = to_torch(inputs)
        got = run_gpu(spec, t, grid, consts)
        ref = float64_reference(spec, t)
        err = float((got.double() - ref).norm() / ref.norm())
        if not torch.isfinite(got).all():
            err = float("inf")
        out.append({"check": "gpu_vs_float64", "kernel": spec.name, "dtype": dt,
                    "shape": shape, "rel_err": err, "ok": err <= spec.tolerance(dt)})
    return out


def emulator_agreement(target: str = "sm_90a", rng=None, names=None) -> list[dict]:
    """The same inputs through the GPU and the emulator, at the small (ragged) shapes."""
    rng = rng or np.random.default_rng(1)
    out = []
    for spec, dt, shape in library_cases(target, names, "shapes"):
        inputs = spec.make_inputs(shape, dtype_of(dt), rng)
        grid, consts = spec.launch(inputs, target)
        emu = emulate(spec.kernel, grid=grid, target=target, **inputs,
                      **consts)[spec.outputs[0]].astype(np.float64)
        hw = run_gpu(spec, to_torch(inputs), grid, consts).double().cpu().numpy()
        rel = rel_err(hw, emu)
        out.append({"check": "gpu_vs_emulator", "kernel": spec.name, "dtype": dt,
                    "shape": shape, "rel_diff": rel,
                    "max_abs_diff": float(np.max(np.abs(hw - emu))),
                    "bitwise_equal_fraction": float(np.mean(hw == emu)),
                    "ok": bool(rel <= spec.tolerance(dt) and np.all(np.isfinite(hw)))})
    return out


SDPA_NAMES = {"CUDNN_ATTENTION": "cuDNN", "FLASH_ATTENTION": "flash"}


def attention_peers(sdpa_backends=("CUDNN_ATTENTION",)) -> dict:
    """name -> fn(q, k, v, causal) -> O on (B, N, H, D) tensors (flash_attn_func's layout):
    torch SDPA on each backend named (SDPBackend members), and FlashAttention-4's CuTe-DSL
    kernels where importable — otherwise, under its name, the reason (a string)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    peers = {}

    def sdpa(backend):
        def run(q, k, v, causal):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=bool(causal),
                    enable_gqa=kt.shape[1] != qt.shape[1]).transpose(1, 2)
        return run

    for name in sdpa_backends:
        peers[f"torch SDPA ({SDPA_NAMES.get(name, name)})"] = sdpa(getattr(SDPBackend, name))
    try:
        from flash_attn.cute import flash_attn_func
        peers["FA4 (flash_attn.cute)"] = lambda q, k, v, c: flash_attn_func(
            q, k, v, causal=bool(c))
    except Exception as e:  # noqa: BLE001 - the peer is optional
        peers["FA4 (flash_attn.cute)"] = f"not importable: {type(e).__name__}: {e}"[:80]
    return peers


def event_time(fn, reps: int = 20, rounds: int = 10) -> float:
    """Seconds of one call of fn (after one warm-up call): CUDA events around `reps` calls,
    the median of `rounds` such timings. For work that a CUDA graph cannot capture."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps * 1e-3)
    return float(np.median(times))


def copy_ceiling(nbytes: int = 1 << 30) -> tuple[float, dict]:
    """Device-to-device copy bandwidth (bytes read + written per second): the best of the
    driver's memcpy (timed with events) and an SM copy kernel replayed in a CUDA graph."""
    big = torch.randn(nbytes // 2, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(big)
    moved = 2 * big.numel() * big.element_size()
    dst.copy_(big)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(big)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    memcpy = moved / float(np.median(times))
    kernel = moved / graph_time(lambda: torch.mul(big, 1, out=dst))
    return max(memcpy, kernel), {"memcpy_bytes_per_s": memcpy, "sm_copy_bytes_per_s": kernel}


def copy_ramp(mib=(64, 128, 256, 512, 1024)) -> dict:
    """What a streaming kernel costs beyond its bytes: an SM copy kernel (torch.mul into
    another tensor) replayed in CUDA graphs at each size (MiB moved: read + written), and
    the least-squares line time = fixed + moved / bandwidth through those points (the
    fixed part: its start and drain among back-to-back kernels)."""
    points = []
    for size in mib:
        n = size * (1 << 20) // 4                 # bf16 elements read (and as many written)
        src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        points.append((4 * n, graph_time(lambda: torch.mul(src, 1, out=dst))))
        del src, dst
    moved, secs = (np.array(v, dtype=float) for v in zip(*points))
    slope, fixed = np.polyfit(moved, secs, 1)
    return {"fixed_s": float(fixed), "bytes_per_s": float(1 / slope),
            "points": [{"bytes": int(b), "s": float(t)} for b, t in points]}


def summary_rows(results: list[dict]) -> list[list]:
    rows = []
    for r in results:
        val = r.get("rel_err", r.get("rel_diff"))
        rows.append([r["check"], r["kernel"], r["dtype"], "x".join(map(str, r["shape"])),
                     f"{val:.2e}", "ok" if r["ok"] else "FAIL"])
    return rows
