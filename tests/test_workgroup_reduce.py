"""pk.workgroup_sum / pk.workgroup_max: vectors combined across the waves of a workgroup
(through shared memory, between barriers), the same bits in every wave, on every target."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.ir.nodes import walk

from conftest import TARGETS

WAVES = 4


@pk.kernel(num_waves=WAVES)
def row_totals(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], R: pk.const = 1,
               C: pk.const = 256):
    """Rows r0.. of x, each wave a C-column share: out = row sum + row max, written by
    every wave over its own share (so a wave that saw another total shows)."""
    r0, c0 = pk.program_id(0) * R, pk.wave_id() * C
    t = pk.load(pk.rt((R, C), pk.f32), x, (r0, c0))
    total = pk.workgroup_sum(pk.row_sum(t))
    peak = pk.workgroup_max(pk.row_max(t))
    pk.store(out, pk.zeros(t.type) + total + peak, (r0, c0))


@pk.kernel(num_waves=WAVES)
def col_totals(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    """Column sums over 4 x 16 rows, each wave 16 of them; repeated in a loop (the
    scratch is reused: the reduction must keep a fast wave off a slow wave's slice)."""
    r0 = pk.wave_id() * 16
    acc = pk.zeros(pk.rv(pk.rt((16, 64), pk.f32), "col"))
    for _ in pk.range(3):
        t = pk.load(pk.rt((16, 64), pk.f32), x, (r0, 0))
        acc += pk.workgroup_sum(pk.col_sum(t))
    pk.store(out, pk.zeros(pk.rt((16, 64), pk.f32)) + acc, (r0, 0))


def _ordered_sum(x, axis):
    """Sums of each wave's share, added in wave order as the hardware does."""
    return sum(np.sum(part, axis=axis, keepdims=True, dtype=np.float32)
               for part in np.split(x, WAVES, axis=axis))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("R,C", [(1, 512), (4, 512), (16, 64)])
def test_row_vectors_combine_across_waves(target, R, C, rng):
    x = rng.standard_normal((2 * R, WAVES * C)).astype(np.float32)
    out = pk.emulate(row_totals, x, np.full_like(x, np.nan), grid=2, target=target,
                     R=R, C=C)["out"]
    ref = x.sum(1, keepdims=True, dtype=np.float64) + x.max(1, keepdims=True)
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5)
    # every wave holds the same bits: each row of out is one value
    assert (out == out[:, :1]).all()


@pytest.mark.parametrize("target", TARGETS)
def test_col_vectors_in_a_loop(target, rng):
    x = rng.standard_normal((WAVES * 16, 64)).astype(np.float32)
    out = pk.emulate(col_totals, x, np.full_like(x, np.nan), grid=1, target=target)["out"]
    ref = 3 * x.sum(0, dtype=np.float64)
    assert np.allclose(out, np.broadcast_to(ref, out.shape), rtol=1e-5, atol=1e-5)
    assert (out == out[:1]).all()


def test_one_wave_is_the_identity(rng):
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out = pk.emulate(row_totals, x, np.zeros_like(x), grid=2, target="sm_90a",
                     num_waves=1)["out"]
    assert np.allclose(out, x.sum(1, keepdims=True) + x.max(1, keepdims=True), rtol=1e-5)
    prog = compiler.lane_ir(row_totals, "sm_90a", num_waves=1)
    assert not any(op.kind == "barrier" for op in walk(prog.body))


@pytest.mark.parametrize("target", TARGETS)
def test_lowering_uses_shared_scratch_between_barriers(target):
    prog = compiler.lane_ir(row_totals, target, R=4, C=512)
    kinds = [op.kind for op in walk(prog.body)]
    # per reduction: barrier, store own slice, barrier, read all WAVES slices
    assert kinds.count("barrier") == 4
    assert kinds.count("lds_store") == 2 and kinds.count("lds_load") == 2 * WAVES
    scratch = [r for r in prog.regions if r.name.startswith("wgred")]
    assert [r.tile.shape for r in scratch] == [(WAVES * 4, 1)] * 2     # 4 rows per wave
    assert prog.lds_bytes >= sum(r.size for r in scratch)


@pytest.mark.parametrize("target,barrier,scratch_store", [
    ("sm_90a", "barrier.sync", "st.shared"), ("gfx942", "s_barrier", "ds_write"),
    ("gfx950", "s_barrier", "ds_write")])
def test_compiles_for_every_target(target, barrier, scratch_store):
    asm = compiler.assembly(row_totals, target, R=4, C=512)
    assert asm.count(barrier) >= 4 and scratch_store in asm


def test_needs_a_vector():
    @pk.kernel(num_waves=2)
    def bad(x: pk.gl[pk.f32, 2]):
        pk.workgroup_sum(pk.load(pk.rt((1, 256), pk.f32), x, (0, 0)))

    with pytest.raises(pk.KernelError, match="workgroup_sum: takes a register vector"):
        pk.emulate(bad, np.zeros((1, 256), np.float32), grid=1)
