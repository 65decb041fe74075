"""pk.timestamp: a wave records when and where it runs. In the emulators the timer is the
order of the timestamps and the place the round-robin dispatch (checked here from the
targets' XCD and CU counts, not from Target.emulated_place); the code reads the chips'
timers and ids (checked in the PTX and in the disassembly, whose register names come from
LLVM, not from pykittens' encodings); the ISA emulator agrees with the lane emulator; bad
records, rows shared by two waves and rows outside the record are handled."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, targets
from pykittens.emulator.machine import Race
from pykittens.ir.errors import KernelError
from pykittens.runtime.args import written_params


@pk.kernel(num_waves=2)
def stamped(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], rec: pk.gl[pk.i32, (None, 4)]):
    """Each wave doubles its two rows of x between a timestamp before and one after."""
    me = pk.program_id(0) * pk.num_waves() + pk.wave_id()
    pk.timestamp(rec, 2 * me)
    t = pk.load(pk.rt((2, 64), pk.f32), x, (me * 2, 0))
    pk.store(out, t * 2.0, (me * 2, 0))
    pk.timestamp(rec, 2 * me + 1)


@pk.kernel(num_waves=2)
def one_row_for_both(rec: pk.gl[pk.i32, (None, 4)]):
    pk.timestamp(rec, pk.program_id(0))            # both waves write the same row


@pk.kernel(num_waves=1)
def past_the_end(rec: pk.gl[pk.i32, (None, 4)]):
    pk.timestamp(rec, pk.program_id(0) + 2)


def _record(rows):
    return np.full((rows, 4), -1, np.int32)


def _expected_place(target, index, wave):
    """(unit, chiplet) of wave `wave` of workgroup `index` under round-robin dispatch,
    written out from the targets' counts: Hopper's SM index; CDNA's XCD index % XCDs and
    the CU index // XCDs within it, in HW_ID's fields."""
    t = targets.get(target)
    if t.num_xcds == 1:
        return index % t.num_cus, 0
    cu = (index // t.num_xcds) % t.cus_per_xcd
    return wave + 256 * (cu % 16) + 8192 * (cu // 16), index % t.num_xcds


@pytest.mark.parametrize("target", ["sm_90a", "gfx942", "gfx950"])
def test_every_wave_stamps_in_order_and_place(target):
    x = np.random.default_rng(0).random((24, 64), np.float32)
    grid, waves = 6, 2
    r = pk.emulate(stamped, x, np.zeros_like(x), _record(2 * grid * waves), grid=grid,
                   target=target)
    np.testing.assert_array_equal(r["out"], 2 * x)
    rec = r["rec"].astype(np.int64)
    when = rec[:, 0] + (rec[:, 1] << 32)
    assert sorted(when.tolist()) == list(range(len(rec)))     # every stamp, one order
    assert (when[1::2] > when[0::2]).all()                      # after comes after before
    for row in range(len(rec)):
        index, wave = divmod(row // 2, waves)
        assert tuple(rec[row, 2:]) == _expected_place(target, index, wave), row


def test_cdna_place_spreads_over_xcds_then_cus():
    # the 9th and 17th workgroups of a gfx942 launch: XCD 0 again, its CUs 1 and 2
    assert _expected_place("gfx942", 8, 0) == (256, 0)
    rec = pk.emulate(past_the_end, _record(40), grid=38, target="gfx942")["rec"]
    assert tuple(rec[8 + 2, 2:]) == (256, 0) and tuple(rec[16 + 2, 2:]) == (512, 0)
    assert tuple(rec[9 + 2, 2:]) == (256, 1)


def test_a_row_outside_the_record_writes_nothing():
    rec = pk.emulate(past_the_end, _record(4), grid=3, target="sm_90a")["rec"]
    assert (rec[:2] == -1).all()                         # rows 0, 1: nobody's
    assert (rec[2:, 2] == [0, 1]).all()                  # workgroups 0 and 1; 2 fell off


def test_two_waves_on_one_row_is_a_race():
    with pytest.raises(Race, match="race on global tensor 'rec'"):
        pk.emulate(one_row_for_both, _record(2), grid=2, target="sm_90a")


@pytest.mark.parametrize("decl, why", [
    ("pk.gl[pk.f32, (None, 4)]", "must be declared pk.gl\\[pk.i32, \\(None, 4\\)\\]"),
    ("pk.gl[pk.i32, 2]", "must be declared pk.gl\\[pk.i32, \\(None, 4\\)\\]"),
    ("pk.gl[pk.i32, (None, 3)]", "a row of 4 words a timestamp"),
])
def test_a_record_of_the_wrong_kind_is_refused(decl, why):
    ns = {"pk": pk}
    exec(f"@pk.kernel(num_waves=1)\ndef bad(rec: {decl}):\n    pk.timestamp(rec, 0)\n", ns)
    with pytest.raises(KernelError, match=why):
        compiler.tile_ir(ns["bad"], "sm_90a")


def test_the_record_counts_as_written():
    prog = compiler.lane_ir(stamped, "sm_90a")
    assert written_params(prog) == {"out", "rec"}


def test_hopper_reads_the_global_timer_at_each_stamp_and_the_sm():
    ptx = compiler.assembly(stamped, "sm_90a")
    assert ptx.count("%globaltimer;") == 2               # not merged into one read
    assert "%smid;" in ptx
    rep = compiler.report(stamped, "sm_90a")
    assert rep["registers"] and not rep.get("spill_stores")


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_cdna_reads_realtime_hw_id_and_xcc_id(target):
    asm = compiler.assembly(stamped, target)
    lines = [ln.split("//")[0].strip() for ln in asm.splitlines()]
    assert sum(ln.startswith("s_memrealtime") for ln in lines) == 2
    # the disassembler names the registers: pykittens' encodings (cdna.HWREG_*) are right
    assert sum(ln.endswith("hwreg(HW_REG_HW_ID)") for ln in lines) == 2
    assert sum(ln.endswith("hwreg(HW_REG_XCC_ID)") for ln in lines) == 2


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_the_isa_emulator_runs_the_code_object_as_the_lane_emulator(target):
    x = np.random.default_rng(1).random((16, 64), np.float32)
    lane = pk.emulate(stamped, x, np.zeros_like(x), _record(16), grid=4, target=target)
    isa = pk.emulate(stamped, x, np.zeros_like(x), _record(16), grid=4, target=target,
                     isa=True)
    np.testing.assert_array_equal(isa["out"], 2 * x)
    np.testing.assert_array_equal(isa["rec"][:, 2:], lane["rec"][:, 2:])   # the places
    when = isa["rec"][:, 0].astype(np.int64)
    assert sorted(when.tolist()) == list(range(16)) and (when[1::2] > when[0::2]).all()
