"""LayerNorm, RMSNorm, and the residual add fused with RMSNorm, as differentiable torch
operators over the library's row kernels (layernorm, rmsnorm, add_rmsnorm; layernorm_bwd,
rmsnorm_bwd, with column_sum adding up the weight and bias gradients)."""
from __future__ import annotations

import functools
import math

import torch

from ..ir.types import dtype_of
from ..kernels import ln_launch, ln_grad_launch, rms_grad_launch, stats_launch
from ..kernels.layernorm import dbias_column, layernorm, layernorm_bwd, layernorm_bwd_fused
from ..kernels.rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_bwd, rmsnorm_bwd_fused
from ..kernels import rows as row_kernels
from ..kernels.rows import ColumnSums, column_sum, column_sum_launch
from .run import (check_same, check_tensor, custom_op, kernel_output, placeholder, replayable,
                  run, target_of, workspace, zeroed_buffer)

F32 = torch.float32


# The launch rules (kernels.stats_launch) pick a forward norm's schedule from its shape; on
# Hopper the ops then check the compiled build's registers (a choice the launch rules,
# which never compile, cannot make)
SPLIT_MORE_PROGRAMS_BELOW = 3    # split rows sharing an SM with fewer workgroups: try one more
SPLIT_SPILL_BYTES = 16           # ... if ptxas spills at most this many bytes a lane


@functools.lru_cache(maxsize=256)
def _fits(kernel, target: str, consts: tuple, dtype: str):
    """(registers, spill bytes) of a build by ptxas' report, or None without ptxas."""
    from .. import compiler
    from ..toolchain.tools import ToolMissing
    try:
        r = compiler.report(kernel, target, DT=dtype, **dict(consts))
    except ToolMissing:
        return None
    return r["registers"], r["spill_bytes"]


def split_programs(kernel, target: str, consts: dict, dtype) -> dict:
    """`consts` of a forward norm's split-row launch, with PROGRAMS raised where that
    helps on Hopper: a row split over many waves leaves fewer than
    SPLIT_MORE_PROGRAMS_BELOW workgroups on an SM by its registers (one row in flight
    each), one more fits the SM's warp slots, and a build capped for it
    (pk.programs_per_cu) spills at most SPLIT_SPILL_BYTES a lane by ptxas' report. On the
    H200 (docs/PERF.md): rms_norm 87 -> 91% of copy bandwidth at 4096x12288 (three
    workgroups of 12 warps, no spills; run AP), add_rms_norm 89 -> 92% there with a cap
    spilling 16 bytes (run AP) and layer_norm 83 -> 89% with one spilling 16 (the night's
    run AS); caps spilling more were slower (layer_norm 76 -> 65% at 160 bytes,
    add_rms_norm 95 -> 74% at 82). Unchanged elsewhere, and without ptxas (the choice needs
    the compiled register counts)."""
    from ..targets import get
    from ..targets.sm90a import REGISTERS_PER_SM
    t = get(target)
    if t.family != "hopper" or not consts.get("SPLIT") or consts.get("PROGRAMS"):
        return consts
    dtype = dtype_of(dtype).name
    base = _fits(kernel, target, tuple(sorted(consts.items())), dtype)
    if base is None:
        return consts
    warps = consts["num_waves"]
    per_warp = -(-base[0] * t.wave_size // 256) * 256       # allocated in 256-register units
    resident = REGISTERS_PER_SM // (warps * per_warp)
    slots = t.max_waves_per_simd * t.simds_per_cu           # warps an SM holds
    if not 1 <= resident < SPLIT_MORE_PROGRAMS_BELOW or (resident + 1) * warps > slots:
        return consts
    more = {**consts, "PROGRAMS": resident + 1}
    fit = _fits(kernel, target, tuple(sorted(more.items())), dtype)
    return more if fit is not None and fit[1] <= SPLIT_SPILL_BYTES else consts


def _rows(op: str, x, normalized_shape, **params):
    """x as (rows, n) for a norm over its last dims `normalized_shape`, and the weight and
    bias (`params`, None where absent) as (n,); every mismatch an error naming it."""
    check_tensor(op, "input", x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else \
        tuple(int(d) for d in normalized_shape)
    if not shape or x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"{op}: normalized_shape {list(shape)} must be the last dims of "
                         f"input {tuple(x.shape)}")
    n = math.prod(shape)
    flat = {}
    for name, t in params.items():
        if t is not None:
            check_tensor(op, name, t)
            if tuple(t.shape) != shape:
                raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} but "
                                 f"normalized_shape is {list(shape)}")
            t = t.reshape(n)
        flat[name] = t
    check_same(op, input=x, **params)
    return x.reshape(-1, n), flat


def _column_sums(x, grid, consts, n: int, wanted: bool, gaps: bool = False,
                 fused: bool = False):
    """The partial-sum buffer of a backward kernel (zeroed where looped rows add into it,
    or where columns between two sums are never written: `gaps`), or a placeholder; made
    so that the call can be replayed. One the walk writes whole for column_sum to read is
    a kernel_output; a fused walk reads its own back (which kernel_output's rule forbids)
    and leaves nothing in it for later, so it gets the stream's scratch."""
    if not wanted:
        return placeholder(x, 2, F32)
    rows = ColumnSums.partial_rows(grid[0], consts)
    held = consts.get("RESIDENT") or consts.get("SPLIT")
    if held and not gaps:
        return workspace(x, "norm_bwd.part", (rows, n), F32, zeroed=False) if fused else \
            kernel_output(x, (rows, n), F32)
    return zeroed_buffer(x, (rows, n), F32)


def _column_sum(part, like, wanted: bool):
    """part's column sums in like's dtype (empty when not wanted)."""
    out = like.new_empty((part.shape[1] if wanted else 0,))
    if wanted:
        grid, consts = column_sum_launch(part.shape[1], part.shape[0],
                                         DISCARD=int(row_kernels.DISCARD_PARTS))
        run(column_sum, {"part": part, "out": out}, grid, consts, ("out",))
    return out


def _barrier_flags(x):
    """The two flags a fused backward's workgroups meet on (rows.fused_column_sums): zero
    before its launch and after, kept per stream."""
    return workspace(x, "norm_bwd.flags", (2,), torch.int32)


def _grad_rows(dy, x):
    """dy as the backward kernels read it: x's shape, unit stride in its last dim."""
    return torch.zeros_like(x) if dy is None else dy.contiguous()


# ---- layer_norm ------------------------------------------------------------------------------

@custom_op("pykittens::layer_norm")
def _layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The output, and each row's mean and 1/std (rows 0 and 1 of a (2, rows) tensor)."""
    m, n = x.shape
    y, stats = x.new_empty((m, n)), kernel_output(x, (2, m), F32)
    if x.numel() == 0:
        return y, stats
    target = target_of(x)
    grid, consts = stats_launch({"x": x}, target, launch=ln_launch)
    consts = split_programs(layernorm, target, {**consts, "WEIGHT": int(weight is not None),
                                                "BIAS": int(bias is not None)}, x.dtype)
    run(layernorm, {"x": x, "w": placeholder(x, 1) if weight is None else weight,
                    "b": placeholder(x, 1) if bias is None else bias, "out": y,
                    "stats": stats, "eps": eps}, grid, consts, ("out", "stats"))
    return y, stats


@_layer_norm.register_fake
def _(x, weight, bias, eps):
    m, n = x.shape
    return x.new_empty((m, n)), x.new_empty((2, m), dtype=F32)


@custom_op("pykittens::layer_norm_bwd")
def _layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                    stats: torch.Tensor, dw: bool, db: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """dx, and the gradients asked for one after the other in one tensor: dweight (dw),
    then dbias (db) from _dbias_at(n, dw) on; _sums_width(n, dw, db) elements."""
    m, n = x.shape
    dx = x.new_empty((m, n))
    width = _sums_width(n, dw, db)
    if x.numel() == 0:
        return dx, x.new_zeros((width,))
    target = target_of(x)
    grid, consts = ln_grad_launch({"x": x, "dy": dy}, target, dw, db)
    fused = width > 0 and row_kernels.fuses_sums(grid[0], consts, target)
    part = _column_sums(x, grid, consts, width, width > 0,
                        gaps=dw and db and dbias_column(n) != n and not fused, fused=fused)
    args = {"x": x, "dy": dy, "w": placeholder(x, 1) if weight is None else weight,
            "stats": stats, "dx": dx, "part": part}
    consts = {**consts, "WEIGHT": int(weight is not None), "DW": int(dw), "DB": int(db)}
    if not fused:
        run(layernorm_bwd, args, grid, consts, ("dx", "part"))
        return dx, _column_sum(part, x, width > 0)
    sums = kernel_output(x, (width,))          # dweight, then dbias from _dbias_at(n, dw)
    first = _dbias_at(n, dw)
    run(layernorm_bwd_fused, {**args, "dweight": sums[:n] if dw else placeholder(x, 1),
                              "dbias": sums[first:first + n] if db else placeholder(x, 1),
                              "flags": _barrier_flags(x)},
        grid, consts, ("dx", "dweight", "dbias"))
    return dx, sums


@_layer_norm_bwd.register_fake
def _(dy, x, weight, stats, dw, db):
    return x.new_empty(x.shape), x.new_empty((_sums_width(x.shape[1], dw, db),))


def _dbias_at(n: int, dw: bool) -> int:
    """Where dbias starts among layer_norm_bwd's sums (kernels.layernorm.dbias_column)."""
    return dbias_column(n) if dw else 0


def _sums_width(n: int, dw: bool, db: bool) -> int:
    """Elements of layer_norm_bwd's sums: dweight's n, then dbias's n from _dbias_at."""
    return _dbias_at(n, dw) + n if db else n * dw


def _ln_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)          # no zeros made (and launched) for the stats


def _ln_backward(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    dw = weight is not None and ctx.needs_input_grad[1]
    db = ctx.has_bias and ctx.needs_input_grad[2]
    dx, sums = _layer_norm_bwd(_grad_rows(dy, x), x, weight, stats, dw, db)
    n = x.shape[1]
    at = _dbias_at(n, dw)
    return dx, sums[:n] if dw else None, sums[at:at + n] if db else None, None


_layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


@replayable
def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """torch.nn.functional.layer_norm: normalise over the last dims `normalized_shape`
    (an int or a sequence) to zero mean and unit variance (biased), then scale by weight
    and shift by bias (each optional, of shape normalized_shape). float32, bfloat16 or
    float16, weight and bias in input's dtype; statistics in float32. Differentiable in
    input, weight and bias."""
    x, p = _rows("layer_norm", input, normalized_shape, weight=weight, bias=bias)
    return _layer_norm(x, p["weight"], p["bias"], float(eps))[0].view(input.shape)


# ---- rms_norm, add_rms_norm ------------------------------------------------------------------

def _rms_eps(x, eps):
    """torch's default: the machine epsilon of the float32 the statistics are computed in."""
    return torch.finfo(F32).eps if eps is None else float(eps)


def _rms_forward(kernel, x, tensors: dict, weight, eps, outputs):
    """Launch or emulate a forward RMSNorm kernel with its statistics."""
    m = x.shape[0]
    rstd = kernel_output(x, (m,), F32)
    if x.numel():
        row_bytes = (2 if "residual" in tensors else 1) * x.itemsize
        target = target_of(x)
        grid, consts = stats_launch({"x": x}, target, row_bytes=row_bytes)
        consts = split_programs(kernel, target, {**consts, "WEIGHT": int(weight is not None)},
                                x.dtype)
        run(kernel, {"x": x, **tensors, "w": placeholder(x, 1) if weight is None else weight,
                     "rstd": rstd, "eps": eps}, grid, consts, outputs + ("rstd",))
    return rstd


@custom_op("pykittens::rms_norm")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.new_empty(x.shape)
    return y, _rms_forward(rmsnorm, x, {"out": y}, weight, eps, ("out",))


@_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty((x.shape[0],), dtype=F32)


@custom_op("pykittens::add_rms_norm")
def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, s = x.new_empty(x.shape), x.new_empty(x.shape)
    rstd = _rms_forward(add_rmsnorm, x, {"residual": residual, "out": y, "s": s}, weight, eps,
                        ("out", "s"))
    return y, s, rstd


@_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty((x.shape[0],), dtype=F32)


@custom_op("pykittens::rms_norm_bwd")
def _rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                  rstd: torch.Tensor, ds: torch.Tensor | None, dw: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """dx (plus ds, the gradient reaching a fused add's sum directly), and dweight where
    asked for (else empty)."""
    m, n = x.shape
    dx = x.new_empty((m, n))
    if x.numel() == 0:
        return dx, x.new_zeros((n if dw else 0,))
    target = target_of(x)
    grid, consts = rms_grad_launch({"x": x, "dy": dy, "ds": ds}, target, ds is not None, dw)
    consts = {**consts, "WEIGHT": int(weight is not None)}
    fused = dw and row_kernels.fuses_sums(grid[0], consts, target)
    part = _column_sums(x, grid, consts, n, dw, fused=fused)
    args = {"x": x, "dy": dy, "w": placeholder(x, 1) if weight is None else weight,
            "rstd": rstd, "ds": placeholder(x, 2) if ds is None else ds, "dx": dx,
            "dw_part": part}
    if not fused:
        run(rmsnorm_bwd, args, grid, {**consts, "DW": int(dw)}, ("dx", "dw_part"))
        return dx, _column_sum(part, x, dw)
    dweight = kernel_output(x, (n,))
    run(rmsnorm_bwd_fused, {**args, "dweight": dweight,
                            "flags": _barrier_flags(x)},
        grid, consts, ("dx", "dweight"))
    return dx, dweight


@_rms_norm_bwd.register_fake
def _(dy, x, weight, rstd, ds, dw):
    return x.new_empty(x.shape), x.new_empty((x.shape[1] if dw else 0,))


def _rms_setup(ctx, inputs, output):
    x, weight = inputs[0], inputs[-2]
    ctx.fused = len(inputs) == 4                         # add_rms_norm: x, residual, w, eps
    s = output[1] if ctx.fused else x
    ctx.save_for_backward(s, weight, output[-1])
    ctx.mark_non_differentiable(output[-1])
    # an unused output's gradient comes as None, not zeros: none made for rstd, and an
    # unused sum's adds nothing (RESIDUAL=0) rather than a tensor of zeros read in full
    ctx.set_materialize_grads(False)


def _rms_backward(ctx, dy, *rest):
    s, weight, rstd = ctx.saved_tensors
    ds = rest[0] if ctx.fused else None
    dw = weight is not None and ctx.needs_input_grad[-2]
    dx, gw = _rms_norm_bwd(_grad_rows(dy, s), s, weight, rstd,
                           None if ds is None else ds.contiguous(), dw)
    gw = gw if dw else None
    return (dx, dx, gw, None) if ctx.fused else (dx, gw, None)


for _op in (_rms_norm, _add_rms_norm):
    _op.register_autograd(_rms_backward, setup_context=_rms_setup)


@replayable
def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    """torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) over the last dims
    `normalized_shape`, times weight (optional, of shape normalized_shape); eps=None is
    torch's default, torch.finfo(torch.float32).eps (the statistics are float32).
    float32, bfloat16 or float16. Differentiable in input and weight."""
    x, p = _rows("rms_norm", input, normalized_shape, weight=weight)
    return _rms_norm(x, p["weight"], _rms_eps(x, eps))[0].view(input.shape)


@replayable
def add_rms_norm(x, residual, weight, eps: float | None = None):
    """The residual stream of a pre-norm block in one pass over memory: s = x + residual
    (rounded to their dtype, as the unfused sum is), then rms_norm(s, (n,), weight, eps)
    over the last dim. Returns (normalised output, s). weight may be None. Differentiable
    in x, residual (both get the same gradient) and weight."""
    check_tensor("add_rms_norm", "x", x)
    check_tensor("add_rms_norm", "residual", residual)
    if residual.shape != x.shape:
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} must have x's "
                         f"shape {tuple(x.shape)}")
    check_same("add_rms_norm", x=x, residual=residual)
    n = x.shape[-1]
    x2, p = _rows("add_rms_norm", x, (n,), weight=weight)
    y, s, _ = _add_rms_norm(x2, residual.reshape(-1, n), p["weight"], _rms_eps(x2, eps))
    return y.view(x.shape), s.view(x.shape)
