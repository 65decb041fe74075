"""Lowering of each tile-IR op into lane-IR ops."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..ir import types as T
from ..ir.errors import KernelError, NotSupportedYet
from ..ir.nodes import Block, KernelIR, Value
from ..ir.verify import verify
from ..targets import get as get_target
from . import layouts as L
from .lane import LaneBuilder, LaneProgram, LDSRegion

LDS_ALIGN = 16
TMA_ALIGN = 128       # shared addresses of bulk tensor copies (PTX ISA, cp.async.bulk.tensor)


class _Lowering:
    def __init__(self, k: KernelIR, target):
        self.k, self.t = k, target
        self.b = LaneBuilder()
        self.env: dict = {}            # tile-IR Value -> lane register (or LDSRegion)
        self.layouts: dict = {}        # tile-IR Value -> LaneLayout
        self.regions: list[LDSRegion] = []
        self.tmaps: list = []
        self.reg_budget: dict = {}     # first wave of a Hopper warp role -> its registers
        self.cluster_scratch: dict = {}  # (dtype, shape) -> pk.cluster_sum's shared tile
        self.lds = 0
        self.loc = None
        self.consts: dict = {}         # lane register -> int, for registers holding constants

    # -- helpers ------------------------------------------------------------------------
    def err(self, msg, cls=KernelError):
        return cls(msg, self.loc, self.k.name)

    def emit(self, kind, dst=None, srcs=(), regions=None, **attrs):
        return self.b.emit(kind, dst, srcs, self.loc, regions, **attrs)

    def const(self, value, dtype=T.i32):
        r = self.b.reg(dtype, uniform=True)
        if isinstance(value, int):
            self.consts[r] = value
        return self.emit("const", r, value=value)

    def bin(self, op, a, b, dtype=None, nslots=None):
        dt = dtype or a.type.dtype
        n = nslots or max(a.type.nslots, b.type.nslots)
        uni = a.type.uniform and b.type.uniform
        r = self.b.reg(T.boolean if op in ("lt", "le", "gt", "ge", "eq", "ne") else dt, n, uni)
        kind = "cmp" if op in ("lt", "le", "gt", "ge", "eq", "ne") else "bin"
        return self.emit(kind, r, (a, b), op=op)

    def coords(self, lay, origin, scope="wave"):
        """Per-(lane, slot) global coordinates: origin + layout position, for each dim."""
        out = []
        for dim in (0, 1):
            c = self.b.reg(T.i32, lay.nslots)
            self.emit("coord", c, layout=lay, dim=dim, scope=scope)
            out.append(self.bin("add", c, origin[dim]) if origin[dim] is not None else c)
        return out

    def dim(self, gl_v, axis):
        d = self.b.reg(T.i32, uniform=True)
        return self.emit("dim", d, (gl_v,), axis=axis)

    def cvt(self, src, dtype):
        if src.type.dtype == dtype:
            return src
        r = self.b.reg(dtype, src.type.nslots, src.type.uniform)
        return self.emit("cvt", r, (src,))

    def layout(self, v):
        if v not in self.layouts:
            try:
                self.layouts[v] = L.reg_layout(v.type, self.t)
            except NotSupportedYet as e:
                raise self.err(e.message, NotSupportedYet) from None
            except ValueError as e:
                raise self.err(str(e)) from None
        return self.layouts[v]

    # -- driver -------------------------------------------------------------------------
    def run(self) -> LaneProgram:
        for p in self.k.params:          # scalar arguments once, where every path sees them
            if p.kind == "scalar":
                self.val(self.k.param_values[p.name])
        self.block(self.k.body)
        return LaneProgram(self.k.name, self.t, self.k.params, self.k.param_values,
                           self.k.num_waves, self.lds, self.regions, self.b.blocks[0],
                           self.k.consts, tuple(self.tmaps), self.k.programs_per_cu,
                           self.k.cluster)

    def block(self, blk: Block):
        ops, i = blk.ops, 0
        while i < len(ops):
            self.loc = ops[i].loc
            taken, allocs, group = _reduction_group(ops, i)
            if len(group) > 1:                 # one round of barriers for them all
                for op in allocs:
                    self.op_alloc(op)
                self._wg_reduce(group)
            else:
                getattr(self, "op_" + ops[i].kind)(ops[i])
            i += taken

    def sub_block(self, blk: Block) -> Block:
        with self.b.into(Block()) as out:
            self.block(blk)
        return out

    def val(self, v):
        """Lane register of a tile-IR value (parameters map to themselves)."""
        if v in self.env:
            return self.env[v]
        if v.name in self.k.param_values and self.k.param_values[v.name] is v:
            if isinstance(v.type, T.ScalarType):
                r = self.b.reg(v.type.dtype, uniform=True, name=v.name)
                self.emit("arg", r, name=v.name)
                self.env[v] = r
                return r
            return v
        raise self.err(f"internal: value {v!r} used before definition")

    # -- scalars ------------------------------------------------------------------------
    def op_const(self, op):
        self.env[op.dst] = self.const(op.attrs["value"], op.dst.type.dtype)

    def op_special(self, op):
        r = self.b.reg(T.i32, uniform=True, name=op.attrs["name"])
        self.env[op.dst] = self.emit("special", r, name=op.attrs["name"], axis=op.attrs["axis"])

    def op_lane_id(self, op):
        lane = self.b.reg(T.i32, 1, name="lane")
        self.emit("special", lane, name="lane_id", axis=0)
        self.emit("mov", self.env[op.dst], (lane,))

    def op_dim(self, op):
        self.env[op.dst] = self.dim(self.val(op.srcs[0]), op.attrs["axis"])

    def op_sbin(self, op):
        a, b = (self.val(s) for s in op.srcs)
        self.env[op.dst] = self.bin(op.attrs["op"], a, b)

    def op_scast(self, op):
        self.env[op.dst] = self.cvt(self.val(op.srcs[0]), op.dst.type.dtype)

    def op_sselect(self, op):
        c, a, b = (self.val(s) for s in op.srcs)
        r = self.b.reg(op.dst.type.dtype, uniform=True)
        self.env[op.dst] = self.emit("select", r, (c, a, b))

    # -- tiles --------------------------------------------------------------------------
    def op_alloc(self, op):
        t = op.dst.type
        if isinstance(t, (T.MBarrierType, T.SharedTileType, T.StagesType)):
            count = t.count if isinstance(t, T.StagesType) else 1
            one = t.of if isinstance(t, T.StagesType) else t
            self.env[op.dst] = self._shared(one, count)
            return
        lay = self.layout(op.dst)
        pin = getattr(t, "pin", None)
        self.env[op.dst] = self.b.reg(t.dtype, lay.nslots, name=f"t{op.dst.id}", pin=pin)

    def _shared(self, t, count) -> LDSRegion:
        """LDS for `count` shared tiles or mbarriers of type t (wave 0 initialises
        mbarriers; the barrier after makes their initial state visible to all waves)."""
        if isinstance(t, T.MBarrierType):
            if self.t.family != "hopper":
                raise self.err(f"mbarriers are a Hopper feature; on {self.t.name} synchronise "
                               "waves with pk.barrier()", NotSupportedYet)
            reg = self._lds_region("mbar", t, 8, count)
            w = self.b.reg(T.i32, uniform=True)
            self.emit("special", w, name="wave_id", axis=0)
            first = self.bin("eq", w, self.const(0))
            with self.b.into(Block()) as init:
                for i in range(count):
                    self.emit("mbar_init", region=reg.element(i) if count > 1 else reg,
                              count=t.arrivals)
            self.emit("if", None, (first,), regions=[init])
            self.emit("barrier")
            return reg
        # a 128-byte-swizzled tile starts on a 1024-byte boundary: the hardware's swizzle
        # (wgmma, TMA) is defined on absolute shared addresses; on Hopper any tile a TMA
        # box could copy (rows of a multiple of 16 bytes) starts on a 128-byte one, as
        # the bulk tensor copies require
        row_bytes = t.shape[1] * t.dtype.bytes
        align = 1024 if t.swizzle == 8 and row_bytes % 128 == 0 else \
            TMA_ALIGN if self.t.family == "hopper" and row_bytes % 16 == 0 else LDS_ALIGN
        if t.swizzle and row_bytes < 16 * t.swizzle:
            raise self.err(f"swizzle={t.swizzle} needs rows of at least {16 * t.swizzle} "
                           f"bytes; this tile's rows are {row_bytes}")
        return self._lds_region("st", t, align, count)

    def _lds_region(self, prefix, t, align, count=1) -> LDSRegion:
        """The next `align`-aligned piece of LDS / shared memory for `count` elements of
        type t, each starting `align`-aligned."""
        base = -(-self.lds // align) * align
        stride = -(-t.nbytes // align) * align
        size = stride * (count - 1) + t.nbytes
        reg = LDSRegion(f"{prefix}{len(self.regions)}", base, size, t,
                        count=count, stride=stride if count > 1 else 0)
        self.regions.append(reg)
        self.lds = base + size
        return reg

    def op_stage(self, op):
        """Stage i of a pk.empty(..., count=n) / pk.mbarrier(..., count=n): a static region
        for a constant index, else the region with the index register (its address is
        computed where it is used)."""
        arr, idx = self.env[op.srcs[0]], self.val(op.srcs[1])
        c = self.consts.get(idx)
        if c is not None:
            if not 0 <= c < arr.count:
                raise self.err(f"stage {c} of {arr.count}: index out of range")
            self.env[op.dst] = arr.element(c)
        else:
            self.env[op.dst] = dataclasses.replace(arr, stage=idx)

    def op_atom(self, op):
        """Column block j of a tile stored as 128-byte column blocks: the same region
        (stages and all) moved to the block and typed as a 128-byte-wide tile."""
        src, t = self.env[op.srcs[0]], op.dst.type
        block = t.shape[0] * 128
        self.env[op.dst] = dataclasses.replace(
            src, name=f"{src.name}.atom{op.attrs['index']}",
            base=src.base + op.attrs["index"] * block, tile=t,
            size=src.size - src.tile.nbytes + block)

    def op_fill(self, op):
        dst = self.env[op.dst]
        self.emit("mov", dst, (self.val(op.srcs[0]),))

    def op_copy(self, op):
        self._same_lanes(op.srcs[0].type, op.dst.type, "copy")
        dst, src = self.env[op.dst], self.val(op.srcs[0])
        self.emit("cvt" if src.type.dtype != dst.type.dtype else "mov", dst, (src,))

    def _same_lanes(self, have, want, what):
        """Vectors made for different tiles combine when they sit in the same lanes and
        slots on this target; anything else is an error naming the conversion."""
        if not isinstance(have, T.RegVecType) or have.of == want.of:
            return
        if L.vec_layout(have, self.t) != L.vec_layout(want, self.t):
            raise self.err(f"{what}: {have} does not sit in the lanes of {want} on "
                           f"{self.t.name}; pk.convert it first")

    def op_convert(self, op):
        """A register-only change of layout: every element the destination's layout puts in a
        lane must already be in that lane (for a transpose: at the swapped position)."""
        src_v, dst_v = op.srcs[0], op.dst
        src_l, dst_l = self.layout(src_v), self.layout(dst_v)
        if op.attrs.get("relabel"):                      # pk.relabel: the registers as they are
            if src_l.nslots != dst_l.nslots or src_l.lanes != dst_l.lanes:
                raise self.err(f"pk.relabel: {src_v.type} holds {src_l.nslots} elements a "
                               f"lane on {self.t.name}, {dst_v.type} {dst_l.nslots}: no "
                               "register-for-register reading")
            self.emit("slots", self.env[dst_v], (self.val(src_v),),
                      index=tuple(range(src_l.nslots)))
            return
        rows, cols = dst_l.coords()
        if op.attrs.get("transpose"):
            rows, cols = cols, rows
        index = self._slot_map(src_l, rows, cols)
        if index is None:
            raise self.err(f"pk.convert: {src_v.type} -> {dst_v.type} moves elements between "
                           f"lanes on {self.t.name}, which pk.convert does not do; on CDNA "
                           "give the operand krun=4 or compute the transposed product")
        src, dst = self.val(src_v), self.env[dst_v]
        if src.type.dtype == dst.type.dtype:
            self.emit("slots", dst, (src,), index=index)
            return
        picked = self.b.reg(src.type.dtype, len(index))
        self.emit("slots", picked, (src,), index=index)
        self.emit("cvt", dst, (picked,))

    @staticmethod
    def _slot_map(src_lay, rows, cols):
        """For each slot of a layout whose lanes hold elements (rows, cols) [lanes, slots],
        the slot of `src_lay` holding the same element in every lane; None if some slot's
        elements are not all in one source slot of their own lanes."""
        sr, sc = src_lay.coords()
        where = {}
        for p in range(src_lay.nslots):
            where.setdefault((sr[:, p].tobytes(), sc[:, p].tobytes()), p)
        index = []
        for s_ in range(rows.shape[1]):
            p = where.get((np.ascontiguousarray(rows[:, s_], np.int64).tobytes(),
                           np.ascontiguousarray(cols[:, s_], np.int64).tobytes()))
            if p is None:
                return None
            index.append(p)
        return tuple(index)

    def op_index(self, op):
        c = self.b.reg(T.i32, self.layout(op.dst).nslots)
        self.emit("coord", c, layout=self.layouts[op.dst], dim=op.attrs["dim"], scope="wave")
        self.emit("bin", self.env[op.dst], (c, self.val(op.srcs[0])), op="add")

    def op_any(self, op):
        r = self.b.reg(T.boolean, uniform=True)
        self.env[op.dst] = self.emit("any", r, (self.val(op.srcs[0]),))

    def op_select(self, op):
        for v in op.srcs[1:]:
            self._same_lanes(v.type, op.srcs[0].type, "where")
        cond, a, b = (self.val(v) for v in op.srcs)
        self.emit("select", self.env[op.dst], (cond, a, b))

    def op_unary(self, op):
        self.emit("un", self.env[op.dst], (self.val(op.srcs[0]),), op=op.attrs["op"])

    def op_fma(self, op):
        a_v = op.srcs[0]
        a = self.val(a_v)
        args = [a]
        for v, how in zip(op.srcs[1:], op.attrs["bcast"]):
            x = self.val(v)
            if how in ("row", "col") and a_v.type.__class__ is T.RegTileType:
                mine = T.RegVecType(v.type.dtype, a_v.type, how)
                self._same_lanes(v.type, mine, "fma")
                g = self.b.reg(x.type.dtype, a.type.nslots)
                x = self.emit("slots", g, (x,), index=L.broadcast_index(mine, self.t))
            elif how == "tile":
                self._same_lanes(v.type, a_v.type, "fma")
            args.append(x)
        self.emit("fma", self.env[op.dst], tuple(args))

    def op_binary(self, op):
        a_v, b_v = op.srcs
        a, b = self.val(a_v), self.val(b_v)
        kind, bop = "bin", op.attrs["op"]
        if bop in ("lt", "le", "gt", "ge"):
            kind = "cmp"
        if op.attrs["bcast"] in ("row", "col") and a_v.type.__class__ is T.RegTileType:
            mine = T.RegVecType(b_v.type.dtype, a_v.type, b_v.type.axis)
            self._same_lanes(b_v.type, mine, bop)
            if bop == "div" and not op.attrs["reverse"] and b_v.type.dtype.is_float:
                r = self.b.reg(b.type.dtype, b.type.nslots)     # one reciprocal per row
                b = self.emit("un", r, (b,), op="recip")
                bop = "mul"
            g = self.b.reg(b.type.dtype, a.type.nslots)
            b = self.emit("slots", g, (b,), index=L.broadcast_index(mine, self.t))
        elif op.attrs["bcast"] == "tile":
            self._same_lanes(b_v.type, a_v.type, bop)
        if op.attrs["reverse"]:
            a, b = b, a
        self.emit(kind, self.env[op.dst], (a, b), op=bop)

    def op_subtile(self, op):
        """A static slot selection: each slot of the window's own layout must be found, in
        the same lane for every lane, among the parent's slots."""
        src_v = op.srcs[0]
        parent, sub = self.layout(src_v), self.layout(op.dst)
        sr, sc = sub.coords()
        r0, c0 = op.attrs["origin"]
        index = self._slot_map(parent, sr + r0, sc + c0)
        if index is None:
            sweep = min(parent.shape[1], parent.lanes * L.TILE_VEC)
            raise self.err(f"subtile {op.dst.type.shape} at {(r0, c0)} does not sit in the "
                           f"same lanes as a fresh tile of that shape; use a window whose "
                           f"column offset and width are multiples of the wave's sweep "
                           f"({sweep} columns on {self.t.name})")
        self.emit("slots", self.env[op.dst], (self.val(src_v),), index=index, window=True)

    def op_xor_cols(self, op):
        """A static slot permutation: element (r, c ^ mask) must be in the lane holding
        (r, c), for every lane."""
        src_v = op.srcs[0]
        rows, cols = self.layout(op.dst).coords()
        index = self._slot_map(self.layout(src_v), rows, cols ^ op.attrs["mask"])
        if index is None:
            raise self.err(f"xor_cols({op.attrs['mask']}) on {src_v.type} exchanges columns "
                           f"held by different lanes on {self.t.name}; use a row-layout "
                           "tile wide enough that each lane holds runs of 8 columns")
        self.emit("slots", self.env[op.dst], (self.val(src_v),), index=index)

    def op_mask(self, op):
        src = self.val(op.srcs[0])
        o0, o1, e0, e1 = (self.val(s) for s in op.srcs[1:])
        rows, cols = self.coords(self.layout(op.srcs[0]), (o0, o1))
        inside = self.bin("and", self.bin("lt", rows, e0), self.bin("lt", cols, e1), T.boolean)
        inside = self.bin("and", inside, self.bin("ge", rows, self.const(0)), T.boolean)
        inside = self.bin("and", inside, self.bin("ge", cols, self.const(0)), T.boolean)
        fill = self.const(op.attrs["value"], src.type.dtype)
        self.emit("select", self.env[op.dst], (inside, src, fill))

    def op_reduce(self, op):
        src_t: T.RegTileType = op.srcs[0].type
        src = self.val(op.srcs[0])
        lay = self.layout(op.srcs[0])
        dim = 0 if op.attrs["axis"] == "row" else 1
        offs = sorted({s[dim] for s in lay.slots})
        groups = tuple(tuple(i for i, s in enumerate(lay.slots) if s[dim] == o) for o in offs)
        rop = op.attrs["op"]
        part = self.b.reg(src_t.dtype, len(groups))
        self.emit("slot_reduce", part, (src,), op=rop, groups=groups)
        bits = tuple(lay.lane_bits_of(1 - dim))
        if bits:
            self.emit("bfly", part, (part,), op=rop, bits=bits)
        dst = self.env[op.dst]
        if op.attrs["accumulate"]:
            self._same_lanes(op.dst.type, T.RegVecType(src_t.dtype, src_t, op.attrs["axis"]),
                             f"{op.attrs['axis']}_{rop} into=")
            self.emit("bin", dst, (dst, part), op=rop)
        else:
            self.emit("mov", dst, (part,))

    def op_wg_reduce(self, op):
        self._wg_reduce([op])

    def _wg_reduce(self, ops):
        """Each wave writes its vectors to its own slices of shared scratch tiles (one per
        reduction); after a barrier every wave reads all slices and combines them in wave
        order, so every wave holds the same bits. The barrier in front keeps a wave from
        overwriting a slice that a slower wave still reads from the previous execution of
        these reductions. Adjacent independent reductions (_reduction_group) share the two
        barriers."""
        nw = self.k.num_waves
        if nw == 1:
            for op in ops:
                self.emit("mov", self.env[op.dst], (self.val(op.srcs[0]),))
            return
        wave = self.b.reg(T.i32, uniform=True)
        self.emit("special", wave, name="wave_id", axis=0)
        zero = self.const(0)
        slots = []
        for op in ops:
            t: T.RegVecType = op.srcs[0].type
            shape, step, row0 = self._wave_slice(t, wave)
            region = self._lds_region("wgred", T.SharedTileType(t.dtype, shape), LDS_ALIGN)
            slots.append((op, region, step, row0))
        self.emit("barrier")
        for op, region, step, row0 in slots:
            v = op.srcs[0]
            self.lds_store(region, self.layout(v), (row0, zero), "wave", self.val(v))
        self.emit("barrier")
        for op, region, step, row0 in slots:
            lay = self.layout(op.srcs[0])
            self._combine(self.env[op.dst], (
                self.lds_load(region, lay, (self.const(w * step), zero), "wave")
                for w in range(nw)), op.attrs["op"])

    def _wave_slice(self, t: T.RegVecType, wave):
        """(shape, row step, the row of `wave`) of a scratch tile holding one vector of type
        t per wave: row vectors lie along rows, column vectors along columns."""
        nw, n = self.k.num_waves, t.length
        shape, step = ((nw * n, 1), n) if t.axis == "row" else ((nw, n), 1)
        return shape, step, self.bin("mul", wave, self.const(step)) if step != 1 else wave

    def _combine(self, dst, parts, rop):
        """dst = parts combined by `rop` in order (parts may be a generator: each part is
        loaded just before it is combined)."""
        for i, part in enumerate(parts):
            if i == 0:
                self.emit("mov", dst, (part,))
            else:
                self.emit("bin", dst, (dst, part), op=rop)

    def op_cluster_reduce(self, op):
        """pk.cluster_sum: each wave writes its vector to its own slice of a shared scratch
        tile; after the cluster's barrier it reads the slice of its index in every
        workgroup of the cluster (rank order, its own included) and combines them; a second
        barrier keeps every workgroup's scratch (and the workgroup) alive until all have
        read it."""
        v, n_cta = op.srcs[0], self.k.cluster
        if n_cta == 1:
            self.emit("mov", self.env[op.dst], (self.val(v),))
            return
        t: T.RegVecType = v.type
        wave = self.b.reg(T.i32, uniform=True)
        self.emit("special", wave, name="wave_id", axis=0)
        shape, _, row0 = self._wave_slice(t, wave)
        # one scratch tile per shape, shared by every cluster_sum: each ends with the
        # barrier after the last read of it
        key = (t.dtype, shape)
        region = self.cluster_scratch.get(key)
        if region is None:
            region = self.cluster_scratch[key] = self._lds_region(
                "clred", T.SharedTileType(t.dtype, shape), LDS_ALIGN)
        zero, lay = self.const(0), self.layout(v)
        self.lds_store(region, lay, (row0, zero), "wave", self.val(v))
        self.emit("cluster_sync")
        self._combine(self.env[op.dst], (
            self.lds_load(region, lay, (row0, zero), "wave", rank=self.const(r))
            for r in range(n_cta)), op.attrs["op"])
        self.emit("cluster_sync")

    def op_mma(self, op):
        """One matrix instruction per (i, j, k) triple of base tiles, k innermost."""
        if isinstance(op.srcs[1].type, T.SharedTileType):
            return self._mma_shared_b(op)
        a_v, b_v, c_v = op.srcs[:3]
        scales = op.srcs[3:]
        fams = {v: L.family(v.type, self.t) for v in (a_v, b_v, op.dst, *scales)}
        if len(set(fams.values())) > 1:
            sizes = ", ".join(str(fams[v]) for v in (op.dst, a_v, b_v, *scales))
            raise self.err(f"mma: the tiles (d, a, b{', scales' if scales else ''}) resolve to "
                           f"different matrix-instruction sizes on {self.t.name} ({sizes}); "
                           "give them the same mma=")
        for v in (a_v, b_v, c_v, op.dst, *scales):
            self.layout(v)
        try:
            ins = L.mma_instr(a_v.type, self.t)
        except NotSupportedYet as e:
            raise self.err(e.message, NotSupportedYet) from None
        trans = op.attrs["trans"]
        m, n = op.dst.type.shape
        k = a_v.type.shape[1] if trans[0] == "N" else a_v.type.shape[0]
        if k % ins.k:
            raise self.err(f"mma: K={k} is not a multiple of {ins.name}'s K={ins.k}; use a "
                           f"K of {ins.k}, {2 * ins.k}, ...")
        zero = op.attrs.get("zero", False)
        d = self.env[op.dst] if zero else self._accumulator(op.dst, c_v)
        a, b = self.val(a_v), self.val(b_v)
        extra = tuple(self.val(s) for s in scales)
        for i in range(m // ins.m):
            for j in range(n // ins.n):
                cs = self._base_slots(op.dst, i, j)
                for kk in range(k // ins.k):
                    if zero and kk == 0:
                        attrs0 = {"zero": True}
                    else:
                        attrs0 = {}
                    ai, aj = (i, kk) if trans[0] == "N" else (kk, i)
                    bi, bj = (kk, j) if trans[1] == "N" else (j, kk)
                    attrs = {}
                    if scales:
                        attrs = {"sa_slots": self._base_slots(scales[0], i, kk),
                                 "sb_slots": self._base_slots(scales[1], kk, j)}
                    self.emit("mma", d, (a, b, d) + extra, instr=ins,
                              a_slots=self._base_slots(a_v, ai, aj),
                              b_slots=self._base_slots(b_v, bi, bj), c_slots=cs, **attrs,
                              **attrs0)

    def _mma_shared_b(self, op):
        """Hopper warpgroup MMA (wgmma): b from a 128B-swizzled shared tile, K x N (mma_AB,
        N = one 128-byte row) or N x K (mma_ABt, K-major: N up to 256, K one 128-byte row);
        a from each wave's registers (16 rows) or, with mma_ABt, from a shared 64 x K tile
        holding the warpgroup's rows. Each wave owns 16 rows of d."""
        a_v, b_v, c_v = op.srcs
        st, kmajor = b_v.type, op.attrs["trans"][1] == "T"
        a_kmajor = op.attrs["trans"][0] == "N"
        if self.t.family != "hopper":
            raise self.err(f"mma with b in shared memory is Hopper's wgmma form; on "
                           f"{self.t.name} load b into a register tile (role='b')",
                           NotSupportedYet)
        n, k = st.shape if kmajor else st.shape[::-1]
        dt = st.dtype
        kstep = 32 if dt.bits == 8 else 16
        row = st.shape[1] * dt.bytes
        if op.dst.type.shape != (16, n):
            raise self.err("wgmma gives each wave 16 rows: make a (16, K) and d (16, N)")
        if kmajor:
            if dt.bits == 8 and not dt.is_fp8 or st.swizzle != 8 or row % 128 \
                    or n % 16 or not 16 <= n <= 256:
                raise self.err(f"mma_ABt reads b as an N x K {dt} tile with rows of a multiple "
                               f"of 128 bytes (K = {128 // dt.bytes}, {256 // dt.bytes}, ...), "
                               f"swizzle=8 (the 128B pattern) and N a multiple of 16 up to "
                               f"256; got {st}")
        elif dt.name not in ("bf16", "f16") or row % 128 or n > 256 or st.swizzle != 8 \
                or k % 16:
            raise self.err(f"wgmma reads b as a K x N {dt} tile with rows of a multiple of "
                           f"128 bytes (N = {128 // dt.bytes}, {256 // dt.bytes}, ... up to 256), "
                           f"swizzle=8 (the 128B pattern) and K a multiple of 16; fp8 operands "
                           f"need b stored N x K (mma_ABt); got {st}")
        if self.k.num_waves % 4:
            raise self.err("wgmma is warpgroup-wide: num_waves must be a multiple of 4")
        a_shared = isinstance(a_v.type, T.SharedTileType)
        if a_shared and a_kmajor and (a_v.type.swizzle != 8 or a_v.type.shape[1] *
                                      a_v.type.dtype.bytes % 128):
            raise self.err(f"a shared a is 64 x K with rows of a multiple of 128 bytes and "
                           f"swizzle=8; got {a_v.type}")
        if a_shared and not a_kmajor and (a_v.type.swizzle != 8 or a_v.type.shape[1] != 64
                                          or a_v.type.dtype.name not in ("bf16", "f16")):
            raise self.err(f"mma_AtB reads a shared a as K x 64 (one 128-byte row per K) "
                           f"bf16/f16 tile with swizzle=8; got {a_v.type}")
        for v in (c_v, op.dst) if a_shared else (a_v, c_v, op.dst):
            self.layout(v)
        zero = op.attrs.get("zero", False)
        d = self.env[op.dst] if zero else self._accumulator(op.dst, c_v)
        a = self.env[a_v] if a_shared else self.val(a_v)
        self.emit("wgmma", d, (a, d) if not a_shared else (d,), region=self.env[b_v],
                  a_region=a if a_shared else None, b_kmajor=kmajor, a_kmajor=a_kmajor,
                  a_layout=None if a_shared else self.layouts[a_v],
                  acc_layout=self.layouts[op.dst], n=n, k=k, kstep=kstep,
                  a_dtype=a_v.type.dtype.name, in_flight=op.attrs.get("in_flight", 0),
                  zero=zero)

    def op_mma_wait(self, op):
        if self.t.family != "hopper":
            raise self.err(f"pk.mma_wait waits for Hopper's asynchronous wgmma groups; "
                           f"{self.t.name}'s matrix instructions complete in order",
                           NotSupportedYet)
        self.emit("wgmma_wait", None, tuple(self.env[a] for a in op.srcs),
                  in_flight=op.attrs["in_flight"])

    def _accumulator(self, d_v, c_v):
        """d's register, holding c to start with (d <- a @ b + c accumulates in place)."""
        d = self.env[d_v]
        if c_v is not d_v:
            self.emit("mov", d, (self.val(c_v),))
        return d

    def _base_slots(self, v, i, j) -> tuple[int, ...]:
        """Slots of base tile (i, j) of a tiled role layout (see layouts.tiled)."""
        base = L.role_base(v.type, self.t)
        per = base.nslots
        index = i * (v.type.shape[1] // base.shape[1]) + j
        return tuple(range(index * per, (index + 1) * per))

    # -- memory -------------------------------------------------------------------------
    # Every access is a *window*: a layout placed at an origin. The lane ops carry the origin
    # and the layout, so the renderer can address and bounds-check per contiguous run.

    def _window(self, tile_v, coords_v):
        """(layout, dims, lead indices, origin) of a register tile/vector placed in a tensor:
        a tile covers the last two tensor dims, a row/col vector the last one."""
        lay = self.layout(tile_v)
        c = [self.val(x) for x in coords_v]
        t = tile_v.type
        dims = ((0,) if t.axis == "row" else (1,)) if isinstance(t, T.RegVecType) else (0, 1)
        return lay, dims, c[:-len(dims)], c[-len(dims):]

    def _wg_layout(self, st_t):
        try:
            return L.workgroup_layout(st_t, self.t, self.k.num_waves)
        except ValueError:
            raise self.err(f"shared tile {st_t} has fewer elements than the workgroup's "
                           f"{self.t.wave_size * self.k.num_waves} lanes; use a larger tile "
                           "or fewer waves") from None

    def gload(self, gl, lay, dims, lead, origin, scope, fill, end=None, inside=False):
        raw = self.b.reg(gl.type.dtype, lay.nslots)
        return self.emit("gload", raw, (gl, *lead, *origin), layout=lay, dims=dims,
                         scope=scope, fill=fill, **self._ends(end, gl, dims),
                         **({"inside": True} if inside else {}))

    def gstore(self, gl, lay, dims, lead, origin, scope, val, end=None, inside=False):
        self.emit("gstore", None, (gl, *lead, *origin, self.cvt(val, gl.type.dtype)),
                  layout=lay, dims=dims, scope=scope, **self._ends(end, gl, dims),
                  **({"inside": True} if inside else {}))

    def _ends(self, end, gl, dims) -> dict:
        """The `ends` attribute of a window: per window dim, the register of an extra
        exclusive bound (pk.load/store's end=) or None; absent when there is none."""
        if end is None:
            return {}
        rank = gl.type.rank
        ends = tuple(end[rank - len(dims) + i] for i in range(len(dims)))
        if all(e is None for e in ends):
            return {}
        return {"ends": tuple(None if e is None else self.val(e) for e in ends)}

    def op_sload(self, op):
        gl, *idx = op.srcs
        r = self.b.reg(op.dst.type.dtype, uniform=True)
        self.env[op.dst] = self.emit("sload", r, (self.val(gl), *(self.val(i) for i in idx)))

    def lds_load(self, region, lay, origin, scope, rank=None):
        """A window of a shared tile; rank (a register): in that workgroup of the cluster."""
        raw = self.b.reg(region.tile.dtype, lay.nslots)
        srcs = tuple(origin) + ((rank,) if rank is not None else ())
        return self.emit("lds_load", raw, srcs, region=region, layout=lay, scope=scope)

    def lds_store(self, region, lay, origin, scope, val):
        self.emit("lds_store", None, (*origin, self.cvt(val, region.tile.dtype)),
                  region=region, layout=lay, scope=scope)

    def _into(self, dst_v, raw):
        self.emit("cvt" if raw.type.dtype != dst_v.type.dtype else "mov", self.env[dst_v], (raw,))

    def op_load(self, op):
        src_v, coords_v, dst_v = op.srcs[0], op.srcs[1:], op.dst
        fill = op.attrs["fill"]
        if isinstance(src_v.type, T.GlobalType):
            gl = self.val(src_v)
            if isinstance(dst_v.type, T.SharedTileType):      # global -> shared, cooperative
                region = self.env[dst_v]
                c = [self.val(x) for x in coords_v]
                if op.attrs.get("direct") and self.t.lds_dma_bytes:
                    return self._direct_to_lds(gl, region, c)
                lay = self._wg_layout(region.tile)
                raw = self.gload(gl, lay, (0, 1), c[:-2], c[-2:], "workgroup", fill,
                                 op.attrs.get("end"))
                zero = self.const(0)
                self.lds_store(region, lay, (zero, zero), "workgroup", raw)
                return
            lay, dims, lead, origin = self._window(dst_v, coords_v)
            self._into(dst_v, self.gload(gl, lay, dims, lead, origin, "wave", fill,
                                         op.attrs.get("end"), op.attrs.get("inside", False)))
            return
        region = self.env[src_v]                              # shared -> register
        origin = [self.val(x) for x in coords_v]
        lay = self.layout(dst_v)
        src = L.tr16_source(lay) if self.t.lds_read_tr16 and region.tile.dtype.bits == 16 \
            else None
        if src is not None:                                   # column runs: transpose reads
            raw = self.b.reg(region.tile.dtype, lay.nslots)
            self.emit("lds_load_tr", raw, tuple(origin), region=region, layout=lay,
                      source=src, scope="wave")
            self._into(dst_v, raw)
            return
        self._into(dst_v, self.lds_load(region, lay, origin, "wave"))

    def _direct_to_lds(self, gl, region, c):
        """One lane op for a memory -> LDS copy in per-lane chunks of the target's DMA size;
        its workgroup layout puts lane L of a chunk group at flat element L * vec, which is
        where the hardware writes (LDS base + lane * bytes)."""
        st = region.tile
        vec = max(1, self.t.lds_dma_bytes // st.dtype.bytes)
        lanes = self.t.wave_size * self.k.num_waves
        try:
            lay = L.row_major_lane_layout(st.shape, lanes, vec)
        except ValueError:
            raise self.err(f"shared tile {st} is too small for a direct load by "
                           f"{lanes} lanes") from None
        # The hardware writes lane L's chunk at (group base + L * bytes): check that the layout
        # puts chunk groups exactly there (row-major flat positions, contiguous in lane order).
        rows, cols = lay.coords()
        flat = rows * st.shape[1] + cols
        lanes_idx = np.arange(lanes)
        if lay.nslots % vec or any(
                not np.array_equal(flat[:, g], flat[0, g] + lanes_idx * vec) or
                not np.array_equal(flat[:, g:g + vec] - flat[:, g:g + 1], np.tile(np.arange(vec), (lanes, 1)))
                for g in range(0, lay.nslots, vec)):
            raise self.err(f"shared tile {st} cannot be copied in {self.t.lds_dma_bytes}-byte "
                           "chunks per lane; use the ordinary load")
        self.emit("gload_lds", None, (gl, *c[:-2], *c[-2:]), region=region, layout=lay,
                  dims=(0, 1), scope="workgroup", vec=vec)

    def op_atomic_add(self, op):
        gl = self.val(op.dst)
        lay, dims, lead, origin = self._window(op.srcs[0], op.srcs[1:])
        val = self.cvt(self.val(op.srcs[0]), T.f32)
        self.emit("gatomic_add", None, (gl, *lead, *origin, val), layout=lay, dims=dims,
                  scope="wave", **self._ends(op.attrs.get("end"), gl, dims))

    def op_discard(self, op):
        gl = self.val(op.dst)
        lay, dims, lead, origin = self._window(op.srcs[0], op.srcs[1:])
        t = op.srcs[0].type
        width = t.length if isinstance(t, T.RegVecType) else t.shape[1]
        self.emit("gdiscard", None, (gl, *lead, *origin), layout=lay, dims=dims,
                  scope="wave", width=width, **self._ends(op.attrs.get("end"), gl, dims))

    def op_store(self, op):
        dst_v, src_v, coords_v = op.dst, op.srcs[0], op.srcs[1:]
        if isinstance(dst_v.type, T.GlobalType):
            gl = self.val(dst_v)
            if isinstance(src_v.type, T.SharedTileType):      # shared -> global, cooperative
                region = self.env[src_v]
                lay = self._wg_layout(region.tile)
                zero = self.const(0)
                raw = self.lds_load(region, lay, (zero, zero), "workgroup")
                c = [self.val(x) for x in coords_v]
                self.gstore(gl, lay, (0, 1), c[:-2], c[-2:], "workgroup", raw,
                            op.attrs.get("end"))
                return
            lay, dims, lead, origin = self._window(src_v, coords_v)
            self.gstore(gl, lay, dims, lead, origin, "wave", self.val(src_v),
                        op.attrs.get("end"), op.attrs.get("inside", False))
            return
        region = self.env[dst_v]                              # register -> shared
        origin = [self.val(x) for x in coords_v]
        self.lds_store(region, self.layout(src_v), origin, "wave", self.val(src_v))

    # -- control ------------------------------------------------------------------------
    def op_for(self, op):
        start, stop = (self.val(s) for s in op.srcs)
        idx = self.b.reg(T.i32, uniform=True, name="i")
        self.env[op.dst] = idx
        body = self.sub_block(op.regions[0])
        self.loc = op.loc
        self.emit("for", idx, (start, stop), regions=[body], step=op.attrs["step"])

    def op_if(self, op):
        cond = self.val(op.srcs[0])
        regions = [self.sub_block(r) for r in op.regions]
        self.loc = op.loc
        self.emit("if", None, (cond,), regions=regions)

    def op_barrier(self, op):
        self.emit("barrier")

    # -- peers and flags ----------------------------------------------------------------
    def op_peer(self, op):
        """One rank's tensor of a pk.peers, picked at run time: a view that loads, stores
        and flags use as their tensor (sizes and strides are the first rank's, equal)."""
        *members, rank = (self.val(s) for s in op.srcs)
        view = Value(op.dst.type, members[0].name)
        self.env[op.dst] = self.emit("peer", view, (*members, rank))

    def op_signal(self, op):
        self.emit("signal", None, tuple(self.val(s) for s in op.srcs), add=op.attrs["add"],
                  scope=op.attrs.get("scope", "system"))

    def op_timestamp(self, op):
        self.emit("timestamp", None, tuple(self.val(s) for s in op.srcs))

    def op_flag_wait(self, op):
        self.emit("flag_wait", None, tuple(self.val(s) for s in op.srcs),
                  tma=op.attrs.get("tma", True), scope=op.attrs.get("scope", "system"))

    def op_arrive(self, op):
        if op.attrs.get("remote"):          # on the barrier of cluster workgroup srcs[1]
            self.emit("mbar_arrive", None, (self.val(op.srcs[1]),),
                      region=self.env[op.srcs[0]], remote=True)
            return
        self.emit("mbar_arrive", None, (), region=self.env[op.srcs[0]])

    def op_cluster_sync(self, op):
        self.emit("cluster_sync")

    def op_wait(self, op):
        self.emit("mbar_wait", None, (self.val(op.srcs[1]),), region=self.env[op.srcs[0]])

    def op_tma_load(self, op):
        if self.t.family != "hopper":
            raise self.err(f"TMA is a Hopper feature; on {self.t.name} use pk.load (direct=True "
                           "copies memory straight into LDS on CDNA)", NotSupportedYet)
        gl_v, *coords, bar_v, at = op.srcs
        st = op.dst.type
        desc = self._tmap(gl_v, (op.attrs["rows"], st.shape[1] // st.atoms), st.swizzle == 8)
        self.emit("tma_load", None, (*(self.val(c) for c in coords), self.val(at)), gl=gl_v,
                  tmap=desc, region=self.env[op.dst], bar=self.env[bar_v],
                  multicast=op.attrs.get("multicast", False))

    def _tmap(self, gl_v, box, swizzle128):
        """The tensor map of TMA copies of `box` (rows, columns: the last two dims; 1 in
        the others) of tensor `gl_v`: one per tensor, box and swizzle."""
        from ..ir.abi import TMADesc
        for t in self.tmaps:
            if (t.param, t.box, t.swizzle128) == (gl_v.name, box, swizzle128):
                return t
        desc = TMADesc(f"{gl_v.name}.tmap{len(self.tmaps)}", gl_v.name, box, swizzle128)
        self.tmaps.append(desc)
        return desc

    def op_tma_store(self, op):
        if self.t.family != "hopper":
            raise self.err(f"TMA is a Hopper feature; on {self.t.name} use pk.store",
                           NotSupportedYet)
        st_v, *coords = op.srcs
        st = st_v.type
        desc = self._tmap(op.dst, (st.shape[0], st.shape[1] // st.atoms), st.swizzle == 8)
        self.emit("tma_store", None, tuple(self.val(c) for c in coords), gl=op.dst, tmap=desc,
                  region=self.env[st_v], add=op.attrs.get("add", False),
                  wait=op.attrs.get("wait", True))

    def op_tma_store_wait(self, op):
        if self.t.family != "hopper":
            raise self.err(f"TMA is a Hopper feature; on {self.t.name} use pk.store",
                           NotSupportedYet)
        self.emit("tma_store_wait", None, (), pending=op.attrs.get("pending", 0))

    def op_setmaxnreg(self, op):
        if self.t.family != "hopper":
            return                          # register budgets are a Hopper notion
        if op.attrs["first_wave"] % 4 or op.attrs["num_waves"] % 4:
            raise self.err("on Hopper a role with regs= must cover whole warpgroups: "
                           "first_wave and num_waves multiples of 4 (setmaxnreg is "
                           "warpgroup-wide)")
        self.reg_budget[op.attrs["first_wave"]] = op.attrs["regs"] * op.attrs["num_waves"] * \
            self.t.wave_size
        threads = self.k.num_waves * self.t.wave_size
        cap = self.t.entry_register_cap(threads)
        total = sum(self.reg_budget.values())
        if total > cap * threads:
            raise self.err(f"warp roles ask for {total} registers in total, but the "
                           f"workgroup starts with {cap} a thread ({cap * threads}) and "
                           f"setmaxnreg only moves them between roles (a raise beyond "
                           f"that waits forever): lower some role's regs=")
        self.emit("setmaxnreg", regs=op.attrs["regs"])

    def op_setprio(self, op):
        self.emit("setprio", level=op.attrs["level"])

    def op_sched_barrier(self, op):
        self.emit("sched_barrier", mask=self.t.sched_mask(op.attrs["classes"]))

    def op_sched_group(self, op):
        a = op.attrs
        self.emit("sched_group", mask=self.t.sched_mask(a["classes"]), size=a["size"],
                  sync_id=a["sync_id"])

    def op_waitcnt(self, op):
        self.emit("waitcnt", **op.attrs)


def lower(k: KernelIR, target) -> LaneProgram:
    """Verify `k` for `target`, then lower it to a lane program."""
    target = get_target(target)
    verify(k, target)
    return _Lowering(k, target).run()


def _reduction_group(ops, i):
    """(ops taken, their allocations, the reductions): ops[i] and the workgroup reductions
    right after it, each with the allocation of its result just before it, that do not read
    an earlier one's result — reductions the lowering gives one round of barriers; else
    (1, [], [ops[i]])."""
    group, allocs, j = [ops[i]], [], i + 1
    if ops[i].kind != "wg_reduce":
        return 1, allocs, group
    while j + 1 < len(ops):
        alloc, nxt = ops[j], ops[j + 1]
        if alloc.kind != "alloc" or nxt.kind != "wg_reduce" or nxt.dst is not alloc.dst or \
                any(nxt.srcs[0] is g.dst for g in group):
            break
        allocs.append(alloc)
        group.append(nxt)
        j += 2
    return j - i, allocs, group
