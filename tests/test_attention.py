"""The library's attention_fwd (Hopper schedule) in the emulator against a float64 numpy
reference, at small ragged shapes: head dims 64 and 128, causal or not (Nq != Nk: the
diagonal aligned bottom-right), MHA and GQA, bf16 and f16, every named schedule, rows that
see no key, a max that jumps late (the lazy rescale's slow path); static checks of the
cubins; and pykittens.ops.attention on CPU tensors (emulated), its errors and torch.compile."""
import math

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels.attention import (attention_fwd, attention_fwd_launch,
                                         attention_fwd_varlen, attention_fwd_varlen_launch,
                                         hopper_schedules)
from conftest import needs_sass, rel_err

DT = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def reference(q, k, v, scale, causal):
    """float64 O and natural-log LSE of (B, H, N, D) arrays; GQA by repeating K/V heads;
    rows that see no key: O = 0, LSE = -inf."""
    hq, hkv, nq, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    kk = np.repeat(k.astype(np.float64), hq // hkv, axis=1)
    vv = np.repeat(v.astype(np.float64), hq // hkv, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * scale
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    lsum = p.sum(-1, keepdims=True)
    o = np.where(lsum > 0, p / np.where(lsum > 0, lsum, 1), 0) @ vv
    lse = np.where(lsum[..., 0] > 0, np.log(np.where(lsum > 0, lsum, 1))[..., 0] +
                   np.where(np.isfinite(m), m, 0)[..., 0], -np.inf)
    return o, lse


def run(q, k, v, causal, target="sm_90a", **over):
    scale = 1 / math.sqrt(q.shape[-1])
    grid, consts = attention_fwd_launch({"q": q, "k": k, "v": v}, target, CAUSAL=causal,
                                        **over)
    if consts.get("PERSISTENT"):
        grid = (3,)                              # fewer workgroups than tiles
    got = pk.emulate(attention_fwd, q, k, v, np.full(q.shape, np.nan, q.dtype),
                     np.full(q.shape[:3], np.nan, np.float32), scale, grid=grid,
                     target=target, **consts)
    return got["o"], got["lse"], reference(q, k, v, scale, causal)


def inputs(rng, b, hq, hkv, nq, nk, d, dt="bf16"):
    mk = lambda h, n: rng.standard_normal((b, h, n, d)).astype(DT[dt])  # noqa: E731
    return mk(hq, nq), mk(hkv, nk), mk(hkv, nk)


def check(o, lse, want, tol=1e-2):
    want_o, want_lse = want
    assert rel_err(o.astype(np.float64), want_o) < tol
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isinf(lse), ~seen)           # -inf exactly where no key is seen
    assert np.max(np.abs(lse[seen] - want_lse[seen]), initial=0) < 1e-4


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("shape", [(1, 2, 2, 130, 200), (1, 4, 1, 200, 130)])   # MHA, GQA 4:1
def test_attention_matches_float64(rng, d, causal, shape):
    q, k, v = inputs(rng, *shape, d)
    check(*run(q, k, v, causal))


@pytest.mark.parametrize("d", [64, 128])
def test_every_schedule_computes_the_same(rng, d):
    q, k, v = inputs(rng, 2, 2, 1, 140, 260, d, "f16")
    for name, over in hopper_schedules(d).items():
        for causal in (0, 1):
            if causal and over.get("PERSISTENT"):
                continue
            check(*run(q, k, v, causal, **over), tol=2e-3)


@pytest.mark.parametrize("order", ["naive-block-first", "swizzled-block-first",
                                   "naive-head-first"])
def test_hopper_tile_orders(rng, order):
    """The NUMA study's orders on Hopper (MAP): block-first ones take a one-dimensional grid
    decoded by chiplet.mapping.attention_coords (one XCD), head-first ones the (query block,
    head, batch) grid; every order computes the same attention, causal or not, with 3 query
    blocks of 6 heads in 2 KV groups of a batch of 2, and persistent too."""
    from pykittens.chiplet import mapping as chip
    q, k, v = inputs(rng, 2, 6, 2, 300, 200, 64, "f16")
    for causal in (0, 1):
        grid, _ = attention_fwd_launch({"q": q, "k": k, "v": v}, "sm_90a", CAUSAL=causal,
                                       MAP=order)
        nqb = -(-300 // (64 * 3))                 # D=64: 3 consumers, 192 rows a tile
        assert grid == ((2 * 6 * nqb,) if order.endswith("block-first") else (nqb, 6, 2))
        check(*run(q, k, v, causal, MAP=order), tol=2e-3)
    check(*run(q, k, v, 0, MAP=order, PERSISTENT=1), tol=2e-3)
    # the decode covers every tile once
    coords = {tuple(int(c) for c in chip.attention_coords(order, i, 2, 6, nqb, 3, 1))
              for i in range(2 * 6 * nqb)}
    assert len(coords) == 2 * 6 * nqb


def test_rows_that_see_no_key_and_a_late_maximum(rng):
    """Causal with Nq > Nk: the first Nq - Nk queries see no key (O = 0, LSE = -inf). A key
    whose scores dwarf the others in the last block moves the running max by far more
    than 8 after many blocks: the lazy rescale must take its slow path."""
    q, k, v = inputs(rng, 1, 2, 2, 300, 200, 64)
    k[:, :, 190] = (q[:, :, 290].astype(np.float32) * 4).astype(k.dtype)
    o, lse, want = run(q, k, v, 1)
    check(o, lse, want)
    assert np.all(o[:, :, :100] == 0) and np.all(np.isneginf(lse[:, :, :100]))
    check(*run(q, k, v, 1, LAZY=0))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
def test_packed_variable_lengths(rng, d, causal):
    """attention_fwd_varlen on Hopper: four sequences of different lengths packed along
    the rows (one with no queries, one with no keys, one longer than a block), each against
    its own float64 attention; rows outside every sequence stay untouched."""
    lq, lk = [50, 0, 200, 20], [70, 30, 260, 0]
    cq, ck = (np.cumsum([0] + n).astype(np.int32) for n in (lq, lk))
    hq, hkv = 4, 2
    q = rng.standard_normal((hq, cq[-1] + 5, d)).astype(DT["bf16"])    # 5 rows past the end
    k = rng.standard_normal((hkv, ck[-1], d)).astype(DT["bf16"])
    v = rng.standard_normal((hkv, ck[-1], d)).astype(DT["bf16"])
    i = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    grid, consts = attention_fwd_varlen_launch(i, "sm_90a", CAUSAL=causal)
    scale = 1 / math.sqrt(d)
    got = pk.emulate(attention_fwd_varlen, q, k, v, np.full(q.shape, 7.0, q.dtype),
                     np.full(q.shape[:2], 7.0, np.float32), cq, ck, scale, grid=grid,
                     target="sm_90a", **consts)
    for b in range(4):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lq[b] and not lk[b]:                  # no keys: O = 0, LSE = -inf
            assert not got["o"][:, rows].astype(np.float32).any()
            assert np.all(np.isneginf(got["lse"][:, rows]))
        elif lq[b]:
            want = reference(q[None, :, rows], k[None, :, keys], v[None, :, keys], scale,
                             causal)
            check(got["o"][None, :, rows], got["lse"][None, :, rows], want)
    assert np.all(got["o"][:, cq[-1]:] == 7.0) and np.all(got["lse"][:, cq[-1]:] == 7.0)


def test_launch_checks_name_the_limit(rng):
    q, k, v = inputs(rng, 1, 3, 2, 64, 64, 64)
    with pytest.raises(ValueError, match="3 query heads are not a multiple of 2"):
        attention_fwd_launch({"q": q, "k": k, "v": v}, "sm_90a")
    q, k, v = inputs(rng, 1, 2, 2, 64, 64, 32)
    with pytest.raises(ValueError, match="head dim 32 is not supported"):
        attention_fwd_launch({"q": q, "k": k, "v": v}, "sm_90a")


@pytest.mark.parametrize("d,causal", [(128, 0), (128, 1), (64, 0)])
@needs_sass
def test_hopper_cubin_has_no_spills_and_wgmma_in_the_loop(d, causal):
    """The launch defaults compile without spills or stack, with the wgmma groups of
    Q K^T (D / 16) and P V (BN / 16) in the main loop and no serialisation advisory."""
    shapes = {n: np.empty((1, 4, 256, d), np.float16) for n in "qkv"}
    _, consts = attention_fwd_launch(shapes, "sm_90a", CAUSAL=causal)
    rep = compiler.report(attention_fwd, "sm_90a", DT="bf16", **consts)
    assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, rep
    assert rep["loop_wgmma"] == d // 16 + consts["BN"] // 16
    assert rep["notes"] == []
    ptx = compiler.assembly(attention_fwd, "sm_90a", DT="bf16", **consts)
    assert "ex2.approx.ftz.f32" in ptx and "cp.async.bulk.tensor.4d" in ptx
    assert "stmatrix.sync.aligned" in ptx and "vote.sync.any" in ptx


# ---- pykittens.ops.attention on CPU tensors ----------------------------------------------------

torch = pytest.importorskip("torch")


def torch_reference(q, k, v, causal):
    o, lse = reference(*(x.transpose(1, 2).float().numpy() for x in (q, k, v)),
                       1 / math.sqrt(q.shape[-1]), causal)
    return np.swapaxes(o, 1, 2), lse


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_op_on_cpu_tensors(dtype):
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(1, 70, 4, 64, generator=g).to(dt)
    k = torch.randn(1, 90, 2, 64, generator=g).to(dt)
    v = torch.randn(1, 90, 2, 64, generator=g).to(dt)
    import pykittens.ops as pko
    o, lse = pko.attention(q, k, v, causal=True, return_lse=True)
    want_o, want_lse = torch_reference(q, k, v, True)
    assert o.shape == q.shape and o.dtype == dt and lse.shape == (1, 4, 70)
    assert rel_err(o.double().numpy(), want_o) < 1e-2
    assert np.max(np.abs(lse.numpy() - want_lse)) < 1e-4


@pytest.mark.parametrize("bad, msg", [
    (lambda q, k, v: (q.float(), k.float(), v.float()), "the kernels take bfloat16 or float16"),
    (lambda q, k, v: (q[..., :32], k[..., :32], v[..., :32]), "head dim 32 is not supported"),
    (lambda q, k, v: (q[:, :, :3], k, v), "3 query heads are not a multiple of 2"),
    (lambda q, k, v: (q, k, v[:, :5]), "k (1, 9, 2, 64) and v (1, 5, 2, 64) differ"),
    (lambda q, k, v: (q[0], k, v), "must be (batch, seq, heads, head_dim)"),
    (lambda q, k, v: (q.transpose(1, 3).contiguous().transpose(1, 3)[..., ::2], k, v),
     "unit stride in its last dim"),
    (lambda q, k, v: (q, k.half(), v.half()), "must share one dtype"),
])
def test_op_errors_name_the_argument_and_the_limit(bad, msg):
    import pykittens.ops as pko
    q = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 9, 2, 64, dtype=torch.bfloat16)
    v = torch.randn(1, 9, 2, 64, dtype=torch.bfloat16)
    with pytest.raises((ValueError, TypeError), match=msg.replace("(", r"\(").replace(")", r"\)")):
        pko.attention(*bad(q, k, v))
    with pytest.raises(ValueError, match="scale must be a positive"):
        pko.attention(q, k, v, scale=-1.0)


def test_op_under_torch_compile_fullgraph():
    import pykittens.ops as pko

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return pko.attention(q, k, v, causal=True) * 2 + 1

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=g, dtype=torch.bfloat16) for _ in range(3))
    eager = Block()(q, k, v)
    compiled = torch.compile(Block(), fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fq = torch.empty(2, 33, 8, 128, dtype=torch.float16)
        fk = torch.empty(2, 17, 2, 128, dtype=torch.float16)
        o, lse = pko.attention(fq, fk, fk, return_lse=True)
        assert o.shape == (2, 33, 8, 128) and lse.shape == (2, 8, 33)
