"""RMSNorm forward, alone or fused with the residual add before it, and its backward; on
the row schedules of `rows.Rows` (statistics in f32)."""
import pykittens as pk

from .layernorm import _store_affine, norm_backward
from .rows import ColumnSums, Rows


def _rms(rows, sb, w, out, rstd_out, eps, WEIGHT, STATS):
    """out = s * rstd * w for rows whose block j is sb(j), rstd = 1 / sqrt(mean(s^2) + eps)."""
    sq = pk.zeros(rows.row)
    for j in rows.blocks():
        t = sb(j)
        pk.row_sum(t * t, into=sq)
    rstd = pk.rsqrt(rows.total(sq) / rows.n + eps)
    if STATS:
        rows.store_rows(rstd_out, rstd)
    for j in rows.blocks():
        _store_affine(rows, out, lambda: sb(j) * rstd, w, None, j, WEIGHT, 0)


@pk.kernel(num_waves=4)
def rmsnorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], out: pk.gl["DT", 2],
            rstd: pk.gl[pk.f32, 1], eps: pk.f32, DT: pk.const = None, ROWS: pk.const = 1,
            COLS: pk.const = 1024, RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
            CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
            STATS: pk.const = 0):
    """out = x / sqrt(mean(x^2) + eps) * w per row (w: WEIGHT); with STATS also rstd =
    1 / sqrt(mean(x^2) + eps) per row."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK)
    _rms(rows, rows.hold(x), w, out, rstd, eps, WEIGHT, STATS)


@pk.kernel(num_waves=4)
def add_rmsnorm(x: pk.gl["DT", 2], residual: pk.gl["DT", 2], w: pk.gl["DT", 1],
                out: pk.gl["DT", 2], s: pk.gl["DT", 2], rstd: pk.gl[pk.f32, 1], eps: pk.f32,
                DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
                SPLIT: pk.const = 0, WEIGHT: pk.const = 1, STATS: pk.const = 0):
    """s = x + residual (rounded to DT, as the unfused sum would be) and out = rmsnorm(s)
    in one pass: the residual stream of a pre-norm transformer block."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK)
    xb, rb = rows.hold(x), rows.hold(residual)
    if rows.held:
        held = [(xb(j) + rb(j)).cast(DT) for j in pk.static_range(rows.nblocks)]
        for j in pk.static_range(rows.nblocks):
            pk.store(s, held[j], rows.at(j))
        _rms(rows, lambda j: held[j].cast(pk.f32), w, out, rstd, eps, WEIGHT, STATS)
        return
    for j in rows.blocks():        # looped rows: s goes to memory first, read back below
        pk.store(s, (xb(j) + rb(j)).cast(DT), rows.at(j))
    _rms(rows, rows.hold(s), w, out, rstd, eps, WEIGHT, STATS)


@pk.kernel(num_waves=4)
def rmsnorm_bwd(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                rstd: pk.gl[pk.f32, 1], ds: pk.gl["DT", 2], dx: pk.gl["DT", 2],
                dw_part: pk.gl[pk.f32, 2], DT: pk.const = None, ROWS: pk.const = 1,
                COLS: pk.const = 1024, RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
                DW: pk.const = 1, RESIDUAL: pk.const = 0):
    """dx of rmsnorm (rstd from its STATS=1 run; x is add_rmsnorm's s when fused), plus ds
    with RESIDUAL=1 (the gradient reaching add_rmsnorm's s output directly), and partial
    column sums of dy * xhat in dw_part (DW), as layernorm_bwd."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK)
    dws = ColumnSums(rows, dw_part) if DW else None
    wv = rows.vecs(w) if WEIGHT else None
    for i in pk.range(rows.steps()):
        rows.step(i)
        # read where it is added, block by block: each element is used once
        extra = (lambda j: pk.load(rows.block, ds, rows.at(j))) if RESIDUAL else None
        norm_backward(rows, x, dy, wv, rstd, dx, dws, None, 0, extra=extra)
    if dws is not None:
        dws.finish()
