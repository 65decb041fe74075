"""Attention as a differentiable torch operator: the forward over the library's
`attention_fwd`, the backward (registered with torch's autograd) over `attention_bwd`."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels.attention import attention_fwd, attention_fwd_launch
from ..kernels.attention_bwd import (attention_bwd, attention_bwd_dq, attention_bwd_dq_finish,
                                     attention_bwd_launch, attention_bwd_prep, dq_sum_shape,
                                     stats_rows)
from .run import (HALVES as DTYPES, custom_op, kernel_output, placeholder, replayable, run,
                  target_of, zeroed_buffer)


def _check(q, k, v, scale, causal=False, op="attention", names=("q", "k", "v")):
    """The op's contract, each violation a message naming the op (`op`), the argument
    (`names`: how the op calls q, k and v) and the limit."""
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be (batch, seq, heads, head_dim), got "
                             f"{t.dim()} dims {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{op}: {name} is {t.dtype}; the kernels take bfloat16 or "
                            "float16 (convert with .to(torch.bfloat16))")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} needs a unit stride in its last dim (head "
                             "dim); pass .contiguous()")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{op}: {', '.join(names)} must share one dtype, got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"{op}: {', '.join(names)} are on {q.device}, {k.device}, {v.device}; "
                         "put them on one device")
    (b, nq, hq, d), (bk, nk, hkv, dk) = q.shape, k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if bk != b or dk != d:
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must agree "
                         "in batch and head dim")
    if d not in (64, 128):
        raise ValueError(f"{op}: head dim {d} is not supported; the kernels take 64 or "
                         "128")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{op}: {hq} query heads are not a multiple of {hkv} key/value "
                         "heads")
    if scale is not None:
        if isinstance(scale, (bool, str, bytes)) or not hasattr(scale, "__float__"):
            raise TypeError(f"{op}: scale must be a number (or None for "
                            f"1/sqrt(head_dim)), not {type(scale).__name__}")
        scale = float(scale)
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"{op}: scale must be a positive finite number, got {scale}")
    if not isinstance(causal, (bool, np.bool_)) and causal not in (0, 1):
        raise TypeError(f"{op}: causal must be True or False, not {causal!r}")


@custom_op("pykittens::attention_fwd")
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, nq, hq, _ = q.shape
    o = torch.empty_like(q)
    lse = kernel_output(q, (b, hq, nq), torch.float32)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    views = [x.transpose(1, 2) for x in (q, k, v, o)]       # (B, H, N, D)
    grid, consts = attention_fwd_launch({"q": views[0], "k": views[1], "v": views[2]},
                                        target_of(q), CAUSAL=int(causal))
    run(attention_fwd, dict(zip(("q", "k", "v", "o"), views), lse=lse, scale=scale), grid,
        consts, ("o", "lse"))
    return o, lse


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
    qv, kv, vv, dov, ov = (x.transpose(1, 2) for x in (q, k, v, do.contiguous(), o))
    rows = stats_rows(nq)                 # LSE and delta in rows the main pass copies by TMA
    (pgrid, pconsts), *plans = attention_bwd_launch(
        {"q": qv, "k": kv}, target_of(q), dq=_dq_schedule(deterministic), rows=rows,
        CAUSAL=int(causal))
    lse = in_rows(lse, rows)
    delta = kernel_output(lse, (b, hq, rows))[..., :nq]
    run(attention_bwd_prep, {"o": ov, "do": dov, "delta": delta}, pgrid, pconsts, ("delta",))
    if dlse is not None:                 # d lse / d s = P: folds into dS = P (dP - delta)
        delta -= dlse
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    main_and_dq((attention_bwd, attention_bwd_dq_finish, attention_bwd_dq), plans,
                dq_sum_shape(*qv.shape),
                {"q": qv, "k": kv, "v": vv, "do": dov, "lse": lse, "delta": delta,
                 "scale": scale}, *(x.transpose(1, 2) for x in (dq, dk, dv)))
    return dq, dk, dv


def main_and_dq(kernels, plans, sum_shape, common: dict, dq, dk, dv, finish_args=None):
    """The backward's main pass and dQ's plan (attention_bwd_launch or its packed twin):
    kernels = (main, finish, dq pass). With DQ_ATOMIC the main pass adds dQ into a zeroed
    f32 sum of `sum_shape` that the finish pass (given `finish_args` too) turns into dQ;
    otherwise dQ's own pass computes it and the main pass gets a placeholder it never
    touches."""
    main, finish, dq_pass = kernels
    (grid, consts), (qgrid, qconsts) = plans
    if consts.get("DQ_ATOMIC"):
        dq_sum = zeroed_buffer(dq, sum_shape, torch.float32)
        run(main, {**common, "dq": dq_sum, "dk": dk, "dv": dv}, grid, consts,
            ("dq", "dk", "dv"))
        run(finish, {"dq_sum": dq_sum, "dq": dq, **(finish_args or {})}, qgrid, qconsts,
            ("dq",))
        return
    run(main, {**common, "dq": placeholder(dq, 4, torch.float32), "dk": dk, "dv": dv}, grid,
        consts, ("dk", "dv"))
    run(dq_pass, {**common, "dq": dq}, qgrid, qconsts, ("dq",))


def in_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x (..., N) float32 in rows of `rows` elements, the first N of each viewed: x itself
    where it already is, else a copy in a new buffer."""
    n = x.shape[-1]
    if rows == n and x.is_contiguous():
        return x
    return x.new_empty(*x.shape[:-1], rows)[..., :n].copy_(x)


def _dq_schedule(deterministic: bool) -> str | None:
    """deterministic=True guarantees dQ's fixed order; otherwise the target's faster
    schedule (attention_bwd.default_dq)."""
    return "pass" if deterministic else None


@_attention_bwd.register_fake
def _(do, q, k, v, o, lse, dlse, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
    ctx.set_materialize_grads(False)   # an unused LSE's gradient: None, not zeros to subtract


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
    o, lse = _forward(q, k, v, causal, scale, deterministic)
    return (o, lse) if return_lse else o


def _forward(q, k, v, causal, scale, deterministic):
    """O and LSE of checked (batch, seq, heads, head_dim) inputs; scale None: 1/sqrt(D)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attention_fwd(q, k, v, bool(causal), scale, bool(deterministic))


@replayable
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False):
    """torch.nn.functional.scaled_dot_product_attention on (batch, heads, seq, head_dim)
    tensors, as `attention` computes it (its kernels, limits and backward): the output
    (batch, heads, L, head_dim) as torch's, laid out in memory as query is. What the
    kernels do not do is an error rather than a silent difference: no
    attn_mask, no dropout, and is_causal only where L == S (torch aligns the causal
    mask to the top left, `attention` to the bottom right; both agree at L == S).
    Differing head counts need enable_gqa=True, as in torch."""
    op = "scaled_dot_product_attention"
    if attn_mask is not None:
        raise ValueError(f"{op}: attn_mask is not supported (the kernels take no mask); "
                         "pass is_causal=True for a causal mask, or pack sequences of "
                         "different lengths for pykittens.ops.attention_varlen")
    if dropout_p != 0:
        raise ValueError(f"{op}: dropout_p={dropout_p} is not supported (the kernels have no "
                         "dropout); pass 0.0")
    if not isinstance(is_causal, (bool, np.bool_)) and is_causal not in (0, 1):
        raise TypeError(f"{op}: is_causal must be True or False, not {is_causal!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if isinstance(t, torch.Tensor) and t.dim() != 4:
            raise ValueError(f"{op}: {name} must be (batch, heads, seq, head_dim), got "
                             f"{t.dim()} dims {tuple(t.shape)}")
    if all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        (b, hq, L, e), (bk, hkv, S, ek) = query.shape, key.shape
        if tuple(value.shape) != tuple(key.shape):
            raise ValueError(f"{op}: key {tuple(key.shape)} and value {tuple(value.shape)} "
                             "differ (the kernels take one head dim and length for both)")
        if (bk, ek) != (b, e):
            raise ValueError(f"{op}: query {tuple(query.shape)} and key {tuple(key.shape)} "
                             "must agree in batch and head dim")
        if hq != hkv and not enable_gqa:
            raise ValueError(f"{op}: query has {hq} heads and key/value {hkv}; pass "
                             "enable_gqa=True for grouped-query attention (as torch asks)")
        if is_causal and L != S:
            raise ValueError(f"{op}: is_causal with query length {L} != key length {S}: "
                             "torch aligns that mask to the top left, pykittens' causal "
                             "attention to the bottom right (query i sees keys up to "
                             "i + S - L); use pykittens.ops.attention(query.transpose(1, 2), "
                             "..., causal=True) if that is what you mean")
    q, k, v = (t.transpose(1, 2) if isinstance(t, torch.Tensor) else t
               for t in (query, key, value))
    _check(q, k, v, scale, op=op, names=("query", "key", "value"))
    return _forward(q, k, v, is_causal, scale, False)[0].transpose(1, 2)
