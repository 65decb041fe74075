"""Matrix products as differentiable torch operators over the library GEMMs: `linear`
(y = x W^T + b) and `matmul` (a matrix, or a stack of them, times one matrix). One custom
op, pykittens::gemm(a, b, form), computes C = A B ("nn"), A B^T ("nt") or A^T B ("tn") in
the operands' dtype with float32 accumulation; its gradients are gemms of the other forms.

The kernel: on Hopper `gemm_ws` (warp-specialised wgmma), which reads each operand as it is
stored, K-major or not (its LAYOUT is the form), wherever TMA can copy the stored rows (a
multiple of 16 bytes), else the mma.sync `gemm_basic`; on CDNA `gemm_pingpong` (8-wave ping-pong
MFMA on 256 x 256 blocks; A (M, K), B (N, K)). Where the kernel cannot read an operand as
stored it is copied transposed (torch) first."""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import KERNELS, Operand, gemm_split_k, gemm_ws_grid, gemm_ws_launch
from ..kernels.gemm import gemm_basic, gemm_sk, gemm_ws
from ..kernels.gemm_cdna import STEP_BYTES, gemm_pingpong, gemm_pingpong_launch
from .run import (HALVES, check_same, check_tensor, custom_op, replayable, run, target_of,
                  workspace)

FORMS = ("nn", "nt", "tn")


def ws_layout(target: str, form: str, m: int, k: int, n: int, itemsize: int) -> str | None:
    """The LAYOUT gemm_ws reads an (m, k) x (k, n) product of this form in: the form itself
    when TMA can copy both operands' stored rows and the type is 16-bit, else "nt" after
    transposing copies (K rows that TMA can copy); None where gemm_ws cannot run it."""
    if target != "sm_90a":
        return None
    stored_rows = ({"n": k, "t": m}[form[0]], {"t": k, "n": n}[form[1]])
    if itemsize == 2 and all(r * itemsize % 16 == 0 for r in stored_rows):
        return form
    return "nt" if k * itemsize % 16 == 0 else None


@custom_op("pykittens::gemm")
def _gemm(a: torch.Tensor, b: torch.Tensor, form: str) -> torch.Tensor:
    A = a if form[0] == "n" else a.t()                   # (M, K)
    B = b if form[1] == "n" else b.t()                   # (K, N)
    (m, k), n = A.shape, B.shape[1]
    c = a.new_empty((m, n))
    if c.numel() == 0 or k == 0:
        return c.zero_()
    target = target_of(a)
    kernel, grid, consts, slots = _plan(target, form, m, k, n, a.itemsize)
    if AUTOTUNE and kernel is gemm_ws and a.device.type == "cuda":
        consts = _tuned(a, form, m, k, n, consts)
        grid = gemm_ws_grid(consts, target)
    ws = kernel in (gemm_ws, gemm_sk)
    if ws and consts.get("LAYOUT", "nt") == form:        # read as stored
        a_in, b_in = a, b
    else:                                                # A (M, K), B as (N, K) or (K, N)
        a_in, b_in = A, (B.t() if ws or kernel is gemm_pingpong else B)
    args = {"a": a_in.contiguous(), "b": b_in.contiguous(), "c": c}
    if slots:                                            # split-K: where blocks meet
        args["part"] = workspace(a, "gemm_sk.part", (128 * slots, consts["BN"]),
                                 torch.float32, zeroed=False)
        args["flags"] = workspace(a, "gemm_sk.flags", (8 * slots,), torch.int32)
    run(kernel, args, grid, consts, ("c",))
    return c


AUTOTUNE = os.environ.get("PYKITTENS_AUTOTUNE", "0") == "1"   # time gemm_ws's candidates


def gemm_ws_candidates(target: str, m: int, k: int, n: int, itemsize: int,
                       layout: str = "nt") -> list[dict]:
    """Constants of gemm_ws worth timing for an (m, k) x (k, n) product with operands stored
    as `layout`: the launch rule's choice first, then its block order replaced by row-major
    and grouped windows of 4 to 32 block rows, then, for 256-wide blocks, one workgroup per
    block (not persistent) under the rule's order and windows of 8 and 16, then, for them,
    C stored through shared memory and TMA (three ring stages beside the staging) and
    128-wide blocks — or, where the rule took 128-wide blocks for want of 256-wide ones
    to fill the SMs, 256-wide blocks — then 128-wide blocks with the consumers in
    ping-pong (16-bit)."""
    from ..chiplet import mapping as chip
    i = ws_operands(layout, m, k, n, itemsize)
    _, first = gemm_ws_launch(i, target, layout=layout)
    out = [first]
    tm, tn = first["TM"], first["TN"]
    for spec in ["row-major"] + [chip.gemm_grouped(tm, tn, w).spec for w in (4, 8, 16, 32)
                                 if w < tm]:
        c = {**first, "MAP": spec}
        if c not in out:
            out.append(c)
    # a block per workgroup: not with 128-wide blocks, whose TMA-staged C can hang the H200
    # (gemm_ws refuses the configuration; bench/litmus/gemm_hang.py), and C from registers,
    # as measured so (TMA-staged C under one block per workgroup has not been run there)
    if first["BN"] == 256:
        for spec in [first["MAP"]] + [chip.gemm_grouped(tm, tn, w).spec for w in (8, 16)
                                      if w < tm]:
            c = {**first, "MAP": spec, "PERSISTENT": 0}
            c.pop("TMA_STORE", None)
            if c not in out:
                out.append(c)
    narrow = gemm_ws_launch(i, target, bn=128, layout=layout)[1]
    if first["BN"] == 128 and n > 128 and first["PROMOTE"] <= 1:
        # the rule's 128-wide blocks where 256-wide ones would leave SMs idle (or fp8
        # promoted every K step): 256-wide blocks may still finish first (few blocks, each
        # with its own epilogue; promoting each half of a block after its group)
        out.append(gemm_ws_launch(i, target, bn=256, layout=layout)[1])
    if first["BN"] == 256:
        if first.get("TMA_STORE") and not first["PROMOTE"]:     # the rule stages C: whole,
            out.append({**first, "TMA_STORE": 1, "STAGES": 3})  # with 3 ring stages
        out.append(narrow)
    if not narrow["PROMOTE"]:                # the consumers taking turns over whole blocks
        pingpong = {**narrow, "PINGPONG": 1, "STAGES": 4}
        pingpong.pop("TMA_STORE", None)
        pingpong.pop("A_ROWS", None)          # both warpgroups' turns copy whole blocks
        out.append(pingpong)
    return out


def ws_stored(layout: str, m: int, k: int, n: int, make) -> dict:
    """{"a": make(A's stored shape), "b": make(B's)} for gemm_ws's LAYOUT."""
    return {"a": make((m, k) if layout[0] == "n" else (k, m)),
            "b": make((n, k) if layout[1] == "t" else (k, n))}


def ws_operands(layout: str, m: int, k: int, n: int, itemsize: int,
                out_itemsize: int | None = None) -> dict:
    """gemm_ws_launch's inputs (kernels.Operand) for an (m, k) x (k, n) product stored as
    `layout`, C of `out_itemsize` bytes an element (default: the operands')."""
    return {**ws_stored(layout, m, k, n, lambda shape: Operand(shape, itemsize)),
            "c": Operand((m, n), out_itemsize or itemsize)}


def gemm_ws_problem(a: torch.Tensor, layout: str, m: int, k: int, n: int) -> dict:
    """What the autotuner's choice for a product of a's type on a's GPU depends on (its
    disk-cache key, with the candidates)."""
    return {"m": m, "k": k, "n": n, "layout": layout, "dtype": str(a.dtype),
            "target": target_of(a), "gpu": torch.cuda.get_device_name(a.device)}


def _tuned(a: torch.Tensor, form: str, m: int, k: int, n: int, consts: dict) -> dict:
    """gemm_ws's constants for this product on a's GPU: the autotuner's choice among
    gemm_ws_candidates (timed once per shape, layout, type and GPU, then read from disk)."""
    dev = a.device
    layout = consts.get("LAYOUT", "nt")
    known = (dev.index, layout, m, k, n, str(a.dtype))
    if known in _TUNED:                              # decided in this process
        return _TUNED[known]
    from .. import tune
    from ..runtime.launch import launch
    target = target_of(a)
    problem = gemm_ws_problem(a, layout, m, k, n)
    candidates = gemm_ws_candidates(target, m, k, n, a.itemsize, layout)
    if torch.cuda.is_current_stream_capturing():     # no timing inside a graph capture
        return tune.cached("gemm_ws", problem, candidates) or consts

    # one set of operands for every candidate and round
    ops = ws_stored(layout, m, k, n, lambda shape: torch.randn(shape, device=dev).to(a.dtype))
    y = a.new_empty((m, n))

    def measure(c):
        grid = gemm_ws_grid(c, target)
        return tune.graph_time(lambda: launch(gemm_ws, grid=grid, c=y, **ops, **c), 5)

    _TUNED[known] = tune.tune("gemm_ws", problem, candidates, measure)
    return _TUNED[known]


_TUNED: dict = {}


@functools.lru_cache(maxsize=1024)
def _plan(target: str, form: str, m: int, k: int, n: int, itemsize: int):
    """(kernel, grid, consts, slots) of an (m, k) x (k, n) product of this form with a C
    of the operands' type, decided once per shape (the launch rules consult the cache
    simulator's choice): on Hopper gemm_ws, or gemm_sk where few blocks split in K pay
    (kernels.gemm_split_k; `slots` sizes its workspace, 0 for other kernels)."""
    layout = ws_layout(target, form, m, k, n, itemsize)
    if layout is not None:
        grid, consts = gemm_ws_launch(ws_operands(layout, m, k, n, itemsize), target,
                                      layout=layout)
        split = gemm_split_k(consts, target, k, itemsize, m=m, n=n)
        if split is not None:
            return (gemm_sk, *split)
        return gemm_ws, grid, consts, 0
    if target in STEP_BYTES:
        return (gemm_pingpong, *gemm_pingpong_launch(m, n, k, target, itemsize), 0)
    i = {"a": Operand((m, k), itemsize), "b": Operand((k, n), itemsize)}
    return (gemm_basic, *KERNELS["gemm_basic"].launch(i, target), 0)


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


@replayable
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


@replayable
def matmul(input, other):
    """torch.matmul where `other` is a matrix (K, N) and input a matrix (M, K), a vector
    (K,) or a stack (..., M, K) of matrices (multiplied as one (M', K) matrix); bfloat16 or
    float16, float32 accumulation. `other` may be row-major or a transposed view (w.t() of
    a row-major w). The Hopper and CDNA GEMMs read B as (N, K) rows: a transposed view is
    read as it is, a row-major `other` is first copied into that order (a transpose pass
    over B on every call, except on Hopper, where gemm_ws reads a (K, N) B as it is).
    Differentiable in both. A batched
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
