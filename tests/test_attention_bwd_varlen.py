"""The attention backward over packed batches (attention_bwd_varlen / attention_bwd_dq_varlen)
in the emulator, on Hopper's schedule and on CDNA's (gfx950, gfx942): sequences of different
lengths packed along the rows, the forward emulated on the same target, each sequence's dQ,
dK, dV against its own float64 gradients; a sequence with no queries or no keys gets zero
gradients; rows outside every sequence are left untouched. The code objects compile without
spills or scratch, and one CDNA code object runs on the ISA emulator."""
import math

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, isa
from pykittens.kernels.attention import attention_fwd_varlen, attention_fwd_varlen_launch
from pykittens.kernels.attention_bwd import (attention_bwd, attention_bwd_dq,
                                             attention_bwd_dq_finish_varlen,
                                             attention_bwd_dq_varlen, attention_bwd_launch,
                                             attention_bwd_prep, attention_bwd_varlen,
                                             attention_bwd_varlen_launch, dq_sum_shape)
from pykittens.kernels.attention_bwd_cdna import BLOCK_KEYS, DQ_ROWS, WAVES
from conftest import needs_amd_llvm, needs_ptxas, rel_err
from test_attention_bwd import DT, check, reference_grads

PAST = 5                                   # rows after the last sequence, never written
CDNA = ("gfx950", "gfx942")


def packed_backward(rng, lq, lk, hq, hkv, d, causal, dt="bf16", target="sm_90a",
                    isa_run=False, dq_schedule="pass"):
    """The forward and the three backward passes on `target` (the main and dQ passes on
    the ISA emulator with isa_run) over packed (H, total, D) tensors with PAST rows after
    the last sequence; checks every sequence's gradients and the untouched rows.
    dq_schedule="atomic": dQ added into the main pass's f32 sum, then finished."""
    cq, ck = (np.cumsum([0] + n).astype(np.int32) for n in (lq, lk))
    mk = lambda h, n: rng.standard_normal((h, n, d)).astype(DT[dt])  # noqa: E731
    q, do = mk(hq, cq[-1] + PAST), mk(hq, cq[-1] + PAST)
    k, v = mk(hkv, ck[-1] + PAST), mk(hkv, ck[-1] + PAST)
    i = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    scale, run = 1 / math.sqrt(d), dict(target=target)
    grid, consts = attention_fwd_varlen_launch(i, target, CAUSAL=causal)
    # the forward leaves the PAST rows' LSE at 0: finite, so a query block reading on past
    # the last sequence's end gets P != 0 there unless the backward masks those rows
    fwd = pk.emulate(attention_fwd_varlen, q, k, v, np.zeros_like(q),
                     np.zeros(q.shape[:2], np.float32), cq, ck, scale, grid=grid, **run,
                     **consts)
    (pg, pc), (mg, mc), (qg, qc) = attention_bwd_varlen_launch(i, target, CAUSAL=causal,
                                                                dq=dq_schedule)
    delta = pk.emulate(attention_bwd_prep, fwd["o"][None], do[None],
                       np.zeros((1,) + q.shape[:2], np.float32), grid=pg, **run,
                       **pc)["delta"][0]
    seven = lambda x: np.full(x.shape, 7.0, x.dtype)  # noqa: E731
    atomic = dq_schedule == "atomic"
    dq_sum = np.zeros(dq_sum_shape(len(lq), hq, max(lq), d) if atomic else (1, 1, 1, 16),
                      np.float32)
    out = pk.emulate(attention_bwd_varlen, q, k, v, do, fwd["lse"], delta, dq_sum, seven(k),
                     seven(v), cq, ck, scale, grid=mg, isa=isa_run, **run, **mc)
    if atomic:
        dq = pk.emulate(attention_bwd_dq_finish_varlen, out["dq"], seven(q), cq, grid=qg,
                        **run, **qc)["dq"]
    else:
        dq = pk.emulate(attention_bwd_dq_varlen, q, k, v, do, fwd["lse"], delta, seven(q), cq,
                        ck, scale, grid=qg, isa=isa_run, **run, **qc)["dq"]
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


# Five sequences: one with no queries, one longer than a key block (3 blocks of 128 keys on
# CDNA, 2 blocks of dQ rows), one with no keys, one with more queries than keys (causal: its
# first 50 rows see no key). Query blocks of 32 (CDNA) and 64 (Hopper) rows read on past the
# ends of the first, third and last sequences, into the next one's rows or the PAST rows.
LQ, LK = [50, 0, 200, 40, 90], [70, 30, 260, 0, 40]


@pytest.mark.parametrize("d,causal", [(64, 1), (128, 0)])
@pytest.mark.parametrize("target", ["sm_90a", *CDNA])
def test_packed_gradients_match_float64(rng, target, d, causal):
    """GQA 2:1, bf16."""
    packed_backward(rng, LQ, LK, 4, 2, d, causal, target=target)


@pytest.mark.parametrize("d,causal", [(64, 1), (128, 0)])
def test_packed_atomic_dq_schedule(rng, d, causal):
    """Hopper: dQ added into the main pass's per-sequence f32 sum and finished sequence by
    sequence (stored up to each end: the query blocks reading on past an end add nothing,
    and the rows after it are the next sequence's), GQA 2:1."""
    packed_backward(rng, LQ, LK, 4, 2, d, causal, dq_schedule="atomic")


def test_packed_atomic_dq_is_hoppers():
    i = {"q": np.empty((2, 64, 64), np.float16), "k": np.empty((2, 64, 64), np.float16),
         "cu_seqlens_q": np.array([0, 64], np.int32), "cu_seqlens_k": np.array([0, 64], np.int32)}
    with pytest.raises(ValueError, match="dq='atomic' is not available on gfx950: .* use "
                                         "dq='pass'"):
        attention_bwd_varlen_launch(i, "gfx950", dq="atomic")
    assert attention_bwd_varlen_launch(i, "sm_90a", dq=None)[1][1]["DQ_ATOMIC"] == 1


@pytest.mark.parametrize("target,d", [("sm_90a", 64), ("gfx950", 128), ("gfx942", 128)])
def test_packed_f16_mha(rng, target, d):
    """Causal, MHA, f16; a sequence whose queries outnumber its keys and one the other way."""
    packed_backward(rng, [130, 17], [64, 150], 2, 2, d, 1, "f16", target=target)


@pytest.mark.parametrize("target", CDNA)
def test_cdna_launch_plans(target):
    """The dense CDNA schedule's flat head-first grids, sized by the longest sequences;
    the prep pass on (1, Hq, total_q, D) views."""
    i = {"q": np.empty((4, 300, 64), np.float16), "k": np.empty((2, 500, 64), np.float16),
         "cu_seqlens_q": np.array([0, 40, 290], np.int32),
         "cu_seqlens_k": np.array([0, 300, 300], np.int32)}
    prep, main, dq = attention_bwd_varlen_launch(i, target, CAUSAL=1)
    assert prep == ((5, 4, 1), {"D": 64})
    common = {"D": 64, "CAUSAL": 1, "MAP": "head-first", "num_waves": WAVES, "TARGET": target}
    assert main == ((2 * 2 * -(-300 // BLOCK_KEYS),), {**common, "BM": 32})
    assert dq == ((2 * 4 * -(-250 // (DQ_ROWS * WAVES)),), {**common, "BN": 32})
    empty = {**i, "cu_seqlens_q": np.array([0, 0], np.int32),
             "cu_seqlens_k": np.array([0, 0], np.int32)}
    _, main, dq = attention_bwd_varlen_launch(empty, target)   # a block per head, idle
    assert main[0] == (2,) and dq[0] == (4,)
    with pytest.raises(ValueError, match="grid mapping 'zigzag'"):
        attention_bwd_varlen_launch(i, target, MAP="zigzag")


@pytest.mark.parametrize("d,causal", [(128, 1), (64, 0)])
@needs_ptxas
def test_packed_cubins_have_no_spills(d, causal):
    i = {"q": np.empty((4, 512, d), np.float16), "k": np.empty((2, 512, d), np.float16),
         "cu_seqlens_q": np.array([0, 200, 512], np.int32),
         "cu_seqlens_k": np.array([0, 300, 512], np.int32)}
    _, (_, main), (_, dq) = attention_bwd_varlen_launch(i, "sm_90a", CAUSAL=causal,
                                                        dq="pass")
    _, (_, amain), (_, fin) = attention_bwd_varlen_launch(i, "sm_90a", CAUSAL=causal)
    for kernel, consts in ((attention_bwd_varlen, main), (attention_bwd_dq_varlen, dq),
                           (attention_bwd_dq_finish_varlen, fin)):
        rep = compiler.report(kernel, "sm_90a", DT="bf16", **consts)
        assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, (kernel.name, rep)
    # the atomic schedule at D=128 spills as dense does, more with its three loops (blocks
    # cut by the causal mask, whole ones, the sequence's last): 180 bytes, faster than the
    # one masked loop's 64 on the H200 (docs/PERF.md)
    rep = compiler.report(attention_bwd_varlen, "sm_90a", DT="bf16", **amain)
    assert rep["spill_bytes"] <= (192 if d == 128 else 0), rep


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
@needs_amd_llvm
def test_packed_code_objects_have_no_spills(target, d):
    """Both packed passes, bf16 and f16, causal or not: no spilled register and no scratch,
    the dense schedule's 4 waves, LDS (Q and dO, or K and V: 32 rows each, two stages) and
    waves per SIMD, no wait-state hazard."""
    i = {"q": np.empty((4, 512, d), np.float16), "k": np.empty((2, 512, d), np.float16),
         "cu_seqlens_q": np.array([0, 200, 512], np.int32),
         "cu_seqlens_k": np.array([0, 300, 512], np.int32)}
    dense = {"q": np.empty((1, 4, 512, d)), "k": np.empty((1, 2, 512, d))}
    for causal in (0, 1):
        _, (_, main), (_, dq) = attention_bwd_varlen_launch(i, target, CAUSAL=causal)
        _, (_, dmain), (_, ddq) = attention_bwd_launch(dense, target, CAUSAL=causal)
        for kernel, consts, twin, tconsts in ((attention_bwd_varlen, main, attention_bwd, dmain),
                                              (attention_bwd_dq_varlen, dq, attention_bwd_dq, ddq)):
            for dt in ("bf16", "f16"):
                rep = compiler.report(kernel, target, DT=dt, **consts)
                where = (kernel.name, dt, causal, rep)
                assert rep["scratch_bytes"] == 0, where
                assert rep["vgpr_spill"] == rep["sgpr_spill"] == 0, where
                assert rep["num_waves"] == WAVES and rep["lds_bytes"] == 4 * 32 * d * 2, where
                occupancy = compiler.report(twin, target, DT=dt, **tconsts)[
                    "occupancy_waves_per_simd"]
                assert rep["occupancy_waves_per_simd"] == occupancy, where
                asm = compiler.assembly(kernel, target, DT=dt, **consts)
                assert isa.check_hazards(asm, target) == [], where


@pytest.mark.parametrize("target,d,dt", [("gfx950", 64, "bf16"), ("gfx942", 128, "f16")])
def test_packed_code_objects_compute_the_gradients(rng, target, d, dt):
    """The main and dQ passes' code objects on the ISA emulator: a causal GQA batch whose
    first sequence's query block reads on into the second's rows."""
    packed_backward(rng, [20, 30], [45, 25], 2, 1, d, 1, dt, target=target, isa_run=True)


# ---- pykittens.ops.attention_varlen: autograd on CPU tensors --------------------------------

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("causal,deterministic", [(False, False), (True, False), (True, True)])
def test_varlen_op_matches_torch_autograd_per_sequence(causal, deterministic):
    """ops.attention_varlen on a packed CPU batch (a sequence without queries, one without
    keys, GQA 2:1): the output and dQ, dK, dV of every sequence against torch autograd of
    the float64 reference on that sequence alone; rows after the last sequence get 0. dQ
    by the atomic schedule (the default) or its own pass (deterministic=True)."""
    import pykittens.ops as pko
    from test_attention_bwd import torch_reference
    lq, lk = [40, 0, 70, 25], [50, 20, 90, 0]
    cq, ck = (torch.tensor(np.cumsum([0] + n), dtype=torch.int32) for n in (lq, lk))
    g = torch.Generator().manual_seed(3)
    mk = lambda n, h: torch.randn(n, h, 64, generator=g).bfloat16().requires_grad_()  # noqa: E731
    q, k, v = mk(int(cq[-1]) + 3, 4), mk(int(ck[-1]) + 2, 2), mk(int(ck[-1]) + 2, 2)
    w = torch.randn(q.shape, generator=g)
    o = pko.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                             deterministic=deterministic)
    (o.float() * w).sum().backward()
    assert not o[int(cq[-1]):].any() and not q.grad[int(cq[-1]):].any()
    assert not k.grad[int(ck[-1]):].any() and not v.grad[int(ck[-1]):].any()
    for b in range(len(lq)):
        rows, keys = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if not lq[b] or not lk[b]:                  # no queries or no keys: 0 everywhere
            assert not o[rows].any() and not k.grad[keys].any() and not q.grad[rows].any()
            continue
        leaves64 = [x.detach()[s][None].double().requires_grad_()
                    for x, s in ((q, rows), (k, keys), (v, keys))]
        o64, _ = torch_reference(*leaves64, causal, 1 / 8)
        (o64 * w[rows][None].double()).sum().backward()
        assert rel_err(o[rows].double().detach().numpy(), o64[0].detach().numpy()) < 1e-2
        for x, s, x64 in zip((q, k, v), (rows, keys, keys), leaves64):
            assert rel_err(x.grad[s].double().numpy(), x64.grad[0].numpy()) < 1e-2, b


def test_varlen_op_errors_name_the_argument():
    import pykittens.ops as pko
    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D torch.int32 tensor"):
        pko.attention_varlen(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match=r"max_seqlen_q=5 is below the longest sequence .* 6"):
        pko.attention_varlen(q, q, q, cu, cu, 5, 6)
    with pytest.raises(ValueError, match="must be \\(total, heads, head_dim\\)"):
        pko.attention_varlen(q[None], q, q, cu, cu, 6, 6)


def test_varlen_op_under_torch_compile_fullgraph():
    import pykittens.ops as pko
    cu = torch.tensor([0, 30, 80], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(80, h, 64, generator=g).bfloat16().requires_grad_() for h in (2, 1, 1))

    def f(q, k, v):
        return pko.attention_varlen(q, k, v, cu, cu, 50, 50, causal=True).float().sum()

    eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
