"""Point-to-point synchronisation and warp roles (Hopper's building blocks for
warp-specialised, producer/consumer kernels).

    full = pk.mbarrier(arrivals=4)          # completes a phase when 4 waves arrived
    with pk.role(first_wave=0, num_waves=4, regs=40):     # producers: fewer registers
        ...write a shared tile...; pk.arrive(full)
    with pk.role(first_wave=4, num_waves=4, regs=232):    # consumers: more registers
        pk.wait(full, phase); ...read it...

A wave's arrive publishes its earlier shared-memory writes to the waves that then wait on
that phase; the emulator checks this ordering (a read without it is a race) and reports a
wait that can never complete as a deadlock.
"""
from __future__ import annotations

import contextlib

from ..ir import types as T
from ..ir.nodes import Block
from . import ops
from .trace import current, error, new_value
from .values import Scalar, Tile, as_index


class MBarrier(Tile):
    """An mbarrier in shared memory."""


def mbarrier(arrivals: int, count: int | None = None) -> MBarrier:
    """A barrier whose phase completes after `arrivals` arrivals (pk.arrive calls and
    pk.tma_load issues, one each; a wave may arrive several times). Allocate at the top of
    the kernel (like shared tiles); it starts in phase 0. count=n makes n of them, indexed
    by a runtime value (`bars[k % n]`) like stages of shared tiles."""
    if not isinstance(arrivals, int) or arrivals < 1:
        raise error("mbarrier arrivals must be a positive int (a number of waves)")
    if len(current().blocks) > 1:
        raise error("mbarriers must be allocated at the top of the kernel, outside loops "
                    "and branches")
    if count is not None:
        return ops._stages(T.MBarrierType(arrivals), count, MBarrier)
    v = new_value(T.MBarrierType(arrivals))
    current().emit("alloc", v)
    return MBarrier(v)


def _need_bar(bar, what):
    if not isinstance(bar, MBarrier):
        raise error(f"{what} takes a pk.mbarrier, got {type(bar).__name__}")


def arrive(bar: MBarrier, cta=None) -> None:
    """This wave arrives on `bar` (once per call), releasing its earlier writes.
    cta=r (a kernel in clusters, pk.cluster): on workgroup r's `bar` instead (the same
    barrier in the cluster's workgroup of rank r, this one's own included), releasing this
    wave's writes and reads to the waves that wait on it there."""
    _need_bar(bar, "pk.arrive")
    if cta is None:
        current().emit("arrive", None, (bar.v,))
        return
    _need_cluster("pk.arrive(cta=...)")
    current().emit("arrive", None, (bar.v, as_index(cta, "pk.arrive cta=").v), remote=True)


def _need_cluster(what):
    if current().cluster < 2:
        raise error(f"{what} reaches another workgroup of the cluster: launch the kernel in "
                    "clusters first (pk.cluster(n) at its top)")


def cluster_sync() -> None:
    """Cluster barrier (pk.cluster): every wave of every workgroup of the cluster must reach
    it; what each wrote before, shared memory and mbarrier initialisations included, is
    then visible to all. Call it once every workgroup has set up the barriers the others
    will arrive on or copy into (before the first pk.tma_load(multicast=True) or
    pk.arrive(cta=...)), and before a workgroup ends while the others may still reach its
    shared memory."""
    _need_cluster("pk.cluster_sync()")
    current().emit("cluster_sync")


def wait(bar: MBarrier, parity) -> None:
    """Block until the phase of `bar` with parity `parity` (0 or 1; e.g. k % 2 in a loop)
    has completed; the writes its arrivals released are then visible."""
    _need_bar(bar, "pk.wait")
    if isinstance(parity, int) and parity not in (0, 1):
        raise error("wait parity is 0 or 1 (the phase number modulo 2)")
    current().emit("wait", None, (bar.v, as_index(parity, "a wait parity").v))


def tma_load(dst, src, coord, bar: MBarrier, rows: int | None = None, at=0,
             multicast: bool = False) -> None:
    """Hopper bulk tensor copy (TMA): the shared tile `dst` <- the box of tensor `src` at
    element `coord`, asynchronously; elements outside the tensor read as 0. The box is the
    whole tile, or `rows` full-width rows landing at row `at` of it (a runtime value is
    fine), so one tile can collect many boxes. The calling wave issues it and arrives on
    `bar` expecting its bytes: the phase completes once the data has landed (and the
    barrier's other arrivals came), so consumers pk.wait(bar, ...) before reading `dst`.

    multicast=True (a kernel in clusters of n, pk.cluster): the box lands in `dst` of every
    workgroup of the cluster, each copy completing bytes on that workgroup's `bar`. Every
    workgroup issues one such copy of the same size (its own part of a block they all read,
    e.g. `at=` rank x rows), so the calling wave's arrival on its own `bar` expects n boxes:
    its part and the n - 1 the others send it. A workgroup may refill `dst` only once every
    workgroup of the cluster has done reading it (e.g. an empty barrier that the readers
    of all of them arrive on, pk.arrive(bar, cta=r))."""
    from .values import GL, ST
    if multicast:
        _need_cluster("pk.tma_load(multicast=True)")
    _need_bar(bar, "pk.tma_load")
    if not isinstance(dst, ST) or not isinstance(src, GL):
        raise error("pk.tma_load copies a global tensor (a kernel parameter) into a shared "
                    "tile (pk.st)")
    t = _check_tma("tma_load", src, dst, "destination")
    box_rows = t.shape[0] if rows is None else rows
    if not isinstance(box_rows, int) or not 1 <= box_rows <= min(t.shape[0], 256):
        raise error(f"tma_load rows= must be an int in 1..{min(t.shape[0], 256)}")
    if t.swizzle and box_rows % 8:
        raise error("a 128B-swizzled TMA box covers whole 8-row swizzle atoms: rows % 8 == 0")
    c = ops._coords(coord, src.rank, "tma_load")
    current().emit("tma_load", dst.v, (src.v,) + c + (bar.v, as_index(at, "tma_load at=").v),
                   rows=box_rows, multicast=bool(multicast))


def tma_store(dst, src, coord, add: bool = False, wait: bool = True) -> None:
    """Hopper bulk tensor copy (TMA) the other way: tensor `dst` at element `coord` <- the
    whole shared tile `src`; elements outside the tensor are not written. With add=True the
    tile is added into the tensor instead (the TMA unit's reduction at L2: concurrent adds
    from many workgroups are each applied once, in no fixed order). The calling wave
    issues it once every wave's writes to `src` are ordered before it (a pk.barrier()), and
    waits until the copy has read `src`, so the tile can be reused right after.

    wait=False: the wave goes on at once; the copy may read `src` until this wave's next
    pk.tma_store_wait(), and no wave may write `src` before that (the emulator reports a
    write in between as a race, and a wave that ends without waiting)."""
    from .values import GL, ST
    if not isinstance(src, ST) or not isinstance(dst, GL):
        raise error("pk.tma_store copies a shared tile (pk.st) into a global tensor")
    t = _check_tma("tma_store", dst, src, "source")
    if t.shape[0] > 256:                     # the box is the whole tile
        raise error("a TMA box has at most 256 elements per dim")
    if add and t.dtype.name not in ("f32", "f16", "bf16"):
        raise error(f"pk.tma_store(add=True) adds f32, f16 or bf16 tiles, not {t.dtype}")
    c = ops._coords(coord, dst.rank, "tma_store")
    current().emit("tma_store", dst.v, (src.v,) + c, add=bool(add), wait=bool(wait))


def tma_store_wait(pending: int = 0) -> None:
    """Wait until every pk.tma_store(wait=False) this wave issued, but the last `pending`,
    has read its shared tile (their writes to global memory may still be under way), so
    those tiles can be written again; arrive on an mbarrier afterwards to let other waves
    know. A wave writing its own tiles in turn waits with pending = tiles - 1."""
    if not (isinstance(pending, int) and 0 <= pending <= 7):
        raise error(f"tma_store_wait pending= is an int from 0 to 7, not {pending!r}")
    current().emit("tma_store_wait", None, (), pending=pending)


def _check_tma(name, gl, st, side):
    """What every TMA box needs: a tensor of rank 2 to 5 (the box covers its last two dims,
    one element of the others), one element type on both sides, rows of a multiple of 16
    bytes and at most 256 elements, and no swizzle or the hardware's 128B one (swizzle=8
    with rows of 128 bytes, or a multiple: one box per 128-byte column block). Returns the
    shared tile's type."""
    if gl.view:
        raise error(f"pk.{name} needs a tensor map made at launch for one tensor, not a "
                    "rank picked at run time (x.local / x.peer(r)): pass the tensor as a "
                    "pk.gl argument of its own (the same tensor may also be in a pk.Peers)")
    if not 2 <= gl.rank <= 5:
        raise error(f"pk.{name} takes a tensor of rank 2 to 5, not {gl.rank}")
    if gl.dtype != st.dtype:
        raise error(f"TMA copies bytes: the shared tile must be {gl.dtype}, not {st.dtype}")
    t = st.type
    row = t.shape[1] * t.dtype.bytes
    if t.swizzle not in (0, 8) or (t.swizzle == 8 and row % 128):
        raise error(f"a TMA {side} is unswizzled, or swizzle=8 with rows of a multiple of "
                    "128 bytes (the hardware's 128B pattern)")
    if row % 16 or (t.shape[1] > 256 and t.atoms == 1):
        raise error("a TMA box has rows of a multiple of 16 bytes and at most 256 elements")
    return t


def _flag(name, flags, index, value):
    """Operands of a flag op: an i32 tensor, one index per dim, an i32 value."""
    from .values import GL, PeerTensors
    if isinstance(flags, PeerTensors):
        raise error(f"pk.{name}: {flags.name} holds one tensor per rank; pick one with "
                    f"{flags.name}.local or {flags.name}.peer(r)")
    if not isinstance(flags, GL):
        raise error(f"pk.{name} takes a flag tensor (a pk.gl[pk.i32, ...] or one rank's "
                    "tensor of a pk.peers), not " + type(flags).__name__)
    if flags.dtype != T.i32:
        raise error(f"pk.{name}: flags are i32 tensors, {flags.name} holds {flags.dtype}")
    index = index if isinstance(index, tuple) else (index,)
    if len(index) != flags.rank:
        raise error(f"pk.{name} needs {flags.rank} indices into {flags.name} (one per dim), "
                    f"got {len(index)}")
    idx = tuple(as_index(i, f"an index of {flags.name}").v for i in index)
    return (flags.v, *idx, as_index(value, f"a pk.{name} value").v)


SCOPES = ("system", "gpu")       # who a flag publishes to: other GPUs too, or this one's


def _scope(name, scope):
    if scope not in SCOPES:
        raise error(f"pk.{name} scope is one of {', '.join(map(repr, SCOPES))}, not "
                    f"{scope!r}")
    return scope


def signal(flags, index, value, *, add: bool = False, scope: str = "system") -> None:
    """Publish to other workgroups and GPUs: flags[index] = value (add=True: += value,
    atomically), written by one lane of the calling wave with release semantics at system
    scope, so whoever sees the new value with pk.wait_flag also sees everything this wave
    wrote before, and what it saw of others (a pk.barrier() first brings in the other
    waves' writes). `flags` is an i32 tensor, local or a peer's (`f.peer(r)`).
    scope="gpu": for workgroups of this GPU only (a cheaper release: no write reaches
    past the GPU's own memory)."""
    current().emit("signal", None, _flag("signal", flags, index, value), add=bool(add),
                   scope=_scope("signal", scope))


TIMESTAMP_WORDS = 4      # a pk.timestamp record: timer low, timer high, unit, chiplet


def timestamp(record, index) -> None:
    """Record when and where the calling wave is: one lane writes row `index` of `record`
    (a pk.gl[pk.i32, (None, 4)]) — the GPU's timer as two words (low, high: a 64-bit
    count), the compute unit it runs on, and its chiplet. Hopper: %globaltimer
    (nanoseconds), %smid, 0; CDNA: s_memrealtime (the constant 100 MHz clock), the HW_ID
    register (CU_ID in bits 8-11; the ISA guide gives its other fields), XCC_ID. The emulator
    writes the number of timestamps taken before this one in its run (an order, not a
    time), the workgroup's compute unit under round-robin dispatch, and its XCD (0 on
    Hopper). A row outside `record` writes nothing. For timelines of a kernel's
    workgroups: when each started, waited and ended, and on which SM."""
    from .values import GL
    if not isinstance(record, GL) or record.view:
        raise error("pk.timestamp takes a record tensor (a pk.gl[pk.i32, (None, 4)] "
                    "argument), not " + type(record).__name__)
    if record.dtype != T.i32 or record.rank != 2 or \
            record.type.shape[1] != TIMESTAMP_WORDS:
        raise error(f"pk.timestamp: {record.name} must be declared pk.gl[pk.i32, (None, "
                    f"{TIMESTAMP_WORDS})] (a row of {TIMESTAMP_WORDS} words a timestamp), "
                    f"not {record.type}")
    current().emit("timestamp", None, (record.v, as_index(index, "a pk.timestamp row").v))


def wait_flag(flags, index, value, *, tma: bool = True, scope: str = "system") -> None:
    """Wait until flags[index] >= value (acquire, system scope): afterwards the calling
    wave sees everything the signals that raised it published. Flags only grow: count
    calls (an epoch) rather than resetting them. Every wave that reads the published data
    waits itself, or is ordered after a wave that did (pk.barrier, an mbarrier).
    tma=True: TMA copies the wave issues next may read that data (on Hopper a proxy fence
    follows the wait); tma=False saves the fence where only ordinary loads read it.
    scope="gpu": an acquire for signals of this GPU's workgroups only (pk.signal's)."""
    current().emit("flag_wait", None, _flag("wait_flag", flags, index, value),
                   tma=bool(tma), scope=_scope("wait_flag", scope))


@contextlib.contextmanager
def role(first_wave: int, num_waves: int, regs: int | None = None):
    """`with pk.role(first_wave, num_waves, regs=None):` — a body only waves
    [first_wave, first_wave + num_waves) run. On Hopper whole warpgroups (4 waves) take a
    role and `regs` sets their register budget (setmaxnreg: producers give registers to
    consumers); elsewhere `regs` is ignored. A role written right after roles of other
    waves becomes the else branch of theirs: values computed before the roles then stay
    live only in the branches that use them (not through a producer's small budget)."""
    tr = current()
    if not (isinstance(first_wave, int) and isinstance(num_waves, int) and num_waves >= 1
            and 0 <= first_wave and first_wave + num_waves <= tr.num_waves):
        raise error(f"role waves [{first_wave}, {first_wave}+{num_waves}) must lie in the "
                    f"workgroup's {tr.num_waves} waves")
    if regs is not None and (not isinstance(regs, int) or regs % 8 or not 24 <= regs <= 256):
        raise error("role regs must be a multiple of 8 in 24..256 (setmaxnreg)")
    waves = set(range(first_wave, first_wave + num_waves))
    chain = _role_chain(tr.blocks[-1], waves)
    if chain is not None:                      # the else branch of the roles before it
        chain.regions.append(Block())
        tr.blocks.append(chain.regions[-1])
    try:
        w = ops.wave_id()
        inside = (w >= first_wave) & (w < first_wave + num_waves)
        with ops.if_(inside):
            tr.blocks[-2].ops[-1].attrs["role_waves"] = waves | (
                chain.attrs["role_waves"] if chain is not None else set())
            if regs is not None:
                tr.emit("setmaxnreg", regs=regs, first_wave=first_wave, num_waves=num_waves)
            yield
    finally:
        if chain is not None:
            tr.blocks.pop()


def _role_chain(block, waves):
    """The innermost role branch without an else that ends `block`, if its roles' waves
    are disjoint from `waves` (then the new role may be its else branch)."""
    op = block.ops[-1] if block.ops else None
    while op is not None and op.kind == "if" and "role_waves" in op.attrs:
        if op.attrs["role_waves"] & waves:
            return None
        if len(op.regions) == 1:
            return op
        inner = op.regions[1].ops
        op = inner[-1] if inner else None
    return None
