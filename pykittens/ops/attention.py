"""Attention as a differentiable torch operator: the forward over the library's
`attention_fwd`, the backward (registered with torch's autograd) over `attention_bwd`."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels.attention import attention_fwd, attention_fwd_launch
from ..kernels.attention_bwd import (attention_bwd, attention_bwd_dq, attention_bwd_dq_finish,
                                     attention_bwd_launch, attention_bwd_prep, dq_finish_launch,
                                     dq_sum_shape, stats_rows)
from .run import EMULATE_TARGET, HALVES as DTYPES, custom_op, from_numpy as _from_numpy
from . import replay
from .run import kernel_output, replayable, run, target_of, to_numpy as _to_numpy


def _check(q, k, v, scale, causal=False):
    """The op's contract, each violation a message naming the argument and the limit."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be (batch, seq, heads, head_dim), got "
                             f"{t.dim()} dims {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"attention: {name} is {t.dtype}; the kernels take bfloat16 or "
                            "float16 (convert with .to(torch.bfloat16))")
        if t.stride(-1) != 1:
            raise ValueError(f"attention: {name} needs a unit stride in its last dim (head "
                             "dim); pass .contiguous()")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"attention: q, k, v are on {q.device}, {k.device}, {v.device}; "
                         "put them on one device")
    (b, nq, hq, d), (bk, nk, hkv, dk) = q.shape, k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if bk != b or dk != d:
        raise ValueError(f"attention: q {tuple(q.shape)} and k {tuple(k.shape)} must agree "
                         "in batch and head dim")
    if d not in (64, 128):
        raise ValueError(f"attention: head dim {d} is not supported; the kernels take 64 or "
                         "128")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"attention: {hq} query heads are not a multiple of {hkv} key/value "
                         "heads")
    if scale is not None:
        if isinstance(scale, (bool, str, bytes)) or not hasattr(scale, "__float__"):
            raise TypeError(f"attention: scale must be a number (or None for "
                            f"1/sqrt(head_dim)), not {type(scale).__name__}")
        scale = float(scale)
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"attention: scale must be a positive finite number, got {scale}")
    if not isinstance(causal, (bool, np.bool_)) and causal not in (0, 1):
        raise TypeError(f"attention: causal must be True or False, not {causal!r}")


@custom_op("pykittens::attention_fwd")
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, nq, hq, _ = q.shape
    o = torch.empty_like(q)
    lse = kernel_output(q, (b, hq, nq), torch.float32)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    views = [x.transpose(1, 2) for x in (q, k, v, o)]       # (B, H, N, D)
    if not replay.on_gpu(q):
        return _emulate(views, lse, causal, scale)
    grid, consts = attention_fwd_launch({"q": views[0], "k": views[1], "v": views[2]},
                                        target_of(q), CAUSAL=int(causal))
    run(attention_fwd, dict(zip(("q", "k", "v", "o"), views), lse=lse, scale=scale), grid,
        consts)
    return o, lse


def _emulate(views, lse, causal, scale):
    from .. import emulate
    npy = [_to_numpy(x) for x in views]
    grid, consts = attention_fwd_launch({"q": npy[0], "k": npy[1], "v": npy[2]},
                                        EMULATE_TARGET, CAUSAL=int(causal))
    out = emulate(attention_fwd, *npy, np.zeros(tuple(lse.shape), np.float32), scale,
                  grid=grid, target=EMULATE_TARGET, **consts)
    return _bhnd(_from_numpy(out["o"], views[0].dtype)), torch.from_numpy(out["lse"].copy())


def _bhnd(t):
    """A (B, H, N, D) result back in the op's (B, N, H, D) layout."""
    return t.transpose(1, 2).contiguous()


@_attention_fwd.register_fake
def _(q, k, v, causal, scale, deterministic):
    b, nq, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, hq, nq), dtype=torch.float32)


@custom_op("pykittens::attention_bwd")
def _attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   o: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                   causal: bool, scale: float, deterministic: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the forward's O (and LSE, when its gradient dlse is given)."""
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    b, nq, hq, _ = q.shape
    views = [x.transpose(1, 2) for x in (q, k, v, do.contiguous(), o)]   # (B, H, N, D)
    if q.device.type == "cpu":
        return _emulate_bwd(views, lse, dlse, causal, scale, deterministic)
    from ..runtime.launch import gpu_target, launch
    qv, kv, vv, dov, ov = views
    rows = stats_rows(nq)                 # LSE and delta in rows the main pass copies by TMA
    plans = attention_bwd_launch({"q": qv, "k": kv}, gpu_target(q.device.index or 0),
                                 dq=_dq_schedule(deterministic), rows=rows, CAUSAL=int(causal))
    (pgrid, pconsts), (grid, consts), dq_plan = plans
    lse = in_rows(lse, rows)
    delta = torch.empty(b, hq, rows, device=q.device, dtype=torch.float32)[..., :nq]
    launch(attention_bwd_prep, ov, dov, delta, grid=pgrid, **pconsts)
    if dlse is not None:                 # d lse / d s = P: folds into dS = P (dP - delta)
        delta -= dlse
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # the f32 sum of the atomic schedule; with a dQ pass the main pass does not touch it (a
    # placeholder with 16-element strides keeps the aligned build)
    dq_sum = q.new_empty((1, 1, 1, 16), dtype=torch.float32) if dq_plan else \
        q.new_zeros(dq_sum_shape(*qv.shape), dtype=torch.float32)
    launch(attention_bwd, qv, kv, vv, dov, lse, delta, dq_sum, dk.transpose(1, 2),
           dv.transpose(1, 2), scale, grid=grid, **consts)
    dq = torch.empty_like(q)
    if dq_plan is None:
        fgrid, fconsts = dq_finish_launch(qv.shape)
        launch(attention_bwd_dq_finish, dq_sum, dq.transpose(1, 2), grid=fgrid, **fconsts)
        return dq, dk, dv
    launch(attention_bwd_dq, qv, kv, vv, dov, lse, delta, dq.transpose(1, 2), scale,
           grid=dq_plan[0], **dq_plan[1])
    return dq, dk, dv


def in_rows(x, rows: int):
    """x (..., N) float32 (a numpy array or torch tensor) in rows of `rows` elements, the
    first N of each viewed: x itself where it already is, else a copy in a new buffer."""
    n = x.shape[-1]
    if isinstance(x, np.ndarray):
        if rows == n and x.flags.c_contiguous:
            return x
        out = np.empty(x.shape[:-1] + (rows,), np.float32)[..., :n]
        out[...] = x
        return out
    if rows == n and x.is_contiguous():
        return x
    return x.new_empty(*x.shape[:-1], rows)[..., :n].copy_(x)


def _dq_schedule(deterministic: bool) -> str | None:
    """deterministic=True guarantees dQ's fixed order; otherwise the target's faster
    schedule (attention_bwd.default_dq)."""
    return "pass" if deterministic else None


def _emulate_bwd(views, lse, dlse, causal, scale, deterministic):
    from .. import emulate
    q, k, v, do, o = (_to_numpy(x) for x in views)
    rows = stats_rows(q.shape[2])                                   # as on the GPU
    (pgrid, pconsts), (grid, consts), dq_plan = attention_bwd_launch(
        {"q": q, "k": k}, EMULATE_TARGET, dq=_dq_schedule(deterministic), rows=rows,
        CAUSAL=int(causal))
    run = dict(target=EMULATE_TARGET)
    delta = emulate(attention_bwd_prep, o, do, np.zeros(lse.shape, np.float32), grid=pgrid,
                    **run, **pconsts)["delta"]
    if dlse is not None:
        delta = delta - _to_numpy(dlse.float())
    lse, delta = in_rows(_to_numpy(lse), rows), in_rows(delta, rows)
    dq_sum = np.zeros((1, 1, 1, 16) if dq_plan else dq_sum_shape(*q.shape), np.float32)
    out = emulate(attention_bwd, q, k, v, do, lse, delta, dq_sum,
                  np.zeros_like(k), np.zeros_like(v), scale, grid=grid, **run, **consts)
    dtype = views[0].dtype
    if dq_plan is None:                                              # as on the GPU
        fgrid, fconsts = dq_finish_launch(q.shape)
        dq = _from_numpy(emulate(attention_bwd_dq_finish, out["dq"], np.zeros_like(q),
                                 grid=fgrid, **run, **fconsts)["dq"], dtype)
    else:
        dq = _from_numpy(emulate(attention_bwd_dq, q, k, v, do, lse, delta,
                                 np.zeros_like(q), scale, grid=dq_plan[0], **run,
                                 **dq_plan[1])["dq"], dtype)
    return _bhnd(dq), _bhnd(_from_numpy(out["dk"], dtype)), _bhnd(_from_numpy(out["dv"], dtype))


@_attention_bwd.register_fake
def _(do, q, k, v, o, lse, dlse, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = _attention_bwd(do, q, k, v, o, lse, dlse, ctx.causal, ctx.scale,
                                ctx.deterministic)
    return dq, dk, dv, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@replayable
def attention(q, k, v, causal: bool = False, scale: float | None = None,
              return_lse: bool = False, deterministic: bool = False):
    """Scaled dot-product attention on (batch, seq, heads, head_dim) tensors, as
    FlashAttention's `flash_attn_func` takes them: O = softmax(Q K^T * scale) V per head,
    bfloat16 or float16, head dim 64 or 128, Hq a multiple of Hkv (grouped-query attention:
    head h reads key/value head h // (Hq / Hkv)), any sequence lengths (Nq and Nk may
    differ), `causal` aligned to the bottom right (query i sees keys up to i + Nk - Nq; a
    query that sees no key gives 0), `scale` 1/sqrt(head_dim) by default. With
    return_lse=True also the log-sum-exp of each row's scores, (batch, heads, seq) float32
    (natural log; -inf where a row sees no key).

    Differentiable: the backward computes dQ, dK, dV (summed over each key/value head's
    group) with `attention_bwd`. deterministic=True guarantees bitwise-repeatable gradients
    (dQ summed in a fixed order by its own pass); otherwise the target's faster dQ schedule
    is used (Hopper: f32 reductions into dQ by the main pass; CDNA: the pass).

        >>> o = pykittens.ops.attention(q, k, v, causal=True)
        >>> o.float().square().sum().backward()
    """
    _check(q, k, v, scale, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    o, lse = _attention_fwd(q, k, v, bool(causal), scale, bool(deterministic))
    return (o, lse) if return_lse else o
