"""Attention over packed batches of sequences of different lengths, as FlashAttention's
`flash_attn_varlen_func` takes them, as a differentiable torch operator: the forward over
`attention_fwd_varlen`, the backward over `attention_bwd_varlen` with dQ added into an f32
sum and finished (`attention_bwd_dq_finish_varlen`) or, with deterministic=True (and on
CDNA), by its own pass (`attention_bwd_dq_varlen`: the gradients are deterministic)."""
from __future__ import annotations

import math

import torch

from ..kernels.attention import attention_fwd_varlen, attention_fwd_varlen_launch
from ..kernels.attention_bwd import (attention_bwd_dq_finish_varlen, attention_bwd_dq_varlen,
                                     attention_bwd_prep, attention_bwd_varlen,
                                     attention_bwd_varlen_launch, dq_sum_shape, stats_rows)
from .attention import _check as _check_dense, _dq_schedule, in_rows, main_and_dq
from .run import custom_op, run, target_of

OP = "attention_varlen"


def _check(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    """The op's contract: (total, heads, head_dim) tensors checked as the dense op checks
    (batch, seq, heads, head_dim) ones, int32 offsets on their device, positive maxima."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"{OP}: {name} must be (total, heads, head_dim), packed along its "
                             f"first dim, got {t.dim()} dims {tuple(t.shape)}")
    _check_dense(*(t[None] if isinstance(t, torch.Tensor) else t for t in (q, k, v)), scale,
                 causal)
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            raise TypeError(f"{OP}: {name} must be a 1-D torch.int32 tensor of B + 1 offsets")
        if cu.device != q.device:
            raise ValueError(f"{OP}: {name} is on {cu.device} but q on {q.device}; put it on "
                             "q's device")
    if cu_q.shape[0] != cu_k.shape[0] or cu_q.shape[0] < 2:
        raise ValueError(f"{OP}: cu_seqlens_q and cu_seqlens_k must both hold B + 1 >= 2 "
                         f"offsets, got {cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise TypeError(f"{OP}: {name} must be an int >= 0 (the longest sequence), "
                            f"not {m!r}")


def _heads_first(*ts):
    """(total, H, D) tensors as the kernels' (H, total, D) views."""
    return [t.transpose(0, 1) for t in ts]


def _inputs(q, k, cu_q, cu_k):
    """What the packed launchers read: shapes and the offsets (v has k's shape)."""
    return {"q": q, "k": k, "v": k, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


# (not replayed: the outputs are zeroed by torch, rows outside every sequence kept 0)
@custom_op("pykittens::attention_varlen_fwd", replay=False)
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
         cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool, scale: float,
         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    o = torch.zeros_like(q)                   # rows outside every sequence stay 0
    lse = q.new_full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
    if q.numel() == 0 or max_q == 0:
        return o, lse
    qv, kv, vv, ov = _heads_first(q, k, v, o)
    grid, consts = attention_fwd_varlen_launch(_inputs(qv, kv, cu_q, cu_k), target_of(q),
                                               max_seqlen_q=max_q, CAUSAL=int(causal))
    run(attention_fwd_varlen, {"q": qv, "k": kv, "v": vv, "o": ov, "lse": lse,
                               "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "scale": scale},
        grid, consts, ("o", "lse"))
    return o, lse


@_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@custom_op("pykittens::attention_varlen_bwd", replay=False)       # (as the forward)
def _bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         o: torch.Tensor, lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
         max_q: int, max_k: int, causal: bool, scale: float, deterministic: bool
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if q.numel() == 0 or k.numel() == 0 or max_q == 0 or max_k == 0:
        return dq, dk, dv
    qv, kv, vv, dov, ov, dqv, dkv, dvv = _heads_first(q, k, v, do.contiguous(), o, dq, dk, dv)
    rows = stats_rows(lse.shape[-1])      # LSE and delta in rows the main pass copies by TMA
    (pgrid, pconsts), *plans = attention_bwd_varlen_launch(
        _inputs(qv, kv, cu_q, cu_k), target_of(q), max_seqlen_q=max_q,
        max_seqlen_k=max_k, rows=rows, dq=_dq_schedule(deterministic), CAUSAL=int(causal))
    lse = in_rows(lse, rows)
    delta = lse.new_empty((1, lse.shape[0], rows))[..., :lse.shape[-1]]
    run(attention_bwd_prep, {"o": ov[None], "do": dov[None], "delta": delta}, pgrid, pconsts,
        ("delta",))
    main_and_dq((attention_bwd_varlen, attention_bwd_dq_finish_varlen, attention_bwd_dq_varlen),
                plans, dq_sum_shape(cu_q.shape[0] - 1, qv.shape[0], max_q, qv.shape[2]),
                {"q": qv, "k": kv, "v": vv, "do": dov, "lse": lse, "delta": delta[0],
                 "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "scale": scale},
                dqv, dkv, dvv, finish_args={"cu_seqlens_q": cu_q})
    return dq, dk, dv


@_bwd.register_fake
def _(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.max_q, ctx.max_k, ctx.causal, ctx.scale = max_q, max_k, causal, scale
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)          # no zeros made (and launched) for the LSE


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = _bwd(do, q, k, v, o, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal,
                      ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: float | None = None,
                     deterministic: bool = False):
    """Attention over a packed batch, as FlashAttention's `flash_attn_varlen_func`: q
    (total_q, Hq, D), k and v (total_k, Hkv, D) hold B sequences one after another; int32
    `cu_seqlens_q` / `cu_seqlens_k` (B + 1, on the tensors' device) say where each starts
    (sequence b: rows cu[b] .. cu[b + 1]); max_seqlen_q / max_seqlen_k are the longest
    lengths (they size the grids). Per sequence the same contract as `attention`: bfloat16 or
    float16, head dim 64 or 128, GQA, `causal` aligned to the bottom right of each sequence,
    `scale` 1/sqrt(head_dim) by default; a sequence with no keys gives 0. Rows after the
    last sequence are left 0 in the output and the gradients. Differentiable in q, k, v;
    deterministic=True gives the same gradients bitwise on every run (dQ by its own pass,
    which costs time: without it, on Hopper, dQ is added into an f32 sum in no fixed
    order; CDNA always takes the pass).

        >>> cu = torch.tensor([0, 100, 350], dtype=torch.int32, device="cuda")
        >>> o = pykittens.ops.attention_varlen(q, k, v, cu, cu, 250, 250, causal=True)
    """
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    o, _ = _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                bool(causal), scale, bool(deterministic))
    return o
