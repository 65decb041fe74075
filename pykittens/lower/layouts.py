"""Which lane holds which element: the layout of every register tile and vector on a target."""
from __future__ import annotations

from ..ir.errors import NotSupportedYet
from ..ir.types import RegTileType, RegVecType, SharedTileType
from ..targets.base import LaneLayout, row_major_lane_layout

VEC_BYTES = 16     # widest per-lane global/LDS access on all targets (b128)
TILE_VEC = 8       # consecutive columns per lane in generic register tiles: one b128 access
                   # of 16-bit data; the same for every dtype so casts keep the layout


def transpose(lay: LaneLayout) -> LaneLayout:
    bits = tuple((None if d is None else 1 - d, s) for d, s in lay.lane_bits)
    return LaneLayout(lay.shape[::-1], bits, tuple((c, r) for r, c in lay.slots))


def tiled(base: LaneLayout, shape) -> LaneLayout:
    """Repeat a base layout over a larger tile; slots run base tile by base tile, row-major,
    so base tile (i, j) owns slots [(i * cols + j) * n, ... + n)."""
    br, bc = base.shape
    slots = tuple((i * br + r, j * bc + c) for i in range(shape[0] // br)
                  for j in range(shape[1] // bc) for r, c in base.slots)
    return LaneLayout(tuple(shape), base.lane_bits, slots)


def family(t: RegTileType, target) -> int:
    """The matrix-instruction M of a role tile: its mma= or the target's choice (the widest
    instruction whose M divides the tile's M/N dims)."""
    if t.mma is not None:
        return t.mma
    for m in sorted({ins.m for ins in target.mma}, reverse=True):
        if all(d % m == 0 for d in t.mn_dims):
            return m
    return min(ins.m for ins in target.mma)


def mma_instr(t: RegTileType, target, ab_dtype=None):
    """The matrix instruction whose operand layouts a role tile follows."""
    d = ab_dtype or t.dtype
    m = family(t, target)
    if t.role in ("a_scale", "b_scale"):
        for ins in target.mma:
            if ins.m == m and ins.scaled:
                return ins
        raise NotSupportedYet(f"{target.name} has no block-scaled matrix instruction "
                              "(the MX formats' f8f6f4 MFMAs are CDNA4, gfx950)")
    k = t.shape[1] if t.layout == "row" else t.shape[0]       # a (M x K) or b (N x K / K x N)
    for ins in target.mma:
        if ins.no_scale and (t.role == "acc" or k % ins.k):
            continue             # the f8f6f4 form of plain fp8 needs K a multiple of its K
        if ins.m == m and ins.scaled == t.scaled and \
                (t.role == "acc" or ins.ab_dtype == d.name):
            return ins
    kind = "block-scaled " if t.scaled else ""
    raise NotSupportedYet(f"{target.name} has no {kind}matrix instruction with M={m} for {d} "
                          "operands")


def role_base(t: RegTileType, target) -> LaneLayout:
    ins = mma_instr(t, target)
    if t.role == "acc":                               # 'col': the transposed view
        return ins.acc_layout if t.layout == "row" else transpose(ins.acc_layout)
    if t.role == "a_scale":
        return ins.scale_a_layout
    if t.role == "b_scale":
        return ins.scale_b_layout
    base = ins.a_layout if t.role == "a" else ins.b_layout
    if t.krun is not None:
        base = _krun_base(t, ins, target)
    natural = "row" if t.role == "a" else "col"       # A is (M, K), B is (K, N)
    return base if t.layout == natural else transpose(base)


def _krun_base(t: RegTileType, ins, target) -> LaneLayout:
    """The operand layout of `ins` with K relabelled into runs of t.krun (targets.cdna)."""
    if target.family != "cdna" or ins.scaled:
        raise NotSupportedYet(f"krun= is a CDNA operand layout (unscaled MFMAs); "
                              f"{target.name} has no use for it")
    from ..targets import cdna
    return cdna.mfma_a(ins.m, ins.k, t.krun) if t.role == "a" else \
        cdna.mfma_b(ins.n, ins.k, t.krun)


def tile_layout(t: RegTileType, target) -> LaneLayout:
    if t.role is not None:
        base = role_base(t, target)
        if t.shape[0] % base.shape[0] or t.shape[1] % base.shape[1]:
            raise ValueError(f"tile {t} is not a whole number of {base.shape[0]}x"
                             f"{base.shape[1]} matrix-instruction tiles on {target.name}")
        return tiled(base, t.shape)
    vec = TILE_VEC
    if t.layout == "row":
        return row_major_lane_layout(t.shape, target.wave_size, vec)
    return transpose(row_major_lane_layout(t.shape[::-1], target.wave_size, vec))


def vec_layout(v: RegVecType, target) -> LaneLayout:
    """A vector keeps the lane bits of its axis from the parent tile; the other lane bits
    replicate it, and its slots are the distinct offsets along the axis."""
    parent = tile_layout(v.of, target)
    dim = 0 if v.axis == "row" else 1
    bits = tuple((d if d == dim else None, s) for d, s in parent.lane_bits)
    offs = sorted({s[dim] for s in parent.slots})
    slots = tuple((o, 0) if dim == 0 else (0, o) for o in offs)
    shape = (v.length, 1) if dim == 0 else (1, v.length)
    return LaneLayout(shape, bits, slots)


def reg_layout(t, target) -> LaneLayout:
    return vec_layout(t, target) if isinstance(t, RegVecType) else tile_layout(t, target)


def broadcast_index(v: RegVecType, target) -> tuple[int, ...]:
    """For each slot of the parent tile, the vector slot holding its row (or column)."""
    parent = tile_layout(v.of, target)
    dim = 0 if v.axis == "row" else 1
    offs = sorted({s[dim] for s in parent.slots})
    pos = {o: i for i, o in enumerate(offs)}
    return tuple(pos[s[dim]] for s in parent.slots)


def workgroup_layout(t: SharedTileType, target, num_waves: int) -> LaneLayout:
    """How all lanes of a workgroup split a cooperative global<->shared copy: the wave index
    supplies the lane bits above the wave's own."""
    vec = max(1, VEC_BYTES // t.dtype.bytes)
    return row_major_lane_layout(t.shape, target.wave_size * num_waves, vec)


def tr16_source(lay: LaneLayout):
    """For a 16-bit register layout whose 16-lane groups sweep 16 consecutive columns and
    whose slots come in runs of 4 consecutive rows, the layout of the 8-byte row chunks that
    gfx950's ds_read_b64_tr_b16 must read so that its in-group transpose delivers exactly
    `lay` (checked element by element); None when the pattern does not apply."""
    from ..targets.cdna import ds_read_tr16_b64_source
    if lay.lanes != 64 or lay.lane_bits[:4] != ((1, 1), (1, 2), (1, 4), (1, 8)) or \
            lay.nslots % 4:
        return None
    for g in range(0, lay.nslots, 4):
        r, c = lay.slots[g]
        if any(lay.slots[g + e] != (r + e, c) for e in range(4)):
            return None
    # lane i of a group reads row (group row + i // 4), columns 4 * (i % 4) .. + 3
    bits = ((1, 4), (1, 8), (0, 1), (0, 2)) + lay.lane_bits[4:]
    slots = tuple((lay.slots[g][0], lay.slots[g][1] + e)
                  for g in range(0, lay.nslots, 4) for e in range(4))
    src = LaneLayout(lay.shape, bits, slots)
    sr, sc = src.coords()
    tr, tc = lay.coords()
    for lane in range(64):
        base = lane & ~15
        for s_ in range(lay.nslots):
            g, e = divmod(s_, 4)
            sl, se = ds_read_tr16_b64_source(lane & 15, e)
            if (sr[base + sl, 4 * g + se], sc[base + sl, 4 * g + se]) != (tr[lane, s_], tc[lane, s_]):
                return None
    return src
