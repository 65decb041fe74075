"""A Llama-style decoder block (pre-norm: RMSNorm, grouped-query attention with rotary
embeddings, SwiGLU MLP) written twice over one set of weights: with pykittens.ops for every
norm, rotation, attention and matrix product (the residual add fused into the second
RMSNorm), and with torch's own operators. On a GPU the script checks that forward and
backward agree and times forward+backward of both, and of torch.compile of the torch block;
on a CPU it only checks, at a tiny size (the pykittens kernels run in the emulator).

    PYTHONPATH=. python3 bench/llama_block.py            # on the GPU (H200)
    PYTHONPATH=. python3 bench/llama_block.py --tiny     # the CPU check
    PYKITTENS_CACHE=$PWD/.pkcache python3 bench/llama_block.py --prebuild   # no GPU: the
        # PTX of the GPU run's ops (attention's: bench/prebuild.py attention_bwd)
Details go to $OUT/llama_block.json when OUT is set; a table is printed last.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import pykittens.ops as pko


@dataclass(frozen=True)
class Config:
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    hidden: int = 14336            # the SwiGLU MLP's inner width
    seq: int = 2048
    batch: int = 2
    eps: float = 1e-5
    rope_base: float = 500000.0


TINY = Config(dim=128, heads=2, kv_heads=1, hidden=256, seq=48, batch=1)


def rope_tables(c: Config, device):
    """cos and sin (seq, head_dim / 2) of the GPT-NeoX rotation, float32."""
    hd = c.dim // c.heads
    freq = c.rope_base ** (-torch.arange(0, hd // 2, dtype=torch.float64) / (hd // 2))
    ang = torch.arange(c.seq, dtype=torch.float64)[:, None] * freq[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


class Block(torch.nn.Module):
    """One decoder block; `impl` is "pykittens" or "torch"."""

    def __init__(self, c: Config, impl: str, device="cpu", dtype=torch.bfloat16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        hd = c.dim // c.heads

        def param(*shape, scale):
            return torch.nn.Parameter((torch.randn(*shape, generator=g) * scale)
                                      .to(device=device, dtype=dtype))
        self.c, self.impl = c, impl
        self.norm1 = param(c.dim, scale=0.1)
        self.norm2 = param(c.dim, scale=0.1)
        with torch.no_grad():
            self.norm1 += 1
            self.norm2 += 1
        self.wqkv = param((c.heads + 2 * c.kv_heads) * hd, c.dim, scale=c.dim ** -0.5)
        self.wo = param(c.dim, c.heads * hd, scale=(c.heads * hd) ** -0.5)
        self.w13 = param(2 * c.hidden, c.dim, scale=c.dim ** -0.5)
        self.w2 = param(c.dim, c.hidden, scale=c.hidden ** -0.5)
        self.cos, self.sin = rope_tables(c, device)

    def forward(self, x):
        c, (b, n, _) = self.c, x.shape
        hd = c.dim // c.heads
        ops = _PYKITTENS if self.impl == "pykittens" else _TORCH
        h = ops.rms_norm(x, self.norm1, c.eps)
        qkv = ops.linear(h, self.wqkv).view(b, n, c.heads + 2 * c.kv_heads, hd)
        q, k, v = qkv.split([c.heads, c.kv_heads, c.kv_heads], dim=2)
        q, k = ops.rope(q, self.cos, self.sin), ops.rope(k, self.cos, self.sin)
        o = ops.attention(q, k, v)
        h, s = ops.add_rms_norm(ops.linear(o.reshape(b, n, -1), self.wo), x, self.norm2, c.eps)
        gate, up = ops.linear(h, self.w13).chunk(2, dim=-1)
        return s + ops.linear(F.silu(gate) * up, self.w2)


class _PYKITTENS:
    @staticmethod
    def rms_norm(x, w, eps):
        return pko.rms_norm(x, (x.shape[-1],), w, eps)

    add_rms_norm = staticmethod(pko.add_rms_norm)
    linear = staticmethod(pko.linear)
    rope = staticmethod(pko.rope)

    @staticmethod
    def attention(q, k, v):
        return pko.attention(q, k, v, causal=True)


class _TORCH:
    @staticmethod
    def rms_norm(x, w, eps):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    @staticmethod
    def add_rms_norm(x, residual, w, eps):
        s = x + residual
        return F.rms_norm(s, (s.shape[-1],), w, eps), s

    linear = staticmethod(F.linear)

    @staticmethod
    def rope(x, cos, sin):
        half = cos.shape[-1]
        c, s = cos[None, :x.shape[1], None, :], sin[None, :x.shape[1], None, :]
        lo, hi = x[..., :half].float(), x[..., half:].float()
        return torch.cat([lo * c - hi * s, hi * c + lo * s], -1).to(x.dtype)

    @staticmethod
    def attention(q, k, v):
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                           is_causal=True, enable_gqa=k.shape[2] != q.shape[2])
        return o.transpose(1, 2)


def _step(block, x, dy):
    """Forward and backward: the output and the gradients of x and every weight."""
    x = x.detach().requires_grad_()
    y = block(x)
    y.backward(dy)
    grads = [x.grad] + [p.grad for p in block.parameters()]
    return y.detach(), grads


def compare(c: Config, device, dtype=torch.bfloat16) -> dict:
    """pykittens and torch blocks (bf16) against torch in float64 (float32 on a GPU) from
    the same weights and input: the relative error of the output and of each gradient."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(c.batch, c.seq, c.dim, generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(c.batch, c.seq, c.dim, generator=g).to(device=device, dtype=dtype)
    exact = torch.float64 if device == "cpu" else torch.float32
    exact_block = Block(c, "torch", device, exact)
    ref = _step(exact_block, x.to(exact), dy.to(exact))
    names = ["y", "dx"] + [f"d{n}" for n, _ in exact_block.named_parameters()]
    out = {}
    for impl in ("pykittens", "torch"):
        y, grads = _step(Block(c, impl, device, dtype), x, dy)
        out[impl] = {n: float((a.to(exact) - r).norm() / r.norm())
                     for n, a, r in zip(names, [y] + grads, [ref[0]] + ref[1])}
    return out


def timings(c: Config, reps: int = 20) -> dict:
    """Median milliseconds of forward+backward on the GPU: pykittens, torch eager and
    torch.compile of the torch block."""
    import numpy as np
    x = torch.randn(c.batch, c.seq, c.dim, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    variants = {"pykittens": Block(c, "pykittens", "cuda"), "torch eager": Block(c, "torch", "cuda"),
                "torch.compile": torch.compile(Block(c, "torch", "cuda"))}
    out = {}
    for name, block in variants.items():
        for _ in range(3):                                 # compile, autotune, warm up
            _step(block, x, dy)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _step(block, x, dy)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        out[name] = float(np.median(times))
    return out


def prebuild() -> int:
    """The pykittens block's forward and backward at the GPU configuration on empty CPU
    tensors, every library launch replaced by its sm_90a build (bench/ops_bandwidth.py)."""
    import time
    from ops_bandwidth import builds_not_launches     # bench/, this script's directory
    t0, c = time.time(), Config()
    with builds_not_launches() as (built, _):
        block = Block(c, "pykittens")
        x = torch.zeros(c.batch, c.seq, c.dim, dtype=torch.bfloat16)
        _step(block, x, torch.zeros_like(x))
    print(f"{len(built)} builds in {time.time() - t0:.0f} s")
    return 0


def main() -> int:
    if "--prebuild" in sys.argv:
        return prebuild()
    from pykittens.bench import text_table
    gpu = torch.cuda.is_available() and "--tiny" not in sys.argv
    c, device = (Config(), "cuda") if gpu else (TINY, "cpu")
    errs = compare(c, device)
    worst = max(errs["pykittens"].values())
    ok = math.isfinite(worst) and worst < 2e-2
    rows = [[n, f"{errs['pykittens'][n]:.1e}", f"{errs['torch'][n]:.1e}"] for n in errs["torch"]]
    details = {"config": asdict(c), "device": device, "rel_err": errs, "ok": ok}
    if gpu:
        details["ms_fwd_bwd"] = timings(c)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "llama_block.json"), "w") as f:
            json.dump(details, f, indent=2)
    print(c)
    print(text_table(rows, ["tensor", "pykittens bf16 vs exact", "torch bf16 vs exact"]))
    if gpu:
        ms = details["ms_fwd_bwd"]
        print(text_table([[k, f"{v:.3f}", f"{ms['torch eager'] / v:.2f}x"] for k, v in ms.items()],
                         ["forward+backward", "ms", "speed vs torch eager"]))
    print(f"worst relative error {worst:.1e}: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

