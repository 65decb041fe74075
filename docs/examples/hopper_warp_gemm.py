"""One warp computes C (32x32) = A (32xK) @ Bt (32xK)^T with warp-level mma.sync, K stepped by
BK in a loop: docs/examples/pinned_gemm.py without the pins, for any operand type the target's
matrix instructions take (bf16, f16; e4m3, e5m2 on sm_90a and gfx950). Bt is stored N x K, so
both operand tiles load contiguous runs. Used by docs/targets/hopper.md."""
import pykittens as pk


@pk.kernel(num_waves=1)
def warp_gemm(a: pk.gl["DT", (32, None)], bt: pk.gl["DT", (32, None)],
              c: pk.gl[pk.f32, (32, 32)], DT: pk.const = None, BK: pk.const = 32):
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
    ta = pk.empty(pk.rt((32, BK), DT, role="a"))
    tb = pk.empty(pk.rt((32, BK), DT, role="b", layout="row"))
    for k in pk.range(a.shape[1] // BK):
        pk.load(ta, a, (0, k * BK))
        pk.load(tb, bt, (0, k * BK))
        pk.mma_ABt(acc, ta, tb)
    pk.store(c, acc)
