"""LayerNorm forward with weight and bias; statistics in f32 (mean, then the centred sum of
squares, so large means do not cancel).

Three schedules, chosen by compile-time constants:
- TMA=1 (Hopper): the TMA unit copies each workgroup's rows (one per wave, up to N_MAX
  columns) into shared memory in CHUNK-wide boxes on one mbarrier; x is read once.
- RESIDENT=1: each wave keeps one whole row in registers in its storage type (up to N_MAX
  elements), so x is read from memory exactly once; the statistics and the output are
  computed block by block from the registers (pk.subtile), converting to f32 on the fly.
- SPLIT=1: ROWS rows per workgroup, split across its waves (N_MAX // num_waves columns
  each), held in registers: rows too long for one wave's registers are still read once;
  pk.workgroup_sum combines the waves' partial sums.
- RESIDENT=0: ROWS rows per wave, any width: one pass over column blocks of COLS for the
  statistics (block-wise merge), one for the output.
"""
import pykittens as pk


def _normalize(block, nblocks, loop, r0, x, w, b, out, eps, tile, c0=0,
               combine=lambda v: v):
    """A row held in blocks (shared memory or registers): `block(j)` is its column block j
    (columns c0 + j * cols ..) as an f32 `tile`; two passes over the blocks give the mean
    and the centred sum of squares, a third writes the output. `loop` is pk.range or
    pk.static_range; `combine` joins partial sums when the row is split across waves."""
    m_rows, n = x.shape
    cols = tile.shape[1]
    row, col = pk.rv(tile, "row"), pk.rv(tile, "col")
    total = pk.zeros(row)
    for j in loop(nblocks):
        pk.row_sum(block(j), into=total)
    mean = combine(total) / n
    sq = pk.zeros(row)
    for j in loop(nblocks):
        d = pk.mask_outside(block(j) - mean, (r0, c0 + j * cols), (m_rows, n))
        pk.row_sum(d * d, into=sq)
    rstd = pk.rsqrt(combine(sq) / n + eps)
    for j in loop(nblocks):
        gamma = pk.load(col, w, (c0 + j * cols,))
        beta = pk.load(col, b, (c0 + j * cols,))
        pk.store(out, (block(j) - mean) * rstd * gamma + beta, (r0, c0 + j * cols))


def _from_registers(r0, c0, shape, DT, CHUNK, x, w, b, out, eps, combine=lambda v: v):
    """The `shape` block of x at (r0, c0) read once into registers in its storage type, then
    normalised CHUNK columns at a time (pk.subtile), converted to f32 on the fly."""
    rows = shape[0]
    xr = pk.load(pk.rt(shape, DT), x, (r0, c0))
    _normalize(lambda j: pk.subtile(xr, (0, j * CHUNK), (rows, CHUNK)).cast(pk.f32),
               shape[1] // CHUNK, pk.static_range, r0, x, w, b, out, eps,
               pk.rt((rows, CHUNK), pk.f32), c0=c0, combine=combine)


@pk.kernel(num_waves=4)
def layernorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], b: pk.gl["DT", 1], out: pk.gl["DT", 2],
              eps: pk.f32, DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128,
              RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
              TMA: pk.const = 0, PREFETCH: pk.const = 0, SPLIT: pk.const = 0):
    m_rows, n = x.shape
    if SPLIT:
        span = N_MAX // pk.num_waves()                       # this wave's share of a row
        _from_registers(pk.program_id(0) * ROWS, pk.wave_id() * span, (ROWS, span), DT,
                        CHUNK, x, w, b, out, eps, combine=pk.workgroup_sum)
        return
    if TMA:
        # Hopper: the TMA unit brings the workgroup's rows (one per wave) into one shared
        # tile, box by box (CHUNK columns x one row per wave), all completing one mbarrier;
        # x is read from memory once and the three passes run from shared memory.
        nw = pk.num_waves()
        boxes = N_MAX // CHUNK
        r_first = pk.program_id(0) * nw
        rows = pk.empty(pk.st((boxes * nw, CHUNK), DT))      # box j: rows j*nw .. +nw
        landed = pk.mbarrier(boxes)
        with pk.if_(pk.wave_id() == 0):
            for j in pk.range(boxes):
                pk.tma_load(rows, x, (r_first, j * CHUNK), landed, rows=nw, at=j * nw)
        pk.wait(landed, 0)
        wave = pk.wave_id()
        tile = pk.rt((1, CHUNK), pk.f32)
        _normalize(lambda j: pk.load(tile, rows, (j * nw + wave, 0)), boxes, pk.range,
                   r_first + wave, x, w, b, out, eps, tile)
        return
    if RESIDENT:
        _from_registers(pk.program_id(0) * pk.num_waves() + pk.wave_id(), 0, (1, N_MAX), DT,
                        CHUNK, x, w, b, out, eps)
        return

    # Statistics in one pass over column blocks: each block's mean and centred sum of
    # squares, merged into the running ones (Chan et al.'s parallel update), so no large
    # mean ever cancels; then one more pass writes the output (mostly from L2).
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * ROWS
    tile = pk.rt((ROWS, COLS), pk.f32)
    row, col = pk.rv(tile, "row"), pk.rv(tile, "col")
    blocks = (n + COLS - 1) // COLS

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

    mean = pk.zeros(row)
    m2 = pk.zeros(row)
    nxt = pk.load(tile, x, (r0, 0)) if PREFETCH else None
    for j in pk.range(blocks):
        c0 = j * COLS
        t = block_at(c0, nxt)
        n_blk = pk.minimum(n - c0, COLS)
        mean_blk = pk.row_sum(t) / n_blk
        d = pk.mask_outside(t - mean_blk, (r0, c0), (m_rows, n))
        delta = mean_blk - mean
        share = n_blk / (c0 + n_blk)                  # this block's weight in the total
        mean += delta * share
        m2 += pk.row_sum(d * d) + delta * delta * (c0 * share)
    rstd = pk.rsqrt(m2 / n + eps)

    nxt = pk.load(tile, x, (r0, 0)) if PREFETCH else None
    for j in pk.range(blocks):
        t = block_at(j * COLS, nxt)
        gamma = pk.load(col, w, (j * COLS,))
        beta = pk.load(col, b, (j * COLS,))
        pk.store(out, (t - mean) * rstd * gamma + beta, (r0, j * COLS))
