"""The emulator: a workgroup's waves run as separate instruction streams (generators) that
meet at barriers; LDS is a byte array with per-byte write/read tracking, so reads of
never-written shared memory, races between waves and out-of-bounds accesses are reported
with the kernel name, the user's line, the workgroup and the wave.

Global tensors that the kernel writes are tracked per element too: two workgroups (or two
waves of one workgroup not ordered by a barrier) writing one element, or one reading an
element another writes, is a race — the GPU runs workgroups in no fixed order, so such a
result depends on timing. Atomic adds (pk.atomic_add, TMA reduce-add stores) may meet
each other; they race only with plain writes and reads. Arguments passed as the same array
(an in-place update) share one buffer, as they share memory on the GPU."""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from ..ir import types as T
from ..ir.errors import KernelError
from ..ir.nodes import walk
from ..lower.lane import LaneProgram
from . import values as V


class EmulatorError(KernelError):
    pass


class OutOfBounds(EmulatorError):
    pass


class UnwrittenRead(EmulatorError):
    pass


class Race(EmulatorError):
    pass


class Misaligned(EmulatorError):
    """An access whose address the hardware requires aligned, not aligned (as the GPU's
    "misaligned address" error)."""


class MissingBarrier(Race, UnwrittenRead):
    """A wave reads shared memory that other waves write, before they wrote it: the
    barrier between the store and the load is missing."""


class BarrierMismatch(EmulatorError):
    """Some waves wait at a barrier that the others never reach: a deadlock."""


class Deadlock(EmulatorError):
    """Every workgroup still running (on every rank) waits for a flag that nothing left
    to run will raise."""


class _GlobalBuf:
    """A global tensor (C order copy). `track`: the kernel writes it, so every access
    records who made it (a unit: a wave of the world, _Machine._unit) and when (its
    workgroup's clock), for the race checks."""

    def __init__(self, name, arr: np.ndarray, gt: T.GlobalType, track: bool = False):
        self.name = name
        self.names = [name]
        self.flat = np.ascontiguousarray(arr).reshape(-1).copy()
        self.shape = arr.shape
        st, acc = [], 1
        for d in reversed(arr.shape):
            st.append(acc)
            acc *= d
        self.strides = tuple(reversed(st))
        self.track = track
        self.released: dict = {}     # flag element -> its signals (World's race checks)
        if track:
            n, i32 = self.flat.size, np.int32        # (times: a workgroup's own clock)
            self.w_unit, self.w_time = np.full(n, -1, i32), np.full(n, -1, i32)
            self.a_unit, self.a_time = np.full(n, -1, i32), np.full(n, -1, i32)
            self.r_unit, self.r_time = np.full(n, -1, i32), np.full(n, -1, i32)
            self.r_many = np.zeros(n, bool)          # read by two or more workgroups

    def label(self) -> str:
        also = [n for n in self.names if n != self.name]
        return repr(self.name) + (f" (also passed as {', '.join(map(repr, also))})"
                                  if also else "")


class _Workgroup:
    """LDS and its tracking for one workgroup.

    Ordering between waves is tracked with vector clocks: every LDS access gets a time; a
    wave has seen another wave's accesses up to vc[wave][other]. A workgroup barrier makes
    everything before it visible to everyone; an mbarrier phase makes the arriving waves'
    past visible to the waves that wait on it. An access by one wave to bytes another wave
    touched at a time the first has not seen is a race."""

    def __init__(self, nbytes, num_waves, gid):
        self.gid = gid                           # index among all launches' workgroups
        self.waves: list = []
        n = max(nbytes, 1)
        self.lds = np.zeros(n, np.uint8)
        self.written = np.zeros(n, bool)
        self.w_time = np.full(n, -1, np.int64)
        self.w_wave = np.full(n, -1, np.int64)
        self.r_time = np.full((n, num_waves), -1, np.int64)
        self.vc = np.full((num_waves, num_waves), -1, np.int64)
        self.time = 0
        self.mbarriers: dict = {}
        self.ended: set = set()                  # ranks of a cluster's finished workgroups

    def tick(self) -> int:
        self.time += 1
        return self.time

    def sync_all(self, waves=None):
        """A barrier of `waves` (default all): each has seen what any of them did or saw."""
        waves = self.waves if waves is None else waves
        g = [w.wave for w in waves]
        seen = self.vc[g].max(axis=0)
        seen[g] = self.time
        self.vc[g] = seen
        ext = [w.ext for w in waves if w.ext is not None]
        if ext:                                  # and what each wave learnt from flags
            merged = np.maximum.reduce(ext)
            for e in ext:
                e[:] = merged


class _MBarrier:
    """Arrival count, current phase, and what each completed phase made visible."""

    def __init__(self, count, num_waves):
        self.count, self.pending, self.phase = count, count, 0
        self.tx = 0                          # bytes expected by arrivals, less those landed
        self.acc = np.full(num_waves, -1, np.int64)
        self.completed: dict = {}            # parity -> vector clock of its last completion
        self.ext = None                      # arrivals' knowledge of other workgroups
        self.completed_ext: dict = {}


class _Wave:
    """One wave of a workgroup; in a cluster (pk.cluster) the workgroups share one
    _Workgroup: `wave` numbers the cluster's waves (vector clocks, LDS tracking), `local`
    is the wave's index in its own workgroup (wave_id), `rank` its workgroup's place in the
    cluster (its shared memory comes rank x span bytes into the cluster's), `gid` its
    workgroup's index among all launches' workgroups."""

    def __init__(self, m: "_Machine", wg: _Workgroup, pid, wave: int, rank: int = 0,
                 gid: int | None = None):
        self.m, self.wg, self.pid, self.wave = m, wg, pid, wave
        self.rank, self.local = rank, wave - rank * m.p.num_waves
        self.cluster_syncs = 0          # cluster barriers passed
        self.gid = wg.gid if gid is None else gid
        self.regs: dict = {}
        self.barriers = 0
        self.waiting_op = None
        self.prio = 0
        self.wgmma_groups: list = []    # issued, not yet retired: (op, a registers at issue)
        self.tma_stores: list = []      # tma_store(wait=False) not yet waited for: (op, copy)
        # what this wave has seen of other workgroups' global accesses, per unit (a wave of
        # any launch in the world): the time of that unit's workgroup clock; only kept
        # where flags can order workgroups (World.sync)
        self.ext = np.full(m.world.units, -1, np.int64) if m.world.sync else None


class _Machine:
    """One launch of a World (a single launch is a world of one): a lane program over a
    grid. `gid_base` numbers its workgroups after the earlier launches', and units (waves)
    are numbered world-wide with `world.ustride` per workgroup."""

    def __init__(self, prog: LaneProgram, bufs: dict, scalars: dict, grid, world: "World",
                 gid_base: int = 0, label: str = ""):
        self.p, self.bufs, self.scalars, self.grid = prog, bufs, scalars, grid
        self.world, self.gid_base, self.label = world, gid_base, label
        self.ustride = world.ustride
        self.W = prog.wave_size
        self._coord_cache: dict = {}
        self.lds_written = _lds_written_ranges(prog)
        # a cluster's workgroups keep their shared memory side by side in one array,
        # 1024-byte aligned as each workgroup's own is
        self.lds_span = -(-max(prog.lds_bytes, 1) // 1024) * 1024
        self._ranked: dict = {}

    # -- global races --------------------------------------------------------------------
    def _unit(self, w: _Wave) -> int:
        return w.gid * self.ustride + w.local

    def _unordered(self, w: _Wave, units, times):
        """Which of the accesses (by `units`, at their workgroup's clock `times`) wave w
        has not seen: by another wave of its own workgroup since the last barrier (or
        mbarrier wait) that ordered them, or by another workgroup (of any launch) unless a
        flag it waited on published them."""
        nw = self.ustride
        known = units >= 0
        wg = units // nw
        other_wg = known & (wg != w.gid)
        other_wave = known & ~other_wg & (units != self._unit(w))
        first = w.rank * self.p.num_waves            # this workgroup's waves in the clocks
        seen = w.wg.vc[w.wave][np.where(other_wave, first + units % nw, 0)]
        mine = other_wave & (times > seen)
        if w.ext is None:
            return other_wg | mine
        return (other_wg & (times > w.ext[np.where(known, units, 0)])) | mine

    def _who(self, unit: int) -> str:
        return self.world.who(int(unit))

    def _global_race(self, w, op, buf, offs, bad, other_units, what, other_did):
        i = int(np.argmax(bad))
        elem = tuple(int(c) for c in np.unravel_index(int(offs[i]), buf.shape))
        u = int(other_units[i])
        who = self._who(u) if u >= 0 and u != self._unit(w) else "another workgroup"
        if self.world.sync:
            raise self.fail(Race, w, op, f"race on global tensor {buf.label()}: {what} element "
                            f"{elem}, which {who} {other_did} with no flag ordering the two: "
                            "the reader (or second writer) must pk.wait_flag on a flag that "
                            "the first raised with pk.signal after that access (a wave's "
                            "signal publishes its own accesses and what it saw: a "
                            "pk.barrier() before it brings in the other waves')")
        raise self.fail(Race, w, op, f"race on global tensor {buf.label()}: {what} element "
                        f"{elem}, which {who} {other_did} in the same launch; workgroups (and "
                        "waves between barriers) run in no fixed order on the GPU, so the "
                        "result depends on timing: give each element one writer (check the "
                        "tile coordinates or the grid mapping), accumulate with "
                        "pk.atomic_add, or pass separate input and output tensors")

    def global_read(self, w, op, buf, offs):
        if not buf.track or offs.size == 0:
            return
        offs = np.asarray(offs).reshape(-1)
        for units, times, did in ((buf.w_unit, buf.w_time, "writes"),
                                  (buf.a_unit, buf.a_time, "adds to atomically")):
            u = units[offs]
            bad = self._unordered(w, u, times[offs])
            if np.any(bad):
                self._global_race(w, op, buf, offs, bad, u, "reads", did)
        me, wg = self._unit(w), w.gid
        prev = buf.r_unit[offs]
        buf.r_many[offs] |= (prev >= 0) & (prev // self.ustride != wg)
        buf.r_unit[offs] = me
        buf.r_time[offs] = w.wg.tick()

    def global_write(self, w, op, buf, offs, atomic=False):
        if not buf.track or offs.size == 0:
            return
        offs = np.asarray(offs).reshape(-1)
        checks = [(buf.w_unit, buf.w_time, "writes")]
        if not atomic:
            checks.append((buf.a_unit, buf.a_time, "adds to atomically"))
        checks.append((buf.r_unit, buf.r_time, "reads"))
        what = "adds atomically to" if atomic else "writes"
        for units, times, did in checks:
            u = units[offs]
            bad = self._unordered(w, u, times[offs])
            if units is buf.r_unit:
                bad = bad | buf.r_many[offs]
            if np.any(bad):
                self._global_race(w, op, buf, offs, bad, u, what, did)
        t = w.wg.tick()
        if atomic:
            buf.a_unit[offs], buf.a_time[offs] = self._unit(w), t
        else:
            buf.w_unit[offs], buf.w_time[offs] = self._unit(w), t

    # -- errors -------------------------------------------------------------------------
    def fail(self, cls, w: _Wave, op, msg):
        where = f"workgroup {tuple(w.pid)}, wave {w.local}"
        return cls(f"{msg} ({where}, op {op.kind})", op.loc, self.p.name)

    # -- registers ----------------------------------------------------------------------
    def get(self, w: _Wave, v):
        if w.wgmma_groups and any(g[0].dst is v for g in w.wgmma_groups):
            raise _Busy(v)
        try:
            return w.regs[v]
        except KeyError:
            raise _Unset(v) from None

    def unset(self, w: _Wave, op, v):
        return self.fail(UnwrittenRead, w, op, f"reads {v!r} before anything was written to "
                         "it: a tile from pk.empty, or a value set only inside a pk.if_ "
                         "branch that was not taken")

    def read(self, w: _Wave, op, v):
        try:
            return self.get(w, v)
        except _Unset:
            raise self.unset(w, op, v) from None

    def put(self, w: _Wave, v, x):
        t = v.type
        x = V.to_dtype(x, t.dtype)
        if not t.uniform:
            x = np.broadcast_to(x, (self.W, t.nslots)).copy() if np.ndim(x) < 2 else x
            if x.shape != (self.W, t.nslots):
                x = np.broadcast_to(x, (self.W, t.nslots)).copy()
        w.regs[v] = x

    def coords(self, w: _Wave, op):
        key = (id(op), w.local)
        c = self._coord_cache.get(key)
        if c is None:
            lay, dim = op.attrs["layout"], op.attrs["dim"]
            full = lay.coords()[dim]
            if op.attrs["scope"] == "workgroup":
                full = full[w.local * self.W:(w.local + 1) * self.W]
            c = self._coord_cache[key] = full.astype(np.int32)
        return c

    # -- execution ----------------------------------------------------------------------
    def run_block(self, w: _Wave, block):
        for op in block.ops:
            k = op.kind
            if k == "for":
                start = int(self.read(w, op, op.srcs[0]))
                stop = int(self.read(w, op, op.srcs[1]))
                for i in range(start, stop, op.attrs["step"]):
                    self.put(w, op.dst, np.int32(i))
                    yield from self.run_block(w, op.regions[0])
            elif k == "if":
                if bool(self.read(w, op, op.srcs[0])):
                    yield from self.run_block(w, op.regions[0])
                elif len(op.regions) > 1:
                    yield from self.run_block(w, op.regions[1])
            elif k in ("barrier", "mbar_wait", "wgmma", "flag_wait", "cluster_sync"):
                if k == "flag_wait":
                    self._flag(w, op)                # an index out of range fails here
                if k == "mbar_wait":
                    try:
                        self._mbar(w, op)
                    except _StageOutOfRange as e:
                        raise self._stage_error(w, op, *e.args) from None
                w.waiting_op = op
                yield op                         # wgmma: the warpgroup meets here
                w.waiting_op = None
                if k == "wgmma":
                    try:
                        self.x_wgmma(w, op)
                    except _Unset as e:
                        raise self.unset(w, op, e.args[0]) from None
            else:
                try:
                    getattr(self, "x_" + k)(w, op)
                except ZeroDivisionError as e:
                    raise self.fail(EmulatorError, w, op, str(e)) from None
                except _Unset as e:
                    raise self.unset(w, op, e.args[0]) from None
                except _StageOutOfRange as e:
                    raise self._stage_error(w, op, *e.args) from None
                except _Busy as e:
                    raise self.fail(Race, w, op, f"reads {e.args[0]!r} while a wgmma group "
                                    "issued with in_flight= may still be writing it; "
                                    "pk.mma_wait(acc) first") from None

    def x_const(self, w, op):
        self.put(w, op.dst, np.asarray(op.attrs["value"]))

    def x_special(self, w, op):
        n, ax = op.attrs["name"], op.attrs["axis"]
        if n == "lane_id":
            self.put(w, op.dst, np.arange(self.W, dtype=np.int32)[:, None])
            return
        val = {"program_id": lambda: w.pid[ax], "num_programs": lambda: self.grid[ax],
               "wave_id": lambda: w.local, "cluster_rank": lambda: w.rank}[n]()
        self.put(w, op.dst, np.int32(val))

    def x_arg(self, w, op):
        self.put(w, op.dst, np.asarray(self.scalars[op.attrs["name"]]))

    def buf(self, w, gl) -> _GlobalBuf:
        """The tensor an op names: a parameter, or the rank a `peer` op picked."""
        b = w.regs.get(gl)
        return b if b is not None else self.bufs[gl.name]

    def x_dim(self, w, op):
        self.put(w, op.dst, np.int32(self.buf(w, op.srcs[0]).shape[op.attrs["axis"]]))

    def x_stride(self, w, op):
        self.put(w, op.dst, np.int32(self.buf(w, op.srcs[0]).strides[op.attrs["axis"]]))

    # -- peers and flags --------------------------------------------------------------------
    def x_peer(self, w, op):
        *members, rank = op.srcs
        r = int(self.read(w, op, rank))
        if not 0 <= r < len(members):
            raise self.fail(OutOfBounds, w, op, f"peer({r}) of a group of {len(members)} "
                            f"ranks (0..{len(members) - 1})")
        w.regs[op.dst] = self.bufs[members[r].name]

    def _flag(self, w, op):
        """(buffer, element offset) of a signal / flag_wait; out of range is an error."""
        buf = self.buf(w, op.srcs[0])
        idx = [int(self.read(w, op, s)) for s in op.srcs[1:-1]]
        if not all(0 <= i < n for i, n in zip(idx, buf.shape)):
            raise self.fail(OutOfBounds, w, op, f"flag index {tuple(idx)} outside "
                            f"{buf.label()} of shape {buf.shape}")
        return buf, sum(i * st for i, st in zip(idx, buf.strides))

    def knowledge(self, w) -> np.ndarray:
        """What wave w has seen, per unit of the world: other workgroups' accesses it
        learnt of through flags, its own workgroup's waves up to its vector clock, and
        itself up to now (what a release publishes)."""
        k = w.ext.copy()
        base, nw = w.gid * self.ustride, self.p.num_waves
        mine = k[base:base + nw]
        np.maximum(mine, w.wg.vc[w.wave][w.rank * nw:(w.rank + 1) * nw], out=mine)
        k[base + w.local] = w.wg.tick()
        return k

    def x_signal(self, w, op):
        buf, off = self._flag(w, op)
        value = np.int32(self.read(w, op, op.srcs[-1]))
        before = int(buf.flat[off])
        buf.flat[off] = buf.flat[off] + value if op.attrs["add"] else value
        if w.ext is not None:
            # per flag element, in the order they ran: (value after, added amount or None
            # for a plain store, what this signal published, value before)
            buf.released.setdefault(off, []).append(
                (int(buf.flat[off]), int(value) if op.attrs["add"] else None,
                 self.knowledge(w), before))

    def x_timestamp(self, w, op):
        """The emulator's timestamp (pk.timestamp): the count of those taken before it in
        this run (an order, not a time), and where the workgroup runs
        (Target.emulated_place)."""
        buf = self.buf(w, op.srcs[0])
        row = int(self.read(w, op, op.srcs[1]))
        if not 0 <= row < buf.shape[0]:
            return
        when = self.world.stamps
        self.world.stamps += 1
        words = (when & 0xFFFFFFFF, when >> 32,       # the workgroup's index in its launch
                 *self.p.target.emulated_place(w.gid - self.gid_base, w.local))
        offs = row * buf.strides[0] + np.arange(len(words)) * buf.strides[1]
        self.global_write(w, op, buf, offs)
        buf.flat[offs] = np.array(words, np.uint32).view(np.int32)

    def _flag_ready(self, w, op) -> bool:
        buf, off = self._flag(w, op)
        return int(buf.flat[off]) >= int(self.read(w, op, op.srcs[-1]))

    def _acquire(self, w, op):
        """What the waiting wave may assume it sees: the least a GPU guarantees. The flag
        first reached the value it waits for in some run of atomic adds after the last
        plain store (a release sequence: the acquire sees every signal of the run that it
        read). The adds of a run may land in any order, so where each adds 1 and the wait
        needs n of them, the wave is sure only of what any n of them published: per wave
        of the world, the n-th smallest of their clocks. So a wait for too small a count,
        or a plain store per wave, shows up as a race whatever order the emulator ran
        things in."""
        buf, off = self._flag(w, op)
        want = int(self.read(w, op, op.srcs[-1]))
        history = buf.released.get(off, ())
        first = next((i for i, h in enumerate(history) if h[0] >= want), None)
        if first is None or w.ext is None:
            return
        start = first
        while start >= 0 and history[start][1] is not None:
            start -= 1                               # back to the run's plain store, if any
        base = history[start] if start >= 0 else None
        adds = [h for h in history[start + 1:] if h[1] is not None]
        base_value = base[0] if base is not None else (adds[0][3] if adds else 0)
        need = want - base_value
        if need <= 0 and base is None:
            return                   # the value was there before any signal: nothing seen
        if need <= 0:
            k = base[2]
        elif adds and all(h[1] == 1 for h in adds) and need <= len(adds):
            clocks = np.stack([h[2] for h in adds])
            k = np.partition(clocks, need - 1, axis=0)[need - 1]
            if base is not None:
                k = np.maximum(k, base[2])
        else:                      # other amounts: the run as it ran, up to the value
            k = np.maximum.reduce([h[2] for h in history[start + 1:first + 1]] +
                                  ([base[2]] if base is not None else []))
        np.maximum(w.ext, k, out=w.ext)
        mine, nw = w.gid * self.ustride, self.p.num_waves
        vc = w.wg.vc[w.wave][w.rank * nw:(w.rank + 1) * nw]
        np.maximum(vc, k[mine:mine + nw], out=vc)

    def x_coord(self, w, op):
        w.regs[op.dst] = self.coords(w, op)

    def x_mov(self, w, op):
        self.put(w, op.dst, self.get(w, op.srcs[0]))

    x_cvt = x_mov

    def x_bin(self, w, op):
        a, b = (self.get(w, s) for s in op.srcs)
        self.put(w, op.dst, V.binary(op.attrs["op"], a, b, op.dst.type.dtype))

    def x_any(self, w, op):
        self.put(w, op.dst, np.bool_(np.any(self.get(w, op.srcs[0]))))

    def x_fma(self, w, op):
        a, b, c = (np.asarray(self.get(w, s), np.float64) for s in op.srcs)
        self.put(w, op.dst, V.to_dtype((a * b + c).astype(np.float32), op.dst.type.dtype))

    def x_cmp(self, w, op):
        a, b = (self.get(w, s) for s in op.srcs)
        self.put(w, op.dst, V.compare(op.attrs["op"], a, b))

    def x_un(self, w, op):
        self.put(w, op.dst, V.unary(op.attrs["op"], self.get(w, op.srcs[0]), op.dst.type.dtype))

    def x_select(self, w, op):
        c, a, b = (self.get(w, s) for s in op.srcs)
        d = op.dst.type.dtype
        self.put(w, op.dst, np.where(c, V.to_dtype(a, d), V.to_dtype(b, d)))

    def x_slots(self, w, op):
        self.put(w, op.dst, self.get(w, op.srcs[0])[:, list(op.attrs["index"])])

    def x_slot_reduce(self, w, op):
        src, d, rop = self.get(w, op.srcs[0]), op.dst.type.dtype, op.attrs["op"]
        cols = []
        for g in op.attrs["groups"]:
            acc = src[:, g[0]]
            for i in g[1:]:
                acc = V.binary(rop, acc, src[:, i], d)
            cols.append(acc)
        self.put(w, op.dst, np.stack(cols, axis=1))

    def x_bfly(self, w, op):
        v, d = self.get(w, op.srcs[0]), op.dst.type.dtype
        lanes = np.arange(self.W)
        for b in op.attrs["bits"]:
            v = V.binary(op.attrs["op"], v, v[lanes ^ (1 << b)], d)
        self.put(w, op.dst, v)

    def x_mma(self, w, op):
        """D = A @ B + C for one matrix instruction, operands gathered from the listed slots
        through the instruction's documented lane layouts; products and C summed in float64,
        rounded once to f32 (as the ISA emulator does: rounding A @ B before adding C made
        the two disagree by an ulp on accumulators, which a 16-bit output can turn into one
        of its own)."""
        ins = op.attrs["instr"]
        a, b = (self.get(w, s) for s in op.srcs[:2])
        if op.attrs.get("zero"):             # C = 0: the accumulator is not read
            c = w.regs.get(op.srcs[2])
            c = np.zeros((self.W, op.dst.type.nslots), np.float32) if c is None else c
            C = np.zeros(ins.acc_layout.shape, np.float32)
        else:
            c = self.get(w, op.srcs[2])
            C = _matrix(ins.acc_layout, c[:, list(op.attrs["c_slots"])], np.float32)
        unpack = _PACKED.get(ins.ab_dtype)
        if unpack is not None:                  # packed FP4 / FP6: bytes -> elements along K
            A = unpack(_matrix(ins.a_layout, a[:, list(op.attrs["a_slots"])], np.uint8), 1)
            B = unpack(_matrix(ins.b_layout, b[:, list(op.attrs["b_slots"])], np.uint8), 0)
        else:
            A = _matrix(ins.a_layout, a[:, list(op.attrs["a_slots"])], np.float32)
            B = _matrix(ins.b_layout, b[:, list(op.attrs["b_slots"])], np.float32)
        if ins.scaled:                      # E8M0 block scales: 2^(e - 127) per 32 K-elements
            sa, sb = (self.get(w, s) for s in op.srcs[3:5])
            SA = _matrix(ins.scale_a_layout, sa[:, list(op.attrs["sa_slots"])], np.float64)
            SB = _matrix(ins.scale_b_layout, sb[:, list(op.attrs["sb_slots"])], np.float64)
            A = A * np.repeat(SA, ins.scale_block, axis=1)
            B = B * np.repeat(SB, ins.scale_block, axis=0)
        D = (A.astype(np.float64) @ B.astype(np.float64) + C.astype(np.float64)).astype(np.float32)
        r, col = ins.acc_layout.coords()
        out = c.copy()
        out[:, list(op.attrs["c_slots"])] = D[r, col]
        w.regs[op.dst] = out

    def x_wgmma(self, w, op):
        """Issue a group: its register operand A is taken now; it runs when retired (at once
        with in_flight=0, else by a later wgmma or wgmma_wait), reading shared memory then,
        so a stage released before its group retired shows as a race or a wrong result."""
        a = None if op.attrs["a_region"] is not None else self.get(w, op.srcs[0])
        regions = (self.at(w, op.attrs["region"]), self.at(w, op.attrs["a_region"]))
        if self.world.wave_order == "reverse":   # the tensor cores may read it right away
            for region, rows, cols in self._wgmma_operands(w, op, regions):
                self._check_lds_read(w, op, _element_bytes(region, rows, cols))
        w.wgmma_groups.append((op, a, regions))
        self._retire_wgmma(w, op.attrs["in_flight"])

    @staticmethod
    def _wgmma_operands(w, op, regions):
        """(shared tile, rows, cols) of the shared operands a wgmma group reads: B (K x N, or
        N x K when K-major) and, from shared memory, this wave's 16 rows of A's 64 x K tile
        (K x 64 when MN-major), as (element rows, cols) of each tile; A as K x 16 where
        MN-major (transposed by the reader)."""
        (region, a_region), n, k = regions, op.attrs["n"], op.attrs["k"]
        kk, nn = np.arange(k)[:, None], np.arange(n)[None, :]
        out = [(region, *((nn, kk) if op.attrs["b_kmajor"] else (kk, nn)))]
        if a_region is not None:                     # rows of this wave within its warpgroup
            rows = (w.local % 4) * 16 + np.arange(16)[:, None]
            out.append((a_region, *((rows, kk.T) if op.attrs["a_kmajor"] else (kk, rows.T))))
        return out

    def x_wgmma_wait(self, w, op):
        self._retire_wgmma(w, op.attrs["in_flight"])

    def _retire_wgmma(self, w, keep: int):
        while len(w.wgmma_groups) > keep:
            self._run_wgmma(w, *w.wgmma_groups.pop(0))

    def _run_wgmma(self, w, op, a_regs, regions):
        """acc += A @ B: B read from its shared tile (K x N, or N x K when K-major), A from
        the registers taken at issue or from this wave's 16 rows of the warpgroup's shared
        64 x K tile (K x 64 when MN-major), with swizzle, ordering and initialisation
        checks; acc in registers.
        The shared tiles are the stages picked when the group was issued."""
        (b_region, b_rows, b_cols), *a_tile = self._wgmma_operands(w, op, regions)
        B = self._shared_matrix(w, op, b_region, b_rows, b_cols)
        if a_tile:
            A = self._shared_matrix(w, op, *a_tile[0])
            if not op.attrs["a_kmajor"]:
                A = A.T
        else:
            A = _matrix(op.attrs["a_layout"], a_regs, np.float64)
        if op.attrs.get("zero"):                 # scale-d = 0: acc is not read
            C = np.zeros(op.attrs["acc_layout"].shape, np.float32)
        elif op.srcs[-1] not in w.regs:          # (later groups on acc are still pending)
            raise _Unset(op.srcs[-1])
        else:
            C = _matrix(op.attrs["acc_layout"], w.regs[op.srcs[-1]], np.float32)
        D = (A @ B).astype(np.float32) + C
        r, col = op.attrs["acc_layout"].coords()
        w.regs[op.dst] = D[r, col]

    def _shared_matrix(self, w, op, region, rows, cols):
        """Elements (rows, cols) of a shared tile as a float64 matrix of the broadcast
        shape, read with the race and initialisation checks of any shared read."""
        idx = _element_bytes(region, rows, cols)
        self._check_lds_read(w, op, idx)
        shape = np.broadcast_shapes(np.shape(rows), np.shape(cols))
        return _lds_values(w.wg.lds, idx, region.tile.dtype).reshape(shape).astype(np.float64)

    def x_setprio(self, w, op):
        w.prio = op.attrs["level"]

    def x_sched_barrier(self, w, op):
        """Scheduling hints and waits change timing, not results: nothing to emulate (the
        emulator completes every memory operation at once)."""

    x_sched_group = x_waitcnt = x_sched_barrier

    def _stage_error(self, w, op, i, region):
        return self.fail(OutOfBounds, w, op, f"stage index {i} is outside {region.name}, "
                         f"which has {region.count} stages")

    def at(self, w, region, rank=None):
        """A region with its runtime stage resolved to a static one (stage i of n), in the
        shared memory of the wave's workgroup or, in a cluster, of the one of `rank`."""
        if region is None:
            return region
        if region.stage is not None:
            i = int(self.get(w, region.stage))
            if not 0 <= i < region.count:
                raise _StageOutOfRange(i, region)
            region = region.element(i)
        r = w.rank if rank is None else rank
        if not r:
            return region
        key = (region, r)
        out = self._ranked.get(key)
        if out is None:                  # the same tile in workgroup r's part of the LDS
            out = self._ranked[key] = dataclasses.replace(
                region, name=f"{region.name}@{r}", base=region.base + r * self.lds_span)
        return out

    # -- windows --------------------------------------------------------------------------
    def _lane_coords(self, w, op):
        """(rows, cols) int64[W, nslots] of this wave's lanes under the op's layout."""
        key = (id(op), w.local)
        c = self._coord_cache.get(key)
        if c is None:
            rows, cols = op.attrs["layout"].coords()
            if op.attrs["scope"] == "workgroup":
                rows = rows[w.local * self.W:(w.local + 1) * self.W]
                cols = cols[w.local * self.W:(w.local + 1) * self.W]
            c = self._coord_cache[key] = (rows.astype(np.int64), cols.astype(np.int64))
        return c

    def _tensor_window(self, w, op, nvals):
        """Element offsets and in-bounds mask of a gload/gstore window."""
        buf = self.buf(w, op.srcs[0])
        dims = op.attrs["dims"]
        rank = len(buf.shape)
        nlead = rank - len(dims)
        srcs = op.srcs[1:len(op.srcs) - nvals]
        lead = [int(self.get(w, s)) for s in srcs[:nlead]]
        origin = [int(self.get(w, s)) for s in srcs[nlead:]]
        rc = self._lane_coords(w, op)
        idx = [np.full_like(rc[0], v) for v in lead] + [o + rc[d] for o, d in zip(origin, dims)]
        off = np.zeros_like(rc[0])
        mask = np.ones(rc[0].shape, bool)
        for axis, x in enumerate(idx):
            off = off + x * buf.strides[axis]
            mask &= (x >= 0) & (x < buf.shape[axis])
        for i, e in enumerate(op.attrs.get("ends") or ()):
            if e is not None:
                mask &= idx[nlead + i] < int(self.get(w, e))
        if op.attrs.get("inside") and not mask.all():
            lane, slot = np.argwhere(~mask)[0]
            at = tuple(int(x[lane, slot]) for x in idx)
            raise self.fail(OutOfBounds, w, op, f"a window of {buf.name!r} promised inside "
                            f"(inside=True) reaches element {at} of its {tuple(buf.shape)} "
                            f"(lane {lane}, slot {slot}); the GPU code checks no bounds "
                            "there: drop the promise or launch so that it holds")
        return buf, off, mask

    def x_sload(self, w, op):
        buf = self.buf(w, op.srcs[0])
        idx = [int(self.get(w, s)) for s in op.srcs[1:]]
        inside = all(0 <= i < n for i, n in zip(idx, buf.shape))
        off = sum(i * st for i, st in zip(idx, buf.strides))
        if inside:
            self.global_read(w, op, buf, np.array([off]))
        self.put(w, op.dst, buf.flat[off] if inside else np.zeros((), buf.flat.dtype))

    def _gcheck(self, w, op, buf, off, mask):
        bad = mask & ((off < 0) | (off >= buf.flat.size))
        if np.any(bad):
            lane, slot = np.argwhere(bad)[0]
            raise self.fail(OutOfBounds, w, op, f"out-of-bounds access to global tensor "
                            f"{buf.name!r}: element offset {int(off[lane, slot])} outside "
                            f"[0, {buf.flat.size}) at lane {lane}, slot {slot}")

    def x_gload(self, w, op):
        buf, off, mask = self._tensor_window(w, op, 0)
        self._gcheck(w, op, buf, off, mask)
        fill = V.to_dtype(np.asarray(op.attrs["fill"]), op.dst.type.dtype)
        self.global_read(w, op, buf, off[mask])
        self.put(w, op.dst, _masked_read(buf, off, mask, fill))

    def x_gstore(self, w, op):
        buf, off, mask = self._tensor_window(w, op, 1)
        self._gcheck(w, op, buf, off, mask)
        v = np.broadcast_to(self.get(w, op.srcs[-1]), off.shape)
        self.global_write(w, op, buf, off[mask])
        buf.flat[off[mask]] = V.to_dtype(v[mask], T.dtype_of(buf.flat.dtype))

    def x_gatomic_add(self, w, op):
        buf, off, mask = self._tensor_window(w, op, 1)
        self._gcheck(w, op, buf, off, mask)
        v = np.broadcast_to(self.get(w, op.srcs[-1]), off.shape)
        self.global_write(w, op, buf, off[mask], atomic=True)
        np.add.at(buf.flat, off[mask], v[mask].astype(buf.flat.dtype))

    def x_gdiscard(self, w, op):
        """The window's contents become undefined: poisoned (NaN, or an integer type's
        largest value) so that a later read shows. The wave's own reads of it came first."""
        buf, off, mask = self._tensor_window(w, op, 0)
        self._gcheck(w, op, buf, off, mask)
        self.global_write(w, op, buf, off[mask])
        kind = np.dtype(buf.flat.dtype)
        poison = np.iinfo(kind).max if kind.kind in "iu" else np.nan
        buf.flat[off[mask]] = np.asarray(poison).astype(kind)

    # -- LDS ------------------------------------------------------------------------------
    def _lds_bytes(self, w, op, origin=None, rank=None):
        """Byte indices [W*nslots*esz] of an LDS window (in the shared memory of the
        cluster's workgroup `rank`, else the wave's own), after bounds checks."""
        region = self.at(w, op.attrs["region"], rank)
        t = region.tile
        r0, c0 = origin if origin is not None else (int(self.get(w, s)) for s in op.srcs[:2])
        rows, cols = self._lane_coords(w, op)
        rows, cols = rows + r0, cols + c0
        bad = (rows < 0) | (rows >= t.shape[0]) | (cols < 0) | (cols >= t.shape[1])
        if np.any(bad):
            lane, slot = np.argwhere(bad)[0]
            raise self.fail(OutOfBounds, w, op, f"LDS access to element "
                            f"({int(rows[lane, slot])}, {int(cols[lane, slot])}) is outside "
                            f"shared tile {region.name} of shape {t.shape}")
        return _element_bytes(region, rows, cols)

    def x_lds_load(self, w, op):
        d = op.dst.type.dtype
        rank = None
        if len(op.srcs) > 2:                 # another workgroup's shared memory (cluster)
            rank = int(self.get(w, op.srcs[2]))
            if not 0 <= rank < self.p.cluster:
                raise self.fail(OutOfBounds, w, op, f"shared-memory read of cluster rank "
                                f"{rank}, outside the cluster of {self.p.cluster}")
            self._reach(w, op, rank)
        idx = self._lds_bytes(w, op, rank=rank)
        self._check_lds_read(w, op, idx)
        w.regs[op.dst] = _lds_values(self.wg_of(w).lds, idx, d).reshape(self.W, -1)

    def _check_lds_read(self, w, op, idx):
        """A read of LDS bytes `idx`: written before, and ordered after their writers."""
        wg = self.wg_of(w)
        if not np.all(wg.written[idx]):
            b = int(idx[~wg.written[idx]][0])
            name = op.attrs['region'].name
            b_own = b % self.lds_span if self.p.cluster > 1 else b
            if self.p.num_waves > 1 and any(lo <= b_own < hi for lo, hi in self.lds_written):
                raise self.fail(MissingBarrier, w, op, f"missing barrier: reads shared memory "
                                f"(byte {b} of {name}) that no wave has written yet, though "
                                "the kernel writes it elsewhere; waves run in no fixed order "
                                "between barriers, so put pk.barrier() (or an mbarrier wait) "
                                "between the store and this load")
            raise self.fail(UnwrittenRead, w, op, f"read of shared memory that was never "
                            f"written (byte {b} of {name}); store or load the shared tile "
                            "before reading it")
        writer = wg.w_wave[idx]
        seen = wg.vc[w.wave][np.maximum(writer, 0)]
        racy = (writer >= 0) & (writer != w.wave) & (wg.w_time[idx] > seen)
        if np.any(racy):
            other = int(writer[racy][0])
            raise self.fail(Race, w, op, f"race: reads shared memory that wave {other} wrote "
                            "since the last barrier (or mbarrier wait); order them with pk.barrier() "
                            "or an mbarrier the writer arrives on")
        wg.r_time[idx, w.wave] = wg.tick()

    def x_lds_load_tr(self, w, op):
        """The hardware's two steps: per-lane 8-byte reads of the source chunks, then the
        in-group exchange; the result must be the target layout's elements."""
        from ..targets.cdna import ds_read_tr16_b64_source
        src_op = _Shadow(op, op.attrs["source"])
        self.x_lds_load(w, src_op)
        chunks = w.regs.pop(src_op.dst)                  # [W, nslots] in source order
        out = np.empty_like(chunks)
        lanes = np.arange(self.W)
        for s in range(chunks.shape[1]):
            g, e = divmod(s, 4)
            sl, se = ds_read_tr16_b64_source(lanes & 15, e)
            out[:, s] = chunks[(lanes & ~15) + sl, 4 * g + se]
        w.regs[op.dst] = out

    def x_lds_store(self, w, op):
        self._lds_write(w, op, self.get(w, op.srcs[-1]), None)

    def x_gload_lds(self, w, op):
        """Memory -> LDS: the window's values (0 outside the tensor) land where an
        lds_store of the same layout would put them."""
        buf, off, mask = self._tensor_window(w, op, 0)
        self._gcheck(w, op, buf, off, mask)
        self.global_read(w, op, buf, off[mask])
        self._lds_write(w, op, _masked_read(buf, off, mask), (0, 0))

    def x_tma_load(self, w, op):
        """The whole box lands at once (0 outside the tensor), written by this wave; then the
        wave's arrival with the bytes completes its part of the barrier's phase. multicast:
        it lands in every workgroup of the cluster, completing its bytes on each one's
        barrier, and the wave's own barrier expects the cluster's parts (one each)."""
        if op.attrs.get("multicast"):
            n = self.p.cluster
            for r in range(n):
                self._reach(w, op, r)
                nbytes = self._tma_box_in(w, op, self.at(w, op.attrs["region"], r))
                self._land(w, op, self._mbar(w, _BarOp(op), r), nbytes)
            self._arrive(w, op, self._mbar(w, _BarOp(op)), expect=n * nbytes)
            return
        self._tma_box_in(w, op, self.at(w, op.attrs["region"]))
        self.x_mbar_arrive(w, _BarOp(op))

    def _tma_box_in(self, w, op, region) -> int:
        """A TMA load's box written into `region` (a workgroup's tile); its bytes."""
        buf = self.bufs[op.attrs["gl"].name]
        t = region.tile
        *lead, r0, c0, at = (int(self.get(w, s)) for s in op.srcs)
        box_rows = op.attrs["tmap"].box[0]
        if at < 0 or at + box_rows > t.shape[0]:
            raise self.fail(OutOfBounds, w, op, f"TMA box of {box_rows} rows at row {at} falls "
                            f"outside shared tile {region.name} of shape {t.shape}")
        self._check_tma_lds(w, op, region, at)
        rows = np.arange(box_rows)[:, None]
        cols = np.arange(t.shape[1])[None, :]
        off, mask = _box(buf, rows + r0, cols + c0, lead)
        self.global_read(w, op, buf, off[mask])
        vals = _masked_read(buf, off, mask)
        idx = _element_bytes(region, rows + at, cols)
        self._store_bytes(w, op, idx, np.ascontiguousarray(vals).view(np.uint8).reshape(-1))
        return idx.size

    def x_tma_store(self, w, op):
        """The tile is read (ordered after every wave's writes to it, as a barrier would
        order them) and written to (add: added into) the tensor box, clipped to the
        tensor. wait=False: the copy is kept until the wave's tma_store_wait, which reads
        the tile then and reports a race if any wave wrote it in between (the TMA unit may
        read it at any time until the wait)."""
        region = self.at(w, op.attrs["region"])
        t = region.tile
        self._check_tma_lds(w, op, region, 0)
        idx = _element_bytes(region, np.arange(t.shape[0])[:, None],
                             np.arange(t.shape[1])[None, :])
        copy = (region, [int(self.get(w, s)) for s in op.srcs], idx)
        self._check_lds_read(w, op, idx)
        if op.attrs.get("wait", True):
            self._tma_copy_out(w, op, *copy)
        else:
            w.tma_stores.append((op, copy, w.wg.w_time[idx].copy()))

    def x_tma_store_wait(self, w, op):
        cut = max(len(w.tma_stores) - op.attrs.get("pending", 0), 0)
        done, w.tma_stores = w.tma_stores[:cut], w.tma_stores[cut:]
        for store, (region, coords, idx), written in done:
            if np.any(w.wg.w_time[idx] != written):
                raise self.fail(Race, w, store, f"race: shared tile {region.name} was written "
                                "while a pk.tma_store(wait=False) of it may still be reading "
                                "it; write it again only after the issuing wave's "
                                "pk.tma_store_wait() (and an mbarrier it arrives on)")
            self._check_lds_read(w, store, idx)
            self._tma_copy_out(w, store, region, coords, idx)

    def _tma_copy_out(self, w, op, region, coords, idx):
        """The copy's global write: the tile (its bytes `idx`) into the box at `coords`."""
        buf, t = self.bufs[op.attrs["gl"].name], region.tile
        *lead, r0, c0 = coords
        rows = np.arange(t.shape[0])[:, None]
        cols = np.arange(t.shape[1])[None, :]
        vals = _lds_values(w.wg.lds, idx, t.dtype).reshape(t.shape)
        off, mask = _box(buf, rows + r0, cols + c0, lead)
        self.global_write(w, op, buf, off[mask], atomic=bool(op.attrs.get("add")))
        if op.attrs.get("add"):
            vals = (buf.flat[off[mask]].astype(np.float32) + vals[mask].astype(np.float32))
            buf.flat[off[mask]] = vals.astype(buf.flat.dtype)
        else:
            buf.flat[off[mask]] = vals[mask]

    def _check_tma_lds(self, w, op, region, at):
        """Each box of a bulk tensor copy (one per column block) starts on a 128-byte
        boundary of shared memory (PTX ISA, cp.async.bulk.tensor)."""
        t = region.tile
        block_row = t.shape[1] * t.dtype.bytes // t.atoms        # a column block's row bytes
        for j in range(t.atoms):
            addr = region.base + (j * t.shape[0] + at) * block_row
            if addr % 128:
                raise self.fail(Misaligned, w, op, f"TMA box {j} of {region.name} (row {at}) "
                                f"starts at shared byte {addr}, not a multiple of 128")

    def _lds_write(self, w, op, value, origin):
        d = op.attrs["region"].tile.dtype
        n = op.attrs["layout"].nslots
        idx = self._lds_bytes(w, op, origin)
        vals = np.ascontiguousarray(V.to_dtype(np.broadcast_to(value, (self.W, n)), d))
        self._store_bytes(w, op, idx, vals.view(np.uint8).reshape(-1))

    def _store_bytes(self, w, op, idx, raw):
        wg = self.wg_of(w)
        writer = wg.w_wave[idx]
        seen = wg.vc[w.wave]
        waw = (writer >= 0) & (writer != w.wave) & (wg.w_time[idx] > seen[np.maximum(writer, 0)])
        others = np.arange(len(seen)) != w.wave
        war = np.any((wg.r_time[idx][:, others] > seen[others]), axis=1)
        if np.any(waw | war):
            kind = "wrote" if np.any(waw) else "read"
            owner = int(idx[0]) // self.lds_span if self.p.cluster > 1 else 0
            if owner != w.rank:                  # a copy into another workgroup's memory
                raise self.fail(Race, w, op, f"race: writes the shared memory of workgroup "
                                f"{owner} of the cluster, which one of its waves {kind} and "
                                "has not released to this wave: wait, before the copy, on an "
                                "mbarrier that every workgroup's readers arrive on "
                                "(pk.arrive(bar, cta=r); pk.Ring(..., cluster=n))")
            raise self.fail(Race, w, op, f"race: writes shared memory that another wave {kind} "
                            "since the last barrier; add pk.barrier() between them")
        wg.lds[idx] = raw
        wg.written[idx] = True
        wg.w_time[idx] = wg.tick()
        wg.w_wave[idx] = w.wave

    def wg_of(self, w):
        return w.wg

    # -- grid ---------------------------------------------------------------------------
    def run_workgroup(self, pid):
        """Waves run one at a time until they block (at a barrier, an mbarrier wait, a
        warpgroup-wide wgmma or a flag wait); a workgroup barrier opens when every live wave
        stands at one, a wgmma when all four waves of its warpgroup stand at the same one.
        A generator: it yields when its waves can only wait for flags (another workgroup,
        of this launch or another, may raise them; the world decides whether anything
        can), and returns when every wave is done. No runnable wave, nothing to open and
        no flag to wait for is a deadlock, reported with what each wave waits for.

        A kernel in clusters (pk.cluster) runs a whole cluster here, `pid` its first
        workgroup: their waves take turns as one workgroup's would, each workgroup's
        barriers among its own waves, a cluster_sync among all."""
        gx, gy = self.grid[0], self.grid[1]
        n, nw = self.p.cluster, self.p.num_waves
        index = pid[0] + gx * (pid[1] + gy * pid[2])
        wg = _Workgroup(self.lds_span * n if n > 1 else self.p.lds_bytes, nw * n,
                        self.gid_base + index)
        waves = [_Wave(self, wg, (pid[0] + r, *pid[1:]), r * nw + i, r, wg.gid + r)
                 for r in range(n) for i in range(nw)]
        ctas = [waves[r * nw:(r + 1) * nw] for r in range(n)]
        wg.waves = waves
        gens = {w: self.run_block(w, self.p.body) for w in waves}
        state = {w: None for w in waves}        # None: runnable; op: blocked; "done"
        moved = False                           # since the world last resumed it
        eager = self.world.wave_order == "reverse"
        turns = waves[::-1] if eager else waves
        while True:
            progressed = False
            for w in turns:
                st = state[w]
                if st == "done" or (st is not None and
                                    st.kind in ("barrier", "wgmma", "cluster_sync")):
                    continue
                if st is not None and not self._wait_done(w, st):
                    continue
                if st is not None:
                    self._finish_wait(w, st)
                try:
                    state[w] = next(gens[w])
                    # reverse order: a wait that passes when reached does not give up the
                    # wave's turn (the other waves' copies have not landed yet)
                    while eager and state[w].kind == "mbar_wait" and \
                            self._wait_done(w, state[w]):
                        self._finish_wait(w, state[w])
                        state[w] = next(gens[w])
                except StopIteration:
                    state[w] = "done"
                    if all(state[x] == "done" for x in ctas[w.rank]):
                        wg.ended.add(w.rank)
                    if w.wgmma_groups:
                        raise self.fail(EmulatorError, w, w.wgmma_groups[0][0],
                                        "the wave ends with wgmma groups still running; "
                                        "retire them with pk.mma_wait(acc)")
                    if w.tma_stores:
                        raise self.fail(EmulatorError, w, w.tma_stores[0][0],
                                        "the wave ends before its pk.tma_store(wait=False) "
                                        "has read its shared tile; call pk.tma_store_wait() "
                                        "first (the workgroup's shared memory goes to the "
                                        "next one)")
                progressed = True
            live = [w for w in waves if state[w] != "done"]
            if not live:
                return
            for g in range(0, len(waves), 4):        # warpgroups that all reached a wgmma
                group = waves[g:g + 4]
                if all(state[w] not in (None, "done") and state[w].kind == "wgmma"
                       for w in group) and len({id(state[w]) for w in group}) == 1:
                    for w in group:
                        state[w] = None
                    progressed = True
            if progressed:
                moved = True
                continue
            opened = False
            for cta in ctas:                          # each workgroup's barrier on its own
                mine = [w for w in cta if state[w] != "done"]
                if mine and all(state[w].kind == "barrier" for w in mine):
                    if len(mine) < len(cta):          # a finished wave never arrives
                        self._deadlock(waves, state)
                    wg.sync_all(mine)
                    for w in mine:
                        w.barriers += 1
                        state[w] = None
                    opened = True
            if not opened and all(state[w].kind == "cluster_sync" for w in live):
                if len(live) < len(waves):
                    self._deadlock(waves, state)
                wg.sync_all()
                for w in live:
                    state[w] = None
                    w.cluster_syncs += 1
                opened = True
            if opened:
                moved = True
                continue
            if any(state[w].kind == "flag_wait" for w in live):
                yield moved, waves, state            # up to the other workgroups now
                moved = False
                continue
            self._deadlock(waves, state)

    def _wait_done(self, w, op) -> bool:
        if op.kind == "flag_wait":
            return self._flag_ready(w, op)
        # PTX try_wait.parity(P): true once the barrier's current phase has parity != P,
        # i.e. the phase with parity P completed.
        bar = w.wg.mbarriers[self.at(w, op.attrs["region"]).name]
        return bar.phase % 2 != int(self.get(w, op.srcs[0])) % 2

    def _finish_wait(self, w, op):
        if op.kind == "flag_wait":
            self._acquire(w, op)
            return
        bar = w.wg.mbarriers[self.at(w, op.attrs["region"]).name]
        parity = int(self.get(w, op.srcs[0])) % 2
        done = bar.completed.get(parity)
        if done is not None:
            np.maximum(w.wg.vc[w.wave], done, out=w.wg.vc[w.wave])
        ext = bar.completed_ext.get(parity)
        if ext is not None and w.ext is not None:
            np.maximum(w.ext, ext, out=w.ext)

    def _deadlock(self, waves, state):
        def blocked_at(kind):
            return [w for w in waves if state[w] not in ("done", None) and state[w].kind == kind]

        def names(ws):           # waves by index; in a cluster, rank:index
            return [x.local if self.p.cluster == 1 else f"{x.rank}:{x.local}" for x in ws]
        done = names(w for w in waves if state[w] == "done")
        at_bar, waiting, at_mma = (blocked_at(k) for k in ("barrier", "mbar_wait", "wgmma"))
        if at_mma:
            w = at_mma[0]
            group = [x for x in waves if x.wave // 4 == w.wave // 4]
            raise self.fail(BarrierMismatch, w, state[w],
                            f"deadlock: wgmma is warpgroup-wide, but of warpgroup waves "
                            f"{names(group)} only {names(x for x in at_mma if x in group)} "
                            "reached this one")
        if waiting:
            w = waiting[0]
            op = state[w]
            parity = int(self.get(w, op.srcs[0])) % 2
            raise self.fail(BarrierMismatch, w, op,
                            f"deadlock: waves {names(waiting)} wait on mbarrier "
                            f"{op.attrs['region'].name} (phase parity {parity}) that no wave "
                            f"will complete; waves {names(at_bar)} are at a "
                            f"barrier, waves {done} finished")
        if not at_bar:
            at_cluster = blocked_at("cluster_sync")
            a = at_cluster[0]
            raise self.fail(BarrierMismatch, a, state[a],
                            f"deadlock: waves {names(at_cluster)} of the cluster "
                            f"wait at pk.cluster_sync() that waves {done} never reach (every "
                            "wave of every workgroup of the cluster must)")
        a = at_bar[0]
        raise self.fail(BarrierMismatch, a, state[a],
                        f"barrier mismatch (deadlock): waves {names(at_bar)} wait "
                        f"at a barrier that waves {done} never reach (they finished)")

    # -- mbarriers ---------------------------------------------------------------------------
    def x_mbar_init(self, w, op):
        r = self.at(w, op.attrs["region"])
        w.wg.mbarriers[r.name] = _MBarrier(op.attrs["count"], len(w.wg.vc))

    def _mbar(self, w, op, rank=None):
        r = self.at(w, op.attrs["region"], rank)
        if r.name not in w.wg.mbarriers:
            raise self.fail(EmulatorError, w, op, f"mbarrier {r.name} used before its "
                            "initialisation" + (" (in a cluster, pk.cluster_sync() after "
                                                "every workgroup's barriers are set up)"
                                                if self.p.cluster > 1 else ""))
        return w.wg.mbarriers[r.name]

    def x_mbar_arrive(self, w, op):
        rank = int(self.get(w, op.srcs[0])) if op.attrs.get("remote") else None
        if rank is not None and not 0 <= rank < self.p.cluster:
            raise self.fail(OutOfBounds, w, op, f"pk.arrive(cta={rank}) in a cluster of "
                            f"{self.p.cluster} workgroups")
        if rank is not None:
            self._reach(w, op, rank)
        self._arrive(w, op, self._mbar(w, op, rank))

    def _reach(self, w, op, rank):
        """Wave w reaches into the shared memory of the cluster's workgroup `rank`: only
        after a cluster_sync (before it, that workgroup may not have started or set up its
        barriers) and while that workgroup runs (its shared memory goes to the next one)."""
        if rank == w.rank:
            return
        if not w.cluster_syncs:
            raise self.fail(Race, w, op, f"reaches workgroup {rank} of the cluster before any "
                            "pk.cluster_sync(): it may not have started or set up its "
                            "barriers yet; call pk.cluster_sync() after the barriers are made "
                            "and before the first multicast copy or remote arrive")
        if rank in w.wg.ended:
            raise self.fail(Race, w, op, f"reaches workgroup {rank} of the cluster after it "
                            "ended (its shared memory may belong to the next workgroup); end "
                            "every workgroup of the cluster with pk.cluster_sync()")

    def _publish(self, w, bar):
        """What wave w did and saw goes to whoever waits for the barrier's phase."""
        wg = w.wg
        mine = wg.vc[w.wave].copy()
        mine[w.wave] = wg.tick()
        np.maximum(bar.acc, mine, out=bar.acc)
        if w.ext is not None:
            bar.ext = w.ext.copy() if bar.ext is None else np.maximum(bar.ext, w.ext)

    def _arrive(self, w, op, bar, expect: int = 0):
        """One arrival (expecting `expect` more bytes to land in this phase)."""
        self._publish(w, bar)
        bar.pending -= 1
        bar.tx += expect
        self._complete(bar)

    def _land(self, w, op, bar, nbytes: int):
        """`nbytes` of a multicast copy that wave w issued landed for the barrier."""
        self._publish(w, bar)
        bar.tx -= nbytes
        self._complete(bar)

    @staticmethod
    def _complete(bar):
        """The phase completes once every arrival came and every byte they expect landed:
        publish, next phase."""
        if bar.pending or bar.tx:
            return
        bar.completed[bar.phase % 2] = bar.acc.copy()
        bar.completed_ext[bar.phase % 2], bar.ext = bar.ext, None
        bar.acc[:] = -1
        bar.phase += 1
        bar.pending = bar.count

    def x_setmaxnreg(self, w, op):
        """Register budgets change occupancy, not results."""


def _matrix(lay, values, dtype) -> np.ndarray:
    """The matrix a lane layout spreads over registers: element (r, c) is values[lane, slot]
    for the (lane, slot) that holds it."""
    r, c = lay.coords()
    m = np.zeros(lay.shape, dtype)
    m[r, c] = values
    return m


# OCP MX FP4 E2M1 by its 4-bit code: sign bit 3, exponent bits 2:1 (bias 1), mantissa bit 0
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
_E2M1 = np.concatenate([_E2M1, -_E2M1])


def _fp4_pairs(raw: np.ndarray, axis: int) -> np.ndarray:
    """Bytes of packed FP4 pairs -> their values, twice as many along `axis` (element 2i
    from bits 3:0 of byte i, 2i + 1 from bits 7:4)."""
    lo, hi = _E2M1[raw & 15], _E2M1[raw >> 4]
    return np.stack([lo, hi], axis=axis + 1).reshape(
        tuple(n * 2 if d == axis else n for d, n in enumerate(raw.shape)))


def _fp6_stream(fmt):
    """Bytes of densely packed FP6 (`fmt`, an ml_dtypes float6 type) -> their values, 4/3 as
    many along `axis`: each line of bytes along the axis is one little-endian bit string,
    value j in bits 6j .. 6j + 5 (pk.e2m3p)."""
    def unpack(raw: np.ndarray, axis: int) -> np.ndarray:
        lines = np.moveaxis(raw, axis, -1)
        bits = np.unpackbits(lines, axis=-1, bitorder="little")
        n = bits.shape[-1] // 6
        codes = np.packbits(bits[..., :6 * n].reshape(*lines.shape[:-1], n, 6), axis=-1,
                            bitorder="little")[..., 0]
        return np.moveaxis(codes.view(fmt).astype(np.float32), -1, axis)
    return unpack


# MFMA operand types stored packed: their unpacking, bytes -> values along K
_PACKED = {"e2m1x2": _fp4_pairs, "e2m3p": _fp6_stream(ml_dtypes.float6_e2m3fn),
           "e3m2p": _fp6_stream(ml_dtypes.float6_e3m2fn)}


def _element_bytes(region, rows, cols) -> np.ndarray:
    """Flat LDS byte indices of the elements (rows, cols) of a region's tile, in order."""
    return (region.byte_offset(rows, cols)[..., None] +
            np.arange(region.tile.dtype.bytes)).reshape(-1)


def _lds_values(lds, idx, d) -> np.ndarray:
    """The `d` elements whose bytes are LDS[idx] (whole elements, in order), flat."""
    return lds[idx].reshape(-1, d.bytes).copy().view(np.dtype(d.np)).reshape(-1)


def _box(buf, rows, cols, lead=()):
    """Element offsets and in-bounds mask of elements (lead..., rows, cols) of a tensor
    (`lead` indexes the dims before the last two)."""
    mask = (rows >= 0) & (rows < buf.shape[-2]) & (cols >= 0) & (cols < buf.shape[-1])
    off = rows * buf.strides[-2] + cols * buf.strides[-1]
    for i, x in enumerate(lead):
        mask = mask & (0 <= x < buf.shape[i])
        off = off + x * buf.strides[i]
    return off, mask


def _masked_read(buf, off, mask, fill=None) -> np.ndarray:
    """Tensor elements at `off` where `mask` holds, `fill` (default 0) elsewhere; offsets
    outside the mask are never read."""
    fill = np.zeros((), buf.flat.dtype) if fill is None else fill
    return np.where(mask, buf.flat[np.where(mask, off, 0)], fill)


class _Shadow:
    """An op seen through another layout (same operands, result and location)."""

    def __init__(self, op, layout):
        self.kind, self.srcs, self.loc = op.kind, op.srcs, op.loc
        self.dst = _ShadowValue(op.dst)
        self.attrs = {**op.attrs, "layout": layout}


class _ShadowValue:
    def __init__(self, v):
        self.type, self.name = v.type, v.name


class _BarOp:
    """A TMA load seen as the arrival it makes on its barrier."""

    def __init__(self, op):
        self.kind, self.loc, self.srcs = "tma_load", op.loc, ()
        self.attrs = {"region": op.attrs["bar"]}


class _StageOutOfRange(Exception):
    """A runtime stage index outside its pk.empty(..., count=n) (turned into OutOfBounds)."""


class _Unset(Exception):
    """A register read before any op wrote it (turned into UnwrittenRead with the op)."""


class _Busy(Exception):
    """A register read while an unretired wgmma group writes it (turned into a Race)."""


def _lds_written_ranges(prog) -> list[tuple[int, int]]:
    """LDS byte ranges that some op of the program writes (to tell a missing barrier from
    a tile nobody stores)."""
    from ..ir.nodes import walk
    out = []
    for op in walk(prog.body):
        if op.kind in ("lds_store", "gload_lds", "tma_load"):
            r = op.attrs["region"]
            out.append((r.base, r.base + max(r.size, r.stride * r.count)))
    return out


def _view_key(a):
    """Arguments with equal keys are the same view of the same memory (an in-place
    update): they share one buffer, as they share memory on the GPU."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return None
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _pids(grid, cluster: int = 1):
    """Workgroup ids in launch order (x fastest); of clusters, each one's first."""
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(0, grid[0], cluster):
                yield x, y, z


class World:
    """Launches that run at the same time and share memory: the ranks of a group (each
    with its own launch), or kernels on several streams. Each launch's workgroups start in
    launch order, at most `resident` of a launch at once (workgroups wait for a free
    compute unit, as on a GPU); live workgroups of all launches take turns whenever one
    can only wait for a flag. Arrays shared between launches (by view, as one buffer) are
    one memory; accesses are ordered across workgroups only through flags (pk.signal /
    pk.wait_flag), which the race checks follow."""

    def __init__(self, launches, resident: int, wave_order: str = "forward"):
        """`launches`: (lane program, {param: array or number}, grid, label) each.
        `wave_order`: which of a workgroup's runnable waves runs first (WAVE_ORDERS)."""
        from ..runtime.args import written_params
        if wave_order not in WAVE_ORDERS:
            raise ValueError(f"wave_order is one of {', '.join(WAVE_ORDERS)}, not "
                             f"{wave_order!r}")
        self.resident, self.wave_order = resident, wave_order
        self.ustride = max(p.num_waves for p, *_ in launches)
        self.sync = any(op.kind in ("signal", "flag_wait") for p, *_ in launches
                        for op in walk(p.body))
        views, written = {}, set()
        for i, (prog, args, grid, label) in enumerate(launches):
            written |= {(i, n) for n in written_params(prog)}
            for p in prog.params:
                if p.name not in args:
                    raise KernelError(f"missing argument {p.name!r}", None, prog.name)
                if p.kind == "gl":
                    a = args[p.name]
                    views.setdefault(_view_key(np.asarray(a)) or id(a), []).append((i, p))
        bufs = [dict() for _ in launches]
        for members in views.values():
            (i0, p0) = members[0]
            buf = _GlobalBuf(p0.name, np.asarray(launches[i0][1][p0.name]), p0.type,
                             track=any((i, p.name) in written for i, p in members))
            buf.names = list(dict.fromkeys(p.name for _, p in members))
            for i, p in members:
                bufs[i][p.name] = buf
        self.machines, gid = [], 0
        for (prog, args, grid, label), b in zip(launches, bufs):
            grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
            scalars = {p.name: np.asarray(args[p.name]).astype(p.type.dtype.np)
                       for p in prog.params if p.kind != "gl"}
            self.machines.append(_Machine(prog, b, scalars, grid, self, gid, label))
            gid += grid[0] * grid[1] * grid[2]
        self.units = gid * self.ustride
        self.stamps = 0                  # pk.timestamp's: taken so far, in the run's order

    def who(self, unit: int) -> str:
        g, wave = divmod(unit, self.ustride)
        for m in self.machines:
            gx, gy, gz = m.grid
            n = gx * gy * gz
            if m.gid_base <= g < m.gid_base + n:
                i = g - m.gid_base
                where = f"workgroup {(i % gx, i // gx % gy, i // (gx * gy))}, wave {wave}"
                return f"{m.label}: {where}" if m.label else where
        return f"unit {unit}"

    def run(self) -> list[dict]:
        pending = [_pids(m.grid, m.p.cluster) for m in self.machines]
        live: list = []                     # [machine index, generator, last report]
        counts = [0] * len(self.machines)
        while True:
            started = False
            for i, m in enumerate(self.machines):
                while counts[i] + m.p.cluster <= max(self.resident, m.p.cluster):
                    pid = next(pending[i], None)
                    if pid is None:
                        break
                    live.append([i, m.run_workgroup(pid), None])
                    counts[i] += m.p.cluster          # a cluster's workgroups at once
                    started = True
            if not live:
                break
            moved = started
            for entry in list(live):
                try:
                    entry[2] = next(entry[1])
                    moved |= entry[2][0]
                except StopIteration:
                    live.remove(entry)
                    counts[entry[0]] -= self.machines[entry[0]].p.cluster
                    moved = True
            if not moved:
                self._deadlock(live)
        out = []
        for m in self.machines:
            arrays = {id(b): b.flat.reshape(b.shape) for b in m.bufs.values()}
            out.append({n: arrays[id(b)] for n, b in m.bufs.items()})
        return out

    def _deadlock(self, live):
        lines = []
        for i, _, (_, waves, state) in live[:6]:
            m = self.machines[i]
            for w in waves:
                op = state[w]
                if op in (None, "done"):
                    continue
                if op.kind == "flag_wait":
                    buf, off = m._flag(w, op)
                    idx = tuple(int(c) for c in np.unravel_index(off, buf.shape))
                    what = (f"waits for {buf.label()}{list(idx)} >= "
                            f"{int(m.get(w, op.srcs[-1]))} (it holds {int(buf.flat[off])})")
                else:
                    what = f"waits at {op.kind}"
                lines.append(f"{m._who(m._unit(w))} {what} [{op.loc}]")
                break
        more = f"; and {len(live) - 6} more workgroups" if len(live) > 6 else ""
        m = self.machines[live[0][0]]
        raise Deadlock("deadlock: every running workgroup waits for a flag that no workgroup "
                       "left to run will raise (a signal missing, a wrong index or value, or "
                       f"waits in an order that needs more workgroups at once than "
                       f"{self.resident} per launch):\n  " + "\n  ".join(lines) + more,
                       None, m.p.name)


# The order in which a workgroup's runnable waves take turns (each runs until it blocks).
# The GPU promises none: "forward" runs wave 0 (on Hopper, a producer) first, so copies
# tend to land before anyone waits for them; "reverse" runs the last waves (consumers)
# first, so a wait that a barrier's phase parity lets through too early (a phase two
# ahead looks complete) reads memory nothing has written yet, and is reported.
WAVE_ORDERS = ("forward", "reverse")


def run_program(prog: LaneProgram, args: dict, grid, wave_order: str = "forward") -> dict:
    """Run `prog` over `grid` (tuple of up to 3 ints). `args` maps parameter names to numpy
    arrays (global tensors) or numbers (scalars); the same array under two names is one
    buffer. Returns the global tensors after the run (new arrays; the inputs are not
    modified). As many workgroups are resident at once as the program was built to fit
    (programs_per_cu a compute unit, else one)."""
    return World([(prog, args, grid, "")], prog.target.num_cus * max(1, prog.programs_per_cu),
                 wave_order).run()[0]
