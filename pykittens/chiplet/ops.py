"""Operator descriptions for the cache simulator: which tile blocks each workgroup reads.

A workgroup reads some blocks once when it starts (`prologue`, e.g. its Q block) and one
block from each `stream` at every step of its main loop (e.g. the A and B blocks of one K
step). A block is one cache object; its size is its bytes, with each contiguous row segment
rounded up to whole cache lines, since that is what a cache holds. Operands are assumed
contiguous along the reduction (K, or head_dim for attention): A and B both K-major, as in the
HipKittens GEMMs, and Q/K/V laid out [batch, heads, seq, head_dim].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import types as T


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_pos(what: str, **vals):
    for k, v in vals.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{what}: {k} must be a positive integer, got {v!r}")


def _dtype_bytes(name: str) -> int:
    if name not in T.DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(T.DTYPES)}")
    if T.DTYPES[name].packed != 1:          # sizes here count values, not stored pairs
        raise ValueError(f"dtype {name!r} packs {T.DTYPES[name].packed} values a byte; give "
                         "the operands' bytes: an 8-bit dtype with K / 2 (FP4 pairs)")
    return T.DTYPES[name].bytes


def _block_bytes(rows: int, row_bytes: int, line: int) -> int:
    return rows * _cdiv(row_bytes, line) * line


@dataclass(frozen=True)
class Stream:
    """Blocks a workgroup reads: item index `base[wg]` (per step: `base[wg] * steps + k`)."""
    name: str
    base: np.ndarray
    nbytes: int
    per_step: bool
    count: int          # distinct bases (items per step for per-step streams)


@dataclass(frozen=True)
class Gemm:
    """C[M, N] = A[M, K] @ B[K, N] with BM x BN output tiles; step k reads A block (row, k)
    of BM x BK and B block (col, k) of BN x BK."""
    m: int
    n: int
    k: int
    bm: int = 256
    bn: int = 256
    bk: int = 64
    dtype: str = "bf16"
    out_dtype: str = "bf16"

    kind = "gemm"

    def __post_init__(self):
        _check_pos("gemm", M=self.m, N=self.n, K=self.k, BM=self.bm, BN=self.bn, BK=self.bk)
        _dtype_bytes(self.dtype)
        _dtype_bytes(self.out_dtype)

    @property
    def grid(self) -> tuple[int, int]:
        return (_cdiv(self.m, self.bm), _cdiv(self.n, self.bn))

    @property
    def steps(self) -> int:
        return _cdiv(self.k, self.bk)

    @property
    def output_bytes(self) -> int:
        return self.m * self.n * _dtype_bytes(self.out_dtype)

    @property
    def step_flops(self) -> int:
        """Matrix FLOPs of one tile's main-loop step."""
        return 2 * self.bm * self.bn * self.bk

    def streams(self, coords, line: int) -> list[Stream]:
        row, col = coords
        seg = self.bk * _dtype_bytes(self.dtype)
        rows, cols = self.grid
        return [Stream("A", np.asarray(row), _block_bytes(self.bm, seg, line), True, rows),
                Stream("B", np.asarray(col), _block_bytes(self.bn, seg, line), True, cols)]

    def describe(self) -> str:
        return (f"gemm {self.m}x{self.n}x{self.k} {self.dtype}, tiles {self.bm}x{self.bn}, "
                f"BK {self.bk}")


@dataclass(frozen=True)
class Attention:
    """Flash-attention forward: workgroup (b, h, q_block) reads its BQ x D Q block once, then
    K and V blocks (BKV x D) of KV head h // (heads // kv_heads) for every KV step."""
    batch: int
    heads: int
    seq: int
    head_dim: int
    kv_heads: int | None = None
    bq: int = 256
    bkv: int = 64
    dtype: str = "bf16"

    kind = "attention"

    def __post_init__(self):
        _check_pos("attention", B=self.batch, H=self.heads, N=self.seq, D=self.head_dim,
                   BQ=self.bq, BKV=self.bkv, H_KV=self.kv)
        if self.heads % self.kv:
            raise ValueError(f"attention: kv_heads={self.kv} must divide heads={self.heads} "
                             f"(grouped-query attention shares one KV head per group)")
        _dtype_bytes(self.dtype)

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.batch, self.heads, _cdiv(self.seq, self.bq))

    @property
    def steps(self) -> int:
        return _cdiv(self.seq, self.bkv)

    @property
    def output_bytes(self) -> int:
        return self.batch * self.heads * self.seq * self.head_dim * _dtype_bytes(self.dtype)

    @property
    def step_flops(self) -> int:
        """Matrix FLOPs of one workgroup's KV step: Q K^T and P V."""
        return 4 * self.bq * self.bkv * self.head_dim

    def streams(self, coords, line: int) -> list[Stream]:
        b, h, q = (np.asarray(c) for c in coords)
        seg = self.head_dim * _dtype_bytes(self.dtype)
        qb = self.grid[2]
        kvh = b * self.kv + h // self.group
        nkv = self.batch * self.kv
        kv_bytes = _block_bytes(self.bkv, seg, line)
        return [Stream("Q", (b * self.heads + h) * qb + q, _block_bytes(self.bq, seg, line),
                       False, self.batch * self.heads * qb),
                Stream("K", kvh, kv_bytes, True, nkv),
                Stream("V", kvh, kv_bytes, True, nkv)]

    def describe(self) -> str:
        return (f"attention B={self.batch} H={self.heads} H_kv={self.kv} N={self.seq} "
                f"D={self.head_dim} {self.dtype}, BQ {self.bq}, BKV {self.bkv}")
