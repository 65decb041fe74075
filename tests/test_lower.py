"""Tile IR -> lane IR: program facts, op kinds, loops kept as loops, reductions as lane
butterflies, LDS placement, and lowering errors."""
import pytest

import pykittens as pk
from pykittens.ir.nodes import walk
from pykittens.lower import LaneProgram, LaneType, lower
from pykittens.lower.printer import format_lane
from pykittens.targets import get

from conftest import TARGETS

HERE = __file__

# The op kinds the lane IR documents (pykittens/lower/lane.py) plus 'arg' (a scalar kernel
# argument), 'mfma' (CDNA matrix instructions) and the scheduling hints: both the renderer and
# the emulator implement exactly these.
LANE_KINDS = {"const", "special", "dim", "stride", "coord", "mov", "bin", "un", "cmp",
              "select", "cvt", "slots", "slot_reduce", "bfly", "gload", "gstore", "lds_load",
              "lds_store", "lds_load_tr", "gload_lds", "for", "if", "barrier", "setprio", "arg", "mma", "sched_barrier",
              "sched_group", "waitcnt"}


def test_emulator_implements_every_lane_kind():
    from pykittens.emulator.machine import _Machine
    structural = {"for", "if", "barrier"}          # run_block handles these itself
    missing = {k for k in LANE_KINDS - structural if not hasattr(_Machine, "x_" + k)}
    assert not missing


@pk.kernel(num_waves=4)
def everything(x: pk.gl[pk.bf16, 2], out: pk.gl[pk.f32, 2], alpha: pk.f32, N: pk.const = 3):
    s = pk.empty(pk.st((32, 64), pk.bf16, swizzle=4))
    s2 = pk.empty(pk.st((8, 8), pk.f32))                 # 256 bytes, then aligned to 16
    s3 = pk.empty(pk.st((8, 64), pk.f32))
    pk.load(s, x, (0, 0), fill=1.0)
    pk.barrier()
    w = pk.wave_id()
    t = pk.load(pk.rt((8, 64), pk.f32), s, (w * 8, 0))
    acc = pk.zeros(pk.rt((8, 64), pk.f32))
    for j in pk.range(N):
        acc += pk.exp2(t * alpha - pk.row_max(t))
    with pk.if_(w == 0):
        pk.setprio(1)
        pk.store(s3, acc, (0, 0))
    pk.store(out, pk.cast(acc, pk.bf16).cast(pk.f32), (w * 8, 0))


@pytest.fixture(params=TARGETS)
def prog(request) -> LaneProgram:
    return lower(everything.specialize(), request.param)


def kinds(p):
    return [op.kind for op in walk(p.body)]


def test_program_facts(prog):
    t = prog.target
    assert isinstance(prog, LaneProgram) and prog.wave_size == t.wave_size
    assert prog.num_waves == 4 and prog.consts == {"N": 3}
    assert [p.name for p in prog.params] == ["x", "out", "alpha"]
    bases = [(r.name, r.base, r.size) for r in prog.regions]
    assert bases == [("st0", 0, 4096), ("st1", 4096, 256), ("st2", 4352, 2048)]
    assert all(r.base % 16 == 0 for r in prog.regions)
    assert prog.lds_bytes == 4352 + 2048


def test_lane_op_kinds_are_the_documented_ones(prog):
    ks = set(kinds(prog))
    assert ks <= LANE_KINDS, ks - LANE_KINDS
    assert {"gload", "gstore", "lds_load", "lds_store", "for", "if", "barrier", "setprio",
            "bfly", "slot_reduce", "un", "cvt", "arg"} <= ks


def test_registers_are_typed_per_lane(prog):
    regs = [op.dst for op in walk(prog.body) if op.dst is not None and op.kind != "for"]
    assert all(isinstance(r.type, LaneType) for r in regs)
    tile_elems = 8 * 64 // prog.wave_size                    # slots of an 8x64 tile
    assert any(r.type.nslots == tile_elems and not r.type.uniform for r in regs)
    specials = [op for op in walk(prog.body) if op.kind == "special"]
    assert all(op.dst.type.uniform for op in specials)


def test_loops_stay_loops():
    k3, k50 = (lower(everything.specialize(N=n), "gfx942") for n in (3, 50))
    assert len(kinds(k3)) == len(kinds(k50))
    loop = next(op for op in walk(k50.body) if op.kind == "for")
    assert loop.attrs["step"] == 1 and loop.dst.type.uniform
    inner = [op.kind for op in walk(loop.regions[0])]
    assert "un" in inner and "bfly" in inner


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, layout", [((8, 64), "row"), ((4, 128), "row"),
                                           ((16, 16), "col"), ((64, 8), "row")])
def test_row_reduction_is_slots_then_butterfly(target, shape, layout):
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 1]):
        pk.store(out, pk.row_sum(pk.load(pk.rt(shape, pk.f32, layout), x)), (0,))

    p = lower(k.specialize(), target)
    from pykittens.lower import layouts as L
    lay = L.tile_layout(pk.rt(shape, pk.f32, layout), get(target))
    sr = [op for op in walk(p.body) if op.kind == "slot_reduce"]
    bf = [op for op in walk(p.body) if op.kind == "bfly"]
    assert len(sr) == 1 and sr[0].attrs["op"] == "add"
    assert len(sr[0].attrs["groups"]) == len({s[0] for s in lay.slots})
    col_bits = lay.lane_bits_of(1)        # lanes that share a row: reduced across lanes
    if col_bits:
        assert len(bf) == 1 and list(bf[0].attrs["bits"]) == col_bits
    else:
        assert not bf


def test_lane_printer(prog):
    text = format_lane(prog)
    head = text.splitlines()[0]
    assert head.startswith(f"lane_program everything target={prog.target.name} "
                           f"wave={prog.wave_size} num_waves=4 lds_bytes=6400")
    for frag in ("lds st0 [0, 4096)", "gload(", "lds_store(", "for(", "bfly(", "barrier()",
                 "setprio() {level=1}", "# line "):
        assert frag in text, frag


def test_ops_keep_user_lines(prog):
    locs = {op.loc.file for op in walk(prog.body) if op.loc is not None}
    assert locs == {HERE}


@pytest.mark.parametrize("target", TARGETS)
def test_swizzle_needs_wide_rows(target):
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((64, 16), pk.f32, swizzle=8))  # 64-byte rows < 8 x 16  # MARK-swz
        pk.load(s, x)

    with pytest.raises(pk.KernelError, match="swizzle=8 needs rows of at least 128 bytes; "
                                             "this tile's rows are 64") as e:
        lower(k.specialize(), target)
    from conftest import assert_names_line
    assert_names_line(e.value, HERE, "# MARK-swz")


def test_shared_tile_smaller_than_workgroup():
    @pk.kernel(num_waves=4)
    def k(x: pk.gl[pk.f32, 2]):
        pk.load(pk.st((4, 32), pk.f32), x)        # 128 elements, 256 lanes

    with pytest.raises(pk.KernelError, match="fewer elements than the workgroup's 256 lanes"):
        lower(k.specialize(), "gfx950")
    lower(k.specialize(num_waves=1), "sm_90a")     # 32 lanes: fine


def test_lower_accepts_target_objects_and_rejects_unknown_names():
    kir = everything.specialize()
    assert lower(kir, get("gfx950")).target is get("gfx950")
    with pytest.raises(ValueError, match="unknown target 'gfx1100'; choose one of gfx942, "
                                         "gfx950, sm_90a"):
        lower(kir, "gfx1100")


def test_adjacent_workgroup_reductions_share_their_barriers():
    """Two workgroup sums in a row (no op between), the second not reading the first: one
    round of two barriers for both (not four); a sum of a sum keeps its own round. Every wave gets the
    totals, in the emulator."""
    import numpy as np
    from pykittens import compiler

    @pk.kernel(num_waves=4)
    def two_sums(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], NESTED: pk.const = 0):
        t = pk.load(pk.rt((1, 64), pk.f32), x, (0, pk.wave_id() * 64))
        s, q = pk.row_sum(t), pk.row_sum(t * t)
        a = pk.workgroup_sum(s)
        b = pk.workgroup_sum(a if NESTED else q)
        pk.store(out, pk.load(pk.rt((1, 64), pk.f32), x, (0, 0)) * 0.0 + a + b,
                 (pk.wave_id(), 0))

    def barriers(**c):
        return sum(op.kind == "barrier" for op in walk(compiler.lane_ir(two_sums, "sm_90a",
                                                                          **c).body))

    assert barriers() == 2 and barriers(NESTED=1) == 4
    x = np.random.default_rng(0).random((1, 256), dtype=np.float32)
    got = pk.emulate(two_sums, x, np.zeros((4, 64), np.float32), grid=1)["out"]
    want = x.sum() + (x * x).sum()
    assert np.allclose(got, want, rtol=1e-5)
