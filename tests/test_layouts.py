"""Lane layouts: every (lane, slot) of a tile holds a distinct element and every element is
held (a bijection), the MFMA operand layouts match AMD's documented lane positions, and the
emulator places elements where the layouts say (seen through pk.lane_id)."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.ir import types as T
from pykittens.lower import layouts as L
from pykittens.targets import TARGETS, cdna, get, row_major_lane_layout

from conftest import TARGETS as TARGET_NAMES


def assert_bijection(lay, lanes=None):
    """Each element of lay.shape is held by exactly one (lane, slot)."""
    rows, cols = lay.coords()
    n_lanes = lanes or lay.lanes
    assert rows.shape == (n_lanes, lay.nslots)
    assert rows.min() >= 0 and cols.min() >= 0
    assert rows.max() < lay.shape[0] and cols.max() < lay.shape[1]
    flat = rows * lay.shape[1] + cols
    assert flat.size == lay.shape[0] * lay.shape[1]
    assert len(np.unique(flat)) == flat.size


SHAPES = [(4, 64), (8, 64), (4, 128), (16, 16), (32, 32), (2, 256), (64, 64), (1, 64),
          (64, 1), (128, 8), (32, 16), (16, 32)]


@pytest.mark.parametrize("wave", [32, 64, 128, 256])
@pytest.mark.parametrize("vec", [1, 4, 8, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_row_major_lane_layout_is_a_bijection(shape, vec, wave):
    if shape[0] * shape[1] < wave:
        with pytest.raises(ValueError, match="cannot be spread over a wave"):
            row_major_lane_layout(shape, wave, vec)
        return
    lay = row_major_lane_layout(shape, wave, vec)
    assert lay.lanes == wave and lay.nslots * wave == shape[0] * shape[1]
    assert_bijection(lay)


def test_row_major_lane_layout_is_coalesced():
    """Lanes sweep a row first, each owning `vec` consecutive columns."""
    lay = row_major_lane_layout((4, 64), 64, 4)
    rows, cols = lay.coords()
    assert list(cols[:16, 0]) == list(range(0, 64, 4)) and list(rows[:16, 0]) == [0] * 16
    assert list(cols[0]) == [0, 1, 2, 3] and rows[16, 0] == 1


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("shape", [(4, 64), (8, 64), (16, 16), (64, 32), (2, 128)])
def test_register_tile_layouts_are_bijections(target, layout, dtype, shape):
    t = get(target)
    if shape[0] * shape[1] < t.wave_size:
        return
    rt = T.RegTileType(T.DTYPES[dtype], shape, layout)
    lay = L.tile_layout(rt, t)
    assert lay.shape == shape and lay.lanes == t.wave_size
    assert_bijection(lay)
    for axis, dim in (("row", 0), ("col", 1)):
        v = T.RegVecType(rt.dtype, rt, axis)
        vl = L.vec_layout(v, t)
        # a vector holds each row (column) once per lane group; the slot the broadcast picks
        # for each tile slot holds exactly that slot's row (column)
        vr, vc = vl.coords()
        tr, tc = lay.coords()
        idx = L.broadcast_index(v, t)
        got = (vr if dim == 0 else vc)[:, list(idx)]
        assert np.array_equal(got, tr if dim == 0 else tc)


MFMAS = [(tn, ins) for tn in ("gfx942", "gfx950") for ins in TARGETS[tn].mma]


@pytest.mark.parametrize("tname, ins", MFMAS, ids=[f"{t}-{i.name}" for t, i in MFMAS])
def test_mfma_layouts_are_bijections(tname, ins):
    assert ins.a_layout.shape == (ins.m, ins.k) and ins.b_layout.shape == (ins.k, ins.n)
    assert ins.acc_layout.shape == (ins.m, ins.n)
    for lay in (ins.a_layout, ins.b_layout, ins.acc_layout):
        assert lay.lanes == cdna.WAVE
        assert_bijection(lay)


def _holder(lay, row, col):
    rows, cols = lay.coords()
    (lane,), (slot,) = np.nonzero((rows == row) & (cols == col))
    return int(lane), int(slot)


def _instr(target, name):
    return next(i for i in TARGETS[target].mma if i.name == name)


def test_mfma_32x32x8_bf16_positions():
    """AMD Matrix Instruction Calculator, v_mfma_f32_32x32x8bf16_1k: D/C lane l holds column
    l % 32, rows 8 * (s // 4) + 4 * (l // 32) + s % 4 for slot s; A lane l holds row l % 32,
    k = 4 * (l // 32) + s; B lane l holds column l % 32, k = 4 * (l // 32) + s."""
    ins = _instr("gfx942", "v_mfma_f32_32x32x8_bf16")
    r, c = ins.acc_layout.coords()
    assert (r[33, 0], c[33, 0]) == (4, 1)
    assert (r[0, 4], c[0, 4]) == (8, 0)
    assert (r[63, 15], c[63, 15]) == (31, 31)
    assert _holder(ins.acc_layout, 4, 1) == (33, 0)
    r, c = ins.a_layout.coords()
    assert (r[40, 1], c[40, 1]) == (8, 5)
    r, c = ins.b_layout.coords()
    assert (r[40, 1], c[40, 1]) == (5, 8)


def test_mfma_16x16_positions():
    """16x16 family: D lane l holds column l % 16, rows 4 * (l // 16) + s."""
    ins = _instr("gfx942", "v_mfma_f32_16x16x16_bf16")
    r, c = ins.acc_layout.coords()
    assert (r[17, 2], c[17, 2]) == (6, 1) and ins.acc_layout.nslots == 4
    r, c = ins.a_layout.coords()
    assert (r[50, 3], c[50, 3]) == (2, 15)          # k = 4 * (50 // 16) + 3
    ins = _instr("gfx950", "v_mfma_f32_16x16x32_bf16")  # CDNA4: 8 consecutive k per lane
    r, c = ins.a_layout.coords()
    assert (r[50, 3], c[50, 3]) == (2, 27) and ins.a_layout.nslots == 8


def test_cdna4_doubles_k():
    a942 = _instr("gfx942", "v_mfma_f32_32x32x8_bf16").a_layout
    a950 = _instr("gfx950", "v_mfma_f32_32x32x16_bf16").a_layout
    assert (a942.nslots, a950.nslots) == (4, 8)
    r, c = a950.coords()
    assert (r[33, 7], c[33, 7]) == (1, 15)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("role, layout, shape", [
    ("acc", "row", (32, 32)), ("acc", "row", (64, 32)), ("a", "row", (32, 16)),
    ("a", "col", (16, 32)), ("b", "col", (16, 32)), ("b", "row", (32, 64)),
])
def test_role_tile_layouts_are_bijections(target, role, layout, shape):
    t = pk.rt(shape, pk.bf16 if role != "acc" else pk.f32, layout, role=role)
    assert_bijection(L.tile_layout(t, get(target)))


# ---- the emulator agrees with the layouts -----------------------------------------------------

@pk.kernel
def lanes_k(out: pk.gl[pk.i32, 2], SHAPE: pk.const = (8, 64), LAY: pk.const = "row",
            ROLE: pk.const = "", DT: pk.const = "f32"):
    pk.store(out, pk.lane_id(pk.rt(SHAPE, DT, LAY, role=ROLE or None)))


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("lay", ["row", "col"])
@pytest.mark.parametrize("shape", [(8, 64), (32, 16), (4, 128)])
def test_lane_id_shows_the_layout(target, lay, shape):
    got = pk.emulate(lanes_k, np.full(shape, -1, np.int32), grid=1, target=target,
                     SHAPE=shape, LAY=lay)["out"]
    layout = L.tile_layout(T.RegTileType(T.f32, shape, lay), get(target))
    rows, cols = layout.coords()
    want = np.empty(shape, np.int32)
    want[rows, cols] = np.arange(layout.lanes)[:, None]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_lane_id_of_an_accumulator(target):
    got = pk.emulate(lanes_k, np.full((32, 32), -1, np.int32), grid=1, target=target,
                     SHAPE=(32, 32), ROLE="acc")["out"]
    assert got[4, 1] == 33 and got[0, 31] == 31 and got[31, 0] == 32
