"""The norms' backward adding up its own column sums (rows.fused_column_sums: a grid-wide
barrier on flags, then each workgroup sums column slices of the partial rows): the fused
kernels against float64, under the launch rules' schedules and a walk of several steps;
the flags left zero and the partial rows dropped; without the barrier the emulator reports
the race; and the ops taking the fused kernels (rows.FUSED_SUMS) where the whole grid is
resident, with their gradients against float64."""
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.emulator.machine import Race
from pykittens.kernels import ln_grad_launch, rms_grad_launch
from pykittens.kernels import rows as rk
from pykittens.kernels.layernorm import dbias_column, layernorm_bwd_fused
from pykittens.kernels.rmsnorm import rmsnorm_bwd_fused
from pykittens.kernels.rows import ColumnSums

BF = ml_dtypes.bfloat16


def _inputs(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, n)).astype(BF), rng.standard_normal((m, n)).astype(BF),
            rng.standard_normal(n).astype(BF), (rng.random((2, m)) + 0.5).astype(np.float32))


def _rel(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("m, n, grid", [(40, 1024, None), (40, 1024, 8), (10, 4096, None),
                                        (37, 300, 5)])
def test_layernorm_backward_sums_its_own_columns(m, n, grid):
    x, dy, w, stats = _inputs(m, n)
    g, c = ln_grad_launch({"x": x, "dy": dy}, "sm_90a", True, True)
    grid = (grid,) if grid else g
    parts = ColumnSums.partial_rows(grid[0], c)
    r = pk.emulate(layernorm_bwd_fused, x, dy, w, stats, np.zeros((m, n), BF),
                   np.zeros((parts, dbias_column(n) + n), np.float32), np.zeros(n, BF),
                   np.zeros(n, BF), np.zeros(2, np.int32), grid=grid, target="sm_90a",
                   DT="bf16", **c)
    mean, rstd = stats.astype(np.float64)
    xhat = (x.astype(np.float64) - mean[:, None]) * rstd[:, None]
    assert _rel(r["dweight"], (dy.astype(np.float64) * xhat).sum(0)) < 1e-2
    assert _rel(r["dbias"], dy.astype(np.float64).sum(0)) < 1e-2
    assert not r["flags"].any()                       # left zero for the next launch
    assert np.isnan(r["part"][:, :n]).all()           # the partial rows dropped once read


@pytest.mark.parametrize("m, n, grid, residual", [(40, 1024, 8, 0), (10, 4096, None, 1)])
def test_rmsnorm_backward_sums_its_own_columns(m, n, grid, residual):
    x, dy, w, stats = _inputs(m, n, seed=1)
    g, c = rms_grad_launch({"x": x, "dy": dy, "ds": dy if residual else None}, "sm_90a",
                           bool(residual), True)
    grid = (grid,) if grid else g
    parts = ColumnSums.partial_rows(grid[0], c)
    r = pk.emulate(rmsnorm_bwd_fused, x, dy, w, stats[1], dy, np.zeros((m, n), BF),
                   np.zeros((parts, n), np.float32), np.zeros(n, BF), np.zeros(2, np.int32),
                   grid=grid, target="sm_90a", DT="bf16", **c)
    want = (dy.astype(np.float64) * x.astype(np.float64) *
            stats[1].astype(np.float64)[:, None]).sum(0)
    assert _rel(r["dweight"], want) < 1e-2 and not r["flags"].any()


@pk.kernel(num_waves=2)
def sums_without_the_barrier(part: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 1]):
    """Each workgroup writes its partial row, then sums a column slice of everyone's: with
    no barrier between, the reads race with the other workgroups' writes."""
    w = pk.program_id(0)
    with pk.if_(pk.wave_id() == 0):
        pk.store(part, pk.full(pk.rv(pk.rt((1, 32), pk.f32), "col"), 1.0), (w, 0))
    pk.barrier()
    rk.sum_columns(part, out, w * 16, 16, 16)


def test_without_the_barrier_the_emulator_reports_the_race():
    with pytest.raises(Race, match="race on global tensor 'part'"):
        pk.emulate(sums_without_the_barrier, np.zeros((2, 32), np.float32),
                   np.zeros(32, np.float32), grid=2, target="sm_90a")


def test_fusing_needs_the_whole_grid_resident(monkeypatch):
    monkeypatch.setattr(rk, "FUSED_SUMS", True)
    assert rk.fuses_sums(264, {"PROGRAMS": 2}, "sm_90a")
    assert not rk.fuses_sums(265, {"PROGRAMS": 2}, "sm_90a")
    assert not rk.fuses_sums(8, {}, "sm_90a")                 # not built to fit: unknown
    monkeypatch.setattr(rk, "FUSED_SUMS", False)
    assert not rk.fuses_sums(8, {"PROGRAMS": 1}, "sm_90a")


def test_the_ops_take_the_fused_backward(monkeypatch):
    torch = pytest.importorskip("torch")
    import pykittens.ops as pko
    from pykittens.ops import norms
    monkeypatch.setattr(rk, "FUSED_SUMS", True)
    launched = []
    real = norms.run
    monkeypatch.setattr(norms, "run", lambda k, *a, **kw: (launched.append(k.name),
                                                           real(k, *a, **kw))[1])
    m, n = 10, 4096                              # a staged plan: PROGRAMS workgroups an SM
    torch.manual_seed(0)
    x = torch.randn(m, n, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(m, n, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, dtype=torch.bfloat16, requires_grad=True)
    cases = [(lambda a: pko.layer_norm(a[0], (n,), a[1], a[2]),
              lambda a: torch.nn.functional.layer_norm(a[0], (n,), a[1], a[2]), [x, w, b]),
             (lambda a: pko.rms_norm(a[0], (n,), a[1], 1e-6),
              lambda a: torch.nn.functional.rms_norm(a[0], (n,), a[1], 1e-6), [x, w]),
             (lambda a: pko.add_rms_norm(a[0], a[1], a[2], 1e-6)[0],
              lambda a: torch.nn.functional.rms_norm(a[0] + a[1], (n,), a[2], 1e-6),
              [x, r, w])]
    for ours, theirs, leaves in cases:
        dy = torch.randn(m, n, dtype=torch.bfloat16)
        got = torch.autograd.grad(ours(leaves), leaves, dy)
        ref = [t.detach().double().requires_grad_() for t in leaves]
        want = torch.autograd.grad(theirs(ref), ref, dy.double())
        for g_, w_ in zip(got, want):
            assert float((g_.double() - w_).norm() / w_.norm()) < 1e-2
    assert "column_sum" not in launched
    assert {"layernorm_bwd_fused", "rmsnorm_bwd_fused"} <= set(launched)
