"""Lane IR -> LLVM IR text, shared by both GPU families.

Registers become SSA values: a lane register's current value is tracked while the program is
walked, and structured loops and branches get phi nodes for the registers their bodies write.
Uniform registers are scalars; per-lane registers are `<N x T>` vectors (one element per slot).
Arithmetic on 16-bit floats is done in f32 and rounded once, exactly as the emulator does.
The target dialects (amdgpu.py, nvptx.py) supply ids, memory access and cross-lane exchange.
"""
from __future__ import annotations

import struct

import numpy as np

from ..ir import types as T
from ..ir.errors import NotSupportedYet
from ..ir.nodes import Block, walk
from ..lower.lane import LaneProgram
from ..runtime.abi import kernel_args

_LLTY = {"f32": "float", "bf16": "bfloat", "f16": "half", "i32": "i32", "i8": "i8",
         "i1": "i1", "e4m3": "i8", "e5m2": "i8", "e4m3fnuz": "i8", "e5m2fnuz": "i8"}


def llty(d: T.DType) -> str:
    return _LLTY[d.name]


def literal(value, d: T.DType) -> str:
    if d == T.boolean:
        return "true" if value else "false"
    if not d.is_float:
        return str(int(value))
    if d.is_fp8:
        raise NotSupportedYet("fp8 constants are not supported yet in LLVM rendering")
    if d == T.f32:
        bits = struct.unpack("<Q", struct.pack("<d", float(np.float32(value))))[0]
        return f"0x{bits:016X}"
    raw = np.array([value], d.np).view(np.uint16)[0]
    return f"0x{'R' if d == T.bf16 else 'H'}{int(raw):04X}"


class Value:
    """An SSA value: its text, LLVM element type, and lanes-in-a-vector (0 = scalar)."""
    __slots__ = ("text", "ety", "n")

    def __init__(self, text, ety, n):
        self.text, self.ety, self.n = text, ety, n

    @property
    def ty(self):
        return self.ety if self.n == 0 else f"<{self.n} x {self.ety}>"

    def __str__(self):
        return f"{self.ty} {self.text}"


class Renderer:
    dialect_name = "?"

    def __init__(self, prog: LaneProgram, stride_divisor: int = 1):
        from .divisibility import analyze
        self.p = prog
        self.divs = analyze(prog, stride_divisor)
        self.lines: list[str] = []
        self.decls: dict[str, str] = {}
        self.globals: list[str] = []
        self.cur: dict = {}
        self.counter = 0
        self.block = "entry"

    # -- text helpers ---------------------------------------------------------------------
    def fresh(self, stem="t") -> str:
        self.counter += 1
        return f"%{stem}{self.counter}"

    def label(self, stem) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def ins(self, text: str):
        self.lines.append("  " + text)

    def start_block(self, name):
        self.lines.append(f"{name}:")
        self.block = name

    def declare(self, name, sig):
        self.decls[name] = sig

    def call(self, ret: str, name: str, args: list[str], sig_args: list[str] | None = None,
             attrs: str = "") -> str | None:
        self.declare(name, f"declare {ret} @{name}({', '.join(sig_args or [a.rsplit(' ', 1)[0] for a in args])}){(' ' + attrs) if attrs else ''}")
        if ret == "void":
            self.ins(f"call void @{name}({', '.join(args)})")
            return None
        r = self.fresh()
        self.ins(f"{r} = call {ret} @{name}({', '.join(args)})")
        return r

    def op(self, text, ety, n) -> Value:
        r = self.fresh()
        self.ins(f"{r} = {text}")
        return Value(r, ety, n)

    # -- shape helpers --------------------------------------------------------------------
    def splat(self, v: Value, n: int) -> Value:
        if v.n == n:
            return v
        if v.n not in (0, 1):
            raise AssertionError(f"cannot splat a {v.n}-vector to {n}")
        if v.n == 1:
            v = self.extract(v, 0)
        a = self.op(f"insertelement <{n} x {v.ety}> poison, {v}, i64 0", v.ety, n)
        return self.op(f"shufflevector {a}, <{n} x {v.ety}> poison, <{n} x i32> zeroinitializer",
                       v.ety, n)

    def extract(self, v: Value, i: int) -> Value:
        if v.n == 0:
            return v
        return self.op(f"extractelement {v}, i64 {i}", v.ety, 0)

    def build(self, elems: list[Value]) -> Value:
        ety, n = elems[0].ety, len(elems)
        acc = Value("poison", ety, n)
        for i, e in enumerate(elems):
            acc = self.op(f"insertelement {acc}, {e}, i64 {i}", ety, n)
        return acc

    def const_vec(self, values, d: T.DType) -> Value:
        items = ", ".join(f"{llty(d)} {literal(x, d)}" for x in values)
        return Value(f"<{items}>", llty(d), len(values))

    def shape_of(self, reg) -> int:
        t = reg.type
        return 0 if t.uniform else t.nslots

    def read(self, reg) -> Value:
        v = self.cur.get(reg)
        if v is None:
            n = self.shape_of(reg)
            return Value("poison" if n else "poison", llty(reg.type.dtype), n)
        return v

    def write(self, reg, v: Value):
        n = self.shape_of(reg)
        if n and v.n != n:
            v = self.splat(v, n)
        self.cur[reg] = v

    def operands(self, dst, srcs):
        """Operand values brought to the destination's shape."""
        n = self.shape_of(dst)
        vals = [self.read(s) for s in srcs]
        if n:
            vals = [self.splat(v, n) if v.n != n else v for v in vals]
        return vals, n

    # -- arithmetic -----------------------------------------------------------------------
    def widen(self, v: Value, d: T.DType) -> Value:
        if d in (T.bf16, T.f16):
            ty = "float" if v.n == 0 else f"<{v.n} x float>"
            return self.op(f"fpext {v} to {ty}", "float", v.n)
        return v

    def narrow(self, v: Value, d: T.DType) -> Value:
        if d in (T.bf16, T.f16):
            e = llty(d)
            ty = e if v.n == 0 else f"<{v.n} x {e}>"
            return self.op(f"fptrunc {v} to {ty}", e, v.n)
        return v

    def intrinsic_name(self, base: str, v: Value) -> str:
        suffix = ("f32" if v.ety == "float" else v.ety) if v.n == 0 else \
            f"v{v.n}{'f32' if v.ety == 'float' else v.ety}"
        return f"{base}.{suffix}"

    def float_bin(self, op, a: Value, b: Value, d: T.DType) -> Value:
        a, b = self.widen(a, d), self.widen(b, d)
        if op in ("add", "sub", "mul", "div"):
            r = self.op(f"f{op} {a}, {b.text}", a.ety, a.n)
        elif op in ("max", "min"):
            name = self.intrinsic_name(f"llvm.{op}num", a)
            r = Value(self.call(a.ty, name, [str(a), str(b)]), a.ety, a.n)
        else:
            raise NotSupportedYet(f"float operation {op!r} has no LLVM rendering")
        return self.narrow(r, d)

    def int_bin(self, op, a: Value, b: Value, d: T.DType) -> Value:
        simple = {"add": "add", "sub": "sub", "mul": "mul", "and": "and", "or": "or",
                  "xor": "xor", "shl": "shl", "shr": "lshr"}
        if op in simple:
            return self.op(f"{simple[op]} {a}, {b.text}", a.ety, a.n)
        if op in ("max", "min"):
            name = self.intrinsic_name(f"llvm.s{op}", a)
            return Value(self.call(a.ty, name, [str(a), str(b)]), a.ety, a.n)
        if op in ("div", "floordiv", "mod"):
            # Floor semantics (as Python and the emulator): fix truncating sdiv/srem when the
            # remainder is non-zero and its sign differs from the divisor's.
            q = self.op(f"sdiv {a}, {b.text}", a.ety, a.n)
            r = self.op(f"srem {a}, {b.text}", a.ety, a.n)
            zero = "zeroinitializer" if a.n else "0"
            nz = self.op(f"icmp ne {r}, {zero}", "i1", a.n)
            x = self.op(f"xor {r}, {b.text}", a.ety, a.n)
            neg = self.op(f"icmp slt {x}, {zero}", "i1", a.n)
            fix = self.op(f"and {nz}, {neg.text}", "i1", a.n)
            if op == "mod":
                add = self.op(f"select {fix}, {b}, {a.ty} {zero}", a.ety, a.n)
                return self.op(f"add {r}, {add.text}", a.ety, a.n)
            one = self.op(f"zext {fix} to {a.ty}", a.ety, a.n)
            return self.op(f"sub {q}, {one.text}", a.ety, a.n)
        raise NotSupportedYet(f"integer operation {op!r} has no LLVM rendering")

    def binary(self, op, a: Value, b: Value, d: T.DType) -> Value:
        if d == T.boolean:
            return self.op(f"{op} {a}, {b.text}", "i1", a.n)
        if d.is_fp8:
            raise NotSupportedYet("arithmetic on fp8 registers is not supported; cast to f32")
        return self.float_bin(op, a, b, d) if d.is_float else self.int_bin(op, a, b, d)

    def compare(self, op, a: Value, b: Value, d: T.DType) -> Value:
        if d.is_float:
            a, b = self.widen(a, d), self.widen(b, d)
            pred = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq",
                    "ne": "une"}[op]
            return self.op(f"fcmp {pred} {a}, {b.text}", "i1", a.n)
        pred = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}[op]
        return self.op(f"icmp {pred} {a}, {b.text}", "i1", a.n)

    def unary(self, op, a: Value, d: T.DType) -> Value:
        x = self.widen(a, d)
        one = Value(literal(1.0, T.f32), "float", 0)
        if op in ("exp2", "log2", "sqrt", "abs"):
            base = {"abs": "llvm.fabs"}.get(op, f"llvm.{op}")
            r = Value(self.call(x.ty, self.intrinsic_name(base, x), [str(x)]), "float", x.n)
        elif op == "neg":
            r = self.op(f"fneg {x}", "float", x.n)
        elif op in ("rsqrt", "recip"):
            s = x if op == "recip" else \
                Value(self.call(x.ty, self.intrinsic_name("llvm.sqrt", x), [str(x)]), "float", x.n)
            o = self.splat(one, x.n) if x.n else one
            r = self.op(f"fdiv {o}, {s.text}", "float", x.n)
        else:
            raise NotSupportedYet(f"unary operation {op!r} has no LLVM rendering")
        return self.narrow(r, d)

    def convert(self, v: Value, src: T.DType, dst: T.DType) -> Value:
        n = v.n
        e = llty(dst)
        ty = e if n == 0 else f"<{n} x {e}>"
        if src == dst:
            return v
        if src.is_fp8 or dst.is_fp8:
            return self.convert_fp8(v, src, dst)
        if src == T.boolean:
            return self.op(f"zext {v} to {ty}", e, n) if not dst.is_float else \
                self.op(f"uitofp {v} to {ty}", e, n)
        if src.is_float and dst.is_float:
            kind = "fpext" if dst.bits > src.bits else "fptrunc"
            if {src, dst} == {T.bf16, T.f16}:
                v = self.op(f"fpext {v} to {'float' if n == 0 else f'<{n} x float>'}", "float", n)
                kind = "fptrunc"
            return self.op(f"{kind} {v} to {ty}", e, n)
        if src.is_float:                      # round to nearest even, saturate, NaN -> 0
            r = Value(self.call(v.ty, self.intrinsic_name("llvm.rint", v), [str(v)]), v.ety, n)
            return Value(self.call(ty, f"llvm.fptosi.sat.{self._suffix(e, n)}.{self._suffix(v.ety, n)}",
                                   [str(r)]), e, n)
        if dst.is_float:
            return self.op(f"sitofp {v} to {ty}", e, n)
        if dst.bits < src.bits:                # saturate, as float -> int conversions do
            lo, hi = -(1 << (dst.bits - 1)), (1 << (dst.bits - 1)) - 1
            sv = lambda c: self.splat(Value(str(c), v.ety, 0), n) if n else Value(str(c), v.ety, 0)  # noqa: E731
            v = Value(self.call(v.ty, self.intrinsic_name("llvm.smax", v), [str(v), str(sv(lo))]), v.ety, n)
            v = Value(self.call(v.ty, self.intrinsic_name("llvm.smin", v), [str(v), str(sv(hi))]), v.ety, n)
            return self.op(f"trunc {v} to {ty}", e, n)
        return self.op(f"sext {v} to {ty}", e, n)

    def _suffix(self, ety, n):
        s = {"float": "f32", "bfloat": "bf16", "half": "f16"}.get(ety, ety)
        return s if n == 0 else f"v{n}{s}"

    def convert_fp8(self, v, src, dst):
        raise NotSupportedYet(f"conversions to and from fp8 are not supported yet on "
                              f"{self.p.target.name}")

    # -- program --------------------------------------------------------------------------
    def render(self) -> str:
        self.prologue()
        self.emit_block(self.p.body)
        self.ins("ret void")
        args = []
        for a in kernel_args(self.p.params):
            ty = self.arg_type(a)
            args.append(f"{ty} %{a.name}")
        head = self.function_header(", ".join(args))
        body = "\n".join(getattr(self, "entry_lines", []) + self.lines)
        decls = "\n".join(sorted(self.decls.values()))
        glob = "\n".join(self.globals)
        return "\n".join(x for x in (self.module_header(), glob, head + " {", "entry:", body,
                                     "}", decls, self.module_footer()) if x) + "\n"

    def emit_block(self, block: Block):
        for op in block.ops:
            self.loc = op.loc
            getattr(self, "r_" + op.kind)(op)

    def assigned(self, block: Block) -> list:
        """Registers a region writes (pinned ones live in physical registers: no phis)."""
        seen, out = set(), []
        for op in walk(block):
            if op.dst is not None and op.dst not in seen and \
                    getattr(op.dst.type, "pin", None) is None:
                seen.add(op.dst)
                out.append(op.dst)
        return out

    def r_for(self, op):
        start, stop = (self.read(s) for s in op.srcs)
        step = op.attrs["step"]
        idx = op.dst
        carried = [r for r in self.assigned(op.regions[0]) if r is not idx]
        pre = self.block
        head, body, done = self.label("loop"), self.label("body"), self.label("exit")
        self.ins(f"br label %{head}")
        self.start_block(head)
        iv = self.fresh("i")
        phis = {}
        placeholder = len(self.lines)
        for r in carried:
            v = self.read(r)
            n = self.shape_of(r)
            if n and v.n != n:
                v = Value("poison", llty(r.type.dtype), n)
            phis[r] = (self.fresh("c"), v)
        cmp = self.fresh()
        self.lines.append(None)                    # phi lines are filled in after the body
        self.ins(f"{cmp} = icmp {'slt' if step > 0 else 'sgt'} i32 {iv}, {stop.text}")
        self.ins(f"br i1 {cmp}, label %{body}, label %{done}")
        self.start_block(body)
        for r, (name, v) in phis.items():
            self.cur[r] = Value(name, v.ety, v.n)
        self.cur[idx] = Value(iv, "i32", 0)
        self.emit_block(op.regions[0])
        nxt = self.fresh()
        self.ins(f"{nxt} = add i32 {iv}, {step}")
        latch = self.block
        self.ins(f"br label %{head}")
        phi_lines = [f"  {iv} = phi i32 [ {start.text}, %{pre} ], [ {nxt}, %{latch} ]"]
        for r, (name, v) in phis.items():
            end = self.read(r)                    # write() keeps vector shapes: no splat here
            phi_lines.append(f"  {name} = phi {v.ty} [ {v.text}, %{pre} ], [ {end.text}, %{latch} ]")
        self.lines[placeholder:placeholder + 1] = phi_lines
        self.start_block(done)
        for r, (name, v) in phis.items():
            self.cur[r] = Value(name, v.ety, v.n)
        self.cur.pop(idx, None)

    def r_if(self, op):
        cond = self.read(op.srcs[0])
        regs = []
        for region in op.regions:
            regs += [r for r in self.assigned(region) if r not in regs]
        before = {r: self.read(r) for r in regs}
        then_l, else_l, join = self.label("then"), self.label("else"), self.label("join")
        self.ins(f"br i1 {cond.text}, label %{then_l}, label %{else_l}")
        ends = []
        for i, lab in enumerate((then_l, else_l)):
            self.start_block(lab)
            self.cur.update(before)
            if i < len(op.regions):
                self.emit_block(op.regions[i])
            vals = {}
            for r in regs:
                v = self.read(r)
                n = self.shape_of(r)
                if n and v.n != n:
                    v = self.splat(v, n) if v.text != "poison" else Value("poison", v.ety, n)
                vals[r] = v
            ends.append((self.block, vals))
            self.ins(f"br label %{join}")
        self.start_block(join)
        for r in regs:
            (b1, vals1), (b2, vals2) = ends
            v1, v2 = vals1[r], vals2[r]
            name = self.fresh("m")
            self.ins(f"{name} = phi {v1.ty} [ {v1.text}, %{b1} ], [ {v2.text}, %{b2} ]")
            self.cur[r] = Value(name, v1.ety, v1.n)

    def r_const(self, op):
        d = op.dst.type.dtype
        self.write(op.dst, Value(literal(op.attrs["value"], d), llty(d), 0))

    def r_arg(self, op):
        self.write(op.dst, Value(f"%{op.attrs['name']}", llty(op.dst.type.dtype), 0))

    def r_dim(self, op):
        self.write(op.dst, Value(f"%{op.srcs[0].name}.size{op.attrs['axis']}", "i32", 0))

    def r_stride(self, op):
        gl = op.srcs[0]
        if op.attrs["axis"] == gl.type.rank - 1:
            # The launchers require a unit stride in the last dim; knowing it lets runs of
            # adjacent elements become one vector access.
            self.write(op.dst, Value("1", "i32", 0))
        else:
            self.write(op.dst, Value(f"%{gl.name}.stride{op.attrs['axis']}", "i32", 0))

    def r_special(self, op):
        self.write(op.dst, self.special(op.attrs["name"], op.attrs["axis"]))

    def r_coord(self, op):
        lay, dim = op.attrs["layout"], op.attrs["dim"]
        lane = self.lane_id() if op.attrs["scope"] == "wave" else self.flat_thread_id()
        base = None
        bits = [(b, s) for b, (d, s) in enumerate(lay.lane_bits) if d == dim]
        i = 0
        while i < len(bits):                      # runs of bits with doubling strides
            j = i + 1
            while j < len(bits) and bits[j][0] == bits[j - 1][0] + 1 and \
                    bits[j][1] == 2 * bits[j - 1][1]:
                j += 1
            b0, s0 = bits[i]
            mask = (1 << (j - i)) - 1
            sh = self.op(f"lshr i32 {lane.text}, {b0}", "i32", 0)
            fld = self.op(f"and i32 {sh.text}, {mask}", "i32", 0)
            term = self.op(f"mul i32 {fld.text}, {s0}", "i32", 0)
            base = term if base is None else self.op(f"add i32 {base.text}, {term.text}", "i32", 0)
            i = j
        if base is None:
            base = Value("0", "i32", 0)
        offs = [s[dim] for s in lay.slots]
        v = self.splat(base, len(offs))
        self.write(op.dst, self.op(f"add {v}, {self.const_vec(offs, T.i32).text}", "i32", len(offs)))

    def r_mov(self, op):
        (v,), n = self.operands(op.dst, op.srcs)
        src_d, dst_d = op.srcs[0].type.dtype, op.dst.type.dtype
        self.write(op.dst, self.convert(v, src_d, dst_d) if src_d != dst_d else v)

    r_cvt = r_mov

    def r_bin(self, op):
        (a, b), n = self.operands(op.dst, op.srcs)
        self.write(op.dst, self.binary(op.attrs["op"], a, b, op.dst.type.dtype))

    def r_cmp(self, op):
        (a, b), n = self.operands(op.dst, op.srcs)
        d = op.srcs[0].type.dtype
        self.write(op.dst, self.compare(op.attrs["op"], a, b, d))

    def r_un(self, op):
        (a,), n = self.operands(op.dst, op.srcs)
        self.write(op.dst, self.unary(op.attrs["op"], a, op.dst.type.dtype))

    def r_select(self, op):
        n = self.shape_of(op.dst)
        c = self.read(op.srcs[0])
        a, b = (self.read(s) for s in op.srcs[1:])
        if n:
            a, b = self.splat(a, n) if a.n != n else a, self.splat(b, n) if b.n != n else b
            if c.n not in (0, n):
                c = self.splat(c, n)
        self.write(op.dst, self.op(f"select {c}, {a}, {b}", a.ety, a.n))

    def r_slots(self, op):
        src = self.read(op.srcs[0])
        idx = op.attrs["index"]
        if src.n == 0:
            self.write(op.dst, src)
            return
        mask = ", ".join(f"i32 {i}" for i in idx)
        self.write(op.dst, self.op(f"shufflevector {src}, {src.ty} poison, <{len(idx)} x i32> <{mask}>",
                                   src.ety, len(idx)))

    def r_slot_reduce(self, op):
        src = self.read(op.srcs[0])
        d = op.dst.type.dtype
        outs = []
        for g in op.attrs["groups"]:
            acc = self.extract(src, g[0])
            for i in g[1:]:
                acc = self.binary(op.attrs["op"], acc, self.extract(src, i), d)
            outs.append(acc)
        self.write(op.dst, self.build(outs))

    def r_bfly(self, op):
        v = self.read(op.srcs[0])
        d = op.dst.type.dtype
        elems = [self.extract(v, i) for i in range(v.n)]
        for b in op.attrs["bits"]:
            elems = [self.binary(op.attrs["op"], e, self.lane_xor(e, 1 << b), d) for e in elems]
        self.write(op.dst, self.build(elems))

    # -- memory shared by dialects --------------------------------------------------------
    def runs_of(self, op, n):
        return op.attrs.get("runs") or tuple((i, 1) for i in range(n))

    def r_lds_load(self, op):
        addr = self.read(op.srcs[0])
        d = op.dst.type.dtype
        n = self.shape_of(op.dst)
        addr = self.splat(addr, n) if addr.n != n else addr
        elems = []
        for i in range(n):
            a = self.extract(addr, i)
            p = self.op(f"getelementptr i8, ptr addrspace(3) {self.lds_symbol()}, {a}", "ptr addrspace(3)", 0)
            elems.append(self.op(f"load {llty(d)}, ptr addrspace(3) {p.text}, align {d.bytes}", llty(d), 0))
        self.write(op.dst, self.build(elems))

    def r_lds_store(self, op):
        addr, val = (self.read(s) for s in op.srcs)
        n = max(addr.n, val.n, 1)
        addr = self.splat(addr, n) if addr.n != n else addr
        val = self.splat(val, n) if val.n != n else val
        d = op.srcs[1].type.dtype
        for i in range(n):
            a, x = self.extract(addr, i), self.extract(val, i)
            p = self.op(f"getelementptr i8, ptr addrspace(3) {self.lds_symbol()}, {a}", "ptr addrspace(3)", 0)
            self.ins(f"store {x}, ptr addrspace(3) {p.text}, align {d.bytes}")

    def run_align(self, off_reg, slot, d) -> int:
        from .divisibility import alignment
        return alignment(self.divs, off_reg, slot, d.bytes)

    def _norm(self, reg, n) -> Value:
        v = self.read(reg)
        return self.splat(v, n) if v.n != n else v

    def _all(self, bits: list[Value]) -> Value:
        acc = bits[0]
        for b in bits[1:]:
            acc = self.op(f"and i1 {acc.text}, {b.text}", "i1", 0)
        return acc

    def r_gload(self, op):
        """Fast path: every element of the lane in range -> one vector access per run.
        Otherwise each element is loaded on its own, masked elements reading zero."""
        gl, off_r, mask_r = op.srcs
        d, n = op.dst.type.dtype, self.shape_of(op.dst)
        off, mask = self._norm(off_r, n), self._norm(mask_r, n)
        offs = [self.extract(off, i) for i in range(n)]
        ms = [self.extract(mask, i) for i in range(n)]
        full = self._all(ms)
        fast_l, slow_l, join = self.label("ld_full"), self.label("ld_edge"), self.label("ld_join")
        self.ins(f"br i1 {full.text}, label %{fast_l}, label %{slow_l}")
        self.start_block(fast_l)
        elems = []
        for first, k in self.runs_of(op, n):
            self.align = self.run_align(off_r, first, d)
            v = self.load_run(gl, offs[first], k, d)
            elems += [self.extract(v, i) for i in range(k)] if k > 1 else [v]
        fast = self.build(elems)
        fast_end = self.block
        self.ins(f"br label %{join}")
        self.start_block(slow_l)
        slow = self.build([self.load_elem(gl, offs[i], ms[i], d) for i in range(n)])
        slow_end = self.block
        self.ins(f"br label %{join}")
        self.start_block(join)
        self.write(op.dst, self.op(f"phi {fast.ty} [ {fast.text}, %{fast_end} ], "
                                   f"[ {slow.text}, %{slow_end} ]", fast.ety, n))

    def r_gstore(self, op):
        gl, off_r, mask_r, val_r = op.srcs
        d = val_r.type.dtype
        n = max(self.shape_of(val_r), self.shape_of(off_r), 1)
        off, mask, val = self._norm(off_r, n), self._norm(mask_r, n), self._norm(val_r, n)
        offs = [self.extract(off, i) for i in range(n)]
        ms = [self.extract(mask, i) for i in range(n)]
        full = self._all(ms)
        fast_l, slow_l, join = self.label("st_full"), self.label("st_edge"), self.label("st_join")
        self.ins(f"br i1 {full.text}, label %{fast_l}, label %{slow_l}")
        self.start_block(fast_l)
        for first, k in self.runs_of(op, n):
            idx = ", ".join(f"i32 {first + i}" for i in range(k))
            part = self.op(f"shufflevector {val}, {val.ty} poison, <{k} x i32> <{idx}>",
                           val.ety, k) if k > 1 else self.extract(val, first)
            self.align = self.run_align(off_r, first, d)
            self.store_run(gl, offs[first], part, d)
        self.ins(f"br label %{join}")
        self.start_block(slow_l)
        for i in range(n):
            self.store_elem(gl, offs[i], ms[i], self.extract(val, i), d)
        self.ins(f"br label %{join}")
        self.start_block(join)

    # -- dialect hooks ----------------------------------------------------------------------
    def module_header(self) -> str: raise NotImplementedError
    def module_footer(self) -> str: return ""
    def function_header(self, args: str) -> str: raise NotImplementedError
    def arg_type(self, a) -> str: raise NotImplementedError
    def prologue(self): pass
    def special(self, name, axis) -> Value: raise NotImplementedError
    def lane_id(self) -> Value: raise NotImplementedError
    def flat_thread_id(self) -> Value: raise NotImplementedError
    def lane_xor(self, v: Value, mask: int) -> Value: raise NotImplementedError
    def lds_symbol(self) -> str: raise NotImplementedError
    def load_run(self, gl, off: Value, k: int, d) -> Value: raise NotImplementedError
    def load_elem(self, gl, off: Value, mask: Value, d) -> Value: raise NotImplementedError
    def store_run(self, gl, off: Value, vec: Value, d): raise NotImplementedError
    def store_elem(self, gl, off: Value, mask: Value, val: Value, d): raise NotImplementedError
    def r_barrier(self, op): raise NotImplementedError
    def r_setprio(self, op): raise NotImplementedError
