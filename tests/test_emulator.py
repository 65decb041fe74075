"""Emulator semantics against numpy, for every target, at shapes that are not multiples of
the tile (ragged edges)."""
import math

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.ir import types as T

from conftest import FP8, TARGETS, cdiv, poison, rel_err

M, N = 37, 150            # ragged against 4x64 (and 8x64, 8x32) tiles
WAVES = 2


def grid_2d(m, n, rows=4, cols=64, waves=WAVES):
    return (cdiv(m, rows * waves), cdiv(n, cols))


def f64(x):
    return np.asarray(x).astype(np.float64)


# ---- elementwise ----------------------------------------------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "max": (pk.max, np.maximum),
    "min": (pk.min, np.minimum),
}
FUNCS = {"add": pk.add, "sub": pk.sub, "mul": pk.mul, "div": pk.div, "max": pk.max,
         "min": pk.min}


@pk.kernel(num_waves=WAVES)
def binary_k(x: pk.gl[pk.f32, 2], y: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], s: pk.f32,
             OP: pk.const = None, FORM: pk.const = "tile", LAY: pk.const = "row"):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    t = pk.rt((4, 64), pk.f32, LAY)
    a = pk.load(t, x, (r0, c0))
    if FORM == "tile":
        r = BINARY[OP][0](a, pk.load(t, y, (r0, c0)))
    elif FORM == "scalar":
        r = FUNCS[OP](a, s)
    elif FORM == "rscalar":                  # scalar on the left: reversed operands
        r = BINARY[OP][0](s, a) if OP in ("add", "sub", "mul", "div") else FUNCS[OP](a, 0.25)
    else:                                    # in place, functional form with out=
        r = FUNCS[OP](a, pk.load(t, y, (r0, c0)), out=a)
    pk.store(out, r, (r0, c0))


@pytest.mark.parametrize("form", ["tile", "scalar", "rscalar", "inplace"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary(target, rng, op, form):
    x = rng.standard_normal((M, N)).astype(np.float32)
    y = (rng.uniform(0.5, 2.0, (M, N)) * rng.choice([-1, 1], (M, N))).astype(np.float32)
    s = -1.75
    got = pk.emulate(binary_k, x, y, poison((M, N)), s, grid=grid_2d(M, N), target=target,
                     OP=op, FORM=form, LAY="col" if form == "inplace" else "row")["out"]
    f = BINARY[op][1]
    ref = {"tile": lambda: f(f64(x), f64(y)), "inplace": lambda: f(f64(x), f64(y)),
           "scalar": lambda: f(f64(x), s),
           "rscalar": lambda: f(s, f64(x)) if op in ("add", "sub", "mul", "div")
           else f(f64(x), 0.25)}[form]()
    assert rel_err(got, ref) < 1e-6


UNARY = {
    "exp2": (pk.exp2, np.exp2, lambda r, s: r.uniform(-6, 6, s)),
    "log2": (pk.log2, np.log2, lambda r, s: r.uniform(0.05, 50, s)),
    "rsqrt": (pk.rsqrt, lambda v: 1 / np.sqrt(v), lambda r, s: r.uniform(0.05, 50, s)),
    "sqrt": (pk.sqrt, np.sqrt, lambda r, s: r.uniform(0.05, 50, s)),
    "abs": (pk.abs, np.abs, lambda r, s: r.standard_normal(s)),
    "neg": (lambda a: -a, np.negative, lambda r, s: r.standard_normal(s)),
}


@pk.kernel(num_waves=WAVES)
def unary_k(x: pk.gl["DT", 2], out: pk.gl["DT", 2], OP: pk.const = None, DT: pk.const = None,
            TD: pk.const = "f32"):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    a = pk.load(pk.rt((4, 64), TD), x, (r0, c0))
    pk.store(out, UNARY[OP][0](a), (r0, c0))


@pytest.mark.parametrize("op", list(UNARY))
def test_unary_f32(target, rng, op):
    x = UNARY[op][2](rng, (M, N)).astype(np.float32)
    got = pk.emulate(unary_k, x, poison((M, N)), grid=grid_2d(M, N), target=target,
                     OP=op)["out"]
    assert rel_err(got, UNARY[op][1](f64(x))) < 1e-5


@pytest.mark.parametrize("op", ["exp2", "log2", "rsqrt"])
def test_unary_bf16_tiles(target, rng, op):
    """bf16 in memory and in registers: computed in f32, rounded once to bf16."""
    x = UNARY[op][2](rng, (M, N)).astype(ml_dtypes.bfloat16)
    got = pk.emulate(unary_k, x, poison((M, N), ml_dtypes.bfloat16), grid=grid_2d(M, N),
                     target=target, OP=op, TD="bf16")["out"]
    assert got.dtype == ml_dtypes.bfloat16
    assert rel_err(got, UNARY[op][1](f64(x))) < 1e-2


@pk.kernel(num_waves=WAVES)
def bf16_math_k(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.bf16, 2], out: pk.gl[pk.bf16, 2]):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    t = pk.rt((4, 64), pk.f32)                 # bf16 in memory, f32 in registers
    a, b = pk.load(t, x, (r0, c0)), pk.load(t, y, (r0, c0))
    pk.store(out, pk.max(a * b - 0.5, a / (pk.abs(b) + 1.0)), (r0, c0))


def test_bf16_inputs_f32_math(target, rng):
    x = rng.standard_normal((M, N)).astype(ml_dtypes.bfloat16)
    y = rng.standard_normal((M, N)).astype(ml_dtypes.bfloat16)
    got = pk.emulate(bf16_math_k, x, y, poison((M, N), ml_dtypes.bfloat16),
                     grid=grid_2d(M, N), target=target)["out"]
    a, b = f64(x), f64(y)
    assert rel_err(got, np.maximum(a * b - 0.5, a / (np.abs(b) + 1))) < 1e-2


# ---- casts ----------------------------------------------------------------------------------

@pk.kernel(num_waves=WAVES)
def cast_k(x: pk.gl["XT", 2], out: pk.gl["OT", 2], MID: pk.const = None, RT: pk.const = "f32",
           XT: pk.const = None, OT: pk.const = None):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    t = pk.load(pk.rt((4, 64), RT), x, (r0, c0))
    u = pk.cast(t, MID) if MID else t
    pk.store(out, u, (r0, c0))


def ref_cast(x, name):
    """numpy/ml_dtypes conversion with the documented semantics: round to nearest even;
    fp8 and int8 saturate to their largest finite value."""
    d = T.DTYPES[name]
    x = np.asarray(x, np.float32)
    if name in ("f32", "bf16", "f16"):
        return x.astype(d.np)
    if d.is_fp8:
        m = float(ml_dtypes.finfo(d.np).max)
        return np.clip(x, -m, m).astype(d.np)
    info = np.iinfo(d.np)
    return np.clip(np.rint(x), info.min, info.max).astype(d.np)


def cast_names(target):
    return ["bf16", "f16", *FP8[target], "i8"]


@pytest.mark.parametrize("target, name", [(t, n) for t in TARGETS for n in cast_names(t)])
def test_cast_in_registers(target, name, rng):
    x = (rng.standard_normal((M, N)) * 200).astype(np.float32)   # fp8/i8 saturate
    got = pk.emulate(cast_k, x, poison((M, N)), grid=grid_2d(M, N), target=target,
                     MID=name)["out"]
    ref = ref_cast(x, name).astype(np.float32)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("target, name", [(t, n) for t in TARGETS for n in cast_names(t)])
def test_cast_on_store_and_load(target, name, rng):
    d = T.DTYPES[name]
    x = (rng.standard_normal((M, N)) * 200).astype(np.float32)
    out = np.ones((M, N), d.np)
    got = pk.emulate(cast_k, x, out, grid=grid_2d(M, N), target=target, MID="")["out"]
    assert got.dtype == np.dtype(d.np)
    assert np.array_equal(got.astype(np.float32), ref_cast(x, name).astype(np.float32))
    # and back: a narrow tensor loaded into an f32 tile converts exactly
    back = pk.emulate(cast_k, got, poison((M, N)), grid=grid_2d(M, N), target=target,
                      MID="")["out"]
    assert np.array_equal(back, got.astype(np.float32))


@pytest.mark.parametrize("name, top", [("e4m3", 448.0), ("e5m2", 57344.0), ("e4m3fnuz", 240.0),
                                       ("e5m2fnuz", 57344.0), ("i8", 127.0)])
def test_saturation_bounds(name, top):
    target = "gfx942" if "fnuz" in name else "gfx950"
    x = np.tile(np.float32([1e6, -1e6, 3.0, -2.5, 0.5, 1.5]), (4, 11))[:, :64]
    got = pk.emulate(cast_k, x, poison(x.shape), grid=(1, 1), target=target, MID=name)["out"]
    lo = -128.0 if name == "i8" else -top
    assert got.max() == top and got.min() == lo
    if name == "i8":   # round half to even
        assert set(np.unique(got)) == {127.0, -128.0, 3.0, -2.0, 0.0, 2.0}


def test_int32_to_int8_saturates():
    x = np.full((4, 64), 300, np.int32)
    x[:, ::2] = -300
    got = pk.emulate(cast_k, x, np.zeros((4, 64), np.int8), grid=(1, 1), MID="i8", RT="i32")
    assert set(np.unique(got["out"])) == {127, -128}


def test_cast_chain_and_int_tiles(target, rng):
    """i8 tensor -> i8 tile -> bf16 -> f16 -> f32 output, and f32 -> i32 tile."""
    x = rng.integers(-128, 128, (M, N)).astype(np.int8)
    got = pk.emulate(cast_k, x, poison((M, N)), grid=grid_2d(M, N), target=target,
                     MID="bf16", RT="i8")["out"]
    assert np.array_equal(got, x.astype(np.float32))
    y = (rng.standard_normal((M, N)) * 1000).astype(np.float32)
    got = pk.emulate(cast_k, y, np.zeros((M, N), np.int32), grid=grid_2d(M, N),
                     target=target, MID="i32")["out"]
    assert np.array_equal(got, np.rint(y).astype(np.int32))


# ---- broadcasts -------------------------------------------------------------------------------

@pk.kernel(num_waves=WAVES)
def bcast_k(x: pk.gl[pk.f32, 2], v: pk.gl[pk.f32, 1], out: pk.gl[pk.f32, 2],
            AXIS: pk.const = "row", OP: pk.const = "sub", LAY: pk.const = "row"):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    t = pk.rt((4, 64), pk.f32, LAY)
    a = pk.load(t, x, (r0, c0))
    vec = pk.load(pk.rv(t, AXIS), v, (r0 if AXIS == "row" else c0,))
    pk.store(out, BINARY[OP][0](a, vec), (r0, c0))


@pytest.mark.parametrize("lay", ["row", "col"])
@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max"])
def test_vector_broadcast(target, rng, op, axis, lay):
    x = rng.standard_normal((M, N)).astype(np.float32)
    v = rng.uniform(0.5, 2.0, M if axis == "row" else N).astype(np.float32)
    got = pk.emulate(bcast_k, x, v, poison((M, N)), grid=grid_2d(M, N), target=target,
                     AXIS=axis, OP=op, LAY=lay)["out"]
    vv = f64(v)[:, None] if axis == "row" else f64(v)[None, :]
    assert rel_err(got, BINARY[op][1](f64(x), vv)) < 1e-6


@pk.kernel(num_waves=WAVES)
def rank4_k(x: pk.gl[pk.f32, 4], v: pk.gl[pk.f32, 3], out: pk.gl[pk.f32, 4]):
    """Tiles of a (batch, head, rows, cols) tensor: leading coordinates pick the matrix."""
    b, h = pk.program_id(1), pk.program_id(2)
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    t = pk.rt((4, 64), pk.f32)
    a = pk.load(t, x, (b, h, r0, 0))
    pk.store(out, a * pk.load(pk.rv(t, "row"), v, (b, h, r0)), (b, h, r0, 0))


def test_rank4_tensors(target, rng):
    x = rng.standard_normal((2, 3, 13, 50)).astype(np.float32)
    v = rng.standard_normal((2, 3, 13)).astype(np.float32)
    got = pk.emulate(rank4_k, x, v, poison(x.shape), grid=(2, 2, 3), target=target)["out"]
    assert rel_err(got, f64(x) * f64(v)[..., None]) < 1e-6


# ---- reductions, fill, mask_outside -----------------------------------------------------------

@pk.kernel(num_waves=WAVES)
def row_reduce_k(x: pk.gl[pk.f32, 2], rmax: pk.gl[pk.f32, 1], rsum: pk.gl[pk.f32, 1],
                 rfill: pk.gl[pk.f32, 1], LAY: pk.const = "row", COLS: pk.const = 64):
    m, n = x.shape
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    tile = pk.rt((4, COLS), pk.f32, LAY)
    row = pk.rv(tile, "row")
    mx, s, f = pk.full(row, -math.inf), pk.zeros(row), pk.zeros(row)
    for j in pk.range((n + COLS - 1) // COLS):
        t = pk.load(tile, x, (r0, j * COLS), fill=-math.inf)
        pk.row_max(t, into=mx)
        pk.row_sum(pk.mask_outside(t, (r0, j * COLS), (m, n)), into=s)
        # fill=1 pads with ones; mask_outside(value=-2) turns the padding into -2s
        u = pk.load(tile, x, (r0, j * COLS), fill=1.0)
        f += pk.row_sum(u) + pk.row_sum(pk.mask_outside(u, (r0, j * COLS), (m, n), -2.0))
    pk.store(rmax, mx, (r0,))
    pk.store(rsum, s, (r0,))
    pk.store(rfill, f, (r0,))


@pytest.mark.parametrize("lay", ["row", "col"])
def test_row_reductions(target, rng, lay):
    x = rng.standard_normal((M, N)).astype(np.float32)
    got = pk.emulate(row_reduce_k, x, poison(M), poison(M), poison(M), grid=cdiv(M, 8),
                     target=target, LAY=lay)
    assert np.array_equal(got["rmax"], x.max(1))
    assert rel_err(got["rsum"], f64(x).sum(1)) < 1e-5
    pad = cdiv(N, 64) * 64 - N
    assert rel_err(got["rfill"], 2 * f64(x).sum(1) + pad - 2 * pad) < 1e-5


@pk.kernel
def col_reduce_k(x: pk.gl[pk.f32, 2], cmax: pk.gl[pk.f32, 1], csum: pk.gl[pk.f32, 1],
                 LAY: pk.const = "row"):
    m, n = x.shape
    c0 = pk.program_id(0) * 32
    tile = pk.rt((8, 32), pk.f32, LAY)
    col = pk.rv(tile, "col")
    mx, s = pk.full(col, -math.inf), pk.zeros(col)
    for i in pk.range((m + 7) // 8):
        t = pk.load(tile, x, (i * 8, c0), fill=-math.inf)
        mx.set(pk.max(mx, pk.col_max(t)))
        pk.col_sum(pk.mask_outside(t, (i * 8, c0), (m, n)), into=s)
    pk.store(cmax, mx, (c0,))
    pk.store(csum, s, (c0,))


@pytest.mark.parametrize("lay", ["row", "col"])
def test_col_reductions(target, rng, lay):
    x = rng.standard_normal((M, N)).astype(np.float32)
    got = pk.emulate(col_reduce_k, x, poison(N), poison(N), grid=cdiv(N, 32), target=target,
                     LAY=lay)
    assert np.array_equal(got["cmax"], x.max(0))
    assert rel_err(got["csum"], f64(x).sum(0)) < 1e-5


@pk.kernel(num_waves=WAVES)
def partial_colsum_k(x: pk.gl[pk.f32, 2], part: pk.gl[pk.f32, 2]):
    """Each wave stores the column sums of its 4-row block into row `block` of `part`:
    a vector store into a 2-D tensor takes a leading coordinate."""
    m, n = x.shape
    blk = pk.program_id(0) * pk.num_waves() + pk.wave_id()
    c0 = pk.program_id(1) * 64
    t = pk.mask_outside(pk.load(pk.rt((4, 64), pk.f32), x, (blk * 4, c0)), (blk * 4, c0),
                        (m, n))
    pk.store(part, pk.col_sum(t), (blk, c0))


def test_vector_store_with_leading_coordinate(target, rng):
    x = rng.standard_normal((M, N)).astype(np.float32)
    nblk = cdiv(M, 4)
    got = pk.emulate(partial_colsum_k, x, poison((cdiv(M, 8) * 2, N)), grid=grid_2d(M, N),
                     target=target)["part"]
    ref = np.stack([f64(x[4 * b:4 * b + 4]).sum(0) for b in range(nblk)])
    assert rel_err(got[:nblk], ref) < 1e-5


# ---- shared tiles -------------------------------------------------------------------------------

@pk.kernel(num_waves=4)
def shared_k(x: pk.gl["DT", 2], out: pk.gl[pk.f32, 2], back: pk.gl["DT", 2], DT: pk.const = None,
             SW: pk.const = 0, LAY: pk.const = "row", FILL: pk.const = 0.0):
    s = pk.empty(pk.st((32, 64), DT, swizzle=SW))
    s2 = pk.empty(pk.st((32, 64), DT, swizzle=SW))
    r0 = pk.program_id(0) * 32
    pk.load(s, x, (r0, 0), fill=FILL)            # global -> shared, whole workgroup
    pk.barrier()
    w = pk.wave_id()
    t = pk.load(pk.rt((8, 64), pk.f32, LAY), s, (w * 8, 0))     # shared -> register
    pk.store(out, t * 2.0, (r0 + w * 8, 0))
    pk.store(s2, t + 1.0, ((3 - w) * 8, 0))      # register -> shared, rows reversed by wave
    pk.barrier()
    pk.store(back, s2, (r0, 0))                  # shared -> global


@pytest.mark.parametrize("lay", ["row", "col"])
@pytest.mark.parametrize("sw", [0, 2, 4, 8])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_shared_round_trip(target, rng, dt, sw, lay):
    npd = T.DTYPES[dt].np
    m, n = 50, 40                  # ragged against the 32x64 shared tile
    x = rng.standard_normal((m, n)).astype(npd)
    got = pk.emulate(shared_k, x, poison((m, n)), poison((m, n), npd), grid=cdiv(m, 32),
                     target=target, SW=sw, LAY=lay, FILL=7.0)
    assert np.array_equal(got["out"], 2 * x.astype(np.float32))
    xp = np.full((64, 64), 7.0)
    xp[:m, :n] = f64(x)
    ref = np.concatenate([np.concatenate([xp[32 * b + 8 * (3 - w):32 * b + 8 * (4 - w)]
                                          for w in range(4)]) for b in range(2)]) + 1
    assert np.array_equal(f64(got["back"]), f64(ref[:m, :n].astype(npd)))


def test_swizzle_moves_bytes():
    """The swizzle changes where elements sit in LDS, but a round trip sees none of it."""
    from pykittens.lower import lower

    def regions(sw):
        prog = lower(shared_k.specialize(DT="f32", SW=sw), "gfx942")
        ops = [op for op in _walk(prog.body) if op.kind in ("lds_store", "lds_load")]
        assert len(ops) == 4                     # 2 stores, 2 loads
        return [op.attrs["region"] for op in ops]

    plain, swz, atoms = regions(0)[0], regions(4)[0], regions(8)[0]
    assert all(r.tile.swizzle == 4 for r in regions(4))
    assert plain.tile.swizzle == 0 and swz.tile.swizzle == 4
    rows = np.arange(8)[:, None]
    cols = np.arange(0, 64, 4)[None, :]          # one f32 per 16-byte chunk
    a, b = plain.byte_offset(rows, cols), swz.byte_offset(rows, cols)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[1:4], b[1:4])
    # a permutation within each row: same set of chunks, different places
    assert all(sorted(a[r]) == sorted(b[r]) for r in range(8))
    # swizzle=8 with 256-byte rows: two 128-byte column blocks, each row-major and swizzled
    assert atoms.tile.atoms == 2
    r, c = np.meshgrid(np.arange(32), np.arange(64), indexing="ij")
    flat = atoms.byte_offset(r, c * 1) - atoms.base
    assert sorted(flat.ravel()) == list(range(0, 32 * 256, 4))
    assert flat[8, 0] == 8 * 128 and flat[0, 32] == 32 * 128     # row 8; second block


def _walk(block):
    from pykittens.ir.nodes import walk
    return walk(block)


# ---- loops --------------------------------------------------------------------------------------

@pk.kernel(num_waves=WAVES)
def loop_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], mx: pk.gl[pk.f32, 2], START: pk.const = 0,
           STEP: pk.const = 1):
    """Accumulate column blocks: out[:, :64] = sum_j x[:, 64j:64j+64] for j in range(START,
    nblocks, STEP); mx is a running max carried with .set()."""
    n = x.shape[1]
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    t = pk.rt((4, 64), pk.f32)
    acc = pk.zeros(t)
    run = pk.full(t, -math.inf)
    for j in pk.range(START, (n + 63) // 64, STEP):
        blk = pk.load(t, x, (r0, j * 64), fill=-math.inf)
        run.set(pk.max(run, blk))
        acc += pk.mask_outside(blk, (r0, j * 64), x.shape)
    pk.store(out, acc, (r0, 0))
    pk.store(mx, run, (r0, 0))


@pytest.mark.parametrize("start, step", [(0, 1), (1, 2)])
def test_loop_carried_tiles(target, rng, start, step):
    n = 64 * 4 + 22
    x = rng.standard_normal((M, n)).astype(np.float32)
    got = pk.emulate(loop_k, x, poison((M, 64)), poison((M, 64)), grid=cdiv(M, 8),
                     target=target, START=start, STEP=step)
    xp = np.full((M, 64 * 5), -np.inf)
    xp[:, :n] = f64(x)
    blocks = [xp[:, 64 * j:64 * j + 64] for j in range(start, 5, step)]
    assert rel_err(got["out"], sum(np.where(np.isinf(b), 0, b) for b in blocks)) < 1e-5
    assert np.array_equal(got["mx"], np.max(blocks, axis=0).astype(np.float32))


@pk.kernel
def nested_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 1]):
    """Nested pk.range loops with a static_range inside; the row vector is carried."""
    m, n = x.shape
    t = pk.rt((4, 64), pk.f32)
    s = pk.zeros(pk.rv(t, "row"))
    tot = pk.zeros(pk.rv(t, "row"))
    for i in pk.range((m + 3) // 4):
        s.set(0.0)
        for j in pk.range((n + 63) // 64):
            for _ in pk.static_range(2):
                pk.row_sum(pk.load(t, x, (i * 4, j * 64)), into=s)
        pk.store(out, s, (i * 4,))
        tot += s
    pk.store(out, tot, (m,))


def test_nested_loops(target, rng):
    x = rng.standard_normal((M, N)).astype(np.float32)
    got = pk.emulate(nested_k, x, poison(M + 4), grid=1, target=target)["out"]
    rows = 2 * f64(x).sum(1)
    assert rel_err(got[:M], rows) < 1e-5
    blk = np.zeros(cdiv(M, 4) * 4)
    blk[:M] = rows
    assert rel_err(got[M:], blk.reshape(-1, 4).sum(0)) < 1e-5


@pk.kernel
def reverse_k(x: pk.gl[pk.f32, 2], first: pk.gl[pk.f32, 2], order: pk.gl[pk.f32, 2]):
    """A loop counting down: `first` keeps the block seen last (block 0), `order` gets
    2 * order + j, which records the visiting order."""
    t = pk.rt((4, 64), pk.f32)
    keep = pk.zeros(t)
    seq = pk.zeros(t)
    for j in pk.range(x.shape[1] // 64 - 1, -1, -1):
        keep.set(pk.load(t, x, (0, j * 64)))
        seq.set(seq * 2.0 + pk.full(t, j))
    pk.store(first, keep)
    pk.store(order, seq)


def test_loop_with_negative_step(target, rng):
    x = rng.standard_normal((4, 64 * 3)).astype(np.float32)
    got = pk.emulate(reverse_k, x, poison((4, 64)), poison((4, 64)), grid=1, target=target)
    assert np.array_equal(got["first"], x[:, :64])
    assert np.all(got["order"] == (2 * 2 + 1) * 2 + 0)          # visited 2, 1, 0


# ---- branches, ids, grids ----------------------------------------------------------------------

@pk.kernel(num_waves=4)
def branch_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    w = pk.wave_id()
    t = pk.load(pk.rt((4, 64), pk.f32), x, (w * 4, 0))
    with pk.if_(w == 0):
        pk.store(out, t * 10.0, (w * 4, 0))
    with pk.else_():
        with pk.if_((w == 1) | (w == 3)):
            pk.store(out, -t, (w * 4, 0))


def test_if_on_wave_id(target, rng):
    x = rng.standard_normal((16, 64)).astype(np.float32)
    out = np.full((16, 64), 5.0, np.float32)
    got = pk.emulate(branch_k, x, out, grid=1, target=target)["out"]
    assert np.array_equal(got[0:4], 10 * x[0:4])
    assert np.array_equal(got[4:8], -x[4:8]) and np.array_equal(got[12:16], -x[12:16])
    assert np.all(got[8:12] == 5.0)           # wave 2 stores nothing
    assert np.all(out == 5.0)                 # inputs are never modified


@pk.kernel
def ids_k(out: pk.gl[pk.i32, 4]):
    """out[z, y, x, :] = [pid0, pid1, pid2, np0, np1, np2, wave, num_waves]"""
    p = [pk.program_id(a) for a in range(3)]
    vals = p + [pk.num_programs(a) for a in range(3)] + [pk.wave_id(), pk.num_waves()]
    t = pk.rt((1, 64), pk.i32)               # one row each: workgroups write disjoint rows
    for i in pk.static_range(8):
        v = pk.full(t, vals[i])
        pk.store(out, v, (p[2], p[1], p[0] * 8 + i, 0))


def test_program_ids_3d_grid(target):
    gx, gy, gz = 3, 2, 2
    got = pk.emulate(ids_k, np.full((gz, gy, gx * 8, 64), -1, np.int32), grid=(gx, gy, gz),
                     target=target, num_waves=1)["out"]
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                want = [x, y, z, gx, gy, gz, 0, 1]
                assert list(got[z, y, x * 8:x * 8 + 8, 0]) == want


@pk.kernel(num_waves=WAVES)
def grid2d_k(x: pk.gl[pk.f32, 2], y: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], alpha: pk.f32):
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
    c0 = pk.program_id(1) * 64
    t = pk.rt((4, 64), pk.f32)
    pk.store(out, pk.load(t, x, (r0, c0)) * alpha + pk.load(t, y, (r0, c0)), (r0, c0))


def test_two_dim_grid(target, rng):
    x = rng.standard_normal((M, N)).astype(np.float32)
    y = rng.standard_normal((M, N)).astype(np.float32)
    got = pk.emulate(grid2d_k, x, y, poison((M, N)), 0.75, grid=grid_2d(M, N),
                     target=target)["out"]
    assert rel_err(got, 0.75 * f64(x) + f64(y)) < 1e-6
    # too small a grid leaves the right-hand column blocks untouched
    part = pk.emulate(grid2d_k, x, y, poison((M, N)), 0.75, grid=(grid_2d(M, N)[0], 1),
                      target=target)["out"]
    assert np.all(np.isnan(part[:, 64:])) and not np.any(np.isnan(part[:, :64]))


@pk.kernel(num_waves=WAVES)
def scalars_k(out: pk.gl[pk.f32, 2], a: pk.f32, k: pk.i32):
    m, n = out.shape
    pid = pk.program_id(0)
    vals = [(a * 2.0 + 1.0) / 4.0 - k,           # float arithmetic, i32 promoted
            n // 7 + n % 7 - (-k),                # integer arithmetic on a runtime dim
            pk.where(pid > 0, 5.0, -3.0),
            pk.minimum(k, 3) + pk.maximum(k, 3),
            pk.where((pid == 1) & (k >= 4), 1, 0)]
    t = pk.rt((4, 64), pk.f32)
    w = pk.wave_id()
    for i in pk.static_range(len(vals)):
        with pk.if_(w == i % pk.num_waves()):
            pk.store(out, pk.full(t, vals[i]), (i * 4, pid * 64))


def test_scalar_arithmetic(target):
    out = poison((20, 128))
    got = pk.emulate(scalars_k, out, 1.5, 4, grid=2, target=target)["out"]
    want = [[-3.0, -3.0], [24.0, 24.0], [-3.0, 5.0], [7.0, 7.0], [0.0, 1.0]]
    assert np.array_equal(got[::4, ::64], np.array(want, np.float32))
    assert np.array_equal(got[::4, ::64].repeat(4, 0).repeat(64, 1), got)


def test_named_arguments_and_outputs(rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = rng.standard_normal((8, 64)).astype(np.float32)
    res = pk.emulate(grid2d_k, x=x, y=y, out=poison((8, 64)), alpha=2.0, grid=(1, 1))
    assert set(res) == {"x", "y", "out"}
    assert np.array_equal(res["x"], x) and res["out"].dtype == np.float32
    assert rel_err(res["out"], 2 * f64(x) + f64(y)) < 1e-6


# ---- matrix multiply (CDNA: MFMA layouts, emulated lane-exactly) -------------------------------

@pk.kernel
def mma_k(a: pk.gl["AT", 2], b: pk.gl["AT", 2], c: pk.gl[pk.f32, 2], AT: pk.const = None,
          M_: pk.const = 32, N_: pk.const = 32, K_: pk.const = 16, MMA: pk.const = 0,
          TR: pk.const = "AB"):
    mma = MMA or None
    d = pk.zeros(pk.rt((M_, N_), pk.f32, role="acc", mma=mma))
    if TR == "AB":
        ta = pk.load(pk.rt((M_, K_), AT, role="a", mma=mma), a)
        tb = pk.load(pk.rt((K_, N_), AT, "col", role="b", mma=mma), b)
        pk.mma_AB(d, ta, tb)
    elif TR == "ABt":
        ta = pk.load(pk.rt((M_, K_), AT, role="a", mma=mma), a)
        tb = pk.load(pk.rt((N_, K_), AT, role="b", mma=mma), b)          # stored N x K
        pk.mma_ABt(d, ta, tb)
    else:
        ta = pk.load(pk.rt((K_, M_), AT, "col", role="a", mma=mma), a)   # stored K x M
        tb = pk.load(pk.rt((K_, N_), AT, "col", role="b", mma=mma), b)
        pk.mma_AtB(d, ta, tb)
    if TR == "AB":
        pk.mma_AB(d, ta, tb)            # accumulate a second time: d = 2 a b
    pk.store(c, d)


@pytest.mark.parametrize("tr", ["AB", "ABt", "AtB"])
@pytest.mark.parametrize("m, n, k, mma", [(32, 32, 16, 0), (16, 16, 32, 16), (64, 32, 32, 0),
                                          (32, 64, 64, 16)])
@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_mma_bf16(target, rng, m, n, k, mma, tr):
    sa = (k, m) if tr == "AtB" else (m, k)
    sb = (n, k) if tr == "ABt" else (k, n)
    a = rng.standard_normal(sa).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(sb).astype(ml_dtypes.bfloat16)
    got = pk.emulate(mma_k, a, b, poison((m, n)), grid=1, target=target, M_=m, N_=n, K_=k,
                     MMA=mma, TR=tr)["c"]
    ref = (f64(a).T if tr == "AtB" else f64(a)) @ (f64(b).T if tr == "ABt" else f64(b))
    assert rel_err(got, ref * (2 if tr == "AB" else 1)) < 1e-5


@pytest.mark.parametrize("target, dt", [(t, d) for t in ("gfx942", "gfx950")
                                        for d in ("f16", *FP8[t])])
def test_mma_f16_fp8(target, dt, rng):
    d = T.DTYPES[dt]
    a = rng.standard_normal((32, 32)).astype(d.np)
    b = rng.standard_normal((32, 32)).astype(d.np)
    got = pk.emulate(mma_k, a, b, poison((32, 32)), grid=1, target=target, K_=32)["c"]
    assert rel_err(got, 2 * f64(a) @ f64(b)) < 1e-5
