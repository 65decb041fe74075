"""Wave-scheduling primitives: HipKittens' 8-wave ping-pong and 4-wave interleave as reusable
constructs, plus the raw scheduling hints they are made of.

On CDNA these become `s_barrier`, `s_setprio`, `sched_barrier`, `sched_group_barrier` and
`s_waitcnt`; on Hopper priorities and scheduling hints have no counterpart and emit nothing
(the barriers stay), so one kernel source serves both.
"""
from __future__ import annotations

import contextlib

from ..targets import SCHED_CLASSES
from . import ops
from .trace import current, error
from .values import maximum, minimum, where


def _classes(kinds) -> tuple[str, ...] | int:
    """Instruction class names, checked here (the lowering turns them into the target's
    mask); an int is a raw mask, passed through."""
    if isinstance(kinds, int):
        return kinds
    if isinstance(kinds, str):
        kinds = [kinds]
    for k in kinds:
        if k not in SCHED_CLASSES:
            raise error(f"unknown instruction class {k!r}; choose from "
                        f"{', '.join(SCHED_CLASSES)}")
    return tuple(kinds)


def sched_barrier(allow="none") -> None:
    """No instruction moves across this point, except the classes in `allow`."""
    current().emit("sched_barrier", classes=_classes(allow))


def sched_group(kind, count: int, sync_id: int = 0) -> None:
    """Ask the scheduler for a group of `count` instructions of class `kind` here; groups with
    the same sync_id are ordered as written (llvm.amdgcn.sched.group.barrier)."""
    if count < 1:
        raise error("sched_group count must be >= 1")
    current().emit("sched_group", classes=_classes(kind), size=int(count), sync_id=int(sync_id))


def interleave(pattern, repeat: int = 1, sync_id: int = 0) -> None:
    """4-wave interleave: declare that the enclosing block's instructions issue as `pattern`
    (a list of (class, count), e.g. [("mfma", 1), ("ds_read", 2), ("vmem_read", 1)]) repeated
    `repeat` times. Call it at the end of the block (e.g. a pk.range body) it shapes."""
    if not pattern or repeat < 1:
        raise error("interleave needs a non-empty pattern and repeat >= 1")
    for _ in range(repeat):
        for kind, count in pattern:
            sched_group(kind, count, sync_id)


def waitcnt(vmcnt: int | None = None, lgkmcnt: int | None = None) -> None:
    """Wait until at most `vmcnt` global and `lgkmcnt` LDS/scalar memory operations of this
    wave are outstanding (s_waitcnt); None means do not wait on that counter."""
    for name, v in (("vmcnt", vmcnt), ("lgkmcnt", lgkmcnt)):
        if v is not None and not (isinstance(v, int) and v >= 0):
            raise error(f"waitcnt {name} must be a non-negative int or None")
    current().emit("waitcnt", vmcnt=vmcnt, lgkmcnt=lgkmcnt)


class PingPong:
    """8-wave ping-pong: two groups of waves one barrier phase apart, so that while one group
    runs its compute cluster (at raised priority) the other runs its memory cluster.

        with pk.pingpong() as pp:
            for k in pk.range(n):
                with pp.memory():   ...loads...
                with pp.compute():  ...mma...

    Group 1 passes one extra barrier before the loop and group 0 one after it, so both pass
    the same number of barriers (the emulator checks this). fence=True also puts a
    sched_barrier at each end of every cluster, so the compiler keeps a cluster's
    instructions between its barriers (HipKittens' sched_barrier(0))."""

    def __init__(self, priority: int = 1, fence: bool = False):
        tr = current()
        if tr.num_waves % 2:
            raise error(f"ping-pong needs an even number of waves (two groups); this kernel "
                        f"has num_waves={tr.num_waves}")
        self.group_size = tr.num_waves // 2
        self.priority, self.fence = priority, fence
        self.group = ops.wave_id() // self.group_size

    @contextlib.contextmanager
    def _fenced(self):
        if self.fence:
            sched_barrier()
        yield
        if self.fence:
            sched_barrier()

    @contextlib.contextmanager
    def memory(self):
        """Memory cluster: base priority, then a barrier hands the phase over."""
        with self._fenced():
            yield
        ops.barrier()

    @contextlib.contextmanager
    def compute(self):
        """Compute cluster: raised priority while it issues, then a barrier."""
        ops.setprio(self.priority)
        with self._fenced():
            yield
        ops.setprio(0)
        ops.barrier()


@contextlib.contextmanager
def pingpong(priority: int = 1, fence: bool = False):
    pp = PingPong(priority, fence)
    with ops.if_(pp.group == 1):
        ops.barrier()                       # group 1 starts one phase behind
    yield pp
    with ops.if_(pp.group == 0):
        ops.barrier()                       # re-align: group 0 passes the missing barrier


class Segment:
    """K steps k0 .. k1 - 1 of output tile `tile` (a walk's piece of work), the first of
    them the workgroup's `at`-th K step of its walk (where a pipeline's ring stands)."""

    def __init__(self, tile, k0, k1, at):
        self.tile, self.k0, self.k1, self.at = tile, k0, k1, at

    def steps(self):
        """The K steps (a pk.range loop)."""
        return iter(ops.range(self.k1) if _zero(self.k0) else ops.range(self.k0, self.k1))

    def ring(self, i):
        """The walk's position of K step i."""
        return self.at + i if _zero(self.k0) else self.at + (i - self.k0)


def _zero(v) -> bool:
    return isinstance(v, int) and v == 0


class TileWalk:
    """The output tiles a workgroup computes, out of `count`: one per workgroup (tile
    program_id(0)), or, persistent, a grid of fewer workgroups walking them (tiles pid,
    pid + grid, ...; pipelines run on from one tile to the next).

        walk = pk.tile_walk(TM * TN, persistent=True)
        for t in walk:                    # this workgroup's t-th tile (a pk.range loop)
            tile = walk.tile(t)           # its index in 0..count-1

    In a kernel launched in clusters (pk.cluster(n)), cluster=n walks `count` items of a
    whole cluster instead (each its workgroups' tiles together): every workgroup of a
    cluster gets the same items, cluster c the c-th (persistent: c, c + grid / n, ...).
    Given `steps` (K steps a tile), walk.segment(t) is tile t as a Segment, all its steps,
    as a StreamWalk gives its pieces: one pipeline serves both walks."""

    def __init__(self, count, persistent: bool, cluster: int = 1, steps=None):
        self.persistent, self.steps = bool(persistent), steps
        if self.persistent and isinstance(count, int) and count < 1:
            raise error(f"a persistent walk needs the number of tiles, not {count}")
        self.cluster = ops.kernel_cluster(cluster, "tile_walk")
        if self.persistent:
            self.grid, self.first = ops.num_programs(0), ops.program_id(0)
            if cluster > 1:
                self.grid, self.first = self.grid // cluster, self.first // cluster
            self.mine = (count - self.first + self.grid - 1) // self.grid

    def __iter__(self):
        # the pk.range generator itself, so its loop belongs to the caller's frame
        return iter(ops.range(self.mine)) if self.persistent else iter((0,))

    def tile(self, t):
        if self.persistent:
            return self.first + t * self.grid
        return ops.program_id(0) // self.cluster if self.cluster > 1 else ops.program_id(0)

    def segment(self, t) -> Segment:
        """Tile t's K steps, all of them (the walk's `steps` a tile)."""
        if self.steps is None:
            raise error("walk.segment needs the K steps a tile: pk.tile_walk(..., steps=)")
        return Segment(self.tile(t), 0, self.steps, t * self.steps)

    def share(self, i: int, n: int):
        """Every n-th of this workgroup's tiles, from its i-th (a pk.range loop over t =
        i, i + n, ...): consumer group i of n taking turns, as in a ping-pong schedule."""
        if not (isinstance(i, int) and isinstance(n, int) and 0 <= i < n):
            raise error(f"walk.share(i, n) takes Python ints 0 <= i < n, got {i!r}, {n!r}")
        return iter(ops.range(i, self.mine if self.persistent else 1, n))


def tile_walk(count, persistent: bool = True, cluster: int = 1, steps=None) -> TileWalk:
    """See TileWalk."""
    return TileWalk(count, persistent, cluster, steps)


def _split(count, grid, steps):
    """(tiles taken whole, tiles split, workgroups sharing their steps, most lenders a
    split tile has) of a stream walk: traced or Python ints alike (the kernel's walk and
    the host's sizing agree). Where the split steps are fewer than the workgroups, only
    as many take one each."""
    rem = count % grid
    split = where(rem == 0, 0, where(count >= grid, rem + grid, count))
    runners = maximum(minimum(grid, split * steps), 1)
    run = split * steps // runners                   # the shortest run (0: nothing split)
    return (count - split, split, runners,
            where(split > 0, (steps + maximum(run, 1) - 1) // maximum(run, 1), 0))


class StreamWalk:
    """A persistent walk over `count` output tiles of `steps` K steps each that gives every
    workgroup the same number of K steps (stream-K): tiles go round-robin, whole, as in a
    persistent TileWalk, except the last ones where the grid does not divide them — the
    last `count % grid + grid`, or all of them where they are fewer than the workgroups —
    whose K steps are shared out evenly, one contiguous run per workgroup. The workgroup
    whose run holds a split tile's first step owns it (k0 = 0); each one whose run starts
    inside it lends (k0 > 0): it leaves its partial sum for the owner (e.g. in memory,
    then a pk.signal), which adds them in order and stores the tile. After whole rounds a
    run covers more than a tile, so a split tile has one lender; fewer tiles than
    workgroups (a skinny product, split-K) give a tile several. Without the split a grid
    of G workgroups over T tiles takes ceil(T / G) rounds where T / G would do.

        walk = pk.stream_walk(TM * TN, steps)
        for t in walk:                    # this workgroup's t-th piece (a pk.range loop)
            seg = walk.segment(t)         # seg.tile, K steps seg.k0 .. seg.k1 - 1, seg.at

    A workgroup lends only its first piece and owns only its last: an owner waits for
    workgroups after it, which lent at the start of their runs, so owners do not wait long
    and the last workgroup never waits. Lender j of a split tile (j = 1, 2, ...) meets its
    owner at slot(seg, j - 1); lend_slot(seg) is the lender's own."""

    def __init__(self, count: int, steps):
        if not isinstance(count, int) or count < 1:
            raise error(f"a stream walk needs the number of tiles as a Python int, not "
                        f"{count!r}")
        self.steps = steps
        self.grid, self.first = ops.num_programs(0), ops.program_id(0)
        grid = self.grid
        self.whole, split, self.runners, self.most = _split(count, grid, steps)
        self.rounds = (self.whole - self.first + grid - 1) // grid
        self.shared = split * steps                              # K steps shared out
        self.base = self.whole * steps
        # this workgroup's run (none past the runners)
        runner = minimum(self.first, self.runners)
        self.g0 = self.base + runner * self.shared // self.runners
        self.g1 = self.base + minimum(runner + 1, self.runners) * self.shared // self.runners
        pieces = where(self.g1 > self.g0, (self.g1 - 1) // steps - self.g0 // steps + 1, 0)
        self.mine = self.rounds + pieces

    def __iter__(self):
        return iter(ops.range(self.mine))

    def segment(self, t) -> Segment:
        steps, whole = self.steps, t < self.rounds
        tile = self.g0 // steps + t - self.rounds
        start = maximum(self.g0, tile * steps)
        end = minimum(self.g1, tile * steps + steps)
        return Segment(where(whole, self.first + t * self.grid, tile),
                       where(whole, 0, start - tile * steps),
                       where(whole, steps, end - tile * steps),
                       where(whole, t * steps, self.rounds * steps + start - self.g0))

    def lends(self, seg: Segment):
        """Whether `seg` is a split tile's later steps, whose sum its owner adds."""
        return seg.k0 > 0

    def owns_split(self, seg: Segment):
        """Whether `seg` is a split tile's first steps (its owner's)."""
        return (seg.k0 == 0) & (seg.k1 < self.steps)

    def _runner(self, x):
        """The workgroup whose run holds shared step x (0 .. shared - 1)."""
        return ((x + 1) * self.runners - 1) // self.shared

    def lenders(self, seg: Segment):
        """How many workgroups lend to the split tile `seg` begins."""
        x0 = seg.tile * self.steps - self.base
        return self._runner(x0 + self.steps - 1) - self._runner(x0)

    def slot(self, seg: Segment, j):
        """Where the j-th lender (from 0) of seg's tile meets its owner: 0 .. slots - 1."""
        return (seg.tile - self.whole) * self.most + j

    def lend_slot(self, seg: Segment):
        """slot() of this workgroup's lent piece `seg`."""
        return self.slot(seg, self.first - self._runner(seg.tile * self.steps - self.base)
                         - 1)

    @staticmethod
    def slots(count: int, grid: int, steps: int) -> int:
        """How many lenders' slots a stream walk of `count` tiles of `steps` K steps over
        `grid` workgroups needs (0: nothing is split)."""
        _, split, _, most = _split(count, grid, steps)
        return int(split * most)


def stream_walk(count: int, steps) -> StreamWalk:
    """See StreamWalk."""
    return StreamWalk(count, steps)
