"""The attention backward over packed batches (attention_bwd_varlen / attention_bwd_dq_varlen,
Hopper schedule) in the emulator: sequences of different lengths packed along the rows, each
sequence's dQ, dK, dV against its own float64 gradients; rows outside every sequence left
untouched."""
import math

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels.attention import attention_fwd_varlen, attention_fwd_varlen_launch
from pykittens.kernels.attention_bwd import (attention_bwd_dq_varlen, attention_bwd_prep,
                                             attention_bwd_varlen,
                                             attention_bwd_varlen_launch)
from conftest import needs_ptxas
from test_attention_bwd import DT, check, reference_grads

PAST = 5                                   # rows after the last sequence, never written


def packed_backward(rng, lq, lk, hq, hkv, d, causal, dt="bf16"):
    cq, ck = (np.cumsum([0] + n).astype(np.int32) for n in (lq, lk))
    mk = lambda h, n: rng.standard_normal((h, n, d)).astype(DT[dt])  # noqa: E731
    q, do = mk(hq, cq[-1] + PAST), mk(hq, cq[-1] + PAST)
    k, v = mk(hkv, ck[-1] + PAST), mk(hkv, ck[-1] + PAST)
    i = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    scale, run = 1 / math.sqrt(d), dict(target="sm_90a")
    grid, consts = attention_fwd_varlen_launch(i, "sm_90a", CAUSAL=causal)
    fwd = pk.emulate(attention_fwd_varlen, q, k, v, np.zeros_like(q),
                     np.zeros(q.shape[:2], np.float32), cq, ck, scale, grid=grid, **run,
                     **consts)
    (pg, pc), (mg, mc), (qg, qc) = attention_bwd_varlen_launch(i, "sm_90a", CAUSAL=causal)
    delta = pk.emulate(attention_bwd_prep, fwd["o"][None], do[None],
                       np.zeros((1,) + q.shape[:2], np.float32), grid=pg, **run,
                       **pc)["delta"][0]
    seven = lambda x: np.full(x.shape, 7.0, x.dtype)  # noqa: E731
    out = pk.emulate(attention_bwd_varlen, q, k, v, do, fwd["lse"], delta, seven(k), seven(v),
                     cq, ck, scale, grid=mg, **run, **mc)
    dq = pk.emulate(attention_bwd_dq_varlen, q, k, v, do, fwd["lse"], delta, seven(q), cq, ck,
                    scale, grid=qg, **run, **qc)["dq"]
    for b in range(len(lq)):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        got = (dq[None, :, rows], out["dk"][None, :, keys], out["dv"][None, :, keys])
        if lq[b] and lk[b]:
            check(got, reference_grads(q[None, :, rows], k[None, :, keys], v[None, :, keys],
                                       do[None, :, rows], scale, causal))
        else:                              # no queries or no keys: every gradient is 0
            assert not any(g.astype(np.float32).any() for g in got), b
    for name, g, n in (("dq", dq, cq[-1]), ("dk", out["dk"], ck[-1]), ("dv", out["dv"], ck[-1])):
        assert np.all(g[:, n:] == 7.0), name


@pytest.mark.parametrize("d,causal", [(64, 1), (128, 0)])
def test_packed_gradients_match_float64(rng, d, causal):
    """Four sequences (one with no queries, one with no keys, one longer than a key block,
    one with more queries than keys), GQA 2:1."""
    packed_backward(rng, [50, 0, 200, 90], [70, 30, 260, 40], 4, 2, d, causal)


def test_packed_f16_mha(rng):
    packed_backward(rng, [130, 17], [64, 150], 2, 2, 64, 1, "f16")


def test_packed_backward_on_cdna_says_so():
    i = {"q": np.empty((2, 64, 64), np.float16), "k": np.empty((2, 64, 64), np.float16),
         "cu_seqlens_q": np.array([0, 64], np.int32), "cu_seqlens_k": np.array([0, 64], np.int32)}
    with pytest.raises(pk.NotSupportedYet, match="packed batches has no gfx950 schedule"):
        attention_bwd_varlen_launch(i, "gfx950")


@pytest.mark.parametrize("d,causal", [(128, 1), (64, 0)])
@needs_ptxas
def test_packed_cubins_have_no_spills(d, causal):
    i = {"q": np.empty((4, 512, d), np.float16), "k": np.empty((2, 512, d), np.float16),
         "cu_seqlens_q": np.array([0, 200, 512], np.int32),
         "cu_seqlens_k": np.array([0, 300, 512], np.int32)}
    _, (_, main), (_, dq) = attention_bwd_varlen_launch(i, "sm_90a", CAUSAL=causal)
    for kernel, consts in ((attention_bwd_varlen, main), (attention_bwd_dq_varlen, dq)):
        rep = compiler.report(kernel, "sm_90a", DT="bf16", **consts)
        assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, (kernel.name, rep)
