"""gemm_ws and gemm_sk over A of a few rows (A_ROWS: a decode step's tokens): each K step
copies only A's rows and one consumer warpgroup multiplies. Run by the emulator against
float64 products computed here; a row of A left out, a stage row read before it was
written, or a K step lost shows in the product or as the emulator's error."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
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
                     TM=-(-m // 128), TN=-(-n // bn), TMA_STORE=tma_store,
                     **{"STAGES": 4, "PERSISTENT": 1, "A_ROWS": rows, **consts})
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


def test_the_decode_build_of_64_wide_blocks_over_all_of_k(rng):
    """kernels.DECODE_WHOLE_K's build (64-wide blocks, 12 ring stages, C from registers)
    over 16 rows: 3 blocks of 14 K steps on 2 workgroups, so the ring wraps in a block and
    a workgroup takes a second block."""
    from pykittens.kernels import DECODE_WHOLE_K
    got, want = _ws(rng, 16, 192, 14, 16, bn=DECODE_WHOLE_K["BN"], tma_store=0,
                    **{key: v for key, v in DECODE_WHOLE_K.items() if key != "BN"})
    assert rel_err(got, want) < 1e-2


def test_the_launch_rule_takes_64_wide_blocks_over_all_of_k_for_a_decode_step():
    """Where a decode step's 64-wide blocks fill more than half the SMs and at most all
    (N = 4225 .. 8448 on 132), each takes all of K; 128-wide blocks (split where few) on
    either side, for 128 rows, and where the caller chose the width."""
    from pykittens.kernels import DECODE_WHOLE_K, gemm_split_k, gemm_ws_launch
    from pykittens.ops.matmul import ws_operands

    def rule(m, n, k=8192, **kw):
        return gemm_ws_launch(ws_operands("nt", m, k, n, 2), "sm_90a", **kw)
    for n in (4352, 6144, 8192, 8448):
        (grid,), consts = rule(16, n)
        assert {key: consts[key] for key in DECODE_WHOLE_K} == DECODE_WHOLE_K
        assert consts["TN"] == -(-n // 64) == grid and "TMA_STORE" not in consts
        assert gemm_split_k(consts, "sm_90a", 8192, m=16, n=n) is None
    for m, n, kw in ((16, 4096, {}), (16, 8704, {}), (128, 8192, {}), (16, 8192, {"bn": 128})):
        assert rule(m, n, **kw)[1]["BN"] >= 128     # (4096 at K = 8192: split 128-wide)


@pytest.mark.parametrize("width", [0, 1])
def test_the_decode_builds_of_narrow_blocks_over_a_short_k(width, rng):
    """kernels.DECODE_SHORT_K's builds (48- and 32-wide blocks, 8 and 12 ring stages, C
    from registers) over 40 rows (A_ROWS 64): 14 K steps a block, a second block for a
    workgroup."""
    from pykittens.kernels import DECODE_SHORT_K
    plan = DECODE_SHORT_K[width]
    got, want = _ws(rng, 40, 4 * plan["BN"], 14, 64, bn=plan["BN"], tma_store=0,
                    **{key: v for key, v in plan.items() if key != "BN"})
    assert rel_err(got, want) < 1e-2


def test_the_launch_rule_takes_narrow_blocks_over_a_short_k_for_a_decode_step():
    """A 16-bit decode step with K at most DECODE_SHORT_MAX_K takes the first of
    DECODE_SHORT_K's widths whose blocks fill more than half the SMs and at most all (48:
    N = 3169 .. 6336 on 132; 32: N = 2113 .. 3168), over all of K (no split); a longer K,
    N past them (64-wide, DECODE_WHOLE_K), 128 rows, B stored K x N and promoted fp8 keep
    their rules (the last: test_promoted_fp8_decode_steps_take_narrow_blocks...)."""
    from pykittens.kernels import (DECODE_SHORT_K, DECODE_SHORT_MAX_K, DECODE_WHOLE_K,
                                   Operand, gemm_split_k, gemm_ws_launch)
    from pykittens.ops.matmul import ws_operands

    def rule(m, n, k):
        return gemm_ws_launch(ws_operands("nt", m, k, n, 2), "sm_90a")
    for m, n, k, plan in ((1, 4096, 4096, 0), (64, 6144, 4096, 0), (16, 6336, 2048, 0),
                          (16, 3168, 4096, 1), (16, 2176, 4096, 1)):
        want = DECODE_SHORT_K[plan]
        (grid,), consts = rule(m, n, k)
        assert {key: consts[key] for key in want} == want
        assert consts["TN"] == -(-n // want["BN"]) == grid and "TMA_STORE" not in consts
        assert gemm_split_k(consts, "sm_90a", k, m=m, n=n) is None
    assert rule(16, 8192, 4096)[1]["BN"] == DECODE_WHOLE_K["BN"]
    assert rule(16, 6144, DECODE_SHORT_MAX_K + 64)[1]["BN"] == DECODE_WHOLE_K["BN"]
    for m, n, k in ((16, 4096, DECODE_SHORT_MAX_K + 64), (16, 2048, 4096), (128, 4096, 4096)):
        assert rule(m, n, k)[1]["BN"] >= 128
    fp8 = gemm_ws_launch({"a": Operand((16, 2560), 1), "b": Operand((2560, 2560), 1),
                          "c": Operand((16, 2560), 2)}, "sm_90a")[1]
    assert fp8["BN"] == 64 and fp8["PROMOTE"] == 1      # (no 32-wide promoted blocks)
    # B stored K x N: narrow blocks' rows would be 96 or 64 bytes, which TMA's swizzle
    # refuses
    nn = gemm_ws_launch(ws_operands("nn", 16, 4096, 4096, 2), "sm_90a", layout="nn")[1]
    assert nn["BN"] >= 64
    compiler.llvm_ir(gemm_ws, "sm_90a", DT="bf16", OUT="bf16", **nn)


def test_promoted_fp8_decode_steps_take_narrow_blocks_wherever_they_fit():
    """Promoted e4m3 does not split K: a decode step's 48-wide blocks over all of K where
    they fill more than half the SMs and at most all (N = 3169 .. 6336 on 132), at any K,
    else 64-wide ones where those fill more than a quarter (N = 2113 .. 8448), still
    promoted; promotion every 2 K steps keeps 64-wide blocks."""
    from pykittens.kernels import DECODE_SHORT_K, DECODE_WHOLE_K, Operand, gemm_ws_launch

    def rule(n, k=4096, **kw):
        return gemm_ws_launch({"a": Operand((16, k), 1), "b": Operand((n, k), 1),
                               "c": Operand((16, n), 2)}, "sm_90a", **kw)
    for n, k in ((4096, 4096), (4096, 14336), (6144, 4096)):
        (grid,), consts = rule(n, k)
        assert {key: consts[key] for key in DECODE_SHORT_K[0]} == DECODE_SHORT_K[0]
        assert consts["PROMOTE"] == 1 and grid == -(-n // 48)
    for n in (2176, 3072, 8448):
        (grid,), consts = rule(n)
        assert consts["BN"] == 64 and consts["STAGES"] == DECODE_WHOLE_K["STAGES"]
        assert consts["PROMOTE"] == 1 and grid == -(-n // 64)
    assert rule(4096, promote=2)[1]["BN"] == 64
    assert rule(8704)[1]["BN"] == 128 and rule(2048)[1]["BN"] == 128


@pytest.mark.parametrize("promote", [1])
def test_promoted_fp8_48_wide_blocks_over_a_of_few_rows(promote, rng):
    """The promoted e4m3 build of 48-wide blocks (8 ring stages) over 16 rows against
    float64: 4 blocks of 5 K steps of 128 on 2 workgroups."""
    import ml_dtypes
    from pykittens.kernels import DECODE_SHORT_K, Operand, gemm_ws_launch
    m, n, k = 16, 192, 640
    a = rng.standard_normal((m, k)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((n, k)).astype(ml_dtypes.float8_e4m3fn)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    rule = gemm_ws_launch({"a": Operand((m, 4096), 1), "b": Operand((4096, 4096), 1),
                           "c": Operand((m, 4096), 2)}, "sm_90a")[1]
    assert rule["BN"] == DECODE_SHORT_K[0]["BN"] and rule["PROMOTE"] == promote
    out = pk.emulate(gemm_ws, grid=(2,), target="sm_90a", a=a, b=b,
                     c=np.full((m, n), np.nan, pk.bf16.np), DT="e4m3", OUT="bf16",
                     **{**rule, "TN": n // rule["BN"]})
    assert rel_err(out["c"].astype(np.float64), want) < 1e-2


def test_a_decode_steps_split_takes_more_ring_stages():
    """gemm_split_k gives a decode step's 128-wide split blocks DECODE_SPLIT_STAGES stages,
    and keeps four for 128 rows."""
    from pykittens.kernels import DECODE_SPLIT_STAGES, gemm_split_k, gemm_ws_launch
    from pykittens.ops.matmul import ws_operands
    for m, stages in ((16, DECODE_SPLIT_STAGES), (64, DECODE_SPLIT_STAGES), (256, 4)):
        consts = gemm_ws_launch(ws_operands("nt", m, 14336, 4096, 2), "sm_90a")[1]
        (grid,), split, _ = gemm_split_k(consts, "sm_90a", 14336, m=m, n=4096)
        assert split["BN"] == 128 and split["STAGES"] == stages and grid == 128


@pytest.mark.parametrize("rule", [{}, {"bn": 256}, {"promote": 2}])
def test_promoted_fp8_over_a_of_few_rows(rule, rng):
    """e4m3 operands promoted as the launch rule promotes them (two products in turn, B
    in two halves, every 2 K steps), over 16 rows: A_ROWS from the rule, against
    float64."""
    from pykittens.kernels import gemm_ws_launch
    m, k, n = 16, 128 * 5, 384
    a = (rng.standard_normal((m, k)) / 4).astype(pk.e4m3.np)
    b = (rng.standard_normal((n, k)) / 4).astype(pk.e4m3.np)
    c = np.full((m, n), np.nan, pk.bf16.np)
    (grid,), consts = gemm_ws_launch({"a": a, "b": b, "c": c}, "sm_90a", **rule)
    assert consts["A_ROWS"] == 16 and consts["PROMOTE"]
    out = pk.emulate(gemm_ws, grid=(grid,), target="sm_90a", a=a, b=b, c=c, **consts)
    assert rel_err(out["c"].astype(np.float64),
                   a.astype(np.float64) @ b.astype(np.float64).T) < 1e-2
