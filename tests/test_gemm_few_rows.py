"""gemm_ws and gemm_sk over A of a few rows (A_ROWS: a decode step's tokens): each K step
copies only A's rows and one consumer warpgroup multiplies. Run by the emulator against
float64 products computed here; a row of A left out, a stage row read before it was
written, or a K step lost shows in the product or as the emulator's error."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels import a_rows
from pykittens.kernels.gemm import gemm_sk, gemm_ws

from conftest import rel_err

pytestmark = pytest.mark.usefixtures("module_cache")


def _operands(rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(pk.bf16.np)
    b = rng.standard_normal((n, k)).astype(pk.bf16.np)
    return a, b, a.astype(np.float64) @ b.astype(np.float64).T


def _ws(rng, m, n, steps, rows, grid=2, bn=128, tma_store=2, **consts):
    a, b, want = _operands(rng, m, n, 64 * steps)
    out = pk.emulate(gemm_ws, grid=(grid,), target="sm_90a", a=a, b=b,
                     c=np.full((m, n), np.nan, pk.bf16.np), DT="bf16", OUT="bf16", BN=bn,
                     TM=-(-m // 128), TN=-(-n // bn), TMA_STORE=tma_store, STAGES=4,
                     PERSISTENT=1, A_ROWS=rows, **consts)
    return out["c"].astype(np.float64), want


@pytest.mark.parametrize("m, rows", [(16, 16), (40, 64), (5, 8), (64, 64), (24, 32)])
def test_a_of_few_rows(m, rows, rng):
    got, want = _ws(rng, m, 256, 3, rows)
    assert rel_err(got, want) < 1e-2


def test_a_of_few_rows_with_c_from_registers_over_many_steps(rng):
    """C from registers (TMA_STORE=0), 256-wide blocks, 9 K steps: the ring wraps twice."""
    got, want = _ws(rng, 16, 512, 9, 16, bn=256, tma_store=0)
    assert rel_err(got, want) < 1e-2


def test_rows_of_a_past_a_rows_are_left_out(rng):
    """A planted mistake the checks above would catch: A_ROWS below A's rows leaves rows
    16 .. 39 of C unwritten (the NaNs C starts as), while the first 16 are right."""
    got, want = _ws(rng, 40, 256, 3, 16)
    assert rel_err(got[:16], want[:16]) < 1e-2
    assert np.isnan(got[16:]).all()


@pytest.mark.parametrize("bn, tma_store, stages, grid, steps", [
    (128, 2, 4, 6, 9),      # 2 blocks of 9 steps over 6 workgroups: runs of 3
    (64, 0, 8, 8, 12),      # the narrow split: 4 blocks of 12 over 8, the ring wrapping
])
def test_split_k_over_a_of_few_rows(bn, tma_store, stages, grid, steps, rng):
    m, n = 16, 256
    a, b, want = _operands(rng, m, n, 64 * steps)
    tn = n // bn
    slots = pk.StreamWalk.slots(tn, grid, steps)
    out = pk.emulate(gemm_sk, grid=(grid,), target="sm_90a", a=a, b=b,
                     c=np.full((m, n), np.nan, pk.bf16.np),
                     part=np.full((slots * 128, bn), np.nan, np.float32),
                     flags=np.zeros(slots * 8, np.int32), DT="bf16", OUT="bf16", BN=bn,
                     TM=1, TN=tn, TMA_STORE=tma_store, STAGES=stages, A_ROWS=16)
    assert rel_err(out["c"].astype(np.float64), want) < 1e-2
    assert not out["flags"].any()


@pytest.mark.parametrize("consts, match", [
    ({"A_ROWS": 12}, "A_ROWS is 128, or a multiple of 8"),
    ({"A_ROWS": 96}, "A_ROWS is 128, or a multiple of 8"),
    ({"A_ROWS": 16, "TM": 2}, r"one row of blocks, TM = 1\); got A_ROWS=16 with TM=2"),
    ({"A_ROWS": 16, "LAYOUT": "tn"}, "from A stored M x K"),
    ({"A_ROWS": 16, "PINGPONG": 1, "TMA_STORE": 0}, "without PINGPONG"),
])
def test_a_rows_refusals(consts, match):
    a = np.zeros((16, 64), pk.bf16.np)
    b = np.zeros((128, 64), pk.bf16.np)
    base = {"DT": "bf16", "OUT": "bf16", "BN": 128, "TM": 1, "TN": 1, "STAGES": 4,
            "PERSISTENT": 1}
    with pytest.raises(pk.KernelError, match=match):
        pk.emulate(gemm_ws, grid=(1,), target="sm_90a", a=a, b=b,
                   c=np.zeros((16, 128), pk.bf16.np), **{**base, **consts})


def test_the_launch_rule_copies_only_a_decode_steps_rows():
    """gemm_ws_launch's A_ROWS: the power of two from 8 holding M where M <= 64 and A is
    stored M x K; none otherwise (a block's 128 rows)."""
    from pykittens.kernels import gemm_ws_launch
    from pykittens.ops.matmul import ws_operands
    assert [a_rows(m).get("A_ROWS") for m in (1, 8, 9, 16, 17, 33, 64, 65, 4096)] == \
        [8, 8, 16, 16, 32, 64, 64, None, None]
    assert a_rows(16, "tn") == {} and a_rows(16, "nn") == {"A_ROWS": 16}
    for layout, want in (("nt", 16), ("nn", 16), ("tn", None)):
        consts = gemm_ws_launch(ws_operands(layout, 16, 4096, 4096, 2), "sm_90a",
                                layout=layout)[1]
        assert consts.get("A_ROWS") == want


def test_linear_of_a_few_tokens_on_cpu_tensors():
    """pykittens.ops.linear at M = 16 (the launch rule's A_ROWS) against float64, forward
    and the input's gradient (dX = dY W: 16 rows again)."""
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(384, 256, generator=g) / 8).to(torch.bfloat16).requires_grad_()
    y = pko.linear(x, w)
    want = F.linear(x.double(), w.double())
    assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
    y.double().sum().backward()
    ones = torch.ones(16, 384, dtype=torch.float64)
    for got, want in ((x.grad, ones @ w.double()), (w.grad, ones.t() @ x.double())):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-2
