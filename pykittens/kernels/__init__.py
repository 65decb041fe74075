"""The kernel library: each kernel is a short pykittens program plus a KernelSpec that says how
to feed it and what it must compute. `KERNELS[name]` is the registry."""
from __future__ import annotations

import numpy as np

from .gemm import gemm_basic, gemm_sk, gemm_wgmma, gemm_ws
from .gemm_cdna import gemm_pingpong, gemm_pingpong_launch, gemm_pingpong_mx
from . import rows
from .layernorm import dbias_column, layernorm, layernorm_bwd
from .pipeline import tma_scale, ws_scale
from .rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_bwd
from .rope import rope, rope_launch
from .rows import column_sum
from .scaled_add import scaled_add
from .softmax import softmax, softmax_bwd
from .spec import KernelSpec, check, rel_err
from ..ir import types as T

ROWS_PER_WAVE = 4


WAVES = 4            # num_waves of the library's row kernels


def _rows_grid(m: int) -> int:
    return max(1, -(-m // (ROWS_PER_WAVE * WAVES)))


def _rand(shape, dtype, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype.np)


def _f64(x):
    return np.asarray(x).astype(np.float64)


# ---- scaled_add -----------------------------------------------------------------------------

def _sa_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng), "y": _rand(shape, dtype, rng),
            "out": np.zeros(shape, dtype.np), "alpha": float(rng.uniform(0.5, 2.0))}


def _sa_ref(i):
    return {"out": i["alpha"] * _f64(i["x"]) + _f64(i["y"])}


def _sa_torch(t):
    return {"out": t["alpha"] * t["x"] + t["y"]}


def _sa_launch(i, target):
    m, n = i["x"].shape
    return (_rows_grid(m), -(-n // 64)), {}


# ---- softmax ----------------------------------------------------------------------------------

def _sm_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng, 3.0), "out": np.zeros(shape, dtype.np)}


def _sm_ref(i):
    x = _f64(i["x"])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"out": e / e.sum(axis=1, keepdims=True)}


def _sm_torch(t):
    import torch
    return {"out": torch.softmax(t["x"], dim=1)}


TMA_CHUNK = 256                  # columns per TMA box (a box dim is at most 256 elements)
TMA_MAX_COLS = 8192              # rows staged whole in shared memory: 4 waves x 16 KiB (bf16)


def ln_tma_consts(n: int) -> dict:
    """Constants of the Hopper TMA schedule (rows staged in shared memory, read once) for
    rows of n columns. Opt-in: on the H200 it measured slower than the looped schedule
    (1.84 vs 2.57 TB/s at 16384 x 8192 bf16, docs/PERF.md) — its loads do not overlap the
    math yet."""
    if n > TMA_MAX_COLS:
        raise ValueError(f"the TMA schedule stages at most {TMA_MAX_COLS} columns, not {n}")
    return {"TMA": 1, "N_MAX": max(TMA_CHUNK, 1 << (max(n, 1) - 1).bit_length()),
            "CHUNK": TMA_CHUNK}


def row_launch(i, target, x="x", row_bytes=None, loop=rows.LOOP,
               share_regs=rows.SPLIT_SHARE_REGS, exact=False):
    """(grid, consts) of a row kernel (rows.plan) over the rows of input `x`; row_bytes
    defaults to x's element size (a forward pass holding x). Forward passes keep to the
    register schedules: on the H200 the staged walk was slower for every norm forward at
    every measured shape (bench/rows_staged.py, docs/PERF.md). exact: a kernel taking
    EXACT (rows.Rows) gets EXACT=1 where its windows all lie inside (rows.exact)."""
    m, n = i[x].shape
    per, consts = rows.plan(m, n, target, row_bytes or rows.itemsize(i[x]),
                            share_regs=share_regs, loop=loop)
    if exact and rows.exact(n, consts, m, per):
        consts = {**consts, "EXACT": 1}
    return (max(1, -(-m // per)),), consts


def softmax_grad_launch(i, target):
    """(grid, consts) of softmax_bwd for y = i["y"]: on Hopper, 16-bit rows whose default
    split takes more than 16 waves, and that at most 8 waves of shares four times the
    default (64 registers per lane of y and dy) cover, take those: on the H200 that took
    4096x12288 bf16 from 86% to 96% of copy bandwidth, where 16384x4096 and 16384x8192 were
    1-2 points faster with their default 8 and 16 waves (bench/rows_staged.py softmax_bwd,
    docs/PERF.md). Elsewhere (wider rows would need more registers than a workgroup of
    their waves has; f32 and CDNA unmeasured) the default."""
    from ..targets import get
    row_bytes = 2 * rows.itemsize(i["y"])
    default = row_launch(i, target, x="y", row_bytes=row_bytes, exact=True)
    if get(target).family == "hopper" and rows.itemsize(i["y"]) == 2 and \
            default[1].get("num_waves", 0) > SOFTMAX_BWD_MANY_WAVES:
        grid, consts = row_launch(i, target, x="y", row_bytes=row_bytes,
                                  share_regs=SOFTMAX_BWD_SHARE_REGS, exact=True)
        wide_share = SOFTMAX_BWD_SHARE_REGS * 4 * get(target).wave_size // row_bytes
        if consts.get("SPLIT") and consts["num_waves"] <= SOFTMAX_BWD_WAVES and \
                consts["N_MAX"] // consts["num_waves"] == wide_share:
            return grid, consts
    return default


SOFTMAX_BWD_SHARE_REGS = 64     # registers per lane of a wave's share of y and dy (Hopper)
SOFTMAX_BWD_WAVES = 8           # ... for rows that at most this many such waves cover
SOFTMAX_BWD_MANY_WAVES = 16     # ... where the default split takes more waves than this


def _staged(i, target, names, sums: int):
    """rows.staged_plan of a backward pass staging the inputs `names` of i and holding
    `sums` per-column sums (None where it does not apply, or an input is not aligned for
    the TMA unit)."""
    if not rows.STAGED or not all(rows.tma_ready(i[k]) for k in names):
        return None
    m, n = i["x"].shape
    return rows.staged_plan(m, n, target, rows.itemsize(i["x"]), len(names), sums=sums)


def exact_row_launch(i, target, **kw):
    """row_launch of a kernel that takes EXACT (the forward norms, softmax): set where it
    holds (held rows that fill their windows: no bounds checks and no column masks; on the
    H200 that took 14 registers a lane off LayerNorm's 12-wave rows of 12288 columns)."""
    return row_launch(i, target, exact=True, **kw)


def ln_launch(i, target):
    """LayerNorm's loop prefetches the next column block (measured faster on the H200)."""
    return exact_row_launch(i, target, loop={**rows.LOOP, "PREFETCH": 1})


# ---- layernorm --------------------------------------------------------------------------------

def _ln_inputs(shape, dtype, rng):
    m, n = shape
    return {"x": _rand(shape, dtype, rng) + dtype.np(1.5), "w": _rand((n,), dtype, rng),
            "b": _rand((n,), dtype, rng), "out": np.zeros(shape, dtype.np),
            "stats": np.zeros((2, m), np.float32), "eps": 1e-5}


def _ln_ref(i):
    x = _f64(i["x"])
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return {"out": (x - mu) / np.sqrt(var + i["eps"]) * _f64(i["w"]) + _f64(i["b"])}


def stats_launch(i, target, launch=exact_row_launch, **kw):
    """The launch of a forward norm that also writes its per-row statistics (STATS=1)."""
    grid, consts = launch(i, target, **kw)
    return grid, {**consts, "STATS": 1}


def _ln_stats(x):
    """The mean and 1/std of x's rows as the forward kernel stores them: (2, rows), f32."""
    mu = x.mean(axis=1)
    rstd = 1 / np.sqrt(((x - mu[:, None]) ** 2).mean(axis=1) + 1e-5)
    return np.stack([mu, rstd]).astype(np.float32)


PARTS = 8                 # rows of partial column sums in the backward specs: small grids walk


def _grad_inputs(shape, dtype, rng, x_offset=1.5):
    m, n = shape
    return {"x": _rand(shape, dtype, rng) + dtype.np(x_offset), "dy": _rand(shape, dtype, rng),
            "w": _rand((n,), dtype, rng), "dx": np.zeros(shape, dtype.np),
            "dw_part": np.zeros((PARTS, n), np.float32)}


def _norm_grad_ref(i, xhat, center):
    """float64 dx of a LayerNorm (center) or RMSNorm from xhat and the stored rstd."""
    g = _f64(i["dy"]) * _f64(i["w"])
    rstd = _f64(i["rstd"])[:, None]
    dx = g - xhat * (g * xhat).mean(axis=1, keepdims=True)
    if center:
        dx -= g.mean(axis=1, keepdims=True)
    return rstd * dx


# ---- rmsnorm, add_rmsnorm, rmsnorm_bwd --------------------------------------------------------

def _rms_inputs(shape, dtype, rng):
    m, n = shape
    return {"x": _rand(shape, dtype, rng) + dtype.np(0.5), "w": _rand((n,), dtype, rng),
            "out": np.zeros(shape, dtype.np), "rstd": np.zeros(m, np.float32), "eps": 1e-5}


def _rms_of(x, i):
    rstd = 1 / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + i["eps"])
    return {"out": x * rstd * _f64(i["w"]), "rstd": rstd[:, 0]}


def _rms_torch(t):
    x = t["x"]
    rstd = ((x ** 2).mean(1, keepdim=True) + t["eps"]).rsqrt()
    return {"out": x * rstd * t["w"], "rstd": rstd[:, 0]}


def _add_rms_inputs(shape, dtype, rng):
    return {**_rms_inputs(shape, dtype, rng), "residual": _rand(shape, dtype, rng),
            "s": np.zeros(shape, dtype.np)}


def _add_rms_ref(i):
    s = _f64((_f64(i["x"]) + _f64(i["residual"])).astype(i["x"].dtype))  # rounded, as stored
    return {**_rms_of(s, i), "s": s}


def _add_rms_torch(t):
    s = t["x"] + t["residual"]
    return {**_rms_torch({**t, "x": s}), "s": s}


def _rms_grad_inputs(shape, dtype, rng):
    i = _grad_inputs(shape, dtype, rng, 0.5)
    x = _f64(i["x"])
    i["rstd"] = (1 / np.sqrt((x ** 2).mean(axis=1) + 1e-5)).astype(np.float32)
    i["ds"] = _rand(shape, dtype, rng)
    return i


def _rms_grad_ref(i):
    xhat = _f64(i["x"]) * _f64(i["rstd"])[:, None]
    return {"dx": _norm_grad_ref(i, xhat, False) + _f64(i["ds"]),
            "dw_part": (_f64(i["dy"]) * xhat).sum(axis=0)}


def _norm_grad_torch(t, center):
    """_norm_grad_ref on torch tensors (the GPU reference)."""
    x = t["x"]
    rstd = (t["stats"][1] if center else t["rstd"])[:, None]
    xhat = (x - t["stats"][0][:, None]) * rstd if center else x * rstd
    g = t["dy"] * t["w"]
    dx = g - xhat * (g * xhat).mean(1, keepdim=True)
    if center:
        dx = dx - g.mean(1, keepdim=True)
    return {"dx": rstd * dx + (0 if center else t["ds"])}


def rms_grad_launch(i, target, residual=True, dw=True):
    """(grid, consts) of rmsnorm_bwd for x = i["x"] (and at most i["dw_part"]'s rows of
    partial sums, where given); residual: ds is added (add_rmsnorm's gradient); dw: the
    weight's gradient is summed."""
    m, n = i["x"].shape
    inputs = ("x", "dy", "ds") if residual else ("x", "dy")
    grid, consts = rows.walk_plan(m, n, target, len(inputs) * rows.itemsize(i["x"]) + 4 * dw,
                                  parts=i["dw_part"].shape[0] if "dw_part" in i else None,
                                  staged=_staged(i, target, inputs, int(dw)))
    return grid, {**consts, "RESIDUAL": int(residual)}


# ---- layernorm_bwd -----------------------------------------------------------------------------

def _ln_grad_inputs(shape, dtype, rng):
    i = _grad_inputs(shape, dtype, rng)
    i["stats"] = _ln_stats(_f64(i["x"]))
    # dweight's, then dbias's from dbias_column(n)
    i["part"] = np.zeros((PARTS, dbias_column(shape[1]) + shape[1]), np.float32)
    del i["dw_part"]
    return i


def _ln_grad_ref(i):
    mean, rstd = _f64(i["stats"])
    xhat = (_f64(i["x"]) - mean[:, None]) * rstd[:, None]
    dy = _f64(i["dy"])
    n = dy.shape[1]
    part = np.zeros(dbias_column(n) + n)
    part[:n], part[dbias_column(n):] = (dy * xhat).sum(axis=0), dy.sum(axis=0)
    return {"dx": _norm_grad_ref({**i, "rstd": rstd}, xhat, True), "part": part}


def ln_grad_launch(i, target, dw=True, db=True):
    """(grid, consts) of layernorm_bwd, as rms_grad_launch (at most i["part"]'s rows of
    partial sums, where given); dw, db: which of the weight's and the bias's gradients are
    summed."""
    m, n = i["x"].shape
    return rows.walk_plan(m, n, target, 2 * rows.itemsize(i["x"]) + 4 * (dw + db),
                          parts=i["part"].shape[0] if "part" in i else None,
                          staged=_staged(i, target, ("x", "dy"), dw + db))


# ---- softmax_bwd, column_sum -------------------------------------------------------------------

def _sm_grad_inputs(shape, dtype, rng):
    y = _sm_ref({"x": _rand(shape, dtype, rng, 3.0)})["out"].astype(dtype.np)
    return {"y": y, "dy": _rand(shape, dtype, rng), "dx": np.zeros(shape, dtype.np)}


def _sm_grad_ref(i):
    y, dy = _f64(i["y"]), _f64(i["dy"])
    return {"dx": y * (dy - (y * dy).sum(axis=1, keepdims=True))}


def _sm_grad_torch(t):
    y, dy = t["y"], t["dy"]
    return {"dx": y * (dy - (y * dy).sum(1, keepdim=True))}


def _cs_inputs(shape, dtype, rng):
    return {"part": _rand(shape, T.f32, rng), "out": np.zeros(shape[1], dtype.np)}


def _cs_ref(i):
    return {"out": _f64(i["part"]).sum(axis=0)}


# ---- rope (shape = batch, seq, heads, head_dim) ------------------------------------------------

def _rope_half(d):
    """The rotated half of a head in the specs: all of it, or a quarter where d is not a
    multiple of 64 (partial rotary: the rest passes through)."""
    return d // 2 if d % 64 == 0 else d // 4


def _rope_inputs(shape, dtype, rng):
    b, s, h, d = shape
    ang = rng.uniform(-3, 3, (s + 2, _rope_half(d)))
    return {"x": _rand(shape, dtype, rng), "cos": np.cos(ang).astype(np.float32),
            "sin": np.sin(ang).astype(np.float32), "pos": np.zeros((1, 1), np.int32),
            "out": np.zeros(shape, dtype.np)}


def _rope_ref(i):
    x = _f64(i["x"])
    s, half = x.shape[1], i["cos"].shape[1]
    c, sn = (_f64(i[k])[None, :s, None, :] for k in ("cos", "sin"))
    lo, hi = x[..., :half], x[..., half:2 * half]
    return {"out": np.concatenate([lo * c - hi * sn, hi * c + lo * sn, x[..., 2 * half:]], -1)}


def _rope_torch(t):
    import torch
    x = t["x"]
    s, half = x.shape[1], t["cos"].shape[1]
    c, sn = (t[k][None, :s, None, :] for k in ("cos", "sin"))
    lo, hi = x[..., :half], x[..., half:2 * half]
    return {"out": torch.cat([lo * c - hi * sn, hi * c + lo * sn, x[..., 2 * half:]], -1)}


def _rope_spec_launch(i, target):
    return rope_launch(i["x"].shape, i["cos"].shape[1], False, target)


# ---- gemm_basic (shape = M, N, K) --------------------------------------------------------------

def _gemm_inputs(shape, dtype, rng):
    m, n, k = shape
    return {"a": _rand((m, k), dtype, rng), "b": _rand((k, n), dtype, rng),
            "c": np.zeros((m, n), np.float32)}


def _gemm_ref(i):
    return {"c": _f64(i["a"]) @ _f64(i["b"])}


def _gemm_launch(i, target, bm=64, bn=64, n=None):
    """A flat grid of bm x bn output tiles in the order the cache simulator picks for this
    shape and target (chiplet.auto_mapping, memoised on disk)."""
    from .. import chiplet
    from ..targets import get
    m, k = i["a"].shape
    n = i["b"].shape[1] if n is None else n
    tm, tn = max(1, -(-m // bm)), max(1, -(-n // bn))
    op = chiplet.Gemm(tm * bm, tn * bn, max(k, 1), bm=bm, bn=bn, bk=64)
    spec = chiplet.auto_mapping(op, target=target).spec
    return (tm * tn,), {"MAP": spec, "TM": tm, "TN": tn, "TARGET": get(target).name}


def _gemm_nt_inputs(shape, dtype, rng):
    """C = A @ B.T with B stored N x K (a linear layer's weight)."""
    m, n, k = shape
    return {"a": _rand((m, k), dtype, rng), "b": _rand((n, k), dtype, rng),
            "c": np.zeros((m, n), np.float32)}


def _gemm_sk_inputs(shape, dtype, rng):
    """gemm_sk's: gemm_ws's operands, and the lenders' memory its sm_90a launch needs."""
    i = _gemm_nt_inputs(shape, dtype, rng)
    _, consts, slots = _gemm_sk_plan_of(i, "sm_90a")
    return {**i, "part": np.zeros((128 * slots, consts["BN"]), np.float32),
            "flags": np.zeros(8 * slots, np.int32)}


def _gemm_sk_plan_of(i, target):
    m, k = i["a"].shape
    _, rule = gemm_ws_launch(i, target)
    plan = gemm_sk_plan(rule, target, k, rows.itemsize(i["a"]))
    if plan is None:
        raise ValueError(f"gemm_sk splits nothing of a {m} x {i['b'].shape[0]} x {k} "
                         f"product (its blocks fill whole rounds of the grid); use gemm_ws")
    return plan


def _gemm_nt_ref(i):
    return {"c": _f64(i["a"]) @ _f64(i["b"]).T}


def _gemm_nt_torch(t):
    return {"c": t["a"] @ t["b"].T}


class Operand:
    """What the GEMM launch rules read of an operand, for planning without a tensor: its
    shape and element size."""

    def __init__(self, shape, itemsize):
        self.shape, self.itemsize = shape, itemsize


def gemm_ws_dims(layout: str, a_shape, b_shape) -> tuple[int, int, int]:
    """(m, k, n) of gemm_ws's product with A and B stored as `layout` says ("nt": A M x K,
    B N x K; "nn": B K x N; "tn": A K x M, B K x N)."""
    if layout not in ("nt", "nn", "tn"):
        raise ValueError(f"gemm_ws layout is 'nt', 'nn' or 'tn', not {layout!r}")
    m, k = a_shape if layout[0] == "n" else a_shape[::-1]
    kb, n = b_shape[::-1] if layout[1] == "t" else b_shape
    if kb != k:
        raise ValueError(f"gemm_ws ({layout}): A {tuple(a_shape)} and B {tuple(b_shape)} do "
                         f"not agree in K ({k} vs {kb})")
    return m, k, n


def gemm_ws_launch(i, target, promote: bool | int | None = None, bn: int | None = None,
                   layout: str = "nt"):
    """(grid, consts) of gemm_ws for inputs `i`: persistent (one workgroup per SM walks the
    blocks), 128 x BN blocks on the cache simulator's order. fp8 operands promote each K
    step's products to the f32 accumulator unless promote=False (PROMOTE=1: the tensor
    cores' fp8 accumulation keeps fewer bits; 128-wide blocks, a group in flight while the
    one before is added, or with bn=256 each 128-column half after its group);
    promote=n promotes every n K steps instead (128-wide blocks; less exact). A 16-bit C
    leaves through shared memory and TMA stores in every wave's 64-column pieces
    (TMA_STORE=2), another C from registers. TMA copies A and B: their
    stored rows must be multiples of 16 bytes.
    bn=128 or 256 overrides the block width (an autotuner's candidate). layout: how A and B
    are stored (gemm_ws's LAYOUT; MN-major operands are 16-bit only). A decode step's few
    rows of A (A_ROWS) take DECODE_SHORT_K's or DECODE_WHOLE_K's narrow blocks over all of K
    where those fill the SMs."""
    m, k, n = gemm_ws_dims(layout, i["a"].shape, i["b"].shape)
    esz = rows.itemsize(i["a"])
    if layout != "nt" and esz != 2:
        raise ValueError(f"gemm_ws reads fp8 operands K-major only (layout 'nt': A M x K, "
                         f"B N x K), not {layout!r}; transpose the operands first")
    row_dims = {"a": "K" if layout[0] == "n" else "M", "b": "K" if layout[1] == "t" else "N"}
    for name, dim in row_dims.items():
        row = i[name].shape[1]
        if row * esz % 16:
            raise ValueError(f"gemm_ws copies A and B by TMA: each stored row of {name.upper()}"
                             f" must be a multiple of 16 bytes, got {dim} = {row} "
                             f"({row * esz} bytes); pad {dim}")
    if promote is not None and (type(promote) not in (bool, int) or promote < 0):
        raise ValueError(f"gemm_ws promote= is True, False or a number of K steps, not "
                         f"{promote!r}")
    promote = int(esz == 1 if promote is None else promote) if esz == 1 else 0
    if bn not in (None, 128, 256):
        raise ValueError(f"gemm_ws blocks are 128 or 256 wide, not {bn}")
    if bn == 256 and promote > 1:
        raise ValueError(f"gemm_ws promotes 256-wide blocks every K step only (promote=True), "
                         f"not every {promote}; use bn=128 for promote={promote}")
    c = i.get("c")
    # a 16-bit C leaves through shared memory and TMA stores, every wave its rows in
    # 64-column pieces through two tiles of its own (TMA_STORE=2): staging a 256-wide block
    # whole (64 KiB) would cost the ring its fourth stage (H200, 8192³ bf16: 659 against
    # 622 TFLOP/s), the registers' scattered 4-byte stores held the tensor cores up to 9%
    # longer at K = 4096, and a 128-wide block staged whole by the warpgroup 2-11% longer
    # (fp8, promoted; docs/PERF.md, runs EA-EJ)
    staged = c is not None and rows.itemsize(c) == 2 and n * 2 % 16 == 0
    chosen = bn is not None
    from ..targets import get
    cus = get(target).num_cus
    if bn is None:            # 128 wide where 256-wide blocks would leave many SMs idle

        def busy(blocks):     # the share of the SMs' block slots a launch's waves fill
            return blocks / (-(-blocks // cus) * cus)
        tm = -(-m // 128)
        # a 256-wide block does a 128-wide one's work about 10% faster (H200, 4096³, C
        # from registers: 620 against 565 TFLOP/s), so it takes a fuller grid to win
        idle = busy(tm * -(-n // 128)) > 1.1 * busy(tm * -(-n // 256))
        # promoting, 128-wide blocks keep a group in flight while the last is added
        # (gemm.promote_in_flight): on the H200 3-9% faster at 4096³ and 8192³ than
        # 256-wide blocks adding each 128-column half after its group, whose registers
        # hold no second product (docs/PERF.md, 2026-12-04 fourth session, runs SF-SH)
        narrow = bool(promote)
        bn = 128 if n <= 128 or narrow or idle else 256
    _, consts = _gemm_launch({"a": Operand((m, k), esz)}, target, bm=128, bn=bn, n=n)
    if layout != "nt":
        consts["LAYOUT"] = layout
    tma_store = 2 if staged else 0
    # 3 ring stages when promoting into f32 C (its registers leave ptxas no room for a
    # fourth branch), else 4
    stages = 3 if promote and not tma_store else 4
    consts = {**consts, "BN": bn, "PERSISTENT": 1, "STAGES": stages, "PROMOTE": promote,
              **({"TMA_STORE": tma_store} if tma_store else {}), **a_rows(m, layout)}
    if "A_ROWS" in consts and not chosen:
        narrow = narrow_split(consts, n)
        if promote:          # promoted fp8 (never split in K): 48-wide blocks at any K
            short = DECODE_SHORT_K[:1] if promote == 1 else ()
        elif layout == "nt" and k <= DECODE_SHORT_MAX_K:    # (B's narrow rows K-major)
            short = DECODE_SHORT_K
        else:
            short = ()
        fits = [f for f in ({**c, "TN": -(-n // c["BN"])} for c in short)
                if cus // 2 < f["TN"] <= cus]
        if fits:
            consts = {**narrow, **fits[0]}
        # (promoted fp8 never splits K: there, from a quarter of the SMs, as measured)
        elif (cus // 4 if promote else cus // 2) < narrow["TN"] <= cus:
            consts = {**narrow, **DECODE_WHOLE_K}
    return gemm_ws_grid(consts, target), consts


# a decode step's few rows (A_ROWS) where NARROW_SPLIT's 64-wide blocks fill more than half
# the SMs and at most all of them (N = 4225 to 8448 on the H200; promoted fp8, which does
# not split K: more than a quarter, N = 2113 to 8448): each block over all of K with 12
# ring stages (96 KiB of B in flight a workgroup), instead of 128-wide blocks (split in K,
# for 16-bit operands). On the H200 (docs/PERF.md, 2026-12-04 seventh session) 1.09-1.30x
# the bf16 split at 1, 16 and 64 rows against 6144 x 4096, 8192 x 8192 and 8192 x 28672
# (run VC), 1.19-1.54x promoted e4m3's 128-wide blocks against N = 4096 to 8192 (run VH)
DECODE_WHOLE_K = {"BN": 64, "STAGES": 12, "MAP": "row-major"}
# a 16-bit decode step with B stored N x K and K at most DECODE_SHORT_MAX_K: the first of
# these widths whose blocks fill more than half the SMs and at most all (48: N = 3169 to
# 6336 on the H200; 32: N = 2113 to 3168), each block over all of K, instead of 128-wide
# blocks split in K (whose owners' waits and additions weigh most where each share of K
# is short) or DECODE_WHOLE_K's 64-wide ones. On the H200 (docs/PERF.md, 2026-12-04 seventh
# session run VE, eighth WD, WG) at 1, 16 and 64 rows: against 4096 x 4096, 48-wide blocks
# with 8 stages 1.04-1.06x 32-wide with 12, which ran 1.05-1.20x the split; against
# 6144 x 4096, 1.03-1.04x 64-wide with 12 stages; at K = 14336 both lose (48: 0.87-0.93x,
# 32: 0.79-0.87x the split). B stored K x N would give TMA rows of 96 or 64 bytes, which
# its 128-byte swizzle refuses. Promoted fp8, which never splits K, takes the 48-wide
# blocks at any K: 1.07-1.14x DECODE_WHOLE_K's 64-wide ones against 4096 x 4096 and 4096
# x 14336, 1.02-1.05x against 6144 x 4096 (run WJ)
DECODE_SHORT_K = ({"BN": 48, "STAGES": 8, "MAP": "row-major"},
                  {"BN": 32, "STAGES": 12, "MAP": "row-major"})
DECODE_SHORT_MAX_K = 4096


def a_rows(m: int, layout: str = "nt") -> dict:
    """gemm_ws's A_ROWS for A of m rows stored M x K where m <= 64 (a decode step's
    tokens): the power of two from 8 that holds them, so each K step copies no rows past
    A's ({} otherwise: a block's 128)."""
    if m > 64 or layout[0] != "n":
        return {}
    return {"A_ROWS": max(8, 1 << (m - 1).bit_length())}


def gemm_ws_grid(consts: dict, target) -> tuple[int]:
    """The grid of gemm_ws with these constants: persistent, at most one workgroup per SM
    over its TM x TN blocks; else one workgroup per block."""
    from ..targets import get
    blocks = consts["TM"] * consts["TN"]
    if not consts.get("PERSISTENT", 0):
        return (blocks,)
    n = consts.get("CLUSTER", 1)             # whole clusters
    return (min(blocks, get(target).num_cus // n * n),)


# gemm_ws constants gemm_sk does not take (it is persistent, 16-bit, one block a
# workgroup at a time); a launch using any of them otherwise stays gemm_ws
SK_FIXED = {"PERSISTENT": 1, "PROMOTE": 0, "PINGPONG": 0, "CLUSTER": 1}


def _blocks_and_steps(consts: dict, k: int, itemsize: int) -> tuple[int, int]:
    """(output blocks, K steps a block) of a gemm_ws launch over K = k: a K step is one
    128-byte row of each operand."""
    return consts["TM"] * consts["TN"], -(-k * itemsize // 128)


def gemm_sk_plan(consts: dict, target, k: int, itemsize: int = 2, grid: int | None = None):
    """(grid, constants, slots) of gemm_sk for the gemm_ws launch `consts` over K = k of
    `itemsize`-byte operands (the same blocks, order and pipeline; its last blocks, or all
    of them where they are fewer than the workgroups, split in K so every workgroup takes
    the same number of K steps), or None where gemm_sk does not apply (not persistent,
    promoted fp8, ping-pong, clusters, C staged whole) or nothing would split (the blocks
    fill whole rounds of the grid). gemm_sk's `part` then has 128 x slots rows of BN f32,
    `flags` 8 x slots i32 (zeros). `grid`: that many workgroups (default one an SM)."""
    from ..lang.schedule import StreamWalk
    from ..targets import get
    if any(consts.get(key, 0 if key != "CLUSTER" else 1) != v for key, v in SK_FIXED.items()) \
            or consts.get("TMA_STORE", 0) == 1:
        return None
    blocks, steps = _blocks_and_steps(consts, k, itemsize)
    grid = min(grid or get(target).num_cus, blocks * steps)     # every workgroup a K step
    slots = StreamWalk.slots(blocks, grid, steps)
    if not slots:
        return None
    return (grid,), {key: v for key, v in consts.items() if key not in SK_FIXED}, slots


# split-K (gemm_sk over fewer blocks than SMs) where at most half the SMs would have a
# block and each workgroup's share is at least this many K steps. On the H200
# (docs/PERF.md, 2026-12-04 fifth session, run TE) every measured product with at most
# half the SMs' blocks gained: M = 128 and 256 rows against the Llama layers, 1.06x to
# 1.87x gemm_ws, the shortest shares 15.5 K steps (128 x 4096 x 4096: 1.12x); with more
# blocks (and after whole rounds, stream-K) the split products ran slower
SPLIT_K_MIN_STEPS = 12


# split-K's blocks 64 wide where they split evenly and A's 128-row blocks are full: on the
# H200 (docs/PERF.md, 2026-12-04 sixth session, runs UH, UJ) 128 x 4096 x K against 128-wide
# blocks on even runs, K = 4096 / 8192 / 14336 / 28672: 1.03 (0.99 in UH), 1.06, 1.08
# (1.07), 1.02x; with 16 rows (A zero-filled past them) 0.96, 0.80, 0.82, 0.74x: not there
NARROW_SPLIT = {"BN": 64, "STAGES": 8, "MAP": "row-major"}


def gemm_split_k(consts: dict, target, k: int, itemsize: int = 2, m: int | None = None,
                 n: int | None = None):
    """gemm_sk_plan of the gemm_ws launch `consts` (of an m x n product, `nt` layout, where
    given) where the launch rule splits its blocks in K (SPLIT_K_MIN_STEPS), else None; on
    as many workgroups as split every block into equal runs (split_grid) where there are
    such, with NARROW_SPLIT's 64-wide blocks where those split evenly and m is a multiple
    of 128, and DECODE_SPLIT_STAGES ring stages for a decode step's (A_ROWS) 128-wide
    blocks."""
    from ..targets import get
    cus = get(target).num_cus
    blocks, steps = _blocks_and_steps(consts, k, itemsize)
    if blocks > cus // 2 or blocks * steps < SPLIT_K_MIN_STEPS * cus:
        return None
    if m is not None and m % 128 == 0 and consts["BN"] == 128 and \
            consts.get("LAYOUT", "nt") == "nt":
        narrow = narrow_split(consts, n)
        grid = split_grid(narrow["TM"] * narrow["TN"], steps, cus)
        if grid:
            return gemm_sk_plan(narrow, target, k, itemsize, grid=grid)
    if "A_ROWS" in consts and consts["BN"] == 128:
        consts = {**consts, "STAGES": DECODE_SPLIT_STAGES}
    return gemm_sk_plan(consts, target, k, itemsize, grid=split_grid(blocks, steps, cus))


# ring stages of a decode step's 128-wide blocks split in K (A_ROWS: a stage is 8 KiB of A
# and 16 of B): on the H200 (docs/PERF.md, 2026-12-04 seventh session, runs VC, VD) 1.03-
# 1.06x four stages at K = 14336 for 1, 16 and 64 rows against N = 4096, 0.96-1.03x at
# K = 4096
DECODE_SPLIT_STAGES = 6


def narrow_split(consts: dict, n: int) -> dict:
    """The gemm_ws launch `consts` of an N = n product with NARROW_SPLIT's 64-wide blocks
    (C from registers: no TMA_STORE)."""
    return {**{key: v for key, v in consts.items() if key != "TMA_STORE"}, **NARROW_SPLIT,
            "TN": -(-n // NARROW_SPLIT["BN"])}


def split_grid(blocks: int, steps: int, cus: int) -> int | None:
    """blocks x (cus // blocks) workgroups, as many runs a block as one workgroup a CU
    allows, where that many cut each block's `steps` K steps into equal runs (so no
    workgroup's run crosses from one block into the next); None where they do not, or
    where a block would get one run. On the H200 (docs/PERF.md,
    2026-12-04 sixth session, runs UF, UG) 128 workgroups for 32 blocks against the 132 of
    one a CU: 128 x 4096 x 4096 1.085-1.104x, 128 x 8192 x 28672 1.05x, 256 x 4096 x 14336
    1.04-1.05x, the others within 1.5%."""
    parts = cus // blocks
    return blocks * parts if parts > 1 and steps % parts == 0 else None


def _gemm_wgmma_launch(i, target):
    """TMA needs B's rows to be a multiple of 16 bytes; otherwise B goes through registers."""
    grid, consts = _gemm_launch(i, target)
    row_bytes = i["b"].shape[1] * rows.itemsize(i["b"])
    return grid, {**consts, "TMA": int(row_bytes % 16 == 0)}


def _ln_torch(t):
    x = t["x"]
    mu = x.mean(1, keepdim=True)
    var = ((x - mu) ** 2).mean(1, keepdim=True)
    return {"out": (x - mu) / (var + t["eps"]).sqrt() * t["w"] + t["b"]}


def _gemm_torch(t):
    return {"c": t["a"] @ t["b"]}


def _ws_inputs(shape, dtype, rng):
    return {"x": _rand(shape, dtype, rng), "out": np.zeros(shape, dtype.np)}


def _ws_ref(i):
    return {"out": 2.0 * _f64(i["x"])}


def _ws_torch(t):
    return {"out": 2.0 * t["x"]}


def _ws_launch(i, target):
    return (max(1, -(-i["x"].shape[1] // 64)),), {}


_SMALL = ((16, 64), (37, 100), (5, 300), (64, 256))
_LN_SMALL = _SMALL + ((9, 2000),)            # rows past one resident chunk
_NORM_SMALL = ((37, 300), (9, 2000))          # ragged: resident; split on 32-lane waves

KERNELS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec("scaled_add", scaled_add, _sa_inputs, _sa_ref, _sa_launch, ("out",),
               shapes=_SMALL, gpu_shapes=((8192, 8192),), compile_consts={"DT": "bf16"},
               torch_reference=_sa_torch),
    KernelSpec("softmax", softmax, _sm_inputs, _sm_ref, exact_row_launch, ("out",),
               shapes=_SMALL, gpu_shapes=((16384, 4096),), compile_consts={"DT": "bf16"},
               torch_reference=_sm_torch),
    KernelSpec("layernorm", layernorm, _ln_inputs, _ln_ref, ln_launch, ("out",),
               shapes=_LN_SMALL, gpu_shapes=((16384, 8192), (4096, 12288)),
               compile_consts={"DT": "bf16", "SPLIT": 1, "ROWS": 1, "N_MAX": 8192,
                               "CHUNK": 512, "num_waves": 4},       # 8192 columns' default
               torch_reference=_ln_torch),
    KernelSpec("rmsnorm", rmsnorm, _rms_inputs, lambda i: _rms_of(_f64(i["x"]), i),
               stats_launch, ("out", "rstd"), shapes=_NORM_SMALL,
               gpu_shapes=((16384, 8192), (4096, 12288)),
               compile_consts={"DT": "bf16", "RESIDENT": 1, "N_MAX": 1024, "CHUNK": 512},
               torch_reference=_rms_torch),
    KernelSpec("add_rmsnorm", add_rmsnorm, _add_rms_inputs, _add_rms_ref,
               lambda i, t: stats_launch(i, t, row_bytes=2 * rows.itemsize(i["x"])),
               ("out", "s", "rstd"), shapes=_NORM_SMALL, gpu_shapes=((16384, 8192),),
               compile_consts={"DT": "bf16", "RESIDENT": 1, "N_MAX": 1024, "CHUNK": 512},
               torch_reference=_add_rms_torch),
    KernelSpec("rmsnorm_bwd", rmsnorm_bwd, _rms_grad_inputs, _rms_grad_ref, rms_grad_launch,
               ("dx", "dw_part"), partials=("dw_part",), shapes=_NORM_SMALL,
               gpu_shapes=((16384, 8192),),
               compile_consts={"DT": "bf16", "RESIDENT": 1, "N_MAX": 512, "CHUNK": 512,
                               "RESIDUAL": 1},
               torch_reference=lambda t: _norm_grad_torch(t, False)),
    KernelSpec("layernorm_bwd", layernorm_bwd, _ln_grad_inputs, _ln_grad_ref, ln_grad_launch,
               ("dx", "part"), partials=("part",),
               shapes=_NORM_SMALL, gpu_shapes=((16384, 8192),),
               compile_consts={"DT": "bf16", "SPLIT": 1, "ROWS": 1, "N_MAX": 2048,
                               "CHUNK": 512, "num_waves": 4},
               torch_reference=lambda t: _norm_grad_torch(t, True)),
    KernelSpec("softmax_bwd", softmax_bwd, _sm_grad_inputs, _sm_grad_ref,
               softmax_grad_launch,
               ("dx",), shapes=_NORM_SMALL, gpu_shapes=((16384, 4096),),
               compile_consts={"DT": "bf16", "RESIDENT": 1, "N_MAX": 1024, "CHUNK": 512},
               torch_reference=_sm_grad_torch),
    KernelSpec("column_sum", column_sum, _cs_inputs, _cs_ref,
               lambda i, t: rows.column_sum_launch(i["part"].shape[1]), ("out",),
               shapes=((8, 300), (37, 1100)), gpu_shapes=((264, 8192),),
               compile_consts={"PT": "f32", "DT": "bf16"},
               torch_reference=lambda t: {"out": t["part"].sum(0)}),
    KernelSpec("rope", rope, _rope_inputs, _rope_ref, _rope_spec_launch, ("out",),
               shapes=((2, 5, 3, 64), (1, 7, 5, 80)), gpu_shapes=((8, 4096, 32, 128),),
               compile_consts={"DT": "bf16", "CT": "f32", "HALF": 64, "WIDTH": 64,
                               "HEADS": 32}, torch_reference=_rope_torch),
    KernelSpec("gemm_basic", gemm_basic, _gemm_inputs, _gemm_ref, _gemm_launch, ("c",),
               shapes=((64, 64, 64), (100, 70, 96), (128, 64, 160)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               tol={"bf16": 1e-5, "f16": 1e-5},     # exact products, f32 sums
               torch_reference=_gemm_torch),
    KernelSpec("gemm_wgmma", gemm_wgmma, _gemm_inputs, _gemm_ref, _gemm_wgmma_launch, ("c",),
               shapes=((64, 64, 64), (100, 70, 96), (128, 72, 160)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_torch,
               targets=("sm_90a",)),          # warpgroup MMA: Hopper
    KernelSpec("gemm_ws", gemm_ws, _gemm_nt_inputs, _gemm_nt_ref, gemm_ws_launch, ("c",),
               shapes=((128, 128, 128), (150, 200, 304), (64, 272, 96)),
               gpu_shapes=((4096, 4096, 4096),), dtypes=("bf16", "f16", "e4m3", "e5m2"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               # 16-bit: exact products, f32 sums; fp8: the default 1e-2 (without PROMOTE
               # the H200's fp8 wgmma accumulates with fewer bits: 1.3e-3 from float64 at
               # K = 4096, docs/PERF.md)
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_nt_torch,
               targets=("sm_90a",)),          # TMA + warpgroup MMA, warp-specialised: Hopper
    KernelSpec("gemm_sk", gemm_sk, _gemm_sk_inputs, _gemm_nt_ref,
               lambda i, t: _gemm_sk_plan_of(i, t)[:2], ("c",),
               shapes=((128, 128, 128), (150, 200, 304), (64, 272, 96)),
               gpu_shapes=((128, 4096, 14336),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "bf16", "TM": 32, "TN": 16,
                               "TMA_STORE": 2},
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_nt_torch,
               targets=("sm_90a",)),          # gemm_ws's pipeline: Hopper
    KernelSpec("gemm_pingpong", gemm_pingpong, _gemm_nt_inputs, _gemm_nt_ref,
               lambda i, t: gemm_pingpong_launch(i["a"].shape[0], i["b"].shape[0],
                                                 i["a"].shape[1], t),
               ("c",), shapes=((256, 256, 64), (300, 520, 72), (100, 70, 40)),
               gpu_shapes=((8192, 8192, 8192),), dtypes=("bf16", "f16"),
               compile_consts={"DT": "bf16", "OUT": "f32"},
               tol={"bf16": 1e-5, "f16": 1e-5}, torch_reference=_gemm_nt_torch,
               targets=("gfx942", "gfx950")),  # 8-wave ping-pong, MFMA, direct loads: CDNA
    KernelSpec("tma_scale", tma_scale, _ws_inputs, _ws_ref,
               lambda i, t: ((-(-i["x"].shape[0] // 64), -(-i["x"].shape[1] // 64)), {}),
               ("out",), shapes=((64, 64), (100, 136), (130, 72)),
               gpu_shapes=((8192, 4096),), compile_consts={"DT": "bf16"},
               dtypes=("bf16",),            # TMA rows must be multiples of 16 bytes
               torch_reference=_ws_torch, targets=("sm_90a",)),
    KernelSpec("ws_scale", ws_scale, _ws_inputs, _ws_ref, _ws_launch, ("out",),
               shapes=((150, 64), (37, 100), (256, 128)), gpu_shapes=((8192, 4096),),
               compile_consts={"DT": "bf16"}, torch_reference=_ws_torch,
               targets=("sm_90a",)),          # mbarriers and warp roles: Hopper
)}

__all__ = ["KERNELS", "KernelSpec", "Operand", "SK_FIXED", "check", "gemm_sk_plan",
           "gemm_split_k", "gemm_ws_dims", "gemm_ws_grid", "gemm_ws_launch",
           "ln_tma_consts", "rel_err", "row_launch", "stats_launch", "ln_launch",
           "ln_grad_launch", "rms_grad_launch", "rope_launch", "exact_row_launch",
           "softmax_grad_launch", "add_rmsnorm", "column_sum", "gemm_basic",
           "gemm_pingpong", "gemm_pingpong_launch", "gemm_pingpong_mx", "gemm_sk",
           "gemm_wgmma", "gemm_ws", "layernorm", "layernorm_bwd", "rmsnorm",
           "rmsnorm_bwd", "rope", "scaled_add", "softmax", "softmax_bwd", "tma_scale",
           "ws_scale"]
