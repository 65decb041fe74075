"""LayerNorm forward, weight and bias optional (WEIGHT, BIAS), and with STATS=1 the mean and
1/std of every row (f32, rows 0 and 1 of `stats`) for the backward pass; statistics in f32
(the mean, then the centred sum of squares, so large means do not cancel). And its
backward, `layernorm_bwd`, with the RMSNorm backward's shared body `norm_backward`.

Schedules, chosen by compile-time constants:
- RESIDENT=1 / SPLIT=1: the row schedules of `rows.Rows` (rows read once into registers);
- TMA=1 (Hopper): the TMA unit copies each workgroup's rows (one per wave, up to N_MAX
  columns) into shared memory in CHUNK-wide boxes on one mbarrier; x is read once.
- otherwise: ROWS rows per wave, any width: one pass over column blocks of COLS for the
  statistics (block-wise merge), one for the output.
"""
import pykittens as pk

from .rows import ColumnSums, Feed, Rows, fused_column_sums


def _normalize(rows, x, xb, wv, bv, out, stats, eps, STATS):
    """Rows of x whose block j (an f32 tile) is `xb(j)`, one row per wave: one pass over the
    blocks sums d = x - k and d^2 for a shift k, the row's first element (so a large mean
    does not cancel: the sums are of deviations from a value of the row), giving the mean
    k + sum(d) / n and the variance sum(d^2) / n - (sum(d) / n)^2 with one reduction of
    the waves' sums; a second pass writes the output (times block j of the weight wv(j),
    plus the bias bv(j), each where given). Exact rows (Rows.exact) need no d outside the
    row masked (a select per element saved)."""
    k = pk.load(rows.row, x, (rows.r0, 0))
    s, q = pk.zeros(rows.row), pk.zeros(rows.row)
    for j in rows.blocks():
        d = rows.mask(xb(j) - k, j)
        pk.row_sum(d, into=s)
        pk.row_sum(d * d, into=q)
    s, q = rows.total(s), rows.total(q)          # one round of barriers for both
    shift = s / rows.n
    var = pk.max(q / rows.n - shift * shift, 0.0)
    mean, rstd = k + shift, pk.rsqrt(var + eps)
    _store_stats(rows, stats, mean, rstd, STATS)
    # 16-bit outputs: xhat = x rstd - mean rstd, one fused multiply-add (its rounding error,
    # about |mean| / std float32 ulps, is far below the output's); wider ones subtract first
    offset = -mean * rstd
    for j in rows.blocks():
        _store_affine(rows, out, lambda: pk.fma(xb(j), rstd, offset) if out.dtype.bits == 16
                      else (xb(j) - mean) * rstd, wv, bv, j)


def _store_affine(rows, out, normed, wv, bv, j):
    """Block j of out = normed() * wv(j) + bv(j) (each where given; both: one fused
    multiply-add); w and b are read first, so their loads are in flight during the math."""
    gamma = wv(j) if wv is not None else None
    beta = bv(j) if bv is not None else None
    y = normed()
    if gamma is not None and beta is not None:
        y = pk.fma(y, gamma, beta)
    elif gamma is not None:
        y = y * gamma
    elif beta is not None:
        y = y + beta
    rows.store(out, y, j)


def _store_stats(rows, stats, mean, rstd, STATS):
    if STATS:
        rows.store_rows(stats, mean, 0)
        rows.store_rows(stats, rstd, 1)


@pk.kernel(num_waves=4)
def layernorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], b: pk.gl["DT", 1], out: pk.gl["DT", 2],
              stats: pk.gl[pk.f32, 2], eps: pk.f32,
              DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128,
              RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
              TMA: pk.const = 0, PREFETCH: pk.const = 0, SPLIT: pk.const = 0,
              WEIGHT: pk.const = 1, BIAS: pk.const = 1, STATS: pk.const = 0,
              STAGES: pk.const = 0, PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """out = (x - mean) / sqrt(var + eps) * w + b per row (w, b: WEIGHT, BIAS); with STATS
    also stats[0] = mean and stats[1] = rstd = 1 / sqrt(var + eps), a column per row.
    EXACT=1: the launch rule's promise that held rows fit their windows (rows.Rows)."""
    if SPLIT or RESIDENT:
        rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
        feed = Feed(rows, [x], STAGES=STAGES, PROGRAMS=PROGRAMS)
        wv, bv = rows.vecs(w, WEIGHT, held=bool(STAGES)),\
            rows.vecs(b, BIAS, held=bool(STAGES))
        for (xb,), _ in feed.walk(loop=bool(STAGES)):
            _normalize(rows, x, xb, wv, bv, out, stats, eps, STATS)
        return
    if TMA:
        # Hopper: the TMA unit brings the workgroup's rows (one per wave) into one shared
        # tile, box by box (CHUNK columns x one row per wave), all completing one mbarrier;
        # x is read from memory once and the three passes run from shared memory.
        nw = pk.num_waves()
        boxes = N_MAX // CHUNK
        rows = Rows(x, 1, 0, 1, CHUNK, N_MAX, CHUNK)         # a row per wave, CHUNK blocks
        rows.unrolled = False                                # ... read by a runtime index
        staged = pk.empty(pk.st((boxes * nw, CHUNK), DT))    # box j: rows j*nw .. +nw
        landed = pk.mbarrier(boxes)
        r_first = pk.program_id(0) * nw
        with pk.if_(pk.wave_id() == 0):
            for j in pk.range(boxes):
                pk.tma_load(staged, x, (r_first, j * CHUNK), landed, rows=nw, at=j * nw)
        pk.wait(landed, 0)
        wave = pk.wave_id()
        wv, bv = rows.vecs(w, WEIGHT, held=False), rows.vecs(b, BIAS, held=False)
        _normalize(rows, x, lambda j: pk.load(rows.block, staged, (j * nw + wave, 0)), wv, bv,
                   out, stats, eps, STATS)
        return

    # Statistics in one pass over column blocks: each block's mean and centred sum of
    # squares, merged into the running ones (Chan et al.'s parallel update), so no large
    # mean ever cancels; then one more pass writes the output (mostly from L2).
    rows = Rows(x, 0, 0, ROWS, COLS, N_MAX, CHUNK)
    wv, bv = rows.vecs(w, WEIGHT), rows.vecs(b, BIAS)
    m_rows, n = rows.m, rows.n
    r0, tile = rows.r0, rows.block

    def block_at(c0, nxt):
        """Column block c0 of the rows; with PREFETCH it was loaded into `nxt` a step
        earlier, and the loads of the block after it are issued now (in flight during the
        math)."""
        if not PREFETCH:
            return pk.load(tile, x, (r0, c0))
        t = pk.empty(tile)
        t.set(nxt)
        pk.load(nxt, x, (r0, c0 + COLS))
        return t

    mu = pk.zeros(rows.row)
    m2 = pk.zeros(rows.row)
    nxt = pk.load(tile, x, (r0, 0)) if PREFETCH else None
    for j in pk.range(rows.nblocks):
        c0 = j * COLS
        t = block_at(c0, nxt)
        n_blk = pk.minimum(n - c0, COLS)
        mean_blk = pk.row_sum(t) / n_blk
        d = pk.mask_outside(t - mean_blk, (r0, c0), (m_rows, n))
        delta = mean_blk - mu
        share = n_blk / (c0 + n_blk)                  # this block's weight in the total
        mu += delta * share
        m2 += pk.row_sum(d * d) + delta * delta * (c0 * share)
    inv = pk.rsqrt(m2 / n + eps)
    _store_stats(rows, stats, mu, inv, STATS)

    nxt = pk.load(tile, x, (r0, 0)) if PREFETCH else None
    for j in pk.range(rows.nblocks):
        t = block_at(j * COLS, nxt)
        _store_affine(rows, out, lambda: (t - mu) * inv, wv, bv, j)


def norm_backward(rows, xb, dyb, wv, mu, rs, dx, dws, dbs, extra=None):
    """The gradients of a LayerNorm (mu given) or RMSNorm (mu None) over the rows a wave
    holds, whose block j of x and dy is xb(j) / dyb(j): with xhat = (x - mu) * rs (RMSNorm:
    x * rs) and g = dy * w,

        dx = rs * (g - mean(g) - xhat * mean(g * xhat))     (RMSNorm: no mean(g) term)

    plus extra(j) (the gradient of a residual sum the forward also returned), and the
    per-column contributions dy * xhat and dy added into `dws` / `dbs` (ColumnSums or
    None). `wv(j)` is block j of the weight (rows.vecs), None without one; mu and rs the
    forward's mean and rstd per row. Padding reads as zero in x and dy, so it adds nothing
    to any sum."""
    center = mu is not None
    # 16-bit dx: xhat = x rs - mu rs, one fused multiply-add, as the forward forms it (its
    # rounding error, about |mu| / std float32 ulps, is far below dx's); wider ones subtract
    fused = center and dx.dtype.bits == 16
    offset = -mu * rs if fused else None

    def xhat(j):
        if fused:
            return pk.fma(xb(j), rs, offset)
        return (xb(j) - mu) * rs if center else xb(j) * rs

    def g(j):
        return dyb(j) * wv(j) if wv is not None else dyb(j)

    gx = pk.zeros(rows.row)
    gs = pk.zeros(rows.row) if center else None
    for j in rows.blocks():
        gj = g(j)
        pk.row_sum(gj * xhat(j), into=gx)
        if center:
            pk.row_sum(gj, into=gs)
    gx, gs = rows.total(gx), rows.total(gs) if center else None   # one round of barriers
    # dx = g rs - a rs - xhat (c rs), c = mean(g xhat), a = mean(g): two fused multiply-adds
    # an element, the products of the row's scalars made once
    c_rs = -(gx / rows.n) * rs
    a_rs = -(gs / rows.n) * rs if center else None
    for j in rows.blocks():
        xh = xhat(j)
        t = pk.fma(g(j), rs, a_rs) if center else g(j) * rs
        d = pk.fma(xh, c_rs, t)
        if extra is not None:
            d = d + extra(j)
        rows.store(dx, d, j)
        if dws is not None:
            dws.add_product(dyb(j), xh, j)
        if dbs is not None:
            dbs.add(dyb(j), j)


def dbias_column(n):
    """The column of `part` where layernorm_bwd's dbias sums start after dweight's n: n
    rounded up to 16 (n itself for the usual widths), an offset the compiler sees is a
    multiple of 16 elements though n is a run-time value, so dbias's partial rows leave in
    16-byte stores as dweight's do (at n itself they went out in 4-byte pieces, which cost
    the H200 10 µs at 4096x12288, docs/PERF.md). An int for an int n, a traced value for
    a traced one."""
    return (n + 15) // 16 * 16


@pk.kernel(num_waves=4)
def layernorm_bwd(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                  stats: pk.gl[pk.f32, 2], dx: pk.gl["DT", 2], part: pk.gl[pk.f32, 2],
                  DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                  RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
                  SPLIT: pk.const = 0, WEIGHT: pk.const = 1, DW: pk.const = 1,
                  DB: pk.const = 1, STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
                  EXACT: pk.const = 0):
    """dx of layernorm (stats from its STATS=1 run), and per-workgroup partial column sums
    of dy * xhat (DW: dweight) and of dy (DB: dbias) side by side in `part` for
    rows.column_sum: dweight's in columns 0..n-1, dbias's from dbias_column(n) (column 0
    when DW=0), so `part` has dbias_column(n) + n columns with both. Workgroups walk the
    rows in steps of the grid (rows.Rows.steps), so `part` has one row per workgroup (per
    wave when the rows are looped: rows.ColumnSums.partial_rows); STAGES >= 2 stages x and
    dy in shared memory (rows.Feed). EXACT=1: held rows of exactly N_MAX columns
    (rows.Rows)."""
    layernorm_backward(x, dy, w, stats, dx, part, ROWS, COLS, RESIDENT, N_MAX, CHUNK,
                       SPLIT, WEIGHT, DW, DB, STAGES, PROGRAMS, EXACT)


@pk.kernel(num_waves=4)
def layernorm_bwd_fused(x: pk.gl["DT", 2], dy: pk.gl["DT", 2], w: pk.gl["DT", 1],
                        stats: pk.gl[pk.f32, 2], dx: pk.gl["DT", 2], part: pk.gl[pk.f32, 2],
                        dweight: pk.gl["DT", 1], dbias: pk.gl["DT", 1],
                        flags: pk.gl[pk.i32, 1], DT: pk.const = None, ROWS: pk.const = 1,
                        COLS: pk.const = 1024, RESIDENT: pk.const = 0,
                        N_MAX: pk.const = 8192, CHUNK: pk.const = 512, SPLIT: pk.const = 0,
                        WEIGHT: pk.const = 1, DW: pk.const = 1, DB: pk.const = 1,
                        STAGES: pk.const = 0, PROGRAMS: pk.const = 0, EXACT: pk.const = 0):
    """layernorm_bwd with its column sums added up in the same launch (rows.
    fused_column_sums: a grid-wide barrier, so every workgroup must be resident at
    once): dweight and dbias (DW, DB) written directly, `part` scratch, `flags` two i32
    zeros (left zero)."""
    layernorm_backward_fused(x, dy, w, stats, dx, part, dweight, dbias, flags, ROWS, COLS,
                             RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, DW, DB, STAGES, PROGRAMS,
                             EXACT)


def layernorm_backward_fused(x, dy, w, stats, dx, part, dweight, dbias, flags, ROWS, COLS,
                             RESIDENT, N_MAX, CHUNK, SPLIT, WEIGHT, DW, DB, STAGES, PROGRAMS,
                             EXACT, mark=None) -> None:
    """layernorm_bwd_fused's body; mark as layernorm_backward's, and "met" / "summed" of
    rows.fused_column_sums (called with the rows as the other events are)."""
    rows = layernorm_backward(x, dy, w, stats, dx, part, ROWS, COLS, RESIDENT, N_MAX, CHUNK,
                              SPLIT, WEIGHT, DW, DB, STAGES, PROGRAMS, EXACT, mark)
    first = dbias_column(rows.n) if DW else 0
    fused_column_sums(([(part, dweight, 0)] if DW else []) +
                      ([(part, dbias, first)] if DB else []), flags,
                      None if mark is None else (lambda event: mark(event, rows)))


def layernorm_backward(x, dy, w, stats, dx, part, ROWS, COLS, RESIDENT, N_MAX, CHUNK, SPLIT,
                       WEIGHT, DW, DB, STAGES, PROGRAMS, EXACT, mark=None) -> Rows:
    """layernorm_bwd's body, for the kernels that add to it (its rows returned): mark(event,
    rows), where given, is called by every wave at "started" (the walk), "stepped" (after
    each step's rows), "walked" and "stored" (its partial rows), e.g. to stamp a timeline
    (bench/rows_timeline.py)."""
    mark = mark or _no_mark
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    dws = ColumnSums(rows, part) if DW else None
    dbs = ColumnSums(rows, part, first=dbias_column(rows.n) if DW else 0) if DB else None
    wv = rows.vecs(w, WEIGHT)
    feed = Feed(rows, [x, dy], per_row=[(stats, 0), (stats, 1)], STAGES=STAGES,
                PROGRAMS=PROGRAMS)
    mark("started", rows)
    for (xb, dyb), (mu, rs) in feed.walk():
        norm_backward(rows, xb, dyb, wv, mu, rs, dx, dws, dbs)
        mark("stepped", rows)
    mark("walked", rows)
    for sums in (dws, dbs):
        if sums is not None:
            sums.finish()
    mark("stored", rows)
    return rows


def _no_mark(event, rows) -> None:
    """A backward body's mark where the kernel marks nothing."""
