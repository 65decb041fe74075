"""A dispatch on the emulated GPU: tensors placed in emulated global memory, the
kernel-argument segment built as the HIP launcher builds it (runtime.hip.pack_kernargs,
checked against the code object's metadata) plus the code-object-v5 hidden arguments the
runtime would write, then every workgroup of the grid run to completion."""
from __future__ import annotations

import struct

import numpy as np

from ..runtime.abi import kernel_args
from ..runtime.hip import pack_kernargs
from .machine import Run, program
from .state import ISAError, Memory

ALIGN_ELEMS = 16       # a padded row pitch: what runtime.launch calls aligned strides


class _Tensor:
    """What the kernel-argument packer reads of a tensor: its device address, shape and
    strides (in elements)."""

    def __init__(self, addr: int, shape, strides):
        self.addr, self.shape, self._strides = addr, tuple(shape), tuple(strides)

    def data_ptr(self) -> int:
        return self.addr

    def stride(self, axis=None):
        return self._strides if axis is None else self._strides[axis]


def strides_for(shape, pad_rows: bool) -> tuple[int, ...]:
    """Element strides: C order, or with the row pitch (the stride of the second-to-last
    axis) rounded up to a multiple of ALIGN_ELEMS, as a padded allocation would have."""
    st, acc = [], 1
    for i in range(len(shape) - 1, -1, -1):
        if pad_rows and i == len(shape) - 2:
            acc = -(-acc // ALIGN_ELEMS) * ALIGN_ELEMS
        st.append(acc)
        acc *= shape[i]
    return tuple(reversed(st))


def aligned(tensors: dict[str, np.ndarray], pad_rows: bool) -> bool:
    """Whether the build with aligned vector accesses is valid for these tensors (every
    non-last stride a multiple of ALIGN_ELEMS; allocations are 64 KiB aligned)."""
    return all(all(s % ALIGN_ELEMS == 0 for s in strides_for(a.shape, pad_rows)[:-1])
               for a in tensors.values())


def _view(data: np.ndarray, dtype, shape, strides):
    """The tensor's elements in `data`, as unsigned integers of the element's size (numpy
    cannot stride the ml_dtypes float types directly)."""
    esz = np.dtype(dtype).itemsize
    return np.lib.stride_tricks.as_strided(data.view(f"<u{esz}"), shape,
                                           tuple(s * esz for s in strides))


_HIDDEN_U32 = ("hidden_block_count_x", "hidden_block_count_y", "hidden_block_count_z")
_HIDDEN_U16 = ("hidden_group_size_x", "hidden_group_size_y", "hidden_group_size_z")


def _hidden(buf: bytearray, metadata_args, grid, workgroup_size):
    """Code object v5 hidden arguments the HIP runtime writes at dispatch (AMDGPUUsage,
    "Code Object V5 Metadata", hidden_*): block counts, group sizes, zero remainders
    (uniform workgroups) and offsets, the grid's dimensions; anything else (printf
    buffer, queue and heap pointers) stays zero."""
    for m in metadata_args:
        kind, off = m[".value_kind"], m[".offset"]
        if kind in _HIDDEN_U32:
            struct.pack_into("<I", buf, off, grid[_HIDDEN_U32.index(kind)])
        elif kind in _HIDDEN_U16:
            size = (workgroup_size, 1, 1)[_HIDDEN_U16.index(kind)]
            struct.pack_into("<H", buf, off, size)
        elif kind == "hidden_grid_dims":
            struct.pack_into("<H", buf, off, 3)


def run(hsaco: bytes, target: str, params, args: dict, grid, num_waves: int, *,
        kernel: str | None = None, pad_rows: bool = False, check_hazards: bool = True,
        check_waits: bool = True) -> dict:
    """Run `kernel` of the code object over `grid` workgroups of `num_waves` waves.

    `params` are the kernel's parameters (the lane program's), `args` maps each to a
    numpy array or a number. Tensors are copied into emulated memory (C order, or with
    padded rows); returns every tensor after the run, by parameter name. Wait-state
    hazards and registers read before their loads were waited for are errors unless
    switched off."""
    from ..runtime.args import check_grid
    prog = program(hsaco, target, kernel)
    grid = check_grid(grid)
    grid3 = grid + (1,) * (3 - len(grid))
    wave = prog.info.wavefront_size
    if num_waves * wave > prog.info.max_flat_workgroup_size:
        raise ValueError(f"{prog.name} was compiled for at most "
                         f"{prog.info.max_flat_workgroup_size // wave} waves per "
                         f"workgroup, not {num_waves}")
    mem = Memory()
    values, tensors, placed = {}, {}, {}
    for p in params:
        if p.name not in args:
            raise ValueError(f"no value for kernel argument {p.name!r}")
        v = args[p.name]
        if p.kind != "gl":
            values[p.name] = v.item() if isinstance(v, np.generic) else v
            continue
        a = np.asarray(v)
        key = (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str) \
            if a.size else id(v)
        if key in placed:              # the same array under two names: one allocation,
            tensors[p.name] = tensors[placed[key]]          # as on the GPU
            values[p.name] = values[placed[key]]
            continue
        placed[key] = p.name
        strides = strides_for(a.shape, pad_rows)
        extent = sum((d - 1) * s for d, s in zip(a.shape, strides)) + 1 if a.size else 0
        addr = mem.alloc(extent * a.dtype.itemsize, p.name)
        if a.size:
            data = mem.region(addr)[1]
            _view(data[:extent * a.dtype.itemsize], a.dtype, a.shape, strides)[...] = \
                np.ascontiguousarray(a).view(f"<u{a.dtype.itemsize}")
        tensors[p.name] = (addr, a.dtype, a.shape, strides, extent)
        values[p.name] = _Tensor(addr, a.shape, strides)
    info = prog.info
    kernargs = bytearray(pack_kernargs(kernel_args(params), values, list(info.args),
                                       segment_size=info.kernarg_segment_size))
    _hidden(kernargs, info.args, grid3, num_waves * wave)
    karg = mem.alloc(len(kernargs), "kernarg segment")
    mem.region(karg)[1][:len(kernargs)] = np.frombuffer(bytes(kernargs), np.uint8)
    dispatch = 0
    if prog.kd.enabled("dispatch_ptr"):
        dispatch = mem.alloc(64, "dispatch packet")
        pkt = bytearray(64)
        struct.pack_into("<HHHHHHIIIII", pkt, 0, 0, 3, num_waves * wave, 1, 1, 0,
                         grid3[0] * num_waves * wave, grid3[1], grid3[2], 0,
                         prog.kd.group_segment_fixed_size)
        struct.pack_into("<Q", pkt, 40, karg)
        mem.region(dispatch)[1][:64] = np.frombuffer(bytes(pkt), np.uint8)
    r = Run(prog, mem, karg, grid3, num_waves, dispatch, check_hazards, check_waits)
    with np.errstate(all="ignore"):
        for z in range(grid3[2]):
            for y in range(grid3[1]):
                for x in range(grid3[0]):
                    r.run_workgroup((x, y, z))
    out = {}
    for name, (addr, dtype, shape, strides, extent) in tensors.items():
        data = mem.region(addr)[1]
        out[name] = (np.array(_view(data[:extent * np.dtype(dtype).itemsize], dtype, shape,
                                    strides)).view(dtype) if extent else np.zeros(shape, dtype))
    return out


def emulate(kernel, *args, grid, target: str = "gfx950", pad_rows: bool = False,
            check_hazards: bool = True, **kwargs) -> dict:
    """Compile `kernel` for `target` (gfx942 or gfx950) and run its code object on the
    instruction-level emulator; arguments as for pk.emulate, results likewise (every
    global tensor after the run, by parameter name; the inputs are not modified)."""
    from .. import compiler
    from ..lower import lower
    from ..runtime.args import bind_args, check_grid, check_kernel, check_program_args
    from ..targets import get as get_target
    check_kernel(kernel, "isa.emulate")
    t = get_target(target)
    if t.family != "cdna":
        raise ValueError(f"the ISA emulator runs AMD code objects (gfx942, gfx950), not "
                         f"{t.name}; use pk.emulate(..., isa=False) for {t.name}")
    bound, consts = bind_args(kernel, args, kwargs)
    check_grid(grid, kernel)
    prog = lower(kernel.specialize(**consts), t)
    check_program_args(prog, bound, kernel)
    arrays = {k: np.asarray(v) for k, v in bound.items() if not np.isscalar(v)}
    obj = compiler.compile_lane(prog, aligned=aligned(arrays, pad_rows))
    return run(obj, t.name, prog.params, bound, grid, prog.num_waves, kernel=prog.name,
               pad_rows=pad_rows, check_hazards=check_hazards)


__all__ = ["ISAError", "aligned", "emulate", "run", "strides_for"]
