"""A kernel packaged for checking: how to make inputs, launch it, and what it should compute.
Library kernels register one each; users can write their own for `pykittens emulate`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..ir import types as T


@dataclass(frozen=True)
class KernelSpec:
    name: str
    kernel: object                               # a pk.Kernel
    make_inputs: Callable                        # (shape, dtype, rng) -> dict name -> array/scalar
    reference: Callable                          # inputs -> dict output name -> float64 array
    launch: Callable                             # (inputs, target) -> (grid, consts)
    outputs: tuple[str, ...]
    shapes: tuple = ()                           # small shapes for the emulator (ragged ones too)
    gpu_shapes: tuple = ()                       # real shapes for a GPU check
    dtypes: tuple[str, ...] = ("f32", "bf16")
    compile_consts: dict = field(default_factory=dict)   # consts for `pykittens compile`
    tol: dict = field(default_factory=dict)   # per-dtype overrides of the default tolerance
    torch_reference: Callable | None = None   # the reference on float64 torch tensors (GPU)
    targets: tuple = ("gfx942", "gfx950", "sm_90a")   # where the kernel is meant to run
    # outputs that hold partial sums (a row per workgroup or wave, added up by another
    # kernel): they start at zero, and their row sums are what the reference gives
    partials: tuple[str, ...] = ()

    def tolerance(self, dtype) -> float:
        """Relative Frobenius error allowed for results computed from `dtype` inputs
        against a float64 reference: f32 ~1e-5, 16-bit ~1e-2, unless the kernel says
        otherwise."""
        name = T.dtype_of(dtype).name
        return self.tol.get(name, {"f32": 1e-5}.get(name, 1e-2))


    def poison(self, inputs: dict) -> dict:
        """inputs with the outputs (but partial sums) set to NaN, so that elements a kernel
        fails to write show up."""
        return {k: np.full_like(v, np.nan) if k in self.outputs and k not in self.partials
                else v for k, v in inputs.items()}

    def value(self, name: str, got) -> np.ndarray:
        """Output `name` of a run as its reference gives it, in float64."""
        g = np.asarray(got, np.float64)
        return g.sum(axis=0) if name in self.partials else g

    def errors(self, got: dict, ref: dict) -> dict:
        """Relative Frobenius and largest absolute error of each output."""
        out = {}
        for name in self.outputs:
            g = self.value(name, got[name])
            out[name] = {"rel_err": rel_err(g, ref[name]),
                         "max_abs_err": float(np.max(np.abs(g - ref[name]))) if g.size else 0.0}
        return out


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere never passes."""
    o = np.asarray(out, np.float64)
    r = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


def check(spec: KernelSpec, shape, dtype, target, rng=None) -> dict:
    """Emulate `spec` at one shape and dtype; return errors per output."""
    from ..emulator.launch import emulate
    rng = rng or np.random.default_rng(0)
    inputs = spec.poison(spec.make_inputs(shape, T.dtype_of(dtype), rng))
    grid, consts = spec.launch(inputs, target)
    got = emulate(spec.kernel, grid=grid, target=target, **inputs, **consts)
    return spec.errors(got, spec.reference(inputs))
