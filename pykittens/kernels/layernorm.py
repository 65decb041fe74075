"""LayerNorm forward with weight and bias; statistics in f32 (mean, then the centred sum of
squares, so large means do not cancel)."""
import pykittens as pk


@pk.kernel(num_waves=4)
def layernorm(x: pk.gl["DT", 2], w: pk.gl["DT", 1], b: pk.gl["DT", 1], out: pk.gl["DT", 2],
              eps: pk.f32, DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128):
    m_rows, n = x.shape
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
