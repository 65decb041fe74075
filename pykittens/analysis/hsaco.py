"""What a code object says about its kernels: resources from the metadata note, occupancy,
and the instruction mix of the main loop from the disassembly's control-flow graph.

The metadata is the msgpack map in the AMDGPU note (AMDGPUUsage, "Code Object V3+
Metadata"): `amdhsa.version`, `amdhsa.target` and one `amdhsa.kernels` entry per kernel with
its register counts, segment sizes and argument layout. It is the same table the HIP runtime
reads to build the kernel-argument buffer, so checking against it is checking the real ABI.
"""
from __future__ import annotations

import bisect
import re
import struct
from collections import Counter
from dataclasses import dataclass

import msgpack

from .. import targets
from ..toolchain import amdgpu
from .cfg import basic_blocks as cfg_blocks, natural_loops
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


# ----------------------------------------------------------------------------- line table

def _uleb(data: bytes, i: int) -> tuple[int, int]:
    val = shift = 0
    while True:
        b = data[i]
        i += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return val, i


def _sleb(data: bytes, i: int) -> tuple[int, int]:
    val = shift = 0
    while True:
        b = data[i]
        i += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (val - (1 << shift) if b & 0x40 else val), i


def line_rows(hsaco: bytes) -> list[tuple[int, int, bool]]:
    """(address, line, end of sequence) rows of the code object's .debug_line (DWARF 2-5
    line-number programs, DWARF5 section 6.2), [] without one. Only addresses and lines are
    decoded: the header is skipped through its header_length."""
    sec = next((x for x in amdgpu.elf_sections(hsaco) if x.name == ".debug_line"), None)
    if sec is None:
        return []
    data, end, rows = hsaco[sec.offset:sec.offset + sec.size], sec.size, []
    off = 0
    while off + 4 <= end:
        length, = struct.unpack_from("<I", data, off)
        if length == 0xFFFFFFFF:
            raise ValueError(".debug_line: 64-bit DWARF is not supported")
        unit_end, i = off + 4 + length, off + 4
        version, = struct.unpack_from("<H", data, i)
        i += 2
        if version >= 5:
            i += 2                                   # address_size, segment_selector_size
        header_length, = struct.unpack_from("<I", data, i)
        i += 4
        program = i + header_length
        min_inst = data[i]
        i += 2 if version >= 4 else 1                # maximum_operations_per_instruction
        i += 1                                       # default_is_stmt
        line_base = struct.unpack_from("<b", data, i)[0]
        line_range, opcode_base = data[i + 1], data[i + 2]
        std_lengths = data[i + 3:i + 3 + opcode_base - 1]
        i, addr, line = program, 0, 1
        while i < unit_end:
            op = data[i]
            i += 1
            if op >= opcode_base:                    # special opcode: advance both, a row
                adj = op - opcode_base
                addr += adj // line_range * min_inst
                line += line_base + adj % line_range
                rows.append((addr, line, False))
            elif op == 0:                            # extended opcode
                n, i = _uleb(data, i)
                sub, body = data[i], data[i + 1:i + n]
                if sub == 1:                         # end_sequence
                    rows.append((addr, line, True))
                    addr, line = 0, 1
                elif sub == 2:                       # set_address
                    addr = int.from_bytes(body, "little")
                i += n
            elif op == 1:                            # copy
                rows.append((addr, line, False))
            elif op == 2:                            # advance_pc
                n, i = _uleb(data, i)
                addr += n * min_inst
            elif op == 3:                            # advance_line
                n, i = _sleb(data, i)
                line += n
            elif op == 8:                            # const_add_pc
                addr += (255 - opcode_base) // line_range * min_inst
            elif op == 9:                            # fixed_advance_pc
                addr += struct.unpack_from("<H", data, i)[0]
                i += 2
            else:                                    # other standard opcodes: skip operands
                for _ in range(std_lengths[op - 1]):
                    _, i = _uleb(data, i)
        off = unit_end
    return rows


def line_of_addresses(hsaco: bytes, addresses: list[int]) -> list[int | None]:
    """The source line of each instruction address (None where the table has no row)."""
    spans = []                                       # (start, end, line)
    rows = line_rows(hsaco)
    for (a, ln, last), nxt in zip(rows, rows[1:]):
        if not last and nxt[0] > a:
            spans.append((a, nxt[0], ln))
    spans.sort()
    starts = [s for s, _, _ in spans]
    out = []
    for addr in addresses:
        k = bisect.bisect_right(starts, addr) - 1
        out.append(spans[k][2] if k >= 0 and addr < spans[k][1] else None)
    return out


# ----------------------------------------------------------------------------- loops

_LINE = re.compile(r"^\t(\S+)(.*?)\s*(?://\s*([0-9a-f]+))?$")
_LABEL = re.compile(r"^(\.L[0-9a-f]+):$")
_FUNC = re.compile(r"^([^\s.][^\s]*):$")


def instructions(asm: str, kernel_name: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """([(mnemonic, operands)], {label: index of the instruction it precedes}) of one
    function in `amdgpu.disassemble` text."""
    insts, labels, _ = _parse(asm, kernel_name)
    return insts, labels


def addresses(asm: str, kernel_name: str) -> list[int]:
    """The address of each instruction `instructions` lists."""
    return _parse(asm, kernel_name)[2]


def _parse(asm: str, kernel_name: str):
    insts, labels, addrs, inside = [], {}, [], False
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
            addrs.append(int(m.group(3), 16) if m.group(3) else -1)
    if not insts:
        raise ValueError(f"no function {kernel_name!r} in the disassembly")
    return insts, labels, addrs


def is_branch(mnemonic: str) -> bool:
    return mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_")


def ends_flow(mnemonic: str) -> bool:
    """Control does not fall through: s_branch, s_endpgm*, s_setpc_b64 (return or indirect
    jump, target unknown). s_swappc_b64 is a call and returns."""
    return mnemonic in ("s_branch", "s_setpc_b64") or mnemonic.startswith("s_endpgm")


def basic_blocks(insts: list[tuple[str, str]], labels: dict[str, int]
                 ) -> tuple[list[range], list[list[int]]]:
    """(blocks, successors): blocks are instruction-index ranges, split at labels and after
    branches and ends; block 0 is the entry. Edges: s_branch -> its label; s_cbranch_* -> its
    label and the next block; s_endpgm*/s_setpc_b64 -> none; anything else -> the next block.
    A branch whose operand is not a label of this function (none that LLVM emits) has only
    its fall-through edge."""
    leaders = set(labels.values()) | {i + 1 for i, (op, _) in enumerate(insts)
                                      if is_branch(op) or ends_flow(op)}

    def edges(i):
        op, arg = insts[i]
        return (labels.get(arg) if is_branch(op) else None), not ends_flow(op)
    return cfg_blocks(len(insts), leaders, edges)


@dataclass(frozen=True)
class Loop:
    """A natural loop: the blocks that reach a back edge (an edge to a block that dominates
    its source) without passing its header; back edges to one header make one loop."""
    header: int                 # index of the header's first instruction
    body: tuple[int, ...]       # indices of the loop's instructions, in address order
    innermost: bool             # no other loop is nested in it

    def instructions(self, insts: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [insts[i] for i in self.body]

    def mfma(self, insts: list[tuple[str, str]]) -> int:
        return sum(classify(insts[i][0]) == "mfma" for i in self.body)


def loops(insts: list[tuple[str, str]], labels: dict[str, int]) -> list[Loop]:
    """Natural loops of one function's control-flow graph, by header address.

    Layout does not matter: LLVM often places the latch block above the header (the entry
    branches down to the header, the latch falls through into it) and shares one `s_endpgm`
    block that later code branches back up to. A scan for backward branches takes the
    second for a loop and measures the first by address range; back edges to dominators
    get both right."""
    blocks, succs = basic_blocks(insts, labels)
    bodies = natural_loops(succs)
    return [Loop(header=blocks[h].start,
                 body=tuple(sorted(i for b in body for i in blocks[b])),
                 innermost=not any(o != h and o in body for o in bodies))
            for h, body in sorted(bodies.items())]


def main_loop(insts: list[tuple[str, str]], labels: dict[str, int],
              found: list[Loop] | None = None) -> Loop | None:
    """The loop a report describes: of the loops that issue MFMAs, one with no such loop
    nested inside it, most MFMAs first (a loop without MFMAs inside the K loop, e.g. a
    waterfall loop, does not hide it); without MFMAs, the innermost loop with the most
    instructions. Ties go to the larger, then the earlier loop. None when there is no loop."""
    found = loops(insts, labels) if found is None else found
    mma = [lp for lp in found if lp.mfma(insts)]
    if mma:
        cands = [lp for lp in mma if not any(o is not lp and set(o.body) < set(lp.body)
                                              for o in mma)]
    else:
        cands = [lp for lp in found if lp.innermost]
    if not cands:
        return None
    return max(cands, key=lambda lp: (lp.mfma(insts), len(lp.body), -lp.header))


def interior_path(insts: list[tuple[str, str]], labels: dict[str, int], loop: Loop,
                  lines: list[int | None]) -> list[int]:
    """The instructions (indices, in address order) an iteration of `loop` runs for an
    interior tile: the loop's blocks reachable from its header without entering edge code,
    less edge-tagged instructions LLVM moved into shared blocks.

    `lines` are the instructions' source lines from the code object's line table; the
    renderer gives the code of the lowering's ragged-edge sides (ld_edge, st_edge, run_elem,
    lds_copy and what is nested in them) its EDGE_LINE, everything else MAIN_LINE, and LLVM
    gives the exec-mask code it adds no line. A block whose last tagged instruction is edge
    code belongs to the edge side: for an interior tile no lane takes it, so a uniform branch
    jumps past it and an exec-masked one skips it (s_cbranch_execz), with everything only
    reachable through it. The last tag decides because LLVM sinks main-side values into the
    edge blocks that use them (to their start) and hoists edge-side ones into the block that
    branches (before its branch). Without the tags (another compiler's code object) this is
    the whole loop. It undercounts where an edge-only instruction was hoisted (speculated),
    and counts both sides of the kernel's own branches (`pk.if_`), which are not edge code."""
    from ..codegen.amdgpu import AMDGPURenderer as R
    blocks, succs = basic_blocks(insts, labels)
    in_loop = set(loop.body)
    block_at = {blk.start: b for b, blk in enumerate(blocks)}

    def is_edge(b):
        tags = [lines[i] for i in blocks[b] if lines[i] in (R.MAIN_LINE, R.EDGE_LINE)]
        return bool(tags) and tags[-1] == R.EDGE_LINE

    head = block_at[loop.header]
    seen, work = {head}, [head]
    while work:
        b = work.pop()
        for nb in succs[b]:
            if nb not in seen and nb != head and blocks[nb].start in in_loop and not is_edge(nb):
                seen.add(nb)
                work.append(nb)
    return sorted(i for b in seen for i in blocks[b] if lines[i] != R.EDGE_LINE)


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
    max_flat_workgroup_size / wavefront size). `loops` counts the natural loops; `loop_mfma`
    and `loop_instructions` describe the main loop (`main_loop`: the innermost loop with the
    most MFMAs), all of its code, and are 0 and empty when the kernel has no loop;
    `loop_executed` is the mix of one iteration of it for an interior tile, without the
    ragged-edge code (`interior_path`). `occupancy_limits` gives the waves per SIMD each
    resource allows; `hbm_bytes_per_s` the peak memory bandwidth of each chip of the target
    (data sheets), for models over the report.
    """
    t = targets.get(target)
    k = kernel(hsaco, kernel_name)
    if num_waves is None:
        num_waves = max(k.max_flat_workgroup_size // k.wavefront_size, 1)
    occ = waves_per_simd(t, registers=k.vgpr_count, lds_bytes=k.group_segment_fixed_size,
                         waves_per_workgroup=num_waves, sgprs=k.sgpr_count)
    asm = amdgpu.disassemble(hsaco, t.name)
    insts, labels = instructions(asm, k.name)
    found = loops(insts, labels)
    main = main_loop(insts, labels, found)
    inner = instruction_mix(main.instructions(insts)) if main else {}
    executed = {}
    if main:
        lines = line_of_addresses(hsaco, addresses(asm, k.name))
        executed = instruction_mix([insts[i] for i in interior_path(insts, labels, main, lines)])
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
        "occupancy_limits": {"registers": occ.by_registers, "sgprs": occ.by_sgprs,
                             "lds": occ.by_lds, "wave slots": t.max_waves_per_simd},
        "instructions": len(insts),
        "loops": len(found),
        "loop_mfma": inner.get("mfma", 0),
        "loop_instructions": inner,
        "loop_executed": executed,
        "hbm_bytes_per_s": dict(t.hbm_bytes_per_s_by_chip) or {t.chips[0]: t.hbm_bytes_per_s},
    }
