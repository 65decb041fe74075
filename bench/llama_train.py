"""A small Llama-style model (token embedding, RMSNorm, grouped-query attention with rotary
embeddings, SwiGLU MLP, output head) trained for a few AdamW steps twice from the same
initial weights and batches: once with pykittens.ops.attention, once with torch's
scaled_dot_product_attention. The losses should agree step by step within bf16 tolerance.

    PYTHONPATH=. python3 bench/llama_train.py              # on the GPU (H200)
    PYTHONPATH=. python3 bench/llama_train.py --tiny       # a CPU-sized model (emulated)
Details go to $OUT/llama_train.json when OUT is set; a table is printed last.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    dim: int = 1024
    heads: int = 16
    kv_heads: int = 4
    layers: int = 4
    seq: int = 1024
    batch: int = 8
    steps: int = 10
    lr: float = 3e-4


TINY = Config(vocab=256, dim=128, heads=2, kv_heads=1, layers=1, seq=48, batch=1, steps=3,
              lr=3e-3)


def rotary(x, base=10000.0):
    """Rotary position embedding of (B, N, H, D) x (halves rotated)."""
    n, d = x.shape[1], x.shape[-1]
    freq = base ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float32) / (d // 2))
    ang = torch.arange(n, device=x.device, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, c: Config, attention):
        super().__init__()
        self.c, self.attention = c, attention
        hd = c.dim // c.heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(c.dim), torch.nn.RMSNorm(c.dim)
        self.wq = torch.nn.Linear(c.dim, c.heads * hd, bias=False)
        self.wkv = torch.nn.Linear(c.dim, 2 * c.kv_heads * hd, bias=False)
        self.wo = torch.nn.Linear(c.heads * hd, c.dim, bias=False)
        self.w13 = torch.nn.Linear(c.dim, 2 * 4 * c.dim, bias=False)
        self.w2 = torch.nn.Linear(4 * c.dim, c.dim, bias=False)

    def forward(self, x):
        c, (b, n, _) = self.c, x.shape
        hd = c.dim // c.heads
        h = self.norm1(x)
        q = self.wq(h).view(b, n, c.heads, hd)
        k, v = self.wkv(h).view(b, n, 2, c.kv_heads, hd).unbind(2)
        q, k = rotary(q), rotary(k)
        o = self.attention(*(t.to(torch.bfloat16) for t in (q, k, v)))
        x = x + self.wo(o.to(x.dtype).reshape(b, n, -1))
        gate, up = self.w13(self.norm2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(torch.nn.Module):
    def __init__(self, c: Config, attention):
        super().__init__()
        self.embed = torch.nn.Embedding(c.vocab, c.dim)
        self.blocks = torch.nn.ModuleList(Block(c, attention) for _ in range(c.layers))
        self.norm = torch.nn.RMSNorm(c.dim)
        self.head = torch.nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def pykittens_attention(q, k, v):
    import pykittens.ops as pko
    return pko.attention(q, k, v, causal=True)


def sdpa_attention(q, k, v):
    o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True,
                                       enable_gqa=k.shape[2] != q.shape[2])
    return o.transpose(1, 2)


def batch(c: Config, g) -> torch.Tensor:
    """(batch, seq + 1) tokens: a random phrase of 16 repeated, so that the model can learn
    to look back (the loss falls once attention finds the previous repeat)."""
    phrase = torch.randint(0, c.vocab, (c.batch, 16), generator=g)
    return phrase.repeat(1, (c.seq + 16) // 16)[:, :c.seq + 1]


def train(c: Config, attention, device, seed=0) -> list[float]:
    """Losses of c.steps AdamW steps on fixed token batches."""
    torch.manual_seed(seed)
    model = Llama(c, attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    losses = []
    for _ in range(c.steps):
        tokens = batch(c, g).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, c.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compare(c: Config, device) -> tuple[list[list], dict]:
    """Both runs and a row per step: loss with pykittens, with SDPA, relative difference."""
    t0 = time.time()
    ours = train(c, pykittens_attention, device)
    t1 = time.time()
    theirs = train(c, sdpa_attention, device)
    t2 = time.time()
    rows = [[i, f"{a:.5f}", f"{b:.5f}", f"{abs(a - b) / abs(b):.1e}"]
            for i, (a, b) in enumerate(zip(ours, theirs))]
    return rows, {"config": asdict(c), "device": str(device), "pykittens": ours,
                  "sdpa": theirs, "seconds": {"pykittens": t1 - t0, "sdpa": t2 - t1}}


def main() -> int:
    from pykittens.bench import text_table
    tiny = "--tiny" in sys.argv or not torch.cuda.is_available()
    c, device = (TINY, "cpu") if tiny else (Config(), "cuda")
    rows, details = compare(c, device)
    worst = max(abs(a - b) / abs(b) for a, b in zip(details["pykittens"], details["sdpa"]))
    ok = math.isfinite(worst) and worst < 2e-2
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "llama_train.json"), "w") as f:
            json.dump({**details, "worst_rel_diff": worst, "ok": ok}, f, indent=2)
    print(f"{c}\n{details['seconds']}")
    print(text_table(rows, ["step", "loss (pykittens)", "loss (SDPA)", "rel diff"]))
    print(f"worst relative difference {worst:.1e}: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
