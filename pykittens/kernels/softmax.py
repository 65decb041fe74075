"""Row softmax over the last dim, numerically safe, in two passes over column blocks:
an online max/sum pass (the loop carries the row max and the rescaled sum), then a write pass."""
import math

import pykittens as pk

LOG2E = math.log2(math.e)


@pk.kernel(num_waves=4)
def softmax(x: pk.gl["DT", 2], out: pk.gl["DT", 2],
            DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128):
    n = x.shape[1]
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * ROWS
    tile = pk.rt((ROWS, COLS), pk.f32)
    row = pk.rv(tile, "row")
    m = pk.full(row, -math.inf)          # running row max
    s = pk.zeros(row)                    # running sum of exp2((x - m) * log2 e)
    blocks = (n + COLS - 1) // COLS
    for j in pk.range(blocks):
        t = pk.load(tile, x, (r0, j * COLS), fill=-math.inf)
        m_new = pk.max(m, pk.row_max(t))
        s *= pk.exp2((m - m_new) * LOG2E)
        pk.row_sum(pk.exp2((t - m_new) * LOG2E), into=s)
        m.set(m_new)
    inv = 1.0 / s
    for j in pk.range(blocks):
        t = pk.load(tile, x, (r0, j * COLS), fill=-math.inf)
        pk.store(out, pk.exp2((t - m) * LOG2E) * inv, (r0, j * COLS))
