"""Load a code object and launch its kernel on PyTorch ROCm tensors, through the HIP module
API (libamdhip64.so over ctypes: hipModuleLoadData, hipModuleGetFunction,
hipModuleLaunchKernel).

Arguments go in one buffer passed with HIP_LAUNCH_PARAM_BUFFER_POINTER/SIZE ("extra"), laid
out by runtime/abi.py. Before anything is sent, the layout (offset, size, kind and, where the
code object records it, name) is checked against the code object's own `.args` metadata — the
table the HIP runtime itself uses — so a disagreement between code generation and this
packer is an error here, not garbage on the GPU.

Hidden arguments: the buffer is sized to `.kernarg_segment_size` and everything past the
explicit arguments is zero. ROCm's runtime (ROCclr) writes the hidden_* values it knows
(block counts, group sizes, remainders, global offsets, grid dims, heap/hostcall/queue
pointers) into the kernarg segment it builds at dispatch, from the same metadata; HIP copies
only the explicit arguments out of this buffer. So nothing hidden is filled here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import sys
import threading

from .. import targets
from ..analysis.hsaco import kernel as kernel_info
from ..analysis.hsaco import metadata
from .abi import KernArg, kernel_args, offsets, pack_arg, tensor_value
from .args import check_grid, check_overlaps, check_tensor

NO_HIP = ("no HIP runtime found (libamdhip64.so); pykittens launches CDNA kernels only on a "
          "ROCm machine — use pk.emulate on this machine")

HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03

_KIND = {"ptr": ("global_buffer",), "size": ("by_value",), "stride": ("by_value",),
         "scalar": ("by_value",)}


class HipError(RuntimeError):
    pass


class KernargMismatch(RuntimeError):
    """pykittens' argument layout disagrees with the code object's metadata: a bug in code
    generation or in runtime/abi.py, never in the caller's arguments."""


# ----------------------------------------------------------------------------- packing

def pack_kernargs(args: list[KernArg], values: dict, metadata_args: list[dict], *,
                  segment_size: int | None = None) -> bytes:
    """The kernel-argument buffer for `args` (from abi.kernel_args), after checking that each
    argument's offset and size match the code object's `.args` (hidden_* entries excluded).

    `values` maps a gl parameter's name to a tensor (anything with data_ptr(), shape and
    stride(), e.g. a torch tensor) or to a device address (int) with its sizes and strides
    given by argument name ("x.size0", "x.stride1"); a scalar parameter's name maps to a
    number. The buffer is `segment_size` bytes (pass `.kernarg_segment_size`), at least the
    extent of all metadata arguments; hidden arguments are left zero (see module docstring).
    """
    explicit = [m for m in metadata_args if not str(m[".value_kind"]).startswith("hidden_")]
    if len(explicit) != len(args):
        raise KernargMismatch(
            f"the code object declares {len(explicit)} explicit kernel arguments but the "
            f"pykittens ABI has {len(args)} ({', '.join(a.name for a in args)})")
    offs = offsets(args)
    for i, (a, off, m) in enumerate(zip(args, offs, explicit)):
        if (m[".offset"], m[".size"]) != (off, a.size):
            raise KernargMismatch(
                f"kernel argument {a.name!r}: the pykittens ABI puts it at offset {off} "
                f"size {a.size}, the code object at offset {m['.offset']} size {m['.size']}")
        if ".name" in m and m[".name"] != a.name:
            raise KernargMismatch(f"kernel argument {i} is "
                                  f"{a.name!r} in the pykittens ABI but {m['.name']!r} in the "
                                  "code object")
        if m[".value_kind"] not in _KIND[a.kind]:
            raise KernargMismatch(f"kernel argument {a.name!r} ({a.kind}) is a "
                                  f"{m['.value_kind']} in the code object")
    extent = max((m[".offset"] + m[".size"] for m in metadata_args), default=0)
    size = extent if segment_size is None else segment_size
    if size < extent:
        raise KernargMismatch(f"kernarg segment of {size} bytes is smaller than the "
                              f"{extent} bytes its arguments span")
    buf = bytearray(size)
    for a, off in zip(args, offs):
        pack_arg(buf, a, off, _value(a, values))
    return bytes(buf)


def _value(a: KernArg, values: dict):
    if a.name in values and not (a.kind == "ptr" and _is_tensor(values[a.name])):
        return values[a.name]
    if a.param in values and _is_tensor(values[a.param]):
        return tensor_value(a, values[a.param])
    raise KeyError(f"no value for kernel argument {a.name!r}: pass a tensor as "
                   f"{a.param!r}" + ("" if a.kind == "scalar" else
                                     f", or an address and {a.name!r}"))


def _is_tensor(v) -> bool:
    return hasattr(v, "data_ptr") and hasattr(v, "stride") and hasattr(v, "shape")


# ----------------------------------------------------------------------------- HIP

_HIP = None


def hip_library_candidates() -> list[str]:
    """$PYKITTENS_HIP_LIB alone when set; else torch's bundled copy (ROCm wheels ship one),
    the loader's search path, then $ROCM_PATH/lib and /opt/rocm/lib."""
    env = os.environ.get("PYKITTENS_HIP_LIB")
    if env:
        return [env]
    out = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.version, "hip", None):
        out.append(os.path.join(os.path.dirname(torch.__file__), "lib", "libamdhip64.so"))
    found = ctypes.util.find_library("amdhip64")
    out += [found] if found else []
    out.append("libamdhip64.so")
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root:
            out.append(os.path.join(root, "lib", "libamdhip64.so"))
    return out


def hip_runtime() -> ctypes.CDLL:
    global _HIP
    if _HIP is not None:
        return _HIP
    for path in hip_library_candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        vp, u32 = ctypes.c_void_p, ctypes.c_uint
        lib.hipGetErrorString.restype = ctypes.c_char_p
        lib.hipGetErrorString.argtypes = [ctypes.c_int]
        lib.hipModuleLoadData.argtypes = [ctypes.POINTER(vp), vp]
        lib.hipModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.hipModuleUnload.argtypes = [vp]
        lib.hipModuleLaunchKernel.argtypes = [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp,
                                              vp]
        lib.hipGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        _HIP = lib
        return lib
    raise HipError(NO_HIP)


def _check(lib, err: int, what: str):
    if err != 0:
        raise HipError(f"{what} failed: {lib.hipGetErrorString(err).decode()} (hipError {err})")


class HipModule:
    """A code object loaded on the current HIP device."""

    def __init__(self, hsaco: bytes):
        self.lib = hip_runtime()
        self._image = ctypes.create_string_buffer(bytes(hsaco), len(hsaco))
        self.handle = ctypes.c_void_p()
        _check(self.lib, self.lib.hipModuleLoadData(ctypes.byref(self.handle), self._image),
               "hipModuleLoadData")
        self._functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self._functions:
            f = ctypes.c_void_p()
            _check(self.lib, self.lib.hipModuleGetFunction(ctypes.byref(f), self.handle,
                                                           name.encode()),
                   f"hipModuleGetFunction({name!r})")
            self._functions[name] = f
        return self._functions[name]

    def launch(self, name: str, kernargs: bytes, grid: tuple[int, int, int],
               block: tuple[int, int, int], *, dynamic_lds_bytes: int = 0, stream=None):
        """`grid` counts workgroups (as in hipModuleLaunchKernel), `block` work-items."""
        buf = ctypes.create_string_buffer(kernargs, max(len(kernargs), 1))
        size = ctypes.c_size_t(len(kernargs))
        extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER,
                                      ctypes.addressof(buf),
                                      HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                                      HIP_LAUNCH_PARAM_END)
        _check(self.lib, self.lib.hipModuleLaunchKernel(
            self.function(name), *grid, *block, dynamic_lds_bytes, ctypes.c_void_p(stream or 0),
            None, extra), f"hipModuleLaunchKernel({name!r})")

    def __del__(self):
        if getattr(self, "handle", None) and self.handle.value:
            try:
                self.lib.hipModuleUnload(self.handle)
            except Exception:       # at interpreter exit the runtime may already be gone
                pass


_MODULES: dict[tuple[str, int], HipModule] = {}
_LOCK = threading.Lock()


def load(hsaco: bytes) -> HipModule:
    """The module for this code object on the current device, loaded once per process
    (whichever thread asks first)."""
    lib = hip_runtime()
    dev = ctypes.c_int()
    _check(lib, lib.hipGetDevice(ctypes.byref(dev)), "hipGetDevice")
    key = (hashlib.sha256(hsaco).hexdigest(), dev.value)
    with _LOCK:
        if key not in _MODULES:
            _MODULES[key] = HipModule(hsaco)
        return _MODULES[key]


def launch(hsaco: bytes, kernel_name: str, params, values: dict, *, grid, num_waves: int,
           dynamic_lds_bytes: int = 0, stream=None) -> None:
    """Launch `kernel_name` with `grid` workgroups (int or up to 3 ints) of `num_waves`
    waves. Tensors must be on the GPU; the launch goes on torch's current stream of their
    device unless `stream` (a hipStream_t as int) is given."""
    info = kernel_info(hsaco, kernel_name)
    target = targets.get(metadata(hsaco)["amdhsa.target"].split("--")[-1].split(":")[0])
    block = num_waves * info.wavefront_size
    if not 1 <= block <= info.max_flat_workgroup_size:
        raise ValueError(f"{kernel_name} was compiled for at most "
                         f"{info.max_flat_workgroup_size // info.wavefront_size} waves per "
                         f"workgroup, not {num_waves}")
    lds = info.group_segment_fixed_size + dynamic_lds_bytes
    if lds > target.lds_bytes_per_workgroup:
        raise ValueError(f"{kernel_name} needs {lds} bytes of LDS per workgroup "
                         f"({dynamic_lds_bytes} dynamic); {target.name} has "
                         f"{target.lds_bytes_per_workgroup}")
    grid3 = check_grid(grid)
    grid3 = grid3 + (1,) * (3 - len(grid3))
    # the rules pk.launch and the emulator apply (runtime.args): device, element type,
    # rank, unit last stride (the generated code assumes it), i32 sizes and strides
    by_name = {p.name: p for p in params}
    tensors = {p: v for p, v in values.items() if _is_tensor(v)}
    for p, v in tensors.items():
        param = by_name.get(p)
        gl = param is not None and param.kind == "gl"
        check_tensor(v, name=f"argument {p!r}", device="cuda",
                     dtype=param.type.dtype if gl and hasattr(v, "dtype") else None,
                     rank=param.type.rank if gl else None,
                     shape=param.type.shape if gl else None)
    check_overlaps(tensors)
    devices = {str(v.device) for v in tensors.values() if hasattr(v, "device")}
    if len(devices) > 1:
        raise ValueError(f"the tensors are on different GPUs ({', '.join(sorted(devices))}); "
                         "put them on one")
    kernargs = pack_kernargs(kernel_args(params), values, list(info.args),
                             segment_size=info.kernarg_segment_size)
    hip_runtime()
    device = next((v.device for v in tensors.values() if hasattr(v, "device")), None)
    if device is not None:
        import torch
        with torch.cuda.device(device):
            s = stream if stream is not None else torch.cuda.current_stream(device).cuda_stream
            load(hsaco).launch(kernel_name, kernargs, grid3, (block, 1, 1),
                               dynamic_lds_bytes=dynamic_lds_bytes, stream=s)
    else:
        load(hsaco).launch(kernel_name, kernargs, grid3, (block, 1, 1),
                           dynamic_lds_bytes=dynamic_lds_bytes, stream=stream)


__all__ = ["HipError", "HipModule", "KernargMismatch", "NO_HIP", "hip_runtime", "launch",
           "load", "pack_kernargs"]
