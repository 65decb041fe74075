"""Checks of a traced kernel against a target: element types, LDS, registers, pins, sizes.
Errors carry the user's line (the op that allocated the offending tile)."""
from __future__ import annotations

from .errors import KernelError, NotSupportedYet
from .nodes import Block, KernelIR, walk
from .types import (GlobalType, MBarrierType, RegTileType, RegVecType, ScalarType,
                    SharedTileType, StagesType)


def _regs_per_lane(t, wave: int) -> int:
    """32-bit registers a lane needs for one register tile or vector (packed sub-dword)."""
    if isinstance(t, RegVecType):
        return max(1, -(-t.length // wave))
    elems = t.shape[0] * t.shape[1] // wave
    return max(1, -(-elems * t.dtype.bits // 32))


def _dtype_ok(target, d, loc, kname, what):
    if d.name in ("i1",):
        return
    if d.name not in target.dtypes:
        hint = ""
        if d.name == "e8m0":
            hint = " (E8M0 block scales feed the MX matrix instructions of gfx950)"
        elif d.is_fp8:
            hint = (" (gfx942 uses the FNUZ fp8 flavours e4m3fnuz/e5m2fnuz; gfx950 and sm_90a "
                    "use OCP e4m3/e5m2)")
        raise KernelError(f"{what} element type {d} is not supported on {target.name}{hint}",
                          loc, kname)


def _hopper_only(k: KernelIR, target) -> None:
    """A Hopper feature (mbarriers, TMA, wgmma) on a CDNA target is reported first, at its
    line, before the budgets those kernels are sized for (shared memory) fail instead.
    The messages are the lowering's own."""
    if target.family == "hopper":
        return
    tn = target.name
    if k.cluster > 1:
        raise NotSupportedYet(f"workgroup clusters (pk.cluster) are a Hopper feature; {tn} "
                              "launches workgroups on their own", k.loc, k.name)
    for op in walk(k.body):
        t = op.dst.type if op.dst is not None else None
        if op.kind == "alloc" and isinstance(getattr(t, "of", t), MBarrierType):
            what = f"mbarriers are a Hopper feature; on {tn} synchronise waves with pk.barrier()"
        elif op.kind == "tma_load":
            what = (f"TMA is a Hopper feature; on {tn} use pk.load (direct=True copies memory "
                    "straight into LDS on CDNA)")
        elif op.kind in ("tma_store", "tma_store_wait"):
            what = f"TMA is a Hopper feature; on {tn} use pk.store"
        elif op.kind == "mma" and len(op.srcs) > 1 and isinstance(op.srcs[1].type,
                                                                  SharedTileType):
            what = (f"mma with b in shared memory is Hopper's wgmma form; on {tn} load b into "
                    "a register tile (role='b')")
        elif op.kind == "mma_wait":
            what = (f"pk.mma_wait waits for Hopper's asynchronous wgmma groups; {tn}'s matrix "
                    "instructions complete in order")
        else:
            continue
        raise NotSupportedYet(what, op.loc, k.name)


def verify(k: KernelIR, target) -> dict:
    """Raise KernelError on the first problem; return resource facts (lds_bytes, reg estimate)."""
    kn = k.name
    if k.target is not None and k.target != target.name:
        raise KernelError(f"this kernel was traced for target {k.target!r} (its pk.target "
                          f"constant) but is being compiled for {target.name!r}; specialize "
                          f"it for the target it is compiled for (Kernel.specialize_for)",
                          k.loc, kn)
    _hopper_only(k, target)
    if k.num_waves > target.max_waves_per_workgroup:
        raise KernelError(f"num_waves={k.num_waves} exceeds {target.name}'s limit of "
                          f"{target.max_waves_per_workgroup} waves per workgroup", k.loc, kn)
    for p in k.params:
        if isinstance(p.type, (GlobalType, ScalarType)):
            _dtype_ok(target, p.type.dtype, k.loc, kn, f"parameter {p.name!r}")
    lds = 0
    pins: list[tuple] = []
    for op in walk(k.body):
        if op.kind != "alloc":
            continue
        t = op.dst.type
        count = 1
        if isinstance(t, StagesType):
            t, count = t.of, t.count
        if isinstance(t, MBarrierType):
            continue
        _dtype_ok(target, t.dtype, op.loc, kn, "tile")
        if isinstance(t, SharedTileType):
            lds += t.nbytes * count
            if lds > target.lds_bytes_per_workgroup:
                raise KernelError(
                    f"shared tiles need {lds} bytes of LDS/shared memory but {target.name} "
                    f"has {target.lds_bytes_per_workgroup} per workgroup; use smaller tiles or "
                    "fewer pipeline stages", op.loc, kn)
        elif isinstance(t, RegTileType):
            n = t.shape[0] * t.shape[1]
            if n % target.wave_size:
                raise KernelError(
                    f"register tile {t.shape} has {n} elements, not a multiple of the "
                    f"{target.wave_size} lanes of a {target.name} wave", op.loc, kn)
            if t.pin is not None:
                pins.append((t, op.loc))
    _check_pins(pins, target, kn)
    regs = _peak_registers(k.body, target.wave_size)
    budget = target.vgprs + target.agprs
    if regs > budget:
        raise KernelError(f"register tiles need about {regs} 32-bit registers per lane at "
                          f"their peak, over {target.name}'s {budget}; use smaller tiles or "
                          "more waves", k.loc, kn)
    return {"lds_bytes": lds, "tile_registers": regs}


def _check_pins(pins, target, kn):
    files = {"v": target.vgprs, "a": target.agprs}
    taken: list[tuple] = []
    for t, loc in pins:
        if target.family != "cdna":
            raise KernelError(f"register pinning is a CDNA feature; on {target.name} budget "
                              "registers per warpgroup with pk.role(..., regs=N) (setmaxnreg)",
                              loc, kn)
        f, first = t.pin
        n = _regs_per_lane(t, target.wave_size)
        if files.get(f, 0) == 0:
            raise KernelError(f"{target.name} has no '{f}' registers to pin to", loc, kn)
        free = target.min_free_vgprs
        if f == "v" and first < free:
            raise KernelError(f"pinned tile {t} starts at v{first}: keep v0..v"
                              f"{free - 1} for the compiler's own values (addresses, "
                              f"counters) and pin VGPR tiles at v{free} or above",
                              loc, kn)
        if first + n > files[f]:
            raise KernelError(f"pinned tile {t} needs {f}{first}..{f}{first + n - 1} but "
                              f"{target.name} has only {f}0..{f}{files[f] - 1}", loc, kn)
        for (f2, a2, b2, loc2) in taken:
            if f2 == f and first < b2 and a2 < first + n:
                raise KernelError(f"pinned tile {t} ({f}{first}..{f}{first + n - 1}) overlaps "
                                  f"the tile pinned at line {loc2.line if loc2 else '?'} "
                                  f"({f}{a2}..{f}{b2 - 1})", loc, kn)
        taken.append((f, first, first + n, loc))


# Ops that write their whole destination without reading it first (so the tile is dead
# just before them); an mma does too when it starts from zero (c=0).
_KILLS = {"alloc", "fill", "copy", "convert", "unary", "binary", "select", "fma", "index",
          "load", "subtile", "xor_cols", "lane_id", "wg_reduce", "cluster_reduce"}


def _reads(op):
    """Register tiles an op reads: its operands, and its destination where it updates it in
    place (mma accumulating, reductions into=, elementwise ops on their own destination)."""
    out = [v for v in op.srcs if isinstance(v.type, (RegTileType, RegVecType))]
    d = op.dst
    if d is not None and isinstance(d.type, (RegTileType, RegVecType)):
        if op.kind == "mma" and not op.attrs.get("zero") or \
                op.kind == "reduce" and op.attrs.get("accumulate") or \
                op.kind not in _KILLS and op.kind != "mma" and op.kind != "reduce":
            out.append(d)
    return out


def _peak_registers(body: Block, wave: int) -> int:
    """Peak, over program points, of the registers of the tiles live there (read later
    before being wholly rewritten), by backward liveness over the structured IR (loops to
    a fixed point), plus the tile an op produces. Index tiles (lane id plus constants) and
    elementwise temporaries read once by another elementwise op are free: the code generator
    folds them into their uses."""
    ops = [op for op in walk(body)]
    uses: dict = {}
    for op in ops:
        for v in op.srcs:
            uses.setdefault(v, []).append(op)
    elementwise = ("unary", "binary", "select", "index", "fma")
    free = {op.dst for op in ops if op.kind == "index"}
    for op in ops:
        u = uses.get(op.dst, [])
        if op.kind in elementwise and len(u) == 1 and u[0].kind in elementwise:
            free.add(op.dst)

    def regs(vals):
        return sum(_regs_per_lane(v.type, wave) for v in vals if v not in free)

    peak = 0

    def block(blk: Block, live: set) -> set:
        """live-in of `blk` given its live-out; records the peak inside it."""
        nonlocal peak
        for op in reversed(blk.ops):
            if op.kind == "for":
                body_live = set(live)
                for _ in range(3):                 # carried values reach the body's top
                    body_live = block(op.regions[0], live | body_live)
                live = live | body_live
            elif op.kind == "if":
                outs = [block(r, set(live)) for r in op.regions]
                live = set().union(*outs) | (live if len(op.regions) < 2 else set())
            d = op.dst if op.dst is not None and \
                isinstance(op.dst.type, (RegTileType, RegVecType)) else None
            peak = max(peak, regs(live | ({d} if d is not None else set())))
            if d is not None and op.kind in _KILLS and op.kind != "mma" or \
                    op.kind == "mma" and op.attrs.get("zero"):
                live = live - {d}
            live = live | set(_reads(op))
            peak = max(peak, regs(live))
        return live

    block(body, set())
    return peak
