"""pykittens as torch operators: `pykittens.ops.attention(q, k, v, causal=False, scale=None)`.

Each op is a `torch.library.custom_op` with a fake implementation, so it composes with
torch.compile. CUDA (or ROCm) tensors launch the library kernel on their GPU; CPU tensors run
the same kernel in the emulator (small shapes: it executes every lane of every wave in numpy),
so the op is tested without a GPU. Importing this module needs torch."""
from __future__ import annotations

from .attention import attention

__all__ = ["attention"]
