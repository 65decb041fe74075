"""`pk.launch`: run a kernel on the GPU that holds its tensors (CUDA: sm_90a; ROCm: gfx942 /
gfx950, through HIP), compiling on first use. Code objects are cached on disk by the
toolchain and loaded modules in memory per (kernel, constants, alignment, device)."""
from __future__ import annotations

import threading

from ..ir.errors import KernelError
from .args import bind_args, check_grid, check_kernel, check_program_args, fail

_modules: dict = {}
_lock = threading.Lock()
ALIGN_ELEMS = 16          # strides divisible by this many elements allow 16-byte vectors


def _aligned(bound: dict) -> bool:
    """True when every tensor starts 16-byte aligned and its non-last strides are multiples
    of 16 elements: the build that uses aligned vector accesses is then valid."""
    for v in bound.values():
        if hasattr(v, "data_ptr"):
            if v.data_ptr() % 16 or any(s % ALIGN_ELEMS for s in v.stride()[:-1]):
                return False
    return True


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
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise fail(f"the tensors are on different GPUs ({', '.join(devices)}); put them on "
                   "one", kernel)
    dev = tensors[0].device
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
    if prog.target.family == "cdna":
        from . import hip
        hip.launch(code, prog.name, prog.params, bound, grid=grid, num_waves=prog.num_waves,
                   stream=stream)
        return None
    cuda.launch(code, prog.params, bound, grid, (prog.num_waves * prog.wave_size, 1, 1),
                shared_bytes=prog.lds_bytes, stream=stream, align=16 if aligned else None,
                tmaps=prog.tmaps)
    return None
