"""Lane IR -> LLVM IR text, shared by both GPU families.

Registers become SSA values: a lane register's current value is tracked while the program is
walked, and structured loops and branches get phi nodes for the registers their bodies write.
Uniform registers are scalars; per-lane registers are `<N x T>` vectors (one element per slot).
Arithmetic on 16-bit floats is done in f32 and rounded once, exactly as the emulator does.
The target dialects (amdgpu.py, nvptx.py) supply ids, memory access and cross-lane exchange.
"""
from __future__ import annotations

import struct
from math import gcd

import numpy as np

from ..ir import types as T
from ..ir.errors import NotSupportedYet
from ..ir.nodes import Block, walk
from ..lower.lane import LaneProgram
from ..ir.abi import kernel_args

_LLTY = {"f32": "float", "bf16": "bfloat", "f16": "half", "i32": "i32", "i8": "i8",
         "i1": "i1", "e4m3": "i8", "e5m2": "i8", "e4m3fnuz": "i8", "e5m2fnuz": "i8",
         "e8m0": "i8", "e2m1x2": "i8", "e2m3p": "i8", "e3m2p": "i8"}
GLOBAL_PTR = "ptr addrspace(1)"        # a tensor's base pointer, in both dialects


def llty(d: T.DType) -> str:
    return _LLTY[d.name]


def literal(value, d: T.DType) -> str:
    if d == T.boolean:
        return "true" if value else "false"
    if not d.is_float:
        return str(int(value))
    if d.packed != 1:                         # packed pairs: a fill of zeros only
        if value != 0:
            raise ValueError(f"{d} fills with 0 only (packed pairs), not {value}")
        return "0"
    if d.is_fp8:                              # fp8 registers are i8: the encoded byte
        return str(int(np.array([value], np.float32).astype(d.np).view(np.int8)[0]))
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
    # f32 math a dialect renders with its hardware instruction (scalar intrinsic) rather than
    # LLVM's generic intrinsic and the range handling around it
    HARDWARE_MATH: dict = {}

    def __init__(self, prog: LaneProgram, stride_divisor: int = 1):
        from .divisibility import analyze
        self.p = prog
        self.stride_divisor = stride_divisor
        self.divs = analyze(prog, stride_divisor)
        self.lines: list[str] = []
        self.decls: dict[str, str] = {}
        self.globals: list[str] = []
        self.cur: dict = {}
        self.counter = 0
        self.block = "entry"
        # peer views: registers holding the pointer of the rank's tensor they picked
        self.views = {op.dst for op in walk(prog.body) if op.kind == "peer"}

    # -- text helpers ---------------------------------------------------------------------
    def fresh(self, stem="t") -> str:
        self.counter += 1
        return f"%{stem}{self.counter}"

    def label(self, stem) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def branch(self, cond: Value, yes: str, no: str, join: str) -> tuple[str, str, str]:
        """New labels for the two sides of a conditional branch on `cond` and their join;
        emits the branch (the caller starts the blocks)."""
        labels = self.label(yes), self.label(no), self.label(join)
        self.ins(f"br i1 {cond.text}, label %{labels[0]}, label %{labels[1]}")
        return labels

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

    def to_i32(self, v: Value) -> Value:
        """A 32-bit or 16-bit scalar as the i32 that cross-lane exchanges move."""
        if v.ety == "i32":
            return v
        if v.ety == "float":
            return self.op(f"bitcast {v} to i32", "i32", 0)
        b = self.op(f"bitcast {v} to i16", "i16", 0)
        return self.op(f"zext {b} to i32", "i32", 0)

    def from_i32(self, r: Value, ety: str) -> Value:
        """The inverse of to_i32."""
        if ety == "i32":
            return r
        if ety == "float":
            return self.op(f"bitcast {r} to float", "float", 0)
        t = self.op(f"trunc {r} to i16", "i16", 0)
        return self.op(f"bitcast {t} to {ety}", ety, 0)

    def pick(self, v: Value, slots) -> Value:
        """The vector of `v`'s elements at `slots`, in that order."""
        slots = list(slots)
        idx = ", ".join(f"i32 {i}" for i in slots)
        return self.op(f"shufflevector {v}, {v.ty} poison, <{len(slots)} x i32> <{idx}>",
                       v.ety, len(slots))

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
        return 0 if isinstance(t, T.GlobalType) or t.uniform else t.nslots

    def read(self, reg) -> Value:
        v = self.cur.get(reg)
        if v is None:
            if reg in self.views:     # not picked on this path yet: rank 0's, as a bad rank
                return Value(f"%{reg.name}", GLOBAL_PTR, 0)
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
        if op in self.HARDWARE_MATH:           # the chip's own instruction, element by element
            name = self.HARDWARE_MATH[op]
            elems = [Value(self.call("float", name, [str(e)]), "float", 0)
                     for e in ([self.extract(x, i) for i in range(x.n)] if x.n else [x])]
            r = self.build(elems) if x.n else elems[0]
        elif op in ("exp2", "log2", "sqrt", "abs"):
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
        for a in kernel_args(self.p.params, getattr(self.p, "tmaps", ())):
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
            # wgmma_wait hands back the accumulators it waited for: it writes its operands
            for r in (op.srcs if op.kind == "wgmma_wait" else (op.dst,)):
                if r is not None and r not in seen and getattr(r.type, "pin", None) is None:
                    seen.add(r)
                    out.append(r)
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
        then_l, else_l, join = self.branch(cond, "then", "else", "join")
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

    @staticmethod
    def size_of(gl, axis: int) -> Value:
        """A tensor's size in one dim: a constant where the signature makes the dim static
        (the launch checks it), so bounds on it fold away; else the kernel argument."""
        d = gl.type.shape[axis]
        return Value(str(d) if d is not None else f"%{gl.name}.size{axis}", "i32", 0)

    def r_dim(self, op):
        self.write(op.dst, self.size_of(op.srcs[0], op.attrs["axis"]))

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
        base = self.lane_base(lay, dim, op.attrs["scope"])
        offs = [s[dim] for s in lay.slots]
        v = self.splat(base, len(offs))
        self.write(op.dst, self.op(f"add {v}, {self.const_vec(offs, T.i32).text}", "i32", len(offs)))

    def lane_base(self, lay, dim, scope) -> Value:
        """The lane's contribution to coordinate `dim` under a layout: sum of its lane bits'
        strides (runs of bits with doubling strides become one shift-and-mask)."""
        lane = self.lane_id() if scope == "wave" else self.flat_thread_id()
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
        return base if base is not None else Value("0", "i32", 0)

    def r_mov(self, op):
        (v,), n = self.operands(op.dst, op.srcs)
        src_d, dst_d = op.srcs[0].type.dtype, op.dst.type.dtype
        self.write(op.dst, self.convert(v, src_d, dst_d) if src_d != dst_d else v)

    r_cvt = r_mov

    def r_bin(self, op):
        (a, b), n = self.operands(op.dst, op.srcs)
        self.write(op.dst, self.binary(op.attrs["op"], a, b, op.dst.type.dtype))

    def r_any(self, op):
        c = self.read(op.srcs[0])
        if c.n:
            c = Value(self.call("i1", f"llvm.vector.reduce.or.v{c.n}i1", [str(c)]), "i1", 0)
        self.write(op.dst, self.vote_any(c))

    def vote_any(self, c: Value) -> Value:
        raise NotImplementedError

    def r_fma(self, op):
        (a, b, c), n = self.operands(op.dst, op.srcs)
        d = op.dst.type.dtype
        a, b, c = (self.widen(x, d) for x in (a, b, c))
        name = self.intrinsic_name("llvm.fma", a)
        r = Value(self.call(a.ty, name, [str(a), str(b), str(c)]), "float", a.n)
        self.write(op.dst, self.narrow(r, d))

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
        v = self.pick(src, idx)
        if op.attrs.get("window"):
            # A window of a register-resident tile: each use converts its own copy. `freeze`
            # keeps LLVM from merging the conversions of separate uses into values that would
            # stay live (in f32) between the passes over the tile.
            v = self.op(f"freeze {v}", v.ety, v.n)
        self.write(op.dst, v)

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
    # -- windows: global and LDS accesses ---------------------------------------------------
    @staticmethod
    def window_runs(lay, dim: int, esz: int):
        """(first slot, count) groups of slots holding adjacent elements along `dim`, at most
        16 bytes each and of power-of-two size: each becomes one vector access."""
        cap = max(1, 16 // esz)
        out, i, n = [], 0, lay.nslots
        while i < n:
            j = i + 1
            while j < n and j - i < cap:
                a, b = lay.slots[j - 1], lay.slots[j]
                if b[dim] != a[dim] + 1 or b[1 - dim] != a[1 - dim]:
                    break
                j += 1
            k = 1 << ((j - i).bit_length() - 1)
            out.append((i, k))
            i += k
        return out

    def _provable(self, origin_reg, lay, dim, slot_off) -> int:
        """A number that element index origin + lane part + slot_off is provably a multiple
        of (0 = any)."""
        g = self.divs.get(origin_reg, (1,))[0] if origin_reg is not None else 0
        for d, st in lay.lane_bits:
            if d == dim:
                g = gcd(g, st)
        return gcd(g, slot_off)

    def _align_bytes(self, g: int, esz: int, k: int) -> int:
        p = (g & -g) if g else 16
        return max(esz, min(16, p * esz, k * esz))

    def _tensor_window(self, op, nvals):
        """Per-run element offset, validity and alignment of a gload/gstore window."""
        gl = op.srcs[0]
        lay, dims, scope = op.attrs["layout"], op.attrs["dims"], op.attrs["scope"]
        rank, esz = gl.type.rank, gl.type.dtype.bytes
        nlead = rank - len(dims)
        idx_regs = op.srcs[1:len(op.srcs) - nvals]
        lead = [self.read(r) for r in idx_regs[:nlead]]
        origin_regs = idx_regs[nlead:]
        base = [self.op(f"add i32 {self.read(o).text}, {self.lane_base(lay, d, scope).text}",
                        "i32", 0) for o, d in zip(origin_regs, dims)]
        size = [self.size_of(gl, a) for a in range(rank)]
        for i, e in enumerate(op.attrs.get("ends") or ()):      # end= bounds the window too
            if e is not None:
                a = rank - len(dims) + i
                size[a] = Value(self.call("i32", "llvm.smin.i32",
                                          [str(size[a]), str(self.read(e))]), "i32", 0)
        stride = [Value("1" if a == rank - 1 else f"%{gl.name}.stride{a}", "i32", 0)
                  for a in range(rank)]
        ok_lead = Value("true", "i1", 0)
        off_lead = Value("0", "i32", 0)
        for a, v in enumerate(lead):
            ok_lead = self._and(ok_lead, self._in_range(v, size[a]))
            off_lead = self.op(f"add i32 {off_lead.text}, "
                               f"{self.op(f'mul i32 {v.text}, {stride[a].text}', 'i32', 0).text}", "i32", 0)
        stride_div = self.stride_divisor if rank > 1 else 0
        runs = []
        for first, k in self.window_runs(lay, dims[-1], esz):
            off, ok, last = off_lead, ok_lead, None
            for o_reg, d, b in zip(origin_regs, dims, base):
                axis = rank - len(dims) + dims.index(d)
                idx = self.op(f"add i32 {b.text}, {lay.slots[first][d]}", "i32", 0)
                off = self.op(f"add i32 {off.text}, "
                              f"{self.op(f'mul i32 {idx.text}, {stride[axis].text}', 'i32', 0).text}", "i32", 0)
                if d == dims[-1]:
                    last = (idx, size[axis])
                    lo = self.op(f"icmp sge i32 {idx.text}, 0", "i1", 0)
                    end = self.op(f"add i32 {idx.text}, {k}", "i32", 0)
                    hi = self.op(f"icmp sle i32 {end.text}, {size[axis].text}", "i1", 0)
                    full = self._and(self._and(ok, lo), hi)
                else:
                    ok = self._and(ok, self._in_range(idx, size[axis]))
            g = gcd(self._provable(origin_regs[-1], lay, dims[-1], lay.slots[first][dims[-1]]),
                    stride_div)
            runs.append((first, k, off, ok, full, last, self._align_bytes(g, esz, k)))
        return runs

    def _in_range(self, v, size):
        lo = self.op(f"icmp sge i32 {v.text}, 0", "i1", 0)
        hi = self.op(f"icmp slt i32 {v.text}, {size.text}", "i1", 0)
        return self._and(lo, hi)

    def _and(self, a, b):
        if a.text == "true":
            return b
        return self.op(f"and i1 {a.text}, {b.text}", "i1", 0)

    def _elements(self, off, ok, last, k):
        """Per-element (offset, valid) of a run that is not wholly inside the tensor."""
        idx, size = last
        out = []
        for i in range(k):
            oi = self.op(f"add i32 {off.text}, {i}", "i32", 0) if i else off
            ii = self.op(f"add i32 {idx.text}, {i}", "i32", 0) if i else idx
            out.append((oi, self._and(ok, self._in_range(ii, size))))
        return out

    # -- peers and flags: one rank's tensor picked at run time, cross-GPU synchronisation ------
    def base_pointer(self, gl) -> str:
        """The base pointer of a tensor: its parameter, or the one a peer view picked (a
        register like any other, so loops and branches carry it in phis)."""
        return self.read(gl).text if gl in self.views else f"%{gl.name}"

    def elem_ptr(self, gl, off: Value) -> Value:
        """Pointer to element `off` of a tensor."""
        return self.op(f"getelementptr {llty(gl.type.dtype)}, {GLOBAL_PTR} "
                       f"{self.base_pointer(gl)}, i32 {off.text}", GLOBAL_PTR, 0)

    def r_peer(self, op):
        """member[rank] by a chain of selects (uniform: scalar selects); a rank outside
        0..N-1 falls back to member 0."""
        *members, rank = op.srcs
        r = self.read(rank)
        ptr = Value(f"%{members[0].name}", GLOBAL_PTR, 0)
        for i, m in enumerate(members[1:], 1):
            hit = self.op(f"icmp eq i32 {r.text}, {i}", "i1", 0)
            ptr = self.op(f"select i1 {hit.text}, {GLOBAL_PTR} %{m.name}, {GLOBAL_PTR} "
                          f"{ptr.text}", GLOBAL_PTR, 0)
        self.write(op.dst, ptr)

    def _element_at(self, gl, idx) -> tuple[Value, Value]:
        """(offset, inside the tensor) of the element at uniform indices `idx`."""
        rank = gl.type.rank
        off, ok = Value("0", "i32", 0), Value("true", "i1", 0)
        for a, r in enumerate(idx):
            v = self.read(r)
            ok = self._and(ok, self._in_range(v, self.size_of(gl, a)))
            term = v if a == rank - 1 else \
                self.op(f"mul i32 {v.text}, %{gl.name}.stride{a}", "i32", 0)
            off = self.op(f"add i32 {off.text}, {term.text}", "i32", 0)
        return off, ok

    GPU_SCOPE = None                  # the target's LLVM syncscope for one GPU's agents

    def syncscope(self, scope: str) -> str:
        """The syncscope clause of an atomic at a flag's scope: none for "system" (LLVM's
        default), the target's device scope for "gpu"."""
        return "" if scope == "system" else f' syncscope("{self.GPU_SCOPE}")'

    def r_signal(self, op):
        """Lane 0 of the wave stores (or adds) the value with release ordering at the op's
        scope (system: LLVM's default syncscope): the backend's memory model adds the
        fences and cache writebacks each chip needs. An index outside the tensor writes
        nothing."""
        gl, *idx, value = op.srcs
        off, ok = self._element_at(gl, idx)
        v = self.read(value)
        self.wave_sync()
        first = self.op(f"icmp eq i32 {self.lane.text}, 0", "i1", 0)
        do, done = self.label("signal"), self.label("signal_done")
        self.ins(f"br i1 {self._and(first, ok).text}, label %{do}, label %{done}")
        self.start_block(do)
        p = self.elem_ptr(gl, off)
        scope = op.attrs.get("scope", "system")
        if op.attrs["add"]:
            self.release_add(p, v, scope)
        else:
            self.ins(f"store atomic {v}, {GLOBAL_PTR} {p.text}{self.syncscope(scope)} "
                     f"release, align 4")
        self.ins(f"br label %{done}")
        self.start_block(done)

    def r_timestamp(self, op):
        """Lane 0 of the wave reads the timer and where it runs (timestamp_words) and stores
        the four words in row `row` of the record; a row outside it stores nothing."""
        gl, row = op.srcs
        r = self.read(row)
        ok = self._in_range(r, self.size_of(gl, 0))
        first = self.op(f"icmp eq i32 {self.lane.text}, 0", "i1", 0)
        do, done = self.label("stamp"), self.label("stamp_done")
        self.ins(f"br i1 {self._and(first, ok).text}, label %{do}, label %{done}")
        self.start_block(do)
        base = self.op(f"mul i32 {r.text}, %{gl.name}.stride0", "i32", 0)
        for j, word in enumerate(self.timestamp_words()):
            off = self.op(f"add i32 {base.text}, {j}", "i32", 0)
            self.store_elem(gl, off, Value("true", "i1", 0), word, T.i32)
        self.ins(f"br label %{done}")
        self.start_block(done)

    def timestamp_words(self) -> list[Value]:
        """pk.timestamp's four i32 words: the timer's low and high halves, the compute unit,
        the chiplet."""
        raise NotImplementedError

    def split_timer(self, t: str) -> list[Value]:
        """An i64 timer reading as its (low, high) i32 words."""
        lo = self.op(f"trunc i64 {t} to i32", "i32", 0)
        shifted = self.op(f"lshr i64 {t}, 32", "i64", 0)
        return [lo, self.op(f"trunc i64 {shifted.text} to i32", "i32", 0)]

    def r_flag_wait(self, op):
        """Every lane loads the flag with acquire ordering at the op's scope until it is
        >= the value (signed; the dialect may branch on one lane's copy), pausing between
        tries; an index outside the tensor does not wait. The loop carries no registers."""
        gl, *idx, value = op.srcs
        off, ok = self._element_at(gl, idx)
        v = self.read(value)
        head, pause, done = (self.label(x) for x in ("flag_spin", "flag_pause", "flag_done"))
        self.ins(f"br i1 {ok.text}, label %{head}, label %{done}")
        self.start_block(head)
        p = self.elem_ptr(gl, off)
        scope = self.syncscope(op.attrs.get("scope", "system"))
        got = self.op(f"load atomic i32, {GLOBAL_PTR} {p.text}{scope} acquire, align 4",
                      "i32", 0)
        ready = self.op(f"icmp sge i32 {self.uniform(got).text}, {v.text}", "i1", 0)
        self.ins(f"br i1 {ready.text}, label %{done}, label %{pause}")
        self.start_block(pause)
        self.spin_pause()
        self.ins(f"br label %{head}")
        self.start_block(done)
        if op.attrs.get("tma", True):
            self.after_flag_wait()

    def release_add(self, p: Value, v: Value, scope: str = "system"):
        """*p += v atomically, with release ordering at `scope`."""
        self.ins(f"atomicrmw add {GLOBAL_PTR} {p.text}, {v}{self.syncscope(scope)} release, "
                 f"align 4")

    def wave_sync(self):
        """Order every lane's earlier accesses before lane 0's (none where a wave is one
        instruction stream)."""

    def spin_pause(self):
        """A short sleep between two polls of a flag."""

    def after_flag_wait(self):
        """What the wave needs after a flag wait besides the acquire before TMA copies may
        read the published data (Hopper: the async proxy)."""

    def r_sload(self, op):
        """One element of a tensor, the same in every lane (0 outside the tensor)."""
        gl, *idx = op.srcs
        off, ok = self._element_at(gl, idx)
        self.write(op.dst, self.uniform(self.load_elem(gl, off, ok, gl.type.dtype)))

    def uniform(self, v: Value) -> Value:
        """A value known to be the same in every lane, where the dialect can say so."""
        return v

    def r_gload(self, op):
        self.write(op.dst, self._gload_value(op, op.attrs["fill"]))

    def _all_runs_inside(self, runs) -> Value:
        """Whether every run of this lane's window lies inside the tensor (the fast path)."""
        full = runs[0][4]
        for r in runs[1:]:
            full = self._and(full, r[4])
        return full

    def _gload_value(self, op, fill_value) -> Value:
        """Fast path (every run of the lane inside the tensor): one aligned vector load per
        run. Otherwise element by element, elements outside reading the fill value. A
        window promised inside (pk.load's inside=True) is the fast path alone."""
        gl = op.srcs[0]
        d, n = gl.type.dtype, op.attrs["layout"].nslots
        runs = self._tensor_window(op, 0)
        if op.attrs.get("inside"):
            return self._load_runs(gl, runs, n, d)
        full = self._all_runs_inside(runs)
        fast_l, slow_l, join = self.branch(full, "ld_full", "ld_edge", "ld_join")
        self.start_block(fast_l)
        fast = self._load_runs(gl, runs, n, d)
        fast_end = self.block
        self.ins(f"br label %{join}")
        self.start_block(slow_l)
        fill = Value(literal(fill_value, d), llty(d), 0)
        elems = [None] * n
        for first, k, off, ok, run_full, last, align in runs:
            # Each run again: a vector when it is inside, else element by element; so the
            # edge path holds no more registers than the fast one.
            if k > 1:
                v_l, e_l, j_l = self.branch(run_full, "run_vec", "run_elem", "run_join")
                self.start_block(v_l)
                self.align = align
                vec = self.load_run(gl, off, k, d)
                v_end = self.block
                self.ins(f"br label %{j_l}")
                self.start_block(e_l)
            parts = []
            for i, (oi, vi) in enumerate(self._elements(off, ok, last, k)):
                x = self.load_elem(gl, oi, vi, d)
                if fill_value != 0.0:
                    x = self.op(f"select i1 {vi.text}, {x}, {fill}", x.ety, 0)
                parts.append(x)
            if k > 1:
                ev = self.build(parts)
                e_end = self.block
                self.ins(f"br label %{j_l}")
                self.start_block(j_l)
                merged = self.op(f"phi {vec.ty} [ {vec.text}, %{v_end} ], [ {ev.text}, %{e_end} ]",
                                 vec.ety, k)
                parts = [self.extract(merged, i) for i in range(k)]
            elems[first:first + k] = parts
        slow = self.build(elems)
        slow_end = self.block
        self.ins(f"br label %{join}")
        self.start_block(join)
        return self.op(f"phi {fast.ty} [ {fast.text}, %{fast_end} ], "
                       f"[ {slow.text}, %{slow_end} ]", fast.ety, n)

    def _load_runs(self, gl, runs, n, d) -> Value:
        """The window's n slots, one aligned vector load per run, no bounds checked."""
        elems = [None] * n
        for first, k, off, ok, _, last, align in runs:
            self.align = align
            v = self.load_run(gl, off, k, d)
            for i in range(k):
                elems[first + i] = self.extract(v, i) if k > 1 else v
        return self.build(elems)

    def _run_slots(self, val, first, k) -> Value:
        """Slots first..first+k-1 of `val`: the vector one run stores (a scalar when k == 1)."""
        return self.extract(val, first) if k == 1 else self.pick(val, range(first, first + k))

    def r_gstore(self, op):
        gl = op.srcs[0]
        d = gl.type.dtype
        n = op.attrs["layout"].nslots
        val = self._norm(op.srcs[-1], n)
        runs = self._tensor_window(op, 1)
        if op.attrs.get("inside"):                   # promised inside: no bounds checked
            for first, k, off, ok, _, last, align in runs:
                self.align = align
                self.store_run(gl, off, self._run_slots(val, first, k), d)
            return
        full = self._all_runs_inside(runs)
        fast_l, slow_l, join = self.branch(full, "st_full", "st_edge", "st_join")
        self.start_block(fast_l)
        for first, k, off, ok, _, last, align in runs:
            self.align = align
            self.store_run(gl, off, self._run_slots(val, first, k), d)
        self.ins(f"br label %{join}")
        self.start_block(slow_l)
        for first, k, off, ok, run_full, last, align in runs:
            if k > 1:
                v_l, e_l, j_l = self.branch(run_full, "run_vec", "run_elem", "run_join")
                self.start_block(v_l)
                self.align = align
                self.store_run(gl, off, self._run_slots(val, first, k), d)
                self.ins(f"br label %{j_l}")
                self.start_block(e_l)
            for i, (oi, vi) in enumerate(self._elements(off, ok, last, k)):
                self.store_elem(gl, oi, vi, self.extract(val, first + i), d)
            if k > 1:
                self.ins(f"br label %{j_l}")
                self.start_block(j_l)
        self.ins(f"br label %{join}")
        self.start_block(join)

    def r_gatomic_add(self, op):
        """Every element of the window added atomically where it lies inside the tensor: a
        run of the lane's elements wholly inside, by the dialect's vector adds where it has
        them (atomic_add_width), else element by element."""
        gl = op.srcs[0]
        val = self._norm(op.srcs[-1], op.attrs["layout"].nslots)
        for first, k, off, ok, run_full, last, align in self._tensor_window(op, 1):
            width = self.atomic_add_width(k, align)
            if width > 1:
                v_l, e_l, join = self.branch(run_full, "atom_vec", "atom_elem", "atom_join")
                self.start_block(v_l)
                for i in range(0, k, width):
                    oi = self.op(f"add i32 {off.text}, {i}", "i32", 0) if i else off
                    self.atomic_add_run(gl, oi, [self.extract(val, first + i + j)
                                                 for j in range(width)])
                self.ins(f"br label %{join}")
                self.start_block(e_l)
            for i, (oi, vi) in enumerate(self._elements(off, ok, last, k)):
                self.atomic_add_elem(gl, oi, vi, self.extract(val, first + i))
            if width > 1:
                self.ins(f"br label %{join}")
                self.start_block(join)

    def r_gdiscard(self, op):
        """A window of dead data: each lane drops the cache lines that start inside one of
        its runs of elements and lie wholly inside the window and the tensor
        (discard_line), after the wave's reads of it (a wave sync). A run no longer than a
        line holds at most one line start, found from the run's address, so a lane tests
        each run once. Targets without such a drop emit nothing."""
        line = self.discard_line_bytes()
        if not line:
            return
        esz = op.srcs[0].type.dtype.bytes
        per_line, shift = line // esz, esz.bit_length() - 1
        dims = op.attrs["dims"]
        origin = op.srcs[len(op.srcs) - len(dims):]
        window_end = self.op(f"add i32 {self.read(origin[-1]).text}, {op.attrs['width']}",
                             "i32", 0)
        self.wave_sync()
        for first, k, off, ok, _, last, _ in self._tensor_window(op, 0):
            idx, size = last
            for sub in range(0, k, per_line):        # pieces of at most one line each
                n = min(per_line, k - sub)
                o = self.op(f"add i32 {off.text}, {sub}", "i32", 0) if sub else off
                c = self.op(f"add i32 {idx.text}, {sub}", "i32", 0) if sub else idx
                addr = self.op(f"ptrtoint {GLOBAL_PTR} {self.elem_ptr(op.srcs[0], o).text} "
                               f"to i64", "i64", 0)
                neg = self.op(f"sub i64 0, {addr.text}", "i64", 0)
                ahead = self.op(f"and i64 {neg.text}, {line - 1}", "i64", 0)  # to a start
                here = self.op(f"icmp ult i64 {ahead.text}, {n * esz}", "i1", 0)
                ahead_elems = self.op(f"lshr i64 {ahead.text}, {shift}", "i64", 0)
                skip = self.op(f"trunc i64 {ahead_elems.text} to i32", "i32", 0)
                col = self.op(f"add i32 {c.text}, {skip.text}", "i32", 0)
                line_end = self.op(f"add i32 {col.text}, {per_line}", "i32", 0)
                inside = self._and(ok, here)
                inside = self._and(inside, self.op(f"icmp sge i32 {col.text}, 0", "i1", 0))
                inside = self._and(inside, self.op(
                    f"icmp sle i32 {line_end.text}, {size.text}", "i1", 0))
                inside = self._and(inside, self.op(
                    f"icmp sle i32 {line_end.text}, {window_end.text}", "i1", 0))
                do, nxt = self.label("discard"), self.label("discard_next")
                self.ins(f"br i1 {inside.text}, label %{do}, label %{nxt}")
                self.start_block(do)
                at = self.op(f"add i32 {o.text}, {skip.text}", "i32", 0)
                self.discard_line(self.elem_ptr(op.srcs[0], at))
                self.ins(f"br label %{nxt}")
                self.start_block(nxt)

    def discard_line_bytes(self) -> int:
        """Bytes of the cache line a discard drops (0: the target drops none)."""
        return 0

    def discard_line(self, ptr: Value) -> None:
        raise NotImplementedError

    def atomic_add_width(self, k: int, align: int) -> int:
        """Elements one vector atomic add takes from a run of k f32 starting `align` bytes
        aligned (1: element by element)."""
        return 1

    def atomic_add_run(self, gl, off: Value, vals):
        raise NotImplementedError

    def atomic_add_elem(self, gl, off: Value, mask: Value, val: Value):
        raise NotImplementedError

    def _lds_runs(self, op, at_origin=False):
        """Per-run LDS byte address and whether the run is one aligned vector access. A run
        stays contiguous through the swizzle when it fits in one 16-byte chunk. at_origin:
        the window starts at (0, 0) (whole-tile copies) instead of the op's first operands."""
        region, lay, scope = op.attrs["region"], op.attrs["layout"], op.attrs["scope"]
        t = region.tile
        esz = t.dtype.bytes
        r0, c0 = (None, None) if at_origin else (op.srcs[0], op.srcs[1])
        r0v = Value("0", "i32", 0) if at_origin else self.read(r0)
        c0v = Value("0", "i32", 0) if at_origin else self.read(c0)
        rb = self.op(f"add i32 {r0v.text}, {self.lane_base(lay, 0, scope).text}", "i32", 0)
        cb = self.op(f"add i32 {c0v.text}, {self.lane_base(lay, 1, scope).text}", "i32", 0)
        out = []
        for first, k in self.window_runs(lay, 1, esz):
            g = self._provable(c0, lay, 1, lay.slots[first][1])
            whole = k == 1 or (g and (g & -g) % k == 0) or g == 0
            if whole:
                out.append((first, k, self._lds_addr(region, rb, cb, lay.slots[first]), esz * k))
            else:
                for i in range(k):
                    sl = (lay.slots[first][0], lay.slots[first][1] + i)
                    out.append((first + i, 1, self._lds_addr(region, rb, cb, sl), esz))
        return out

    def _lds_addr(self, region, rb, cb, slot) -> Value:
        """Byte address of element (rb + slot row, cb + slot col): LDSRegion.byte_offset's
        rule (row-major, XOR swizzle, 128-byte column blocks) on registers."""
        t = region.tile
        esz = t.dtype.bytes
        row = self.op(f"add i32 {rb.text}, {slot[0]}", "i32", 0)
        col = self.op(f"add i32 {cb.text}, {slot[1]}", "i32", 0)
        byte = self.op(f"mul i32 {col.text}, {esz}", "i32", 0)
        row_bytes = t.shape[1] * esz
        if t.atoms > 1:
            atom = self.op(f"lshr i32 {byte.text}, 7", "i32", 0)
            byte = self.op(f"and i32 {byte.text}, 127", "i32", 0)
            row_bytes = 128
        b = self.swizzled_byte(t, row, byte)
        rowb = self.op(f"mul i32 {row.text}, {row_bytes}", "i32", 0)
        a = self.op(f"add i32 {rowb.text}, {b.text}", "i32", 0)
        if t.atoms > 1:
            block = self.op(f"mul i32 {atom.text}, {t.shape[0] * 128}", "i32", 0)
            a = self.op(f"add i32 {a.text}, {block.text}", "i32", 0)
        return self.op(f"add i32 {a.text}, {self.region_base(region).text}", "i32", 0)

    def region_base(self, region) -> Value:
        """Byte offset of a region in LDS / shared memory: static, or base + stage * stride
        for a stage picked at run time."""
        if region.stage is None:
            return Value(str(region.base), "i32", 0)
        k = self.op(f"mul i32 {self.read(region.stage).text}, {region.stride}", "i32", 0)
        return self.op(f"add i32 {k.text}, {region.base}", "i32", 0)

    def swizzled_byte(self, t, row: Value, byte: Value) -> Value:
        """Byte offset within a row of shared tile type `t` after its XOR swizzle: the
        16-byte chunk index XOR (row % swizzle); an involution, so it also maps a position
        back to its element (LDSRegion.byte_offset is the same rule for the emulator)."""
        if not t.swizzle:
            return byte
        ch = self.op(f"lshr i32 {byte.text}, 4", "i32", 0)
        rs = self.op(f"and i32 {row.text}, {t.swizzle - 1}", "i32", 0)
        ch = self.op(f"xor i32 {ch.text}, {rs.text}", "i32", 0)
        lo = self.op(f"and i32 {byte.text}, 15", "i32", 0)
        hi = self.op(f"shl i32 {ch.text}, 4", "i32", 0)
        return self.op(f"or i32 {hi.text}, {lo.text}", "i32", 0)

    def lds_ptr(self, offset) -> Value:
        """Pointer to byte `offset` (an i32 Value or an int) of the LDS / shared memory."""
        off = offset if isinstance(offset, Value) else f"i32 {offset}"
        return self.op(f"getelementptr i8, ptr addrspace(3) {self.lds_symbol()}, {off}",
                       "ptr addrspace(3)", 0)

    def cluster_lds_ptr(self, p: Value, rank: Value) -> Value:
        """Pointer to the bytes at shared-memory pointer p in the cluster's workgroup
        `rank` (Hopper's distributed shared memory)."""
        raise NotImplementedError(f"{self.t.name} has no workgroup clusters")

    def lane_id(self):
        return self.lane

    def flat_thread_id(self):
        return self.tid

    def r_lds_load(self, op):
        d = op.dst.type.dtype
        n = self.shape_of(op.dst)
        elems = [None] * n
        rank = self.read(op.srcs[2]) if len(op.srcs) > 2 else None
        for first, k, addr, align in self._lds_runs(op):
            p, space = self.lds_ptr(addr), 3
            if rank is not None:             # the same bytes in workgroup `rank`'s memory
                p, space = self.cluster_lds_ptr(p, rank), 7
            ty = llty(d) if k == 1 else f"<{k} x {llty(d)}>"
            v = self.op(f"load {ty}, ptr addrspace({space}) {p.text}, align {align}",
                        llty(d), k if k > 1 else 0)
            for i in range(k):
                elems[first + i] = self.extract(v, i) if k > 1 else v
        self.write(op.dst, self.build(elems))

    def r_lds_store(self, op):
        n = op.attrs["layout"].nslots
        self._lds_write(op, self._norm(op.srcs[-1], n), at_origin=False)

    def r_gload_lds(self, op):
        """Memory -> LDS through registers (targets without an LDS DMA path)."""
        self._lds_write(op, self._gload_value(op, 0.0), at_origin=True)

    def _lds_write(self, op, val, at_origin):
        for first, k, addr, align in self._lds_runs(op, at_origin):
            p = self.lds_ptr(addr)
            self.ins(f"store {self._run_slots(val, first, k)}, ptr addrspace(3) {p.text}, "
                     f"align {align}")

    def _norm(self, reg, n) -> Value:
        v = self.read(reg)
        return self.splat(v, n) if v.n != n else v

    # -- dialect hooks ----------------------------------------------------------------------
    def module_header(self) -> str: raise NotImplementedError
    def module_footer(self) -> str: return ""
    def function_header(self, args: str) -> str: raise NotImplementedError
    def arg_type(self, a) -> str: raise NotImplementedError
    def prologue(self): pass
    def special(self, name, axis) -> Value: raise NotImplementedError
    def lane_xor(self, v: Value, mask: int) -> Value: raise NotImplementedError
    def lds_symbol(self) -> str: raise NotImplementedError
    def load_run(self, gl, off: Value, k: int, d) -> Value: raise NotImplementedError
    def load_elem(self, gl, off: Value, mask: Value, d) -> Value: raise NotImplementedError
    def store_run(self, gl, off: Value, vec: Value, d): raise NotImplementedError
    def store_elem(self, gl, off: Value, mask: Value, val: Value, d): raise NotImplementedError
    def r_barrier(self, op): raise NotImplementedError
    def r_setprio(self, op): raise NotImplementedError
