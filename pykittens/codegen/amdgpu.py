"""AMDGPU dialect (gfx942, gfx950): workgroup/workitem ids, buffer resources whose out-of-range
accesses read zero, LDS as one static array, ds_bpermute for cross-lane exchange."""
from __future__ import annotations

from ..ir import types as T
from ..targets import cdna
from .llvm import Renderer, Value, llty

DATALAYOUT = ("e-m:e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-"
              "p7:160:256:256:32-p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-"
              "v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-n32:64-"
              "S32-A5-G1-ni:7:8:9")


class AMDGPURenderer(Renderer):
    dialect_name = "amdgpu"
    GPU_SCOPE = "agent"           # one GPU (LLVM AMDGPU memory model)
    # v_exp_f32 alone (about 1 ulp; subnormal results flush to zero), without the
    # v_ldexp rescaling LLVM's generic exp2 adds for them
    HARDWARE_MATH = {"exp2": "llvm.amdgcn.exp2.f32"}

    def module_header(self):
        return (f'target datalayout = "{DATALAYOUT}"\n'
                f'target triple = "{self.p.target.triple}"')

    def module_footer(self):
        threads = self.p.num_waves * self.p.wave_size
        extra = ""
        pins = self._pins()
        if any(f == "a" for f, _, _ in pins):
            # The register allocator gets no AGPRs: the pinned accumulators are ours alone.
            extra += ' "amdgpu-agpr-alloc"="0"'
        cap = self._vgpr_cap(pins)
        if cap is not None:
            extra += f' "amdgpu-num-vgpr"="{cap}"'
        if self.p.programs_per_cu:
            # waves per SIMD (EU) that n workgroups put there: LLVM sizes registers to fit
            t = self.p.target
            per_eu = -(-self.p.programs_per_cu * self.p.num_waves // t.simds_per_cu)
            extra += f' "amdgpu-waves-per-eu"="{min(per_eu, t.max_waves_per_simd)}"'
        attrs = (f'attributes #0 = {{ "amdgpu-flat-work-group-size"="{threads},{threads}" '
                 f'"target-cpu"="{self.p.target.name}" "uniform-work-group-size"="true"{extra} }}')
        return attrs + "\n\n" + self._line_table_metadata()

    def _vgpr_cap(self, pins):
        """The "amdgpu-num-vgpr" value that keeps LLVM's allocator below the lowest pinned
        VGPR and, with pinned AGPRs, inside the wave's share of the unified register file
        less those AGPRs (LLVM does not count registers that only inline asm names; AGPRs
        start at a multiple of 4 past the VGPRs). LLVM reads the attribute on gfx90a-class
        chips as half of a VGPR+AGPR total (GCNSubtarget::getBaseMaxNumVGPRs doubles it),
        which its VGPRs may fill when it allocates no AGPRs, and ignores a total above the
        wave's share: so half the cap, which also bounds VGPRs when it does use AGPRs.
        With pinned AGPRs the total stays at most the 256 VGPRs: above that LLVM selects
        the AGPR forms of its MFMAs (SIMachineFunctionInfo's MayNeedAGPRs) and allocates
        their results in AGPRs, amdgpu-agpr-alloc notwithstanding, over the pinned ones."""
        vlow = min((first for f, first, _ in pins if f == "v"), default=None)
        agprs = max((first + n for f, first, n in pins if f == "a"), default=0)
        t = self.p.target
        per_simd = -(-self.p.num_waves // t.simds_per_cu)
        if agprs:
            share = t.unified_regs // per_simd // t.reg_granule * t.reg_granule
            left = min((share - agprs) // 4 * 4, t.vgprs)
            vlow = left if vlow is None else min(vlow, left)
        return None if vlow is None else vlow // 2

    # -- edge code, marked in the line table ------------------------------------------------
    # The report counts the main loop's instructions that an interior tile runs apart from
    # the ragged-edge code it never reaches. The fast/edge splits are lane-IR decisions,
    # rendered as branches whose "edge" side is a block (and everything nested in it) until
    # its join; instructions rendered there get source line EDGE_LINE, all others MAIN_LINE,
    # in line-only debug info: no instruction is added, and the code object's .debug_line maps
    # every instruction address back to its side (analysis/hsaco.py). The exec-mask code LLVM
    # adds where divergent sides meet carries no line (0): it runs on every path.
    MAIN_LINE, EDGE_LINE = 1, 2
    LOCATION = {MAIN_LINE: "!7", EDGE_LINE: "!8"}      # their DILocation nodes below
    FAST_SIDES = ("ld_full", "st_full", "run_vec", "lds_dma")

    def branch(self, cond, yes, no, join):
        labels = super().branch(cond, yes, no, join)
        if yes in self.FAST_SIDES:
            self.edge_starts[labels[1]] = labels[2]
        return labels

    def ins(self, text: str):
        edge = self.edge_stack and self.lines is not getattr(self, "entry_lines", None)
        super().ins(f"{text}, !dbg {self.LOCATION[self.EDGE_LINE if edge else self.MAIN_LINE]}")

    def _line_table_metadata(self) -> str:
        return "\n".join((
            "!llvm.dbg.cu = !{!0}",
            "!llvm.module.flags = !{!4, !5}",
            '!0 = distinct !DICompileUnit(language: DW_LANG_C99, file: !1, producer: '
            '"pykittens", isOptimized: true, runtimeVersion: 0, emissionKind: LineTablesOnly)',
            f'!1 = !DIFile(filename: "{self.p.name}.pykittens", directory: "")',
            f'!2 = distinct !DISubprogram(name: "{self.p.name}", scope: !1, file: !1, line: 1, '
            "type: !3, scopeLine: 1, spFlags: DISPFlagDefinition | DISPFlagOptimized, unit: !0)",
            "!3 = !DISubroutineType(types: !6)",
            '!4 = !{i32 2, !"Debug Info Version", i32 3}',
            '!5 = !{i32 7, !"Dwarf Version", i32 5}',
            "!6 = !{}",
            *(f"{node} = !DILocation(line: {line}, scope: !2)"
              for line, node in self.LOCATION.items())))

    def _pins(self):
        from ..ir.nodes import walk
        seen = {}
        for op in walk(self.p.body):
            for r in (op.dst, *op.srcs):
                pin = getattr(getattr(r, "type", None), "pin", None)
                if pin is not None:
                    seen[r] = (pin[0], pin[1], r.type.dwords)
        return list(seen.values())

    # -- pinned registers: every access is inline asm naming the physical registers ----------
    def read(self, reg):
        pin = getattr(reg.type, "pin", None)
        if pin is None:
            return super().read(reg)
        n_words = reg.type.dwords
        words = [self._read_word(reg, i, last=i == n_words - 1) for i in range(n_words)]
        packed = self.build(words) if len(words) > 1 else words[0]
        n, ety = reg.type.nslots, llty(reg.type.dtype)
        return self.op(f"bitcast {packed} to <{n} x {ety}>", ety, n)

    def _read_word(self, reg, i, last=True) -> Value:
        """Word i (32 bits) of a pinned tile, as an i32 LLVM holds in a VGPR of its choice."""
        f, first = reg.type.pin
        asm = f"v_accvgpr_read_b32 $0, a{first + i}" if f == "a" else f"v_mov_b32 $0, v{first + i}"
        # The words land in VGPRs LLVM picked, written by inline asm, which LLVM does not
        # count as VALU writes: an MFMA intrinsic reading them next needs the wait states
        # after the last word (kernels with intrinsic MFMAs only).
        after = self.ws.valu_write_mfma_read if self.hz_intrinsic and last else 0
        asm = self._guarded(asm, reads=[(f, first + i)], after=after)
        r = self.fresh()
        self.ins(f'{r} = call i32 asm sideeffect "{asm}", "=v"()')
        return Value(r, "i32", 0)

    def write(self, reg, v: Value):
        pin = getattr(reg.type, "pin", None)
        if pin is None:
            return super().write(reg, v)
        n = reg.type.nslots
        if v.n != n:
            v = self.splat(v, n)
        k = reg.type.dwords
        words = self.op(f"bitcast {v} to <{k} x i32>", "i32", k)
        for i in range(k):
            self._write_word(reg, i, self.extract(words, i), first_word=i == 0)

    def _write_word(self, reg, i, w: Value, first_word=True):
        f, first = reg.type.pin
        r = first + i
        asm = f"v_accvgpr_write_b32 a{r}, $0" if f == "a" else f"v_mov_b32 v{r}, $0"
        # An f32 value may come straight from an MFMA intrinsic's result registers, and
        # LLVM does not see this asm as the VALU read that must wait for them.
        before = self.hz_intrinsic_after_write if first_word and reg.type.dtype == T.f32 else 0
        asm = self._guarded(asm, writes=[(f, r)], before=before)
        self.ins(f'call void asm sideeffect "{asm}", "v,~{{{f}{r}}}"({w})')

    def _updates_pinned(self, op) -> bool:
        """An elementwise op that rewrites a pinned tile from itself (acc *= alpha)."""
        return getattr(getattr(op.dst, "type", None), "pin", None) is not None and \
            op.dst in op.srcs and op.dst.type.nslots > 1

    def _pinned_wordwise(self, op, fn):
        """dst <- fn(operands) for a pinned dst that is one of the operands, one 32-bit word
        at a time: read the word, compute, write it back. The tile never sits in VGPRs
        whole, as reading it all before writing it back would have it (asm keeps order)."""
        dst = op.dst
        n, per = dst.type.nslots, max(1, 4 // dst.type.dtype.bytes)
        ety = llty(dst.type.dtype)
        others = {}
        for s_ in op.srcs:
            if s_ is not dst and s_ not in others:
                v = self.read(s_)
                others[s_] = self.splat(v, n) if v.n not in (0, n) else v
        words = dst.type.dwords
        for i in range(words):
            w = self._read_word(dst, i, last=i == words - 1)
            cur = self.op(f"bitcast i32 {w.text} to {ety if per == 1 else f'<{per} x {ety}>'}",
                          ety, 0 if per == 1 else per)
            idx = list(range(i * per, (i + 1) * per))
            vals = [cur if s_ is dst else
                    (others[s_] if others[s_].n == 0 else
                     (self.extract(others[s_], idx[0]) if per == 1 else
                      self.pick(others[s_], idx))) for s_ in op.srcs]
            res = fn(vals)
            out = self.op(f"bitcast {res} to i32", "i32", 0)
            self._write_word(dst, i, out, first_word=i == 0)

    def r_bin(self, op):
        if self._updates_pinned(op):
            d = op.dst.type.dtype
            return self._pinned_wordwise(op, lambda v: self.binary(op.attrs["op"], v[0], v[1], d))
        super().r_bin(op)

    # -- wait states around the inline asm --------------------------------------------------
    # LLVM's hazard recognizer does not look inside inline asm, and LLVM never touches pinned
    # registers, so every dependency on a pinned register runs between two of our asm
    # statements. The hardware does not interlock the MFMA ones (targets/cdna.py,
    # WAIT_STATES_*): each asm statement that consumes such a dependency carries the s_nops
    # it needs *in its own string*, in front of the instruction, so nothing LLVM schedules
    # can separate the nops from the consumer (a separate s_nop statement, or a
    # sched_barrier, would still let LLVM place the consumer elsewhere relative to the
    # producer). How many: the count of instructions our asm issued since the producer is a
    # lower bound on the distance only within one LLVM basic block (asm statements with side
    # effects keep their order and are never dropped; LLVM may only add instructions between
    # them). At every block start the tracker therefore assumes that every producer the
    # kernel has for a register (its MFMAs, its pinned writes) ran just before.
    def _hazard_setup(self):
        from ..ir.nodes import walk
        self.edge_starts, self.edge_stack = {}, []
        self.ws = self.p.target.mfma_wait_states
        self.hz_pos = 0            # instructions our inline asm has issued so far
        self.hz = {}               # (file, reg) -> {"valu": pos, "xdl": (pos, passes, rng),
        seed = {}                  #                 "srcc": (pos, passes)}
        intrinsic = 0
        for op in walk(self.p.body):
            pin = getattr(getattr(op.dst, "type", None), "pin", None)
            if op.kind == "mma" and self._pinned_mma(op):
                ins = op.attrs["instr"]
                rng = self._acc_range(op)
                for r in self._regs(rng):
                    e = seed.setdefault(r, {})
                    old = e.get("xdl")
                    same = old is None or old[2] == rng
                    e["xdl"] = (0, max(ins.passes, old[1] if old else 0), rng if same else None)
                    e["srcc"] = (0, max(ins.passes, e.get("srcc", (0, 0))[1]))
            elif op.kind == "mma":
                intrinsic = max(intrinsic, op.attrs["instr"].passes)
                if pin is not None:
                    self._seed_valu(seed, op.dst)
            elif pin is not None:
                self._seed_valu(seed, op.dst)
        self.hz_seed = seed
        self.hz_intrinsic = intrinsic > 0
        self.hz_intrinsic_after_write = self.ws.after_write(intrinsic) if intrinsic else 0

    @staticmethod
    def _seed_valu(seed, reg):
        f, first = reg.type.pin
        for i in range(reg.type.dwords):
            seed.setdefault((f, first + i), {})["valu"] = 0

    @staticmethod
    def _regs(rng):
        f, lo, hi = rng
        return [(f, r) for r in range(lo, hi + 1)]

    def _acc_range(self, op):
        f, first = op.srcs[2].type.pin
        cs = op.attrs["c_slots"]
        return f, first + cs[0], first + cs[-1]

    @staticmethod
    def _pinned_mma(op) -> bool:
        return getattr(op.srcs[2].type, "pin", None) is not None and op.srcs[2] is op.dst

    def start_block(self, name):
        super().start_block(name)
        if name in self.edge_starts:
            self.edge_stack.append(self.edge_starts.pop(name))
        elif self.edge_stack and name == self.edge_stack[-1]:
            self.edge_stack.pop()
        at = self.hz_pos - 1       # a producer may have issued right before this block
        self.hz = {r: {k: (at, *v[1:]) if isinstance(v, tuple) else at for k, v in e.items()}
                   for r, e in self.hz_seed.items()}

    def _guarded(self, asm: str, reads=(), writes=(), mfma=None, before=0, after=0) -> str:
        """`asm` (one instruction) with the s_nops its pinned-register dependencies need in
        front (and `after` more behind it), the tracker updated. reads/writes: registers a
        VALU instruction reads / writes; mfma: (A and B registers, C = D range, passes)."""
        ws = self.ws
        need = before

        def gap(pos):              # wait states between a producer at pos and this one
            return self.hz_pos - pos - 1

        for r in reads:
            e = self.hz.get(r, {})
            if "xdl" in e:
                need = max(need, ws.after_write(e["xdl"][1]) - gap(e["xdl"][0]))
        for r in writes:
            e = self.hz.get(r, {})
            if "xdl" in e:
                need = max(need, ws.after_write(e["xdl"][1]) - gap(e["xdl"][0]))
            if "srcc" in e:
                need = max(need, ws.after_srcc_read(e["srcc"][1]) - gap(e["srcc"][0]))
        if mfma is not None:
            ab, crng, _ = mfma
            for r in ab:
                e = self.hz.get(r, {})
                if "valu" in e:
                    need = max(need, ws.valu_write_mfma_read - gap(e["valu"]))
                if "xdl" in e:
                    need = max(need, ws.after_write(e["xdl"][1]) - gap(e["xdl"][0]))
            for r in self._regs(crng):
                e = self.hz.get(r, {})
                if "valu" in e:
                    need = max(need, ws.valu_write_mfma_read - gap(e["valu"]))
                if "xdl" in e and e["xdl"][2] != crng:
                    need = max(need, ws.after_write_srcc_overlap(e["xdl"][1]) - gap(e["xdl"][0]))
        need = max(need, 0)
        at = self.hz_pos + need    # where the instruction issues
        for r in writes:
            self.hz[r] = {"valu": at}
        if mfma is not None:
            _, crng, passes = mfma
            for r in self._regs(crng):
                self.hz[r] = {"xdl": (at, passes, crng), "srcc": (at, passes)}
        self.hz_pos = at + 1 + after
        return "\\0A".join(self._nops(need) + [asm] + self._nops(after))

    def _nops(self, n: int) -> list[str]:
        out = []
        while n > 0:
            k = min(n, self.ws.nop_max)
            out.append(f"s_nop {k - 1}")
            n -= k
        return out

    def _asm_operand(self, reg_v, slots, ins, inputs: list, regs: list):
        """Register text for an MFMA operand in inline asm: the pinned range itself (its
        registers added to `regs`), or an input operand ($n) passed as dword-typed VGPRs."""
        pin = getattr(reg_v.type, "pin", None)
        per = reg_v.type.dtype.bytes
        if pin is not None:
            f, first = pin
            lo = first + slots[0] * per // 4
            hi = first + (slots[-1] + 1) * per // 4 - 1
            regs += self._regs((f, lo, hi))
            return f"{f}[{lo}:{hi}]"
        v = self.read(reg_v)
        k = len(slots)
        sub = self.pick(v, slots)
        words = k * per // 4
        inputs.append(self.op(f"bitcast {sub} to <{words} x i32>", "i32", words))
        return f"${len(inputs) - 1}"

    def _mfma_pinned(self, op):
        """An MFMA whose accumulator is pinned: one inline-asm instruction on the physical
        registers, so no copies in or out of the accumulation registers. Plain fp8 on the
        f8f6f4 instructions is their unscaled form; block-scaled ones take their E8M0 scale
        registers as VGPR inputs (byte 0: op_sel 0)."""
        ins = op.attrs["instr"]
        a_v, b_v, c_v = op.srcs[:3]
        f, lo, hi = rng = self._acc_range(op)
        inputs: list = []
        ab: list = []
        a_txt = self._asm_operand(a_v, op.attrs["a_slots"], ins, inputs, ab)
        b_txt = self._asm_operand(b_v, op.attrs["b_slots"], ins, inputs, ab)
        acc = f"{f}[{lo}:{hi}]"
        src_c = "0" if op.attrs.get("zero") else acc        # an inline-constant zero C
        text = f"{ins.name} {acc}, {a_txt}, {b_txt}, {src_c}"
        if ins.scaled:
            for s, key in zip(op.srcs[3:5], ("sa_slots", "sb_slots")):
                inputs.append(self._scale_operand(s, op.attrs[key]))
            text += f", ${len(inputs) - 2}, ${len(inputs) - 1} op_sel_hi:[0,0,0]"
        if ins.scaled or ins.no_scale:
            fmt = cdna.F8F6F4_FORMAT[ins.ab_dtype]
            text += f" cbsz:{fmt} blgp:{fmt}" if fmt else ""
        # Inputs ($n) are VGPRs LLVM's own VALU code may have written just before: it does not
        # know this asm reads them as MFMA operands.
        before = self.ws.valu_write_mfma_read if inputs else 0
        asm = self._guarded(text, mfma=(ab, rng, ins.passes), before=before)
        clob = ",".join(f"~{{{f}{r}}}" for r in range(lo, hi + 1))
        cons = ",".join(["v"] * len(inputs) + [clob])
        args = ", ".join(str(x) for x in inputs)
        self.ins(f'call void asm sideeffect "{asm}", "{cons}"({args})')

    def function_header(self, args):
        return f"define amdgpu_kernel void @{self.p.name}({args}) #0 !dbg !2"

    def arg_type(self, a):
        return {"ptr": "ptr addrspace(1)", "i32": "i32", "f32": "float"}[a.dtype]

    def prologue(self):
        self.rsrc = {}
        self._hazard_setup()
        self.entry_lines = self.lines
        self.lines = []
        tid = self.call("i32", "llvm.amdgcn.workitem.id.x", [])
        self.tid = Value(tid, "i32", 0)
        self.lane = self.op(f"and i32 {tid}, {self.p.wave_size - 1}", "i32", 0)
        if self.p.lds_bytes:
            self.globals.append(f"@lds = internal addrspace(3) global [{self.p.lds_bytes} x i8] "
                                "poison, align 16")

    def special(self, name, axis):
        xyz = "xyz"[axis]
        if name == "program_id":
            return Value(self.call("i32", f"llvm.amdgcn.workgroup.id.{xyz}", []), "i32", 0)
        if name == "num_programs":
            # Code object v5 implicit arguments start with hidden_block_count_{x,y,z}.
            base = self.call("ptr addrspace(4)", "llvm.amdgcn.implicitarg.ptr", [])
            p = self.op(f"getelementptr i8, ptr addrspace(4) {base}, i64 {4 * axis}",
                        "ptr addrspace(4)", 0)
            return self.op(f"load i32, ptr addrspace(4) {p.text}, align 4, !invariant.load !{{}}",
                           "i32", 0)
        if name == "lane_id":
            return self.lane
        if name == "wave_id":
            w = self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length() - 1}", "i32", 0)
            return Value(self.call("i32", "llvm.amdgcn.readfirstlane.i32", [str(w)]), "i32", 0)
        raise NotImplementedError(name)

    def uniform(self, v: Value) -> Value:
        """Into a scalar register (the value is the same in every lane): usable in scalar
        control flow and address arithmetic."""
        x = self.to_i32(v)
        r = Value(self.call("i32", "llvm.amdgcn.readfirstlane.i32", [str(x)]), "i32", 0)
        return self.from_i32(r, v.ety)

    def lane_xor(self, v: Value, mask: int) -> Value:
        """Value of lane (lane ^ mask), cheapest first: DPP quad permutes (VALU) for masks 1
        and 2, ds_swizzle's bit mode inside 32 lanes, ds_bpermute across the halves."""
        x = self.to_i32(v)
        if mask in cdna.DPP_QUAD_PERM_XOR:
            r = self.call("i32", "llvm.amdgcn.update.dpp.i32",
                          ["i32 poison", str(x), f"i32 {cdna.DPP_QUAD_PERM_XOR[mask]}",
                           "i32 15", "i32 15", "i1 true"])
        elif mask < 32:
            r = self.call("i32", "llvm.amdgcn.ds.swizzle",
                          [str(x), f"i32 {cdna.ds_swizzle_xor(mask)}"])
        else:
            addr = self.op(f"xor i32 {self.lane.text}, {mask}", "i32", 0)
            addr = self.op(f"shl i32 {addr.text}, 2", "i32", 0)
            r = self.call("i32", "llvm.amdgcn.ds.bpermute", [str(addr), str(x)])
        return self.from_i32(Value(r, "i32", 0), v.ety)

    def lds_symbol(self):
        return "@lds"

    def vote_any(self, c: Value) -> Value:
        """A ballot of the active lanes is non-zero."""
        b = self.call("i64", "llvm.amdgcn.ballot.i64", [str(c)])
        return self.op(f"icmp ne i64 {b}, 0", "i1", 0)

    # -- global memory through buffer resources ---------------------------------------------
    def resource(self, gl) -> str:
        """One buffer resource per tensor, built in the entry block (uniform: SGPRs). A peer
        view's is built where the view picks its pointer (r_peer), the rank being known only
        there; where the view's pointer is another value (a phi after a loop or a branch),
        at the use, uncached (LLVM merges the copies)."""
        if gl in self.views:
            ptr = self.base_pointer(gl)
            return self.rsrc.get((gl, ptr)) or self._make_resource(gl, ptr)
        if gl not in self.rsrc:
            saved, self.lines = self.lines, self.entry_lines
            self.rsrc[gl] = self._make_resource(gl, f"%{gl.name}")
            self.lines = saved
        return self.rsrc[gl]

    def _make_resource(self, gl, ptr: str) -> str:
        """A raw buffer resource over the tensor at `ptr`: size0 * stride0 elements, so
        out-of-range accesses read zero and drop stores."""
        esz = gl.type.dtype.bytes
        n0 = self.op(f"zext i32 %{gl.name}.size0 to i64", "i64", 0)
        if gl.type.rank > 1:
            s0 = self.op(f"zext i32 %{gl.name}.stride0 to i64", "i64", 0)
            n0 = self.op(f"mul i64 {n0.text}, {s0.text}", "i64", 0)
        nbytes = self.op(f"mul i64 {n0.text}, {esz}", "i64", 0)
        return self.call("ptr addrspace(8)", "llvm.amdgcn.make.buffer.rsrc.p8.p1",
                         [f"ptr addrspace(1) {ptr}", "i16 0", str(nbytes),
                          f"i32 {cdna.BUFFER_RSRC_WORD3}"])

    def r_peer(self, op):
        super().r_peer(op)
        ptr = self.base_pointer(op.dst)
        self.rsrc[(op.dst, ptr)] = self._make_resource(op.dst, ptr)

    def timestamp_words(self):
        """s_memrealtime (the 64-bit constant-clock counter), the HW_ID register and XCC_ID
        (s_getreg_b32, whole registers: cdna.HWREG_*)."""
        t = self.call("i64", "llvm.amdgcn.s.memrealtime", [])
        hw, xcc = (Value(self.call("i32", "llvm.amdgcn.s.getreg", [f"i32 {reg}"]), "i32", 0)
                   for reg in (cdna.HWREG_HW_ID, cdna.HWREG_XCC_ID))
        return [*self.split_timer(t), hw, xcc]

    def spin_pause(self):
        self.call("void", "llvm.amdgcn.s.sleep", [f"i32 {cdna.FLAG_POLL_SLEEP}"])

    def _buf_ty(self, ety, k):
        suffix = {"float": "f32", "bfloat": "bf16", "half": "f16", "i32": "i32", "i8": "i8"}[ety]
        return (ety, suffix) if k == 1 else (f"<{k} x {ety}>", f"v{k}{suffix}")

    def _boff(self, off: Value, esz: int, mask: Value | None = None) -> Value:
        b = self.op(f"mul i32 {off.text}, {esz}", "i32", 0)
        if mask is None:
            return b
        oob = cdna.BUFFER_OOB_OFFSET - (1 << 32)
        if isinstance(mask, _ColumnMask):        # an outside column sets the offset's top bit
            top = self.op(f"and i32 {mask.outside.text}, {oob}", "i32", 0)
            b = self.op(f"or i32 {b.text}, {top.text}", "i32", 0)
            mask = mask.ok
            if mask.text == "true":
                return b
        return self.op(f"select i1 {mask.text}, i32 {b.text}, i32 {oob}", "i32", 0)

    def _tensor_window(self, op, nvals):
        self._one_row = op.attrs["layout"].shape[0] == 1
        return super()._tensor_window(op, nvals)

    def _elements(self, off, ok, last, k):
        """Per-element (offset, valid) of an edge run. In a window of one row (the row
        kernels' tiles) the column bound is kept in an integer: an i1 per element lives in a
        pair of SGPRs, and where a loop walks rows over the same columns, LLVM hoists every
        one of those compares out of it (the backward norms do, and ran out of SGPRs).
        `outside` is negative exactly where the column is outside [0, size); the i1 form is
        there for the selects of a non-zero fill. Other windows (and single-element runs)
        keep the combined i1."""
        if k == 1 or not getattr(self, "_one_row", False):
            return super()._elements(off, ok, last, k)
        idx, size = last
        # columns left from this lane's first: frozen, so that LLVM does not reassociate
        # (size - idx) - i into a scalar size - i per element
        left = self.op(f"sub i32 {size.text}, {idx.text}", "i32", 0)
        left = self.op(f"freeze i32 {left.text}", "i32", 0)
        out = []
        for i in range(k):
            oi = self.op(f"add i32 {off.text}, {i}", "i32", 0) if i else off
            ii = self.op(f"add i32 {idx.text}, {i}", "i32", 0) if i else idx
            room = self.op(f"sub i32 {left.text}, {i + 1}", "i32", 0)      # < 0: past the end
            either = self.op(f"or i32 {room.text}, {ii.text}", "i32", 0)
            outside = self.op(f"ashr i32 {either.text}, 31", "i32", 0)
            inside = self.op(f"icmp sge i32 {either.text}, 0", "i1", 0)
            out.append((oi, _ColumnMask(self._and(ok, inside).text, ok, outside)))
        return out

    def _dwords(self, nbytes):
        """The integer type a buffer access of `nbytes` moves (the backend splits only
        dword-based vectors, e.g. not <8 x i8>)."""
        if nbytes % 4 == 0:
            n = nbytes // 4
            return ("i32", "i32") if n == 1 else (f"<{n} x i32>", f"v{n}i32")
        return {2: ("i16", "i16"), 1: ("i8", "i8")}[nbytes]

    def load_run(self, gl, off, k, d):
        ety = llty(d)
        if k == 1:
            ty, sfx = self._buf_ty(ety, 1)
        else:
            ty, sfx = self._dwords(k * d.bytes)
        r = self.call(ty, f"llvm.amdgcn.raw.ptr.buffer.load.{sfx}",
                      [f"ptr addrspace(8) {self.resource(gl)}", str(self._boff(off, d.bytes)),
                       "i32 0", "i32 0"])
        if k == 1:
            return Value(r, ety, 0)
        return self.op(f"bitcast {ty} {r} to <{k} x {ety}>", ety, k)

    def load_elem(self, gl, off, mask, d):
        # Out-of-range offsets read zero: no branch needed for masked elements.
        ty, sfx = self._buf_ty(llty(d), 1)
        r = self.call(ty, f"llvm.amdgcn.raw.ptr.buffer.load.{sfx}",
                      [f"ptr addrspace(8) {self.resource(gl)}",
                       str(self._boff(off, d.bytes, mask)), "i32 0", "i32 0"])
        return Value(r, llty(d), 0)

    def store_run(self, gl, off, vec: Value, d):
        if vec.n > 1:
            ty, sfx = self._dwords(vec.n * d.bytes)
            vec = self.op(f"bitcast {vec} to {ty}", ty, 0)
        else:
            ty, sfx = self._buf_ty(llty(d), 1)
        self.call("void", f"llvm.amdgcn.raw.ptr.buffer.store.{sfx}",
                  [str(vec), f"ptr addrspace(8) {self.resource(gl)}",
                   str(self._boff(off, d.bytes)), "i32 0", "i32 0"])

    def store_elem(self, gl, off, mask, val: Value, d):
        # Stores to out-of-range offsets are dropped by the hardware.
        ty, sfx = self._buf_ty(llty(d), 1)
        self.call("void", f"llvm.amdgcn.raw.ptr.buffer.store.{sfx}",
                  [str(val), f"ptr addrspace(8) {self.resource(gl)}",
                   str(self._boff(off, d.bytes, mask)), "i32 0", "i32 0"])

    def atomic_add_elem(self, gl, off, mask, val):
        # out-of-range offsets are dropped by the hardware, as for stores
        self.call("float", "llvm.amdgcn.raw.ptr.buffer.atomic.fadd.f32",
                  [str(val), f"ptr addrspace(8) {self.resource(gl)}",
                   str(self._boff(off, 4, mask)), "i32 0", "i32 0"])

    # -- matrix instructions -------------------------------------------------------------
    def _mfma_operand(self, reg: Value, slots, ins) -> Value:
        """The operand register group of one MFMA, typed as the intrinsic wants it."""
        k = len(slots)
        v = self.pick(reg, slots)
        if ins.ab_dtype in ("bf16",) and ins.intrinsic.endswith(".1k"):
            return self.op(f"bitcast {v} to <{k} x i16>", "i16", k)   # gfx942: bf16 as i16
        if reg.ety == "i8":                          # fp8/bf8: 8 bytes as i64, 32 as <8 x i32>
            if k == 8:
                return self.op(f"bitcast {v} to i64", "i64", 0)
            return self.op(f"bitcast {v} to <{k // 4} x i32>", "i32", k // 4)
        return v

    def _scale_operand(self, reg_v, slots) -> Value:
        """An E8M0 scale register: the byte in bits 7:0 of an i32 (op_sel 0)."""
        v = self.read(reg_v)
        e = self.extract(v, slots[0])
        return self.op(f"zext {e} to i32", "i32", 0)

    def r_mma(self, op):
        if self._pinned_mma(op):
            return self._mfma_pinned(op)
        ins = op.attrs["instr"]
        a, b, c = (self.read(s) for s in op.srcs[:3])
        av = self._mfma_operand(a, op.attrs["a_slots"], ins)
        bv = self._mfma_operand(b, op.attrs["b_slots"], ins)
        cs = op.attrs["c_slots"]
        cv = Value("zeroinitializer", "float", len(cs)) if op.attrs.get("zero") else \
            self.pick(c, cs)
        if ins.scaled:
            fmt = cdna.F8F6F4_FORMAT[ins.ab_dtype]
            args = [str(av), str(bv), str(cv), f"i32 {fmt}", f"i32 {fmt}", "i32 0",
                    str(self._scale_operand(op.srcs[3], op.attrs["sa_slots"])), "i32 0",
                    str(self._scale_operand(op.srcs[4], op.attrs["sb_slots"]))]
        elif ins.no_scale:
            # Constant-zero scale operands: LLVM selects the f8f6f4 instruction without
            # scales (unit scale), no v_mfma_ld_scale and no scale registers.
            fmt = cdna.F8F6F4_FORMAT[ins.ab_dtype]
            args = [str(av), str(bv), str(cv), f"i32 {fmt}", f"i32 {fmt}", "i32 0", "i32 0",
                    "i32 0", "i32 0"]
        else:
            args = [str(av), str(bv), str(cv), "i32 0", "i32 0", "i32 0"]
        dv = Value(self.call(cv.ty, ins.intrinsic, args), "float", len(cs))
        # Put the result back into the accumulator's slots.
        wide = ", ".join(f"i32 {i}" if i < len(cs) else "i32 poison" for i in range(c.n))
        dw = self.op(f"shufflevector {dv}, {dv.ty} poison, <{c.n} x i32> <{wide}>", "float", c.n)
        pos = {slot: i for i, slot in enumerate(cs)}
        merge = ", ".join(f"i32 {c.n + pos[i]}" if i in pos else f"i32 {i}" for i in range(c.n))
        self.write(op.dst, self.op(f"shufflevector {c}, {dw}, <{c.n} x i32> <{merge}>", "float", c.n))

    def r_lds_load_tr(self, op):
        """ds_read_b64_tr_b16 per group of 4 slots, each lane addressing its source chunk."""
        region, src = op.attrs["region"], op.attrs["source"]
        d = region.tile.dtype
        r0, c0 = op.srcs[0], op.srcs[1]
        g = self._provable(c0, src, 1, 0)
        if g and (g & -g) % 4:                  # chunks would not be 8-byte aligned
            return super().r_lds_load(op)
        rb = self.op(f"add i32 {self.read(r0).text}, {self.lane_base(src, 0, 'wave').text}", "i32", 0)
        cb = self.op(f"add i32 {self.read(c0).text}, {self.lane_base(src, 1, 'wave').text}", "i32", 0)
        elems = []
        for first in range(0, src.nslots, 4):
            addr = self._lds_addr(region, rb, cb, src.slots[first])
            p = self.lds_ptr(addr)
            v = Value(self.call("<4 x i16>", "llvm.amdgcn.ds.read.tr16.b64.v4i16",
                                [f"ptr addrspace(3) {p.text}"]), "i16", 4)
            v = self.op(f"bitcast {v} to <4 x {llty(d)}>", llty(d), 4)
            elems += [self.extract(v, i) for i in range(4)]
        self.write(op.dst, self.build(elems))

    # -- memory -> LDS without registers (buffer_load ... lds) -----------------------------------
    def r_gload_lds(self, op):
        """One LDS DMA per chunk group: lane l of a wave writes `bytes` at LDS base + l *
        bytes, the base being where the group's first lane's chunk sits. A swizzled tile gets
        the swizzle by fetching, for each fixed LDS position, the element that belongs there.
        Launches whose last dim or column origin are not chunk multiples take the ordinary
        path (a uniform branch)."""
        gl, region, lay, vec = op.srcs[0], op.attrs["region"], op.attrs["layout"], op.attrs["vec"]
        t, rank = region.tile, op.srcs[0].type.rank
        esz = t.dtype.bytes
        size = vec * esz
        origin = op.srcs[1 + rank - 2:]
        lead = op.srcs[1:1 + rank - 2]
        c0 = self.read(origin[1])
        n_last = self.size_of(gl, rank - 1)
        ok = self._and(self.op(f"icmp eq i32 {self.op(f'srem i32 {n_last.text}, {vec}', 'i32', 0).text}, 0", "i1", 0),
                       self.op(f"icmp eq i32 {self.op(f'srem i32 {c0.text}, {vec}', 'i32', 0).text}, 0", "i1", 0))
        dma_l, reg_l, join = self.branch(ok, "lds_dma", "lds_copy", "lds_done")
        self.start_block(dma_l)
        rsrc = self.resource(gl)
        lrow = self.lane_base(lay, 0, "workgroup")
        lcol = self.lane_base(lay, 1, "workgroup")
        wave_first = self.op(f"and i32 {self.tid.text}, {-self.p.wave_size}", "i32", 0)
        frow = self.lane_base_at(lay, 0, wave_first)
        fcol = self.lane_base_at(lay, 1, wave_first)
        size_v = [self.size_of(gl, a) for a in range(rank)]
        stride_v = [Value("1" if a == rank - 1 else f"%{gl.name}.stride{a}", "i32", 0)
                    for a in range(rank)]
        ok_lead, off_lead = Value("true", "i1", 0), Value("0", "i32", 0)
        for a, r in enumerate(lead):
            v = self.read(r)
            ok_lead = self._and(ok_lead, self._in_range(v, size_v[a]))
            off_lead = self.op(f"add i32 {off_lead.text}, {self.op(f'mul i32 {v.text}, {stride_v[a].text}', 'i32', 0).text}", "i32", 0)
        for first in range(0, lay.nslots, vec):
            sr, sc = lay.slots[first]
            prow = self.op(f"add i32 {lrow.text}, {sr}", "i32", 0)        # LDS position
            pcol = self.op(f"add i32 {lcol.text}, {sc}", "i32", 0)
            scol = pcol
            if t.swizzle:                   # the element that belongs at this position
                b = self.swizzled_byte(t, prow, self.op(f"mul i32 {pcol.text}, {esz}", "i32", 0))
                scol = self.op(f"udiv i32 {b.text}, {esz}", "i32", 0)
            grow = self.op(f"add i32 {self.read(origin[0]).text}, {prow.text}", "i32", 0)
            gcol = self.op(f"add i32 {c0.text}, {scol.text}", "i32", 0)
            ok_e = self._and(ok_lead, self._and(self._in_range(grow, size_v[rank - 2]),
                                                self._in_range(gcol, size_v[rank - 1])))
            off = self.op(f"add i32 {off_lead.text}, {self.op(f'mul i32 {grow.text}, {stride_v[rank - 2].text}', 'i32', 0).text}", "i32", 0)
            off = self.op(f"add i32 {off.text}, {gcol.text}", "i32", 0)
            voff = self._boff(off, esz, ok_e)
            # where lane 0 of this wave writes: the unswizzled position of its chunk
            r_first = self.op(f"add i32 {frow.text}, {sr}", "i32", 0)
            c_first = self.op(f"add i32 {fcol.text}, {sc}", "i32", 0)
            pos = self.op(f"mul i32 {r_first.text}, {t.shape[1]}", "i32", 0)
            pos = self.op(f"add i32 {pos.text}, {c_first.text}", "i32", 0)
            base = self.op(f"mul i32 {pos.text}, {esz}", "i32", 0)
            base = self.op(f"add i32 {base.text}, {self.region_base(region).text}", "i32", 0)
            base = Value(self.call("i32", "llvm.amdgcn.readfirstlane.i32", [str(base)]), "i32", 0)
            ptr = self.lds_ptr(base)
            self.call("void", "llvm.amdgcn.raw.ptr.buffer.load.lds",
                      [f"ptr addrspace(8) {rsrc}", f"ptr addrspace(3) {ptr.text}",
                       f"i32 {size}", str(voff), "i32 0", "i32 0", "i32 0"])
        self.ins(f"br label %{join}")
        # the ordinary copy last: the line table marks it edge code up to the join, and the
        # DMA side above stays main code (the report's executed loop counts it)
        self.start_block(reg_l)
        super().r_gload_lds(op)
        self.ins(f"br label %{join}")
        self.start_block(join)

    def lane_base_at(self, lay, dim, lane: Value) -> Value:
        """lane_base for an explicit (uniform) flat lane index."""
        saved = self.tid
        self.tid = lane
        try:
            return self.lane_base(lay, dim, "workgroup")
        finally:
            self.tid = saved

    def r_barrier(self, op):
        self.ins('fence syncscope("workgroup") release')
        self.call("void", "llvm.amdgcn.s.barrier", [])
        self.ins('fence syncscope("workgroup") acquire')

    def r_setprio(self, op):
        self.call("void", "llvm.amdgcn.s.setprio", [f"i16 {op.attrs['level']}"])

    def r_sched_barrier(self, op):
        self.call("void", "llvm.amdgcn.sched.barrier", [f"i32 {op.attrs['mask']}"])

    def r_sched_group(self, op):
        a = op.attrs
        self.call("void", "llvm.amdgcn.sched.group.barrier",
                  [f"i32 {a['mask']}", f"i32 {a['size']}", f"i32 {a['sync_id']}"])

    def r_waitcnt(self, op):
        imm = cdna.waitcnt_imm(op.attrs["vmcnt"], op.attrs["lgkmcnt"])
        self.call("void", "llvm.amdgcn.s.waitcnt", [f"i32 {imm}"])


class _ColumnMask(Value):
    """An edge element's validity: as an i1 (Value), and as the row validity `ok` (i1)
    with the column's `outside` (i32: -1 outside, 0 inside) for buffer offsets."""

    def __init__(self, text, ok, outside):
        super().__init__(text, "i1", 0)
        self.ok, self.outside = ok, outside
