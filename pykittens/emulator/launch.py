"""`pk.emulate`: trace, lower and run a kernel on the CPU for a target."""
from __future__ import annotations

import numpy as np

from ..lower import lower
from ..runtime.args import bind_args, check_grid, check_kernel, check_program_args
from .machine import run_program


def emulate(kernel, *args, grid, target: str = "gfx950", isa: bool = False, **kwargs) -> dict:
    """Run `kernel` in the emulator as `target` would, over `grid` workgroups.

    Tensor and scalar arguments go by position or name; other keywords are compile-time
    constants (and `num_waves`). Arguments are checked by the rules a GPU launch applies
    (runtime.args). Tensors are not modified: the returned dict holds every global tensor
    after the run, by parameter name, as numpy arrays; one array passed under two names (an
    in-place update) is one buffer, returned under both. As on the GPU, nothing runs when a
    tensor has no elements.

    isa=True (gfx942, gfx950): compile the kernel for `target` and execute its code object
    instruction by instruction instead (`pykittens.isa`), checking wait-state hazards.
    """
    check_kernel(kernel, "pk.emulate")
    if isa:
        from ..isa import emulate as isa_emulate
        return isa_emulate(kernel, *args, grid=grid, target=target, **kwargs)
    bound, consts = bind_args(kernel, args, kwargs)
    grid = check_grid(grid, kernel)
    prog = lower(kernel.specialize(**consts), target)
    check_program_args(prog, bound, kernel)
    arrays = {k: (np.asarray(v) if not np.isscalar(v) else v) for k, v in bound.items()}
    if any(isinstance(v, np.ndarray) and v.size == 0 for v in arrays.values()):
        return {p.name: np.array(arrays[p.name]) for p in prog.params if p.kind == "gl"}
    return run_program(prog, arrays, grid)
