"""Matrix products as differentiable torch operators over the library GEMMs: `linear`
(y = x W^T + b) and `matmul` (a matrix, or a stack of them, times one matrix). One custom
op, pykittens::gemm(a, b, form), computes C = A B ("nn"), A B^T ("nt") or A^T B ("tn") in
the operands' dtype with float32 accumulation; its gradients are gemms of the other forms.

The kernel: on Hopper `gemm_ws` (warp-specialised wgmma; it reads A as (M, K) and B as
(N, K), a linear layer's weight as it is) wherever K x element size is a multiple of 16
bytes (its TMA copies), else the mma.sync `gemm`; on CDNA `gemm_pingpong` (8-wave
ping-pong MFMA on 256 x 256 blocks; A (M, K), B (N, K) as well). An operand stored the
other way is copied transposed (torch) first."""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import KERNELS, Operand, gemm_ws_grid, gemm_ws_launch
from ..kernels.gemm import gemm, gemm_ws
from ..kernels.gemm_cdna import STEP_BYTES, gemm_pingpong, gemm_pingpong_launch
from .run import HALVES, check_same, check_tensor, custom_op, run, target_of

FORMS = ("nn", "nt", "tn")


def uses_gemm_ws(target: str, k: int, itemsize: int) -> bool:
    """Whether a product with inner dim k runs on gemm_ws (else on gemm)."""
    return target == "sm_90a" and k * itemsize % 16 == 0


@custom_op("pykittens::gemm")
def _gemm(a: torch.Tensor, b: torch.Tensor, form: str) -> torch.Tensor:
    A = a if form[0] == "n" else a.t()                   # (M, K)
    B = b if form[1] == "n" else b.t()                   # (K, N)
    (m, k), n = A.shape, B.shape[1]
    c = a.new_empty((m, n))
    if c.numel() == 0 or k == 0:
        return c.zero_()
    target = target_of(a)
    kernel, grid, consts = _plan(target, m, k, n, a.itemsize)
    if AUTOTUNE and kernel is gemm_ws and a.device.type == "cuda":
        consts = _tuned(a, m, k, n, consts)
        grid = gemm_ws_grid(consts, target)
    b_rows = B.t() if kernel in (gemm_ws, gemm_pingpong) else B    # these read B as (N, K)
    run(kernel, {"a": A.contiguous(), "b": b_rows.contiguous(), "c": c}, grid, consts,
        ("c",))
    return c


AUTOTUNE = os.environ.get("PYKITTENS_AUTOTUNE", "0") == "1"   # time gemm_ws's candidates


def gemm_ws_candidates(target: str, m: int, k: int, n: int, itemsize: int) -> list[dict]:
    """Constants of gemm_ws worth timing for an (m, k) x (k, n) product: the launch rule's
    choice first, then its block order replaced by row-major and grouped windows of 4 to 32
    block rows, then 128-wide blocks (four ring stages beside C's staging)."""
    from ..chiplet import mapping as chip
    i = {"a": Operand((m, k), itemsize), "b": Operand((n, k), itemsize),
         "c": Operand((m, n), itemsize)}
    _, first = gemm_ws_launch(i, target)
    out = [first]
    tm, tn = first["TM"], first["TN"]
    for spec in ["row-major"] + [chip.gemm_grouped(tm, tn, w).spec for w in (4, 8, 16, 32)
                                 if w < tm]:
        c = {**first, "MAP": spec}
        if c not in out:
            out.append(c)
    if first["BN"] == 256:
        out.append(gemm_ws_launch(i, target, bn=128)[1])
    return out


def _tuned(a: torch.Tensor, m: int, k: int, n: int, consts: dict) -> dict:
    """gemm_ws's constants for this product on a's GPU: the autotuner's choice among
    gemm_ws_candidates (timed once per shape, type and GPU, then read from disk)."""
    dev = a.device
    known = (dev.index, m, k, n, str(a.dtype))
    if known in _TUNED:                              # decided in this process
        return _TUNED[known]
    from .. import tune
    from ..runtime.launch import launch
    target = target_of(a)
    problem = {"m": m, "k": k, "n": n, "dtype": str(a.dtype), "target": target,
               "gpu": torch.cuda.get_device_name(dev)}
    candidates = gemm_ws_candidates(target, m, k, n, a.itemsize)
    if torch.cuda.is_current_stream_capturing():     # no timing inside a graph capture
        return tune.cached("gemm_ws", problem, candidates) or consts

    def measure(c):
        x, w = (torch.randn(r, k, device=dev).to(a.dtype) for r in (m, n))
        y = a.new_empty((m, n))
        grid = gemm_ws_grid(c, target)
        return tune.graph_time(lambda: launch(gemm_ws, grid=grid, a=x, b=w, c=y, **c), 5)

    _TUNED[known] = tune.tune("gemm_ws", problem, candidates, measure)
    return _TUNED[known]


_TUNED: dict = {}


@functools.lru_cache(maxsize=1024)
def _plan(target: str, m: int, k: int, n: int, itemsize: int):
    """(kernel, grid, consts) of an (m, k) x (k, n) product with a C of the operands' type,
    decided once per shape (the launch rules consult the cache simulator's choice)."""
    if uses_gemm_ws(target, k, itemsize):
        i = {"a": Operand((m, k), itemsize), "b": Operand((n, k), itemsize),
             "c": Operand((m, n), itemsize)}
        return (gemm_ws, *gemm_ws_launch(i, target))
    if target in STEP_BYTES:
        return (gemm_pingpong, *gemm_pingpong_launch(m, n, k, target, itemsize))
    i = {"a": Operand((m, k), itemsize), "b": Operand((k, n), itemsize)}
    return (gemm, *KERNELS["gemm"].launch(i, target))


@_gemm.register_fake
def _(a, b, form):
    m = a.shape[0] if form[0] == "n" else a.shape[1]
    n = b.shape[1] if form[1] == "n" else b.shape[0]
    return a.new_empty((m, n))


def _setup(ctx, inputs, output):
    a, b, form = inputs
    ctx.save_for_backward(a, b)
    ctx.form = form


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = dc.contiguous()
    # C = A B: dA = dC B^T, dB = A^T dC, each written as the form that reads the stored
    # operands as they are
    grads = {"nn": (lambda: _gemm(dc, b, "nt"), lambda: _gemm(a, dc, "tn")),
             "nt": (lambda: _gemm(dc, b, "nn"), lambda: _gemm(dc, a, "tn")),
             "tn": (lambda: _gemm(b, dc, "nt"), lambda: _gemm(a, dc, "nn"))}[ctx.form]
    return tuple(g() if need else None for g, need in zip(grads, ctx.needs_input_grad[:2])) \
        + (None,)


_gemm.register_autograd(_backward, setup_context=_setup)


def _check(op, x_name, x, w_name, w):
    check_tensor(op, x_name, x, HALVES)
    check_tensor(op, w_name, w, HALVES)
    check_same(op, **{x_name: x, w_name: w})


def linear(input, weight, bias=None):
    """torch.nn.functional.linear: input (..., K) times weight (N, K) transposed, plus bias
    (N,) if given; bfloat16 or float16, one dtype for all, float32 accumulation.
    Differentiable in all three."""
    _check("linear", "input", input, "weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"linear: weight must be (out_features, in_features), got "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape
    if input.shape[-1] != k:
        raise ValueError(f"linear: input {tuple(input.shape)} has {input.shape[-1]} features "
                         f"but weight {tuple(weight.shape)} takes {k}")
    if bias is not None:
        check_tensor("linear", "bias", bias, HALVES, dims=1)
        check_same("linear", input=input, bias=bias)
        if bias.shape[0] != n:
            raise ValueError(f"linear: bias has {bias.shape[0]} elements, weight {n} outputs")
    y = _gemm(input.reshape(-1, k), weight, "nt").view(*input.shape[:-1], n)
    return y if bias is None else y + bias


def matmul(input, other):
    """torch.matmul where `other` is a matrix (K, N) and input a matrix (M, K), a vector
    (K,) or a stack (..., M, K) of matrices (multiplied as one (M', K) matrix); bfloat16 or
    float16, float32 accumulation. `other` may be row-major or a transposed view (w.t() of
    a row-major w). The Hopper and CDNA GEMMs read B as (N, K) rows: a transposed view is
    read as it is, a row-major `other` is first copied into that order (a transpose pass
    over B on every call: on the H200 it made 4096³ take 0.32 ms against linear's 0.19 ms;
    keep weights as (N, K) and use linear, or pass w.t()). Differentiable in both. A batched
    or vector `other` raises NotImplementedError: the library GEMMs multiply by one
    matrix."""
    if isinstance(other, torch.Tensor) and other.dim() == 2 and other.stride(1) != 1 and \
            other.stride(0) == 1:               # a transposed view, x @ w.t(): read w as is
        _check("matmul", "input", input, "other.t()", other.t())
        form, b = "nt", other.t()
    else:
        _check("matmul", "input", input, "other", other)
        form, b = "nn", other
    if other.dim() != 2:
        raise NotImplementedError(f"matmul: other {tuple(other.shape)} must be a matrix "
                                  "(K, N); the library GEMMs multiply by one matrix (use "
                                  "torch.matmul for batched or vector operands)")
    k, n = other.shape
    if input.shape[-1] != k:
        raise ValueError(f"matmul: input {tuple(input.shape)} and other {tuple(other.shape)}"
                         f" do not agree in the inner dim ({input.shape[-1]} vs {k})")
    return _gemm(input.reshape(-1, k), b, form).view(*input.shape[:-1], n)
