"""NVPTX dialect (sm_90a): special registers, plain global pointers (masked elements are
never dereferenced), dynamic shared memory, and shfl.sync for cross-lane exchange."""
from __future__ import annotations

from ..ir import types as T
from .llvm import Renderer, Value, literal, llty

DATALAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
# every kernel's first instructions (PTX ISA 7.8, sm_90): let the stream's next grid launch,
# then wait for the grids before this one (see NVPTXRenderer.prologue); the launcher gives
# the early-launch attribute only to code whose PTX has the wait (runtime.cuda). Leaving
# the first to the workgroups' exit instead (measured, docs/PERF.md 2026-12-04) kept a
# third of what it gains for the row ops' forward passes
EARLY_LAUNCH_PROLOGUE = ("griddepcontrol.launch_dependents;", "griddepcontrol.wait;")
# a TMA store's fence (every lane's, before the copy) covers the wave's shared-memory writes
# for later arrives too, so a consumer's release of a ring stage after an epilogue that
# staged C needs none of its own (False: such releases fence on every K step, the earlier
# rule; kept for A/B runs, bench/gemm_sweep.py's `fence` step)
STORE_FENCE_COVERS = True


def _asm_operands(lo: int, n: int) -> str:
    """Inline-asm operands $lo..$lo+n-1 as a PTX vector: "{$lo, ..., $lo+n-1}"."""
    return "{" + ", ".join(f"${i}" for i in range(lo, lo + n)) + "}"


class NVPTXRenderer(Renderer):
    dialect_name = "nvptx"
    GPU_SCOPE = "device"          # PTX .gpu
    # MUFU.EX2 / MUFU.LG2 (PTX ex2.approx, lg2.approx: about 2 ulp); flushing exp2's
    # subnormal results to zero saves the instruction that rescales them
    HARDWARE_MATH = {"exp2": "llvm.nvvm.ex2.approx.ftz.f", "log2": "llvm.nvvm.lg2.approx.f"}

    def module_header(self):
        return f'target datalayout = "{DATALAYOUT}"\ntarget triple = "{self.p.target.triple}"'

    def module_footer(self):
        threads = self.p.num_waves * self.p.wave_size
        extra = ""
        if self._uses("setmaxnreg"):
            # setmaxnreg needs a register cap at entry: what fits the whole block on one SM
            extra = f' "nvvm.maxnreg"="{self.register_cap()}" "nvvm.minctasm"="1"'
        elif self.p.programs_per_cu:
            extra = f' "nvvm.minctasm"="{self.p.programs_per_cu}"'
        if self.p.cluster > 1:              # .explicitcluster .reqnctapercluster n, 1, 1
            extra += f' "nvvm.cluster_dim"="{self.p.cluster},1,1"'
        return f'attributes #0 = {{ "nvvm.maxntid"="{threads},1,1"{extra} }}'

    def function_header(self, args):
        return f"define ptx_kernel void @{self.p.name}({args}) #0"

    def arg_type(self, a):
        if a.dtype == "tmap":       # CUtensorMap by value; its address feeds the TMA unit
            return 'ptr byval([128 x i8]) align 64 "nvvm.grid_constant"'
        return {"ptr": "ptr addrspace(1)", "i32": "i32", "f32": "float"}[a.dtype]

    def prologue(self):
        # Early launch (programmatic dependent launch, runtime.cuda.EARLY_LAUNCH): once every
        # workgroup of this grid has started, the stream's next kernel may be launched, its
        # workgroups taking SMs as this grid's leave; each of its threads first waits until
        # the grids before it have completed and their writes are visible. The wait comes
        # before anything else, so kernels still see each other's memory in stream order.
        for ins in EARLY_LAUNCH_PROLOGUE:
            self.ins(f'call void asm sideeffect "{ins}", "~{{memory}}"()')
        tid = self.call("i32", "llvm.nvvm.read.ptx.sreg.tid.x", [])
        self.tid = Value(tid, "i32", 0)
        self.lane = self.op(f"and i32 {tid}, {self.p.wave_size - 1}", "i32", 0)
        if self.p.lds_bytes:
            # Dynamic shared memory: the launcher passes lds_bytes (and raises the 48 KiB cap).
            # 1024-aligned: 128B-swizzled tiles are placed on 1024-byte boundaries
            self.globals.append("@smem = external addrspace(3) global [0 x i8], align 1024")

    def special(self, name, axis):
        xyz = "xyz"[axis]
        if name == "program_id":
            return Value(self.call("i32", f"llvm.nvvm.read.ptx.sreg.ctaid.{xyz}", []), "i32", 0)
        if name == "num_programs":
            return Value(self.call("i32", f"llvm.nvvm.read.ptx.sreg.nctaid.{xyz}", []), "i32", 0)
        if name == "cluster_rank":
            return Value(self.call("i32", "llvm.nvvm.read.ptx.sreg.cluster.ctarank", []),
                         "i32", 0)
        if name == "lane_id":
            return self.lane
        if name == "wave_id":
            return self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length() - 1}",
                           "i32", 0)
        raise NotImplementedError(name)

    def lane_xor(self, v: Value, mask: int) -> Value:
        if v.ety == "float":
            r = self.call("float", "llvm.nvvm.shfl.sync.bfly.f32",
                          ["i32 -1", str(v), f"i32 {mask}", f"i32 {self.p.wave_size - 1}"])
            return Value(r, "float", 0)
        r = self.call("i32", "llvm.nvvm.shfl.sync.bfly.i32",
                      ["i32 -1", str(self.to_i32(v)), f"i32 {mask}",
                       f"i32 {self.p.wave_size - 1}"])
        return self.from_i32(Value(r, "i32", 0), v.ety)

    def lds_symbol(self):
        return "@smem"

    def vote_any(self, c: Value) -> Value:
        return Value(self.call("i1", "llvm.nvvm.vote.any.sync", ["i32 -1", str(c)]), "i1", 0)

    def load_run(self, gl, off, k, d, vector_align=True):
        p = self.elem_ptr(gl, off)
        ety = llty(d)
        ty = ety if k == 1 else f"<{k} x {ety}>"
        a = min(self.align, k * d.bytes) if k > 1 and vector_align else d.bytes
        return self.op(f"load {ty}, ptr addrspace(1) {p.text}, align {a}", ety,
                       k if k > 1 else 0)

    def load_elem(self, gl, off, mask, d):
        # A masked element reads the tensor's first element instead (always valid for a
        # non-empty tensor) and is then replaced by zero.
        safe = self.op(f"select i1 {mask.text}, i32 {off.text}, i32 0", "i32", 0)
        v = self.load_run(gl, safe, 1, d, vector_align=False)
        zero = literal(0.0 if d.is_float else 0, d)
        return self.op(f"select i1 {mask.text}, {v}, {llty(d)} {zero}", llty(d), 0)

    def store_run(self, gl, off, vec, d, vector_align=True):
        p = self.elem_ptr(gl, off)
        a = min(self.align, vec.n * d.bytes) if vector_align and vec.n > 1 else d.bytes
        self.ins(f"store {vec}, ptr addrspace(1) {p.text}, align {a}")

    def store_elem(self, gl, off, mask, val, d):
        do, skip = self.label("st_one"), self.label("st_next")
        self.ins(f"br i1 {mask.text}, label %{do}, label %{skip}")
        self.start_block(do)
        self.store_run(gl, off, val, d, vector_align=False)
        self.ins(f"br label %{skip}")
        self.start_block(skip)

    def atomic_add_width(self, k, align):
        """red.global.add.v2/.v4.f32 (PTX ISA 8.1, sm_90): 2 or 4 consecutive f32 aligned to
        their size."""
        for width in (4, 2):
            if k % width == 0 and align >= 4 * width:
                return width
        return 1

    def atomic_add_run(self, gl, off, vals):
        p = self.elem_ptr(gl, off)
        regs = ", ".join(f"${i + 1}" for i in range(len(vals)))
        self.ins(f'call void asm sideeffect "red.global.add.v{len(vals)}.f32 [$0], {{{regs}}};", '
                 f'"l{",f" * len(vals)},~{{memory}}"(ptr addrspace(1) {p.text}, '
                 + ", ".join(str(v) for v in vals) + ")")

    def atomic_add_elem(self, gl, off, mask, val):
        do, skip = self.label("atom_one"), self.label("atom_next")
        self.ins(f"br i1 {mask.text}, label %{do}, label %{skip}")
        self.start_block(do)
        p = self.elem_ptr(gl, off)
        self.ins(f'atomicrmw fadd ptr addrspace(1) {p.text}, {val} syncscope("device") '
                 f'monotonic, align 4')
        self.ins(f"br label %{skip}")
        self.start_block(skip)

    def discard_line_bytes(self):
        """discard.global.L2 (PTX ISA 7.4, sm_80+) drops one 128-byte, 128-aligned line."""
        return 128

    def discard_line(self, ptr):
        self.ins(f'call void asm sideeffect "discard.global.L2 [$0], 128;", '
                 f'"l,~{{memory}}"(ptr addrspace(1) {ptr.text})')

    # -- flags across GPUs -----------------------------------------------------------------------
    def wave_sync(self):
        """bar.warp.sync orders the memory accesses of the warp's lanes (PTX ISA,
        "bar.warp.sync"): their earlier writes come before lane 0's release."""
        self.call("void", "llvm.nvvm.bar.warp.sync", ["i32 -1"])

    def release_add(self, p, v, scope="system"):
        """One red.release.sys (.gpu): LLVM's NVPTX backend (22) drops both the ordering
        and the scope of an atomicrmw (it prints a relaxed, GPU-scoped atom.global.add)."""
        sc = "sys" if scope == "system" else "gpu"
        self.ins(f'call void asm sideeffect "red.release.{sc}.global.add.u32 [$0], $1;", '
                 f'"l,r,~{{memory}}"(ptr addrspace(1) {p.text}, {v})')

    def spin_pause(self):
        from ..targets.sm90a import FLAG_POLL_SLEEP_NS
        self.call("void", "llvm.nvvm.nanosleep", [f"i32 {FLAG_POLL_SLEEP_NS}"])

    def timestamp_words(self):
        """%globaltimer (PTX ISA: a 64-bit nanosecond timer), %smid, 0."""
        t = self.call("i64", "llvm.nvvm.read.ptx.sreg.globaltimer", [])
        sm = self.call("i32", "llvm.nvvm.read.ptx.sreg.smid", [])
        return [*self.split_timer(t), Value(sm, "i32", 0), Value("0", "i32", 0)]

    def after_flag_wait(self):
        """The acquire covers the generic proxy; TMA copies this thread issues next read
        through the async proxy, which must be fenced to see what the signal published."""
        self.ins('call void asm sideeffect "fence.proxy.async.global;", "~{memory}"()')

    def r_mma(self, op):
        """One warp-level mma.sync (inline PTX: LLVM's NVVM intrinsics do not cover every
        type); operands are passed as the 32-bit registers the fragments occupy."""
        ins = op.attrs["instr"]
        a, b, c = (self.read(s) for s in op.srcs)
        words = []
        for reg, slots in ((a, op.attrs["a_slots"]), (b, op.attrs["b_slots"])):
            sub = self.pick(reg, slots)
            nw = len(slots) * op.srcs[0].type.dtype.bytes // 4
            wv = self.op(f"bitcast {sub} to <{nw} x i32>", "i32", nw)
            words.append([self.extract(wv, i) for i in range(nw)])
        cs = op.attrs["c_slots"]
        cvals = [Value(literal(0.0, T.f32), "float", 0) if op.attrs.get("zero") else
                 self.extract(c, i) for i in cs]
        na, nb, nc = len(words[0]), len(words[1]), len(cvals)
        text = (f"{ins.name} {_asm_operands(0, nc)}, {_asm_operands(nc, na)}, "
                f"{_asm_operands(nc + na, nb)}, {_asm_operands(nc + na + nb, nc)};")
        cons = ",".join(["=f"] * nc + ["r"] * (na + nb) + [str(i) for i in range(nc)])
        rty = "{" + ", ".join(["float"] * nc) + "}"
        args = ", ".join(str(x) for x in words[0] + words[1] + cvals)
        res = self.fresh()
        self.ins(f'{res} = call {rty} asm sideeffect "{text}", "{cons}"({args})')
        out = c
        for i, slot in enumerate(cs):
            e = self.op(f"extractvalue {rty} {res}, {i}", "float", 0)
            out = self.op(f"insertelement {out}, {e}, i64 {slot}", "float", c.n)
        self.write(op.dst, out)

    def _uses(self, kind) -> bool:
        if not hasattr(self, "_kinds"):
            from ..ir.nodes import walk
            self._kinds = {op.kind for op in walk(self.p.body)}
        return kind in self._kinds

    def register_cap(self) -> int:
        return self.p.target.entry_register_cap(self.p.num_waves * self.p.wave_size)

    # -- register tiles <-> shared memory: ldmatrix / stmatrix ------------------------------
    def _matrix_plan(self, op):
        """For a wave's 16-bit window whose slot pairs are ldmatrix/stmatrix fragments
        (targets.sm90a.matrix_fragments), on 16-byte-aligned rows of 8 elements (column
        origin provably a multiple of 8, rows a multiple of 8 elements): (trans, origins);
        else None (per-thread ld.shared / st.shared)."""
        from ..targets.sm90a import matrix_fragments
        region, lay = op.attrs["region"], op.attrs["layout"]
        if op.attrs["scope"] != "wave" or region.tile.dtype.bits != 16 or \
                region.tile.shape[1] % 8:
            return None
        g = self.divs.get(op.srcs[1], (1,))[0]
        if g % 8:
            return None
        return matrix_fragments(lay)

    def _matrix_addresses(self, op, origins):
        """Per group of up to 4 matrices: (slot-pair indices, this lane's row address). Lane l
        points at row l % 8 of matrix l // 8 of its group (lanes past the group's matrices
        repeat the last one's rows: their addresses are not read)."""
        region = op.attrs["region"]
        r0, c0 = self.read(op.srcs[0]), self.read(op.srcs[1])
        q = self.op(f"lshr i32 {self.lane.text}, 3", "i32", 0)
        i = self.op(f"and i32 {self.lane.text}, 7", "i32", 0)
        out = []
        for g0 in range(0, len(origins), 4):
            pairs = list(range(g0, min(g0 + 4, len(origins))))
            rr, cc = origins[pairs[-1]]
            row = self.op(f"add i32 {r0.text}, {rr}", "i32", 0)
            col = self.op(f"add i32 {c0.text}, {cc}", "i32", 0)
            for j in reversed(pairs[:-1]):               # pick matrix q's origin
                is_q = self.op(f"icmp eq i32 {q.text}, {j - g0}", "i1", 0)
                row, col = (self._select_plus(is_q, base, off, other) for base, off, other in
                            ((r0, origins[j][0], row), (c0, origins[j][1], col)))
            row = self.op(f"add i32 {row.text}, {i.text}", "i32", 0)
            off = self._lds_addr(region, row, col, (0, 0))
            out.append((pairs, self.op(f"add i32 {self._smem_addr(0).text}, {off.text}",
                                       "i32", 0)))
        return out

    def _select_plus(self, cond, base, off: int, other) -> Value:
        """cond ? base + off : other (i32)."""
        v = self.op(f"add i32 {base.text}, {off}", "i32", 0)
        return self.op(f"select i1 {cond.text}, i32 {v.text}, i32 {other.text}", "i32", 0)

    def r_lds_load(self, op):
        plan = self._matrix_plan(op) if len(op.srcs) == 2 else None    # not another's
        if plan is None:
            return super().r_lds_load(op)
        trans, origins = plan
        ety = llty(op.attrs["region"].tile.dtype)
        elems = [None] * (2 * len(origins))
        for pairs, addr in self._matrix_addresses(op, origins):
            n = len(pairs)
            nr = 4 if n == 3 else n                   # lanes 24-31 re-read the third matrix
            x = f"x{nr}"
            rty = "{" + ", ".join(["i32"] * nr) + "}"
            res = self.fresh()
            self.ins(f'{res} = call {rty} asm sideeffect "ldmatrix.sync.aligned.m8n8.{x}'
                     f'{".trans" if trans else ""}.shared.b16 {_asm_operands(0, nr)}, '
                     f'[${nr}];", "{",".join(["=r"] * nr)},r,~{{memory}}"(i32 {addr.text})')
            for k, j in enumerate(pairs):
                w = self.op(f"extractvalue {rty} {res}, {k}", "i32", 0)
                two = self.op(f"bitcast i32 {w.text} to <2 x {ety}>", ety, 2)
                elems[2 * j], elems[2 * j + 1] = self.extract(two, 0), self.extract(two, 1)
        self.write(op.dst, self.build(elems))

    def r_lds_store(self, op):
        plan = self._matrix_plan(op)
        if plan is None:
            return super().r_lds_store(op)
        trans, origins = plan
        val = self._norm(op.srcs[-1], op.attrs["layout"].nslots)
        for pairs, addr in self._matrix_addresses(op, origins):
            words = [self.op(f"bitcast {self._run_slots(val, 2 * j, 2)} to i32", "i32", 0)
                     for j in pairs]
            if len(words) == 3:      # x4: lanes 24-31 point at the third matrix again, so
                words.append(words[-1])   # the fourth store rewrites it with the same words
            n = len(words)
            self.ins(f'call void asm sideeffect "stmatrix.sync.aligned.m8n8.x{n}'
                     f'{".trans" if trans else ""}.shared.b16 [$0], {_asm_operands(1, n)};", '
                     f'"r,{",".join(["r"] * n)},~{{memory}}"'
                     f'(i32 {addr.text}, {", ".join(f"i32 {w.text}" for w in words)})')

    # -- mbarriers and register budgets -------------------------------------------------------
    def _smem_addr(self, offset) -> Value:
        """The 32-bit shared-memory address of byte `offset` (what PTX's .shared operands
        take)."""
        return self.op(f"ptrtoint ptr addrspace(3) {self.lds_ptr(offset).text} to i32",
                       "i32", 0)

    def _mbar_addr(self, region) -> Value:
        return self._region_addr(region, 0)

    def _region_addr(self, region, offset: int) -> Value:
        """The 32-bit shared address of byte `offset` of a region (of its runtime stage)."""
        base = self.op(f"add i32 {self._smem_addr(0).text}, {self.region_base(region).text}",
                       "i32", 0)
        return self.op(f"add i32 {base.text}, {offset}", "i32", 0) if offset else base

    def _lane0(self, body):
        """Run `body()` on lane 0 of the wave only."""
        first = self.op(f"icmp eq i32 {self.lane.text}, 0", "i1", 0)
        do, done = self.label("lane0"), self.label("lane0_done")
        self.ins(f"br i1 {first.text}, label %{do}, label %{done}")
        self.start_block(do)
        body()
        self.ins(f"br label %{done}")
        self.start_block(done)

    def r_mbar_init(self, op):
        """The init, then a fence of the async proxy: the TMA unit completes transactions
        on the barrier through that proxy, and without the fence may act on what the shared
        memory held before the init (a previous workgroup's barrier on this SM)."""
        a = self._mbar_addr(op.attrs["region"])
        count = op.attrs["count"]

        def init():
            self.ins(f'call void asm sideeffect "mbarrier.init.shared::cta.b64 [$0], $1;", '
                     f'"r,r"(i32 {a.text}, i32 {count})')
            self.ins('call void asm sideeffect "fence.proxy.async.shared::cta;", "~{memory}"()')
        self._lane0(init)

    def _async_proxy_fence(self, op):
        """Shared memory written by ordinary stores (st.shared, stmatrix) that the tensor
        cores or the TMA unit read next: each writing thread fences the async proxy before
        the barrier / arrive that hands the tile over. Only where this wave may have written
        shared memory since its last fence (a consumer releasing a stage it only read
        through wgmma needs none)."""
        if (self._uses("wgmma") or self._uses("tma_store")) and self._dirty_before(op):
            self.ins('call void asm sideeffect "fence.proxy.async.shared::cta;", "~{memory}"()')

    def _dirty_before(self, op) -> bool:
        """Whether ordinary shared-memory stores may run between the last fence and `op`
        (a barrier or an arrive) on some path: a forward pass over the lane program, loops
        taken twice so a store late in a body reaches the fences at its top."""
        if not hasattr(self, "_dirty"):
            self._dirty = {}
            writes = ("lds_store", "gload_lds")

            def walk(block, dirty):
                for o in block.ops:
                    if o.kind in writes:
                        dirty = True
                    elif o.kind in ("barrier", "mbar_arrive", "cluster_sync"):
                        self._dirty[o] = self._dirty.get(o, False) or dirty
                        dirty = False
                    elif o.kind == "tma_store" and STORE_FENCE_COVERS:
                        dirty = False                  # it fences the wave's writes itself
                    elif o.kind == "if":
                        outs = [walk(r, dirty) for r in o.regions]
                        dirty = any(outs) or len(o.regions) < 2 and dirty
                    elif o.kind == "for":
                        dirty = dirty or walk(o.regions[0], dirty)
                        dirty = walk(o.regions[0], dirty) or dirty
                return dirty

            walk(self.p.body, False)
        return self._dirty.get(op, True)

    def r_mbar_arrive(self, op):
        self._async_proxy_fence(op)
        # the wave's lanes' earlier writes are ordered before lane 0's release-arrive
        self.ins('call void asm sideeffect "bar.warp.sync -1;", "~{memory}"()')
        a = self._mbar_addr(op.attrs["region"])
        if op.attrs.get("remote"):
            # the barrier at the same offset in cluster workgroup srcs[0]; the arrival's
            # default release (.cta, as CUTLASS's cluster barriers: .release.cluster made
            # gemm_ws 40% slower on the H200, docs/PERF.md) orders this wave's reads of its
            # stage before the other workgroup's copy into it, which waits on that barrier
            cta = self.read(op.srcs[0])
            self._lane0(lambda: self.ins(
                f'call void asm sideeffect "{{ .reg .b32 R; mapa.shared::cluster.u32 R, $0, $1; '
                f'mbarrier.arrive.shared::cluster.b64 _, [R]; }}", '
                f'"r,r,~{{memory}}"(i32 {a.text}, i32 {cta.text})'))
            return
        self._lane0(lambda: self.ins(
            f'call void asm sideeffect "mbarrier.arrive.shared::cta.b64 _, [$0];", '
            f'"r,~{{memory}}"(i32 {a.text})'))

    def r_mbar_wait(self, op):
        a = self._mbar_addr(op.attrs["region"])
        parity = self.read(op.srcs[0])
        p = self.op(f"and i32 {parity.text}, 1", "i32", 0)
        asm = ("{ .reg .pred P1; WAIT: mbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1; "
               "@!P1 bra WAIT; }")
        self.ins(f'call void asm sideeffect "{asm}", "r,r,~{{memory}}"(i32 {a.text}, i32 {p.text})')

    def _tma_coords(self, op, lead_and_origin) -> tuple[list, Value, Value]:
        """(lead coordinates, row, column) Values of a TMA op's tensor coordinates."""
        vals = [self.read(x) for x in lead_and_origin]
        return vals[:-2], vals[-2], vals[-1]

    def _tma_issue(self, op, lead, r0, c0, block_addr) -> None:
        """One bulk tensor copy per 128-byte column block of the tile (one for an ordinary
        tile): block j's box starts j box-widths to the right and lands at block_addr(j).
        Coordinates go innermost first; a box covers one element of the lead dims."""
        desc, region = op.attrs["tmap"], op.attrs["region"]
        rank = op.attrs["gl"].type.rank
        tmap = self.op(f"ptrtoint ptr %{desc.name} to i64", "i64", 0)
        for j in range(region.tile.atoms):
            col = self.op(f"add i32 {c0.text}, {j * desc.box[1]}", "i32", 0) if j else c0
            args = ", ".join(f"i32 {v.text}" for v in [col, r0] + lead[::-1])
            regs = ",".join(["r"] * rank)
            if op.kind == "tma_load" and op.attrs.get("multicast"):
                # into every workgroup of the cluster: the same offsets there, mask all ranks
                bar = self._mbar_addr(op.attrs["bar"])
                self.ins(f'call void asm sideeffect "cp.async.bulk.tensor.{rank}d.shared::cluster.'
                         f'global.mbarrier::complete_tx::bytes.multicast::cluster [$0], [$1, '
                         f'{_asm_operands(2, rank)}], [${2 + rank}], ${3 + rank};", '
                         f'"r,l,{regs},r,h,~{{memory}}"(i32 {block_addr(j).text}, '
                         f'i64 {tmap.text}, {args}, i32 {bar.text}, '
                         f'i16 {(1 << self.p.cluster) - 1})')
            elif op.kind == "tma_load":
                bar = self._mbar_addr(op.attrs["bar"])
                self.ins(f'call void asm sideeffect "cp.async.bulk.tensor.{rank}d.shared::cluster.'
                         f'global.mbarrier::complete_tx::bytes [$0], [$1, '
                         f'{_asm_operands(2, rank)}], [${2 + rank}];", "r,l,{regs},r,~{{memory}}"'
                         f'(i32 {block_addr(j).text}, i64 {tmap.text}, {args}, i32 {bar.text})')
            else:
                copy = ("cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile"
                        if op.attrs.get("add") else "cp.async.bulk.tensor.{}d.global.shared::cta"
                        ).format(rank)
                self.ins(f'call void asm sideeffect "{copy}.bulk_group '
                         f'[$0, {_asm_operands(1, rank)}], [${1 + rank}];", '
                         f'"l,{regs},r,~{{memory}}"(i64 {tmap.text}, {args}, '
                         f'i32 {block_addr(j).text})')

    def r_tma_load(self, op):
        """Lane 0: arrive on the barrier expecting the box's bytes, then start the bulk
        tensor copies that complete them, landing at row `at` of the tile."""
        region, bar, desc = op.attrs["region"], op.attrs["bar"], op.attrs["tmap"]
        t = region.tile
        row_bytes = t.shape[1] * t.dtype.bytes // t.atoms     # one column block's row
        nbytes = desc.box[0] * t.shape[1] * t.dtype.bytes
        if op.attrs.get("multicast"):       # this part and the cluster's others, landing here
            nbytes *= self.p.cluster
        *coords, at = op.srcs
        lead, r0, c0 = self._tma_coords(op, coords)
        skip = self.op(f"mul i32 {self.read(at).text}, {row_bytes}", "i32", 0)
        first = self._region_addr(region, 0)
        first = self.op(f"add i32 {first.text}, {skip.text}", "i32", 0)
        b = self._mbar_addr(bar)

        def issue():
            self.ins(f'call void asm sideeffect "mbarrier.arrive.expect_tx.shared::cta.b64 _, '
                     f'[$0], $1;", "r,r,~{{memory}}"(i32 {b.text}, i32 {nbytes})')
            self._tma_issue(op, lead, r0, c0, lambda j: self.op(
                f"add i32 {first.text}, {j * t.shape[0] * 128}", "i32", 0) if j else first)
        self._lane0(issue)

    def r_tma_store(self, op):
        """Every lane fences its generic-proxy writes for the TMA unit; lane 0 starts the
        copies and waits until they have read the tile (so it can be reused) unless
        wait=False (then r_tma_store_wait does)."""
        region = op.attrs["region"]
        t = region.tile
        lead, r0, c0 = self._tma_coords(op, op.srcs)
        first = self._region_addr(region, 0)

        # every lane's writes to the tile made visible to the TMA unit, then lane 0 issues:
        # the store is a point where this wave has fenced all its writes (_dirty_before)
        self.ins('call void asm sideeffect "fence.proxy.async.shared::cta;", "~{memory}"()')
        self.ins('call void asm sideeffect "bar.warp.sync -1;", "~{memory}"()')

        def issue():
            self._tma_issue(op, lead, r0, c0, lambda j: self.op(
                f"add i32 {first.text}, {j * t.shape[0] * 128}", "i32", 0) if j else first)
            self.ins('call void asm sideeffect "cp.async.bulk.commit_group;", "~{memory}"()')
            if op.attrs.get("wait", True):
                self._bulk_read_wait(0)
        self._lane0(issue)

    def r_tma_store_wait(self, op):
        """Lane 0, which issued the copies (bulk async-groups are per thread)."""
        self._lane0(lambda: self._bulk_read_wait(op.attrs.get("pending", 0)))

    def _bulk_read_wait(self, pending: int):
        self.ins(f'call void asm sideeffect "cp.async.bulk.wait_group.read {pending};", '
                 '"~{memory}"()')

    def r_setmaxnreg(self, op):
        regs = op.attrs["regs"]
        kind = "inc" if regs > self.register_cap() else "dec"
        self.ins(f'call void asm sideeffect "setmaxnreg.{kind}.sync.aligned.u32 {regs};", ""()')

    # -- warpgroup MMA -----------------------------------------------------------------------
    def _wgmma_desc(self, region, byte_offset: int, lead: int) -> Value:
        """Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format") of a tile
        in the 128B swizzle (128-byte rows, in column blocks of 128 bytes when wider),
        starting `byte_offset` into it: start address >> 4, leading/stride byte offsets
        >> 4, layout type 1 = 128B swizzle. The stride offset is one 8-row swizzle atom
        (1024 B); `lead` is the leading offset: the distance between 128-byte column
        blocks of an MN-major operand (K-major operands step along K by moving the start
        address, the hardware swizzling the computed addresses)."""
        from ..targets.sm90a import WGMMA_SWIZZLE_128B
        # in 16-byte units, each term exact (tiles and stages are 1024-byte aligned), so the
        # K steps of one operand differ by a constant; shared addresses stay below 2^18
        lo = self.op(f"lshr i32 {self._smem_addr(0).text}, 4", "i32", 0)
        if region.stage is not None:
            st = self.op(f"mul i32 {self.read(region.stage).text}, {region.stride >> 4}",
                         "i32", 0)
            lo = self.op(f"add i32 {lo.text}, {st.text}", "i32", 0)
        lo = self.op(f"add i32 {lo.text}, {(region.base + byte_offset) >> 4}", "i32", 0)
        lo64 = self.op(f"zext i32 {lo.text} to i64", "i64", 0)
        const = (lead >> 4) << 16 | (1024 >> 4) << 32 | WGMMA_SWIZZLE_128B << 62
        return self.op(f"or i64 {lo64.text}, {const}", "i64", 0)

    @staticmethod
    def _kmajor_offset(t, kbyte: int) -> int:
        """Byte offset of K byte `kbyte` of a K-major tile's row 0: inside its column
        block (t.atoms blocks of t.shape[0] x 128 bytes)."""
        return (kbyte // 128) * t.shape[0] * 128 + kbyte % 128

    def r_wgmma(self, op):
        """wgmma.fence; one m64nNk16 (k32 for fp8) per K step: A from this wave's registers
        or by descriptor, B by descriptor, accumulating in place; commit; wait for the
        group. K-major operands (mma_ABt) step 32 bytes along their 128-byte rows;
        MN-major ones (B of mma_AB, A and B of mma_AtB) step 16 rows."""
        region, n, k = op.attrs["region"], op.attrs["n"], op.attrs["k"]
        a_region, kmajor, kstep = op.attrs["a_region"], op.attrs["b_kmajor"], op.attrs["kstep"]
        aty, bty = op.attrs["a_dtype"], region.tile.dtype.name
        zero = op.attrs.get("zero", False)
        nd = op.attrs["acc_layout"].nslots
        # with zero (scale-d = 0 on the first K step) acc is not read, but its registers
        # are still tied to the results: a loop-carried accumulator then keeps one set of
        # registers, where fresh ones would be copied into it at the loop's end — copies
        # that read a group still in flight, which ptxas answers by serializing every
        # wgmma (C7514)
        acc = self.read(op.srcs[-1])
        accs = [self.extract(acc, i) for i in range(nd)]
        fp8 = region.tile.dtype.bits == 8
        # fp8 wgmma has no transpose operands (K-major only); 16-bit ones take imm-trans-b
        # (and imm-trans-a with A in shared memory): 1 = MN-major
        b_trans, a_trans = int(not kmajor), int(not op.attrs["a_kmajor"])
        trans = "" if fp8 else (f", {a_trans}, {b_trans}" if a_region is not None
                                else f", {b_trans}")
        if a_region is None:
            a = self.read(op.srcs[0])
            per = 32 * 4 // region.tile.dtype.bits          # elements in 4 words
        self.ins('call void asm sideeffect "wgmma.fence.sync.aligned;", "~{memory}"()')
        bt = region.tile
        # MN-major B: column blocks (N) lie t.shape[0] rows of 128 bytes apart; one block
        # takes the K step (1024 B) as its unused leading offset
        lead = 16 if kmajor else (bt.shape[0] * 128 if bt.atoms > 1 else 1024)
        for kk in range(k // kstep):
            b_off = self._kmajor_offset(bt, kk * kstep * bt.dtype.bytes) if kmajor else \
                kk * kstep * 128
            bdesc = self._wgmma_desc(region, b_off, lead)
            if a_region is None:
                sub = self.pick(a, range(kk * per, kk * per + per))
                words = self.op(f"bitcast {sub} to <4 x i32>", "i32", 4)
                a_ops = [self.extract(words, i) for i in range(4)]
                a_text, a_cons = _asm_operands(nd, 4), ["r"] * 4
            else:
                at = a_region.tile               # MN-major A: one 64-wide block, as B's
                a_ops = [self._wgmma_desc(
                    a_region, self._kmajor_offset(at, kk * kstep * at.dtype.bytes), 16)
                    if not a_trans else self._wgmma_desc(a_region, kk * kstep * 128, 1024)]
                a_text, a_cons = f"${nd}", ["l"]
            na = len(a_ops)
            text = (f"{{ .reg .pred p; setp.ne.b32 p, ${nd + na + 1}, 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{n}k{kstep}.f32.{aty}.{bty} "
                    f"{_asm_operands(0, nd)}, {a_text}, ${nd + na}, p, 1, 1{trans}; }}")
            cons = ",".join(["=f"] * nd + a_cons + ["l", "n"] + [str(i) for i in range(nd)])
            scale_d = "i32 0" if zero and kk == 0 else "i32 1"
            accs = self._asm_floats(text, cons, a_ops + [bdesc, scale_d] + accs, nd)
        self.ins('call void asm sideeffect "wgmma.commit_group.sync.aligned;", "~{memory}"()')
        self.write(op.dst, self.build(self._wgmma_wait(op.attrs["in_flight"], accs)))

    def _asm_floats(self, text: str, cons: str, args: list, nd: int) -> list:
        """An inline-asm call returning `nd` floats (the accumulators), as Values."""
        rty = "{" + ", ".join(["float"] * nd) + "}"
        res = self.fresh()
        self.ins(f'{res} = call {rty} asm sideeffect "{text}", "{cons}"'
                 f'({", ".join(str(x) for x in args)})')
        return [self.op(f"extractvalue {rty} {res}, {i}", "float", 0) for i in range(nd)]

    def _wgmma_wait(self, in_flight: int, accs: list) -> list:
        """wgmma.wait_group with the accumulators passed through it (tied operands), so the
        compiler reads them only after the wait that retires their groups."""
        nd = len(accs)
        cons = ",".join(["=f"] * nd + [str(i) for i in range(nd)] + ["~{memory}"])
        return self._asm_floats(f"wgmma.wait_group.sync.aligned {in_flight};", cons, accs, nd)

    def r_wgmma_wait(self, op):
        vals = [self.read(r) for r in op.srcs]
        flat = [self.extract(v, i) for v in vals for i in range(v.n)]
        out, at = self._wgmma_wait(op.attrs["in_flight"], flat), 0
        for r, v in zip(op.srcs, vals):
            self.write(r, self.build(out[at:at + v.n]))
            at += v.n

    def r_barrier(self, op):
        self._async_proxy_fence(op)
        # barrier.sync (not .aligned): waves may reach it from different code points, as the
        # ping-pong schedules do.
        self.call("void", "llvm.nvvm.barrier.cta.sync.all", ["i32 0"])

    def cluster_lds_ptr(self, p, rank):
        r = self.call("ptr addrspace(7)", "llvm.nvvm.mapa.shared.cluster",
                      [f"ptr addrspace(3) {p.text}", f"i32 {rank.text}"])
        return Value(r, "ptr addrspace(7)", 0)

    def r_cluster_sync(self, op):
        """Every thread of the cluster arrives (release) and waits (acquire); the mbarrier
        initialisations before it are made visible cluster-wide first."""
        self._async_proxy_fence(op)
        for ins in ("fence.mbarrier_init.release.cluster;",
                    "barrier.cluster.arrive.release.aligned;",
                    "barrier.cluster.wait.acquire.aligned;"):
            self.ins(f'call void asm sideeffect "{ins}", "~{{memory}}"()')

    def r_setprio(self, op):
        """Hopper has no wave priority nor CDNA's scheduling hints: nothing to emit."""

    r_sched_barrier = r_sched_group = r_setprio

    def r_waitcnt(self, op):
        """Loads on Hopper are waited for by data dependence: nothing to emit."""
