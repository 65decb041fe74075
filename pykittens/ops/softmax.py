"""Softmax over the last dim as a differentiable torch operator, over the library's softmax
and softmax_bwd row kernels."""
from __future__ import annotations

import torch

from ..kernels import exact_row_launch, softmax_grad_launch
from ..kernels.softmax import softmax as softmax_kernel, softmax_bwd
from .run import check_tensor, custom_op, replayable, run, target_of


@custom_op("pykittens::softmax")
def _softmax(x: torch.Tensor) -> torch.Tensor:
    y = x.new_empty(x.shape)
    if x.numel():
        grid, consts = exact_row_launch({"x": x}, target_of(x))
        run(softmax_kernel, {"x": x, "out": y}, grid, consts, ("out",))
    return y


@_softmax.register_fake
def _(x):
    return x.new_empty(x.shape)


@custom_op("pykittens::softmax_bwd")
def _softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    dx = y.new_empty(y.shape)
    if y.numel():
        grid, consts = softmax_grad_launch({"y": y}, target_of(y))
        run(softmax_bwd, {"y": y, "dy": dy, "dx": dx}, grid, consts, ("dx",))
    return dx


@_softmax_bwd.register_fake
def _(dy, y):
    return y.new_empty(y.shape)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_bwd(dy.contiguous(), y)


_softmax.register_autograd(_backward, setup_context=_setup)


@replayable
def softmax(input, dim: int = -1):
    """torch.softmax over the last dim (dim=-1 or input.dim() - 1), computed in float32 and
    rounded once to input's dtype (float32, bfloat16 or float16). Differentiable."""
    check_tensor("softmax", "input", input)
    if dim not in (-1, input.dim() - 1):
        raise NotImplementedError(f"softmax: the kernels reduce over the last dim, not dim "
                                  f"{dim}; move it last (input.transpose({dim}, -1)) and "
                                  "transpose the result back")
    n = input.shape[-1]
    return _softmax(input.reshape(-1, n)).view(input.shape)
