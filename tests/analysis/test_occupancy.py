"""Occupancy against hand-worked cases: 512 unified registers per lane in granules of 8,
8 wave slots per SIMD, 4 SIMDs per CU, 64 KiB (gfx942) or 160 KiB (gfx950) LDS per CU."""
import pytest

from pykittens.analysis import waves_per_simd


@pytest.mark.parametrize("regs,waves,limit", [
    (1, 8, "wave slots"),       # tiny kernels are capped by the 8 wave slots
    (64, 8, "registers"),       # 512 / 64 = 8: registers and slots tie; registers named
    (65, 7, "registers"),       # 65 -> 72 allocated: 512 // 72 = 7
    (128, 4, "registers"),
    (256, 2, "registers"),      # the HipKittens 8-wave ping-pong budget
    (512, 1, "registers"),      # all of v0-v255 and a0-a255
])
def test_register_limit_one_wave_per_simd_workgroups(regs, waves, limit):
    o = waves_per_simd("gfx942", registers=regs, lds_bytes=0, waves_per_workgroup=4)
    assert (o.waves_per_simd, o.limited_by) == (waves, limit)
    assert o.by_lds is None


def test_whole_workgroups_only():
    # 8 waves put 2 on each SIMD; 168 registers allow 3 waves, but only 1 workgroup fits.
    o = waves_per_simd("gfx950", registers=168, lds_bytes=0, waves_per_workgroup=8)
    assert (o.waves_per_simd, o.workgroups_per_cu, o.by_registers) == (2, 1, 3)
    # 512 registers with 8 waves cannot be resident at all.
    assert waves_per_simd("gfx942", registers=512, lds_bytes=0,
                          waves_per_workgroup=8).waves_per_simd == 0


def test_small_workgroups_share_simds():
    # one-wave workgroups: 4 per "layer" of SIMDs; 170 -> 176 registers allows 2 per SIMD
    o = waves_per_simd("gfx942", registers=170, lds_bytes=0, waves_per_workgroup=1)
    assert (o.waves_per_simd, o.workgroups_per_cu) == (2, 8)


@pytest.mark.parametrize("target,lds,waves", [
    ("gfx942", 32 << 10, 2), ("gfx950", 32 << 10, 4),  # 2 resp. 5 workgroups; gfx950 regs cap 4
    ("gfx942", 64 << 10, 1), ("gfx950", 160 << 10, 1)])
def test_lds_limit(target, lds, waves):
    o = waves_per_simd(target, registers=128, lds_bytes=lds, waves_per_workgroup=4)
    assert o.waves_per_simd == waves


def test_out_of_range_inputs_are_errors():
    with pytest.raises(ValueError, match="exceed the 65536"):
        waves_per_simd("gfx942", registers=64, lds_bytes=96 << 10, waves_per_workgroup=4)
    with pytest.raises(ValueError, match="513 registers"):
        waves_per_simd("gfx950", registers=513, lds_bytes=0, waves_per_workgroup=4)
    with pytest.raises(ValueError, match="1..16 waves"):
        waves_per_simd("gfx950", registers=64, lds_bytes=0, waves_per_workgroup=17)
    with pytest.raises(ValueError, match="CDNA targets only"):
        waves_per_simd("sm_90a", registers=64, lds_bytes=0, waves_per_workgroup=4)
