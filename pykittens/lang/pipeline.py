"""Producer/consumer pipelines: a ring of shared stages with the full/empty mbarriers and
phase arithmetic that hand each stage from the waves that fill it to the waves that read it,
so a kernel states only its algorithm.

    ring = pk.Ring(4, fill=2, drain=4, k=pk.st((64, 64), pk.bf16, swizzle=8),
                   v=pk.st((64, 64), pk.bf16, swizzle=8))
    # producer, step j:                      # consumers, step j:
    s = ring.acquire(j)                      s = ring.wait(j)
    pk.tma_load(s.k, k, (j * 64, 0), s.full) ...read s.k, s.v...
    pk.tma_load(s.v, v, (j * 64, 0), s.full) ring.release(j)

Step j uses stage j % stages. Its `full` barrier completes once `fill` arrivals came (TMA
copies arrive by themselves; waves that store with ordinary stores pk.arrive(s.full)); its
`empty` barrier once `drain` consumer waves released it, after which step j + stages may
refill it. The parities follow from j: a stage's full phase for step j is j // stages.

In a kernel launched in clusters (pk.cluster(n)), `cluster=n` makes a ring whose stages
the cluster's workgroups fill together (pk.tma_load(..., multicast=True) lands a part in
all of them): a consumer's release goes to the stage's empty barrier in every workgroup
of the cluster, so no workgroup refills a stage that another is still reading.
"""
from __future__ import annotations

from types import SimpleNamespace

from ..ir import types as T
from . import ops
from .sync import arrive, mbarrier, tma_store, wait
from .trace import error


class Ring:
    def __init__(self, stages: int, *, fill: int, drain: int, cluster: int = 1, **tiles):
        """`stages` stages, each holding one shared tile per keyword (a pk.st type, or a
        list of them: the stage then holds a list), `fill` arrivals completing a stage's
        full barrier (this workgroup's own: a multicast copy is one) and `drain` arrivals
        (consumer waves of one workgroup) its empty barrier; `cluster`: the workgroups of
        the kernel's cluster filling it together (1: this one alone)."""
        if not isinstance(stages, int) or stages < 1:
            raise error("a ring needs a positive int number of stages")
        self.cluster = ops.kernel_cluster(cluster, "Ring")
        if not tiles:
            raise error("a ring holds at least one shared tile per stage: pk.Ring(n, "
                        "fill=..., drain=..., name=pk.st(...))")
        self.stages = stages
        self._tiles = {}
        for name, t in tiles.items():
            many = isinstance(t, (list, tuple))
            for x in (t if many else [t]):
                if not isinstance(x, T.SharedTileType):
                    raise error(f"ring tile {name!r} must be a shared tile type (pk.st), "
                                f"not {x!r}")
            self._tiles[name] = [ops.empty(x, count=stages) for x in t] if many else \
                ops.empty(t, count=stages)
        self.full = mbarrier(fill, count=stages)
        self.empty = mbarrier(drain * cluster, count=stages)

    def stage(self, step) -> SimpleNamespace:
        """The tiles and barriers of the stage that `step` uses (stage step % stages)."""
        s = step % self.stages
        out = {n: [x[s] for x in t] if isinstance(t, list) else t[s]
               for n, t in self._tiles.items()}
        return SimpleNamespace(**out, full=self.full[s], empty=self.empty[s], index=s)

    def acquire(self, step) -> SimpleNamespace:
        """Producer: wait until the stage of `step` is free (its previous use, step -
        stages, was released), then return it to fill."""
        st = self.stage(step)
        if isinstance(step, int):                  # a step known at trace time
            if step >= self.stages:
                wait(st.empty, (step // self.stages + 1) % 2)
            return st
        with ops.if_(step >= self.stages):
            wait(st.empty, (step // self.stages + 1) % 2)
        return st

    def wait(self, step) -> SimpleNamespace:
        """Consumer: wait until the stage of `step` is full, then return it to read."""
        st = self.stage(step)
        wait(st.full, (step // self.stages) % 2)
        return st

    def release(self, step) -> None:
        """Consumer: this wave is done with the stage of `step` (its reads have retired:
        an mma left in flight on it must be waited for first); in a cluster ring, done
        with every workgroup's copy of it."""
        bar = self.empty[step % self.stages]
        if self.cluster == 1:
            arrive(bar)
            return
        for r in range(self.cluster):
            arrive(bar, cta=r)


class StagedStore:
    """A group of `waves` waves storing register tiles to global memory through one shared
    tile and the TMA unit (Hopper): each wave writes its rows into the tile (stmatrix for
    16-bit data), the group's first wave waits for all of them and has the TMA unit copy the
    tile out. The next use waits until that copy has read the tile, so a persistent kernel
    stores block t while the others go on. The tile is 128B-swizzled where its rows allow.

        out = pk.StagedStore((64, 256), pk.bf16)          # at the top of the kernel
        out.store(c, acc, (m0, n0), use=t)                 # every wave of the group
    """

    def __init__(self, shape, dtype, waves: int = 4, tile=None):
        """`tile`: a shared tile of that shape and type to stage through (e.g. one whose
        contents are no longer needed when the stores begin) instead of a new one."""
        d = T.dtype_of(dtype)
        swizzle = 8 if shape[1] * d.bytes % 128 == 0 else 0
        if tile is not None and (tuple(tile.shape) != tuple(shape) or tile.dtype != d):
            raise error(f"StagedStore(tile=...) must be a {tuple(shape)} {d} shared tile, "
                        f"not {tile.type}")
        self.tile = tile if tile is not None else ops.empty(ops.st(shape, d, swizzle=swizzle))
        self.waves = waves
        self.stored = mbarrier(waves)            # every wave of the group wrote its rows
        self.drained = mbarrier(1)               # the TMA copy has read the tile

    def store(self, dst, tile, coord, use=0, add: bool = False) -> None:
        """Store this wave's register `tile` (its rows of the group's block) to `dst` at
        `coord` (the block's origin), `use` counting the calls (0, 1, ...: phases); with
        add=True the block is added into `dst` (pk.tma_store's reduction)."""
        rows = tile.shape[0]
        w = ops.wave_id() % self.waves
        if not isinstance(use, int):
            with ops.if_(use > 0):
                wait(self.drained, (use - 1) % 2)
        elif use > 0:
            wait(self.drained, (use - 1) % 2)
        ops.store(self.tile, tile.cast(self.tile.dtype) if tile.dtype != self.tile.dtype
                  else tile, (w * rows, 0))
        arrive(self.stored)
        with ops.if_(w == 0):
            wait(self.stored, use % 2)
            tma_store(dst, self.tile, coord, add=add)
            arrive(self.drained)
