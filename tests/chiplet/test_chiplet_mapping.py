"""Grid mappings: bijections for every grid size (ragged tails included), the XCD grouping they
promise, and the same mapping traced into a real kernel's prologue and emulated."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pykittens as pk
from pykittens import chiplet
from pykittens.chiplet import mapping as M

XCDS = st.sampled_from([1, 2, 3, 8])
SETTINGS = settings(max_examples=150, deadline=None)


def is_permutation(values, n) -> bool:
    v = np.asarray(values)
    return v.shape == (n,) and np.array_equal(np.sort(v), np.arange(n))


@SETTINGS
@given(n=st.integers(1, 3000), x=XCDS, c=st.integers(1, 70))
def test_xcd_chunk_is_a_bijection(n, x, c):
    assert is_permutation(M.xcd_chunk(np.arange(n), n, x, c), n)


@SETTINGS
@given(n=st.integers(1, 3000), x=st.sampled_from([2, 3, 8]), c=st.integers(1, 70))
def test_xcd_chunk_keeps_chunks_and_the_tail_on_one_xcd(n, x, c):
    pid = np.arange(n)
    lid = M.xcd_chunk(pid, n, x, c)
    xcd_of_lid = np.empty(n, np.int64)
    xcd_of_lid[lid] = M.dispatch_xcd(pid, x)
    aligned = (n // (x * c)) * x * c
    # every full chunk of C consecutive logical ids runs on one XCD ...
    chunks = xcd_of_lid[:aligned].reshape(-1, c)
    assert (chunks == chunks[:, :1]).all()
    # ... and the ragged tail is split into contiguous, balanced runs, one per XCD
    tail = xcd_of_lid[aligned:]
    assert (np.diff(tail) >= 0).all()
    counts = np.bincount(tail, minlength=x)
    assert counts.max() - counts.min() <= 1


def test_xcd_chunk_inverts_round_robin_like_hipkittens():
    # Algorithm 1, phase 1 (aligned region): xy_g = chunk*(X*C) + xcd*C + pos
    lid = M.xcd_chunk(np.arange(400), 400, 8, 25)
    assert list(lid[:9]) == [0, 25, 50, 75, 100, 125, 150, 175, 1]
    assert M.xcd_chunk(np.arange(10), 10, 1, 4).tolist() == list(range(10))


@SETTINGS
@given(rows=st.integers(1, 60), cols=st.integers(1, 60), w=st.integers(1, 20))
def test_grouped_is_a_bijection_onto_the_tile_grid(rows, cols, w):
    r, c = M.grouped(np.arange(rows * cols), rows, cols, w)
    assert r.min() >= 0 and r.max() < rows and c.min() >= 0 and c.max() < cols
    assert is_permutation(r * cols + c, rows * cols)


def test_grouped_walks_windows_column_by_column():
    r, c = M.grouped(np.arange(12), 5, 4, 2)
    assert list(zip(r[:6].tolist(), c[:6].tolist())) == [(0, 0), (1, 0), (0, 1), (1, 1),
                                                          (0, 2), (1, 2)]
    r, c = M.grouped(np.arange(20), 5, 4, 2)      # last window has one row
    assert list(zip(r[16:].tolist(), c[16:].tolist())) == [(4, 0), (4, 1), (4, 2), (4, 3)]
    r, c = M.grouped(np.arange(6), 2, 3, 1)       # W=1 is row-major
    assert r.tolist() == [0, 0, 0, 1, 1, 1] and c.tolist() == [0, 1, 2, 0, 1, 2]


@SETTINGS
@given(rows=st.integers(1, 45), cols=st.integers(1, 45), w=st.integers(1, 12),
       c=st.integers(1, 80), x=XCDS)
def test_gemm_presets_are_bijections(rows, cols, w, c, x):
    n = rows * cols
    for m in (M.gemm_row_major(rows, cols), M.gemm_grouped(rows, cols, w),
              M.gemm_xcd(rows, cols, w, c, x)):
        r, col = m(np.arange(n))
        assert is_permutation(r * cols + col, n), m.spec


@SETTINGS
@given(b=st.integers(1, 4), kv=st.integers(1, 6), g=st.integers(1, 4), qb=st.integers(1, 20),
       x=XCDS)
def test_head_first_keeps_each_kv_group_on_one_xcd(b, kv, g, qb, x):
    h = kv * g
    m = M.attention_head_first(b, h, qb, g, x)
    n = m.size
    pid = np.arange(n)
    bb, hh, q = m(pid)
    assert is_permutation((bb * h + hh) * qb + q, n)
    xcd = M.dispatch_xcd(pid, x)
    group = bb * kv + hh // g
    aligned = (n // (x * g * qb)) * x * g * qb
    lid = M.xcd_chunk(pid, n, x, g * qb)
    full = lid < aligned
    for key in np.unique(group[full]):
        assert len(np.unique(xcd[full & (group == key)])) == 1
    nb, nh, nq = M.attention_naive(b, h, qb)(pid)
    assert is_permutation((nb * h + nh) * qb + nq, n)


def test_compose_checks_sizes_and_specs_round_trip():
    with pytest.raises(ValueError, match="covers 10 ids"):
        M.compose("bad", M.XCDChunk(8, 4, 10), M.Grouped(3, 4))
    with pytest.raises(ValueError, match="window must be a positive integer"):
        M.Grouped(3, 4, 0)
    assert M.gemm_xcd(36, 36, 5, 25, 8).spec == "xcd:W=5,C=25"
    assert M.gemm_row_major(3, 4).spec == "row-major"
    assert M.attention_head_first(1, 4, 2, 2, 8).spec == "head-first"
    assert M.attention_head_first(1, 4, 2, 2, 8, chunk=3).spec == "head-first:C=3"


@pk.kernel(num_waves=1)
def tile_ids(rows_out: pk.gl[pk.i32, 2], cols_out: pk.gl[pk.i32, 2], MAP: pk.const = None):
    # The mapping is the kernel's prologue: a few scalar ops on the program id.
    pid = pk.program_id(0)
    row, col = chiplet.tile_of(MAP, pid)
    pk.store(rows_out, pk.full(pk.rt((1, 64), pk.i32), row), (pid, 0))
    pk.store(cols_out, pk.full(pk.rt((1, 64), pk.i32), col), (pid, 0))


@pytest.mark.parametrize("mapping", [M.gemm_xcd(7, 5, 3, 2, 8), M.gemm_xcd(36, 3, 5, 25, 8),
                                     M.gemm_row_major(4, 6)], ids=lambda m: m.spec)
def test_kernel_prologue_matches_numpy(mapping):
    n = mapping.size
    out = pk.emulate(tile_ids, np.full((n, 64), -1, np.int32), np.full((n, 64), -1, np.int32),
                     grid=n, target="gfx950", MAP=mapping)
    r, c = mapping(np.arange(n))
    np.testing.assert_array_equal(out["rows_out"], np.repeat(r[:, None], 64, 1))
    np.testing.assert_array_equal(out["cols_out"], np.repeat(c[:, None], 64, 1))


@pk.kernel(num_waves=1)
def head_ids(out: pk.gl[pk.i32, 2], X: pk.const = 8, G: pk.const = 2, H: pk.const = 6,
             QB: pk.const = 3):
    # Runtime grid size: the ragged tail of the chunking is computed from num_programs.
    pid = pk.program_id(0)
    lid = chiplet.xcd_chunk(pid, pk.num_programs(0), X, G * QB)
    b, h, q = chiplet.split(lid, (pk.num_programs(0) // (H * QB), H, QB))
    pk.store(out, pk.full(pk.rt((1, 64), pk.i32), (b * 100 + h) * 100 + q), (pid, 0))


def test_traced_head_first_with_runtime_grid_matches_numpy():
    n = 2 * 6 * 3
    got = pk.emulate(head_ids, np.zeros((n, 64), np.int32), grid=n, target="gfx950")["out"]
    b, h, q = M.attention_head_first(2, 6, 3, 2, 8)(np.arange(n))
    np.testing.assert_array_equal(got[:, 0], (b * 100 + h) * 100 + q)
    assert (got == got[:, :1]).all()


def test_prologue_compiles_for_gfx950():
    from pykittens.compiler import code_object, llvm_ir
    m = M.gemm_xcd(36, 36, 5, 25, 8)
    ir = llvm_ir(tile_ids, "gfx950", MAP=m)
    assert "select" in ir and "sdiv" in ir       # the chunk's tail test and the divisions
    assert code_object(tile_ids, "gfx950", MAP=m)[:4] == b"\x7fELF"
