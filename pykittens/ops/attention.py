"""Attention forward as a torch operator over the library's `attention_fwd`."""
from __future__ import annotations

import math
import os

import numpy as np
import torch

from ..kernels.attention import attention_fwd, attention_fwd_launch

DTYPES = (torch.bfloat16, torch.float16)
# the kernel schedule CPU tensors are emulated with (any pykittens target)
EMULATE_TARGET = os.environ.get("PYKITTENS_EMULATE_TARGET", "sm_90a")


def _check(q, k, v, scale):
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
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"attention: scale must be a positive finite number, got {scale}")


@torch.library.custom_op("pykittens::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    b, nq, hq, _ = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    views = [x.transpose(1, 2) for x in (q, k, v, o)]       # (B, H, N, D)
    if q.device.type == "cpu":
        return _emulate(views, lse, causal, scale)
    from ..runtime.launch import gpu_target, launch
    target = gpu_target(q.device.index or 0)
    grid, consts = attention_fwd_launch({"q": views[0], "k": views[1], "v": views[2]}, target,
                                        CAUSAL=int(causal))
    launch(attention_fwd, *views, lse, scale, grid=grid, **consts)
    return o, lse


def _emulate(views, lse, causal, scale):
    from .. import emulate
    arrays = [x.detach().contiguous() for x in views]       # (B, H, N, D), numpy-viewable
    dt = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[arrays[0].dtype]
    npy = [_to_numpy(x, dt) for x in arrays]
    grid, consts = attention_fwd_launch({"q": npy[0], "k": npy[1], "v": npy[2]},
                                        EMULATE_TARGET, CAUSAL=int(causal))
    out = emulate(attention_fwd, *npy, np.zeros(tuple(lse.shape), np.float32), scale,
                  grid=grid, target=EMULATE_TARGET, **consts)
    o = torch.from_numpy(out["o"].view(np.int16).copy()).view(arrays[0].dtype)
    return o.transpose(1, 2).contiguous(), torch.from_numpy(out["lse"].copy())


def _to_numpy(t, dt):
    import ml_dtypes
    np_dt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.float16
    return t.view(torch.int16).numpy().view(np_dt)


@_attention_fwd.register_fake
def _(q, k, v, causal, scale):
    b, nq, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, hq, nq), dtype=torch.float32)


def attention(q, k, v, causal: bool = False, scale: float | None = None,
              return_lse: bool = False):
    """Scaled dot-product attention on (batch, seq, heads, head_dim) tensors, as
    FlashAttention's `flash_attn_func` takes them: O = softmax(Q K^T * scale) V per head,
    bfloat16 or float16, head dim 64 or 128, Hq a multiple of Hkv (grouped-query attention:
    head h reads key/value head h // (Hq / Hkv)), any sequence lengths (Nq and Nk may
    differ), `causal` aligned to the bottom right (query i sees keys up to i + Nk - Nq; a
    query that sees no key gives 0), `scale` 1/sqrt(head_dim) by default. With
    return_lse=True also the log-sum-exp of each row's scores, (batch, heads, seq) float32
    (natural log; -inf where a row sees no key).

        >>> o = pykittens.ops.attention(q, k, v, causal=True)
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    _check(q, k, v, scale)
    o, lse = _attention_fwd(q, k, v, bool(causal), scale)
    return (o, lse) if return_lse else o
