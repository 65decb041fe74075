"""The pipeline in one place: kernel -> tile IR -> lane IR -> LLVM IR -> code object, one
function per stage so each artifact can be printed (`pykittens compile --emit ...`)."""
from __future__ import annotations

from .ir.errors import NotSupportedYet
from .ir.printer import format_kernel
from .lower import lower
from .lower.printer import format_lane
from .targets import get as get_target

STAGES = ("tile", "lane", "llvm", "asm")


def tile_ir(kernel, **consts):
    from .lang.kernel import require_kernel
    return require_kernel(kernel, "compiling").specialize(**consts)


def lane_ir(kernel, target, **consts):
    return lower(tile_ir(kernel, **consts), get_target(target))


def llvm_ir(kernel, target, *, aligned: bool = True, **consts) -> str:
    """aligned=True: tensors' non-last strides are multiples of 16 elements (the common case,
    checked at launch), so runs of elements become aligned vector accesses."""
    return _render(lane_ir(kernel, target, **consts), aligned)


def _render(prog, aligned: bool) -> str:
    from .codegen import render
    return render(prog, 16 if aligned else 1)


def code_object(kernel, target, *, aligned: bool = True, **consts):
    """hsaco bytes (CDNA) or the NVPTX compile result dict (Hopper)."""
    return compile_lane(lane_ir(kernel, target, **consts), aligned=aligned)


def compile_lane(prog, *, aligned: bool = True):
    """Code object of an already lowered lane program (what launchers call)."""
    ir = _render(prog, aligned)
    if prog.target.family == "cdna":
        from .toolchain import amdgpu
        return amdgpu.compile_ir(ir, prog.target.name)
    from .toolchain import nvptx
    return nvptx.compile_ir(ir, prog.target.name)


def assembly(kernel, target, **consts) -> str:
    t = get_target(target)
    obj = code_object(kernel, t, **consts)
    if t.family == "cdna":
        from .toolchain import amdgpu
        return amdgpu.disassemble(obj, t.name)
    return obj["ptx"]


def report(kernel, target, **consts) -> dict:
    """Resource report of the compiled kernel (registers, LDS/smem, spills, occupancy, loop mix)."""
    t = get_target(target)
    prog = lane_ir(kernel, t, **consts)
    obj = compile_lane(prog)
    if t.family == "cdna":
        from .analysis import hsaco
        return hsaco.report(obj, t.name, num_waves=prog.num_waves)
    from .analysis import cubin
    rep = cubin.report(obj)
    # Shared tiles live in dynamic shared memory, sized at launch: count them too.
    rep["dynamic_smem_bytes"] = prog.lds_bytes
    rep["smem_bytes"] = (rep.get("smem_bytes") or 0) + rep["dynamic_smem_bytes"]
    return rep


def emit(kernel, target, stage: str, **consts) -> str:
    if stage == "tile":
        return format_kernel(tile_ir(kernel, **consts))
    if stage == "lane":
        return format_lane(lane_ir(kernel, target, **consts))
    if stage == "llvm":
        return llvm_ir(kernel, target, **consts)
    if stage == "asm":
        return assembly(kernel, target, **consts)
    raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")


__all__ = ["STAGES", "tile_ir", "lane_ir", "llvm_ir", "code_object", "assembly", "report",
           "emit", "NotSupportedYet"]
