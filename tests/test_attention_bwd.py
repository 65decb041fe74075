"""Attention backward: the library's attention_bwd_prep / attention_bwd / attention_bwd_dq
(Hopper schedule) in the emulator against float64 gradients written out from the math, at
small ragged shapes (head dims 64 and 128, causal or not, MHA and GQA, f32 atomics and the
deterministic dQ pass); static checks of the cubins; and pykittens.ops.attention's autograd on
CPU tensors against torch's autograd of a float64 reference, including under
torch.compile(fullgraph=True)."""
import math

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels.attention import attention_fwd, attention_fwd_launch
from pykittens.kernels.attention_bwd import (attention_bwd, attention_bwd_dq,
                                             attention_bwd_dq_finish, attention_bwd_launch,
                                             attention_bwd_prep, dq_sum_shape)
from conftest import needs_ptxas, rel_err

DT = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def reference_grads(q, k, v, do, scale, causal):
    """float64 dQ, dK, dV of O = softmax(Q K^T scale) V for (B, H, N, D) arrays: GQA by
    repeating K/V heads and summing their gradients over the group; rows that see no key have
    P = 0."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    qd, kd, vd, dod = (x.astype(np.float64) for x in (q, k, v, do))
    kk, vv = np.repeat(kd, g, 1), np.repeat(vd, g, 1)
    s = qd @ kk.swapaxes(-1, -2) * scale
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    lsum = p.sum(-1, keepdims=True)
    p = np.where(lsum > 0, p / np.where(lsum > 0, lsum, 1), 0)
    o = p @ vv
    dp = dod @ vv.swapaxes(-1, -2)
    ds = p * (dp - (dod * o).sum(-1, keepdims=True))
    group_sum = lambda x: x.reshape(b, hkv, g, nk, d).sum(2)  # noqa: E731
    return (scale * ds @ kk, group_sum(scale * ds.swapaxes(-1, -2) @ qd),
            group_sum(p.swapaxes(-1, -2) @ dod))


def backward(q, k, v, do, causal, dq_schedule, **over):
    """The forward and the three backward passes, as ops.attention runs them on CPU (`over`:
    constants of the main pass, e.g. a schedule variant)."""
    scale, run = 1 / math.sqrt(q.shape[-1]), dict(target="sm_90a")
    grid, consts = attention_fwd_launch({"q": q, "k": k, "v": v}, "sm_90a", CAUSAL=causal)
    fwd = pk.emulate(attention_fwd, q, k, v, np.zeros_like(q),
                     np.zeros(q.shape[:3], np.float32), scale, grid=grid, **run, **consts)
    (pg, pc), (mg, mc), dq_plan = attention_bwd_launch(
        {"q": q, "k": k}, "sm_90a", dq=dq_schedule, CAUSAL=causal, **over)
    delta = pk.emulate(attention_bwd_prep, fwd["o"], do, np.zeros(q.shape[:3], np.float32),
                       grid=pg, **run, **pc)["delta"]
    nan = lambda x, dt=None: np.full(x.shape, np.nan, dt or x.dtype)  # noqa: E731
    out = pk.emulate(attention_bwd, q, k, v, do, fwd["lse"], delta,
                     np.zeros(dq_sum_shape(*q.shape), np.float32), nan(k), nan(v), scale,
                     grid=mg, **run, **mc)
    if dq_schedule == "pass":
        assert not out["dq"].any()                # the main pass leaves dQ to its own pass
        dq = pk.emulate(attention_bwd_dq, q, k, v, do, fwd["lse"], delta, nan(q), scale,
                        grid=dq_plan[0], **run, **dq_plan[1])["dq"]
    else:                                         # its f32 sum, relabelled and cast
        dq = pk.emulate(attention_bwd_dq_finish, out["dq"], nan(q), grid=dq_plan[0], **run,
                        **dq_plan[1])["dq"]
    return (dq, out["dk"], out["dv"]), reference_grads(q, k, v, do, scale, causal)


def inputs(rng, b, hq, hkv, nq, nk, d, dt="bf16"):
    mk = lambda h, n: rng.standard_normal((b, h, n, d)).astype(DT[dt])  # noqa: E731
    return mk(hq, nq), mk(hkv, nk), mk(hkv, nk), mk(hq, nq)


def check(got, want, tol=1e-2):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert np.isfinite(g.astype(np.float64)).all(), name
        assert rel_err(g.astype(np.float64), w) < tol, name


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("shape", [(1, 2, 2, 130, 200), (1, 4, 2, 200, 100)])  # MHA, GQA 2:1
def test_gradients_match_float64(rng, d, causal, shape):
    """The default schedule: dQ by its own pass (key blocks in order)."""
    got, want = backward(*inputs(rng, *shape, d), causal, "pass")
    check(got, want)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
def test_atomic_dq_schedule(rng, d, causal):
    """dQ added into f32 by the main pass's TMA reductions, f16, a 4:1 group."""
    got, want = backward(*inputs(rng, 1, 4, 1, 150, 180, d, "f16"), causal, "atomic")
    check(got, want)


@pytest.mark.parametrize("dq_schedule,nq", [("atomic", 150), ("atomic", 152), ("pass", 150)])
def test_consumers_first(rng, monkeypatch, dq_schedule, nq):
    """Every pass (forward included) with each workgroup's last waves run first and a wait
    that passes keeping its wave running (the emulator's reverse wave order): a consumer
    wait that a barrier's phase parity let through early would read a stage too soon.
    150 query rows: a producer wave copies LSE and delta; 152: TMA does (STATS_TMA)."""
    monkeypatch.setenv("PYKITTENS_WAVE_ORDER", "reverse")
    got, want = backward(*inputs(rng, 1, 4, 2, nq, 260, 64), 1, dq_schedule)
    check(got, want)


@pytest.mark.parametrize("d,causal", [(128, 0), (64, 1)])
def test_atomic_dq_schedule_many_query_blocks(rng, d, causal):
    """The main pass over several query blocks of a 2:1 group: each step's LSE and delta
    arrive through the ring with its Q and dO, and dQ's product is staged while dK's runs."""
    got, want = backward(*inputs(rng, 1, 4, 2, 300, 180, d, "f16"), causal, "atomic")
    check(got, want)


@pytest.mark.parametrize("in_acc", [0, 1, 2, 3])
@pytest.mark.parametrize("d,causal", [(64, 0), (128, 1)])
def test_stats_before_or_after_the_products(rng, d, causal, in_acc):
    """S^T and dP^T start from -LSE / scale and -delta (STATS_IN_ACC=3, the launch's choice
    at D=128), or either from zero with its statistic subtracted after (0: both, at D=64)."""
    q, k, v, do = inputs(rng, 1, 4, 2, 200, 256, d)
    consts = attention_bwd_launch({"q": q, "k": k}, "sm_90a", dq="atomic")[1][1]
    assert consts["STATS_IN_ACC"] == (3 if d == 128 else 0)
    got, want = backward(q, k, v, do, causal, "atomic", STATS_IN_ACC=in_acc)
    check(got, want)


@pytest.mark.parametrize("dv_late,split", [(0, 0), (1, 0), (0, 1)])
def test_walk_variants(rng, dv_late, split):
    """The launch walks causal query blocks the mask cuts first, in a loop of their own
    (SPLIT_MASKED), and issues dV's product after dS is stored (DV_LATE); each alone, or
    neither, computes the same gradients (ragged lengths both ways, a 2:1 group)."""
    q, k, v, do = inputs(rng, 1, 4, 2, 200, 330, 64, "f16")
    def walk(dq, causal, d):
        shapes = {"q": np.empty((1, 4, 200, d)), "k": np.empty((1, 2, 330, d))}
        consts = attention_bwd_launch(shapes, "sm_90a", dq=dq, CAUSAL=causal)[1][1]
        return consts["DV_LATE"], consts["SPLIT_MASKED"]
    # the launch's choice: on for the atomic schedule and at D=64, by the H200's timings
    assert walk("atomic", 1, 128) == walk("pass", 1, 64) == walk("atomic", 0, 128) == (1, 1)
    assert walk("pass", 1, 128) == (0, 0)
    for q_, k_, v_, do_ in ((q, k, v, do), inputs(rng, 1, 4, 2, 330, 200, 128, "f16")):
        got, want = backward(q_, k_, v_, do_, 1, "atomic", DV_LATE=dv_late,
                             SPLIT_MASKED=split)
        check(got, want)


def test_causal_launches_take_the_longest_key_blocks_first(rng):
    """Causal: a flat grid, 4 heads' key blocks at a time in order of their work (the
    gradient tests above run it, 5 heads making a last group of 1 among them)."""
    q, k, _, _ = inputs(rng, 5, 2, 1, 64, 300, 64)
    (grid, consts) = attention_bwd_launch({"q": q, "k": k}, "sm_90a", CAUSAL=1)[1]
    assert grid == (3 * 5,) and consts["LONGEST_FIRST"] == 1
    assert attention_bwd_launch({"q": q, "k": k}, "sm_90a")[1][0] == (3, 1, 5)
    with pytest.raises(ValueError, match="LONGEST_FIRST orders causal launches"):
        attention_bwd_launch({"q": q, "k": k}, "sm_90a", LONGEST_FIRST=1)
    got, want = backward(*inputs(rng, 5, 2, 1, 64, 300, 64), 1, "atomic")
    check(got, want)


def test_rows_that_see_no_key_get_zero_gradients(rng):
    """Causal with Nq > Nk: the first Nq - Nk queries see no key (LSE = -inf); their dQ is 0
    and they add nothing to dK, dV."""
    q, k, v, do = inputs(rng, 1, 2, 2, 120, 40, 64)
    (dq, dk, dv), want = backward(q, k, v, do, 1, "atomic")
    assert not dq[:, :, :80].any()
    check((dq, dk, dv), want)


def test_launch_names_what_is_missing():
    shapes = {"q": np.empty((1, 2, 64, 96), np.float16), "k": np.empty((1, 2, 64, 96), np.float16)}
    with pytest.raises(ValueError, match="head dim 96 is not supported"):
        attention_bwd_launch(shapes, "sm_90a")
    shapes = {"q": np.empty((1, 2, 64, 64), np.float16), "k": np.empty((1, 2, 64, 64), np.float16)}
    with pytest.raises(ValueError, match="dq='fast'; choose one of"):
        attention_bwd_launch(shapes, "sm_90a", dq="fast")


def test_launch_copies_stats_by_tma_where_rows_allow():
    """LSE and delta rows of a multiple of 4 f32 elements (16 bytes) go by TMA."""
    for nq, want in ((256, 1), (130, 0)):
        shapes = {"q": np.empty((1, 2, nq, 64), np.float16),
                  "k": np.empty((1, 2, 64, 64), np.float16)}
        assert attention_bwd_launch(shapes, "sm_90a")[1][1]["STATS_TMA"] == want


@pytest.mark.parametrize("d,causal", [(128, 0), (64, 1)])
@needs_ptxas
def test_hopper_cubins_have_no_spills(d, causal):
    """The default schedule's passes compile without spills or stack. The atomic schedule's
    main pass holds, beside the four products (S^T, dP^T, dV, dK), dQ's product and its TMA
    reduction; at D=128 it spills a few loop-invariant shared-memory addresses (at most 128
    bytes), nothing more."""
    shapes = {"q": np.empty((1, 4, 512, d), np.float16), "k": np.empty((1, 2, 512, d), np.float16)}
    for dq in ("pass", "atomic"):
        plans = attention_bwd_launch(shapes, "sm_90a", dq=dq, CAUSAL=causal)
        third = attention_bwd_dq_finish if dq == "atomic" else attention_bwd_dq
        for kernel, plan in zip((attention_bwd_prep, attention_bwd, third), plans):
            rep = compiler.report(kernel, "sm_90a", DT="bf16", **plan[1])
            limit = 128 if (dq, d, kernel) == ("atomic", 128, attention_bwd) else 0
            assert rep["spill_bytes"] <= limit and rep["stack_bytes"] <= limit, (kernel.name, rep)
    _, (_, consts), _ = attention_bwd_launch(shapes, "sm_90a", dq="atomic", CAUSAL=causal)
    ptx = compiler.assembly(attention_bwd, "sm_90a", DT="bf16", **consts)
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile" in ptx
    assert ptx.count("wgmma.mma_async") >= 5
    # dQ's blocks reach the stage in 16-byte runs (relabelled), not the accumulator's pairs
    assert "st.shared.v4.b32" in ptx and "st.shared.v2" not in ptx


# ---- pykittens.ops.attention: autograd on CPU tensors ------------------------------------------

torch = pytest.importorskip("torch")


def torch_reference(q, k, v, causal, scale):
    """float64 attention and LSE in (B, N, H, D) by plain torch ops (autograd differentiates
    it)."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    nq, nk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + nk - nq,
                          -math.inf)
    return (torch.softmax(s, -1) @ v).transpose(1, 2), torch.logsumexp(s, -1)


def leaves(*shapes, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("causal,deterministic,dtype", [(False, False, "bfloat16"),
                                                        (True, True, "float16")])
def test_op_gradients_match_torch_autograd(causal, deterministic, dtype):
    """Gradients through O and through the LSE (return_lse=True) against torch autograd of
    the float64 reference."""
    op_gradients_match(causal, dtype, deterministic=deterministic)


def test_op_copies_ragged_stats_by_tma(monkeypatch):
    """The op keeps LSE and delta in rows of a multiple of 4 (70 queries: rows of 72), so
    the main pass copies them by TMA (the emulator checks the copies' alignment)."""
    import importlib
    opa = importlib.import_module("pykittens.ops.attention")   # the module, not the op
    seen = []

    def spy(*a, **kw):
        plans = attention_bwd_launch(*a, **kw)
        seen.append(plans[1][1]["STATS_TMA"])
        return plans
    monkeypatch.setattr(opa, "attention_bwd_launch", spy)
    op_gradients_match(True, "bfloat16")
    assert seen == [1]


def op_gradients_match(causal, dtype, **op_kwargs):
    """pykittens.ops.attention's gradients through O and the LSE on a ragged GQA case, against
    torch autograd of the float64 reference (also the CDNA schedules' test)."""
    import pykittens.ops as pko
    q, k, v = leaves((1, 70, 4, 64), (1, 90, 2, 64), (1, 90, 2, 64),
                     dtype=getattr(torch, dtype))
    w = torch.randn(1, 70, 4, 64, generator=torch.Generator().manual_seed(5))
    o, lse = pko.attention(q, k, v, causal=causal, return_lse=True, **op_kwargs)
    ((o.float() * w).sum() + 0.25 * lse.sum()).backward()
    leaves64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o64, lse64 = torch_reference(*leaves64, causal, 1 / 8)
    ((o64 * w.double()).sum() + 0.25 * lse64.sum()).backward()
    for x, x64 in zip((q, k, v), leaves64):
        assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
        assert rel_err(x.grad.double().numpy(), x64.grad.numpy()) < 1e-2


def test_op_backward_under_torch_compile_fullgraph():
    """A module with projections around the op: torch.compile(fullgraph=True) runs forward
    and backward with the same results as eager."""
    import pykittens.ops as pko

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.qkv = torch.nn.Linear(128, 3 * 128, dtype=torch.bfloat16)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, x.shape[1], 3, 2, 64).unbind(2)
            return pko.attention(q, k, v, causal=True).flatten(2)

    x = torch.randn(1, 48, 128, dtype=torch.bfloat16)
    results = []
    for model in (SelfAttention(), torch.compile(SelfAttention(), fullgraph=True)):
        xi = x.clone().requires_grad_()
        model(xi).float().square().sum().backward()
        results.append((xi.grad, model.qkv.weight.grad if hasattr(model, "qkv")
                        else model._orig_mod.qkv.weight.grad))
    (gx, gw), (cx, cw) = results
    assert torch.allclose(gx, cx) and torch.allclose(gw, cw)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fq = torch.empty(2, 33, 8, 128, dtype=torch.float16, requires_grad=True)
        fk = torch.empty(2, 17, 2, 128, dtype=torch.float16, requires_grad=True)
        pko.attention(fq, fk, fk).sum().backward()
        assert fq.grad.shape == fq.shape and fk.grad.shape == fk.shape


def test_training_script_matches_sdpa_on_cpu():
    """bench/llama_train.py's comparison at its CPU size: two AdamW steps of a one-layer
    model, pykittens attention (emulated) against torch SDPA, from the same weights."""
    import dataclasses
    from conftest import bench_script
    script = bench_script("llama_train")
    _, details = script.compare(dataclasses.replace(script.TINY, steps=2), "cpu")
    for ours, theirs in zip(details["pykittens"], details["sdpa"]):
        assert abs(ours - theirs) < 1e-3 * abs(theirs)


@pytest.mark.parametrize("hq,hkv,nq,nk,d,causal", [(2, 2, 40, 40, 64, False),
                                                    (4, 2, 33, 33, 64, True),
                                                    (2, 1, 24, 50, 128, False)])
def test_sdpa_matches_torchs_sdpa(hq, hkv, nq, nk, d, causal):
    """pykittens.ops.scaled_dot_product_attention drops in for torch's: the same
    (batch, heads, seq, head_dim) arguments and keywords, output and gradients against
    torch's own SDPA in float64 (an oracle apart from pykittens'), the output laid out as
    the query is."""
    import torch.nn.functional as F
    import pykittens.ops as pko
    q, k, v = leaves((1, hq, nq, d), (1, hkv, nk, d), (1, hkv, nk, d), seed=hq + nk)
    w = torch.randn(1, hq, nq, d, generator=torch.Generator().manual_seed(7))
    gqa = {"enable_gqa": True} if hq != hkv else {}
    o = pko.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
    assert o.shape == (1, hq, nq, d) and o.stride() == q.stride()
    (o.float() * w).sum().backward()
    leaves64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o64 = F.scaled_dot_product_attention(*leaves64, is_causal=causal, **gqa)
    (o64 * w.double()).sum().backward()
    assert rel_err(o.detach().double().numpy(), o64.detach().numpy()) < 1e-2
    for x, x64 in zip((q, k, v), leaves64):
        assert x.grad.shape == x.shape
        assert rel_err(x.grad.double().numpy(), x64.grad.numpy()) < 1e-2


@pytest.mark.parametrize("kwargs,shapes,msg", [
    ({"attn_mask": torch.ones(8, 8, dtype=torch.bool)}, None, "attn_mask is not supported"),
    ({"dropout_p": 0.1}, None, "dropout_p=0.1 is not supported"),
    ({}, ((1, 4, 8, 64), (1, 2, 8, 64)), "pass enable_gqa=True"),
    ({"is_causal": True}, ((1, 2, 8, 64), (1, 2, 16, 64)),
     "torch aligns that mask to the top left"),
    ({"is_causal": "yes"}, None, "is_causal must be True or False"),
    ({}, ((2, 8, 64), (2, 8, 64)), "query must be (batch, heads, seq, head_dim)"),
    ({}, ((1, 2, 8, 64), (1, 2, 8, 32)), "must agree in batch and head dim"),
    ({}, ((1, 2, 8, 80), (1, 2, 8, 80)), "scaled_dot_product_attention: head dim 80"),
    ({"scale": -1.0}, None, "scaled_dot_product_attention: scale must be a positive"),
])
def test_sdpa_refuses_what_the_kernels_do_not_do(kwargs, shapes, msg):
    """What torch's SDPA takes and the kernels cannot do is an error naming the argument
    and the way out, never a silently different result."""
    import pykittens.ops as pko
    qs, ks = shapes or ((1, 2, 8, 64), (1, 2, 8, 64))
    q, k = torch.zeros(qs, dtype=torch.bfloat16), torch.zeros(ks, dtype=torch.bfloat16)
    with pytest.raises((ValueError, TypeError)) as e:
        pko.scaled_dot_product_attention(q, k, k, **kwargs)
    assert msg in str(e.value)


def test_sdpa_under_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) over the drop-in traces without a graph break and
    gives eager's results."""
    import pykittens.ops as pko
    q, k, v = leaves((1, 2, 24, 64), (1, 2, 24, 64), (1, 2, 24, 64), seed=4)

    def f(q, k, v):
        return pko.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum()

    eager, compiled = f(q, k, v), torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)
