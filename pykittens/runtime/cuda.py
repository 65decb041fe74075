"""Load cubins (or PTX, through the driver's JIT) with the CUDA driver API and launch them on
PyTorch tensors, on torch's current stream.

Why the driver API (cuda.bindings) and not torch or the runtime API: a cubin from ptxas is a
module, and only cuModuleLoadData / cuLaunchKernel take one without a C++ extension build.

Arguments: the kernel-argument buffer is packed exactly as `ir.abi` lays it out (the
same bytes the HIP launcher passes) and handed to cuLaunchKernel through `extra`
(CU_LAUNCH_PARAM_BUFFER_POINTER / CU_LAUNCH_PARAM_BUFFER_SIZE), so there is one definition
of the layout. Before a function's first launch its parameter layout is read back from the
loaded image (cuFuncGetParamInfo, CUDA 12.4+) and compared with the buffer: a disagreement
between code generation and this launcher is an error, never a launch with shifted arguments.

Every driver call goes through `check`, which raises CudaError naming the call, the CUresult
and what to do about it. Nothing here runs on import: `import pykittens.runtime.cuda` works
on a machine without cuda.bindings or a GPU, and the first driver use raises CudaUnavailable.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import struct
import threading

from ..ir import types as T
from ..ir.abi import KernArg, kernel_args, offsets, pack_arg, tensor_value
from . import args as args_check


class CudaError(RuntimeError):
    pass


# Early launch (CUDA's programmatic dependent launch): a pykittens kernel is launched with
# the attribute that lets the driver start it while the stream's previous kernel finishes;
# its code waits for that kernel first (codegen.nvptx.EARLY_LAUNCH_PROLOGUE), so what each
# kernel reads and writes is ordered as in any stream, and the launch and the workgroups'
# start overlap the previous kernel's tail. PYKITTENS_EARLY_LAUNCH=0 launches as usual.
EARLY_LAUNCH = os.environ.get("PYKITTENS_EARLY_LAUNCH", "1") != "0"


class CudaUnavailable(CudaError):
    """No cuda.bindings package, no NVIDIA driver, or no GPU on this machine."""


# ---- the driver binding ---------------------------------------------------------------------

_DRIVER = None
_INIT = False


def driver():
    """The `cuda.bindings.driver` module (or the pre-12.6 `cuda.cuda` spelling of it)."""
    global _DRIVER
    if _DRIVER is None:
        try:
            from cuda.bindings import driver as d
        except ImportError:
            try:
                from cuda import cuda as d      # cuda-python < 12.6
            except ImportError:
                raise CudaUnavailable(
                    "the CUDA launcher needs NVIDIA's Python driver bindings: "
                    "`pip install cuda-bindings` (or cuda-python)") from None
        _DRIVER = d
    return _DRIVER


_HINTS = {
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin was built for another GPU architecture; "
                                    "compile for this GPU's target or load the PTX instead",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the driver is older than the PTX ISA version; "
                                          "load the cubin from ptxas instead, or update the "
                                          "driver",
    "CUDA_ERROR_INVALID_PTX": "the driver's JIT rejected the PTX; run ptxas on it "
                              "(toolchain.nvptx.assemble) to see the assembler's message",
    "CUDA_ERROR_INVALID_IMAGE": "the bytes are not a cubin, fatbin or PTX this driver accepts",
    "CUDA_ERROR_NOT_FOUND": "no kernel of that name in the module; names are the PTX "
                            "`.entry` names (compile_ir(...)['kernels'])",
    "CUDA_ERROR_INVALID_VALUE": "an argument is out of range: grid/block dimensions, shared "
                                "memory size or the argument buffer",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers x threads per block or too much "
                                          "shared memory; use fewer threads or less smem",
    "CUDA_ERROR_INVALID_CONTEXT": "no CUDA context on this thread; create the module from the "
                                  "thread that launches, after torch has initialised CUDA",
    "CUDA_ERROR_NO_DEVICE": "no NVIDIA GPU is visible (check CUDA_VISIBLE_DEVICES)",
}


def _err_name(d, err) -> str:
    """'CUDA_ERROR_...' for a CUresult (an enum member in cuda.bindings, else an int)."""
    name = getattr(err, "name", None)
    if isinstance(name, str):
        return name
    try:
        name = d.cuGetErrorName(err)[1]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return f"CUresult {int(err)}"


def check(result, call: str):
    """Unwrap a cuda.bindings return tuple (CUresult, *values); raise CudaError naming `call`."""
    if not isinstance(result, tuple):
        result = (result,)
    err, vals = result[0], result[1:]
    if int(err) != 0:
        name = _err_name(_DRIVER, err)
        hint = _HINTS.get(name)
        raise CudaError(f"{call} failed with {name} ({int(err)})" + (f": {hint}" if hint else ""))
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def _init():
    global _INIT
    d = driver()
    if _INIT:
        return d
    try:
        res = d.cuInit(0)
    except Exception as e:       # the binding could not dlopen libcuda.so
        raise CudaUnavailable(f"the NVIDIA driver (libcuda.so) could not be loaded "
                              f"({str(e).rstrip('.')}); "
                              "the CUDA launcher runs only on a machine with an NVIDIA GPU "
                              "and driver") from None
    try:
        check(res, "cuInit")
    except CudaError as e:
        raise CudaUnavailable(f"{e}; the CUDA launcher needs an NVIDIA GPU and driver") from None
    _INIT = True
    return d


_CTX: dict[int, object] = {}
_CTX_LOCK = threading.Lock()


class _RawDriver:
    """The two driver calls a repeated launch makes, called through ctypes on libcuda."""

    def __init__(self, lib):
        self.lib = lib
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.cuLaunchKernel = lib.cuLaunchKernel
        # the same entry point without argtypes, for callers that hand it C values they
        # converted once (Launcher): no conversion of eleven arguments per call
        self.launch_c_values = lib["cuLaunchKernel"]
        try:                            # CUDA 12: launches with attributes (early launch)
            self.launch_ex = lib["cuLaunchKernelEx"]
        except AttributeError:
            self.launch_ex = None
        try:                                       # (the same way: TensorMap.encode)
            self.encode_tiled = lib["cuTensorMapEncodeTiled"]
        except AttributeError:                     # a driver older than Hopper's
            self.encode_tiled = None

    def current(self) -> int:
        """The current context's address (0 where none; -1 on an error). A buffer per
        call: the driver's current context is per thread, and so is the answer."""
        ctx = ctypes.c_void_p()
        if self.lib.cuCtxGetCurrent(ctypes.byref(ctx)):
            return -1
        return ctx.value or 0


_RAW: list = []


def _raw_driver():
    """The ctypes view of libcuda (None where it cannot be loaded)."""
    if not _RAW:
        try:
            _RAW.append(_RawDriver(ctypes.CDLL("libcuda.so.1")))
        except (OSError, AttributeError):
            _RAW.append(None)
    return _RAW[0]


class _OnDevice:
    """Make `device`'s primary context (the one PyTorch uses) current for a block of driver
    calls and restore the caller's context afterwards, so torch's notion of the current
    device is never changed behind its back."""

    def __init__(self, device: int):
        d = _DRIVER if _INIT else _init()          # once initialised: no call (fast path)
        if device not in _CTX:
            with _CTX_LOCK:             # retain each primary context once, from any thread
                if device not in _CTX:
                    n = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
                    if not 0 <= device < n:
                        raise CudaError(f"CUDA device {device} does not exist; this machine "
                                        f"has {n}")
                    dev = check(d.cuDeviceGet(device), "cuDeviceGet")
                    _CTX[device] = check(d.cuDevicePrimaryCtxRetain(dev),
                                         "cuDevicePrimaryCtxRetain")
        self.d, self.ctx, self.pushed = d, _CTX[device], False

    def __enter__(self):
        cur = check(self.d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) != int(self.ctx):
            check(self.d.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True
        return self.d

    def __exit__(self, *exc):
        if self.pushed:
            check(self.d.cuCtxPopCurrent(), "cuCtxPopCurrent")


def _current_device() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


# ---- images, modules, functions -------------------------------------------------------------

def image_kind(image: bytes | str) -> str:
    """'cubin', 'fatbin' or 'ptx' — decided from the bytes, since the driver takes all three
    through cuModuleLoadData and we want to say which one failed."""
    if isinstance(image, str):
        image = image.encode()
    if image[:4] == b"\x7fELF":
        return "cubin"
    if image[:4] == struct.pack("<I", 0xBA55ED50):
        return "fatbin"
    head = image[:4096]
    if b".version" in head and b".target" in head:
        return "ptx"
    raise CudaError("the image is neither a cubin (ELF), a fatbin nor PTX text; pass "
                    "compile_ir(...)['cubin'] or ['ptx']")


class Module:
    """One loaded code object on one device. early_launch=True: each of its kernels waits
    for the stream's previous grids itself (EARLY_LAUNCH), so it may be launched early."""

    def __init__(self, image: bytes | str, *, device: int | None = None,
                 early_launch: bool = False):
        self.kind = image_kind(image)
        self.early_launch = bool(early_launch)
        self.device = _current_device() if device is None else int(device)
        data = image.encode() if isinstance(image, str) else bytes(image)
        if self.kind == "ptx" and not data.endswith(b"\0"):
            data += b"\0"                 # the driver reads PTX as a C string
        self._data = data                 # the driver may read the image lazily
        with _OnDevice(self.device) as d:
            self.handle = check(d.cuModuleLoadData(data), f"cuModuleLoadData ({self.kind})")
        self._functions: dict[str, Function] = {}

    @classmethod
    def from_compiled(cls, result: dict, *, device: int | None = None,
                      prefer: str = "cubin") -> "Module":
        """Load a `toolchain.nvptx.compile_ir` result: the cubin when there is one (and
        `prefer` is 'cubin'), else the PTX through the driver's JIT."""
        if prefer not in ("cubin", "ptx"):
            raise ValueError(f"prefer must be 'cubin' or 'ptx', not {prefer!r}")
        image = result.get("cubin") if prefer == "cubin" else None
        return cls(image if image is not None else result["ptx"], device=device,
                   early_launch=waits_for_previous_grid(result.get("ptx")))

    def context_address(self) -> int:
        """The address of the primary context the module is loaded in."""
        return int(_CTX[self.device])

    def function(self, name: str, kargs: list[KernArg] | None = None) -> "Function":
        if name not in self._functions:
            self._functions[name] = Function(self, name, kargs)
        return self._functions[name]

    def close(self) -> None:
        if getattr(self, "handle", None) is not None:
            with _OnDevice(self.device) as d:
                check(d.cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_UNKNOWN = object()


class Function:
    """A kernel in a loaded module. `kargs` (from ir.abi) lets `launch` take a list of
    plain values and lets the layout check compare every argument, not only the total size."""

    def __init__(self, module: Module, name: str, kargs: list[KernArg] | None = None):
        self.module, self.name, self.kargs = module, name, kargs
        with _OnDevice(module.device) as d:
            self.handle = check(d.cuModuleGetFunction(module.handle, name.encode()),
                                f"cuModuleGetFunction({name!r})")
            A = d.CUfunction_attribute
            self.registers = self._attr(d, A.CU_FUNC_ATTRIBUTE_NUM_REGS)
            self.static_smem = self._attr(d, A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            self.max_threads = self._attr(d, A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
            self._dyn_limit = self._attr(d, A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            dev = check(d.cuDeviceGet(module.device), "cuDeviceGet")
            self._optin = check(d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
            self.sms = check(d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        self._layout, self._abi_checked = _UNKNOWN, None
        self._resident: dict = {}          # (threads, shared bytes) -> workgroups an SM holds

    def launches_early(self, grid, block, shared_bytes: int) -> bool:
        """Whether a launch of this grid may be an early one (EARLY_LAUNCH, which the callers
        check): only code that waits for the previous grids itself, and only grids of more
        workgroups than the GPU holds at once. A grid that fits at once (a persistent walk
        sized to the SMs) is placed, launched early, on SMs as the previous grid leaves
        them, where room for two puts two on the first SMs to free and leaves others idle:
        such walks ran up to a quarter slower on the H200 (docs/PERF.md). Launched as usual
        it finds every SM free; grids larger than that are balanced as they run. (Grids of
        one workgroup an SM cannot pile up, but launched early they ran no faster: the
        GEMM sweep's geometric mean 0.986 against 0.983x cuBLAS, shapes -1.9 to +4.5%.)"""
        if not self.module.early_launch:
            return False
        threads = math.prod(block)
        per_sm = self._resident.get((threads, shared_bytes))
        if per_sm is None:
            with _OnDevice(self.module.device) as d:
                per_sm = check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    self.handle, threads, shared_bytes),
                    f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name!r})")
            self._resident[(threads, shared_bytes)] = per_sm
        return math.prod(grid) > per_sm * self.sms

    def _attr(self, d, attr):
        return check(d.cuFuncGetAttribute(attr, self.handle),
                     f"cuFuncGetAttribute({attr.name}) for {self.name!r}")

    def param_layout(self) -> list[tuple[int, int]] | None:
        """(offset, size) of each parameter as the loaded image has it; None when the driver
        or binding predates cuFuncGetParamInfo (CUDA 12.4)."""
        with _OnDevice(self.module.device) as d:
            if not hasattr(d, "cuFuncGetParamInfo"):
                return None
            out = []
            while True:
                res = d.cuFuncGetParamInfo(self.handle, len(out))
                if int(res[0]) != 0:
                    name = _err_name(d, res[0])
                    if name == "CUDA_ERROR_INVALID_VALUE":      # past the last parameter
                        return out
                    if name == "CUDA_ERROR_NOT_SUPPORTED":
                        return None
                    check(res, f"cuFuncGetParamInfo({self.name!r}, {len(out)})")
                out.append((int(res[1]), int(res[2])))

    def _check_layout(self, nbytes: int) -> None:
        """Every launch: the buffer must cover exactly the image's parameters. Once per kargs
        list: each argument's offset and size must be where ir.abi puts it."""
        if self._layout is _UNKNOWN:
            self._layout = self.param_layout()
        if self._layout is None:
            return
        kargs = self.kargs if self.kargs is not self._abi_checked else None
        check_param_layout(self.name, self._layout, nbytes, kargs)
        self._abi_checked = self.kargs

    def launch(self, grid, block, args: bytes | list = b"", shared_bytes: int = 0,
               stream=None) -> None:
        """Launch asynchronously on `stream` (default: torch's current stream on the module's
        device). `args` is the packed buffer, a list of values in `kargs` order, or a list of
        (dtype, value) pairs with dtype 'ptr', 'i32' or 'f32'."""
        grid, block = dims3(grid, "grid"), dims3(block, "block")
        buf = args_buffer(args, self.kargs)
        threads = math.prod(block)
        if threads > self.max_threads:
            raise CudaError(f"{self.name}: block {block} has {threads} threads but the kernel "
                            f"allows at most {self.max_threads} (registers: {self.registers})")
        shared_bytes = int(shared_bytes)
        if shared_bytes < 0:
            raise ValueError(f"shared_bytes must be >= 0, not {shared_bytes}")
        if self.static_smem + shared_bytes > self._optin:
            raise CudaError(f"{self.name}: {shared_bytes} bytes of dynamic shared memory plus "
                            f"{self.static_smem} static exceed the device's per-block limit of "
                            f"{self._optin} bytes")
        self._check_layout(len(buf))
        with _OnDevice(self.module.device) as d:
            if shared_bytes > self._dyn_limit:
                # Above the default (48 KiB) a kernel must opt in to more dynamic smem.
                A = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                check(d.cuFuncSetAttribute(self.handle, A, shared_bytes),
                      f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={shared_bytes}) "
                      f"for {self.name!r}")
                self._dyn_limit = shared_bytes
        self.launch_checked(grid, block, buf, shared_bytes, stream_handle(stream,
                                                                           self.module.device))

    def launch_checked(self, grid, block, buf, shared_bytes: int, stream: int) -> None:
        """cuLaunchKernel with arguments `launch` has already checked (grid and block as
        3-tuples, the packed buffer or an ArgBuffer, a stream handle): the part of a launch
        that repeats. Straight through libcuda by ctypes where the module's context is
        already current (a few microseconds less than the bindings' argument conversion
        and context check; cuLaunchKernelEx for an early launch, EARLY_LAUNCH), else
        through the bindings under _OnDevice."""
        args = buf if type(buf) is ArgBuffer else ArgBuffer(buf)
        raw = _raw_driver()
        early = False
        if raw is not None and raw.current() == self.module.context_address():
            early = EARLY_LAUNCH and bool(raw.launch_ex) and \
                self.launches_early(grid, block, shared_bytes)
            if early:
                config = LaunchConfig(grid, block, shared_bytes)
                config.stream(stream)
                err = raw.launch_ex(config.pointer, ctypes.c_void_p(int(self.handle)), None,
                                    args.extra)
            else:
                err = raw.cuLaunchKernel(int(self.handle), *grid, *block, shared_bytes,
                                         stream, None, args.extra)
            err = _DRIVER.CUresult(err) if err else 0
        else:            # (an ordinary launch: early launch is only ever a saving)
            with _OnDevice(self.module.device) as d:
                err = d.cuLaunchKernel(self.handle, *grid, *block, shared_bytes,
                                       d.CUstream(stream), None,
                                       ctypes.addressof(args.extra) if args.extra else 0)
        if int(err[0] if isinstance(err, tuple) else err):
            check(err, f"cuLaunchKernel{'Ex' if early else ''}({self.name!r}, grid={grid}, "
                  f"block={block}, shared={shared_bytes})")


class ArgBuffer:
    """A kernel's packed arguments in memory the driver reads, with the `extra` array that
    hands them to cuLaunchKernel: made once by a caller that launches one kernel again and
    again, and rewritten in place (`data`, a writable buffer) before each launch — the
    driver copies the arguments during the call."""

    def __init__(self, packed):
        self.data = ctypes.create_string_buffer(bytes(packed), max(len(packed), 1))
        self._size = ctypes.c_size_t(len(packed))
        self.extra = (ctypes.c_void_p * 5)(
            _BUFFER_POINTER, ctypes.addressof(self.data), _BUFFER_SIZE,
            ctypes.addressof(self._size), _END) if len(packed) else None


class Launcher:
    """One kernel launched again and again with the same grid, block, shared memory and
    ArgBuffer (rewritten in place between launches): the call pk.launch's plans and replayed
    op calls make, early where the function allows it (EARLY_LAUNCH: cuLaunchKernelEx with
    a LaunchConfig made once). Its constant arguments are converted to C values once, and
    it does not ask the driver which context is current: a launch made while another
    context is current (or none) fails without running, and then goes through
    launch_checked, which makes the module's context current or names the error."""

    def __init__(self, function: "Function", grid, block, shared: int, args: ArgBuffer):
        self.function, self.grid, self.block, self.shared = function, grid, block, shared
        self.args = args
        raw = _raw_driver()
        self._call = self._early = self.config = None
        if raw is not None:
            self._call = functools.partial(
                raw.launch_c_values, ctypes.c_void_p(int(function.handle)),
                *(ctypes.c_uint(v) for v in (*grid, *block, shared)))
            if raw.launch_ex and function.launches_early(grid, block, shared):
                self.config = LaunchConfig(grid, block, shared)      # its stream set per call
                self._early = functools.partial(raw.launch_ex, self.config.pointer,
                                                ctypes.c_void_p(int(function.handle)))
        self._extra = ctypes.cast(args.extra, ctypes.c_void_p) if args.extra else None
        device = function.module.device
        self.stream_handle = functools.partial(stream_handle, device=device)
        current = _torch_current_stream()
        self.current_stream = functools.partial(current, device) if current is not None \
            else functools.partial(stream_handle, None, device)

    def __call__(self, stream: int) -> None:
        """Launch on the stream with this handle (an int; 0 is the legacy default)."""
        if self._early is not None and EARLY_LAUNCH:    # the stream goes in the config
            self.config.stream(stream)
            failed = self._early(None, self._extra)
        else:
            failed = self._call is None or self._call(ctypes.c_void_p(stream), None,
                                                      self._extra)
        if failed:
            self.function.launch_checked(self.grid, self.block, self.args, self.shared,
                                         stream)


# ---- early launch: cuLaunchKernelEx's configuration -----------------------------------------

# CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h, CUDA 12)
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the attribute's id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_uint64 * 8)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig: grid and block dims, dynamic shared memory, stream, attributes."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


class LaunchConfig:
    """cuLaunchKernelEx's configuration of an early launch (EARLY_LAUNCH): the grid, block,
    shared memory and the programmatic-stream-serialisation attribute, made once; `stream`
    sets the stream before each call (the driver reads the configuration during it)."""

    def __init__(self, grid, block, shared: int):
        self.attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attribute.value[0] = 1                 # programmaticStreamSerializationAllowed
        self.config = _LaunchConfig(*grid, *block, shared, None,
                                    ctypes.pointer(self.attribute), 1)
        self.pointer = ctypes.byref(self.config)

    def stream(self, handle: int) -> None:
        self.config.hStream = handle or None


def waits_for_previous_grid(ptx) -> bool:
    """Whether every kernel of this PTX waits for the stream's previous grids before it does
    anything (codegen.nvptx.EARLY_LAUNCH_PROLOGUE): only such code may be launched early."""
    if not ptx:
        return False
    from ..codegen.nvptx import EARLY_LAUNCH_PROLOGUE
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    entries = text.count(".entry ")
    return entries > 0 and text.count(EARLY_LAUNCH_PROLOGUE[-1]) >= entries


# ---- pure helpers (tested on the CPU) -------------------------------------------------------

# The `extra` markers, as cuda.h defines them: CU_LAUNCH_PARAM_END ((void*)0x00),
# CU_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01), CU_LAUNCH_PARAM_BUFFER_SIZE ((void*)0x02).
# Spelled out because older bindings expose them as opaque pointer objects, not ints.
_END, _BUFFER_POINTER, _BUFFER_SIZE = 0, 1, 2


def dims3(v, what: str) -> tuple[int, int, int]:
    """int or up-to-3 tuple -> (x, y, z), each a positive int (runtime.args.check_grid)."""
    t = args_check.check_grid(v, what=what)
    return t + (1,) * (3 - len(t))


def pack_values(pairs) -> bytes:
    """[(dtype, value)] -> the argument buffer, each at its natural alignment (ir.abi)."""
    kargs = [KernArg(f"arg{i}", f"arg{i}", "scalar", dt, 8 if dt == "ptr" else 4)
             for i, (dt, _) in enumerate(pairs)]
    return pack(kargs, [v for _, v in pairs])


def pack(kargs: list[KernArg], values: list) -> bytes:
    """Pack values for `kargs` (ir.abi.kernel_args) into the kernel-argument buffer."""
    if len(values) != len(kargs):
        raise ValueError(f"{len(kargs)} kernel arguments ({', '.join(a.name for a in kargs)})"
                         f" but {len(values)} values")
    offs = offsets(kargs)
    buf = bytearray(offs[-1] + kargs[-1].size if kargs else 0)
    for a, off, v in zip(kargs, offs, values):
        pack_arg(buf, a, off, v)
    return bytes(buf)


def args_buffer(args, kargs: list[KernArg] | None) -> bytes:
    if isinstance(args, (bytes, bytearray, memoryview)):
        return bytes(args)
    args = list(args)
    if args and all(isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)
                    for a in args):
        return pack_values(args)
    if kargs is None:
        raise TypeError("launch args must be the packed buffer (bytes), (dtype, value) pairs, "
                        "or plain values for a Function created with kargs=")
    return pack(kargs, args)


def check_param_layout(name: str, layout: list[tuple[int, int]], nbytes: int,
                       kargs: list[KernArg] | None = None) -> None:
    """Compare the image's parameter layout with the buffer the launcher built."""
    end = max((o + s for o, s in layout), default=0)
    if kargs is not None:
        want = list(zip(offsets(kargs), (a.size for a in kargs)))
        if want != layout:
            raise CudaError(f"{name}: the kernel image has parameters at (offset, size) "
                            f"{layout} but ir.abi lays out {want} for "
                            f"{[a.name for a in kargs]}; code generation and the launcher "
                            "disagree on the kernel-argument ABI")
    if end != nbytes:
        raise CudaError(f"{name}: the kernel's {len(layout)} parameters take {end} bytes "
                        f"(offset, size: {layout}) but the argument buffer has {nbytes}; "
                        "pass exactly the kernel's parameters, packed per ir.abi")


def _torch_current_stream():
    """torch's current raw stream of a device as a function of the device index (the
    handle as an int, no Stream object made), or None without torch or that function."""
    try:
        import torch
    except ImportError:
        return None
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(stream, device: int) -> int:
    """A CUstream handle as an int: None -> torch's current stream on `device` (0, the
    legacy default stream, without torch); a torch.cuda.Stream; a CUstream; or an int."""
    if stream is None:
        raw = _torch_current_stream()
        if raw is not None:
            return int(raw(device))
        try:
            import torch
        except ImportError:
            return 0
        return int(torch.cuda.current_stream(device).cuda_stream)
    if hasattr(stream, "cuda_stream"):
        s_dev = getattr(getattr(stream, "device", None), "index", None)
        if s_dev is not None and s_dev != device:
            raise CudaError(f"the stream is on cuda:{s_dev} but the module is loaded on "
                            f"cuda:{device}")
        return int(stream.cuda_stream)
    if hasattr(stream, "getPtr"):
        return int(stream.getPtr())
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise TypeError(f"stream must be None, a torch.cuda.Stream, a CUstream or an int handle, "
                    f"not {type(stream).__name__}")


def check_tensor(t, *, name: str = "tensor", dtype=None, rank: int | None = None,
                 device: int | None = None, align: int | None = 16) -> None:
    """Reject what would make a kernel read garbage: a tensor not on the GPU or on another
    GPU, the wrong element type or rank, an inner dimension that is not contiguous, strides
    or sizes beyond the ABI's i32, or a pointer that breaks `align`-byte vector loads.
    The rules are runtime.args.check_tensor's, shared with HIP and the emulator."""
    if not (hasattr(t, "data_ptr") and hasattr(t, "stride") and hasattr(t, "shape")):
        raise args_check.fail(f"{name} must be a torch tensor, not {type(t).__name__}")
    args_check.check_tensor(t, name=name, dtype=dtype, rank=rank, device="cuda",
                            device_index=device, align=align)


def kernel_arg_values(params, bound: dict, *, device: int | None = None,
                      align: int | None = 16, tmaps=()) -> tuple[list[KernArg], list]:
    """Check each tensor and scalar of `bound` against the kernel's `params` and return the
    ABI argument list with its values (pointer, sizes, strides in elements, scalars, and
    the encoded tensor maps of `tmaps`)."""
    kargs = kernel_args(params, tmaps)
    by_name = {p.name: p for p in params}
    tma = {t.param for t in tmaps}
    remote = args_check.remote_peers(bound)
    for p in params:
        if p.name not in bound:
            raise args_check.fail(f"missing kernel argument {p.name!r}")
        if p.kind == "gl":
            if not (hasattr(bound[p.name], "data_ptr") and hasattr(bound[p.name], "stride")):
                raise args_check.fail(f"argument {p.name!r} must be a torch tensor, not "
                                      f"{type(bound[p.name]).__name__}")
            args_check.check_tensor(bound[p.name], name=f"argument {p.name!r}",
                                    dtype=p.type.dtype, rank=p.type.rank, shape=p.type.shape,
                                    device="cuda",
                                    device_index=None if p.name in remote else device,
                                    align=align,
                                    tma=p.name in tma)
        else:
            args_check.check_scalar(bound[p.name], f"argument {p.name!r}", p.type.dtype)
    args_check.check_overlaps({p.name: bound[p.name] for p in params if p.kind == "gl"})
    values = []
    for a in kargs:
        v = bound[a.param]
        if a.kind in ("ptr", "size", "stride"):
            values.append(tensor_value(a, v))
        elif a.kind == "tmap":
            values.append(encode_tensor_map(v, a.tma, by_name[a.param].type.dtype))
        else:
            values.append(args_check.check_scalar(v, f"argument {a.name!r}",
                                                  by_name[a.param].type.dtype))
    return kargs, values


_INVALID_CONTEXT = 201          # cuda.h: CUDA_ERROR_INVALID_CONTEXT


def encode_tensor_map(t, desc, dtype) -> bytes:
    """The 128-byte CUtensorMap (cuTensorMapEncodeTiled) for TMA copies of `desc.box` tiles
    (the last two dims; one element of the others) of tensor `t`, which may be a strided
    view (e.g. (B, H, N, D) of a (B, N, H, D) tensor): elements outside it read as zero;
    128B swizzle when the shared tile is swizzled."""
    return TensorMap(t, desc, dtype).encode(t.data_ptr())


_TMAP_KINDS = {"bf16": "BFLOAT16", "f16": "FLOAT16", "f32": "FLOAT32", "i32": "INT32"}


class TensorMap:
    """cuTensorMapEncodeTiled's arguments for one tensor geometry (shape, strides, element
    type) and box, all but the address: made once, so that a launch replayed on a tensor
    of that geometry somewhere else re-encodes its map from the new address alone (through
    libcuda by ctypes where it loads, the arguments converted once; else the bindings).
    The maps of the last few addresses are kept: a replayed op's outputs come back at the
    same few addresses from torch's caching allocator, and a map is a function of the
    geometry and the address alone."""

    RECENT = 4                      # maps kept per geometry, the oldest dropped first

    def __init__(self, t, desc, dtype):
        self._recent: dict[int, bytes] = {}
        d = driver()
        esz = T.dtype_of(dtype).bytes
        rank = t.dim()
        sizes = [int(x) for x in reversed(t.shape)]                   # innermost first
        strides = [int(t.stride(i)) * esz for i in reversed(range(rank - 1))]
        if any(b % 16 for b in strides) or t.stride(rank - 1) != 1:
            raise ValueError(f"TMA needs a 16-byte aligned tensor with unit stride in its "
                             f"last dim and other strides of a multiple of 16 bytes; this one "
                             f"has strides {tuple(t.stride())} of {esz}-byte elements")
        box = [desc.box[1], desc.box[0]] + [1] * (rank - 2)
        kind = _TMAP_KINDS.get(T.dtype_of(dtype).name, "UINT8")
        self.enums = (getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{kind}"),
                      d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                      getattr(d.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_128B"
                              if desc.swizzle128 else "CU_TENSOR_MAP_SWIZZLE_NONE"),
                      d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                      d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        self.rank, self.sizes, self.strides, self.box = rank, sizes, strides, box
        self.device = t.device.index or 0
        raw = _raw_driver()
        self._c = None
        if raw is not None and raw.encode_tiled is not None:
            c = ctypes
            dt, interleave, swizzle, l2, oob = (c.c_int(int(e)) for e in self.enums)
            self._mem = c.create_string_buffer(128 + 64)   # CUtensorMap is 64-byte aligned
            self._out = (c.addressof(self._mem) + 63) & ~63
            self._c = (raw.encode_tiled, c.c_void_p(self._out), dt, c.c_uint(rank),
                       (c.c_uint64 * rank)(*sizes), (c.c_uint64 * max(rank - 1, 1))(*strides),
                       (c.c_uint32 * rank)(*box), (c.c_uint32 * rank)(*[1] * rank),
                       interleave, swizzle, l2, oob)

    def encode(self, address: int) -> bytes:
        """The 128-byte map of a tensor of this geometry at `address`."""
        got = self._recent.get(address)
        if got is None:
            got = self._encode(address)
            if len(self._recent) >= self.RECENT:
                del self._recent[next(iter(self._recent))]
            self._recent[address] = got
        return got

    def _encode(self, address: int) -> bytes:
        if address % 16:
            raise ValueError(f"TMA needs a 16-byte aligned tensor; this one is at "
                             f"{address:#x}")
        if self._c is not None:
            fn, out, dt, rank, *arrays = self._c
            if not fn(out, dt, rank, ctypes.c_void_p(address), *arrays):
                return ctypes.string_at(self._out, 128)
        return self._encode_bound(address)    # no libcuda, or an error for check to name

    def _encode_bound(self, address):
        d = driver()
        u32, u64 = d.cuuint32_t, d.cuuint64_t      # the bindings want the typed integers
        dt, interleave, swizzle, l2, oob = self.enums

        def encode():
            return d.cuTensorMapEncodeTiled(
                dt, u32(self.rank), address, [u64(x) for x in self.sizes],
                [u64(x) for x in self.strides], [u32(x) for x in self.box],
                [u32(1)] * self.rank, interleave, swizzle, l2, oob)
        err, tmap = encode()
        if int(err) == _INVALID_CONTEXT:
            # no context current on this thread (autograd's backward threads, when a
            # pykittens kernel is their first CUDA work): encode in the tensor's device's
            # primary context
            with _OnDevice(self.device):
                err, tmap = encode()
        check((err,), "cuTensorMapEncodeTiled")
        return ctypes.string_at(int(tmap.getPtr()), 128)


def launch(function: Function, params, bound: dict, grid, block, *, shared_bytes: int = 0,
           stream=None, align: int | None = 16, tmaps=()) -> tuple[list[KernArg], list, bytes]:
    """Check `bound` (name -> tensor/scalar) against `params`, pack per ir.abi, launch.
    Returns the ABI arguments, their values and the packed buffer (pk.launch keeps them to
    replay the launch for calls of the same signature)."""
    kargs, values = kernel_arg_values(params, bound, device=function.module.device,
                                      align=align, tmaps=tmaps)
    if function.kargs is None:
        function.kargs = kargs
    buf = pack(kargs, values)
    function.launch(grid, block, buf, shared_bytes=shared_bytes, stream=stream)
    return kargs, values, buf

