"""Tracing: kernel signatures, tile types, scalars, control flow, the tile IR it produces."""

import math

import numpy as np
import pytest

import pykittens as pk
from pykittens.ir import types as T
from pykittens.ir.nodes import walk
from pykittens.ir.printer import format_kernel
from pykittens import targets as pk_targets

from conftest import assert_names_line

HERE = __file__


def kinds(kir):
    return [op.kind for op in walk(kir.body)]


# ---- signatures ---------------------------------------------------------------------------
def test_target_constant():
    """pk.target: a constant set from the target being compiled for."""
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], N: pk.const = 2, TARGET: pk.target = None):
        pass

    assert k.target_const == "TARGET"
    assert k.specialize_for("gfx942").consts == {"N": 2, "TARGET": "gfx942"}
    assert k.specialize_for(pk_targets.get("sm_90a"), N=3).target == "sm_90a"
    assert k.specialize(TARGET="gfx950").target == "gfx950"
    with pytest.raises(pk.KernelError, match="TARGET='sm_90a' disagrees"):
        k.specialize_for("gfx950", TARGET="sm_90a")
    with pytest.raises(ValueError, match="unknown target 'gfx1100'"):
        k.specialize_for("gfx1100")
    with pytest.raises(pk.KernelError, match="no default"):
        k.specialize()

    with pytest.raises(pk.KernelError, match="pk.target takes no default other than None"):
        @pk.kernel
        def fixed(x: pk.gl[pk.f32, 2], TARGET: pk.target = "gfx950"):
            pass

    with pytest.raises(pk.KernelError, match="a kernel has one target"):
        @pk.kernel
        def two(x: pk.gl[pk.f32, 2], T1: pk.target = None, T2: pk.target = None):
            pass



def test_signature_params_and_consts():
    @pk.kernel(num_waves=2)
    def k(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.f32, (None, 64)], a: pk.f32, n: pk.i32,
          B: pk.const = 16, C: pk.const = None):
        pass

    assert [(p.name, p.kind) for p in k.params] == [("x", "gl"), ("y", "gl"),
                                                     ("a", "scalar"), ("n", "scalar")]
    assert k.params[0].type == T.GlobalType(T.bf16, (None, None))
    assert k.params[1].type.shape == (None, 64)
    assert k.params[2].type == T.ScalarType(T.f32)
    assert k.const_names == ["B", "C"]
    kir = k.specialize(C=3)
    assert kir.consts == {"B": 16, "C": 3} and kir.num_waves == 2
    assert k.specialize(C=3) is kir                      # traced once per constant set
    assert k.specialize(C=3, num_waves=4).num_waves == 4


def test_missing_annotation_names_the_parameter():
    with pytest.raises(pk.KernelError, match="parameter 'y' needs an annotation") as e:
        @pk.kernel
        def k(x: pk.gl[pk.f32, 2], y):
            pass
    assert HERE in str(e.value)


def test_unknown_and_missing_consts():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], B: pk.const = 4, C: pk.const = None):
        pass

    with pytest.raises(pk.KernelError, match=r"unknown compile-time constant\(s\) \['D'\]"):
        k.specialize(C=1, D=2)
    with pytest.raises(pk.KernelError, match=r"constant\(s\) \['C'\] have no default"):
        k.specialize()


def test_consts_must_be_hashable():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], SHAPE: pk.const = (4, 64)):
        pk.zeros(pk.rt(SHAPE, pk.f32))

    assert k.specialize(SHAPE=(8, 64)) is k.specialize(SHAPE=(8, 64))
    with pytest.raises(pk.KernelError, match=r"constant\(s\) \['SHAPE'\] must be hashable"):
        k.specialize(SHAPE=[8, 64])


def test_dtype_from_const():
    @pk.kernel
    def k(x: pk.gl["DT", 2], DT: pk.const = None):
        pass

    assert k.specialize(DT=pk.bf16).params[0].type.dtype == T.bf16
    assert k.specialize(DT="e4m3").params[0].type.dtype == T.e4m3
    with pytest.raises(pk.KernelError, match="takes its dtype from 'DX'"):
        @pk.kernel
        def bad(x: pk.gl["DX", 2], DT: pk.const = None):
            pass


def test_gl_annotation_errors():
    with pytest.raises(TypeError, match="rank must be 1..4"):
        pk.gl[pk.f32, 5]
    with pytest.raises(TypeError, match=r"pk.gl\[dtype, rank\]"):
        pk.gl[pk.f32]
    with pytest.raises(TypeError, match="unsupported element type"):
        pk.gl[np.float64, 2]


def test_kernel_is_not_called_directly():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        pass

    with pytest.raises(pk.KernelError, match="pk.emulate"):
        k(np.ones((2, 2), np.float32))


def test_ops_outside_a_kernel():
    with pytest.raises(pk.KernelError, match="only be called while a @pk.kernel"):
        pk.wave_id()


# ---- tile types ---------------------------------------------------------------------------

def test_tile_types():
    t = pk.rt((16, 64), pk.bf16, "col", role="a", pin="a8")
    assert (t.dtype, t.shape, t.layout, t.role, t.pin) == (T.bf16, (16, 64), "col", "a", ("a", 8))
    assert str(t).startswith("rt<bf16>[16x64,col,a") and str(t).endswith("] @a8")
    v = pk.rv(t, "col", dtype=pk.f32)
    assert (v.length, v.axis, v.dtype, v.of) == (64, "col", T.f32, t)
    s = pk.st((64, 32), "f16", swizzle=4)
    assert (s.nbytes, str(s)) == (64 * 32 * 2, "st<f16>[64x32,swz4]")


@pytest.mark.parametrize("make, msg", [
    (lambda: pk.rt((3, 64), pk.f32), "two powers of two"),
    (lambda: pk.rt((4, 64, 2), pk.f32), "two powers of two"),
    (lambda: pk.rt((0, 64), pk.f32), "two powers of two"),
    (lambda: pk.rt((4, 64), pk.f32, "diag"), "layout must be 'row' or 'col'"),
    (lambda: pk.rt((4, 64), pk.f32, role="c"), "role must be one of"),
    (lambda: pk.rt((4, 64), pk.f32, pin="x3"), "pin='x3'"),
    (lambda: pk.rt((4, 64), pk.f32, pin="a"), "pin='a'"),
    (lambda: pk.rt((4, 64), pk.f32, pin=3), "write the first register"),
    (lambda: pk.rv(pk.st((4, 64), pk.f32)), "needs a register tile"),
    (lambda: pk.rv(pk.rt((4, 64), pk.f32), "diag"), "axis must be 'row' or 'col'"),
    (lambda: pk.st((44, 64), pk.f32), "rows a power of two or a multiple of 8"),
    (lambda: pk.st((48, 48), pk.f32), "cols a power of two"),
    (lambda: pk.rt((48, 64), pk.f32), "two powers of two"),
    (lambda: pk.rt((16, 40), pk.bf16, role="a"), "with a role: multiples of 16"),
    (lambda: pk.st((64, 64), pk.f32, swizzle=3), "swizzle=3 must be a power of two"),
])
def test_tile_type_errors(make, msg):
    with pytest.raises(pk.KernelError, match=msg):
        make()


def test_tile_type_error_inside_kernel_names_line():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        pk.zeros(pk.rt((4, 48), pk.f32))  # MARK-bad-shape

    with pytest.raises(pk.KernelError, match="ragged problem sizes are handled by bounds") as e:
        k.specialize()
    assert_names_line(e.value, HERE, "# MARK-bad-shape")
    assert "[kernel k]" in str(e.value)


def test_unsupported_dtype_name():
    with pytest.raises(TypeError, match="pykittens supports f32, bf16"):
        pk.rt((4, 64), "f64")


# ---- scalars ------------------------------------------------------------------------------

def test_scalar_arithmetic_and_comparisons_trace():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], a: pk.f32, n: pk.i32):
        m = x.shape[0]
        i = (pk.program_id(0) * 4 + 1 - n) // 2 % 3
        f = a * 2.0 / n - 1.5
        r = -i
        c = (i < m) & (f >= 0.0) | (n != 3)
        pk.where(c, i, r)
        pk.minimum(i, 7)
        pk.maximum(i, 7)
        2 - i, 3 * i, 1.0 / a, i > 2, i <= 2, i == m  # noqa: B018

    kir = k.specialize()
    sb = [op for op in walk(kir.body) if op.kind == "sbin"]
    ops = {op.attrs["op"] for op in sb}
    assert {"add", "sub", "mul", "div", "floordiv", "mod", "lt", "ge", "ne", "and", "or",
            "min", "max", "gt", "le", "eq"} <= ops
    by_op = {op.attrs["op"]: op.dst.type.dtype for op in sb}
    assert by_op["lt"] == T.boolean and by_op["and"] == T.boolean and by_op["or"] == T.boolean
    assert by_op["floordiv"] == T.i32 and by_op["div"] == T.f32
    assert "dim" in kinds(kir) and "sselect" in kinds(kir) and "scast" in kinds(kir)


def test_combined_conditions_are_conditions():
    @pk.kernel(num_waves=2)
    def k(x: pk.gl[pk.f32, 2]):
        with pk.if_((pk.wave_id() == 0) & (pk.program_id(0) > 1)):
            pk.barrier()

    assert "if" in kinds(k.specialize())


def test_bool_of_traced_scalar_names_if_():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        if pk.program_id(0) == 0:  # MARK-bool
            pass

    with pytest.raises(pk.KernelError, match=r"no Python truth value.*pk\.if_") as e:
        k.specialize()
    assert_names_line(e.value, HERE, "# MARK-bool")


def test_traced_scalar_is_not_a_python_int():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        for _ in range(x.shape[1]):  # MARK-index
            pass

    with pytest.raises(pk.KernelError, match="use pk.range, or pass a pk.const") as e:
        k.specialize()
    assert_names_line(e.value, HERE, "# MARK-index")


def test_static_dims_are_python_ints():
    seen = {}

    @pk.kernel
    def k(x: pk.gl[pk.f32, (None, 64)]):
        seen["shape"] = x.shape

    k.specialize()
    rows, cols = seen["shape"]
    assert cols == 64 and rows.dtype == T.i32


def test_dims_named_by_consts():
    """A dim named by a const is static, its size the const's value, inferred from the
    tensor at launch when the const has none."""
    seen = {}

    @pk.kernel
    def k(x: pk.gl[pk.f32, (None, "N")], out: pk.gl[pk.f32, (None, "N")], N: pk.const = None):
        seen["n"] = x.shape[1]
        pk.store(out, pk.load(pk.rt((8, N), pk.f32), x))

    assert k.specialize(N=64).params[0].type.shape == (None, 64) and seen["n"] == 64
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    assert np.array_equal(pk.emulate(k, x, np.zeros_like(x), grid=1)["out"], x)
    with pytest.raises(pk.KernelError, match="'out' of k has size 32 in dim 1 but the kernel "
                                             "is compiled for 16"):
        pk.emulate(k, x, np.zeros((8, 32), np.float32), grid=1)
    with pytest.raises(pk.KernelError, match="const N=0.5 gives a dim of 'x': it must be a "
                                             "positive int"):
        k.specialize(N=0.5)
    with pytest.raises(pk.KernelError, match="takes a dim from 'K', which is not a pk.const"):
        @pk.kernel
        def bad(x: pk.gl[pk.f32, (None, "K")], N: pk.const = None):
            pass


def test_where_minimum_maximum_on_numpy():
    a = np.array([1, 5, 3])
    assert list(pk.where(a > 2, a, 0)) == [0, 5, 3]
    assert list(pk.minimum(a, 3)) == [1, 3, 3] and list(pk.maximum(a, 3)) == [3, 5, 3]
    assert pk.log2_e() == pytest.approx(math.log2(math.e))


# ---- control flow -------------------------------------------------------------------------

def _accumulating(n_trips):
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], N: pk.const = n_trips,
          STATIC: pk.const = False):
        t = pk.rt((4, 64), pk.f32)
        acc = pk.zeros(t)
        loop = pk.static_range(N) if STATIC else pk.range(N)
        for j in loop:
            acc += pk.load(t, x, (0, j * 64))
        pk.store(out, acc)
    return k


def test_range_is_a_real_loop():
    k = _accumulating(2)
    small, big = k.specialize(N=2), k.specialize(N=64)
    assert len(kinds(small)) == len(kinds(big))
    fors = [op for op in walk(big.body) if op.kind == "for"]
    assert len(fors) == 1 and fors[0].attrs["step"] == 1
    body = [op.kind for op in fors[0].regions[0].ops]
    assert "load" in body and "binary" in body
    # the += writes the tile allocated before the loop: it is loop-carried
    acc = next(op.dst for op in walk(big.body) if op.kind == "fill")
    add = next(op for op in fors[0].regions[0].ops if op.kind == "binary")
    assert add.dst is acc and add.srcs[0] is acc


def test_static_range_unrolls():
    k = _accumulating(2)
    n2 = kinds(k.specialize(N=2, STATIC=True))
    n6 = kinds(k.specialize(N=6, STATIC=True))
    assert "for" not in n6
    assert n6.count("load") == 6 and n2.count("load") == 2 and len(n6) > len(n2)


def test_range_bounds_and_step():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        for i in pk.range(2, x.shape[1], 3):
            pass
        for i in pk.range(5):
            pass

    fors = [op for op in walk(k.specialize().body) if op.kind == "for"]
    assert [f.attrs["step"] for f in fors] == [3, 1]
    assert fors[1].srcs[0] is not fors[1].srcs[1]


@pytest.mark.parametrize("body, msg", [
    ("step0", "step must be a non-zero Python int"),
    ("stepscalar", "step must be a non-zero Python int"),
    ("static", "pk.static_range needs Python ints"),
])
def test_loop_errors(body, msg):
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], B: pk.const = body):
        n = x.shape[0]
        if B == "step0":
            for _ in pk.range(0, 8, 0):
                pass
        elif B == "stepscalar":
            for _ in pk.range(0, 8, n):
                pass
        else:
            for _ in pk.static_range(n):
                pass

    with pytest.raises(pk.KernelError, match=msg):
        k.specialize()


def test_if_else_regions():
    @pk.kernel(num_waves=2)
    def k(x: pk.gl[pk.f32, 2]):
        with pk.if_(pk.wave_id() == 0):  # MARK-if
            pk.setprio(2)
        with pk.else_():
            pk.barrier()
            pk.setprio(0)

    kir = k.specialize()
    ifs = [op for op in kir.body.ops if op.kind == "if"]
    assert len(ifs) == 1 and len(ifs[0].regions) == 2
    assert [o.kind for o in ifs[0].regions[0].ops] == ["setprio"]
    assert [o.kind for o in ifs[0].regions[1].ops] == ["barrier", "setprio"]
    # the `if` op carries the user's line, not contextlib's
    assert ifs[0].loc.file == HERE and ifs[0].loc.line == \
        __import__("conftest").line_of(HERE, "# MARK-if")


@pytest.mark.parametrize("case, msg", [
    ("else_alone", "must directly follow"),
    ("else_twice", "must directly follow"),
    ("if_python", "needs a comparison of traced scalars"),
    ("if_int", "needs a comparison of traced scalars"),
])
def test_if_errors(case, msg):
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], C: pk.const = case):
        if C == "else_alone":
            with pk.else_():
                pass
        elif C == "else_twice":
            with pk.if_(pk.program_id(0) == 0):
                pass
            with pk.else_():
                pass
            with pk.else_():
                pass
        elif C == "if_python":
            with pk.if_(True):  # MARK-if-python
                pass
        else:
            with pk.if_(pk.program_id(0)):
                pass

    with pytest.raises(pk.KernelError, match=msg) as e:
        k.specialize()
    if case == "if_python":
        assert_names_line(e.value, HERE, "# MARK-if-python")


def test_setprio_range():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        pk.setprio(4)

    with pytest.raises(pk.KernelError, match=r"setprio level must be an int in 0..3"):
        k.specialize()


# ---- ops and the printed tile IR ------------------------------------------------------------

def test_tile_ir_printer_shows_the_ops():
    @pk.kernel(num_waves=4)
    def k(x: pk.gl[pk.bf16, 2], out: pk.gl[pk.bf16, 2], alpha: pk.f32, ROWS: pk.const = 4):
        s = pk.empty(pk.st((16, 64), pk.bf16, swizzle=2))
        pk.load(s, x, (0, 0))
        pk.barrier()
        t = pk.load(pk.rt((ROWS, 64), pk.f32), s, (pk.wave_id() * ROWS, 0))
        row = pk.row_max(t)
        e = pk.exp2((t - row) * alpha)
        for j in pk.range(3):
            pk.row_sum(e, into=row)
        pk.store(out, pk.mask_outside(e, (0, 0), x.shape), (pk.wave_id() * ROWS, 0))

    text = format_kernel(k.specialize())
    assert text.startswith("kernel k(x: gl<bf16>[?,?], out: gl<bf16>[?,?], alpha: f32) "
                           "num_waves=4 [ROWS=4] {")
    for frag in ("alloc()", "st<bf16>[16x64,swz2]", "load(%x", "barrier()", "special()",
                 "{name=wave_id", "reduce(", "op=max, axis=row, accumulate=False",
                 "accumulate=True", "unary(", "{op=exp2}", "binary(", "bcast=row",
                 "bcast=scalar", "for(", "{step=1}", "mask(", "store(", "rt<f32>[4x64,row]",
                 "rv<f32>[4,row of rt<f32>[4x64,row]]", "# line "):
        assert frag in text, frag


def test_ops_carry_user_lines():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        t = pk.load(pk.rt((4, 64), pk.f32), x)  # MARK-load
        pk.store(out, pk.exp2(t))  # MARK-store

    kir = k.specialize()
    from conftest import line_of
    by_kind = {op.kind: op.loc for op in walk(kir.body)}
    assert by_kind["load"].file == HERE
    assert by_kind["load"].line == line_of(HERE, "# MARK-load")
    assert by_kind["unary"].line == by_kind["store"].line == line_of(HERE, "# MARK-store")


def test_in_place_forms_write_their_destination():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        t = pk.rt((4, 64), pk.f32)
        a = pk.load(t, x)
        b = pk.zeros(t)
        b.set(a)
        pk.exp2(a, out=b)
        pk.add(a, 1.0, out=b)
        pk.mask_outside(a, (0, 0), (3, 3), out=b)
        v = pk.zeros(pk.rv(t, "col"))
        pk.col_sum(a, into=v)
        pk.col_max(a, into=v)
        pk.load(b, x, (0, 0))
        b -= a
        b *= 2.0
        b /= a

    ops = [op for op in walk(k.specialize().body) if op.kind != "const"]
    b = ops[3].dst
    writes_b = [op.kind for op in ops if op.dst is b]
    assert writes_b == ["alloc", "fill", "copy", "unary", "binary", "mask", "load", "binary",
                        "binary", "binary"]
    red = [op for op in ops if op.kind == "reduce"]
    assert all(op.attrs["accumulate"] and op.attrs["axis"] == "col" for op in red)
    assert red[0].dst is red[1].dst


@pytest.mark.parametrize("case, msg", [
    ("vec_other_tile", "row vector of length 8 cannot broadcast over the rows of tile"),
    ("dtype_mix", "cast one with pk.cast"),
    ("layout_mix", "change one's layout with pk.convert"),
    ("shared_operand", "load them into registers"),
    ("unary_int", "exp2 needs a float tile"),
    ("gl_to_st_convert", "cannot convert bf16 to f32"),
    ("st_to_gl_convert", "shared->global store cannot convert"),
    ("st_to_st", "shared tiles load into register tiles"),
    ("rank", "a 2-D tile needs a global tensor of rank >= 2"),
    ("coords", "load needs 2 coordinates"),
    ("subtile", "does not fit in shared tile"),
    ("subtile_at", "falls outside the shared tile"),
    ("st_in_loop", "shared tiles must be allocated at the top of the kernel"),
    ("into_axis", "into= must be a row vector"),
    ("reduce_vec", "reductions take a 2-D register tile"),
    ("empty_bad", "pk.empty needs a tile type"),
    ("mma_shapes", r"do not form \(M x K\) @ \(K x N\)"),
    ("mma_dtype", "mma accumulates in f32"),
    ("mma_ab", "a is bf16 but b is f16"),
    ("store_scalar", "store source must be a tile"),
    ("bool_const", "expected a scalar or a number, got bool"),
])
def test_op_argument_errors(case, msg):
    @pk.kernel
    def k(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.f32, 1], C: pk.const = case):
        t = pk.rt((4, 64), pk.f32)
        a = pk.zeros(t)
        if C == "vec_other_tile":
            a - pk.zeros(pk.rv(pk.rt((8, 64), pk.f32), "row"))
        elif C == "dtype_mix":
            a + pk.zeros(pk.rt((4, 64), pk.bf16))
        elif C == "layout_mix":
            a + pk.zeros(pk.rt((4, 64), pk.f32, "col"))
        elif C == "shared_operand":
            a + pk.empty(pk.st((4, 64), pk.f32))
        elif C == "unary_int":
            pk.exp2(pk.zeros(pk.rt((4, 64), pk.i32)))
        elif C == "gl_to_st_convert":
            pk.load(pk.st((4, 64), pk.f32), x)
        elif C == "st_to_gl_convert":
            pk.store(x, pk.empty(pk.st((4, 64), pk.f32)))
        elif C == "st_to_st":
            pk.load(pk.st((4, 64), pk.f32), pk.empty(pk.st((4, 64), pk.f32)))
        elif C == "rank":
            pk.load(t, y, (0,))
        elif C == "coords":
            pk.load(t, x, (0,))
        elif C == "subtile":
            pk.load(pk.rt((8, 64), pk.f32), pk.empty(pk.st((4, 64), pk.f32)))
        elif C == "subtile_at":
            pk.load(t, pk.empty(pk.st((8, 64), pk.f32)), (6, 0))
        elif C == "st_in_loop":
            for _ in pk.range(2):
                pk.empty(pk.st((4, 64), pk.f32))
        elif C == "into_axis":
            pk.row_sum(a, into=pk.zeros(pk.rv(t, "col")))
        elif C == "reduce_vec":
            pk.row_sum(pk.zeros(pk.rv(t, "col")))
        elif C == "empty_bad":
            pk.empty((4, 64))
        elif C == "mma_shapes":
            pk.mma_AB(pk.zeros(pk.rt((32, 32), pk.f32)), pk.zeros(pk.rt((32, 16), pk.bf16)),
                      pk.zeros(pk.rt((32, 32), pk.bf16)))
        elif C == "mma_dtype":
            pk.mma_ABt(pk.zeros(pk.rt((32, 32), pk.bf16)), pk.zeros(pk.rt((32, 16), pk.bf16)),
                       pk.zeros(pk.rt((32, 16), pk.bf16)))
        elif C == "mma_ab":
            pk.mma_AtB(pk.zeros(pk.rt((32, 32), pk.f32)), pk.zeros(pk.rt((16, 32), pk.bf16)),
                       pk.zeros(pk.rt((16, 32), pk.f16)))
        elif C == "store_scalar":
            pk.store(x, 1.0)
        elif C == "bool_const":
            pk.full(t, True)

    with pytest.raises(pk.KernelError, match=msg) as e:
        k.specialize()
    assert HERE in str(e.value)


def test_mma_traces():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        d = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
        a = pk.zeros(pk.rt((32, 16), pk.bf16, role="a"))              # M x K
        b = pk.zeros(pk.rt((16, 32), pk.bf16, "col", role="b"))       # K x N
        bt = pk.zeros(pk.rt((32, 16), pk.bf16, role="b"))             # N x K
        at = pk.zeros(pk.rt((16, 32), pk.bf16, "col", role="a"))      # K x M
        pk.mma_AB(d, a, b)
        pk.mma_ABt(d, a, bt)
        pk.mma_AtB(d, at, b, d)

    mm = [op for op in walk(k.specialize().body) if op.kind == "mma"]
    assert [op.attrs["trans"] for op in mm] == ["NN", "NT", "TN"]
    assert all(op.dst is op.srcs[2] for op in mm)


def test_mma_needs_role_tiles():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2]):
        d = pk.zeros(pk.rt((32, 32), pk.f32))
        a = pk.zeros(pk.rt((32, 16), pk.bf16, role="a"))
        b = pk.zeros(pk.rt((16, 32), pk.bf16, "col", role="b"))
        pk.mma_AB(d, a, b)

    with pytest.raises(pk.KernelError, match="d must be an accumulator tile"):
        k.specialize()


@pytest.mark.parametrize("target", ["gfx950", "sm_90a"])
def test_comparisons_broadcast_a_vector_on_either_side(target):
    """`tile < vector` (Python asks the vector first, its class deriving from the tile's)
    and `vector > tile` both compare the tile with the vector broadcast along its axis."""
    @pk.kernel
    def compare(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        t = pk.load(pk.rt((16, 64), pk.f32), x)
        v = pk.row_max(t) * 0.5
        pk.store(out, pk.where(t < v, t, 0.0), (0, 0))
        pk.store(out, pk.where(v > t, 0.0, t), (16, 0))

    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    got = pk.emulate(compare, x, np.zeros((32, 64), np.float32), grid=1, target=target)["out"]
    half = x.max(1, keepdims=True) * 0.5
    assert np.array_equal(got[:16], np.where(x < half, x, 0.0))
    assert np.array_equal(got[16:], np.where(half > x, 0.0, x))


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_vectors_load_from_shared_tiles(target):
    """pk.load(pk.rv(...), shared, (r, c)): a column vector reads one row of the shared tile,
    a row vector one column, each broadcast over its tile's other axis when added to it."""
    @pk.kernel(num_waves=4)
    def k(x: pk.gl[pk.f32, 2], cols: pk.gl[pk.f32, 2], rows: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((64, 64), pk.f32))
        pk.load(s, x, (0, 0))
        pk.barrier()
        t = pk.rt((16, 32), pk.f32, role="acc")
        w = pk.wave_id()
        c = pk.load(pk.rv(t, "col"), s, (w + 1, 32))           # row w+1, columns 32..63
        r = pk.load(pk.rv(t, "row"), s, (16 * w, 5))           # column 5, rows 16w..16w+15
        pk.store(cols, pk.zeros(t) + c, (16 * w, 0))
        pk.store(rows, pk.zeros(t) + r, (16 * w, 0))

    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = pk.emulate(k, x, np.zeros((64, 32), np.float32), np.zeros((64, 32), np.float32),
                     grid=1, target=target)
    for w in range(4):
        band = slice(16 * w, 16 * w + 16)
        assert (out["cols"][band] == x[w + 1, 32:][None, :]).all()
        assert (out["rows"][band] == x[band, 5][:, None]).all()


def test_vector_window_must_fit_in_the_shared_tile():
    @pk.kernel(num_waves=4)
    def k(x: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((4, 32), pk.f32))
        pk.load(pk.rv(pk.rt((16, 64), pk.f32, role="acc"), "col"), s, (0, 0))

    with pytest.raises(pk.KernelError, match=r"register tile \(1, 64\) does not fit"):
        k.specialize_for("sm_90a")
