"""The CDNA library GEMM (gfx942, gfx950): HipKittens' 8-wave ping-pong on 256 x 256 blocks.

C = A @ B.T with A (M, K) and B (N, K) — a linear layer's weight as it is — bf16, f16 or
fp8 (FNUZ on gfx942, OCP on gfx950), f32 accumulation. Each workgroup owns a 256 x 256 block of C: 8 waves, each a 64 x 128
quadrant (waves 2i, 2i+1 share rows i * 64), its accumulator pinned to a0..a127 so the
MFMAs read and write it in place. K advances BK at a time through two LDS stages filled by
direct memory->LDS loads, two steps ahead.

The waves form two groups one barrier phase apart (`pk.pingpong`); a K step is two
clusters, so that while one group issues its MFMAs at raised priority the other fills the
stage two steps ahead and reads the next step's operands from LDS:

    compute  acc += A_k B_k^T                (operands in registers)
    memory   fetch step k + 2 -> stage k % 2 | A_{k+1}, B_{k+1}: LDS -> registers

A stage is refilled only after both groups have read it (one phase apart, a barrier
between), and read only after both halves of its fetch have landed (each group copies its
half in its own memory cluster).

The block order is the chiplet-aware mapping the launcher picks with the cache simulator
(chiplet.auto_mapping over 256 x 256 blocks: XCD chunking with a window)."""
import pykittens as pk

from .gemm import output_tile

BLOCK = 256           # rows and columns of C per workgroup
WAVES = 8             # two ping-pong groups of 4
WAVE_M, WAVE_N = 64, 128
STORE_N = 32          # columns of C a wave converts and stores at once


@pk.kernel(num_waves=WAVES)
def gemm_pingpong(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
                  DT: pk.const = None, OUT: pk.const = None, BK: pk.const = 0,
                  PIN: pk.const = "a0", MAP: pk.const = "row-major", TM: pk.const = 0,
                  TN: pk.const = 0, TARGET: pk.target = None):
    """C = A @ B.T on 256 x 256 blocks (module docstring); BK = 0: the target's STEP_BYTES
    of each row."""
    _pingpong(a, b, c, None, None, DT, BK, PIN, MAP, TM, TN, TARGET)


@pk.kernel(num_waves=WAVES)
def gemm_pingpong_mx(a: pk.gl["DT", 2], b: pk.gl["DT", 2], scale_a: pk.gl[pk.e8m0, 2],
                     scale_b: pk.gl[pk.e8m0, 2], c: pk.gl["OUT", 2],
                     DT: pk.const = None, OUT: pk.const = None, BK: pk.const = 0,
                     PIN: pk.const = "a0", MAP: pk.const = "row-major", TM: pk.const = 0,
                     TN: pk.const = 0, TARGET: pk.target = None):
    """gfx950, MXFP8, MXFP6 and MXFP4: C = (A 2^(scale_a - 127)) @ (B 2^(scale_b - 127)).T,
    every 32 elements of a row of A and of B along K sharing one E8M0 scale: scale_a
    (M, K / 32) and scale_b (K / 32, N), the layout the block-scaled MFMA reads B's scales
    in. DT e4m3 or e5m2 (A (M, K), B (N, K)); e2m3p or e3m2p: FP6 packed densely, A (M,
    3K / 4) and B (N, 3K / 4) bytes; or e2m1x2: FP4 pairs, A (M, K / 2) and B (N, K / 2)
    bytes. The schedule is gemm_pingpong's; each wave reads its rows' scales of the next
    step from memory in the memory cluster."""
    _pingpong(a, b, c, scale_a, scale_b, DT, BK, PIN, MAP, TM, TN, TARGET)


def _pingpong(a, b, c, scale_a, scale_b, DT, BK, PIN, MAP, TM, TN, TARGET):
    if TARGET not in STEP_BYTES:
        raise pk.KernelError(f"gemm_pingpong is the CDNA GEMM (gfx942, gfx950), not "
                             f"{TARGET}; on Hopper use gemm_ws")
    mx = scale_a is not None
    BK = BK or step_columns(TARGET, pk.dtype_of(DT))   # columns (bytes for packed FP4 / FP6)
    blocks = BK * pk.dtype_of(DT).packed // 32         # scale blocks per step
    m0, n0 = output_tile(MAP, TM, TN, BLOCK, BLOCK, TARGET)
    # LDS rows are a power of two wide: FP6's 48 bytes a step take 64-byte rows, the direct
    # loads moving the next step's 16 bytes too (a third more reads than the data)
    width = 1 << (BK - 1).bit_length()
    sa = pk.empty(pk.st((BLOCK, width), DT), count=2)
    sb = pk.empty(pk.st((BLOCK, width), DT), count=2)
    wm, wn = pk.wave_id() // 2, pk.wave_id() % 2
    ta = pk.empty(pk.rt((WAVE_M, BK), DT, "row", role="a", scaled=mx))
    tb = pk.empty(pk.rt((WAVE_N, BK), DT, "row", role="b", scaled=mx))
    if mx:
        ea = pk.empty(pk.rt((WAVE_M, blocks), pk.e8m0, role="a_scale"))
        eb = pk.empty(pk.rt((blocks, WAVE_N), pk.e8m0, role="b_scale"))
    acc = pk.zeros(pk.rt((WAVE_M, WAVE_N), pk.f32, role="acc", pin=PIN or None))
    steps = (a.shape[1] + BK - 1) // BK

    def fetch(k):                       # this wave's share of step k's operands -> LDS
        pk.load(sa[k % 2], a, (m0, k * BK), direct=True)
        pk.load(sb[k % 2], b, (n0, k * BK), direct=True)

    def operands(k):                    # this wave's rows of step k: LDS -> registers
        pk.load(ta, sa[k % 2], (wm * WAVE_M, 0))
        pk.load(tb, sb[k % 2], (wn * WAVE_N, 0))
        if mx:                          # and their scales, from memory
            pk.load(ea, scale_a, (m0 + wm * WAVE_M, k * blocks))
            pk.load(eb, scale_b, (k * blocks, n0 + wn * WAVE_N))

    fetch(0)
    with pk.if_(steps > 1):
        fetch(1)
    pk.barrier()
    operands(0)
    with pk.pingpong(fence=True) as pp:
        for k in pk.range(steps):
            with pp.compute():
                if mx:
                    pk.mma_ABt(acc, ta, tb, scale_a=ea, scale_b=eb)
                else:
                    pk.mma_ABt(acc, ta, tb)
            with pp.memory():
                with pk.if_(k + 2 < steps):
                    fetch(k + 2)
                with pk.if_(k + 1 < steps):
                    operands(k + 1)
    for j in pk.static_range(WAVE_N // STORE_N):       # a strip at a time: few registers
        pk.store(c, pk.subtile(acc, (0, j * STORE_N), (WAVE_M, STORE_N)),
                 (m0 + wm * WAVE_M, n0 + wn * WAVE_N + j * STORE_N))


# Bytes of K per step (K = 32 bf16 or 64 fp8 on gfx950): the most whose code object keeps
# every value in registers at 2 waves per SIMD (256 VGPRs + AGPRs each, 128 of them the
# pinned accumulator) with no spills (tests/test_gemm_cdna.py): gfx950 64 (128 would need
# ~260 registers for its operands); gfx942 32 (its direct loads move dwords, one M0 setup
# each: 64 spills SGPRs)
STEP_BYTES = {"gfx950": 64, "gfx942": 32}
FP6_STEP_BYTES = 48     # 64 FP6 values, one 32x32x64 MFMA deep (64 bytes: not whole values)


def step_columns(target: str, dtype) -> int:
    """Columns of A and B (bytes for packed types) a K step takes: STEP_BYTES of each row."""
    if dtype.packed not in (1, 2):
        return FP6_STEP_BYTES
    return STEP_BYTES[target] // dtype.bytes


def gemm_pingpong_launch(m: int, n: int, k: int, target: str, itemsize: int = 2,
                         packed: int = 1, dtype=None):
    """(grid, consts) of gemm_pingpong (or gemm_pingpong_mx) for an (m, k) x (n, k) product
    on a CDNA target: one workgroup per 256 x 256 block of C, in the cache simulator's
    order. itemsize: bytes a stored element; packed=2 for FP4 pairs (pk.e2m1x2: k / 2
    bytes a row); or dtype, the operands' element type (its name or pk type), which sets
    both (pk.e2m3p / pk.e3m2p: FP6, 3k / 4 bytes a row)."""
    from .. import chiplet
    from ..ir.types import dtype_of
    from ..targets import get
    t = get(target)
    if t.name not in STEP_BYTES:
        raise ValueError(f"gemm_pingpong is the CDNA GEMM (gfx942, gfx950), not {target}; on "
                         "Hopper use gemm_ws")
    if dtype is None:                  # a type of that storage: only its size matters here
        dtype = {(2, 1): "bf16", (1, 1): "e4m3", (1, 2): "e2m1x2"}.get((itemsize, packed))
        if dtype is None:
            raise ValueError("gemm_pingpong takes bf16, f16 or fp8 operands (itemsize 2 or 1), "
                             "FP4 pairs (itemsize=1, packed=2) or FP6 (dtype=pk.e2m3p / "
                             "e3m2p)")
    elif dtype_of(dtype).name not in t.dtypes:
        raise ValueError(f"{t.name} has no {dtype_of(dtype)} MFMAs (the MX formats are "
                         "gfx950's)")
    d = dtype_of(dtype)
    if d.packed == 2 and k % 2:
        raise ValueError(f"FP4 pairs pack K two a byte: K = {k} must be even")
    if d.packed not in (1, 2) and k % 4:
        raise ValueError(f"FP6 packs four values in three bytes: K = {k} must be a multiple "
                         "of 4")
    itemsize, packed = d.bytes, d.packed
    bk = step_columns(t.name, d)
    tm, tn = max(1, -(-m // BLOCK)), max(1, -(-n // BLOCK))
    op = chiplet.Gemm(tm * BLOCK, tn * BLOCK, max(k // packed, 1), bm=BLOCK, bn=BLOCK, bk=bk,
                      dtype="bf16" if itemsize == 2 else "e4m3")
    spec = chiplet.auto_mapping(op, target=t.name).spec
    return (tm * tn,), {"BK": bk, "MAP": spec, "TM": tm, "TN": tn, "TARGET": t.name}
