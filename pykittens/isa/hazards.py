"""Wait states the software must provide between dependent instructions on gfx942 and
gfx950, checked dynamically (while the emulator runs a code object) and statically (over a
disassembly, across branches).

The hardware does not interlock these cases: the producer's result (or its read of a
source) is not ready for the number of wait states below, and a consumer issued earlier
reads or writes the wrong value. A wait state is one issued instruction; `s_nop N` is
N + 1 (CDNA3 ISA, "Manually Inserted Wait States (NOPs)").

Sources for the numbers:
  [ISA]  AMD Instinct MI300 (CDNA3) ISA Reference Guide, sections "Manually Inserted Wait
         States (NOPs)" (program flow chapter) and "Dependency Resolution: Required
         Independent Instructions" (matrix arithmetic chapter); the AMD Instinct CDNA4
         ISA Reference Guide, the same sections.
  [LLVM] LLVM's GCNHazardRecognizer.cpp (checkMAIHazards90A, checkMAIVALUHazards,
         checkVALUHazards, checkDPPHazards, checkRWLaneHazards, checkDivFMasHazards,
         checkReadM0Hazards, checkVMEMHazards, checkVALUHazardsHelper) for gfx940/gfx950,
         which encodes the same tables; its gfx950 columns add one wait state to the
         XDL-write cases of MFMAs with more than 2 passes.
  [AMD]  rocRoller's WaitState observers (XDLWrite94x, XDLReadSrcC94x, VALUWrite, ...),
         AMD's own tables of the 94x rules.
MFMA pass counts (mfma.passes): the guides' tables of dense MFMAs (cycles / 4; the Matrix
Instruction Calculator's cycle counts).

LLVM inserts these s_nops for the instructions it generates; it does not look inside
inline asm, so the MFMAs and register moves pykittens emits as inline asm for pinned
registers are on their own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import mfma as _mfma
from .decode import EXEC, M0, SRC_SCC, VCC, DecodeError, parse
from .state import ISAError

SGPR = 512                 # register ids: vector 0..511 (v0.., a0 = 256..), SGPR 512 + enc
MAX_WAIT = 20              # no rule needs more


def _xdl_write(np_: int, gfx950: bool) -> int:
    """XDL MFMA writes a VGPR/AGPR -> VALU, VMEM, DS reads it, a VALU/VMEM/DS writes it,
    or another MFMA reads it as SrcA/B: passes + 3, + 1 on gfx950 past 2 passes
    ([ISA] "Dependency Resolution", [LLVM] GFX940_XDL_N_PassWriteVgprVALUMemExpRead /
    _WritesVGPROverlappedSrcAB, [AMD] XDLWrite94x)."""
    return np_ + 3 + (1 if gfx950 and np_ != 2 else 0)


def _xdl_srcc_overlap(np_: int, gfx950: bool) -> int:
    """XDL write -> XDL MFMA reads an overlapping, not identical, SrcC: passes + 1, + 1 on
    gfx950 ([LLVM] GFX940_XDL_N_PassWritesVGPROverlappedXDLOrSMFMASrcC)."""
    return np_ + 1 + (1 if gfx950 else 0)


def _srcc_war(np_: int) -> int:
    """XDL MFMA reads SrcC -> VALU writes that register: 2 passes 1, 4: 3, 8: 7, 16: 15
    ([LLVM] SMFMA*ReadVgprVALUWar / GFX940_XDL4PassReadVgprVALUWar, [ISA] "Dependency
    Resolution")."""
    return {2: 1, 4: 3, 8: 7}.get(np_, 15)


@dataclass(frozen=True)
class Rule:
    name: str
    producer: str
    consumer: str
    wait_states: str
    source: str


RULES = (
    Rule("xdl-write-read", "MFMA writes a VGPR/AGPR",
         "VALU (incl. v_accvgpr_read), VMEM or DS reads it",
         "passes + 3 (gfx950: + 1 past 2 passes)", "[ISA] dependency resolution; [LLVM]"),
    Rule("xdl-write-waw", "MFMA writes a VGPR/AGPR", "VALU, VMEM load or DS read writes it",
         "passes + 3 (gfx950: + 1 past 2 passes)", "[ISA] dependency resolution; [LLVM]"),
    Rule("xdl-write-srcab", "MFMA writes a VGPR/AGPR", "MFMA reads it as SrcA/SrcB",
         "passes + 3 (gfx950: + 1 past 2 passes)", "[ISA] dependency resolution; [LLVM]"),
    Rule("xdl-write-srcc", "MFMA writes a VGPR/AGPR range", "MFMA reads an overlapping, not "
         "identical, SrcC", "passes + 1 (gfx950: + 2); identical range: 0 (2 passes: 2)",
         "[ISA] dependency resolution; [LLVM]"),
    Rule("srcc-war", "MFMA reads SrcC", "VALU writes that register",
         "1 / 3 / 7 / 15 for 2 / 4 / 8 / 16 passes", "[ISA] dependency resolution; [LLVM]"),
    Rule("valu-write-mfma", "VALU (incl. v_accvgpr_write) writes a VGPR/AGPR",
         "MFMA reads it", "2", "[ISA] dependency resolution; [LLVM] LegacyVALUNotDotWritesVGPR"),
    Rule("valu-exec-mfma", "VALU writes EXEC", "MFMA", "4", "[ISA] dependency resolution; [LLVM]"),
    Rule("valu-vgpr-dpp", "VALU writes a VGPR", "DPP reads it", "2", "[ISA] manual NOPs; [LLVM]"),
    Rule("valu-exec-dpp", "VALU writes EXEC", "DPP instruction", "5", "[ISA] manual NOPs; [LLVM]"),
    Rule("valu-sgpr-lanesel", "VALU writes an SGPR", "v_readlane/v_writelane lane select",
         "4", "[ISA] manual NOPs; [LLVM] checkRWLaneHazards"),
    Rule("valu-vcc-divfmas", "VALU writes VCC", "v_div_fmas", "4", "[ISA] manual NOPs; [LLVM]"),
    Rule("salu-m0-ldsdma", "SALU writes M0", "buffer load into LDS", "1",
         "[ISA] manual NOPs; [LLVM] checkReadM0Hazards"),
    Rule("valu-sgpr-vmem", "VALU writes an SGPR", "VMEM reads it", "5",
         "[ISA] manual NOPs; [LLVM] checkVMEMHazards"),
    Rule("valu-sgpr-valu", "VALU writes an SGPR or VCC", "VALU reads it", "2",
         "[LLVM] hasVDecCoExecHazard (gfx940+: no interlock)"),
    Rule("valu-exec-rwlane", "VALU writes EXEC", "v_readlane/v_readfirstlane/v_writelane",
         "4", "[LLVM] VALUWriteEXECRWLane"),
    Rule("valu-vgpr-readlane", "VALU writes a VGPR", "v_readlane/v_readfirstlane reads it",
         "1", "[LLVM] VALUWriteVGPRReadlaneRead"),
    Rule("trans-forward", "transcendental VALU (exp, log, rcp, rsq, sqrt, sin, cos) writes "
         "a VGPR", "non-transcendental VALU reads it", "1", "[LLVM] hasTransForwardingHazard"),
    Rule("store-data-war", "buffer store of more than 8 bytes (no SGPR offset)",
         "VALU writes its data registers", "2", "[ISA] manual NOPs; [LLVM] has12DWordStoreHazard"),
)


@dataclass
class Info:
    """What the rules need to know about one instruction."""
    idx: int
    addr: int
    mnemonic: str
    kind: str                      # mfma, valu, vmem, ds, salu, smem, other
    reads: list = field(default_factory=list)       # (register id, role)
    writes: list = field(default_factory=list)      # register ids
    passes: int = 0
    dst: tuple = ()                # MFMA destination range
    srcc: tuple = ()               # MFMA SrcC range
    wait_states: int = 1
    dpp: bool = False
    trans: bool = False
    lanesel: bool = False          # v_readlane/v_writelane (also readfirstlane for exec)
    rwlane: bool = False
    div_fmas: bool = False
    lds_dma: bool = False
    wide_store_data: tuple = ()

    def where(self) -> str:
        return f"{self.mnemonic} at 0x{self.addr:x}"


_TRANS = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")
_CARRY = ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_addc_co_u32",
          "v_subb_co_u32", "v_subbrev_co_u32")


def _ids(o) -> list[int]:
    if o.kind == "v":
        return list(o.regs)
    if o.kind == "s" and o.reg != SRC_SCC:
        return [SGPR + r for r in o.regs]
    return []


def info(inst, idx: int = 0) -> Info:
    op, ops = inst.op, inst.ops
    m = inst.mnemonic
    x = Info(idx, inst.addr, m, "other")
    if op == "s_nop":
        x.wait_states = (ops[0].value if ops else 0) + 1
        return x
    if op.startswith("v_mfma"):
        x.kind = "mfma"
        x.passes = _mfma.passes(op, inst.mods)
        x.dst = tuple(ops[0].regs)
        x.srcc = tuple(ops[3].regs) if ops[3].kind == "v" else ()
        x.writes = list(ops[0].regs)
        for o, role in zip(ops[1:], ("srcab", "srcab", "srcc", "srcab", "srcab")):
            x.reads += [(r, role) for r in _ids(o)]
        x.reads += [(SGPR + EXEC, "exec"), (SGPR + EXEC + 1, "exec")]
        return x
    if op.startswith("v_"):
        x.kind = "valu"
        x.dpp = inst.enc == "dpp"
        x.trans = op.startswith(_TRANS)
        x.lanesel = op in ("v_readlane_b32", "v_writelane_b32")
        x.rwlane = x.lanesel or op == "v_readfirstlane_b32"
        x.div_fmas = op.startswith("v_div_fmas")
        n_dst = 1
        if op.startswith("v_cmpx"):
            x.writes += [SGPR + EXEC, SGPR + EXEC + 1]
        if op in ("v_div_scale_f32", "v_div_scale_f64", "v_mad_u64_u32", "v_mad_i64_i32") or (
                op in _CARRY and len(ops) > 1 and ops[1].kind == "s"):
            n_dst = 2                                     # vdst, sdst (vcc when e32)
        if op == "v_writelane_b32":
            x.writes += _ids(ops[0])
            srcs = ops[1:]
        else:
            for o in ops[:n_dst]:
                x.writes += _ids(o)
            srcs = ops[n_dst:]
        if op in ("v_fmac_f32", "v_mac_f32"):
            srcs = tuple(srcs) + (ops[0],)
        for i, o in enumerate(srcs):
            role = "src"
            if x.dpp and i == 0:
                role = "dpp"
            elif x.lanesel and i == len(srcs) - 1:
                role = "lanesel"
            elif op in ("v_readlane_b32", "v_readfirstlane_b32") and i == 0:
                role = "rlsrc"
            x.reads += [(r, role) for r in _ids(o)]
        if x.div_fmas:                                   # VCC is implicit, not printed
            x.reads += [(SGPR + VCC, "vcc-divfmas"), (SGPR + VCC + 1, "vcc-divfmas")]
        x.reads += [(SGPR + EXEC, "exec"), (SGPR + EXEC + 1, "exec")]
        return x
    if op.startswith(("buffer_", "global_", "flat_", "scratch_")):
        x.kind = "vmem"
        store = "_store" in op or "_atomic" in op
        lds = bool(inst.mods.get("lds"))
        x.lds_dma = lds
        regs = list(ops)
        if lds:
            vaddr, rest = regs[0], regs[1:]
            data = None
        else:
            data, vaddr, rest = regs[0], regs[1], regs[2:]
        if data is not None:
            if store:
                x.reads += [(r, "data") for r in _ids(data)]
                if data.n > 2 and not (rest and rest[-1].kind == "s"):
                    x.wide_store_data = tuple(data.regs)
            else:
                x.writes += _ids(data)
        x.reads += [(r, "addr") for r in _ids(vaddr)]
        for o in rest:
            x.reads += [(r, "sgpr") for r in _ids(o)]
        if lds:
            x.reads.append((SGPR + M0, "m0"))
        return x
    if op.startswith("ds_"):
        x.kind = "ds"
        reads_only = op.startswith(("ds_write", "ds_store")) or op in ("ds_nop",)
        if reads_only:
            for o in ops:
                x.reads += [(r, "data") for r in _ids(o)]
        else:
            x.writes += _ids(ops[0])
            for o in ops[1:]:
                x.reads += [(r, "addr") for r in _ids(o)]
        return x
    if op.startswith(("s_load", "s_buffer_load")) or op == "s_memrealtime":
        x.kind = "smem"
        x.writes += _ids(ops[0])
        for o in ops[1:]:
            x.reads += [(r, "src") for r in _ids(o)]
        return x
    if op.startswith("s_"):
        x.kind = "salu"
        if op.startswith(("s_cbranch", "s_branch", "s_waitcnt", "s_setprio", "s_barrier",
                          "s_endpgm", "s_sleep")):
            if op in ("s_cbranch_vccz", "s_cbranch_vccnz"):
                x.reads += [(SGPR + VCC, "src"), (SGPR + VCC + 1, "src")]
            if op in ("s_cbranch_execz", "s_cbranch_execnz"):
                x.reads += [(SGPR + EXEC, "src"), (SGPR + EXEC + 1, "src")]
            return x
        writes_first = not op.startswith(("s_cmp", "s_bitcmp"))
        for i, o in enumerate(ops):
            if i == 0 and writes_first:
                x.writes += _ids(o)
            else:
                x.reads += [(r, "src") for r in _ids(o)]
        if "saveexec" in op:
            x.writes += [SGPR + EXEC, SGPR + EXEC + 1]
        return x
    return x


def _overlaps(a: tuple, b: tuple) -> bool:
    return bool(a) and bool(b) and a[0] <= b[-1] and b[0] <= a[-1]


def requirements(p: Info, c: Info, reg: int, role: str | None, gfx950: bool):
    """[(wait states, rule name)] that consumer `c` needs after producer `p`, for the
    register `reg` that `p` writes and `c` reads (`role`) or, with role None, writes."""
    out = []
    p_writes = reg in p.writes
    if p.kind == "mfma" and p_writes:
        np_ = p.passes
        if role is None:
            if c.kind in ("valu", "vmem", "ds"):
                out.append((_xdl_write(np_, gfx950), "xdl-write-waw"))
        elif c.kind == "mfma":
            if role == "srcc":
                if c.srcc == p.dst:
                    out.append((2 if np_ == 2 else 0, "xdl-write-srcc"))
                else:
                    out.append((_xdl_srcc_overlap(np_, gfx950), "xdl-write-srcc"))
            elif role == "srcab":
                out.append((_xdl_write(np_, gfx950), "xdl-write-srcab"))
        elif c.kind in ("valu", "vmem", "ds") and role != "exec":
            out.append((_xdl_write(np_, gfx950), "xdl-write-read"))
    if p.kind == "mfma" and role is None and c.kind == "valu" and reg in p.srcc \
            and reg not in p.writes:
        out.append((_srcc_war(p.passes), "srcc-war"))
    if p.kind == "valu" and p_writes and role is not None:
        sgpr = reg >= SGPR
        is_exec = reg in (SGPR + EXEC, SGPR + EXEC + 1)
        if c.kind == "mfma":
            out.append((4, "valu-exec-mfma") if is_exec else (2, "valu-write-mfma"))
        if c.kind == "valu":
            if is_exec and role == "exec":
                if c.dpp:
                    out.append((5, "valu-exec-dpp"))
                if c.rwlane:
                    out.append((4, "valu-exec-rwlane"))
            if role == "dpp" and not sgpr:
                out.append((2, "valu-vgpr-dpp"))
            if role == "lanesel" and sgpr:
                out.append((4, "valu-sgpr-lanesel"))
            if role == "vcc-divfmas":
                out.append((4, "valu-vcc-divfmas"))
            if role == "rlsrc" and not sgpr:
                out.append((1, "valu-vgpr-readlane"))
            if sgpr and not is_exec and role in ("src", "lanesel", "vcc-divfmas", "dpp"):
                out.append((2, "valu-sgpr-valu"))
            if p.trans and not c.trans and not sgpr:
                out.append((1, "trans-forward"))
        if c.kind == "vmem" and sgpr and role in ("sgpr", "m0"):
            out.append((5, "valu-sgpr-vmem"))
    if p.kind == "salu" and p_writes and reg == SGPR + M0 and role == "m0" and c.lds_dma:
        out.append((1, "salu-m0-ldsdma"))
    if p.kind == "vmem" and role is None and c.kind == "valu" and reg in p.wide_store_data:
        out.append((2, "store-data-war"))
    return out


@dataclass(frozen=True)
class Violation:
    """`consumer` reads (or writes) `register` only `actual` wait states after
    `producer`; rule `rule` needs `needed`."""
    producer: str
    consumer: str
    register: str
    needed: int
    actual: int
    rule: str
    kernel: str = ""
    access: str = "reads"

    def __str__(self) -> str:
        k = f"[{self.kernel}] " if self.kernel else ""
        return (f"{k}wait-state hazard: {self.consumer} {self.access} {self.register} "
                f"{self.actual} wait state(s) after {self.producer}; needs {self.needed} "
                f"({self.rule})")


def reg_name(r: int) -> str:
    if r < 256:
        return f"v{r}"
    if r < SGPR:
        return f"a{r - 256}"
    s = r - SGPR
    return {VCC: "vcc_lo", VCC + 1: "vcc_hi", EXEC: "exec_lo", EXEC + 1: "exec_hi",
            M0: "m0"}.get(s, f"s{s}")


def _pairs(p: Info, c: Info):
    """(register, role or None) that consumer c reads or writes of what p touches."""
    pw = set(p.writes)
    for r, role in c.reads:
        if r in pw:
            yield r, role
    mine = pw | set(p.srcc) | set(p.wide_store_data)
    for r in c.writes:
        if r in mine:
            yield r, None


def check_pair(p: Info, c: Info, distance: int, gfx950: bool, kernel: str = ""
               ) -> list[Violation]:
    """The violations when c issues `distance` wait states after p: one per rule, naming
    the first register involved."""
    bad, seen = [], set()
    for reg, role in _pairs(p, c):
        for need, rule in requirements(p, c, reg, role, gfx950):
            if distance < need and rule not in seen:
                seen.add(rule)
                bad.append(Violation(p.where(), c.where(), reg_name(reg), need, distance,
                                     rule, kernel, "reads" if role else "writes"))
    return bad


# ----------------------------------------------------------------------------- dynamic

class Tracker:
    """Checks the rules on the instructions a wave actually issues. Per register it keeps
    the last write (and the last MFMA SrcC read, and the last wide store's data) with its
    issue time in wait states; a consumer is checked against those of the registers it
    reads and writes. (An older write the last one replaced was itself checked by the
    rules when the newer one was issued.)"""

    def __init__(self, infos: list[Info], gfx950: bool, kernel: str = ""):
        self.infos = infos
        self.gfx950 = gfx950
        self.kernel = kernel

    def start(self, w):
        w.hz_clock = 0
        w.hz_write, w.hz_srcc, w.hz_store = {}, {}, {}

    def _check(self, p, c, reg, role, dist):
        for need, rule in requirements(p, c, reg, role, self.gfx950):
            if dist < need:
                raise ISAError(str(Violation(p.where(), c.where(), reg_name(reg), need, dist,
                                             rule, self.kernel,
                                             "reads" if role else "writes")))

    def step(self, w, idx: int):
        c = self.infos[idx]
        now = w.hz_clock
        last = w.hz_write
        for reg, role in c.reads:
            hit = last.get(reg)
            if hit is not None and now - hit[0] - 1 < MAX_WAIT:
                self._check(hit[1], c, reg, role, now - hit[0] - 1)
        for reg in c.writes:
            for table in (last, w.hz_srcc, w.hz_store):
                hit = table.get(reg)
                if hit is not None and now - hit[0] - 1 < MAX_WAIT:
                    self._check(hit[1], c, reg, None, now - hit[0] - 1)
        if c.kind in ("mfma", "valu", "salu", "vmem", "ds", "smem"):
            for reg in c.writes:
                last[reg] = (now, c)
            for reg in c.srcc:
                if reg not in c.writes:
                    w.hz_srcc[reg] = (now, c)
            for reg in c.wide_store_data:
                w.hz_store[reg] = (now, c)
        w.hz_clock = now + c.wait_states


# ----------------------------------------------------------------------------- static

def check_infos(infos: list[Info], succs: list[list[int]], gfx950: bool,
                kernel: str = "") -> list[Violation]:
    """Every violation on any path: for each instruction, the producers within MAX_WAIT
    wait states before it along every control-flow path (the minimum distance of each)."""
    preds: list[list[int]] = [[] for _ in infos]
    for i, ss in enumerate(succs):
        for s in ss:
            preds[s].append(i)
    out, seen = [], set()
    for ci, c in enumerate(infos):
        if not (c.reads or c.writes):
            continue
        best: dict[int, int] = {}
        work = [(p, 0) for p in preds[ci]]
        while work:
            pi, dist = work.pop()
            if dist >= MAX_WAIT or best.get(pi, MAX_WAIT + 1) <= dist:
                continue
            best[pi] = dist
            for q in preds[pi]:
                work.append((q, dist + infos[pi].wait_states))
        for pi, dist in sorted(best.items()):
            p = infos[pi]
            if p.kind not in ("mfma", "valu", "salu", "vmem"):
                continue
            for v in check_pair(p, c, dist, gfx950, kernel):
                key = (pi, ci, v.rule)
                if key not in seen:
                    seen.add(key)
                    out.append(v)
    return out


_LINE = re.compile(r"^\t(\S.*?)\s*//\s*([0-9a-f]+)\s*$")
_FUNC = re.compile(r"^([^\s.][^\s]*):$")
_LABEL = re.compile(r"^(\.L[0-9a-f]+):$")


def check_hazards(asm_text: str, target) -> list[Violation]:
    """Static check of a disassembly (`toolchain.amdgpu.disassemble` text, or the
    `--emit asm` listing) for `target` (gfx942 or gfx950): every pair of instructions
    closer than the rules allow, on any path (branches followed both ways, loops
    around). Returns the violations, each naming both instructions."""
    from .. import targets
    t = targets.get(target)
    if t.family != "cdna":
        raise ValueError(f"hazard rules are for CDNA targets, not {t.name}")
    gfx950 = t.name == "gfx950"
    out = []
    for kernel, lines in _functions(asm_text).items():
        insts, labels = [], {}
        for text, addr in lines:
            if text.startswith(".L"):
                labels[text] = len(insts)
                continue
            op = text.split(" ", 1)[0]
            if op == "s_branch" or op.startswith("s_cbranch_"):
                insts.append(("branch", text, addr))
            else:
                try:
                    insts.append(("inst", parse(addr, 4, text), addr))
                except DecodeError as e:
                    raise ValueError(f"{kernel}: {e}") from None
        infos, succs = [], []
        for i, (kind, x, addr) in enumerate(insts):
            if kind == "branch":
                op, _, arg = x.partition(" ")
                infos.append(Info(i, addr, op, "salu"))
                tgt = labels.get(arg.strip())
                s = [tgt] if tgt is not None else []
                if op != "s_branch" and i + 1 < len(insts):
                    s.append(i + 1)
                if op in ("s_cbranch_vccz", "s_cbranch_vccnz"):
                    infos[-1].reads = [(SGPR + VCC, "src"), (SGPR + VCC + 1, "src")]
                succs.append(s)
            else:
                infos.append(info(x, i))
                ends = x.op.startswith("s_endpgm") or x.op == "s_setpc_b64"
                succs.append([] if ends or i + 1 >= len(insts) else [i + 1])
        out += check_infos(infos, succs, gfx950, kernel)
    return out


def _functions(asm: str) -> dict[str, list[tuple[str, int]]]:
    funcs: dict[str, list] = {}
    cur = None
    for line in asm.splitlines():
        f = _FUNC.match(line)
        if f:
            cur = funcs.setdefault(f.group(1), [])
            continue
        if cur is None:
            continue
        lab = _LABEL.match(line)
        if lab:
            cur.append((lab.group(1), -1))
            continue
        m = _LINE.match(line)
        if m:
            cur.append((m.group(1), int(m.group(2), 16)))
    return funcs
