"""RMSNorm forward, alone or fused with the residual add before it, and its backward; on
the row schedules of `rows.Rows` (statistics in f32)."""
import pykittens as pk

from .layernorm import _no_mark, _store_affine, norm_backward
from .rows import ColumnSums, Feed, Rows, fused_column_sums


def _rms(rows, sb, wv, out, rstd_out, eps, STATS):
    """out = s * rstd * w for rows whose block j is sb(j) (wv(j): block j of w, or None),
    rstd = 1 / sqrt(mean(s^2) + eps)."""
    sq = pk.zeros(rows.row)
    for j in rows.blocks():
        t = sb(j)
        pk.row_sum(t * t, into=sq)
    rstd = pk.rsqrt(rows.total(sq) / rows.n + eps)
    if STATS:
        rows.store_rows(rstd_out, rstd)
    for j in rows.blocks():
        _store_affine(rows, out, lambda: sb(j) * rstd, wv, None, j)


@pk.kernel(num_waves=4)
def rmsnorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], out: pk.gl["DT", 2],
            rstd: pk.gl[pk.f32, 1], eps: pk.f32, DT: pk.const = None, ROWS: pk.const = 1,
            COLS: pk.const = 1024, RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
            CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
            STATS: pk.const = 0, STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
            EXACT: pk.const = 0):
    """out = x / sqrt(mean(x^2) + eps) * w per row (w: WEIGHT); with STATS also rstd =
    1 / sqrt(mean(x^2) + eps) per row. STAGES >= 2: x staged in shared memory (rows.Feed).
    EXACT=1: the launch rule's promise that held rows fit their windows (rows.Rows)."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    feed = Feed(rows, [x], STAGES=STAGES, PROGRAMS=PROGRAMS)
    wv = rows.vecs(w, WEIGHT, held=bool(STAGES))
    for (xb,), _ in feed.walk(loop=bool(STAGES)):
        _rms(rows, xb, wv, out, rstd, eps, STATS)


@pk.kernel(num_waves=4)
def add_rmsnorm(x: pk.gl["DT", 2], residual: pk.gl["DT", 2], w: pk.gl["DT", 1],
                out: pk.gl["DT", 2], s: pk.gl["DT", 2], rstd: pk.gl[pk.f32, 1], eps: pk.f32,
                DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
                SPLIT: pk.const = 0, WEIGHT: pk.const = 1, STATS: pk.const = 0,
                STAGES: pk.const = 0, PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """s = x + residual (rounded to DT, as the unfused sum would be) and out = rmsnorm(s)
    in one pass: the residual stream of a pre-norm transformer block. EXACT as rmsnorm's."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    wv = rows.vecs(w, WEIGHT, held=bool(STAGES))
    feed = Feed(rows, [x, residual], STAGES=STAGES, PROGRAMS=PROGRAMS)
    for (xb, rb), _ in feed.walk(loop=bool(STAGES)):
        if rows.held:
            held = [(xb(j) + rb(j)).cast(DT) for j in pk.static_range(rows.nblocks)]
            for j in pk.static_range(rows.nblocks):
                rows.store(s, held[j], j)
            _rms(rows, lambda j: held[j].cast(pk.f32), wv, out, rstd, eps, STATS)
        else:
            for j in rows.blocks():   # looped rows: s goes to memory first, read back below
                pk.store(s, (xb(j) + rb(j)).cast(DT), rows.at(j))
            _rms(rows, rows.hold(s), wv, out, rstd, eps, STATS)


@pk.kernel(num_waves=4)
def rmsnorm_bwd(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                rstd: pk.gl[pk.f32, 1], ds: pk.gl["DT", 2], dx: pk.gl["DT", 2],
                dw_part: pk.gl[pk.f32, 2], DT: pk.const = None, ROWS: pk.const = 1,
                COLS: pk.const = 1024, RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
                DW: pk.const = 1, RESIDUAL: pk.const = 0, STAGES: pk.const = 0,
                PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """dx of rmsnorm (rstd from its STATS=1 run; x is add_rmsnorm's s when fused), plus ds
    with RESIDUAL=1 (the gradient reaching add_rmsnorm's s output directly), and partial
    column sums of dy * xhat in dw_part (DW), as layernorm_bwd; EXACT as its."""
    rmsnorm_backward(x, dy, w, rstd, ds, dx, dw_part, ROWS, COLS, RESIDENT, N_MAX, CHUNK,
                     SPLIT, WEIGHT, DW, RESIDUAL, STAGES, PROGRAMS, EXACT)


@pk.kernel(num_waves=4)
def rmsnorm_bwd_fused(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                      rstd: pk.gl[pk.f32, 1], ds: pk.gl["DT", 2], dx: pk.gl["DT", 2],
                      dw_part: pk.gl[pk.f32, 2], dweight: pk.gl["DT", 1],
                      flags: pk.gl[pk.i32, 1], DT: pk.const = None, ROWS: pk.const = 1,
                      COLS: pk.const = 1024, RESIDENT: pk.const = 0, N_MAX: pk.const = 8192,
                      CHUNK: pk.const = 512, SPLIT: pk.const = 0, WEIGHT: pk.const = 1,
                      RESIDUAL: pk.const = 0, STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
                      EXACT: pk.const = 0):
    """rmsnorm_bwd (DW=1) with its column sums added up in the same launch, as
    layernorm_bwd_fused: dweight written directly, dw_part scratch, flags two i32 zeros."""
    rmsnorm_backward_fused(x, dy, w, rstd, ds, dx, dw_part, dweight, flags, ROWS, COLS,
                           RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, RESIDUAL, STAGES, PROGRAMS,
                           EXACT)


def rmsnorm_backward_fused(x, dy, w, rstd, ds, dx, dw_part, dweight, flags, ROWS, COLS,
                           RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, RESIDUAL, STAGES, PROGRAMS,
                           EXACT, mark=None) -> None:
    """rmsnorm_bwd_fused's body; mark as layernorm_backward_fused's."""
    rows = rmsnorm_backward(x, dy, w, rstd, ds, dx, dw_part, ROWS, COLS, RESIDENT, N_MAX,
                            CHUNK, SPLIT, WEIGHT, 1, RESIDUAL, STAGES, PROGRAMS, EXACT, mark)
    fused_column_sums([(dw_part, dweight, 0)], flags,
                      None if mark is None else (lambda event: mark(event, rows)))


def rmsnorm_backward(x, dy, w, rstd, ds, dx, dw_part, ROWS, COLS, RESIDENT, N_MAX, CHUNK,
                     SPLIT, WEIGHT, DW, RESIDUAL, STAGES, PROGRAMS, EXACT, mark=None) -> Rows:
    """rmsnorm_bwd's body, for the kernels that add to it (its rows returned); mark as
    layernorm_backward's."""
    mark = mark or _no_mark
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    dws = ColumnSums(rows, dw_part) if DW else None
    wv = rows.vecs(w, WEIGHT)
    # ds is used once per element: staged with the others, or else read where it is added
    staged_ds = RESIDUAL and STAGES
    feed = Feed(rows, [x, dy] + ([ds] if staged_ds else []), per_row=[(rstd, None)],
                STAGES=STAGES, PROGRAMS=PROGRAMS)
    mark("started", rows)
    for blocks, (rs,) in feed.walk():
        extra = None
        if RESIDUAL:
            extra = blocks[2] if staged_ds else (lambda j: pk.load(rows.block, ds, rows.at(j)))
        norm_backward(rows, blocks[0], blocks[1], wv, None, rs, dx, dws, None, extra=extra)
        mark("stepped", rows)
    mark("walked", rows)
    if dws is not None:
        dws.finish()
    mark("stored", rows)
    return rows
