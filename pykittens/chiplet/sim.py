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

The LRU runs in C: `functools.lru_cache` over unit keys, wrapped around a counter that is
only called on a miss, so every access is one C-level cache lookup and no Python frame.
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .. import targets
from .mapping import Mapping, dispatch_xcd


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

    @classmethod
    def of(cls, target, *, wgs_per_cu: int = 1, l2_bytes: int | None = None,
           llc_bytes: int | None = None) -> "Machine":
        t = targets.get(target)
        if isinstance(wgs_per_cu, bool) or not isinstance(wgs_per_cu, int) or wgs_per_cu < 1:
            raise ValueError(f"wgs_per_cu must be a positive integer, got {wgs_per_cu!r}")
        l2 = t.l2_bytes_per_xcd if l2_bytes is None else int(l2_bytes)
        llc = t.llc_bytes if llc_bytes is None else int(llc_bytes)
        if l2 < 0 or llc < 0:
            raise ValueError(f"cache sizes must be >= 0 bytes, got l2={l2}, llc={llc}")
        return cls(t.name, t.num_xcds, t.cus_per_xcd, l2, llc, t.cache_line_bytes,
                   t.dispatch_round_robin, wgs_per_cu)

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

    def __post_init__(self):
        if not (self.launch_skew >= 0 and self.phase_jitter >= 0):
            raise ValueError("launch_skew and phase_jitter must be >= 0 (steps)")


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


def _trace(op, mapping: Mapping, machine: Machine, timing: Timing):
    """Every block access in time order: (item key, units, xcd), plus the unit size.

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
    t0 = start_steps(n, steps, machine.resident, timing)
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
    return keys, units, dispatch_xcd(wgs, machine.num_xcds, machine.round_robin), unit


def _expand(keys, units, span):
    """Unit keys of block accesses: block key b of u units -> b*span + 0..u-1."""
    if span == 1:
        return keys
    first = np.cumsum(units) - units
    return np.repeat(keys * span - first, units) + np.arange(int(units.sum()), dtype=np.int64)


def simulate(op, mapping: Mapping, target="gfx950", *, machine: Machine | None = None,
             timing: Timing | None = None, wgs_per_cu: int = 1) -> SimResult:
    """Replay `op` launched with `mapping` on `target` (or an explicit `machine`).

    A request for the block the same XCD requested just before it is a hit that leaves the
    LRU order unchanged, so such repeats are counted as hits and skipped: exact, and it
    keeps the C-level LRU loop short."""
    t_begin = time.perf_counter()
    machine = machine or Machine.of(target, wgs_per_cu=wgs_per_cu)
    timing = timing or Timing()
    keys, units, xcd, unit = _trace(op, mapping, machine, timing)
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
        seconds=time.perf_counter() - t_begin)
