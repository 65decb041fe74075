"""`pk.launch`: run a kernel on the GPU that holds its tensors (CUDA: sm_90a; ROCm: gfx942 /
gfx950, through HIP), compiling on first use. Code objects are cached on disk by the
toolchain and loaded modules in memory per (kernel, constants, alignment, device).

Arguments are checked by the rules the emulator applies too (runtime.args). Repeated calls
take a fast path: the first call with a given *signature* — the kernel, its constants (by
value and type), the grid (ints), and each tensor's dtype, shape, strides, device and
address modulo 16 (each scalar's type) — runs every check, picks the build and packs the
argument buffer; what it decided is kept as a `_Plan`. A later call with the same signature
has passed every check that depends on those (dtype, rank, static dims, unit last stride,
i32 extents, element and TMA alignment, stride-0 outputs, one device) and is checked only
for what varies from call to call: the scalars' ranges and tensors that overlap in memory
(a call that fails either takes the checked path, which says what is wrong). It then
writes its pointers and scalar values into a copy of the plan's buffer (and re-encodes TMA
tensor maps whose tensor moved) before the driver call, so it launches exactly what the
checked path would. PYKITTENS_FAST_LAUNCH=0 turns it off."""
from __future__ import annotations

import ctypes
import functools
import os
import struct
import sys
import threading

from ..ir.errors import KernelError
from ..lang.kernel import Peers, peer_members
from .args import (_F32_MAX, I32_MAX, bind_args, check_cluster_grid, check_grid,
                   check_kernel, check_program_args, fail, remote_peers)

_modules: dict = {}
_lock = threading.Lock()
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
    place (as any GPU kernel would); returns None. Arguments are checked by the rules the
    emulator applies too (runtime.args); nothing runs when a tensor has no elements."""
    launch_plan(kernel, *args, grid=grid, stream=stream, **kwargs)


def launch_plan(kernel, *args, grid, stream=None, **kwargs):
    """`launch`, returning the _Plan that launched it (None where nothing was launched):
    a caller that knows where its next call's tensors come from replays it directly
    (ops.replay)."""
    key = _signature(kernel, args, kwargs, grid) if FAST_PATH else None
    plan = None
    if key is not None:
        try:
            plan = _plans.get(key)
        except TypeError:                    # an unhashable constant: the checked path
            key = None
    if plan is not None and plan(args, kwargs, stream):
        return plan
    plan = _checked_launch(kernel, args, kwargs, grid, stream)
    if key is not None and plan is not None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    return plan


def _checked_launch(kernel, args, kwargs, grid, stream):
    """Check everything, compile on first use, launch; return the _Plan of this call (None
    where nothing was launched)."""
    from .. import compiler
    from . import cuda
    from ..lang.kernel import const_key
    from ..lower import lower
    check_kernel(kernel, "pk.launch")
    bound, consts = bind_args(kernel, args, kwargs, device="cuda", what="pk.launch")
    grid = check_grid(grid, kernel)
    tensors = [v for v in bound.values() if hasattr(v, "data_ptr")]
    if not tensors:
        raise KernelError("launch needs at least one GPU tensor argument", kernel.loc,
                          kernel.name)
    # other ranks' tensors of a pk.Peers live on their GPUs, mapped into this one's memory
    remote = remote_peers(bound)
    local = [v for n, v in bound.items() if hasattr(v, "data_ptr") and n not in remote]
    devices = sorted({str(v.device) for v in local})
    if len(devices) > 1:
        raise fail(f"the tensors are on different GPUs ({', '.join(devices)}); put them on "
                   "one", kernel)
    dev = local[0].device
    if any(t.numel() == 0 for t in tensors):
        return None                                       # nothing to compute
    index = dev.index if dev.index is not None else 0
    target = gpu_target(index)
    aligned = _aligned(bound)
    # constants by value and type (two mappings that print alike are different kernels)
    key = (id(kernel), const_key(consts), aligned, index)
    with _lock:
        entry = _modules.get(key)
        if entry is None:
            prog = lower(kernel.specialize_for(target, **consts), target)
            obj = compiler.compile_lane(prog, aligned=aligned)
            if prog.target.family == "cdna":
                entry = (obj, prog)                   # the HIP launcher loads and caches it
            else:
                module = cuda.Module.from_compiled(obj, device=index)
                entry = (module.function(prog.name), prog)
            _modules[key] = (kernel, entry)           # the kernel kept alive: id() stays its
        else:
            entry = entry[1]
    code, prog = entry
    check_program_args(prog, bound, kernel)
    check_cluster_grid(prog, grid, kernel)
    if prog.target.family == "cdna":
        from . import hip
        hip.launch(code, prog.name, prog.params, bound, grid=grid, num_waves=prog.num_waves,
                   stream=stream)
        return _Plan(kernel, grid, bound, prog.params, hip_entry=entry)
    block = (prog.num_waves * prog.wave_size, 1, 1)
    packed = cuda.launch(code, prog.params, bound, grid, block, shared_bytes=prog.lds_bytes,
                         stream=stream, align=16 if aligned else None, tmaps=prog.tmaps)
    if packed is None:                                    # nothing to replay
        return None
    kargs, values, buf = packed
    return _Plan(kernel, cuda.dims3(grid, "grid"), bound, prog.params, function=code,
                 block=block, shared=prog.lds_bytes, kargs=kargs, values=values, buf=buf)


def expanded_names(params, bound) -> list[str]:
    """The kernel's parameter names with each pk.peers one replaced by its ABI members
    (`x.p0` ... and `x.rank`, as bind_args expands the pk.Peers)."""
    out = []
    for p in params:
        if p.kind == "peers":
            out += peer_members(p.name, bound) + [f"{p.name}.rank"]
        else:
            out.append(p.name)
    return out


def _signature(kernel, args, kwargs, grid):
    """What a launch's checks and build depend on (see the module docstring), or None where
    the call is not one the fast path takes (numpy arrays, 0-d tensors or numpy numbers as
    scalars, a float or bool in the grid, an argument given twice, ...): those take the
    checked path every time."""
    names = getattr(kernel, "param_names", None)
    torch = sys.modules.get("torch")
    if names is None or torch is None or len(args) > len(names):
        return None
    if type(grid) is int:
        g = grid
    elif type(grid) in (tuple, list) and all(type(x) is int for x in grid):
        g = tuple(grid)
    else:
        return None
    key = [kernel, g]
    consts = {}
    positional = names[:len(args)]
    for k, v in kwargs.items():
        if k not in names:
            consts[k] = v
        elif k in positional:
            return None                      # given twice: the checked path says so
    tensor = torch.Tensor
    params = kernel.params
    for i, name in enumerate(names):
        if i < len(args):
            v = args[i]
        elif name in kwargs:
            v = kwargs[name]
        else:
            return None
        t = type(v)
        if t is int or t is float:
            if t is float and not params[i].type.dtype.is_float:
                return None                  # the checked path says whether it is integral
            key.append(t)
        elif isinstance(v, tensor):
            key.append((v.dtype, v.shape, v.stride(), v.device, v.data_ptr() % 16))
        elif isinstance(v, Peers) and params[i].kind == "peers" and \
                all(isinstance(x, tensor) for x in v.tensors):
            key.append((v.rank, tuple((x.dtype, x.shape, x.stride(), x.device,
                                       x.data_ptr() % 16) for x in v.tensors)))
        else:
            return None
    if consts:
        from ..lang.kernel import const_key
        key.append(const_key(consts))
    return tuple(key)


class _Plan:
    """A checked launch, replayed for calls of the same signature: the argument buffer of
    the checked call with this call's pointers and scalars written in (ABI offsets), and
    the tensor maps of the tensors whose address changed re-encoded. Calling it launches
    and returns True, or returns False (launching nothing) where this call's scalars or
    overlapping tensors need the checked path."""

    def __init__(self, kernel, grid, bound, params, function=None, block=None, shared=0,
                 kargs=(), values=(), buf=b"", hip_entry=None):
        from ..ir import types as T
        from ..ir.abi import FORMAT, offsets
        from .args import memory_span
        self.kernel_names = kernel.param_names
        self.peers = [i for i, p in enumerate(kernel.params) if p.kind == "peers"]
        self.names = expanded_names(kernel.params, bound)
        self.grid, self.hip_entry, self.function = grid, hip_entry, function
        self.block, self.shared = block, shared
        # the argument buffer, rewritten in place by each launch (under the lock: one
        # plan may launch from several threads)
        self.buf, self.lock, self.launcher = None, threading.Lock(), None
        if function is not None:
            from .cuda import ArgBuffer, Launcher
            self.buf = ArgBuffer(buf)
            self.launcher = Launcher(function, grid, block, shared, self.buf)
        self.params = {p.name: p for p in params}
        index = {n: i for i, n in enumerate(self.names)}
        # scalars: (index, the largest magnitude the checks accept)
        self.scalars = [(index[p.name], _F32_MAX if T.dtype_of(p.type.dtype).is_float
                         else None) for p in params if p.kind != "gl"]
        # tensors: (index, bytes from the first element to past the last, layout) for the
        # overlap check (runtime.args.check_overlaps: spans that meet must be one view)
        self.tensors = []
        for p in params:
            if p.kind == "gl":
                v = bound[p.name]
                lo, hi = memory_span(v)
                self.tensors.append((index[p.name], hi - lo,
                                     (str(v.dtype), tuple(v.shape), tuple(v.stride()))))
        # the arguments a launch rewrites — pointers and scalars, each an item of a view
        # of the buffer as words of its type ([view, item, index, is a pointer]), and
        # tensor maps; the rest (sizes, strides) is the same for every launch of the plan
        self.slots, self.tmaps = [], []
        views: dict = {}
        for a, off, v in zip(kargs, offsets(kargs) if kargs else (), values):
            if a.kind in ("ptr", "scalar") and self.buf is not None:
                fmt = FORMAT["ptr" if a.kind == "ptr" else a.dtype]
                size = struct.calcsize(fmt)
                if off % size or sys.byteorder != "little":
                    raise AssertionError(f"argument {a.name} at byte {off} is not a "
                                         f"little-endian {size}-byte word (ir.abi)")
                if fmt not in views:             # the whole buffer as words of the type
                    raw = memoryview(self.buf.data).cast("B")
                    views[fmt] = raw[:len(raw) // size * size].cast(fmt[1:])
                self.slots.append((views[fmt], off // size, index[a.param], a.kind == "ptr"))
            elif a.kind == "tmap":
                # (index, offset, karg, [the address the buffer's map is of, the map's
                # encoder for this geometry]): a launch re-encodes a tensor that moved
                from .cuda import TensorMap
                t = bound[a.param]
                self.tmaps.append((index[a.param], off, a, [t.data_ptr(), TensorMap(
                    t, a.tma, self.params[a.param].type.dtype)]))

    def values(self, args, kwargs) -> list:
        """A call's arguments in ABI order (each pk.Peers as its ranks' tensors, the rank)."""
        vals = list(args) + [kwargs[n] for n in self.kernel_names[len(args):]]
        if self.peers:
            for i in reversed(self.peers):
                v = vals[i]
                vals[i:i + 1] = [*v.tensors, v.rank]
        return vals

    def passes(self, vals) -> bool:
        """The checks that depend on more than the signature (a tensor given as its address,
        an int, counts as that tensor)."""
        for i, limit in self.scalars:
            v = vals[i]
            if limit is None:
                if not -2**31 <= v <= I32_MAX:
                    return False
            elif not -limit <= v <= limit:            # overflow, or inf / nan: checked path
                return False
        if len(self.tensors) > 1:
            spans = sorted((_address(vals[i]), n, i, layout) for i, n, layout in self.tensors)
            end, last = spans[0][0] + spans[0][1], spans[0]
            for s in spans[1:]:
                if s[0] < end and not (s[0] == last[0] and s[3] == last[3] and
                                       s[1] == last[1]):
                    return False                      # overlapping, not the same view
                if s[0] + s[1] > end:
                    end, last = s[0] + s[1], s
        return True

    def __call__(self, args, kwargs, stream) -> bool:
        vals = self.values(args, kwargs)
        if not self.passes(vals):
            return False
        self.launch(vals, stream)
        return True

    def launch(self, vals, stream, addresses: bool = False) -> None:
        """Launch with these arguments (ABI order; tensors given by address where no tensor
        map is made of them), which have passed `passes`. `addresses`: every tensor is
        given by its address (a replayed op call), so none needs converting."""
        if self.hip_entry is not None:
            from . import hip
            code, prog = self.hip_entry
            hip.launch(code, prog.name, prog.params, dict(zip(self.names, vals)),
                       grid=self.grid, num_waves=prog.num_waves, stream=stream)
            return
        launcher = self.launcher
        handle = launcher.current_stream() if stream is None else \
            launcher.stream_handle(stream)
        with self.lock:
            buf = self.buf.data
            if addresses:
                for view, at, i, _ in self.slots:
                    view[at] = vals[i]
            else:
                for view, at, i, ptr in self.slots:
                    v = vals[i]
                    view[at] = v.data_ptr() if ptr and type(v) is not int else v
            for i, off, karg, cell in self.tmaps:
                ptr = _address(vals[i])
                if ptr != cell[0]:                   # the tensor moved: a new map
                    ctypes.memmove(ctypes.addressof(buf) + off, cell[1].encode(ptr), 128)
                    cell[0] = ptr
            launcher(handle)


def _address(v) -> int:
    """A tensor's address, or an address given as an int."""
    return v if type(v) is int else v.data_ptr()
