"""What a code object says about its kernels: resources from the metadata note, occupancy,
and the instruction mix of the innermost loop from the disassembly.

The metadata is the msgpack map in the AMDGPU note (AMDGPUUsage, "Code Object V3+
Metadata"): `amdhsa.version`, `amdhsa.target` and one `amdhsa.kernels` entry per kernel with
its register counts, segment sizes and argument layout. It is the same table the HIP runtime
reads to build the kernel-argument buffer, so checking against it is checking the real ABI.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import msgpack

from .. import targets
from ..toolchain import amdgpu
from .occupancy import waves_per_simd

NT_AMDGPU_METADATA = 32
ELFOSABI_AMDGPU_HSA = 64


@dataclass(frozen=True)
class KernelInfo:
    name: str
    vgpr_count: int                  # unified VGPR+AGPR per lane on gfx90a+ (occupancy uses it)
    arch_vgpr_count: int             # v0..vN only
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    group_segment_fixed_size: int    # static LDS bytes
    private_segment_fixed_size: int  # scratch bytes per lane
    kernarg_segment_size: int
    kernarg_segment_align: int
    wavefront_size: int
    max_flat_workgroup_size: int
    uses_dynamic_stack: bool
    args: tuple[dict, ...]           # {'.offset', '.size', '.value_kind', maybe '.name', ...}


def metadata(hsaco: bytes) -> dict:
    """The decoded metadata map of a code object (code object v3 and later)."""
    for owner, ntype, desc in amdgpu.elf_notes(hsaco):
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            return msgpack.unpackb(desc, raw=False, strict_map_key=False)
    raise ValueError("the code object has no AMDGPU metadata note (NT_AMDGPU_METADATA); "
                     "code objects older than v3 are not supported")


def code_object_version(hsaco: bytes) -> int:
    """From e_ident[EI_ABIVERSION] (ELFABIVERSION_AMDGPU_HSA_V3 = 1 ... V6 = 4); the
    metadata's amdhsa.version says [1, 2] for both v5 and v6, so it cannot tell them apart."""
    if hsaco[7] != ELFOSABI_AMDGPU_HSA:
        raise ValueError(f"ELF OS ABI {hsaco[7]} is not ELFOSABI_AMDGPU_HSA "
                         f"({ELFOSABI_AMDGPU_HSA}): not an HSA code object")
    return hsaco[8] + 2


def kernels(hsaco: bytes) -> dict[str, KernelInfo]:
    md = metadata(hsaco)
    syms = {s.name: s.value for s in amdgpu.elf_symbols(hsaco)}
    out = {}
    for k in md.get("amdhsa.kernels", []):
        name = k[".name"]
        agpr = k.get(".agpr_count", 0)
        # LLVM's resource symbols give the architectural VGPR count; without them the
        # unified count minus AGPRs is an upper bound (AGPRs start at a multiple of 4).
        arch = syms.get(f"{name}.num_vgpr", k[".vgpr_count"] - agpr if agpr else k[".vgpr_count"])
        out[name] = KernelInfo(
            name=name, vgpr_count=k[".vgpr_count"], arch_vgpr_count=arch, agpr_count=agpr,
            sgpr_count=k[".sgpr_count"], vgpr_spill_count=k.get(".vgpr_spill_count", 0),
            sgpr_spill_count=k.get(".sgpr_spill_count", 0),
            group_segment_fixed_size=k[".group_segment_fixed_size"],
            private_segment_fixed_size=k[".private_segment_fixed_size"],
            kernarg_segment_size=k[".kernarg_segment_size"],
            kernarg_segment_align=k[".kernarg_segment_align"],
            wavefront_size=k[".wavefront_size"],
            max_flat_workgroup_size=k[".max_flat_workgroup_size"],
            uses_dynamic_stack=bool(k.get(".uses_dynamic_stack", False)),
            args=tuple(k.get(".args", ())))
    return out


def kernel(hsaco: bytes, name: str | None = None) -> KernelInfo:
    ks = kernels(hsaco)
    if name is None:
        if len(ks) != 1:
            raise ValueError(f"the code object has {len(ks)} kernels ({', '.join(ks)}); "
                             "name the one you mean")
        return next(iter(ks.values()))
    if name not in ks:
        raise ValueError(f"no kernel {name!r} in the code object; it has {', '.join(ks)}")
    return ks[name]


# ----------------------------------------------------------------------------- loops

_LINE = re.compile(r"^\t(\S+)(.*?)\s*(?://\s*([0-9a-f]+))?$")
_LABEL = re.compile(r"^(\.L[0-9a-f]+):$")
_FUNC = re.compile(r"^([^\s.][^\s]*):$")


def instructions(asm: str, kernel_name: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """([(mnemonic, operands)], {label: index of the instruction it precedes}) of one
    function in `amdgpu.disassemble` text."""
    insts, labels, inside = [], {}, False
    for line in asm.splitlines():
        f = _FUNC.match(line)
        if f:
            inside = f.group(1) == kernel_name
            continue
        if not inside:
            continue
        lab = _LABEL.match(line)
        if lab:
            labels[lab.group(1)] = len(insts)
            continue
        m = _LINE.match(line)
        if m:
            insts.append((m.group(1), m.group(2).strip()))
    if not insts:
        raise ValueError(f"no function {kernel_name!r} in the disassembly")
    return insts, labels


def is_branch(mnemonic: str) -> bool:
    return mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_")


def loops(insts: list[tuple[str, str]], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction index of every loop: a branch back to a label at or above
    it. Sorted innermost (shortest) first."""
    found = []
    for i, (op, arg) in enumerate(insts):
        if is_branch(op) and arg in labels and labels[arg] <= i:
            found.append((labels[arg], i))
    return sorted(found, key=lambda r: (r[1] - r[0], r[0]))


INSTRUCTION_CLASSES = ("mfma", "vmem", "ds", "valu", "smem", "salu", "branch", "other")


def classify(mnemonic: str) -> str:
    """mfma: v_mfma*/v_smfmac*; vmem: buffer_/global_/flat_/scratch_; ds: ds_ (LDS);
    valu: other v_; smem: scalar memory (s_load/s_buffer/s_store/s_dcache); branch:
    s_branch/s_cbranch_*; salu: other s_ (incl. s_waitcnt, s_barrier, s_setprio)."""
    if mnemonic.startswith(("v_mfma", "v_smfmac")):
        return "mfma"
    if mnemonic.startswith(("buffer_", "global_", "flat_", "scratch_")):
        return "vmem"
    if mnemonic.startswith("ds_"):
        return "ds"
    if mnemonic.startswith("v_"):
        return "valu"
    if is_branch(mnemonic):
        return "branch"
    if mnemonic.startswith(("s_load", "s_buffer_", "s_store", "s_dcache", "s_scratch_")):
        return "smem"
    if mnemonic.startswith("s_"):
        return "salu"
    return "other"


def instruction_mix(insts: list[tuple[str, str]]) -> dict[str, int]:
    c = Counter(classify(op) for op, _ in insts)
    return {k: c.get(k, 0) for k in INSTRUCTION_CLASSES} | {"total": len(insts)}


# ----------------------------------------------------------------------------- report

def report(hsaco: bytes, target, *, num_waves: int | None = None,
           kernel_name: str | None = None) -> dict:
    """Resource and schedule summary of one kernel, JSON-ready.

    `num_waves` is the workgroup size in waves (default: the code object's
    max_flat_workgroup_size / wavefront size). Loop figures describe the innermost loop
    (shortest backward-branch range); `loop_mfma` is 0 and `loop_instructions` empty when the
    kernel has no loop.
    """
    t = targets.get(target)
    k = kernel(hsaco, kernel_name)
    if num_waves is None:
        num_waves = max(k.max_flat_workgroup_size // k.wavefront_size, 1)
    occ = waves_per_simd(t, registers=k.vgpr_count, lds_bytes=k.group_segment_fixed_size,
                         waves_per_workgroup=num_waves)
    insts, labels = instructions(amdgpu.disassemble(hsaco, t.name), k.name)
    found = loops(insts, labels)
    inner = instruction_mix(insts[found[0][0]:found[0][1] + 1]) if found else {}
    return {
        "kernel": k.name,
        "target": t.name,
        "code_object_version": code_object_version(hsaco),
        "vgpr": k.arch_vgpr_count,
        "agpr": k.agpr_count,
        "unified_vgpr": k.vgpr_count,
        "sgpr": k.sgpr_count,
        "vgpr_spill": k.vgpr_spill_count,
        "sgpr_spill": k.sgpr_spill_count,
        "lds_bytes": k.group_segment_fixed_size,
        "scratch_bytes": k.private_segment_fixed_size,
        "kernarg_bytes": k.kernarg_segment_size,
        "num_waves": num_waves,
        "occupancy_waves_per_simd": occ.waves_per_simd,
        "occupancy_limited_by": occ.limited_by,
        "instructions": len(insts),
        "loops": len(found),
        "loop_mfma": inner.get("mfma", 0),
        "loop_instructions": inner,
    }
