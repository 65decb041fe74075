"""Rotary position embedding as a differentiable torch operator over the library's rope
kernel (its layout contract: pykittens/kernels/rope.py, docs/ops.md)."""
from __future__ import annotations

import torch

from ..kernels.rope import rope as rope_kernel, rope_launch
from .run import (check_same, check_tensor, custom_op, placeholder, replayable, run,
                  target_of)


@custom_op("pykittens::rope")
def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          positions: torch.Tensor | None, interleaved: bool, inverse: bool) -> torch.Tensor:
    out = x.new_empty(x.shape)
    if x.numel() == 0:
        return out
    half = cos.shape[1]
    if positions is not None and x.device.type == "cpu" and not \
            (0 <= int(positions.min()) and int(positions.max()) < cos.shape[0]):
        raise ValueError(f"rope: positions must index the {cos.shape[0]} rows of cos and "
                         f"sin, got {int(positions.min())}..{int(positions.max())}")
    if interleaved:                     # each angle twice: the kernel's table per column
        cos, sin = (t.repeat_interleave(2, dim=1) for t in (cos, sin))
    grid, consts = rope_launch(x.shape, half, interleaved, target_of(x),
                               INVERSE=int(inverse), POSITIONS=int(positions is not None))
    pos = placeholder(x, 2, torch.int32) if positions is None else positions
    run(rope_kernel, {"x": x, "cos": cos, "sin": sin, "pos": pos, "out": out}, grid, consts,
        ("out",))
    return out


@_rope.register_fake
def _(x, cos, sin, positions, interleaved, inverse):
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output):
    x, cos, sin, positions, interleaved, inverse = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.interleaved, ctx.inverse = interleaved, inverse


def _backward(ctx, dy):
    cos, sin, positions = ctx.saved_tensors
    dx = _rope(dy.contiguous(), cos, sin, positions, ctx.interleaved, not ctx.inverse)
    return dx, None, None, None, None, None


_rope.register_autograd(_backward, setup_context=_setup)


@replayable
def rope(x, cos, sin, interleaved: bool = False, positions=None):
    """Rotary position embedding of x (batch, seq, heads, head_dim), as FlashAttention's
    `apply_rotary_emb(x, cos, sin, interleaved)` takes it: cos and sin are (rows,
    rotary_dim / 2) tables, float32 or x's dtype; the first rotary_dim columns of every
    head rotate in pairs by the angles of row p: the token's index in its sequence, or
    positions[b, s] when a (batch, seq) or (seq,) integer tensor is given (CPU tensors
    check that every position has a row; on a GPU, where that would wait for the device,
    a position without a row rotates by cos = sin = 0). The other columns pass through.

    interleaved=False (GPT-NeoX): pairs (i, i + rotary_dim/2); True (GPT-J): (2i, 2i + 1).
    Pair (a, b) with angle row (c, s) becomes (a c - b s, b c + a s), in float32, rounded
    once. Differentiable in x (the gradient is the inverse rotation); cos and sin get no
    gradient, and passing ones that require it is an error."""
    check_tensor("rope", "x", x, dims=4)
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor("rope", name, t, dims=2)
        if t.dtype not in (torch.float32, x.dtype):
            raise TypeError(f"rope: {name} is {t.dtype}; give float32 tables or x's "
                            f"{x.dtype}")
        if t.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"rope: no gradient flows to {name}; pass "
                                      f"{name}.detach()")
    check_same("rope", cos=cos, sin=sin)
    if cos.device != x.device:
        raise ValueError(f"rope: x on {x.device}, cos on {cos.device}; put them on one "
                         "device")
    if cos.shape != sin.shape:
        raise ValueError(f"rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ")
    b, s, h, d = x.shape
    half = cos.shape[1]
    if not 0 < 2 * half <= d:
        raise ValueError(f"rope: cos and sin have {half} columns, so rotary_dim = {2 * half}"
                         f"; it must be in 1..head_dim ({d}) and even")
    if positions is None:
        if cos.shape[0] < s:
            raise ValueError(f"rope: cos and sin have {cos.shape[0]} rows but x has {s} "
                             "positions; give a row per position (or positions=)")
        pos = None
    else:
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or \
                positions.dtype == torch.bool:
            raise TypeError("rope: positions must be an integer tensor of row indices into "
                            "cos and sin")
        if positions.device != x.device:
            raise ValueError(f"rope: x on {x.device}, positions on {positions.device}; put "
                             "them on one device")
        if tuple(positions.shape) not in ((b, s), (s,)):
            raise ValueError(f"rope: positions {tuple(positions.shape)} must be (batch, seq) "
                             f"= ({b}, {s}) or (seq,) = ({s},)")
        pos = positions.expand(b, s).to(torch.int32).contiguous()
    return _rope(x, cos, sin, pos, bool(interleaved), False)
