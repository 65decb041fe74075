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


class TileWalk:
    """The output tiles a workgroup computes, out of `count`: one per workgroup (tile
    program_id(0)), or, persistent, a grid of fewer workgroups walking them (tiles pid,
    pid + grid, ...; pipelines run on from one tile to the next).

        walk = pk.tile_walk(TM * TN, persistent=True)
        for t in walk:                    # this workgroup's t-th tile (a pk.range loop)
            tile = walk.tile(t)           # its index in 0..count-1

    In a kernel launched in clusters (pk.cluster(n)), cluster=n walks `count` items of a
    whole cluster instead (each its workgroups' tiles together): every workgroup of a
    cluster gets the same items, cluster c the c-th (persistent: c, c + grid / n, ...)."""

    def __init__(self, count, persistent: bool, cluster: int = 1):
        self.persistent = bool(persistent)
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

    def share(self, i: int, n: int):
        """Every n-th of this workgroup's tiles, from its i-th (a pk.range loop over t =
        i, i + n, ...): consumer group i of n taking turns, as in a ping-pong schedule."""
        if not (isinstance(i, int) and isinstance(n, int) and 0 <= i < n):
            raise error(f"walk.share(i, n) takes Python ints 0 <= i < n, got {i!r}, {n!r}")
        return iter(ops.range(i, self.mine if self.persistent else 1, n))


def tile_walk(count, persistent: bool = True, cluster: int = 1) -> TileWalk:
    """See TileWalk."""
    return TileWalk(count, persistent, cluster)
