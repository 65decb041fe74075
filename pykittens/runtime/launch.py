"""`pk.launch`: run a kernel on the GPU that holds its tensors (CUDA: sm_90a; ROCm: gfx942 /
gfx950, through HIP), compiling on first use. Code objects are cached on disk by the
toolchain and loaded modules in memory per (kernel, constants, alignment, device).

Repeated calls take a fast path: the first call with a given *signature* — the kernel, its
constants, the grid, and each tensor's dtype, shape, strides, device and 16-byte alignment
(each scalar's type) — runs every check, picks the build and packs the argument buffer;
what it decided is kept as a `_Plan`, and later calls with the same signature only write
their pointers and scalar values into a copy of that buffer (and re-encode TMA tensor maps
whose tensor moved) before the driver call. Everything the checks look at is in the
signature, so the fast path launches exactly what the checked path would.
PYKITTENS_FAST_LAUNCH=0 turns it off."""
from __future__ import annotations

import functools
import os
import struct
import sys

from ..ir.errors import KernelError
from .args import bind_args

_modules: dict = {}
_plans: dict = {}
MAX_PLANS = 4096          # signatures kept (shapes that keep changing must not grow it forever)
FAST_PATH = os.environ.get("PYKITTENS_FAST_LAUNCH", "1") != "0"
ALIGN_ELEMS = 16          # strides divisible by this many elements allow 16-byte vectors


def _aligned(bound: dict) -> bool:
    """True when every tensor starts 16-byte aligned and its non-last strides are multiples
    of 16 elements: the build that uses aligned vector accesses is then valid."""
    for v in bound.values():
        if hasattr(v, "data_ptr"):
            if v.data_ptr() % 16 or any(s % ALIGN_ELEMS for s in v.stride()[:-1]):
                return False
    return True


@functools.lru_cache(maxsize=None)
def gpu_target(device_index: int) -> str:
    """The pykittens target of a torch GPU: a ROCm build reports the gfx arch, CUDA the
    compute capability."""
    import torch
    from ..targets import TARGETS
    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device_index).gcnArchName.split(":")[0]
        if arch not in TARGETS or TARGETS[arch].family != "cdna":
            raise KernelError(f"cuda:{device_index} is {arch}; pykittens' AMD backend targets "
                              "gfx942 (MI300X/MI325X) and gfx950 (MI350X/MI355X)")
        return arch
    major, minor = torch.cuda.get_device_capability(device_index)
    if (major, minor) != (9, 0):
        raise KernelError(f"pykittens' NVIDIA backend targets Hopper (sm_90a); cuda:"
                          f"{device_index} has compute capability {major}.{minor}")
    return "sm_90a"


def launch(kernel, *args, grid, stream=None, **kwargs):
    """Run `kernel` on the GPU over `grid` workgroups. Tensor and scalar arguments go by
    position or name; other keywords are compile-time constants. Tensors are written in
    place (as any GPU kernel would); returns None."""
    key = _signature(kernel, args, kwargs, grid) if FAST_PATH else None
    try:
        plan = _plans.get(key) if key is not None else None
    except TypeError:                        # an unhashable constant: the checked path
        key = plan = None
    if plan is None:
        plan = _checked_launch(kernel, args, kwargs, grid, stream)
        if key is not None and plan is not None:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
        return None
    plan(args, kwargs, stream)
    return None


def _checked_launch(kernel, args, kwargs, grid, stream):
    """Check everything, compile on first use, launch; return the _Plan of this call (None
    where nothing was launched)."""
    from .. import compiler
    from . import cuda
    from ..lower import lower
    bound, consts = bind_args(kernel, args, kwargs, device="cuda")
    tensors = [v for v in bound.values() if hasattr(v, "data_ptr")]
    if not tensors:
        raise KernelError("launch needs at least one GPU tensor argument", kernel.loc,
                          kernel.name)
    dev = tensors[0].device
    if dev.type != "cuda":
        raise KernelError(f"tensors are on {dev}; pykittens launches on CUDA devices here "
                          "(use pk.emulate for CPU arrays)", kernel.loc, kernel.name)
    if any(t.numel() == 0 for t in tensors):
        return None                                       # nothing to compute
    index = dev.index if dev.index is not None else 0
    target = gpu_target(index)
    grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
    aligned = _aligned(bound)
    key = (id(kernel), tuple(sorted((k, str(v)) for k, v in consts.items())), aligned, index)
    entry = _modules.get(key)
    if entry is None:
        prog = lower(kernel.specialize(**consts), target)
        obj = compiler.compile_lane(prog, aligned=aligned)
        if prog.target.family == "cdna":
            entry = (obj, prog)                       # the HIP launcher loads and caches it
        else:
            module = cuda.Module.from_compiled(obj, device=index)
            entry = (module.function(prog.name), prog)
        _modules[key] = entry
    code, prog = entry
    if prog.target.family == "cdna":
        from . import hip
        hip.launch(code, prog.name, prog.params, bound, grid=grid, num_waves=prog.num_waves,
                   stream=stream)
        return _Plan(kernel, grid, bound, hip_entry=entry)
    kargs, values = cuda.kernel_arg_values(prog.params, bound, device=code.module.device,
                                           align=16 if aligned else None, tmaps=prog.tmaps)
    if code.kargs is None:
        code.kargs = kargs
    buf = cuda.pack(kargs, values)
    block = (prog.num_waves * prog.wave_size, 1, 1)
    code.launch(grid, block, buf, shared_bytes=prog.lds_bytes, stream=stream)
    return _Plan(kernel, cuda.dims3(grid, "grid"), bound, function=code, block=block,
                 shared=prog.lds_bytes, kargs=kargs, values=values, buf=buf,
                 params=prog.params)


def _signature(kernel, args, kwargs, grid):
    """What a launch's checks and build depend on (see the module docstring), or None where
    the call is not one the fast path takes (numpy arrays, unhashable constants, ...)."""
    names = kernel.param_names
    torch = sys.modules.get("torch")
    if len(args) > len(names) or torch is None:
        return None
    tensor = torch.Tensor
    key = [kernel, grid if isinstance(grid, int) else tuple(grid)]
    consts = []
    for k, v in kwargs.items():
        if k not in names:
            consts.append((k, v))
    for i, name in enumerate(names):
        if i < len(args):
            v = args[i]
        elif name in kwargs:
            v = kwargs[name]
        else:
            return None
        t = type(v)
        if t is int or t is float:
            p = kernel.params[i]
            if t is float and p.kind == "scalar" and not p.type.dtype.is_float:
                return None                  # the checked path says whether it is integral
            key.append(t)
        elif isinstance(v, tensor):
            key.append((v.dtype, v.shape, v.stride(), v.device, v.data_ptr() % 16 == 0))
        else:
            return None
    key.append(tuple(sorted(consts)) if len(consts) > 1 else tuple(consts))
    return tuple(key)


class _Plan:
    """A checked launch, replayed for calls of the same signature: the argument buffer of
    the checked call with this call's pointers and scalars written in (ABI offsets), and
    the tensor maps of the tensors whose address changed re-encoded."""

    def __init__(self, kernel, grid, bound, function=None, block=None, shared=0, kargs=(),
                 values=(), buf=b"", params=(), hip_entry=None):
        from .abi import FORMAT, offsets
        self.names = kernel.param_names
        self.grid, self.hip_entry, self.function = grid, hip_entry, function
        self.block, self.shared, self.buf = block, shared, bytes(buf)
        self.params = {p.name: p for p in params}
        self.fields, self.tmaps = [], []
        index = {n: i for i, n in enumerate(self.names)}
        for a, off, v in zip(kargs, offsets(kargs) if kargs else (), values):
            if a.kind == "ptr":
                self.fields.append((index[a.param], off, "ptr", FORMAT["ptr"]))
            elif a.kind == "scalar":
                self.fields.append((index[a.param], off, a.dtype, FORMAT[a.dtype]))
            elif a.kind == "tmap":
                ptr = bound[a.param].data_ptr()
                self.tmaps.append([index[a.param], off, a, ptr, bytes(v)])

    def __call__(self, args, kwargs, stream):
        vals = list(args) + [kwargs[n] for n in self.names[len(args):]]
        if self.hip_entry is not None:
            from . import hip
            code, prog = self.hip_entry
            hip.launch(code, prog.name, prog.params, dict(zip(self.names, vals)),
                       grid=self.grid, num_waves=prog.num_waves, stream=stream)
            return
        from . import cuda
        buf = bytearray(self.buf)
        for i, off, kind, fmt in self.fields:
            v = vals[i]
            if kind == "ptr":
                v = v.data_ptr()
            elif kind == "i32" and not -2**31 <= v < 2**31:
                raise OverflowError(f"kernel argument {self.names[i]!r} = {v} does not fit "
                                    "i32")
            struct.pack_into(fmt, buf, off, v)
        for tm in self.tmaps:
            t = vals[tm[0]]
            if t.data_ptr() != tm[3]:                     # the tensor moved: a new map
                tm[3], tm[4] = t.data_ptr(), cuda.encode_tensor_map(
                    t, tm[2].tma, self.params[tm[2].param].type.dtype)
            buf[tm[1]:tm[1] + 128] = tm[4]
        self.function.launch_checked(self.grid, self.block, buf, self.shared,
                                     cuda.stream_handle(stream, self.function.module.device))
