"""The NUMA study's four attention orders (arXiv:2511.02132; chiplet.mapping.attention_order):
bijections onto (batch, head, q block), where round-robin dispatch puts each GQA group's
workgroups (an "attention compute cluster", ACC), the modeled L2 ordering on MI300X, and
attention_fwd on gfx950 launched with every order in the lane emulator."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pykittens as pk
from pykittens import chiplet
from pykittens.chiplet import mapping as M
from pykittens.kernels.attention import attention_fwd, attention_fwd_launch
from pykittens.kernels.attention_cdna import MAPS, cdna_grid
from pykittens.targets import get

from test_attention_cdna import check, dense_inputs, reference

ORDERS = M.ATTENTION_ORDERS
SETTINGS = settings(max_examples=80, deadline=None)


def xcds_of_each_acc(order, b, h, qb, g, x):
    """{ACC: set of XCDs its workgroups run on} under round-robin dispatch."""
    pid = np.arange(b * h * qb)
    bb, hh, _ = M.attention_order(order, b, h, qb, g, x)(pid)
    acc = bb * (h // g) + hh // g
    xcd = M.dispatch_xcd(pid, x)
    return {int(a): set(xcd[acc == a].tolist()) for a in np.unique(acc)}


@SETTINGS
@given(b=st.integers(1, 3), kv=st.integers(1, 6), g=st.integers(1, 4), qb=st.integers(1, 17),
       x=st.sampled_from([1, 2, 3, 8]), order=st.sampled_from(ORDERS))
def test_every_order_is_a_bijection_onto_the_grid(b, kv, g, qb, x, order):
    h = kv * g
    m = M.attention_order(order, b, h, qb, g, x)
    n = b * h * qb
    assert m.grid == (b, h, qb) and m.size == n
    pid = np.arange(n)
    bb, hh, q = m(pid)
    assert bb.min() >= 0 and bb.max() < b and hh.min() >= 0 and hh.max() < h
    assert q.min() >= 0 and q.max() < qb
    assert np.array_equal(np.sort((bb * h + hh) * qb + q), pid)
    # the kernel's decode (stage functions only) is the same function
    got = M.attention_coords(order, pid, b, h, qb, g, x)
    assert all(np.array_equal(u, v) for u, v in zip(got, (bb, hh, q)))
    got = cdna_grid(pid, b, h, qb, g, x, order)
    assert all(np.array_equal(u, v) for u, v in zip(got, (bb, hh, q)))


def test_names_aliases_and_the_existing_orders_are_unchanged():
    b, h, qb, g = 2, 8, 3, 4
    pid = np.arange(b * h * qb)
    same = [("swizzled-head-first", M.attention_head_first(b, h, qb, g, 8)),
            ("head-first", M.attention_head_first(b, h, qb, g, 8)),
            ("naive-head-first", M.attention_naive(b, h, qb)),
            ("naive", M.attention_naive(b, h, qb)),
            ("block-first", M.attention_block_first(b, h, qb))]
    for name, want in same:
        got = M.attention_order(name, b, h, qb, g, 8)
        assert got == want and got.spec == want.spec
    assert M.attention_order("head-first", b, h, qb, g, 8).spec == "head-first"
    # naive block-first: the head fastest, then the q block, then the batch
    bb, hh, q = M.attention_order("naive-block-first", b, h, qb, g, 8)(pid)
    assert np.array_equal(hh, pid % h) and np.array_equal(q, (pid // h) % qb)
    assert np.array_equal(bb, pid // (h * qb))
    assert set(MAPS) == set(ORDERS) | set(M.ATTENTION_ALIASES)
    with pytest.raises(ValueError, match="unknown attention order 'zigzag'"):
        M.attention_order("zigzag", b, h, qb, g, 8)
    with pytest.raises(ValueError, match="not a multiple of kv_group=3"):
        M.attention_order("swizzled-block-first", b, h, qb, 3, 8)
    with pytest.raises(pk.KernelError, match="not 'zigzag'"):
        cdna_grid(pid, b, h, qb, g, 8, "zigzag")


@pytest.mark.parametrize("b,h,kv,qb", [(1, 64, 8, 64), (2, 32, 8, 5), (1, 16, 16, 3),
                                       (4, 8, 2, 7)])
def test_swizzled_head_first_keeps_each_acc_on_one_xcd(b, h, kv, qb):
    """B*H_kv a multiple of the 8 XCDs: every ACC in the aligned region, so every ACC's
    workgroups run on one XCD, and the ACCs are spread evenly over the XCDs."""
    x = get("gfx942").num_xcds
    assert x == 8 and b * kv % x == 0
    xcds = xcds_of_each_acc("swizzled-head-first", b, h, qb, h // kv, x)
    assert len(xcds) == b * kv and all(len(s) == 1 for s in xcds.values())
    owners = np.bincount([next(iter(s)) for s in xcds.values()], minlength=x)
    assert (owners == b * kv // x).all()


@SETTINGS
@given(b=st.integers(1, 3), kv=st.integers(1, 9), g=st.integers(1, 4), qb=st.integers(1, 12),
       x=st.sampled_from([2, 3, 8]))
def test_swizzled_orders_keep_their_aligned_windows_on_one_xcd(b, kv, g, qb, x):
    """Any shape: ACCs of the aligned region (head-first: one ACC per chunk; block-first: k
    ACCs per window) never leave their XCD."""
    h = kv * g
    for order, k in (("swizzled-head-first", 1),
                     ("swizzled-block-first", M.default_accs_per_window(kv, x))):
        aligned_accs = (b * kv // (x * k)) * x * k
        xcds = xcds_of_each_acc(order, b, h, qb, g, x)
        assert all(len(xcds[a]) == 1 for a in range(aligned_accs)), order
        for w in range(aligned_accs // k):            # a window's ACCs share one XCD
            assert len(set().union(*(xcds[a] for a in range(w * k, (w + 1) * k)))) == 1


def test_naive_block_first_spreads_a_gqa_group_over_all_xcds():
    """Many heads, GQA 8:1 on MI300X: the head-fastest grid sends the 8 query heads of each
    KV group to 8 different XCDs; naive head-first scatters the q blocks the same way."""
    x = get("gfx942").num_xcds
    for order in ("naive-block-first", "naive-head-first"):
        xcds = xcds_of_each_acc(order, 1, 64, 32, 8, x)
        assert len(xcds) == 8 and all(s == set(range(x)) for s in xcds.values()), order


def test_swizzled_block_first_differs_from_head_first_for_mha_only_in_order():
    """MHA with 32 heads on 8 XCDs: both swizzles give XCD x the same number of heads, but
    block-first walks k = 4 heads together (4 K/V heads live per XCD), head-first one."""
    b, h, qb, x = 1, 32, 6, 8
    pid = np.arange(b * h * qb)
    for order, live in (("swizzled-block-first", 4), ("swizzled-head-first", 1)):
        _, hh, _ = M.attention_order(order, b, h, qb, 1, x)(pid)
        xcd = M.dispatch_xcd(pid, x)
        first = hh[xcd == 0][:live * qb]               # XCD 0's first wave of work
        assert len(np.unique(first)) == live, order


def test_modeled_l2_swizzled_head_first_beats_naive_block_first_on_mi300x():
    """Many-head GQA (H=64, H_kv=8, N=8192) on gfx942: modeled L2 hit rate of swizzled
    head-first >= naive block-first's (an ordering, not a fitted number)."""
    op = chiplet.Attention(1, 64, 8192, 128, kv_heads=8)
    b, h, qb = op.grid
    x = get("gfx942").num_xcds
    res = {o: chiplet.simulate(op, M.attention_order(o, b, h, qb, op.group, x), "gfx942")
           for o in ("naive-block-first", "swizzled-head-first")}
    assert res["swizzled-head-first"].l2_hit_rate >= res["naive-block-first"].l2_hit_rate
    # K/V fit in the LLC either way: the order moves L2 traffic, not HBM traffic
    assert res["swizzled-head-first"].hbm_bytes == res["naive-block-first"].hbm_bytes


@pytest.mark.parametrize("order", ORDERS)
def test_attention_fwd_with_each_order_matches_float64(order, rng):
    """gfx950 lane emulator, 2 batches x 4 query heads (GQA 2:1) x 2 q blocks, causal, so
    that every order decodes a different (batch, head, q block) per workgroup."""
    b, hq, hkv, nq, nk, d = 2, 4, 2, 300, 100, 64
    q, k, v, o, lse = dense_inputs(rng, b, hq, hkv, nq, nk, d, "bf16")
    grid, consts = attention_fwd_launch({"q": q, "k": k, "v": v}, "gfx950", CAUSAL=1,
                                        MAP=order)
    assert consts["MAP"] == order and grid == (b * hq * 2,)
    scale = 1 / math.sqrt(d)
    got = pk.emulate(attention_fwd, q, k, v, o, lse, scale, grid=grid, target="gfx950",
                     **consts)
    want_o, want_lse = reference(q, k, v, scale, 1)
    check(got["o"].astype(np.float64), got["lse"], want_o, want_lse)


def test_the_orders_by_name_in_specs_and_candidates():
    """parse_mapping takes every order and alias; auto_mapping simulates the study's
    block-first orders beside naive and head-first."""
    from pykittens.chiplet import auto
    op = chiplet.Attention(1, 32, 8192, 128, kv_heads=8)
    for name in M.ATTENTION_ORDERS + tuple(M.ATTENTION_ALIASES):
        m = auto.parse_mapping(name, op, "gfx942")
        want = M.attention_order(name, *op.grid, op.group, 8)
        pid = np.arange(op.grid[0] * op.grid[1] * op.grid[2])
        assert all(np.array_equal(x, y) for x, y in zip(m(pid), want(pid))), name
    specs = {c.spec for c in auto.candidates(op, "gfx942")}
    assert {"naive-block-first", "swizzled-block-first", "head-first", "naive"} <= specs, specs
    with pytest.raises(ValueError, match="swizzled-head-first"):
        auto.parse_mapping("diagonal", op, "gfx942")
