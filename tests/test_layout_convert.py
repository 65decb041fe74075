"""Register-level layout changes and index masks: pk.convert (an accumulator becoming the next
mma's operand), pk.transpose, vectors shared between tiles of one row layout, index tiles with
pk.where, division by a vector and the hardware exp2 — the pieces attention is made of.
Expected values come from numpy in float64, never from the layout tables."""
import math

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from conftest import rel_err

BF16 = ml_dtypes.bfloat16


def attention_ref(q, k, v, mask=None):
    s = q.astype(np.float64) @ k.astype(np.float64).T
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(1, keepdims=True)
    p = np.exp2(s - m)
    l_ = p.sum(1, keepdims=True)
    return (p / l_) @ v.astype(np.float64), (m + np.log2(l_))[:, 0]


@pk.kernel(num_waves=1)
def flash_rows(q: pk.gl[pk.bf16, 2], k: pk.gl[pk.bf16, 2], v: pk.gl[pk.bf16, 2],
               o: pk.gl[pk.f32, 2], lse: pk.gl[pk.f32, 1], BQ: pk.const = 16,
               BK: pk.const = 32, D: pk.const = 64, MMA: pk.const = 16, CAUSAL: pk.const = 0,
               WINDOW: pk.const = 0):
    """One wave, rows of Q: S = Q K^T, P = softmax(S) converted in registers into the A
    operand of O += P V. The running max / sum are vectors made for O (D wide) and used on S
    (BK wide)."""
    qa = pk.load(pk.rt((BQ, D), pk.bf16, role="a", mma=MMA), q)
    acc = pk.zeros(pk.rt((BQ, D), pk.f32, role="acc", mma=MMA))
    s_t = pk.rt((BQ, BK), pk.f32, role="acc", mma=MMA)
    m = pk.full(pk.rv(acc, "row"), -math.inf)
    l_ = pk.zeros(pk.rv(acc, "row"))
    nq, nk = q.shape[0], k.shape[0]
    for j in pk.range((nk + BK - 1) // BK):
        s = pk.zeros(s_t)
        pk.mma_ABt(s, qa, pk.load(pk.rt((BK, D), pk.bf16, "row", role="b", mma=MMA), k,
                                  (j * BK, 0)))
        rows, cols = pk.row_index(s, nk - nq), pk.col_index(s, j * BK)
        keep = cols < nk                                     # the ragged tail
        if CAUSAL:
            keep = keep & (cols <= rows)                     # diagonal offset nk - nq
        if WINDOW:
            keep = keep & (cols > rows - WINDOW)
        pk.where(keep, s, -math.inf, out=s)
        m_new = pk.max(m, pk.row_max(s))
        base = pk.where(m_new > -math.inf, m_new, 0.0)       # rows with no key yet
        alpha = pk.exp2(m - base)
        p = pk.exp2(s - base)
        l_.set(l_ * alpha)
        pk.row_sum(p, into=l_)
        acc.set(acc * alpha)
        pa = pk.convert(pk.rt((BQ, BK), pk.bf16, role="a", mma=MMA), p)
        pk.mma_AB(acc, pa, pk.load(pk.rt((BK, D), pk.bf16, "col", role="b", mma=MMA), v,
                                   (j * BK, 0)))
        m.set(m_new)
    pk.store(o, acc / l_)
    pk.store(lse, m + pk.log2(l_), (0,))


@pk.kernel(num_waves=1)
def flash_cols(q: pk.gl[pk.bf16, 2], k: pk.gl[pk.bf16, 2], v: pk.gl[pk.bf16, 2],
               o: pk.gl[pk.f32, 2], BQ: pk.const = 32, BK: pk.const = 64, D: pk.const = 64,
               KRUN: pk.const = 4):                        # KRUN=0: the plain operand order
    """The transposed formulation CDNA converts in registers: S^T = K Q^T (queries along the
    accumulator's lanes), P^T converted into a krun=4 B operand, O^T += V^T P^T with V^T
    loaded in the same K order; O stored through pk.transpose."""
    qb = pk.load(pk.rt((BQ, D), pk.bf16, "row", role="b"), q)
    ot = pk.zeros(pk.rt((D, BQ), pk.f32, role="acc"))
    st_t = pk.rt((BK, BQ), pk.f32, role="acc")
    m = pk.full(pk.rv(st_t, "col"), -math.inf)
    l_ = pk.zeros(pk.rv(st_t, "col"))
    for j in pk.range(k.shape[0] // BK):
        st = pk.zeros(st_t)
        pk.mma_ABt(st, pk.load(pk.rt((BK, D), pk.bf16, "row", role="a"), k, (j * BK, 0)), qb)
        m_new = pk.max(m, pk.col_max(st))
        alpha = pk.exp2(m - m_new)
        p = pk.exp2(st - m_new)
        l_.set(l_ * alpha)
        pk.col_sum(p, into=l_)
        ot.set(ot * alpha)
        pt = pk.convert(pk.rt((BK, BQ), pk.bf16, "col", role="b", krun=KRUN or None), p)
        vt = pk.load(pk.rt((BK, D), pk.bf16, "col", role="a", krun=KRUN or None), v,
                     (j * BK, 0))
        pk.mma_AtB(ot, vt, pt)
        m.set(m_new)
    pk.store(o, pk.transpose(ot / l_))


def _inputs(rng, nq, nk, d):
    return (rng.standard_normal((nq, d)).astype(BF16), rng.standard_normal((nk, d)).astype(BF16),
            rng.standard_normal((nk, d)).astype(BF16))


@pytest.mark.parametrize("target,mma", [("sm_90a", 16), ("gfx950", 16), ("gfx942", 16)])
@pytest.mark.parametrize("causal,window", [(0, 0), (1, 0), (1, 24)])
def test_accumulator_becomes_the_next_operand(rng, target, mma, causal, window):
    q, k, v = _inputs(rng, 16, 100, 64)                # 100 keys: a ragged last block
    nq, nk = 16, 100
    rows = np.arange(nq)[:, None] + nk - nq
    cols = np.arange(nk)[None, :]
    mask = np.ones((nq, nk), bool)
    if causal:
        mask &= cols <= rows
    if window:
        mask &= cols > rows - window
    want_o, want_lse = attention_ref(q, k, v, mask)
    if target != "sm_90a":                # CDNA rows of S sit across lanes: the row form
        e = pytest.raises(pk.KernelError, pk.emulate, flash_rows, q, k, v,
                          np.zeros((nq, 64), np.float32), np.zeros(nq, np.float32), grid=1,
                          target=target, MMA=mma, CAUSAL=causal, WINDOW=window)
        assert "moves elements between lanes" in str(e.value) and "krun=4" in str(e.value)
        return
    got = pk.emulate(flash_rows, q, k, v, np.full((nq, 64), np.nan, np.float32),
                     np.full(nq, np.nan, np.float32), grid=1, target=target, CAUSAL=causal,
                     WINDOW=window)
    assert rel_err(got["o"], want_o) < 1e-2
    assert np.max(np.abs(got["lse"] - want_lse)) < 1e-4


@pytest.mark.parametrize("target", ["gfx950", "gfx942"])
def test_transposed_attention_converts_through_krun_operands(rng, target):
    q, k, v = _inputs(rng, 32, 128, 64)
    want, _ = attention_ref(q, k, v)
    got = pk.emulate(flash_cols, q, k, v, np.full((32, 64), np.nan, np.float32), grid=1,
                     target=target)["o"]
    assert rel_err(got, want) < 1e-2
    lane = compiler.emit(flash_cols, target, "lane")
    assert "lds_load(" not in lane and "lds_store(" not in lane   # registers only


def test_krun_must_match_between_operands(rng):
    q, k, v = _inputs(rng, 32, 128, 64)
    e = pytest.raises(pk.KernelError, pk.emulate, flash_cols, q, k, v,
                      np.zeros((32, 64), np.float32), grid=1, target="gfx950", KRUN=0)
    assert "moves elements between lanes" in str(e.value)

    @pk.kernel
    def mixed(x: pk.gl[pk.bf16, 2]):
        d = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
        a = pk.load(pk.rt((32, 16), pk.bf16, role="a", krun=4), x)
        b = pk.load(pk.rt((16, 32), pk.bf16, "col", role="b"), x)
        pk.mma_AB(d, a, b)

    e = pytest.raises(pk.KernelError, compiler.lane_ir, mixed, "gfx950")
    assert "must hold K in the same order" in str(e.value)
    e = pytest.raises(pk.NotSupportedYet, compiler.lane_ir, flash_cols, "sm_90a")
    assert "krun= is a CDNA operand layout" in str(e.value)


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "sm_90a"])
def test_transpose_is_a_view_of_the_same_registers(rng, target):
    @pk.kernel
    def twice(x: pk.gl[pk.f32, 2], a: pk.gl[pk.f32, 2], b: pk.gl[pk.f32, 2]):
        t = pk.load(pk.rt((16, 64), pk.f32), x)
        pk.store(a, pk.transpose(t))                       # (64, 16), 'col'
        acc = pk.load(pk.rt((32, 16), pk.f32, role="acc"), x)
        pk.store(b, acc.T.T.T, (0, 0))                     # (16, 32)

    x = rng.standard_normal((32, 64)).astype(np.float32)
    got = pk.emulate(twice, x, np.zeros((64, 16), np.float32), np.zeros((16, 32), np.float32),
                     grid=1, target=target)
    assert np.array_equal(got["a"], x[:16].T)
    assert np.array_equal(got["b"], x[:32, :16].T)
    lane = compiler.emit(twice, target, "lane")
    assert "lds_load(" not in lane and "bfly" not in lane


@pk.kernel(num_waves=1)
def relabelled(x: pk.gl[pk.f32, 2], acc_out: pk.gl[pk.f32, 2], back: pk.gl[pk.f32, 2]):
    """A generic (32, 32) tile read as a Hopper m16 accumulator (16, 64), and back."""
    acc = pk.relabel(pk.rt((16, 64), pk.f32, role="acc"), pk.load(pk.rt((32, 32), pk.f32), x))
    pk.store(acc_out, acc)
    pk.store(back, pk.relabel(pk.rt((32, 32), pk.f32), acc))


def test_relabel_reads_the_same_registers_in_another_layout(rng):
    """Lane l's register i, from the layouts as PTX documents them (not from the layout
    tables): in the generic tile (8 columns a lane, 4 lanes a row) element
    (l // 4 + 8 (i // 8), 8 (l % 4) + i % 8); in an m16n8 accumulator, tiled over 64 columns,
    (l // 4 + 8 ((i // 2) % 2), 8 (i // 4) + 2 (l % 4) + i % 2)."""
    x = rng.standard_normal((32, 32)).astype(np.float32)
    got = pk.emulate(relabelled, x, np.zeros((16, 64), np.float32), np.zeros_like(x), grid=1,
                     target="sm_90a")
    want = np.full((16, 64), np.nan, np.float32)
    for lane in range(32):
        for i in range(32):
            want[lane // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = \
                x[lane // 4 + 8 * (i // 8), 8 * (lane % 4) + i % 8]
    assert np.array_equal(got["acc_out"], want)
    assert np.array_equal(got["back"], x)                  # relabelled back: as it was
    lane_ir = compiler.emit(relabelled, "sm_90a", "lane")
    assert "bfly" not in lane_ir and "lds_load(" not in lane_ir  # no data moves


def test_relabel_names_what_does_not_match(rng):
    def build(src, dst):
        @pk.kernel(num_waves=1)
        def bad(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
            pk.store(out, pk.relabel(dst, pk.load(src, x)))
        return bad

    x = np.zeros((32, 64), np.float32)
    cases = ((pk.rt((16, 64), pk.f32), pk.rt((16, 32), pk.f32), "keeps the number of elements"),
             (pk.rt((16, 64), pk.f32), pk.rt((16, 64), pk.bf16), "keeps the element type"))
    for src, dst, msg in cases:
        with pytest.raises(pk.KernelError, match=msg):
            pk.emulate(build(src, dst), x, x, grid=1, target="sm_90a")


@pytest.mark.parametrize("target", ["gfx942", "sm_90a"])
def test_a_vector_broadcasts_over_any_tile_of_its_row_layout(rng, target):
    @pk.kernel
    def scale(x: pk.gl[pk.f32, 2], y: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        s = pk.load(pk.rt((16, 32), pk.f32, role="acc", mma=16), x)
        o = pk.load(pk.rt((16, 64), pk.f32, role="acc", mma=16), y)
        pk.store(out, o / pk.row_sum(s) - pk.row_max(o))

    x = rng.uniform(1, 2, (16, 32)).astype(np.float32)
    y = rng.standard_normal((16, 64)).astype(np.float32)
    got = pk.emulate(scale, x, y, np.zeros_like(y), grid=1, target=target)["out"]
    want = y / x.sum(1, keepdims=True) - y.max(1, keepdims=True)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    lane = compiler.emit(scale, target, "lane")
    assert len([ln for ln in lane.split("\n") if "op=recip" in ln]) == 1   # once per row


def test_vectors_of_tiles_in_other_lanes_are_an_error(rng):
    @pk.kernel
    def bad(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        s = pk.load(pk.rt((16, 64), pk.f32), x)                    # generic row layout
        o = pk.load(pk.rt((16, 64), pk.f32, role="acc", mma=16), x)
        pk.store(out, o - pk.row_max(s))

    x = rng.standard_normal((16, 64)).astype(np.float32)
    e = pytest.raises(pk.KernelError, pk.emulate, bad, x, x, grid=1, target="gfx950")
    assert "does not sit in the lanes of" in str(e.value) and "pk.convert" in str(e.value)


def test_where_needs_a_boolean_tile_of_the_same_layout(rng):
    @pk.kernel
    def bad(x: pk.gl[pk.f32, 2], C: pk.const = 0):
        t = pk.load(pk.rt((16, 64), pk.f32), x)
        if C == 0:
            pk.where(t, t, 0.0)
        else:
            pk.where(pk.col_index(pk.rt((16, 64), pk.f32, "col")) < 3, t, 0.0)

    x = np.ones((16, 64), np.float32)
    e = pytest.raises(pk.KernelError, pk.emulate, bad, x, grid=1)
    assert "needs a boolean tile" in str(e.value)
    e = pytest.raises(pk.KernelError, pk.emulate, bad, x, grid=1, C=1)
    assert "differ in shape or layout" in str(e.value)


def test_exp2_and_log2_use_the_hardware_instructions():
    ptx = compiler.assembly(flash_rows, "sm_90a")
    assert "ex2.approx.ftz.f32" in ptx and "lg2.approx.f32" in ptx
    asm = compiler.assembly(flash_cols, "gfx950")
    assert "v_exp_f32" in asm and "v_ldexp_f32" not in asm
