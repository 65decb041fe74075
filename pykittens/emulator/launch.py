"""`pk.emulate`: trace, lower and run a kernel on the CPU for a target."""
from __future__ import annotations

import numpy as np

from ..lower import lower
from ..runtime.args import bind_args
from .machine import run_program


def emulate(kernel, *args, grid, target: str = "gfx950", isa: bool = False, **kwargs) -> dict:
    """Run `kernel` in the emulator as `target` would, over `grid` workgroups.

    Tensor and scalar arguments go by position or name; other keywords are compile-time
    constants (and `num_waves`). Tensors are not modified: the returned dict holds every
    global tensor after the run, by parameter name, as numpy arrays.

    isa=True (gfx942, gfx950): compile the kernel for `target` and execute its code object
    instruction by instruction instead (`pykittens.isa`), checking wait-state hazards.
    """
    if isa:
        from ..isa import emulate as isa_emulate
        return isa_emulate(kernel, *args, grid=grid, target=target, **kwargs)
    bound, consts = bind_args(kernel, args, kwargs)
    prog = lower(kernel.specialize_for(target, **consts), target)
    if isinstance(grid, int):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise ValueError(f"grid must be 1 to 3 positive sizes, got {grid}")
    return run_program(prog, {k: (np.asarray(v) if not np.isscalar(v) else v)
                              for k, v in bound.items()}, grid)
