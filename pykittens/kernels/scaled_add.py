"""out = alpha * x + y, elementwise over 2-D tensors: the smallest complete pykittens kernel."""
import pykittens as pk


@pk.kernel(num_waves=4)
def scaled_add(x: pk.gl["DT", 2], y: pk.gl["DT", 2], out: pk.gl["DT", 2], alpha: pk.f32,
               DT: pk.const = None, ROWS: pk.const = 4, COLS: pk.const = 64):
    # Each wave owns a ROWS x COLS tile; workgroups tile the rows, grid axis 1 the columns.
    r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * ROWS
    c0 = pk.program_id(1) * COLS
    tile = pk.rt((ROWS, COLS), pk.f32)
    a = pk.load(tile, x, (r0, c0))
    b = pk.load(tile, y, (r0, c0))
    pk.store(out, a * alpha + b, (r0, c0))
