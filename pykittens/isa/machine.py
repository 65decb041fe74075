"""Loading a code object and running a dispatch of it: the kernel descriptor, the initial
register state, the kernel-argument segment, workgroups of waves with LDS and barriers,
and the wave's wait counters.

Sources: LLVM AMDGPUUsage, "Kernel Descriptor" (the 64-byte descriptor in .rodata),
"Initial Kernel Execution State" (user SGPRs in their fixed order, then the workgroup
ids, and the work-item ids in v0, packed x | y << 10 | z << 20 on gfx90a and later) and
"Code Object V5 Metadata" (hidden kernel arguments); the CDNA3 ISA guide's chapters on
the wave's state and on program control (S_WAITCNT: vector memory returns in order,
scalar memory out of order; S_BARRIER).
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from .. import targets
from . import hazards
from .decode import DecodeError, parse
from .memory import compile_ds, compile_mubuf, compile_smem
from .mfma import compile_mfma
from .scalar import END, compile_scalar
from .state import LANES, ISAError, Memory, Wave
from .vector import compile_vector

MAX_ISSUED = 20_000_000          # per wave: beyond this the kernel is taken to be looping


# ----------------------------------------------------------------------------- descriptor

@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    entry_offset: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    properties: int
    kernarg_preload: int

    @classmethod
    def parse(cls, raw: bytes) -> "KernelDescriptor":
        g, p, k = struct.unpack_from("<III", raw, 0)
        entry = struct.unpack_from("<q", raw, 16)[0]
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return cls(g, p, k, entry, rsrc1, rsrc2, rsrc3, props, preload)

    # kernel code properties (bits of bytes 56..57)
    PROPS = ("private_segment_buffer", "dispatch_ptr", "queue_ptr", "kernarg_segment_ptr",
             "dispatch_id", "flat_scratch_init", "private_segment_size")
    USER_SGPRS = {"private_segment_buffer": 4, "dispatch_ptr": 2, "queue_ptr": 2,
                  "kernarg_segment_ptr": 2, "dispatch_id": 2, "flat_scratch_init": 2,
                  "private_segment_size": 1}

    def enabled(self, prop: str) -> bool:
        return bool(self.properties >> self.PROPS.index(prop) & 1)

    @property
    def user_sgpr_count(self) -> int:
        return (self.rsrc2 >> 1) & 0x1F

    @property
    def preload_dwords(self) -> int:
        return self.kernarg_preload & 0x7F

    def workgroup_id_enabled(self, axis: int) -> bool:
        return bool(self.rsrc2 >> (7 + axis) & 1)


# ----------------------------------------------------------------------------- program

class Program:
    """One kernel of a code object, decoded and compiled into a closure per
    instruction (built once per code object and cached)."""

    def __init__(self, hsaco: bytes, target: str, kernel: str | None = None):
        from ..analysis import hsaco as hs
        from ..toolchain import amdgpu
        self.target = target
        self.info = hs.kernel(hsaco, kernel)
        self.name = self.info.name
        syms = {s.name: s for s in amdgpu.elf_symbols(hsaco)}
        kd_sym = syms.get(f"{self.name}.kd")
        if kd_sym is None:
            raise ISAError(f"{self.name}: no kernel descriptor symbol {self.name}.kd")
        self.kd = KernelDescriptor.parse(_bytes_at(hsaco, kd_sym.value, 64))
        entry = kd_sym.value + self.kd.entry_offset
        if entry != syms[self.name].value:
            raise ISAError(f"{self.name}: the kernel descriptor's entry 0x{entry:x} is not "
                           f"the kernel symbol 0x{syms[self.name].value:x}")
        self._check_modes()
        listing = amdgpu.instructions(hsaco, target)[self.name]
        try:
            self.insts = [parse(a, n, t) for a, n, t in listing]
        except DecodeError as e:
            raise ISAError(f"{self.name}: {e}") from None
        self.index = {x.addr: i for i, x in enumerate(self.insts)}
        self.fns = [self._compile(x) for x in self.insts]
        self.hz = [hazards.info(x, i) for i, x in enumerate(self.insts)]

    def _check_modes(self):
        r1 = self.kd.rsrc1
        if (r1 >> 12) & 0xF != 0:
            raise ISAError(f"{self.name}: float round mode {(r1 >> 12) & 0xF:#x} is not "
                           "round-to-nearest-even; the emulator implements only that")
        if (r1 >> 16) & 3 != 3:
            raise ISAError(f"{self.name}: f32 denormals are flushed (FLOAT_DENORM_MODE_32 = "
                           f"{(r1 >> 16) & 3}); the emulator keeps them")
        if self.kd.private_segment_fixed_size or self.kd.enabled("private_segment_buffer"):
            raise ISAError(f"{self.name} uses scratch memory "
                           f"({self.kd.private_segment_fixed_size} bytes per lane), which the "
                           "emulator does not provide")

    def index_of(self, addr: int, inst) -> int:
        if addr not in self.index:
            raise ISAError(f"{self.name}: {inst.where()} branches to 0x{addr:x}, which is not "
                           "an instruction of the kernel")
        return self.index[addr]

    def _compile(self, inst):
        op = inst.op
        ctx = self
        if op.startswith("v_mfma"):
            fn = compile_mfma(inst, ctx)
        elif op.startswith("v_"):
            fn = compile_vector(inst, ctx)
        elif op.startswith(("s_load", "s_buffer_load")) or op == "s_memrealtime":
            fn = compile_smem(inst, ctx)
        elif op.startswith("s_"):
            fn = compile_scalar(inst, ctx)
        elif op.startswith("buffer_"):
            fn = compile_mubuf(inst, ctx)
        elif op.startswith("ds_"):
            fn = compile_ds(inst, ctx)
        else:
            fn = None
        if fn is None:
            def unknown(w, inst=inst):
                raise ISAError(f"{self.name}: the ISA emulator does not implement "
                               f"{inst.mnemonic} (at 0x{inst.addr:x}: {inst.text})")
            return unknown
        return fn


def _bytes_at(hsaco: bytes, vaddr: int, n: int) -> bytes:
    from ..toolchain import amdgpu
    for s in amdgpu.elf_sections(hsaco):
        if s.type != 8 and s.addr <= vaddr < s.addr + s.size and s.size:
            off = s.offset + vaddr - s.addr
            return hsaco[off:off + n]
    raise ISAError(f"no section holds address 0x{vaddr:x}")


_PROGRAMS: dict = {}


def program(hsaco: bytes, target: str, kernel: str | None = None) -> Program:
    key = (hashlib.sha256(hsaco).hexdigest(), target, kernel)
    if key not in _PROGRAMS:
        if len(_PROGRAMS) > 64:
            _PROGRAMS.clear()
        _PROGRAMS[key] = Program(hsaco, target, kernel)
    return _PROGRAMS[key]


# ----------------------------------------------------------------------------- wait counters

class Waits:
    """The memory operations a real wave would still have in flight. Each access is done
    when it issues; its destination registers (and, for loads into LDS, its LDS bytes)
    stay pending until an s_waitcnt retires it: vector memory in issue order (vmcnt),
    LDS in order and scalar loads in any order (lgkmcnt, so only lgkmcnt(0) retires a
    scalar load). Touching a pending register or LDS byte is an error. The LDS bytes a
    DS instruction reads or writes stay pending for the other waves of the workgroup
    until lgkmcnt retires it (Workgroup.lds_read / lds_write)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def start(self, w):
        w.pend = {"vm": [], "lgkm": []}
        w.pend_regs = {}

    def issue(self, w, counter, regs, smem=False, inst=None, lds=None, ds=None):
        """`lds`: (first byte, count) a load into LDS writes; `ds`: (LDS byte indices,
        writing) of a DS instruction."""
        if not self.enabled:
            return
        entry = (tuple(regs), inst, smem, lds, ds)
        w.pend[counter].append(entry)
        for r in regs:
            w.pend_regs[r] = (counter, entry)
        if lds is not None:
            w.wg.dma.append((lds[0], lds[0] + lds[1], w, entry))
        if ds is not None and len(w.wg.waves) > 1:
            w.wg.ds_pending.append((ds[0], ds[1], w, entry))

    def wait(self, w, vm, lgkm):
        if not self.enabled:
            return
        for counter, keep in (("vm", vm), ("lgkm", lgkm)):
            q = w.pend[counter]
            if len(q) <= keep:
                continue
            if counter == "lgkm" and keep > 0 and any(e[2] for e in q):
                # scalar loads may return out of order: only the LDS entries older than
                # the last `keep` ones are known to be done, and only if no scalar load
                # is among them... be exact: nothing is guaranteed but what lgkmcnt(0) does
                continue
            done, w.pend[counter] = q[:len(q) - keep], q[len(q) - keep:]
            for e in done:
                for r in e[0]:
                    if w.pend_regs.get(r, (None, None))[1] is e:
                        del w.pend_regs[r]
                if e[3] is not None:
                    w.wg.dma = [d for d in w.wg.dma if d[3] is not e]
                if e[4] is not None:
                    w.wg.ds_pending = [d for d in w.wg.ds_pending if d[3] is not e]

    def check(self, w, hz):
        """Before `hz` (hazards.Info) issues: it must not read or write a register whose
        load has not been waited for (another load of the same in-order kind may
        overwrite one)."""
        pend = w.pend_regs
        for r, _ in hz.reads:
            if r in pend:
                self._fail(w, hz, r, pend[r], "reads")
        for r in hz.writes:
            if r in pend:
                counter, entry = pend[r]
                same_queue = hz.kind in ("vmem",) and counter == "vm" or \
                    hz.kind == "ds" and counter == "lgkm" and not entry[2]
                if not same_queue:
                    self._fail(w, hz, r, pend[r], "overwrites")

    @staticmethod
    def _fail(w, hz, r, pending, verb):
        counter, entry = pending
        inst = entry[1]
        raise ISAError(f"{hz.where()} {verb} {hazards.reg_name(r)} before the "
                       f"{inst.where()} that loads it has been waited for "
                       f"(s_waitcnt {counter}cnt)")


# ----------------------------------------------------------------------------- workgroups

class Workgroup:
    def __init__(self, run, wg_id, num_waves):
        self.prog = run.prog
        self.mem = run.mem
        self.waits = run.waits
        self.id = wg_id
        self.lds = np.zeros(max(self.prog.kd.group_segment_fixed_size, 0), np.uint8)
        self.dma: list = []
        self.ds_pending: list = []        # (LDS bytes, writing, wave, entry) not yet waited for
        self.waves = [Wave(i, self) for i in range(num_waves)]
        self.run = run
        gx, gy = run.grid[0], run.grid[1]
        self.index = wg_id[0] + gx * (wg_id[1] + gy * wg_id[2])     # in the launch

    # LDS ------------------------------------------------------------------------------------
    def _check_lds(self, w, lo: np.ndarray, size: int, inst, writing: bool, dma: bool = False):
        if lo.size == 0:
            return
        n = len(self.lds)
        bad = (lo < 0) | (lo + size > n)
        if bad.any():
            a = int(lo[bad][0])
            raise ISAError(f"{inst.where()} accesses LDS bytes {a}..{a + size - 1}; the "
                           f"workgroup has {n}")
        for start, end, owner, entry in self.dma:
            if dma and owner is w:
                continue
            hit = (lo < end) & (lo + size > start)
            if hit.any():
                raise ISAError(
                    f"{inst.where()} {'writes' if writing else 'reads'} LDS bytes "
                    f"{start}..{end - 1} "
                    f"while wave {owner.id}'s {entry[1].where()} may still be writing them "
                    "(no s_waitcnt vmcnt / barrier in between)")

    def _check_ds(self, w, touched: np.ndarray, inst, writing: bool):
        """LDS requests of different waves are not ordered by s_barrier alone: "the LDS
        memory has multiple request queues shared by the SIMDs of a CU. Therefore, the LDS
        operations performed by different wavefronts of a work-group can be reordered
        relative to each other" (LLVM AMDGPUUsage, Memory Model GFX942; likewise GFX90A),
        so a wave waits with s_waitcnt lgkmcnt(0) before the barrier that hands LDS over.
        Touching bytes another wave's DS instruction writes (or, writing, reads) before
        that wave has waited for it is a race."""
        for b, wrote, owner, entry in self.ds_pending:
            if owner is w or not (wrote or writing):
                continue
            both = np.intersect1d(b, touched)
            if both.size:
                raise ISAError(
                    f"{inst.where()} {'writes' if writing else 'reads'} LDS bytes "
                    f"{int(both[0])}..{int(both[-1])} while wave {owner.id}'s "
                    f"{entry[1].where()} may still be {'writing' if wrote else 'reading'} "
                    "them (no s_waitcnt lgkmcnt(0) in that wave before the barrier)")

    def lds_read(self, w, addr: np.ndarray, size: int, inst, touched: list | None = None
                 ) -> np.ndarray:
        """The bytes each lane reads; with `touched`, the byte indices read are appended
        (for Waits.issue: pending for the other waves until waited for)."""
        act = w.exec
        self._check_lds(w, addr[act], size, inst, False)
        if touched is not None or self.ds_pending:
            b = (addr[act][:, None] + np.arange(size)).ravel()
            if self.ds_pending:
                self._check_ds(w, b, inst, False)
            if touched is not None:
                touched.append(b)
        safe = np.where(act, addr, 0)
        return self.lds[safe[:, None] + np.arange(size)]

    def lds_write(self, w, addr: np.ndarray, raw: np.ndarray, inst,
                  touched: list | None = None):
        size = raw.shape[1] if raw.ndim == 2 else 1
        dma = inst.op.startswith("buffer_")
        self._check_lds(w, addr, size, inst, True, dma)
        if touched is not None or self.ds_pending:
            b = (addr[:, None] + np.arange(size)).ravel()
            if self.ds_pending:
                self._check_ds(w, b, inst, True)
            if touched is not None:
                touched.append(b)
        self.lds[addr[:, None] + np.arange(size)] = raw


class Run:
    """One dispatch: the program, global memory and the per-wave checkers."""

    def __init__(self, prog: Program, mem: Memory, kernarg_addr: int, grid, num_waves,
                 dispatch_ptr: int = 0, check_hazards: bool = True, check_waits: bool = True):
        self.prog, self.mem = prog, mem
        self.kernarg = kernarg_addr
        self.dispatch_ptr = dispatch_ptr
        self.grid = grid
        self.num_waves = num_waves
        self.waits = Waits(check_waits)
        self.prog_target = targets.get(prog.target)
        self.realtime = 0                     # s_memrealtime's counter (compile_smem)
        self.tracker = hazards.Tracker(prog.hz, prog.target == "gfx950", prog.name) \
            if check_hazards else None
        self.issued = 0

    def init_wave(self, w: Wave, wg_id):
        kd = self.prog.kd
        s = 0
        for prop in KernelDescriptor.PROPS:
            if not kd.enabled(prop):
                continue
            n = KernelDescriptor.USER_SGPRS[prop]
            if prop == "kernarg_segment_ptr":
                w.write_sgpr(s, self.kernarg, 2)
            elif prop == "dispatch_ptr":
                w.write_sgpr(s, self.dispatch_ptr, 2)
            elif prop == "dispatch_id":
                w.write_sgpr(s, 0, 2)
            else:
                raise ISAError(f"{self.prog.name} asks for the {prop.replace('_', ' ')} in "
                               "SGPRs, which the emulator does not provide")
            s += n
        if kd.preload_dwords:
            raw = self.mem.read_bytes(self.kernarg + 4 * ((kd.kernarg_preload >> 7) & 0x1FF),
                                      4 * kd.preload_dwords)
            for i, v in enumerate(struct.unpack(f"<{kd.preload_dwords}I", raw)):
                w.s[s + i] = v
            s += kd.preload_dwords
        if s != kd.user_sgpr_count:
            raise ISAError(f"{self.prog.name}: {kd.user_sgpr_count} user SGPRs declared, "
                           f"{s} set up")
        for axis in range(3):
            if kd.workgroup_id_enabled(axis):
                w.s[s] = wg_id[axis]
                s += 1
        if kd.rsrc2 >> 10 & 1:
            raise ISAError(f"{self.prog.name} asks for the workgroup info SGPR")
        tid = np.arange(LANES, dtype=np.uint32) + LANES * w.id
        w.v[0] = tid                              # x | y << 10 | z << 20, y = z = 0
        w.s[124] = 0
        self.waits.start(w)
        if self.tracker:
            self.tracker.start(w)

    def run_workgroup(self, wg_id):
        wg = Workgroup(self, wg_id, self.num_waves)
        for w in wg.waves:
            self.init_wave(w, wg_id)
        while True:
            live = [w for w in wg.waves if not w.done]
            if not live:
                break
            for w in live:
                self.run_wave(w)
            live = [w for w in wg.waves if not w.done]
            for w in live:                       # everyone left is at the barrier
                w.at_barrier = False
        return wg

    def run_wave(self, w: Wave):
        fns, hz, tracker = self.prog.fns, self.prog.hz, self.tracker
        waits = self.waits if self.waits.enabled else None
        n = len(fns)
        pc = w.pc
        issued = 0
        try:
            while True:
                if pc >= n:
                    raise ISAError(f"{self.prog.name}: wave {w.id} ran past the last "
                                   "instruction without s_endpgm")
                if waits is not None and w.pend_regs:
                    waits.check(w, hz[pc])
                if tracker is not None:
                    tracker.step(w, pc)
                r = fns[pc](w)
                issued += 1
                if r is None:
                    pc += 1
                elif r >= 0:
                    pc = r
                    if issued > MAX_ISSUED:
                        raise ISAError(f"{self.prog.name}: wave {w.id} issued more than "
                                       f"{MAX_ISSUED} instructions; is it looping?")
                elif r == END:
                    w.done = True
                    break
                else:
                    w.at_barrier = True
                    pc += 1
                    break
        except ISAError as e:
            raise ISAError(self._where(w, pc, str(e))) from None
        except Exception as e:                   # a bug in the emulator: say where
            raise ISAError(self._where(w, pc, f"{type(e).__name__}: {e}")) from e
        finally:
            w.pc = pc
            self.issued += issued

    def _where(self, w, pc, msg: str) -> str:
        inst = self.prog.insts[min(pc, len(self.prog.insts) - 1)]
        tag = f"[{self.prog.name}]"
        if msg.startswith(tag):
            msg = msg[len(tag):].lstrip()
        if f"at 0x{inst.addr:x}" not in msg:
            msg = f"{inst.where()} ({inst.text}): {msg}"
        return f"{tag} workgroup {tuple(w.wg.id)} wave {w.id}: {msg}"


# ----------------------------------------------------------------------------- snippets

def lane_bits(val) -> np.ndarray:
    """32-bit register contents of a value: floats as float32 bits, integers two's
    complement."""
    a = np.asarray(val)
    if a.dtype.kind == "f":
        return a.astype(np.float32).view(np.uint32)
    return a.astype(np.int64).astype(np.uint32)


class Snippet(Program):
    """A few instructions given as text (LLVM's syntax, branch operands as the encoded
    word offset) run as a kernel of their own: for testing instruction semantics without
    a code object."""

    def __init__(self, asm, target: str, lds_bytes: int = 0):
        lines = [x.strip() for x in (asm.splitlines() if isinstance(asm, str) else asm)]
        lines = [x for x in lines if x and not x.startswith(";")]
        if not lines or not lines[-1].startswith("s_endpgm"):
            lines.append("s_endpgm")
        self.target, self.name = target, "snippet"
        self.kd = KernelDescriptor(lds_bytes, 0, 0, 0, 0, 0, 0, 0, 0)
        self.insts = [parse(4 * i, 4, t) for i, t in enumerate(lines)]
        self.index = {x.addr: i for i, x in enumerate(self.insts)}
        self.fns = [self._compile(x) for x in self.insts]
        self.hz = [hazards.info(x, i) for i, x in enumerate(self.insts)]


def execute(asm, target: str = "gfx950", *, v: dict | None = None, s: dict | None = None,
            exec_mask: int | None = None, scc: int = 0, lds: np.ndarray | None = None,
            mem: Memory | None = None, check_hazards: bool = True,
            check_waits: bool = True) -> Wave:
    """Run the instructions `asm` on one wave of one workgroup and return the wave (its
    `v` file, a0 = row 256, `s` list, `scc`, `wg.lds`). `v` maps a vector register
    (unified index) to a value or a 64-lane array, `s` an SGPR to an int; `lds` is the
    workgroup's initial LDS, `mem` global memory for buffer and scalar loads."""
    prog = Snippet(asm, target, 0 if lds is None else len(lds))
    run = Run(prog, mem or Memory(), 0, (1, 1, 1), 1, 0, check_hazards, check_waits)
    wg = Workgroup(run, (0, 0, 0), 1)
    if lds is not None:
        wg.lds[:] = np.asarray(lds, np.uint8)
    w = wg.waves[0]
    run.waits.start(w)
    if run.tracker:
        run.tracker.start(w)
    for r, val in (v or {}).items():
        w.v[r] = np.broadcast_to(lane_bits(val), (LANES,))
    for r, val in (s or {}).items():
        w.s[r] = int(val) & 0xFFFFFFFF
    if exec_mask is not None:
        w.set_exec(exec_mask)
    else:
        w.exec_changed()
    w.scc = scc
    with np.errstate(all="ignore"):
        while not w.done:
            run.run_wave(w)
            w.at_barrier = False
    return w
