"""Checks user arguments against a kernel signature before anything runs, so a wrong dtype,
rank, static dim, layout or device is an error that says what to pass instead.

This is the one place for those rules: `pk.emulate`, the ISA emulator, `pk.launch` (CUDA and
HIP) and the low-level launchers (`runtime.cuda`, `runtime.hip`) all check tensors with
`check_tensor`, grids with `check_grid` and overlapping tensors with `check_overlaps`, so an
argument the GPU would misread is refused by the emulator too. The rules:

- a tensor is a numpy array (emulator) or a torch tensor; GPU launches need GPU tensors;
- element type, rank and static dims as the signature says;
- the last dim has unit stride (the generated code assumes it), no stride is negative, and
  sizes, strides and the largest element offset fit the ABI's i32;
- the data pointer is aligned to the element size; tensors copied by TMA (Hopper) start
  16-byte aligned and have non-last strides of a multiple of 16 bytes;
- two tensors that share memory are the very same view (an in-place update), never two
  different views of one buffer;
- grids are 1 to 3 Python ints, each >= 1 and < 2^31.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

from ..ir import types as T
from ..ir.errors import KernelError
from ..ir.nodes import Loc, first_frame_outside

I32_MAX = 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)


class ArgumentError(KernelError, TypeError, ValueError):
    """A bad argument to a kernel launch or emulation (also a TypeError/ValueError, as the
    launchers raised before these checks were shared). `site` is where the user made the
    call; the message shows it after the kernel's own line."""

    def __init__(self, message: str, loc=None, kernel: str | None = None, site=None):
        super().__init__(message, loc, kernel)
        self.site = site
        if site is not None and site != loc:
            self.args = (f"{self.args[0]} (called at {site})",)


_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_dirs() -> tuple[str, ...]:
    dirs = [_PKG]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.append(os.path.dirname(torch.__file__) + os.sep)
    return tuple(dirs)


def call_site() -> Loc | None:
    """The innermost frame outside pykittens (and torch, which dispatches custom ops): where
    the user called the launch or emulation."""
    return first_frame_outside(_library_dirs())


def fail(msg: str, kernel=None, site: Loc | None = None) -> ArgumentError:
    """An ArgumentError naming the kernel (its definition line) and where it was called."""
    site = site or call_site()
    if kernel is None:
        return ArgumentError(msg, site)
    return ArgumentError(msg, getattr(kernel, "loc", None), getattr(kernel, "name", None),
                         site)


def check_kernel(kernel, what: str):
    """`kernel` must be a @pk.kernel; a plain function (the decorator forgotten) is named
    with its own file and line."""
    from ..lang.kernel import require_kernel
    return require_kernel(kernel, what)


def check_grid(grid, kernel=None, *, what: str = "grid") -> tuple[int, ...]:
    """1 to 3 workgroup counts, each a Python (or numpy) int >= 1 and < 2^31; a float
    (`n / 64`) is an error rather than a truncated launch."""
    dims = (grid,) if not isinstance(grid, (tuple, list)) else tuple(grid)
    if not 1 <= len(dims) <= 3:
        raise fail(f"{what} must be an int or a tuple of 1 to 3 ints, got {grid!r}", kernel)
    out = []
    for g in dims:
        if isinstance(g, (bool, np.bool_)) or not isinstance(g, (int, np.integer)):
            hint = (": use integer division (`-(-n // block)` rounds up)"
                    if isinstance(g, (float, np.floating)) else "")
            raise fail(f"{what} sizes must be ints, got {g!r} in {what}={grid!r}{hint}", kernel)
        if not 1 <= int(g) <= I32_MAX:
            raise fail(f"{what} must be 1 to 3 positive sizes below 2^31, got {grid!r}",
                       kernel)
        out.append(int(g))
    return tuple(out)


# ---- tensors ----------------------------------------------------------------------------------

def is_torch(x) -> bool:
    """A torch tensor (or a subclass of one); torch is not imported here for the question."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_tensor_like(v) -> bool:
    return isinstance(v, np.ndarray) or (hasattr(v, "data_ptr") and hasattr(v, "shape")
                                         and hasattr(v, "stride"))


def _strides(v) -> tuple[int, ...]:
    """Element strides of a numpy array or a tensor-like object."""
    if isinstance(v, np.ndarray):
        esz = v.dtype.itemsize
        return tuple(s // esz if s % esz == 0 else s / esz for s in v.strides)
    try:
        return tuple(int(s) for s in v.stride())
    except TypeError:           # stride(d) only (a stand-in for a device tensor)
        return tuple(int(v.stride(d)) for d in range(len(v.shape)))


def _address(v) -> int | None:
    if isinstance(v, np.ndarray):
        return v.__array_interface__["data"][0]
    return int(v.data_ptr())


def _device(v) -> tuple[str, int | None]:
    if isinstance(v, np.ndarray):
        return "cpu", None
    dev = getattr(v, "device", None)
    if dev is None:
        return "cuda", None                 # a bare device tensor stand-in (address only)
    return getattr(dev, "type", str(dev)), getattr(dev, "index", None)


def element_type(v, name: str, kernel=None) -> T.DType:
    """The pykittens element type of a tensor, or an error naming the argument."""
    if not _is_tensor_like(v):
        raise fail(f"{name} must be a numpy array or torch tensor, not {type(v).__name__}",
                   kernel)
    try:
        return T.dtype_of(v.dtype)
    except TypeError:
        got = str(v.dtype).replace("torch.", "")
        fix = "x.to(torch.float32)" if is_torch(v) else "x.astype(np.float32)"
        raise fail(f"{name} has element type {got}, which pykittens kernels do not take "
                   f"(they take {', '.join(T.DTYPES)}); convert it first, e.g. {fix}",
                   kernel) from None


def check_tensor(v, *, name: str, dtype=None, rank: int | None = None, shape=None,
                 device: str | None = None, device_index: int | None = None,
                 align: int | None = None, tma: bool = False, kernel=None) -> T.DType | None:
    """Check one tensor argument (see the module docstring). `device` is 'cpu' (emulator:
    any device; the data is copied) or 'cuda' (a GPU tensor, on `device_index` if given).
    `align`: bytes the data pointer must be aligned to beyond the element size. Returns the
    element type (None for an address-only stand-in without a dtype)."""
    if not _is_tensor_like(v):
        raise fail(f"{name} must be a numpy array or torch tensor, not {type(v).__name__}",
                   kernel)
    dev, index = _device(v)
    if device == "cuda":
        if dev != "cuda":
            where = "on the CPU" if dev == "cpu" else f"on {dev}"
            to = "cuda" if device_index is None else f"cuda:{device_index}"
            raise fail(f"{name} is {where}; move it to the GPU with .to('{to}')" +
                       ("; numpy arrays run with pk.emulate" if isinstance(v, np.ndarray)
                        else ""), kernel)
        if device_index is not None and index is not None and index != device_index:
            raise fail(f"{name} is on cuda:{index} but the kernel is loaded on "
                       f"cuda:{device_index}; move it with .to('cuda:{device_index}')", kernel)
    got = element_type(v, name, kernel) if hasattr(v, "dtype") else None
    if dtype is not None and got is not None:
        want = T.dtype_of(dtype)
        if not T.same_storage(got, want):
            fix = f"x.to({_torch_name(want)})" if is_torch(v) else f"x.astype({_np_name(want)})"
            held = f"{got} ({v.dtype} holds packed FP4 or FP6)" if got.packed != 1 else got
            raise fail(f"{name} has element type {held} but the kernel expects {want}; "
                       f"convert it first ({fix})", kernel)
    dims = tuple(int(d) for d in v.shape)
    if rank is not None and len(dims) != rank:
        raise fail(f"{name} has rank {len(dims)} but the kernel expects rank {rank}", kernel)
    for i, (d, want) in enumerate(zip(dims, shape or ())):
        if want is not None and d != want:
            raise fail(f"{name} has size {d} in dim {i} but the kernel is compiled for {want}",
                       kernel)
    strides = _strides(v)
    esz = got.bytes if got is not None else None
    if any(not float(s).is_integer() for s in strides):
        raise fail(f"{name} has byte strides that are not a multiple of its element size; "
                   "pass a copy (np.ascontiguousarray(x))", kernel)
    if any(s < 0 for s in strides):
        raise fail(f"{name} has a negative stride {strides}; pass a copy (x.contiguous(), "
                   "np.ascontiguousarray(x))", kernel)
    if dims and dims[-1] > 1 and strides[-1] != 1:
        fix = "x.contiguous()" if is_torch(v) or not isinstance(v, np.ndarray) else \
            "np.ascontiguousarray(x)"
        raise fail(f"{name} has stride {strides[-1]} in its last dimension (e.g. a transposed "
                   f"view); kernels need the last dimension contiguous: pass {fix}", kernel)
    extent = sum((d - 1) * s for d, s in zip(dims, strides)) if all(dims) else 0
    if any(d > I32_MAX for d in dims) or any(s > I32_MAX for s in strides) or \
            extent > I32_MAX or math.prod(dims) > I32_MAX:
        raise fail(f"{name} has a size, stride or element offset of 2^31 or more (shape "
                   f"{dims}, strides {strides}); the kernel ABI passes them as i32: split "
                   "the tensor", kernel)
    ptr = _address(v)
    if esz and ptr % esz and math.prod(dims):
        raise fail(f"{name} starts at address {ptr:#x}, not aligned to its {esz}-byte "
                   "elements; pass a copy", kernel)
    if align and ptr % align:
        raise fail(f"{name} starts at address {ptr:#x}, not {align}-byte aligned (a slice "
                   "with an offset?); pass x.clone() or a slice that starts on an aligned "
                   "element", kernel)
    if tma and esz:
        if ptr % 16 or any(s * esz % 16 for s in strides[:-1]):
            raise fail(f"{name} is copied by TMA, which needs a 16-byte aligned start and "
                       f"strides of a multiple of 16 bytes outside the last dim; it has "
                       f"strides {strides} of {esz}-byte elements (pad the rows to a multiple "
                       f"of {16 // math.gcd(16, esz)} elements)", kernel)
    return got


def _np_name(d: T.DType) -> str:
    if d.np is np.uint8:                   # packed FP4 / FP6 bytes
        return "np.uint8"
    return {"f32": "np.float32", "f16": "np.float16", "i32": "np.int32",
            "i8": "np.int8"}.get(d.name, f"ml_dtypes.{np.dtype(d.np).name}")


def _torch_name(d: T.DType) -> str:
    return {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16",
            "i32": "torch.int32", "i8": "torch.int8", "e4m3": "torch.float8_e4m3fn",
            "e5m2": "torch.float8_e5m2", "e2m1x2": "torch.float4_e2m1fn_x2",
            "e2m3p": "torch.uint8", "e3m2p": "torch.uint8"}.get(d.name, d.name)


def memory_span(v) -> tuple[int, int] | None:
    """[first byte, last byte + 1) a tensor can touch; None when empty."""
    dims = tuple(int(d) for d in v.shape)
    if not all(dims):
        return None
    esz = T.dtype_of(v.dtype).bytes if hasattr(v, "dtype") else 1
    start = _address(v)
    last = sum((d - 1) * s for d, s in zip(dims, _strides(v)))
    return start, start + (int(last) + 1) * esz


def same_view(a, b) -> bool:
    """The same elements in the same order: an in-place update, which the GPU and the
    emulator both run as written."""
    return (_address(a) == _address(b) and tuple(a.shape) == tuple(b.shape)
            and _strides(a) == _strides(b) and str(getattr(a, "dtype", "")) ==
            str(getattr(b, "dtype", "")))


def _share(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if not np.may_share_memory(a, b):
            return False
        try:
            return bool(np.shares_memory(a, b, max_work=10**6))
        except Exception:           # too hard to decide exactly: treat as shared
            return True
    sa, sb = memory_span(a), memory_span(b)
    if sa is None or sb is None or _device(a) != _device(b):
        return False
    return sa[0] < sb[1] and sb[0] < sa[1]


def check_overlaps(tensors: dict, kernel=None) -> list[list[str]]:
    """Tensors that share memory must be the very same view (e.g. x passed as input and
    output for an in-place update); different views of one buffer (a shifted slice, a
    reshape, another dtype) are refused: one workgroup's writes would land in elements
    another reads through a different name. Returns the groups of names that alias."""
    names = [n for n, v in tensors.items() if _is_tensor_like(v)]
    groups: list[list[str]] = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            va, vb = tensors[a], tensors[b]
            if not _share(va, vb):
                continue
            if not same_view(va, vb):
                raise fail(f"arguments {a!r} and {b!r} overlap in memory but are different "
                           f"views of it (shapes {tuple(va.shape)} and {tuple(vb.shape)}); "
                           f"pass separate tensors (e.g. {b}.copy() / .clone()), or the very "
                           f"same tensor for an in-place update", kernel)
            group = next((g for g in groups if a in g), None)
            if group is None:
                groups.append([a, b])
            elif b not in group:
                group.append(b)
    return groups


# ---- binding ----------------------------------------------------------------------------------

def bind_args(kernel, args: tuple, kwargs: dict, *, device: str = "cpu",
              what: str = "pk.emulate") -> tuple[dict, dict]:
    """Split positional/keyword arguments into (tensors and scalars by name, consts), after
    checking each against the signature. device='cpu' (emulators): torch tensors become
    numpy views of their CPU data; device='cuda' (launch): tensors must be GPU tensors."""
    check_kernel(kernel, what)
    site = call_site()
    names = [p.name for p in kernel.params]
    if len(args) > len(names):
        raise fail(f"{kernel.name} takes {len(names)} tensor/scalar arguments "
                   f"({', '.join(names)}), got {len(args)}", kernel, site)
    bound = dict(zip(names, args))
    consts = {}
    for k, v in kwargs.items():
        if k in names:
            if k in bound:
                raise fail(f"argument {k!r} given twice", kernel, site)
            bound[k] = v
        else:
            consts[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise fail(f"missing argument(s) {missing} for kernel {kernel.name}", kernel, site)
    out = {}
    for p in kernel.params:
        v = bound[p.name]
        label = f"argument {p.name!r} of {kernel.name}"
        if p.kind == "peers":
            out.update(_bind_peers(kernel, p, v, consts, label, device))
            continue
        if p.kind == "gl" and isinstance(p.type.dtype, str):
            dname = p.type.dtype
            got = element_type(v, label, kernel)
            if consts.get(dname) is None:
                # bytes of a packed format (an uint8 array) are the format the kernel's
                # default names, where it names one: FP6 as well as FP4 pairs
                default = kernel.const_defaults.get(dname)
                packed = default is not None and T.same_storage(got, T.dtype_of(default))
                consts[dname] = T.dtype_of(default) if packed else got
        if p.kind == "gl":
            for i, d in enumerate(p.type.shape):          # dims named by consts
                if isinstance(d, str) and consts.get(d, kernel.const_defaults.get(d)) is None:
                    element_type(v, label, kernel)
                    if len(v.shape) == len(p.type.shape):
                        consts[d] = int(v.shape[i])
            p = kernel.resolve(p, {**kernel.const_defaults, **consts})
            check_tensor(v, name=label, dtype=p.type.dtype, rank=p.type.rank,
                         shape=p.type.shape, device=device, kernel=kernel)
            out[p.name] = _host_view(v) if device == "cpu" else v
        else:
            out[p.name] = check_scalar(v, label, p.type.dtype, kernel)
    check_overlaps(out, kernel)
    return out, consts


def _bind_peers(kernel, p, v, consts, label, device) -> dict:
    """A pk.Peers argument as the kernel's ABI takes it: each rank's tensor under
    `name.p<i>` (checked like any tensor, all of one shape and layout) and `name.rank`."""
    from ..lang.kernel import Peers, peer_params
    if not isinstance(v, Peers):
        raise fail(f"{label} is a pk.peers parameter: pass pk.Peers(tensors, rank) (one "
                   f"tensor per rank, in rank order, and the calling rank), not "
                   f"{type(v).__name__}", kernel)
    w = p.world
    if isinstance(w, str):
        if consts.get(w, kernel.const_defaults.get(w)) is None:
            consts[w] = v.world
        w = consts.get(w, kernel.const_defaults.get(w))
    if v.world != w:
        raise fail(f"{label} has {v.world} tensors but the kernel is compiled for a group of "
                   f"{w} ranks", kernel)
    first = v.tensors[0]
    if isinstance(p.type.dtype, str) and consts.get(p.type.dtype) is None:
        consts[p.type.dtype] = element_type(first, label, kernel)
    for i, d in enumerate(p.type.shape):
        if isinstance(d, str) and consts.get(d, kernel.const_defaults.get(d)) is None:
            element_type(first, label, kernel)
            if len(first.shape) == len(p.type.shape):
                consts[d] = int(first.shape[i])
    rp = kernel.resolve(p, {**kernel.const_defaults, **consts})
    out = {}
    members = peer_params(rp)
    for i, (m, t) in enumerate(zip(members, v.tensors)):
        check_tensor(t, name=f"{label} (rank {i}'s tensor)", dtype=rp.type.dtype,
                     rank=rp.type.rank, shape=rp.type.shape, device=device, kernel=kernel)
        if tuple(t.shape) != tuple(first.shape) or _strides(t) != _strides(first):
            raise fail(f"{label}: rank {i}'s tensor has shape {tuple(t.shape)} and strides "
                       f"{_strides(t)}, rank 0's {tuple(first.shape)} and {_strides(first)}; "
                       "symmetric tensors have one shape and layout on every rank", kernel)
        out[m.name] = _host_view(t) if device == "cpu" else t
    out[members[-1].name] = v.rank
    return out


def remote_peers(bound: dict) -> set:
    """Names, in bound arguments, of other ranks' tensors of pk.Peers arguments (expanded
    as `x.p<i>` beside `x.rank`): they live on other GPUs, mapped into this one's memory,
    so they are exempt from the one-device rule."""
    from ..lang.kernel import peer_members
    out = set()
    for n, rank in bound.items():
        if n.endswith(".rank"):
            members = peer_members(n[:-len(".rank")], bound)
            out |= {m for i, m in enumerate(members) if i != rank}
    return out


def _host_view(v):
    """A numpy view of a tensor's data on the CPU (copied from a GPU first), keeping its
    strides, so aliasing between arguments stays visible."""
    if isinstance(v, np.ndarray):
        return v
    if not is_torch(v):
        return v
    if v.device.type != "cpu":
        v = v.detach().cpu()
    got = T.dtype_of(v.dtype)
    return v.detach().view(_torch_bits(v.dtype)).numpy().view(got.np)


def _torch_bits(dtype):
    import torch
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]


def check_scalar(v, name: str, d: T.DType, kernel=None):
    """A number that fits the parameter's type exactly (an i32 is an integer in range; an
    f32 is finite-sized), so nothing is wrapped or rounded on the way in."""
    d = T.dtype_of(d)
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if is_torch(v) and getattr(v, "ndim", None) == 0:
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                             np.floating)):
        raise fail(f"{name} must be a number ({d}), not {type(v).__name__}", kernel)
    if not d.is_float:
        if not float(v).is_integer():
            raise fail(f"{name} must be an integer ({d}), got {v!r}", kernel)
        if not -2**31 <= int(v) <= I32_MAX:
            raise fail(f"{name} = {int(v)} does not fit {d} (-2^31 .. 2^31-1)", kernel)
        return int(v) if isinstance(v, (float, np.floating)) else v
    if math.isfinite(float(v)) and abs(float(v)) > _F32_MAX:
        raise fail(f"{name} = {v!r} overflows {d} (largest {_F32_MAX:.4g})", kernel)
    return v


def written_params(prog) -> set:
    """Names of the global tensors some op of a lowered program writes. A write through a
    peer view (a rank picked at run time) may reach any rank's tensor: it counts for all."""
    from ..ir.nodes import walk
    views = {op.dst: [m.name for m in op.srcs[:-1]] for op in walk(prog.body)
             if op.kind == "peer"}
    out = set()
    for op in walk(prog.body):
        if op.kind in ("gstore", "gatomic_add", "gdiscard", "signal", "timestamp"):
            out.update(views.get(op.srcs[0], (op.srcs[0].name,)))
        elif op.kind == "tma_store":
            out.add(op.attrs["gl"].name)
    return out


def check_cluster_grid(prog, grid, kernel=None) -> None:
    """A kernel in clusters of n (pk.cluster) launches whole clusters: n divides the grid's
    first dimension."""
    n = getattr(prog, "cluster", 1)
    if n > 1 and grid[0] % n:
        raise fail(f"{prog.name} runs in clusters of {n} workgroups (pk.cluster), so the "
                   f"grid's first dimension must be a multiple of {n}, not {grid[0]}", kernel)


def check_program_args(prog, bound: dict, kernel=None) -> None:
    """The checks that need the lowered program: TMA's alignment rules for the tensors it
    copies, and no written tensor that repeats elements (a stride of 0 from expand() or
    broadcast_to), which the GPU's workgroups would all write at once."""
    check_tma_args(prog, bound, kernel)
    for name in sorted(written_params(prog)):
        v = bound.get(name)
        if v is None or not _is_tensor_like(v):
            continue
        if any(d > 1 and s == 0 for d, s in zip(v.shape, _strides(v))):
            raise fail(f"argument {name!r} of {prog.name} repeats elements (a stride of 0, "
                       "e.g. from expand() or np.broadcast_to) and the kernel writes it; pass "
                       "a tensor with its own memory (x.contiguous() / x.copy())", kernel)


def check_tma_args(prog, bound: dict, kernel=None) -> None:
    """Tensors a lowered program copies with TMA must meet TMA's alignment rules (the same
    check on the GPU and in the emulator)."""
    for t in getattr(prog, "tmaps", ()) or ():
        v = bound.get(t.param)
        if v is not None and _is_tensor_like(v):
            check_tensor(v, name=f"argument {t.param!r} of {prog.name}", tma=True,
                         kernel=kernel)


__all__ = ["ArgumentError", "bind_args", "call_site", "check_grid", "check_kernel",
           "check_overlaps", "check_program_args", "check_scalar", "check_tensor",
           "check_tma_args", "element_type", "memory_span", "same_view", "written_params"]
