"""Hopper register tiles <-> shared memory through ldmatrix / stmatrix, and the K-major
wgmma forms (mma_ABt: N up to 256, fp8, a from shared memory) with the gemm_ws kernel
built on them. The emulator gives the results; the PTX shows the instructions."""
import re

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.ir.types import RegTileType, bf16, e4m3, f16
from pykittens.kernels import KERNELS
from pykittens.lower import layouts as L
from pykittens.targets import get
from pykittens.targets.sm90a import matrix_fragments

from conftest import rel_err

pytestmark = pytest.mark.usefixtures("module_cache")
SM90 = get("sm_90a")


def _layout(shape, dtype, layout="row", role=None):
    return L.tile_layout(RegTileType(dtype, shape, layout, role), SM90)


def test_matrix_fragments_of_the_mma_tiles():
    # A (16 x 16 per instruction): 8x8 matrices down then across, lane t: row t//4, cols 2(t%4)
    trans, origins = matrix_fragments(_layout((16, 32), bf16, role="a"))
    assert not trans and origins == ((0, 0), (8, 0), (0, 8), (8, 8), (0, 16), (8, 16),
                                     (0, 24), (8, 24))
    # B stored K x N, held by column: the transposed fragment
    trans, origins = matrix_fragments(_layout((32, 16), f16, "col", role="b"))
    assert trans and origins[:2] == ((0, 0), (8, 0))
    assert matrix_fragments(_layout((16, 64), bf16, role="acc"))[0] is False
    # generic row tiles (8 consecutive columns a lane) and fp8 operands are not fragments
    assert matrix_fragments(_layout((16, 64), bf16)) is None
    assert matrix_fragments(_layout((16, 32), e4m3, role="a")) is None


def _ptx_ops(kernel, **consts):
    asm = compiler.assembly(kernel, "sm_90a", **consts)
    return set(re.findall(r"(?:ldmatrix|stmatrix|ld\.shared|st\.shared)[\w.:]*", asm))


def test_mma_operands_come_through_ldmatrix():
    spec = KERNELS["gemm_basic"]
    ops = _ptx_ops(spec.kernel, **spec.compile_consts)
    assert {"ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"} <= ops
    assert not any(o.startswith("ld.shared") for o in ops)


@pk.kernel(num_waves=1)
def shared_round_trip(x: pk.gl[pk.bf16, 2], y: pk.gl[pk.bf16, 2], ROLE: pk.const = "a",
                      COL: pk.const = 0):
    """x -> registers (role layout) -> shared at column COL -> registers (generic) -> y."""
    s = pk.empty(pk.st((16, 128), pk.bf16))
    t = pk.load(pk.rt((16, 64), pk.bf16, role=ROLE), x)
    pk.store(s, t, (0, COL))
    pk.store(y, pk.load(pk.rt((16, 64), pk.bf16), s, (0, COL)))


@pytest.mark.parametrize("role", ["a", "acc"])
def test_stmatrix_when_the_column_origin_allows(role, rng):
    x = rng.standard_normal((16, 64)).astype(pk.bf16.np)
    for col in (0, 32):
        y = pk.emulate(shared_round_trip, x, np.zeros_like(x), grid=1, target="sm_90a",
                       ROLE=role, COL=col)["y"]
        assert np.array_equal(y, x)
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in _ptx_ops(shared_round_trip,
                                                                  ROLE=role, COL=32)


@pytest.mark.parametrize("dt", ["bf16", "e4m3"])
@pytest.mark.parametrize("shape", [(150, 200, 304), (64, 96, 128)])
def test_gemm_ws_with_a_tma_stored_bf16_c(dt, shape, rng):
    spec = KERNELS["gemm_ws"]
    inputs = spec.make_inputs(shape, pk.dtype_of(dt), rng)
    inputs["c"] = np.full((shape[0], shape[1]), np.nan, pk.bf16.np)
    grid, consts = spec.launch(inputs, "sm_90a")
    assert consts["PROMOTE"] == (dt == "e4m3") and consts["STAGES"] == 4
    # C leaves in every wave's 64-column pieces; told to stage a block whole, three ring
    # stages beside the staging for 256-wide blocks
    assert consts.get("TMA_STORE", 0) == 2
    consts = {**consts, "TMA_STORE": 1, "STAGES": 3 if consts["BN"] == 256 else 4}
    out = pk.emulate(spec.kernel, grid=grid, target="sm_90a", **inputs, **consts)["c"]
    assert rel_err(out, spec.reference(inputs)["c"]) < 1e-2       # bf16 rounding of C
    ops = _ptx_ops(spec.kernel, DT=dt, OUT="bf16", TMA_STORE=1, STAGES=3)
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ops


# (a block per workgroup with this shape's 128-wide TMA-staged C: three stages, as four
# hang the H200 and gemm_ws refuses them)
@pytest.mark.parametrize("consts", [{}, {"TMA_STORE": 1, "STAGES": 3},
                                    {"PERSISTENT": 0, "STAGES": 3}, {"DT": "e4m3"},
                                    {"LAYOUT": "tn"}])
def test_gemm_ws_with_its_consumers_first(consts, rng):
    """The emulator's reverse wave order (consumers run first, a wait that passes keeps its
    wave running, wgmma operands checked at issue) over gemm_ws's variants, two persistent
    workgroups over nine blocks of 128 x 256: no ring wait may run ahead of its stage."""
    from pykittens.kernels import gemm_ws_grid, gemm_ws_launch
    dt = consts.get("DT", "bf16")
    layout = consts.get("LAYOUT", "nt")               # "tn": A stored K x M, B K x N
    m, n, k = 296, 520, 384                           # rows of 16-byte multiples (TMA)
    A = rng.standard_normal((m, k)).astype(pk.dtype_of(dt).np)
    B = rng.standard_normal((n, k)).astype(pk.dtype_of(dt).np)
    t = layout == "tn"
    inputs = {"a": np.ascontiguousarray(A.T) if t else A,
              "b": np.ascontiguousarray(B.T) if t else B,
              "c": np.full((m, n), np.nan, pk.bf16.np)}
    _, rule = gemm_ws_launch(inputs, "sm_90a", layout=layout)
    c = {**rule, **{key: v for key, v in consts.items() if key not in ("DT", "LAYOUT")}}
    grid = (2,) if c.get("PERSISTENT", 1) else gemm_ws_grid(c, "sm_90a")
    out = pk.emulate(KERNELS["gemm_ws"].kernel, grid=grid, target="sm_90a",
                     wave_order="reverse", **inputs, **c)["c"]
    want = A.astype(np.float64) @ B.astype(np.float64).T
    assert rel_err(out, want) < 2e-2


@pytest.mark.parametrize("bn", [128, 256])
def test_gemm_ws_stores_c_in_pieces_through_two_tiles(bn, rng):
    """TMA_STORE=2: each wave's rows leave in 64-column pieces through two staging tiles
    of its own taking turns, beside four ring stages: every element of a ragged C written
    once (NaN where nothing was), under the emulator's reverse wave order, two persistent
    workgroups walking the blocks (so a tile's next piece waits for its copy of the last
    block's)."""
    from pykittens.kernels import gemm_ws_launch
    m, n, k = 200, 392, 256
    A = rng.standard_normal((m, k)).astype(pk.bf16.np)
    B = rng.standard_normal((n, k)).astype(pk.bf16.np)
    inputs = {"a": A, "b": B, "c": np.full((m, n), np.nan, pk.bf16.np)}
    _, rule = gemm_ws_launch(inputs, "sm_90a", bn=bn)
    c = {**rule, "TMA_STORE": 2, "STAGES": 4}
    out = pk.emulate(KERNELS["gemm_ws"].kernel, grid=(2,), target="sm_90a",
                     wave_order="reverse", **inputs, **c)["c"]
    assert rel_err(out, A.astype(np.float64) @ B.astype(np.float64).T) < 1e-2
    ops = _ptx_ops(KERNELS["gemm_ws"].kernel, DT="bf16", OUT="bf16", **c)
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ops


def test_gemm_ws_pieces_need_pairs_of_64_columns():
    # 96: not whole pieces; 192: three pieces a block, so the next block's first would
    # overwrite the tile whose copy is still running (the emulator reported that race)
    for bn in (96, 192):
        c = {"DT": "bf16", "OUT": "bf16", "BN": bn, "TM": 1, "TN": 1, "TMA_STORE": 2}
        with pytest.raises(pk.KernelError, match="BN must be a multiple of 128"):
            compiler.assembly(KERNELS["gemm_ws"].kernel, "sm_90a", **c)


def test_gemm_ws_rejects_k_rows_tma_cannot_copy():
    spec = KERNELS["gemm_ws"]
    bad = {"a": np.zeros((64, 100), pk.bf16.np), "b": np.zeros((64, 100), pk.bf16.np)}
    with pytest.raises(ValueError, match="multiple of 16 bytes, got K = 100"):
        spec.launch(bad, "sm_90a")


@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_gemm_ws_reads_mn_major_operands_as_stored(layout, dt, rng):
    """LAYOUT "nn" (B stored K x N) and "tn" (A stored K x M too): ragged in M, N and K,
    persistent over several blocks, against float64 products of the stored arrays."""
    from pykittens.kernels import gemm_ws_launch
    m, n, k = 152, 296, 312
    np_dt = pk.dtype_of(dt).np
    a = rng.standard_normal((m, k) if layout == "nn" else (k, m)).astype(np_dt)
    b = rng.standard_normal((k, n)).astype(np_dt)
    want = (a.astype(np.float64) if layout == "nn" else a.astype(np.float64).T) @ \
        b.astype(np.float64)
    inputs = {"a": a, "b": b, "c": np.full((m, n), np.nan, np_dt)}
    (grid,), consts = gemm_ws_launch(inputs, "sm_90a", layout=layout)
    assert consts["LAYOUT"] == layout and (consts["TM"], consts["TN"]) == (2, 3)
    for g in (grid, 1):
        out = pk.emulate(KERNELS["gemm_ws"].kernel, grid=(g,), target="sm_90a", **inputs,
                         **consts)["c"]
        assert rel_err(out, want) < 1e-2                          # C rounded to 16 bits
    asm = compiler.assembly(KERNELS["gemm_ws"].kernel, "sm_90a", DT=dt, OUT=dt, **consts)
    trans = re.findall(r"wgmma\.mma_async\S+ \{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, (\d), (\d);",
                       asm)
    assert set(trans) == {("1" if layout == "tn" else "0", "1")}  # imm-trans-a, imm-trans-b


@pytest.mark.parametrize("layout,c_dtype", [("nt", np.float32), ("tn", pk.bf16.np)])
def test_gemm_ws_pingpong_consumers_take_turns_over_whole_blocks(layout, c_dtype, rng):
    """PINGPONG=1: each consumer warpgroup multiplies every other 128 x 128 block whole;
    grids that give a workgroup one, two (one each) and several blocks each."""
    from pykittens.kernels import gemm_ws_launch
    m, n, k = 296, 264, 312
    A = rng.standard_normal((m, k)).astype(pk.bf16.np)
    B = rng.standard_normal((n, k)).astype(pk.bf16.np)
    a = A if layout == "nt" else np.ascontiguousarray(A.T)
    b = B if layout == "nt" else np.ascontiguousarray(B.T)
    inputs = {"a": a, "b": b, "c": np.full((m, n), np.nan, c_dtype)}
    (grid,), consts = gemm_ws_launch(inputs, "sm_90a", bn=128, layout=layout)
    consts = {**consts, "PINGPONG": 1, "TMA_STORE": 0}
    want = A.astype(np.float64) @ B.astype(np.float64).T
    assert grid == 9
    # reverse wave order: the consumers run first, so one that waited for a ring step a
    # whole block ahead of the stage's phase (without the turns) reads a stage too early
    for g, order in ((9, "forward"), (5, "forward"), (2, "forward"), (1, "forward"),
                     (2, "reverse")):
        out = pk.emulate(KERNELS["gemm_ws"].kernel, grid=(g,), target="sm_90a", **inputs,
                         wave_order=order, **consts)["c"]
        assert rel_err(out, want) < (1e-6 if c_dtype == np.float32 else 1e-2)
    for bad in ({"BN": 256}, {"TMA_STORE": 1}, {"PROMOTE": 1}):
        with pytest.raises(pk.KernelError, match="PINGPONG=1"):
            compiler.lane_ir(KERNELS["gemm_ws"].kernel, "sm_90a",
                             **{**consts, "DT": "bf16", "OUT": "bf16", **bad})


def test_gemm_ws_refuses_the_configuration_that_hung_the_h200():
    """One 128-wide block per workgroup, C staged for the TMA unit, four ring stages: hung
    the H200 (bench/litmus/gemm_hang.py), so it is an error naming what to use instead;
    its neighbours that ran there still build."""
    base = {"DT": "bf16", "OUT": "bf16", "BN": 128, "TM": 8, "TN": 8, "TMA_STORE": 1}
    with pytest.raises(pk.KernelError, match="PERSISTENT=1, STAGES=3 or TMA_STORE=0"):
        compiler.lane_ir(KERNELS["gemm_ws"].kernel, "sm_90a", **base, PERSISTENT=0,
                         STAGES=4)
    for fine in ({"PERSISTENT": 1, "STAGES": 4}, {"PERSISTENT": 0, "STAGES": 3},
                 {"PERSISTENT": 0, "STAGES": 4, "TMA_STORE": 0}):
        compiler.lane_ir(KERNELS["gemm_ws"].kernel, "sm_90a", **{**base, **fine})


def test_gemm_ws_layout_errors():
    from pykittens.kernels import gemm_ws_launch
    z = lambda *s, dt=pk.bf16: np.zeros(s, dt.np)                  # noqa: E731
    with pytest.raises(ValueError, match="fp8 operands K-major only"):
        gemm_ws_launch({"a": z(64, 128, dt=pk.e4m3), "b": z(128, 64, dt=pk.e4m3)}, "sm_90a",
                       layout="nn")
    with pytest.raises(ValueError, match="stored row of A must be a multiple of 16 bytes, "
                                         "got M = 100"):
        gemm_ws_launch({"a": z(64, 100), "b": z(64, 128)}, "sm_90a", layout="tn")
    with pytest.raises(ValueError, match="do not agree in K"):
        gemm_ws_launch({"a": z(64, 128), "b": z(64, 128)}, "sm_90a", layout="nn")
    with pytest.raises(ValueError, match="layout is 'nt', 'nn' or 'tn'"):
        gemm_ws_launch({"a": z(64, 128), "b": z(64, 128)}, "sm_90a", layout="tt")

    @pk.kernel(num_waves=4)
    def atb_regs(c: pk.gl[pk.f32, 2]):
        acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
        pk.mma_AtB(acc, pk.zeros(pk.rt((16, 64), pk.bf16, role="a")),
                   pk.empty(pk.st((64, 64), pk.bf16, swizzle=8)))

    with pytest.raises(pk.KernelError, match="mma_AtB with b in shared memory reads a from "
                                             "shared memory too"):
        compiler.lane_ir(atb_regs, "sm_90a")


@pytest.mark.parametrize("dt,n", [("bf16", 16), ("bf16", 256), ("f16", 96), ("e4m3", 128),  # 96: not a power of two
                                  ("e5m2", 64)])
@pytest.mark.parametrize("shared_a", [True, False])
def test_mma_abt_forms(dt, n, shared_a, rng):
    bk = 128 // pk.dtype_of(dt).bytes

    @pk.kernel(num_waves=4)
    def abt(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl[pk.f32, 2], DT: pk.const = None):
        sa = pk.empty(pk.st((64, bk), DT, swizzle=8))
        sb = pk.empty(pk.st((n, bk), DT, swizzle=8))
        landed = pk.mbarrier(2 if shared_a else 1)
        acc = pk.zeros(pk.rt((16, n), pk.f32, role="acc"))
        for k in pk.range(a.shape[1] // bk):
            with pk.if_(pk.wave_id() == 0):
                if shared_a:
                    pk.tma_load(sa, a, (0, k * bk), landed)
                pk.tma_load(sb, b, (0, k * bk), landed)
            pk.wait(landed, k % 2)
            ta = sa if shared_a else pk.load(pk.rt((16, bk), DT, role="a"), a,
                                             (16 * pk.wave_id(), k * bk))
            pk.mma_ABt(acc, ta, sb)
            pk.barrier()
        pk.store(c, acc, (16 * pk.wave_id(), 0))

    a = rng.standard_normal((64, 2 * bk)).astype(pk.dtype_of(dt).np)
    b = rng.standard_normal((n, 2 * bk)).astype(a.dtype)
    c = pk.emulate(abt, a, b, np.zeros((64, n), np.float32), grid=1, target="sm_90a")["c"]
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64).T) < 1e-6
    kstep = 32 if pk.dtype_of(dt).bits == 8 else 16
    asm = compiler.assembly(abt, "sm_90a", DT=dt)
    a_operand = r"%rd\d+" if shared_a else r"\{%r\d+, %r\d+, %r\d+, %r\d+\}"
    trans = "" if kstep == 32 else (", 0, 0" if shared_a else ", 0")
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k{kstep}\.f32\.{dt}\.{dt}\s+"
                     rf"\{{[^}}]*\}}, {a_operand}, %rd\d+, p, 1, 1{trans};", asm), asm[:0]


def test_mma_abt_shape_errors():
    @pk.kernel(num_waves=4)
    def wide(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
             K: pk.const = 128, SW: pk.const = 8):
        sa = pk.empty(pk.st((64, K), pk.bf16, swizzle=SW))
        sb = pk.empty(pk.st((64, K), pk.bf16, swizzle=SW))
        pk.load(sa, a)
        pk.load(sb, b)
        pk.barrier()
        acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
        pk.mma_ABt(acc, sa, sb)
        pk.store(c, acc)

    with pytest.raises(pk.KernelError, match=r"multiple of 128 bytes \(K = 64, 128, ...\)"):
        compiler.lane_ir(wide, "sm_90a", K=32, SW=0)
    with pytest.raises(pk.KernelError, match="swizzle=8 needs rows of at least 128 bytes"):
        compiler.lane_ir(wide, "sm_90a", K=32)
    with pytest.raises(pk.KernelError, match=r"\(K = 64, 128, ...\), swizzle=8"):
        compiler.lane_ir(wide, "sm_90a", K=64, SW=0)
    with pytest.raises(pk.NotSupportedYet, match="Hopper's wgmma form"):
        compiler.lane_ir(wide, "gfx950", K=64)



def test_mma_ab_with_both_operands_in_shared_memory(rng):
    """A from a (64, K) shared tile (K-major) times B stored K x N (MN-major, N up to two
    128-byte column blocks): wgmma with imm-trans-b."""
    @pk.kernel(num_waves=4)
    def shared_ab(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2]):
        sa = pk.empty(pk.st((64, 64), pk.bf16, swizzle=8))
        sb = pk.empty(pk.st((64, 128), pk.bf16, swizzle=8))
        pk.load(sa, a)
        pk.load(sb, b)
        pk.barrier()
        acc = pk.empty(pk.rt((16, 128), pk.f32, role="acc"))
        pk.mma_AB(acc, sa, sb, c=0)
        pk.store(c, acc, (16 * pk.wave_id(), 0))

    a = rng.standard_normal((64, 64)).astype(pk.bf16.np)
    b = rng.standard_normal((64, 128)).astype(pk.bf16.np)
    c = pk.emulate(shared_ab, a, b, np.zeros((64, 128), np.float32), grid=1,
                   target="sm_90a")["c"]
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < 1e-6
    ptx = compiler.assembly(shared_ab, "sm_90a")
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16\s+"
                     r"\{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, 0, 1;", ptx)


# ---- asynchronous wgmma groups (in_flight=, pk.mma_wait) ----------------------------------

@pk.kernel(num_waves=8)
def ring_abt(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
             MODE: pk.const = "ok"):
    """C = A @ B.T through a 2-stage TMA ring (warpgroup 0 produces, warpgroup 1 consumes
    with one wgmma group left running). MODE breaks it: 'early' releases a stage before
    the group reading it has retired, 'peek' reads acc before the wait, 'nowait' never
    retires the last group."""
    sa = [pk.empty(pk.st((64, 64), pk.bf16, swizzle=8)) for _ in range(2)]
    sb = [pk.empty(pk.st((64, 64), pk.bf16, swizzle=8)) for _ in range(2)]
    full = [pk.mbarrier(2) for _ in range(2)]
    empty = [pk.mbarrier(4) for _ in range(2)]
    steps = a.shape[1] // 64
    with pk.role(0, 4):
        with pk.if_(pk.wave_id() == 0):
            for i in pk.range(steps):
                for s in pk.static_range(2):
                    with pk.if_(i % 2 == s):
                        with pk.if_(i >= 2):
                            pk.wait(empty[s], (i // 2 + 1) % 2)
                        pk.tma_load(sa[s], a, (0, i * 64), full[s])
                        pk.tma_load(sb[s], b, (0, i * 64), full[s])
    with pk.role(4, 4):
        acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
        for i in pk.range(steps):
            for s in pk.static_range(2):
                with pk.if_(i % 2 == s):
                    pk.wait(full[s], (i // 2) % 2)
                    pk.mma_ABt(acc, sa[s], sb[s], in_flight=1)
                    if MODE == "early":
                        pk.arrive(empty[s])
                    else:
                        with pk.if_(i > 0):
                            pk.arrive(empty[1 - s])
        if MODE == "peek":
            pk.store(c, acc, ((pk.wave_id() % 4) * 16, 0))
        if MODE != "nowait":
            pk.mma_wait(acc)
            pk.store(c, acc, ((pk.wave_id() % 4) * 16, 0))


def _ring_inputs(rng, k=384):
    a = rng.standard_normal((64, k)).astype(pk.bf16.np)
    b = rng.standard_normal((64, k)).astype(pk.bf16.np)
    return a, b, np.zeros((64, 64), np.float32)


def test_groups_left_in_flight_give_the_product(rng):
    a, b, c = _ring_inputs(rng)
    out = pk.emulate(ring_abt, a, b, c, grid=1, target="sm_90a")["c"]
    assert rel_err(out, a.astype(np.float64) @ b.astype(np.float64).T) < 1e-6
    asm = compiler.assembly(ring_abt, "sm_90a")
    assert "wgmma.wait_group.sync.aligned 1;" in asm and "wgmma.wait_group.sync.aligned 0;" in asm


def test_async_group_misuse_is_reported(rng):
    from pykittens.emulator import EmulatorError, Race
    a, b, c = _ring_inputs(rng)
    with pytest.raises(Race, match="while a wgmma group issued with in_flight= may still"):
        pk.emulate(ring_abt, a, b, c, grid=1, target="sm_90a", MODE="peek")
    with pytest.raises(EmulatorError, match="ends with wgmma groups still running"):
        pk.emulate(ring_abt, a, b, c, grid=1, target="sm_90a", MODE="nowait")
    # a stage released while its group still reads it: the producer refills it first
    with pytest.raises(Race):
        pk.emulate(ring_abt, a, b, c, grid=1, target="sm_90a", MODE="early")


def test_mma_wait_errors():
    @pk.kernel(num_waves=4)
    def on_cdna(c: pk.gl[pk.f32, 2]):
        acc = pk.zeros(pk.rt((16, 64), pk.f32, role="acc"))
        pk.mma_wait(acc)
        pk.store(c, acc)

    with pytest.raises(pk.NotSupportedYet, match="asynchronous wgmma groups"):
        compiler.lane_ir(on_cdna, "gfx950")

    @pk.kernel(num_waves=4)
    def reg_b(c: pk.gl[pk.f32, 2]):
        acc = pk.zeros(pk.rt((16, 16), pk.f32, role="acc"))
        pk.mma_AB(acc, pk.zeros(pk.rt((16, 16), pk.bf16, role="a")),
                  pk.zeros(pk.rt((16, 16), pk.bf16, "col", role="b")), in_flight=1)

    with pytest.raises(pk.KernelError, match="in_flight= applies to the warpgroup MMA"):
        compiler.lane_ir(reg_b, "sm_90a")


@pytest.mark.parametrize("c_dtype", [np.float32, pk.bf16.np])
def test_persistent_gemm_ws_walks_several_blocks(c_dtype, rng):
    """9 blocks on grids of 9, 2 and 1 workgroups: the ring (and, for bf16 C stored
    through the TMA unit, the staging tiles) carries on from block to block."""
    from pykittens.kernels import gemm_ws_launch
    spec = KERNELS["gemm_ws"]
    inputs = spec.make_inputs((300, 600, 256), pk.bf16, rng)
    inputs["c"] = np.full((300, 600), np.nan, c_dtype)
    (grid,), consts = gemm_ws_launch(inputs, "sm_90a", bn=256)
    assert grid == 9 and consts["PERSISTENT"] == 1 and (consts["TM"], consts["TN"]) == (3, 3)
    ref = spec.reference(inputs)["c"]
    for g in (9, 2, 1):
        out = pk.emulate(spec.kernel, grid=(g,), target="sm_90a", **inputs, **consts)["c"]
        assert rel_err(out, ref) < (1e-6 if c_dtype == np.float32 else 1e-2)
    if c_dtype != np.float32:          # the TMA-store epilogue's staging tiles carry on too
        staged = {**consts, "TMA_STORE": 1, "STAGES": 3}
        out = pk.emulate(spec.kernel, grid=(2,), target="sm_90a", **inputs, **staged)["c"]
        assert rel_err(out, ref) < 1e-2
    big = {"a": np.empty((4096, 64), pk.bf16.np), "b": np.empty((4096, 64), pk.bf16.np)}
    assert spec.launch(big, "sm_90a")[0] == (132,)          # one workgroup per SM
    assert spec.launch(big, "sm_90a")[1]["BN"] == 256
    # 256-wide blocks that would leave SMs idle (4 x 3 of them here) become 128 wide
    small = {"a": np.empty((512, 64), pk.bf16.np), "b": np.empty((600, 64), pk.bf16.np)}
    assert spec.launch(small, "sm_90a")[1]["BN"] == 128


@pytest.mark.parametrize("interval", [2, 4])
def test_fp8_promotion_every_few_k_steps(interval, rng):
    """PROMOTE=n adds n K steps' products at a time; 3 and 5 steps leave a tail shorter
    than the interval (and, for 3 steps of 4, no whole interval at all)."""
    from pykittens.kernels import gemm_ws_launch
    spec = KERNELS["gemm_ws"]
    for k in (384, 640):
        inputs = spec.make_inputs((150, 300, k), pk.e4m3, rng)
        (grid,), consts = gemm_ws_launch(inputs, "sm_90a", promote=interval)
        assert (consts["PROMOTE"], consts["BN"]) == (interval, 128)
        for g in (grid, 1):
            out = pk.emulate(spec.kernel, grid=(g,), target="sm_90a", **inputs, **consts)["c"]
            assert rel_err(out, spec.reference(inputs)["c"]) < 1e-6
    with pytest.raises(ValueError, match="promote= is True, False or a number of K steps"):
        gemm_ws_launch(inputs, "sm_90a", promote=-1)


@pytest.mark.parametrize("k", [128, 384, 640])
def test_fp8_promotion_with_a_group_in_flight(k, rng):
    """PROMOTE=1 on 128-wide blocks: two product accumulators take turns, each K step's
    group running while the one before is added, in runs of PROMOTE_RUN steps — 1, 3 and
    5 steps pad the last run with steps of zeros past K (the TMA unit's out-of-bounds
    fill); two persistent workgroups walk several blocks each, waves in reverse order."""
    from pykittens.kernels import gemm, gemm_ws_launch
    spec = KERNELS["gemm_ws"]
    inputs = spec.make_inputs((150, 300, k), pk.e4m3, rng)
    _, consts = gemm_ws_launch(inputs, "sm_90a")
    assert (consts["PROMOTE"], consts["BN"]) == (1, 128) and gemm.PROMOTE_RUN % 2 == 0
    out = pk.emulate(spec.kernel, grid=(2,), target="sm_90a", wave_order="reverse",
                     **inputs, **consts)["c"]
    assert rel_err(out, spec.reference(inputs)["c"]) < 1e-6
    tile = compiler.tile_ir(spec.kernel, "sm_90a", **{**consts, "DT": "e4m3",
                                                      "OUT": "f32"})
    from pykittens.ir.nodes import walk
    mmas = [op for op in walk(tile.body) if op.kind == "mma"]
    # each consumer warpgroup: a group per step of a run, each left in flight, into two
    # accumulators in turn
    assert len(mmas) == 2 * gemm.PROMOTE_RUN
    assert all(op.attrs["in_flight"] == 1 and op.attrs["zero"] for op in mmas)
    assert len({op.dst for op in mmas}) == 4


def test_fp8_promotion_of_256_wide_blocks_by_halves(rng):
    """A 16-bit C lets fp8 products promote on 256-wide blocks: B in two 128-row halves,
    each half's products of a K step added to its half of C on their own (one 128-wide
    product accumulator); under the emulator's reverse wave order, two persistent
    workgroups, a ragged C."""
    from pykittens.kernels import gemm_ws_launch
    m, n, k = 200, 520, 512
    A = rng.standard_normal((m, k)).astype(pk.e4m3.np)
    B = rng.standard_normal((n, k)).astype(pk.e4m3.np)
    inputs = {"a": A, "b": B, "c": np.full((m, n), np.nan, pk.bf16.np)}
    _, consts = gemm_ws_launch(inputs, "sm_90a", bn=256)
    assert (consts["PROMOTE"], consts["BN"], consts["TMA_STORE"]) == (1, 256, 2)
    out = pk.emulate(KERNELS["gemm_ws"].kernel, grid=(2,), target="sm_90a",
                     wave_order="reverse", **inputs, **consts)["c"]
    assert rel_err(out, A.astype(np.float64) @ B.astype(np.float64).T) < 1e-2
    with pytest.raises(ValueError, match="every K step only"):
        gemm_ws_launch(inputs, "sm_90a", bn=256, promote=2)
    with pytest.raises(pk.KernelError, match="every K step"):
        compiler.tile_ir(KERNELS["gemm_ws"].kernel, "sm_90a", **{
            **consts, "DT": "e4m3", "OUT": "bf16", "PROMOTE": 2})


def test_fp8_promotion_adds_each_k_step_in_f32(rng):
    spec = KERNELS["gemm_ws"]
    inputs = spec.make_inputs((150, 200, 512), pk.e4m3, rng)
    grid, consts = spec.launch(inputs, "sm_90a")
    assert (consts["PROMOTE"], consts["BN"]) == (1, 128)
    out = pk.emulate(spec.kernel, grid=grid, target="sm_90a", **inputs, **consts)["c"]
    assert rel_err(out, spec.reference(inputs)["c"]) < 1e-6
    tile = compiler.tile_ir(spec.kernel, DT="e4m3", OUT="f32", **{
        k: v for k, v in consts.items() if k not in ("DT", "OUT")})
    from pykittens.ir.nodes import walk
    kinds = [op.kind for op in walk(tile.body)]
    assert "binary" in kinds[kinds.index("mma"):]        # part added to acc after the mma
