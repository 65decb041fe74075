"""One wave computes C (32x32) = A (32xK) @ Bt (32xK)^T, K stepped by BK in a loop, with the
accumulator pinned on a0..a15 and the operand tiles on v200..v207 and v216..v223, so the MFMAs
run on those registers. Bt is stored N x K, so both operand tiles load contiguous runs.
Used by docs/targets/cdna.md."""
import pykittens as pk


@pk.kernel(num_waves=1)
def pinned_gemm(a: pk.gl[pk.bf16, (32, None)], bt: pk.gl[pk.bf16, (32, None)],
                c: pk.gl[pk.f32, (32, 32)], BK: pk.const = 32):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    ta = pk.empty(pk.rt((32, BK), pk.bf16, role="a", pin="v200"))
    tb = pk.empty(pk.rt((32, BK), pk.bf16, role="b", layout="row", pin="v216"))
    for k in pk.range(a.shape[1] // BK):
        pk.load(ta, a, (0, k * BK))
        pk.load(tb, bt, (0, k * BK))
        pk.mma_ABt(acc, ta, tb)
    pk.store(c, acc)
