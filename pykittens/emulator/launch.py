"""`pk.emulate`: trace, lower and run a kernel on the CPU for a target."""
from __future__ import annotations

import os

import numpy as np

from ..lang.kernel import Peers, peer_members
from ..lower import lower
from ..runtime.args import (bind_args, check_cluster_grid, check_grid, check_kernel,
                            check_program_args)
from .machine import World, run_program


def emulate(kernel, *args, grid, target: str = "gfx950", isa: bool = False,
            wave_order: str | None = None, **kwargs) -> dict:
    """Run `kernel` in the emulator as `target` would, over `grid` workgroups.

    Tensor and scalar arguments go by position or name; other keywords are compile-time
    constants (and `num_waves`). Arguments are checked by the rules a GPU launch applies
    (runtime.args). Tensors are not modified: the returned dict holds every global tensor
    after the run, by parameter name, as numpy arrays; one array passed under two names (an
    in-place update) is one buffer, returned under both. As on the GPU, nothing runs when a
    tensor has no elements.

    isa=True (gfx942, gfx950): compile the kernel for `target` and execute its code object
    instruction by instruction instead (`pykittens.isa`), checking wait-state hazards.

    wave_order: which of a workgroup's runnable waves runs first, "forward" (wave 0) or
    "reverse" (the last); default $PYKITTENS_WAVE_ORDER, else "forward" (so a test suite
    can be run under both). The GPU promises neither; a kernel whose waits depend on the
    order (e.g. an mbarrier wait for a phase two ahead of the barrier's, which its parity
    lets through) reads unwritten memory under one of them and is reported.
    """
    check_kernel(kernel, "pk.emulate")
    if isa:
        from ..isa import emulate as isa_emulate
        return isa_emulate(kernel, *args, grid=grid, target=target, **kwargs)
    prog, arrays, grid = _prepare(kernel, args, kwargs, grid, target, "pk.emulate")
    if any(isinstance(v, np.ndarray) and v.size == 0 for v in arrays.values()):
        out = {p.name: np.array(arrays[p.name]) for p in prog.params if p.kind == "gl"}
    else:
        out = run_program(prog, arrays, grid,
                          wave_order or os.environ.get("PYKITTENS_WAVE_ORDER", "forward"))
    return _peers_as_lists(kernel, out)


def _prepare(kernel, args, kwargs, grid, target, what):
    """(lane program, arguments as arrays and numbers, grid) of one launch, checked by the
    rules a GPU launch applies."""
    bound, consts = bind_args(kernel, tuple(args), kwargs, what=what)
    grid = check_grid(grid, kernel)
    prog = lower(kernel.specialize_for(target, **consts), target)
    check_program_args(prog, bound, kernel)
    check_cluster_grid(prog, grid, kernel)
    arrays = {k: (np.asarray(v) if not np.isscalar(v) else v) for k, v in bound.items()}
    return prog, arrays, grid


def _peers_as_lists(kernel, out: dict) -> dict:
    """A pk.peers parameter's arrays also under its own name, as the list of its ranks'
    (beside `name.p0`, ...)."""
    for p in kernel.params:
        if p.kind == "peers":
            out[p.name] = [out[n] for n in peer_members(p.name, out)]
    return out


def emulate_world(launches, *, target: str = "gfx950", resident: int | None = None) -> list:
    """Run several launches at the same time in the emulator, sharing memory: the ranks of
    a group (each rank's launch gets pk.Peers of arrays that every rank shares), or kernels
    on two streams of one GPU. `launches` holds (kernel, args, kwargs) triples, kwargs
    including `grid` and the compile-time constants, as pk.emulate takes them (and
    optionally a fourth item, a label for the launch in error messages).

    Each launch starts its workgroups in order, at most `resident` at once (default: the
    target's compute units), and live workgroups of every launch take turns whenever one
    waits for a flag; a state where every live workgroup waits for a flag nothing will
    raise is reported as a deadlock, and accesses to one tensor by workgroups (of any
    launch) that no flag orders are reported as races. Returns one dict per launch, like
    pk.emulate's: every tensor after the run by parameter name, a pk.peers parameter as
    the list of its ranks' arrays."""
    from ..targets import get as get_target
    runs, shapes = [], []
    for i, item in enumerate(launches):
        try:
            kernel, args, kwargs, *name = item
            if len(name) > 1:
                raise ValueError
        except (TypeError, ValueError):
            raise TypeError(f"launch {i} of pk.emulate_world must be a (kernel, args, kwargs) "
                            f"triple (or with a label), got {item!r}") from None
        check_kernel(kernel, "pk.emulate_world")
        kwargs = dict(kwargs)
        if "grid" not in kwargs:
            raise TypeError(f"launch {i} ({kernel.name}) of pk.emulate_world needs grid= in "
                            "its kwargs")
        grid = kwargs.pop("grid")
        prog, arrays, grid = _prepare(kernel, args, kwargs, grid, target, "pk.emulate_world")
        rank = next((v.rank for v in list(args) + list(kwargs.values())
                     if isinstance(v, Peers)), None)
        label = (str(name[0]) if name else f"{kernel.name}" +
                 (f" (rank {rank})" if rank is not None else "")) + f" [launch {i}]"
        runs.append((prog, arrays, grid, label))
        shapes.append(kernel)
    res = resident if resident is not None else get_target(target).num_cus
    if not isinstance(res, int) or res < 1:
        raise TypeError(f"resident= must be a positive int (workgroups of one launch running "
                        f"at once), not {res!r}")
    return [_peers_as_lists(kernel, out) for kernel, out in zip(shapes, World(runs, res).run())]
