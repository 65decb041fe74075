"""Row softmax over the last dim, numerically safe, and its backward. Rows held in registers
(rows.Rows: RESIDENT / SPLIT) are read once: the row max, then the sum of exponentials, then
the output, all from registers. Looped rows take two passes over column blocks: an online
max/sum pass (the loop carries the row max and the rescaled sum), then a write pass."""
import math

import pykittens as pk

from .rows import Feed, Rows

LOG2E = math.log2(math.e)


@pk.kernel(num_waves=4)
def softmax(x: pk.gl["DT", 2], out: pk.gl["DT", 2],
            DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 128,
            RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
            SPLIT: pk.const = 0, EXACT: pk.const = 0):
    """out = softmax(x) over each row; EXACT=1: held rows fit their windows (rows.Rows)."""
    rows = Rows(x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    xb = rows.hold(x, fill=-math.inf)
    if rows.held:
        m = pk.full(rows.row, -math.inf)
        for j in rows.blocks():
            pk.row_max(xb(j), into=m)
        m = rows.peak(m)
        s = pk.zeros(rows.row)
        for j in rows.blocks():
            pk.row_sum(pk.exp2((xb(j) - m) * LOG2E), into=s)
        inv = 1.0 / rows.total(s)
    else:
        m = pk.full(rows.row, -math.inf)    # running row max
        s = pk.zeros(rows.row)              # running sum of exp2((x - m) * log2 e)
        for j in rows.blocks():
            t = xb(j)
            m_new = pk.max(m, pk.row_max(t))
            s *= pk.exp2((m - m_new) * LOG2E)
            pk.row_sum(pk.exp2((t - m_new) * LOG2E), into=s)
            m.set(m_new)
        inv = 1.0 / s
    for j in rows.blocks():
        rows.store(out, pk.exp2((xb(j) - m) * LOG2E) * inv, j)


@pk.kernel(num_waves=4)
def softmax_bwd(y: pk.gl["DT", 2], dy: pk.gl["DT", 2], dx: pk.gl["DT", 2],
                DT: pk.const = None, ROWS: pk.const = 1, COLS: pk.const = 1024,
                RESIDENT: pk.const = 0, N_MAX: pk.const = 8192, CHUNK: pk.const = 512,
                SPLIT: pk.const = 0, STAGES: pk.const = 0, PROGRAMS: pk.const = 0,
                EXACT: pk.const = 0):
    """dx = y * (dy - sum(dy * y)) per row, from the forward's output y. STAGES >= 2: y and
    dy staged in shared memory by workgroups walking the rows (rows.Feed). EXACT as
    softmax's."""
    rows = Rows(y, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT)
    feed = Feed(rows, [y, dy], STAGES=STAGES, PROGRAMS=PROGRAMS)
    for (yb, dyb), _ in feed.walk(loop=bool(STAGES)):
        dot = pk.zeros(rows.row)
        for j in rows.blocks():
            pk.row_sum(yb(j) * dyb(j), into=dot)
        dot = rows.total(dot)
        for j in rows.blocks():
            rows.store(dx, yb(j) * (dyb(j) - dot), j)
