"""Resource report for a Hopper cubin: registers, shared memory, spills (from `ptxas -v`) and
the SASS instruction mix with the warpgroup-MMA count of the hot loop (from cuobjdump).

The loop count is what tells whether a GEMM main loop really issues its wgmmas back to back:
we build the SASS control-flow graph and take natural loops (back edges to a dominating
header), because ptxas moves mbarrier retry blocks out of line after EXIT and a plain "find
backward branches" scan would mistake their jump back into the loop for a loop of its own.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from ..toolchain.nvptx import find_cuda_tool, install_hint
from .cfg import basic_blocks, natural_loops

# Warpgroup MMA mnemonics in Hopper SASS: HGMMA (f16/bf16/tf32), QGMMA (fp8), IGMMA (int8),
# BGMMA (binary) — what ptxas makes of PTX `wgmma.mma_async`.
WGMMA_OPS = frozenset({"HGMMA", "QGMMA", "IGMMA", "BGMMA"})
SPILL_OPS = frozenset({"LDL", "STL"})          # local memory: what ptxas spills to


# ---- ptxas -v ------------------------------------------------------------------------------

def parse_ptxas_log(log: str) -> dict[str, dict]:
    """Per entry function: registers, smem_bytes (static), stack_bytes, spill stores/loads.

    ptxas prints 'Compiling entry function' before the function's lines and the format of the
    'Used ...' line varies by version (barriers, cmem, cumulative stack), so each number is
    matched on its own."""
    out: dict[str, dict] = {}
    entry = props = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = props = m.group(1)
            out.setdefault(entry, {"registers": None, "smem_bytes": 0, "stack_bytes": 0,
                                   "spill_stores": 0, "spill_loads": 0, "barriers": 0})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m and props in out:
            d = out[props]
            d["stack_bytes"], d["spill_stores"], d["spill_loads"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and entry in out:
            d = out[entry]
            d["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            d["smem_bytes"] = int(s.group(1)) if s else 0
            b = re.search(r"used (\d+) barriers", line)
            d["barriers"] = int(b.group(1)) if b else 0
    return out


# ---- SASS ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instr:
    addr: int
    pred: str        # '' or the guard, e.g. '@!P0'
    opcode: str      # full opcode with modifiers, e.g. 'HGMMA.64x8x16.F32.BF16'
    operands: str

    @property
    def op(self) -> str:
        """Base mnemonic: 'HGMMA', 'LDG', 'BRA'."""
        return self.opcode.split(".")[0]


_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;?\s*(?:/\*.*\*/)?\s*$")
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_LABEL = re.compile(r"^\s*(\.L\w+):")


def parse_sass(text: str) -> dict[str, tuple[list[Instr], dict[str, int]]]:
    """cuobjdump -sass (or nvdisasm) text -> {kernel: (instructions, label -> address)}."""
    funcs: dict[str, tuple[list[Instr], dict[str, int]]] = {}
    cur = None
    pending: list[str] = []
    for line in text.splitlines():
        m = _FUNC.match(line) or _SECTION.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), ([], {}))
            pending = []
            continue
        if cur is None:
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if not m or not m.group(2):
            continue
        body = m.group(2).split(";")[0].strip()
        pred = ""
        if body.startswith("@"):
            pred, _, body = body.partition(" ")
        opcode, _, operands = body.strip().partition(" ")
        addr = int(m.group(1), 16)
        for lab in pending:
            cur[1][lab] = addr
        pending = []
        cur[0].append(Instr(addr, pred, opcode, operands.strip()))
    return funcs


def _target(ins: Instr, labels: dict[str, int]) -> int | None:
    m = re.search(r"`\((\.L\w+)\)", ins.operands)
    if m:
        return labels.get(m.group(1))
    hexes = re.findall(r"0x[0-9a-fA-F]+", ins.operands)
    return int(hexes[-1], 16) if hexes else None


def _conditional(ins: Instr) -> bool:
    guarded = ins.pred not in ("", "@PT")
    # BRA.U / BRA.DIV carry their condition as a leading operand: 'BRA.U !UP0, target'.
    return guarded or re.match(r"!?U?P\w*\s*,", ins.operands) is not None


_ENDS_BLOCK = ("BRA", "EXIT", "RET", "BRX", "JMP", "JMX")


def cfg(instrs: list[Instr], labels: dict[str, int]):
    """Basic blocks (instruction-index ranges) and successor lists of SASS, block 0 the entry:
    a branch jumps to its target and, when predicated, also falls through; EXIT/RET end the
    flow unless predicated."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}

    def target(i):
        ins = instrs[i]
        return index.get(_target(ins, labels)) if ins.op in ("BRA", "JMP") else None
    leaders = {i + 1 for i, ins in enumerate(instrs) if ins.op in _ENDS_BLOCK}
    leaders |= {t for t in map(target, range(len(instrs))) if t is not None}

    def edges(i):
        op = instrs[i].op
        if op in ("BRA", "JMP", "EXIT", "RET"):      # taken, or past it when predicated
            return target(i), _conditional(instrs[i])
        return None, True
    return basic_blocks(len(instrs), leaders, edges)


def analyze_sass(instrs: list[Instr], labels: dict[str, int]) -> dict:
    """Instruction mix of the reachable code and the wgmma count of the innermost loop that
    issues wgmmas (spin-wait loops inside it, which issue none, do not hide it)."""
    blocks, succs = cfg(instrs, labels)
    loops = natural_loops(succs)
    reach = set()
    stack = [0] if blocks else []
    while stack:
        b = stack.pop()
        if b not in reach:
            reach.add(b)
            stack.extend(succs[b])
    mix: dict[str, int] = {}
    for b in sorted(reach):
        for i in blocks[b]:
            mix[instrs[i].op] = mix.get(instrs[i].op, 0) + 1

    def count(body, ops=WGMMA_OPS):
        return sum(instrs[i].op in ops for b in body for i in blocks[b])

    with_mma = {h: body for h, body in loops.items() if count(body)}
    inner = [h for h, body in with_mma.items()
             if not any(o != h and with_mma[o] < body for o in with_mma)]
    summary = [{"start": instrs[blocks[h][0]].addr,
                "end": max(instrs[blocks[b][-1]].addr for b in body),
                "instructions": sum(len(blocks[b]) for b in body),
                "wgmma": count(body), "innermost_wgmma": h in inner}
               for h, body in sorted(loops.items())]
    return {"sass_mix": dict(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
            "loop_wgmma": max((count(with_mma[h]) for h in inner), default=0),
            # local-memory loads and stores (spills) in those loops: where they would cost
            "loop_spills": sum(count(with_mma[h], SPILL_OPS) for h in inner),
            "loops": summary}


def disassemble(cubin: bytes) -> tuple[str | None, str]:
    """SASS text of a cubin via cuobjdump, or (None, why not)."""
    cuobjdump = find_cuda_tool("cuobjdump")
    if cuobjdump is None:
        return None, install_hint("cuobjdump")
    env = dict(os.environ)
    nvdisasm = find_cuda_tool("nvdisasm")
    if nvdisasm is None:
        return None, (f"cuobjdump ({cuobjdump}) needs nvdisasm to print SASS; "
                      + install_hint("nvdisasm"))
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="pykittens-sass-") as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        p = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True,
                           env=env, timeout=300)
    if p.returncode != 0:
        return None, f"cuobjdump -sass failed (exit {p.returncode}): {p.stderr.strip()[-500:]}"
    return p.stdout, ""


def _pick(names, kernel, what):
    names = list(names)
    if kernel is not None:
        if kernel not in names:
            raise KeyError(f"kernel {kernel!r} is not in the {what}; it has "
                           f"{', '.join(names) or 'no kernels'}")
        return kernel
    if len(names) != 1:
        raise ValueError(f"the {what} has {len(names)} kernels ({', '.join(names)}); "
                         "pass kernel=NAME")
    return names[0]


def ptxas_advisories(log: str) -> list[str]:
    """The numbered advisories and warnings in a ptxas log, e.g. "(C7514) Potential
    Performance Loss: wgmma.mma_async instructions are serialized ...", one line each."""
    out = []
    for line in log.splitlines():
        m = re.search(r"\((C\d{4})\)\s*(.*)", line)
        if m:
            out.append(f"ptxas {m[1]}: {' '.join(m[2].split())}")
    return out


def report(result: dict, *, kernel: str | None = None) -> dict:
    """JSON-ready resource report for one kernel of a `toolchain.nvptx.compile_ir` result.

    Numbers that need a tool the machine lacks are None, and `notes` says which package to
    install; nothing is guessed."""
    rep = {"kernel": kernel, "registers": None, "smem_bytes": None, "spill_bytes": None,
           "stack_bytes": None, "barriers": None, "sass_mix": None, "loop_wgmma": None,
           "loop_spills": None, "loops": None, "notes": []}
    if result.get("cubin") is None:
        rep["kernel"] = _pick(result.get("kernels") or [], kernel, "PTX")
        rep["notes"].append("no cubin: " + (result.get("ptxas_log") or install_hint("ptxas")))
        return rep
    log = result.get("ptxas_log") or ""
    stats = parse_ptxas_log(log)
    name = _pick(stats, kernel, "ptxas log")
    # ptxas's advisories (C7xxx: wgmma serialised, setmaxnreg ignored, ...) say why a
    # kernel is slower than its instructions suggest
    rep["notes"].extend(ptxas_advisories(log))
    s = stats[name]
    rep.update(kernel=name, registers=s["registers"], smem_bytes=s["smem_bytes"],
               spill_bytes=s["spill_stores"] + s["spill_loads"], stack_bytes=s["stack_bytes"],
               barriers=s["barriers"])
    sass, why = disassemble(result["cubin"])
    if sass is None:
        rep["notes"].append("no SASS: " + why)
        return rep
    funcs = parse_sass(sass)
    if name not in funcs:
        rep["notes"].append(f"cuobjdump printed no SASS for {name!r} "
                            f"(it printed {', '.join(funcs) or 'nothing'})")
        return rep
    rep.update(analyze_sass(*funcs[name]))
    return rep
