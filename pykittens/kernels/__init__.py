"""The kernel library: each kernel is a short pykittens program plus a KernelSpec that says how
to feed it and what it must compute. `KERNELS[name]` is the registry."""
from __future__ import annotations

import numpy as np

from .gemm import gemm, gemm_wgmma, gemm_ws
from . import rows
from .layernorm import layernorm
from .pipeline import tma_scale, ws_scale
from .scaled_add import scaled_add
from .softmax import softmax
from .spec import KernelSpec, check, rel_err

ROWS_PER_WAVE = 4


WAVES = 4            # num_waves of the library's row kernels


def _rows_grid(m: int) -> int:
    return max(1, -(-m // (ROWS_PER_WAVE * WAVES)))


def _rand(shape, dtype, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype.np)


def _f64(x):
    return np.asarray(x).astype(np.float64)


# ---- scaled_add -----------------------------------------------------------------------------

def _sa_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng), "y": _rand(shape, dtype, rng),
            "out": np.zeros(shape, dtype.np), "alpha": float(rng.uniform(0.5, 2.0))}


def _sa_ref(i):
    return {"out": i["alpha"] * _f64(i["x"]) + _f64(i["y"])}


def _sa_torch(t):
    return {"out": t["alpha"] * t["x"] + t["y"]}


def _sa_launch(i, target):
    m, n = i["x"].shape
    return (_rows_grid(m), -(-n // 64)), {}


# ---- softmax ----------------------------------------------------------------------------------

def _sm_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng, 3.0), "out": np.zeros(shape, dtype.np)}


def _sm_ref(i):
    x = _f64(i["x"])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"out": e / e.sum(axis=1, keepdims=True)}


def _sm_torch(t):
    import torch
    return {"out": torch.softmax(t["x"], dim=1)}


def _rows_launch(i, target):
    return (_rows_grid(i["x"].shape[0]),), {}


TMA_CHUNK = 256                  # columns per TMA box (a box dim is at most 256 elements)
TMA_MAX_COLS = 8192              # rows staged whole in shared memory: 4 waves x 16 KiB (bf16)


def ln_tma_consts(n: int) -> dict:
    """Constants of the Hopper TMA schedule (rows staged in shared memory, read once) for
    rows of n columns. Opt-in: on the H200 it measured slower than the looped schedule
    (1.84 vs 2.57 TB/s at 16384 x 8192 bf16, docs/PERF.md) — its loads do not overlap the
    math yet."""
    if n > TMA_MAX_COLS:
        raise ValueError(f"the TMA schedule stages at most {TMA_MAX_COLS} columns, not {n}")
    return {"TMA": 1, "N_MAX": max(TMA_CHUNK, 1 << (max(n, 1) - 1).bit_length()),
            "CHUNK": TMA_CHUNK}


def row_launch(i, target, x="x", row_bytes=None):
    """(grid, consts) of a row kernel (rows.plan) over the rows of input `x`; row_bytes
    defaults to x's element size (a forward pass holding x)."""
    m, n = i[x].shape
    per, consts = rows.plan(m, n, target, row_bytes or rows.itemsize(i[x]))
    return (max(1, -(-m // per)),), consts


# ---- layernorm --------------------------------------------------------------------------------

def _ln_inputs(shape, dtype, rng):
    m, n = shape
    return {"x": _rand(shape, dtype, rng) + dtype.np(1.5), "w": _rand((n,), dtype, rng),
            "b": _rand((n,), dtype, rng), "out": np.zeros(shape, dtype.np),
            "mean": np.zeros(m, np.float32), "rstd": np.zeros(m, np.float32), "eps": 1e-5}


def _ln_ref(i):
    x = _f64(i["x"])
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return {"out": (x - mu) / np.sqrt(var + i["eps"]) * _f64(i["w"]) + _f64(i["b"])}


# ---- gemm (shape = M, N, K) --------------------------------------------------------------------

def _gemm_inputs(shape, dtype, rng):
    m, n, k = shape
    return {"a": _rand((m, k), dtype, rng), "b": _rand((k, n), dtype, rng),
            "c": np.zeros((m, n), np.float32)}


def _gemm_ref(i):
    return {"c": _f64(i["a"]) @ _f64(i["b"])}


def _gemm_launch(i, target, bm=64, bn=64, n=None):
    """A flat grid of bm x bn output tiles in the order the cache simulator picks for this
    shape and target (chiplet.auto_mapping, memoised on disk)."""
    from .. import chiplet
    from ..targets import get
    m, k = i["a"].shape
    n = i["b"].shape[1] if n is None else n
    tm, tn = max(1, -(-m // bm)), max(1, -(-n // bn))
    op = chiplet.Gemm(tm * bm, tn * bn, max(k, 1), bm=bm, bn=bn, bk=64)
    spec = chiplet.auto_mapping(op, target=target).spec
    return (tm * tn,), {"MAP": spec, "TM": tm, "TN": tn, "TARGET": get(target).name}


def _gemm_nt_inputs(shape, dtype, rng):
    """C = A @ B.T with B stored N x K (a linear layer's weight)."""
    m, n, k = shape
    return {"a": _rand((m, k), dtype, rng), "b": _rand((n, k), dtype, rng),
            "c": np.zeros((m, n), np.float32)}


def _gemm_nt_ref(i):
    return {"c": _f64(i["a"]) @ _f64(i["b"]).T}


def _gemm_nt_torch(t):
    return {"c": t["a"] @ t["b"].T}


def gemm_ws_launch(i, target, promote: bool | None = None):
    """(grid, consts) of gemm_ws for inputs `i`: persistent (one workgroup per SM walks the
    blocks), 128 x BN blocks on the cache simulator's order. fp8 operands promote each K
    step's products to the f32 accumulator unless promote=False (PROMOTE=1, BN = 128: the
    tensor cores' fp8 accumulation keeps fewer bits; without it, BN = 256 at their full
    rate). A 16-bit C leaves through shared memory and TMA stores. TMA copies A and B: their
    rows (K elements) must be multiples of 16 bytes."""
    from ..targets import get
    (m, k), (n, _) = i["a"].shape, i["b"].shape
    esz = np.dtype(i["a"].dtype).itemsize
    if k * esz % 16:
        raise ValueError(f"gemm_ws copies A and B by TMA: K x element size must be a "
                         f"multiple of 16 bytes, got K = {k} ({k * esz} bytes); pad K")
    promote = esz == 1 if promote is None else bool(promote and esz == 1)
    bn = 128 if n <= 128 or promote else 256
    (tiles,), consts = _gemm_launch(i, target, bm=128, bn=bn, n=n)
    c = i.get("c")
    tma_store = c is not None and np.dtype(c.dtype).itemsize == 2 and n * 2 % 16 == 0
    # shared memory: 4 ring stages, 3 beside the 64 KiB of C staging of 256-wide blocks;
    # 3 when promoting into f32 C (its registers leave ptxas no room for a fourth branch)
    stages = 3 if (tma_store and bn == 256) or (promote and not tma_store) else 4
    return (min(tiles, get(target).num_cus),), {
        **consts, "BN": bn, "PERSISTENT": 1, "STAGES": stages, "PROMOTE": int(promote),
        **({"TMA_STORE": 1} if tma_store else {})}


def _gemm_wgmma_launch(i, target):
    """TMA needs B's rows to be a multiple of 16 bytes; otherwise B goes through registers."""
    grid, consts = _gemm_launch(i, target)
    row_bytes = i["b"].shape[1] * np.dtype(i["b"].dtype).itemsize
    return grid, {**consts, "TMA": int(row_bytes % 16 == 0)}


def _ln_torch(t):
    x = t["x"]
    mu = x.mean(1, keepdim=True)
    var = ((x - mu) ** 2).mean(1, keepdim=True)
    return {"out": (x - mu) / (var + t["eps"]).sqrt() * t["w"] + t["b"]}


def _gemm_torch(t):
    return {"c": t["a"] @ t["b"]}


def _ws_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng), "out": np.zeros(shape, dtype.np)}


def _ws_ref(i):
    return {"out": 2.0 * _f64(i["x"])}


def _ws_torch(t):
    return {"out": 2.0 * t["x"]}


def _ws_launch(i, target):
    return (max(1, -(-i["x"].shape[1] // 64)),), {}


_SMALL = ((16, 64), (37, 100), (5, 300), (64, 256))
_LN_SMALL = _SMALL + ((9, 2000),)            # rows past one resident chunk

KERNELS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec("scaled_add", scaled_add, _sa_inputs, _sa_ref, _sa_launch, ("out",),
               shapes=_SMALL, gpu_shapes=((8192, 8192),), compile_consts={"DT": "bf16"},
               torch_reference=_sa_torch),
    KernelSpec("softmax", softmax, _sm_inputs, _sm_ref, _rows_launch, ("out",),
               shapes=_SMALL, gpu_shapes=((16384, 4096),), compile_consts={"DT": "bf16"},
               torch_reference=_sm_torch),
    KernelSpec("layernorm", layernorm, _ln_inputs, _ln_ref, row_launch, ("out",),
               shapes=_LN_SMALL, gpu_shapes=((16384, 8192), (4096, 12288)),
               compile_consts={"DT": "bf16", "SPLIT": 1, "ROWS": 1, "N_MAX": 8192,
                               "CHUNK": 512, "num_waves": 4},       # 8192 columns' default
               torch_reference=_ln_torch),
    KernelSpec("gemm", gemm, _gemm_inputs, _gemm_ref, _gemm_launch, ("c",),
               shapes=((64, 64, 64), (100, 70, 96), (128, 64, 160)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               tol={"bf16": 1e-5, "f16": 1e-5},     # exact products, f32 sums
               torch_reference=_gemm_torch),
    KernelSpec("gemm_wgmma", gemm_wgmma, _gemm_inputs, _gemm_ref, _gemm_wgmma_launch, ("c",),
               shapes=((64, 64, 64), (100, 70, 96), (128, 72, 160)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_torch,
               targets=("sm_90a",)),          # warpgroup MMA: Hopper
    KernelSpec("gemm_ws", gemm_ws, _gemm_nt_inputs, _gemm_nt_ref, gemm_ws_launch, ("c",),
               shapes=((128, 128, 128), (150, 200, 304), (64, 272, 96)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16", "e4m3", "e5m2"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               # 16-bit: exact products, f32 sums; fp8: the default 1e-2 (without PROMOTE
               # the H200's fp8 wgmma accumulates with fewer bits: 1.3e-3 from float64 at
               # K = 4096, docs/PERF.md)
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_nt_torch,
               targets=("sm_90a",)),          # TMA + warpgroup MMA, warp-specialised: Hopper
    KernelSpec("tma_scale", tma_scale, _ws_inputs, _ws_ref,
               lambda i, t: ((-(-i["x"].shape[0] // 64), -(-i["x"].shape[1] // 64)), {}),
               ("out",), shapes=((64, 64), (100, 136), (130, 72)),
               gpu_shapes=((8192, 4096),), compile_consts={"DT": "bf16"},
               dtypes=("bf16",),            # TMA rows must be multiples of 16 bytes
               torch_reference=_ws_torch, targets=("sm_90a",)),
    KernelSpec("ws_scale", ws_scale, _ws_inputs, _ws_ref, _ws_launch, ("out",),
               shapes=((150, 64), (37, 100), (256, 128)), gpu_shapes=((8192, 4096),),
               compile_consts={"DT": "bf16"}, torch_reference=_ws_torch,
               targets=("sm_90a",)),          # mbarriers and warp roles: Hopper
)}

__all__ = ["KERNELS", "KernelSpec", "check", "gemm_ws_launch", "ln_tma_consts", "rel_err",
           "gemm", "gemm_wgmma", "gemm_ws", "layernorm", "scaled_add", "softmax", "tma_scale",
           "ws_scale"]
