"""Rotary position embedding (RoPE) of (batch, seq, heads, head_dim) tensors, forward and
backward (the inverse rotation), in f32 and rounded once.

The first 2 * HALF columns of each head rotate in pairs, by the angle whose cosine and sine
are row p of the tables (p: the token's position, its index in the sequence unless a
positions tensor gives it); the columns after them pass through unchanged:

- INTERLEAVED=0 (GPT-NeoX): pair i is (i, i + HALF): out_i = x_i c_i - x_{i+HALF} s_i,
  out_{i+HALF} = x_{i+HALF} c_i + x_i s_i; tables (positions, HALF).
- INTERLEAVED=1 (GPT-J): pair i is (2i, 2i + 1), the same formula; tables (positions,
  2 * HALF) holding each angle twice (c_0 c_0 c_1 c_1 ...): a lane holds both columns of a
  pair (pk.xor_cols) but not the table entry of another column.

A wave rotates HEADS heads of one token; a workgroup's waves take consecutive tokens. The
grid is one axis over (token group, block of heads) pairs: HEADS_FIRST=1 walks the blocks of
heads of a token group before the next group, so consecutive workgroups stream consecutive
memory; 0 walks the token groups of one block of heads first."""
import pykittens as pk

from .rows import WAVES


@pk.kernel(num_waves=4)
def rope(x: pk.gl["DT", 4], cos: pk.gl["CT", 2], sin: pk.gl["CT", 2],
         pos: pk.gl[pk.i32, 2], out: pk.gl["DT", 4], DT: pk.const = None,
         CT: pk.const = None, HALF: pk.const = 32, WIDTH: pk.const = 32,
         HEADS: pk.const = 64, INTERLEAVED: pk.const = 0, INVERSE: pk.const = 0,
         POSITIONS: pk.const = 0, PASS: pk.const = 0, HEADS_FIRST: pk.const = 1):
    """out = RoPE(x) (INVERSE=1: the inverse rotation, which is the gradient); pos (batch,
    seq) gives each token's position with POSITIONS=1. WIDTH: a power of two >= the rotated
    columns of a tile (HALF, or 2 * HALF interleaved)."""
    nb, ns, nh, nd = x.shape
    blocks = (nh + HEADS - 1) // HEADS
    if HEADS_FIRST:
        group, block = pk.program_id(0) // blocks, pk.program_id(0) % blocks
    else:
        groups = (nb * ns + pk.num_waves() - 1) // pk.num_waves()
        group, block = pk.program_id(0) % groups, pk.program_id(0) // groups
    token = group * pk.num_waves() + pk.wave_id()
    b, s = token // ns, token % ns
    p = pos[b, s] if POSITIONS else s
    tile = pk.rt((HEADS, WIDTH), pk.f32)
    c = pk.load(pk.rv(tile, "col"), cos, (p, 0))
    sn = pk.load(pk.rv(tile, "col"), sin, (p, 0))
    if INVERSE:
        sn = -sn
    rd = 2 * HALF
    h = block * HEADS                                        # this wave's block of heads
    if INTERLEAVED:
        t = pk.load(tile, x, (b, s, h, 0), end=(None, None, None, rd))
        partner = pk.xor_cols(t, 1)                          # x_{2i+1} at 2i and back
        cols = pk.col_index(t)
        even = pk.xor_cols(cols, 1) > cols
        pk.store(out, t * c + pk.where(even, -partner, partner) * sn, (b, s, h, 0),
                 end=(None, None, None, rd))
    else:
        lo = pk.load(tile, x, (b, s, h, 0), end=(None, None, None, HALF))
        hi = pk.load(tile, x, (b, s, h, HALF), end=(None, None, None, rd))
        pk.store(out, lo * c - hi * sn, (b, s, h, 0), end=(None, None, None, HALF))
        pk.store(out, hi * c + lo * sn, (b, s, h, HALF), end=(None, None, None, rd))
    if PASS:
        for k in pk.range((nd - rd + WIDTH - 1) // WIDTH):
            c0 = rd + k * WIDTH
            pk.store(out, pk.load(tile, x, (b, s, h, c0)), (b, s, h, c0))


# A wave's (heads x columns) tile: 512 elements (8 heads of a 128-wide head, 80 registers)
# against 2048 (32 heads, 234 registers: two workgroups per SM) took the H200 from 94 / 92 /
# 90% to 96 / 95 / 94% of copy bandwidth at 16384x8192 / 16384x4096 / 4096x12288 bf16, and
# walking the blocks of heads first (HEADS_FIRST) from 89 / 92 / 83% to 94 / 92 / 90% with
# the larger tile (bench/ops_bandwidth.py variants, docs/PERF.md).
TILE_ELEMS = 512
HEADS_FIRST = 1          # the grid's order (see the module docstring)


def rope_launch(shape, half: int, interleaved: bool, target: str, **consts):
    """(grid, consts) of rope for x of `shape` (batch, seq, heads, head_dim) rotating the
    first 2 * half columns of each head."""
    from ..targets import get
    nb, ns, nh, nd = shape
    rot = 2 * half if interleaved else half
    width = max(8, 1 << (rot - 1).bit_length())
    heads = min(1 << max(0, nh - 1).bit_length(), max(1, TILE_ELEMS // width))
    # a lane must hold runs of 8 columns (pk.xor_cols): a tile of at least a wave's sweep
    heads = max(heads, -(-get(target).wave_size * 8 // width))
    return (max(1, -(-nb * ns // WAVES)) * -(-nh // heads),), {
        "HALF": half, "WIDTH": width, "HEADS": heads, "INTERLEAVED": int(interleaved),
        "PASS": int(2 * half < nd), "HEADS_FIRST": HEADS_FIRST, **consts}
