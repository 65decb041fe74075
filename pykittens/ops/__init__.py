"""pykittens as torch operators: attention, scaled_dot_product_attention, attention_varlen,
layer_norm, rms_norm, add_rms_norm, softmax,
rope, linear and matmul; tensor-parallel all_gather_linear and linear_reduce_scatter over a
torch.distributed group (docs/ops.md).

Each op is a `torch.library.custom_op` with a fake implementation, so it composes with
torch.compile, and autograd where the op has a backward; eager calls skip the custom op's
dispatch (ops.run.CustomOp). CUDA (or ROCm) tensors launch the
library kernels on their GPU; CPU tensors run the same kernels in the emulator (small
shapes: it executes every lane of every wave in numpy), so the ops are tested without a
GPU. Importing this module needs torch."""
from __future__ import annotations

from .attention import attention, scaled_dot_product_attention
from .attention_varlen import attention_varlen
from .comm import all_gather_linear, linear_reduce_scatter
from .matmul import linear, matmul
from .norms import add_rms_norm, layer_norm, rms_norm
from .rope import rope
from .softmax import softmax

__all__ = ["add_rms_norm", "all_gather_linear", "attention", "attention_varlen", "layer_norm", "linear", "linear_reduce_scatter", "matmul", "rms_norm",
           "rope", "scaled_dot_product_attention", "softmax"]
