"""Checks user arguments against a kernel signature before anything runs, so a wrong dtype,
rank, static dim or device is an error that says what to pass instead."""
from __future__ import annotations

import sys

import numpy as np

from ..ir import types as T
from ..ir.errors import KernelError


def _is_torch(x) -> bool:
    """A torch tensor (or a subclass of one); torch is not imported here for the question."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def bind_args(kernel, args: tuple, kwargs: dict, *, device: str = "cpu") -> tuple[dict, dict]:
    """Split positional/keyword arguments into (tensors and scalars by name, consts)."""
    names = [p.name for p in kernel.params]
    if len(args) > len(names):
        raise KernelError(f"{kernel.name} takes {len(names)} tensor/scalar arguments "
                          f"({', '.join(names)}), got {len(args)}", kernel.loc, kernel.name)
    bound = dict(zip(names, args))
    consts = {}
    for k, v in kwargs.items():
        if k in names:
            if k in bound:
                raise KernelError(f"argument {k!r} given twice", kernel.loc, kernel.name)
            bound[k] = v
        else:
            consts[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise KernelError(f"missing argument(s) {missing} for kernel {kernel.name}",
                          kernel.loc, kernel.name)
    out = {}
    for p in kernel.params:
        v = bound[p.name]
        if p.kind == "gl" and isinstance(p.type.dtype, str):
            dname = p.type.dtype
            got = _elem_type(kernel, p, v)
            if consts.get(dname) is None:
                consts[dname] = got
            p = kernel.resolve(p, consts)
        out[p.name] = _check_tensor(kernel, p, v, device) if p.kind == "gl" else \
            _check_scalar(kernel, p, v)
    return out, consts


def _elem_type(kernel, p, v):
    if not (_is_torch(v) or isinstance(v, np.ndarray)):
        raise KernelError(f"argument {p.name!r} of {kernel.name} must be a numpy array or "
                          f"torch tensor, not {type(v).__name__}", kernel.loc, kernel.name)
    return T.dtype_of(v.dtype)


def _check_tensor(kernel, p, v, device):
    gt: T.GlobalType = p.type
    where = f"argument {p.name!r} of {kernel.name}"
    if _is_torch(v):
        dev = v.device.type
        if device == "cpu" and dev != "cpu":
            v = v.detach().cpu()
        elif device != "cpu" and dev == "cpu":
            raise KernelError(f"{where} is on the CPU; move it to the GPU with .to('{device}')",
                              kernel.loc, kernel.name)
        got = T.dtype_of(v.dtype)
        if device == "cpu":
            v = v.detach().contiguous().view(_torch_bits(v.dtype)).numpy().view(got.np)
    elif isinstance(v, np.ndarray):
        got = T.dtype_of(v.dtype)
    else:
        raise KernelError(f"{where} must be a numpy array or torch tensor, not "
                          f"{type(v).__name__}", kernel.loc, kernel.name)
    if got != gt.dtype:
        raise KernelError(f"{where} has element type {got} but the kernel expects "
                          f"{gt.dtype}; convert it first (e.g. x.astype/x.to)",
                          kernel.loc, kernel.name)
    if v.ndim != gt.rank:
        raise KernelError(f"{where} has rank {v.ndim} but the kernel expects rank {gt.rank}",
                          kernel.loc, kernel.name)
    for i, (d, want) in enumerate(zip(v.shape, gt.shape)):
        if want is not None and d != want:
            raise KernelError(f"{where} has size {d} in dim {i} but the kernel is compiled "
                              f"for {want}", kernel.loc, kernel.name)
    if any(d >= 2**31 for d in v.shape) or int(np.prod(v.shape)) >= 2**31:
        raise KernelError(f"{where} has more than 2^31 elements; 32-bit offsets cannot "
                          "address it", kernel.loc, kernel.name)
    return v


def _torch_bits(dtype):
    import torch
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]


def _check_scalar(kernel, p, v):
    d = p.type.dtype
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise KernelError(f"argument {p.name!r} of {kernel.name} must be a number ({d}), "
                          f"not {type(v).__name__}", kernel.loc, kernel.name)
    if not d.is_float and float(v) != int(v):
        raise KernelError(f"argument {p.name!r} of {kernel.name} must be an integer ({d})",
                          kernel.loc, kernel.name)
    return v
