"""pk.discard: a window of dead scratch data. The emulator poisons exactly the window (so a
read after the discard shows), races with other waves' reads are reported, Hopper code
drops whole aligned lines from L2 after a wave sync and CDNA code emits nothing, and
column_sum's DISCARD=1 (the norms' partial rows) sums as before and leaves its input
poisoned."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.emulator.machine import Race
from pykittens.ir.errors import KernelError
from pykittens.kernels.rows import column_sum, column_sum_launch


@pk.kernel(num_waves=1)
def sum_then_drop(part: pk.gl["PT", 2], out: pk.gl[pk.f32, 1], PT: pk.const = None,
                  DROP: pk.const = 1, READ_AGAIN: pk.const = 0):
    """out[c] = the sum of part's 16 rows over 32 columns a workgroup; DROP: then discard
    them; READ_AGAIN: a (wrong) second read after the discard, added in."""
    tile = pk.rt((16, 32), pk.f32)
    c0 = pk.program_id(0) * 32
    t = pk.load(tile, part, (0, c0))
    if DROP:
        pk.discard(part, tile, (0, c0))
    if READ_AGAIN:
        t += pk.load(tile, part, (0, c0))
    pk.store(out, pk.col_sum(t), (c0,))


@pk.kernel(num_waves=2)
def other_wave_reads(part: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 1], BARRIER: pk.const = 0):
    """Wave 0 reads the window, wave 1 discards it: ordered only by a barrier."""
    tile = pk.rt((16, 32), pk.f32)
    with pk.if_(pk.wave_id() == 0):
        pk.store(out, pk.col_sum(pk.load(tile, part, (0, 0))), (0,))
    if BARRIER:
        pk.barrier()
    with pk.if_(pk.wave_id() == 1):
        pk.discard(part, tile, (0, 0))


def _part(rows=16, cols=64, dtype=np.float32):
    return (np.arange(rows * cols) % 97).astype(dtype).reshape(rows, cols)


def test_discard_poisons_the_window_only():
    x = _part(cols=80)                            # the second workgroup's window is cut at 80
    r = pk.emulate(sum_then_drop, x, np.zeros(80, np.float32), grid=3, target="sm_90a")
    np.testing.assert_array_equal(r["out"], x.sum(0))
    assert np.isnan(r["part"]).all()


def test_discard_keeps_what_lies_outside_the_window():
    x = _part(rows=20, cols=64)                  # rows 16..19 are outside every window
    r = pk.emulate(sum_then_drop, x, np.zeros(64, np.float32), grid=1, target="sm_90a")
    assert np.isnan(r["part"][:16, :32]).all()
    np.testing.assert_array_equal(r["part"][16:], x[16:])
    np.testing.assert_array_equal(r["part"][:16, 32:], x[:16, 32:])


def test_discard_poisons_integers_with_their_largest_value():
    x = _part(dtype=np.int32)

    @pk.kernel(num_waves=1)
    def drop_ints(part: pk.gl[pk.i32, 2]):
        pk.discard(part, pk.rt((16, 32), pk.f32), (0, 0))
    r = pk.emulate(drop_ints, x, grid=1, target="sm_90a")
    assert (r["part"][:, :32] == np.iinfo(np.int32).max).all()
    np.testing.assert_array_equal(r["part"][:, 32:], x[:, 32:])


def test_a_read_after_the_discard_shows_as_nan():
    """The planted bug: reading scratch after dropping it."""
    r = pk.emulate(sum_then_drop, _part(), np.zeros(64, np.float32), grid=2, target="sm_90a",
                   READ_AGAIN=1)
    assert np.isnan(r["out"]).all()


def test_another_waves_read_must_come_before_by_a_barrier():
    with pytest.raises(Race, match="race on global tensor"):
        pk.emulate(other_wave_reads, _part(), np.zeros(32, np.float32), grid=1,
                   target="sm_90a")
    r = pk.emulate(other_wave_reads, _part(), np.zeros(32, np.float32), grid=1,
                   target="sm_90a", BARRIER=1)
    np.testing.assert_array_equal(r["out"], _part()[:, :32].sum(0))


@pytest.mark.parametrize("bad, match", [
    (lambda t: pk.discard(pk.st((16, 32), pk.f32), pk.rt((16, 32), pk.f32), (0, 0)),
     "window of a global tensor"),
    (lambda t: pk.discard(t, pk.st((16, 32), pk.f32), (0, 0)), "register tile"),
])
def test_discard_refuses_what_it_cannot_drop(bad, match):
    @pk.kernel(num_waves=1)
    def k(part: pk.gl[pk.f32, 2]):
        bad(part)
    with pytest.raises(KernelError, match=match):
        pk.emulate(k, _part(), grid=1, target="sm_90a")


def _ll(target, **consts):
    return compiler.llvm_ir(sum_then_drop, target, PT="f32", **consts)


def test_hopper_drops_whole_aligned_lines_after_a_wave_sync():
    """A drop per run of the lane's elements (16 f32 of a 16 x 32 window: four runs of
    four), each behind its line test (where the next 128-byte boundary falls, the line's
    end inside the window and the tensor), after bar.warp.sync; ptxas takes the code."""
    ll = _ll("sm_90a")
    first = ll.index("discard.global.L2")
    assert ll.count("discard.global.L2") == 4
    assert "llvm.nvvm.bar.warp.sync" in ll[:first]
    assert ll.count(", 127") == 4
    assert "discard.global.L2" not in _ll("sm_90a", DROP=0)
    res = compiler.code_object(sum_then_drop, "sm_90a", PT="f32")
    if res.get("cubin"):
        assert res["cubin"]


def test_cdna_emits_nothing_for_a_discard():
    assert "discard" not in _ll("gfx942")
    assert _ll("gfx950") == _ll("gfx950", DROP=0)


@pytest.mark.parametrize("parts", [None, 48])
def test_column_sum_discarding_its_input_sums_as_before(parts):
    rng = np.random.default_rng(1)
    part = rng.standard_normal((48, 96)).astype(np.float32)
    grid, consts = column_sum_launch(96, parts, DISCARD=1)
    r = pk.emulate(column_sum, part, np.zeros(96, np.float32), grid=grid, target="sm_90a",
                   **consts)
    np.testing.assert_allclose(r["out"], part.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    assert np.isnan(r["part"]).all()
    grid, consts = column_sum_launch(96, parts, DISCARD=0)
    r = pk.emulate(column_sum, part, np.zeros(96, np.float32), grid=grid, target="sm_90a",
                   **consts)
    np.testing.assert_array_equal(r["part"], part)
