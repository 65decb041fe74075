"""Cache simulator: replay a launch order through per-XCD LRU L2s and a shared LLC.

Model (docs/chiplet.md has the full story):

- Dispatch: workgroup d runs on XCD d % num_xcds (CDNA round robin; one L2 on Hopper) in
  resident slot d % R, R = num_xcds * cus_per_xcd * wgs_per_cu. Every workgroup runs the same
  number of main-loop steps, so slot s runs workgroups s, s + R, s + 2R, ... back to back:
  the launch proceeds in waves of R resident workgroups.
- Time: slot s starts `s * launch_skew + jitter_s` steps late (workgroups are launched one
  after another, and CUs drift apart); jitter_s is uniform in [0, phase_jitter). Time advances
  in whole steps; in each step every running workgroup reads its blocks for that step.
- Caches: each block (ops.Stream) is one object. Objects are split into equal units (the gcd
  of the block sizes) so that one exact LRU over units serves every block size. Each XCD's
  L2 is an LRU over its own accesses; L2 misses, in time order across XCDs, go through one
  LRU LLC (memory-side, like AMD's Infinity Cache); LLC misses are HBM reads.
- Hit rates are byte-weighted (a hit on a 32 KiB block counts 32 KiB). HBM bytes = LLC-miss
  bytes + compulsory output writes (writes are not cached in the model).
- Partitioned L2 (Hopper, `Target.l2_partitions` > 1): no XCDs and no LLC; the L2 is split
  into partitions of equal size, each caching the data its SMs request (launch slot s on
  the partition beside the SM the dispatcher gives the s-th workgroup, as measured on the
  H200: targets/sm90a.py; s % P where the target does not say) and homing 1/P of the
  address space (a hash of the unit). A request looks up its SM's partition; a miss on a
  line homed elsewhere looks up the home partition too, and only a miss there reads DRAM.
  Both partitions are LRUs over everything they hold (home lines and copies). The hit
  rate counts every lookup, as Nsight Compute's lts__t_sector_hit_rate does. This replay
  is sequential (the partitions feed each other), so it runs as a Python loop over units,
  slower than the C-level LRU.
- Dispatch where it is not round robin (Hopper): a one-workgroup-per-tile launch hands each
  tile, in launch order, to the slot that frees first; a persistent launch of R workgroups
  gives workgroup w the tiles w, w + R, w + 2R, ... (pk.tile_walk). Each tile takes
  `steps * (1 + tile_jitter * u)` steps, u uniform in [0, 1): a persistent walk's slots
  drift apart, a dynamic launch keeps its running tiles a window of the launch order.

The LRU runs in C: `functools.lru_cache` over unit keys, wrapped around a counter that is
only called on a miss, so every access is one C-level cache lookup and no Python frame.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .. import targets
from .mapping import Mapping, dispatch_xcd
from .ops import _dtype_bytes


@dataclass(frozen=True)
class Machine:
    """The cache topology the simulator replays on; `Machine.of(target)` reads it from
    pykittens.targets. `wgs_per_cu` (workgroups resident per CU) depends on the kernel's
    LDS and register use, so it is a parameter, not a hardware fact."""
    name: str
    num_xcds: int
    cus_per_xcd: int
    l2_bytes: int           # per XCD
    llc_bytes: int          # shared by all XCDs; 0 when there is none
    line_bytes: int
    round_robin: bool
    wgs_per_cu: int = 1
    l2_partitions: int = 1  # >1: the L2 (l2_bytes in all) split into homing partitions
    # closed-loop dispatch (Timing.closed_loop): one resident slot's share of the dense
    # matrix peak (16-bit operands; 8-bit ones twice that) and of the DRAM bandwidth
    slot_flops_per_s: float = 0.0
    slot_dram_bytes_per_s: float = 0.0
    # partitioned L2: the partition beside each resident slot's SM (launch slot w: the SM
    # the w-th workgroup of a launch lands on); () takes slot % l2_partitions
    slot_partition: tuple = ()

    @classmethod
    def of(cls, target, *, wgs_per_cu: int = 1, l2_bytes: int | None = None,
           llc_bytes: int | None = None, l2_partitions: int | None = None) -> "Machine":
        t = targets.get(target)
        if isinstance(wgs_per_cu, bool) or not isinstance(wgs_per_cu, int) or wgs_per_cu < 1:
            raise ValueError(f"wgs_per_cu must be a positive integer, got {wgs_per_cu!r}")
        l2 = t.l2_bytes_per_xcd if l2_bytes is None else int(l2_bytes)
        llc = t.llc_bytes if llc_bytes is None else int(llc_bytes)
        if l2 < 0 or llc < 0:
            raise ValueError(f"cache sizes must be >= 0 bytes, got l2={l2}, llc={llc}")
        parts = t.l2_partitions if l2_partitions is None else l2_partitions
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise ValueError(f"l2_partitions must be a positive integer, got {parts!r}")
        if parts > 1 and (t.num_xcds != 1 or llc > 0):
            raise ValueError("a partitioned L2 is modeled on one die without an LLC")
        slots = t.num_cus * wgs_per_cu
        peak = t.fact("dense_bf16_flops")[0] if t.has_fact("dense_bf16_flops") else 0.0
        chip = t.chips[-1]               # the clock under a tensor-bound load, measured
        if t.has_fact(f"load_clock_hz/{chip}"):
            peak *= t.fact(f"load_clock_hz/{chip}")[0] / t.fact(f"clock_hz/{chip}")[0]
        side = ()
        if parts == t.l2_partitions > 1 and t.dispatch_sms and t.sm_l2_partition:
            # slot w: the w-th workgroup of a launch, on the SM the dispatcher gives it
            # (the same order again for a second workgroup per SM)
            side = tuple(t.sm_l2_partition[t.dispatch_sms[w % len(t.dispatch_sms)]]
                         for w in range(slots))
        return cls(t.name, t.num_xcds, t.cus_per_xcd, l2, llc, t.cache_line_bytes,
                   t.dispatch_round_robin, wgs_per_cu, parts, peak / slots,
                   t.hbm_bytes_per_s / slots, side)

    @property
    def resident(self) -> int:
        return self.num_xcds * self.cus_per_xcd * self.wgs_per_cu


@dataclass(frozen=True)
class Timing:
    """How far apart resident workgroups run, in main-loop steps. Both are model parameters,
    not hardware facts: calibrated so that the 9216^3 bf16 GEMM on gfx950 lands near the
    L2/LLC hit rates HipKittens measured (docs/chiplet.md). launch_skew=0 and phase_jitter=0
    is the idealized lockstep machine."""
    launch_skew: float = 0.04     # steps between consecutive workgroup launches
    phase_jitter: float = 2.0     # each slot's extra random delay, uniform in [0, this)
    seed: int = 0
    # Where dispatch is not round robin (Hopper): each tile takes steps * (1 + jitter * u)
    # steps, u uniform in [0, 1): tile_jitter for one workgroup per tile, walk_jitter for
    # a persistent walk's tiles. Fitted on the H200 measurements (docs/chiplet.md).
    tile_jitter: float = 0.05
    walk_jitter: float = 0.05
    # Closed loop (Hopper): a tile takes at least the time its DRAM reads need at its slot's
    # share of the bandwidth, replayed twice more with the tiles' reads of the previous
    # pass, so tiles that miss fall behind and the dispatch order drifts with the misses.
    closed_loop: bool = False
    # Partitioned L2 (Hopper): steps a DRAM read takes to fill its line; requests for the
    # line meanwhile merge with the miss, uncounted, and C's stores count as lookups that
    # hit, as ncu counts both (partitioned_replay). 0: the untimed replay. Tried with the
    # jitters refitted, not the library's (docs/chiplet.md).
    miss_window: float = 0.0

    def __post_init__(self):
        if min(self.launch_skew, self.phase_jitter, self.tile_jitter, self.walk_jitter,
               self.miss_window) < 0:
            raise ValueError("launch_skew, phase_jitter, tile_jitter, walk_jitter and "
                             "miss_window must be >= 0")


@dataclass(frozen=True)
class Schedule:
    """A launch's schedule as measured (bench/chiplet_timeline.py: pk.timestamp in every
    tile): each tile's start in main-loop steps from the launch's first (by launch index;
    a persistent walk's tiles too) and where it ran — the L2 partition of its SM, or its
    XCD. `simulate(schedule=)` replays it instead of Timing's modeled dispatch."""
    start: np.ndarray
    place: np.ndarray

    def __post_init__(self):
        if len(self.start) != len(self.place):
            raise ValueError(f"a schedule gives each tile a start and a place: {len(self.start)} "
                             f"starts, {len(self.place)} places")
        if len(self.start) and float(np.min(self.start)) < 0:
            raise ValueError("a schedule's starts are steps from the launch's first, >= 0")


@dataclass(frozen=True)
class SimResult:
    op: str
    mapping: str
    target: str
    l2_hit_rate: float
    llc_hit_rate: float | None    # None when the machine has no LLC
    hbm_bytes: int                # hbm_read_bytes + hbm_write_bytes
    hbm_read_bytes: int
    hbm_write_bytes: int
    l2_request_bytes: int
    llc_request_bytes: int
    xcd_l2_hit_rates: tuple[float | None, ...]   # None for an XCD that got no work
    seconds: float = field(default=0.0, compare=False)
    l2_lookup_bytes: int = 0      # L2 lookups (a far request on a partitioned L2 makes two)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["xcd_l2_hit_rates"] = list(self.xcd_l2_hit_rates)
        return d


def lru_misses(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Miss flags of an LRU cache holding `capacity` equal-sized objects, for accesses `keys`.

    A miss calls the wrapped counter and caches a fresh, larger id; a hit returns the id
    cached earlier. So access i missed iff its id exceeds every id returned before it."""
    n = len(keys)
    if capacity <= 0 or n == 0:
        return np.ones(n, bool)
    # next(counter, key) ignores key: a C-level "fresh id" function, so a miss costs no
    # Python frame either.
    cached = functools.lru_cache(maxsize=int(capacity))(
        functools.partial(next, itertools.count()))
    ids = np.fromiter(map(cached, keys.tolist()), dtype=np.int64, count=n)
    miss = np.empty(n, bool)
    miss[0] = True
    miss[1:] = ids[1:] > np.maximum.accumulate(ids)[:-1]
    return miss


def start_steps(n: int, steps: int, resident: int, timing: Timing) -> np.ndarray:
    """Step at which each workgroup (by launch index) starts its main loop."""
    d = np.arange(n, dtype=np.int64)
    slot = d % resident
    jitter = np.random.Generator(np.random.PCG64(timing.seed)).random(resident)
    delay = slot * timing.launch_skew + jitter[slot] * timing.phase_jitter
    start = (d // resident) * steps + delay
    return np.floor(start).astype(np.int64)


def _schedule(n: int, steps: int, machine: Machine, timing: Timing,
              persistent: int | None, mem_steps=None):
    """(start step, placement, exact start) of each tile by launch index. Placement is the
    XCD on a chiplet machine, the L2 partition of the tile's SM on a partitioned one; the
    start step is the exact start (a fraction of a step on Hopper) rounded down.

    Round-robin machines (CDNA), and one-per-tile launches on an unpartitioned machine
    (the single-LRU Hopper model auto_mapping keeps): `start_steps`, slot d % R, XCD d % X;
    a persistent launch only sets R. Otherwise (Hopper): slot starts as in `start_steps`, tiles of jittered
    length, handed to the slot that frees first (persistent=None) or walked by a fixed
    slot (persistent=R: workgroup w takes tiles w, w + R, ...). `mem_steps` (closed loop):
    each tile's DRAM time in steps, a floor under its length."""
    d = np.arange(n, dtype=np.int64)
    if machine.round_robin or (machine.l2_partitions == 1 and persistent is None):
        resident = persistent or machine.resident
        place = dispatch_xcd(d if persistent is None else d % resident, machine.num_xcds, True)
        start = start_steps(n, steps, resident, timing)
        return start, place, start.astype(float)
    resident = min(persistent or machine.resident, max(n, 1))
    rng = np.random.Generator(np.random.PCG64(timing.seed))
    jitter = rng.random(resident)
    free = (np.arange(resident) * timing.launch_skew + jitter * timing.phase_jitter).tolist()
    jitter = timing.walk_jitter if persistent else timing.tile_jitter
    length = steps * (1.0 + jitter * rng.random(n))
    if mem_steps is not None:                # closed loop: no faster than its DRAM reads
        length = np.maximum(length, mem_steps)
    length = length.tolist()
    start = np.empty(n)
    slot = np.empty(n, np.int64)
    if persistent:
        for i in range(n):
            w = i % resident
            start[i], slot[i] = free[w], w
            free[w] += length[i]
    else:
        heap = [(t, w) for w, t in enumerate(free)]
        heapq.heapify(heap)
        for i in range(n):
            t, w = heapq.heappop(heap)
            start[i], slot[i] = t, w
            heapq.heappush(heap, (t + length[i], w))
    parts = machine.l2_partitions
    if parts > 1:
        place = np.asarray(machine.slot_partition)[slot] if machine.slot_partition else \
            slot % parts
    else:
        place = dispatch_xcd(slot, machine.num_xcds, False)
    return np.floor(start).astype(np.int64), place, start


def _trace(op, mapping: Mapping, machine: Machine, timing: Timing,
           persistent: int | None = None, mem_steps=None, schedule: Schedule | None = None):
    """Every block access in step order: (item key, units, xcd, tile), the unit size, and
    each access's exact time in steps (its tile's exact start + the step).

    In each step, all reads of one stream come before the next stream's (prologue first),
    and a stream's reads are ordered by (start step, block): so requests for the same block
    in the same step are adjacent. The order inside one step is otherwise unspecified by the
    model; this one lets adjacent duplicates be merged exactly (see `simulate`)."""
    if tuple(mapping.grid) != tuple(op.grid):
        raise ValueError(f"mapping {mapping.spec!r} is for a {mapping.grid} tile grid but the "
                         f"{op.kind} has {op.grid}; build the mapping from this op")
    n = mapping.size
    streams = op.streams(mapping(np.arange(n, dtype=np.int64)), machine.line_bytes)
    unit = functools.reduce(math.gcd, [s.nbytes for s in streams])
    steps = op.steps
    if schedule is None:
        t0, place, exact = _schedule(n, steps, machine, timing, persistent, mem_steps)
    elif len(schedule.start) != n:
        raise ValueError(f"the schedule has {len(schedule.start)} tiles, the launch {n}")
    else:
        exact = np.asarray(schedule.start, float)
        t0, place = np.floor(exact).astype(np.int64), np.asarray(schedule.place, np.int64)
    d = np.arange(n, dtype=np.int64)
    ticks = np.arange(t0.min(), t0.max() + steps, dtype=np.int64)
    parts, offset = [], 0
    for s in streams:
        order = np.lexsort((d, s.base, t0))
        ts = t0[order]
        lo = np.searchsorted(ts, ticks - steps if s.per_step else ticks - 1, side="right")
        length = np.searchsorted(ts, ticks, side="right") - lo
        parts.append((s, order, lo, length, offset))
        offset += s.count * (steps if s.per_step else 1)
    per_tick = sum(p[3] for p in parts)
    total = int(per_tick.sum())
    keys = np.empty(total, np.int64)
    units = np.empty(total, np.int64)
    wgs = np.empty(total, np.int64)
    when = np.empty(total)
    before = np.cumsum(per_tick) - per_tick          # where each step's reads begin
    for s, order, lo, length, off in parts:
        m = int(length.sum())
        j = np.arange(m, dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        wg = order[np.repeat(lo, length) + j]
        pos = np.repeat(before, length) + j
        before = before + length
        k = np.repeat(ticks, length) - t0[wg]
        keys[pos] = off + (s.base[wg] * steps + k if s.per_step else s.base[wg])
        units[pos] = s.nbytes // unit
        wgs[pos] = wg
        when[pos] = exact[wg] + k
    return keys, units, place[wgs], wgs, unit, when


def _expand(keys, units, span):
    """Unit keys of block accesses: block key b of u units -> b*span + 0..u-1."""
    if span == 1:
        return keys
    first = np.cumsum(units) - units
    return np.repeat(keys * span - first, units) + np.arange(int(units.sum()), dtype=np.int64)


def home_partition(ukeys: np.ndarray, parts: int) -> np.ndarray:
    """The partition that homes each unit: a multiplicative hash of its key, so that
    neighbouring units (and both halves of a block) spread over the partitions."""
    h = (ukeys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (h % np.uint64(parts)).astype(np.int64)


def partitioned_replay(ukeys: np.ndarray, upart: np.ndarray, home: np.ndarray,
                       capacity: int, parts: int, dram_mask: np.ndarray | None = None,
                       utime: np.ndarray | None = None, window: float = 0.0):
    """Replay unit requests through `parts` LRU partitions of `capacity` units each.

    Request i comes from an SM on partition upart[i] for a unit homed on home[i]. It looks
    up its own partition; on a miss for a unit homed elsewhere it looks up the home
    partition as well (both lookups counted, as ncu counts L2 tag lookups); a miss at home
    reads DRAM. A miss fills every partition it looked up. With `utime` (each request's
    time in steps, requests in time order): a DRAM read fills its line `window` steps after
    the miss, and a request for a line still being filled merges with that miss — no lookup
    counted, no DRAM read (the L2 merges requests for sectors in flight before any tag
    lookup: docs/chiplet.md); a copy from the home partition is ready when the home's line
    is. Returns (lookups, hits, DRAM units, near hits per partition, near lookups per
    partition); `dram_mask`, if given, gets True where a request read DRAM."""
    caches = [OrderedDict() for _ in range(parts)]
    near_hits, near_lookups = [0] * parts, [0] * parts
    far_lookups = home_hits = dram = 0
    if capacity <= 0:
        far = int((upart != home).sum())
        if dram_mask is not None:
            dram_mask[:] = True
        return len(ukeys) + far, 0, len(ukeys), near_hits, \
            np.bincount(upart, minlength=parts).tolist()
    times = itertools.repeat(0.0) if utime is None else utime.tolist()
    for i, (k, p, h, t) in enumerate(zip(ukeys.tolist(), upart.tolist(), home.tolist(),
                                         times)):
        c = caches[p]
        ready = c.get(k)                     # when the line is (or was) filled
        if ready is not None:
            c.move_to_end(k)
            if t >= ready:
                near_lookups[p] += 1
                near_hits[p] += 1
            continue                         # else merged with the miss in flight
        near_lookups[p] += 1
        c[k] = t + window
        if len(c) > capacity:
            c.popitem(last=False)
        if h != p:
            f = caches[h]
            ready = f.get(k)
            if ready is not None:
                f.move_to_end(k)
                if t >= ready:
                    far_lookups += 1
                    home_hits += 1
                c[k] = max(ready, t)
                continue
            far_lookups += 1
            f[k] = t + window
            if len(f) > capacity:
                f.popitem(last=False)
        dram += 1
        if dram_mask is not None:
            dram_mask[i] = True
    lookups = sum(near_lookups) + far_lookups
    return lookups, sum(near_hits) + home_hits, dram, near_hits, near_lookups


def _simulate_partitioned(op, mapping, machine, keys, units, part, unit, t_begin,
                          tiles=None, when=None, window=0.0):
    """The partitioned-L2 replay of a trace (see the module docstring). With window > 0
    every request is replayed in the order of its exact time (`when`), so that requests
    for a line in flight merge with its miss (partitioned_replay). Without, repeats of a
    block within a run of identical consecutive requests, from a partition that already
    asked for it in that run, are hits that change no LRU state: counted and skipped. The
    timed replay also counts C's stores as lookups that hit, as ncu does. With `tiles`
    (each access's tile), also the DRAM bytes each tile read: (result, bytes)."""
    parts = machine.l2_partitions
    utime = None
    if window > 0:
        order = np.argsort(when, kind="stable")
        keys, units, part, when = keys[order], units[order], part[order], when[order]
        tiles = None if tiles is None else tiles[order]
        fresh = np.ones(len(keys), bool)
        utime = np.repeat(when, units)
    else:
        run = np.cumsum(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys
        _, first = np.unique(run * parts + part, return_index=True)
        fresh = np.zeros(len(keys), bool)
        fresh[first] = True
    span = int(units.max())
    ukeys = _expand(keys[fresh], units[fresh], span)
    upart = np.repeat(part[fresh], units[fresh])
    mask = None if tiles is None else np.zeros(len(ukeys), bool)
    lookups, hits, dram, near_hits, looked = partitioned_replay(
        ukeys, upart, home_partition(ukeys, parts), machine.l2_bytes // parts // unit, parts,
        mask, utime, window)
    repeats = [int(units[~fresh & (part == p)].sum()) for p in range(parts)]
    stores = op.output_bytes // unit if window > 0 else 0
    lookups += sum(repeats) + stores
    hits += sum(repeats) + stores
    total = [r + q for r, q in zip(looked, repeats)]
    reads = dram * unit
    result = SimResult(
        op=op.describe(), mapping=mapping.spec, target=machine.name,
        l2_hit_rate=hits / lookups, llc_hit_rate=None,
        hbm_bytes=reads + op.output_bytes, hbm_read_bytes=reads,
        hbm_write_bytes=op.output_bytes, l2_request_bytes=int(units.sum()) * unit,
        llc_request_bytes=(sum(looked) - sum(near_hits)) * unit,   # missed the near one
        xcd_l2_hit_rates=tuple((h + q) / r if r else None
                               for h, q, r in zip(near_hits, repeats, total)),
        seconds=time.perf_counter() - t_begin, l2_lookup_bytes=lookups * unit)
    if tiles is None:
        return result
    utile = np.repeat(tiles[fresh], units[fresh])
    return result, np.bincount(utile[mask], minlength=mapping.size) * unit


CLOSED_LOOP_PASSES = 3        # replays of a closed-loop launch (the first one open loop)


def simulate(op, mapping: Mapping, target="gfx950", *, machine: Machine | None = None,
             timing: Timing | None = None, wgs_per_cu: int = 1,
             persistent: int | None = None, schedule: Schedule | None = None) -> SimResult:
    """Replay `op` launched with `mapping` on `target` (or an explicit `machine`): one
    workgroup per tile, or, with persistent=R, R workgroups walking the tiles (workgroup w
    takes w, w + R, ..., as pk.tile_walk does). `schedule` (a Schedule, as measured):
    each tile's start and place as given, instead of the dispatch `timing` models.

    A request for the block the same XCD requested just before it is a hit that leaves the
    LRU order unchanged, so such repeats are counted as hits and skipped: exact, and it
    keeps the C-level LRU loop short."""
    t_begin = time.perf_counter()
    machine = machine or Machine.of(target, wgs_per_cu=wgs_per_cu)
    timing = timing or Timing()
    if persistent is not None and (isinstance(persistent, bool)
                                   or not isinstance(persistent, int) or persistent < 1):
        raise ValueError(f"persistent must be a positive number of workgroups, "
                         f"got {persistent!r}")
    if schedule is not None and timing.closed_loop:
        raise ValueError("a measured schedule replaces the modeled dispatch: closed_loop "
                         "(which remodels it) does not apply")
    keys, units, xcd, tiles, unit, when = _trace(op, mapping, machine, timing, persistent,
                                                 schedule=schedule)
    if machine.l2_partitions > 1 and timing.closed_loop and machine.slot_dram_bytes_per_s:
        # a step's time at the slot's share of the matrix peak (8-bit operands at twice
        # the 16-bit rate), and the DRAM bytes the slot's share of bandwidth moves in it
        rate = machine.slot_flops_per_s * (2 if _dtype_bytes(op.dtype) == 1 else 1)
        step_bytes = machine.slot_dram_bytes_per_s * op.step_flops / rate
        for _ in range(CLOSED_LOOP_PASSES - 1):
            _, read = _simulate_partitioned(op, mapping, machine, keys, units, xcd, unit,
                                            t_begin, tiles, when, timing.miss_window)
            keys, units, xcd, tiles, unit, when = _trace(op, mapping, machine, timing,
                                                         persistent, read / step_bytes)
    if machine.l2_partitions > 1:
        return _simulate_partitioned(op, mapping, machine, keys, units, xcd, unit, t_begin,
                                     when=when, window=timing.miss_window)
    span = int(units.max())
    fresh = np.ones(len(keys), bool)
    xcd_sel = [np.flatnonzero(xcd == x) for x in range(machine.num_xcds)]
    for sel in xcd_sel:
        kx = keys[sel]
        fresh[sel[1:]] = kx[1:] != kx[:-1]
    ukeys = _expand(keys[fresh], units[fresh], span)
    uxcd = np.repeat(xcd[fresh], units[fresh]) if span > 1 else xcd[fresh]
    umiss = np.ones(len(ukeys), bool)
    misses = []
    for x in range(machine.num_xcds):
        sel = np.flatnonzero(uxcd == x)
        m = lru_misses(ukeys[sel], machine.l2_bytes // unit)
        umiss[sel] = m
        misses.append(int(m.sum()))
    requested = [int(units[sel].sum()) for sel in xcd_sel]
    llc_keys = ukeys[umiss]
    if machine.llc_bytes > 0:
        llc_miss = lru_misses(llc_keys, machine.llc_bytes // unit)
        llc_hit = float(1.0 - llc_miss.mean())
        reads = int(llc_miss.sum()) * unit
    else:
        llc_hit, reads = None, len(llc_keys) * unit
    total = sum(requested)
    return SimResult(
        op=op.describe(), mapping=mapping.spec, target=machine.name,
        l2_hit_rate=1.0 - sum(misses) / total, llc_hit_rate=llc_hit,
        hbm_bytes=reads + op.output_bytes, hbm_read_bytes=reads,
        hbm_write_bytes=op.output_bytes, l2_request_bytes=total * unit,
        llc_request_bytes=len(llc_keys) * unit,
        xcd_l2_hit_rates=tuple(1.0 - m / r if r else None for m, r in zip(misses, requested)),
        seconds=time.perf_counter() - t_begin, l2_lookup_bytes=total * unit)
