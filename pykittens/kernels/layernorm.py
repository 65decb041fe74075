"""LayerNorm forward with weight and bias; statistics in f32 (mean, then the centred sum of
squares, so large means do not cancel).

Two schedules, chosen by a compile-time constant:
- RESIDENT=1: each wave keeps one whole row in registers in its storage type (up to N_MAX
  elements), so x is read from memory exactly once; the statistics and the output are
  computed block by block from the registers (pk.subtile), converting to f32 on the fly.
- RESIDENT=0: ROWS rows per wave, three passes over column blocks of COLS (any width).
"""
import pykittens as pk


@pk.kernel(num_waves=4)
def layernorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], b: pk.gl["DT", 1], out: pk.gl["DT", 2],
              eps: pk.f32, DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128,
              RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512):
    m_rows, n = x.shape
    if RESIDENT:
        r0 = pk.program_id(0) * pk.num_waves() + pk.wave_id()
        xr = pk.load(pk.rt((1, N_MAX), DT), x, (r0, 0))       # the row, read once
        tile = pk.rt((1, CHUNK), pk.f32)
        row, col = pk.rv(tile, "row"), pk.rv(tile, "col")

        def block(j):                                          # f32 copy of one block
            return pk.subtile(xr, (0, j * CHUNK), (1, CHUNK)).cast(pk.f32)

        total = pk.zeros(row)
        for j in pk.static_range(N_MAX // CHUNK):
            pk.row_sum(block(j), into=total)
        mean = total / n
        sq = pk.zeros(row)
        for j in pk.static_range(N_MAX // CHUNK):
            d = pk.mask_outside(block(j) - mean, (r0, j * CHUNK), (m_rows, n))
            pk.row_sum(d * d, into=sq)
        rstd = pk.rsqrt(sq / n + eps)
        for j in pk.static_range(N_MAX // CHUNK):
            gamma = pk.load(col, w, (j * CHUNK,))
            beta = pk.load(col, b, (j * CHUNK,))
            pk.store(out, (block(j) - mean) * rstd * gamma + beta, (r0, j * CHUNK))
        return

    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * ROWS
    tile = pk.rt((ROWS, COLS), pk.f32)
    row, col = pk.rv(tile, "row"), pk.rv(tile, "col")
    blocks = (n + COLS - 1) // COLS

    total = pk.zeros(row)
    for j in pk.range(blocks):
        pk.row_sum(pk.load(tile, x, (r0, j * COLS)), into=total)
    mean = total / n

    sq = pk.zeros(row)
    for j in pk.range(blocks):
        d = pk.mask_outside(pk.load(tile, x, (r0, j * COLS)) - mean, (r0, j * COLS), (m_rows, n))
        pk.row_sum(d * d, into=sq)
    rstd = pk.rsqrt(sq / n + eps)

    for j in pk.range(blocks):
        t = pk.load(tile, x, (r0, j * COLS))
        gamma = pk.load(col, w, (j * COLS,))
        beta = pk.load(col, b, (j * COLS,))
        pk.store(out, (t - mean) * rstd * gamma + beta, (r0, j * COLS))
