"""What the norms' per-column sums (dweight, dbias) cost inside the backward walk: the
backward kernels alone, launched with pk.launch CALLS times and timed with CUDA events,
under one schedule (the launch rule's with the sums) and every combination of the sums,
bf16. ROWS_SUMS_NO_FINISH=1 leaves out the partial rows' writes (and with them, the
compiler's dead-code pass, the sums); ROWS_SUMS_FINISH_NEVER=1 keeps the sums and skips
their writes by a test that fails at run time (wrong sums: timing only; run either in a
process of its own with its own PYKITTENS_CACHE, the builds share keys).
ROWS_SUMS_PAD=k: the partial rows k elements apart beyond their width.
ROWS_SUMS_TOUCH=1: each wave of a split row stores zeros to its stretch of its partial row
before the walk (the row's pages and lines touched early; the sums then written as
usual). ROWS_SUMS_ATOMIC=1: each wave of a split row adds its sums into row 0 of the
partial rows atomically (red.global.add.v4.f32) instead of storing its own row (timing
only: the sums accumulate over the calls). LN_WAVES / RMS_WAVES
="w,...": LayerNorm's / RMSNorm's backward also over rows shared by w waves (staged_plan).
ROWS_SUMS_SHAPES="MxN,...": other shapes. Every plan with the sums checks their total
against float64 (sums_rel_err). --once: every launch made once, untimed (what
Nsight Compute profiles: the stall samples of each SASS instruction, with the writes and
without them):

    PYTHONPATH=. python3 bench/rows_sums.py
    ncu --clock-control none --set full --import-source no -k regex:'^layernorm_bwd$' \
        -c 1 -o $OUT/ln python3 bench/rows_sums.py --once
    ncu -i $OUT/ln.ncu-rep --page source --csv --print-source sass
"""
from __future__ import annotations

import json
import os
import sys

import torch

import pykittens as pk
from pykittens.bench.gpu import event_time
from pykittens.kernels import ln_grad_launch, rms_grad_launch, rows
from pykittens.kernels.layernorm import dbias_column, layernorm_bwd
from pykittens.kernels.rmsnorm import rmsnorm_bwd
from pykittens.kernels.rows import ColumnSums

SHAPES = tuple(tuple(int(v) for v in s.split("x")) for s in
               os.environ["ROWS_SUMS_SHAPES"].split(",")) if os.environ.get("ROWS_SUMS_SHAPES") \
    else ((16384, 4096), (4096, 12288), (16384, 8192))
CALLS = 30
LN_WAVES = [int(w) for w in os.environ.get("LN_WAVES", "").split(",") if w]
RMS_WAVES = [int(w) for w in os.environ.get("RMS_WAVES", "").split(",") if w]
PAD = int(os.environ.get("ROWS_SUMS_PAD", "0"))    # elements between partial rows
VARIANTS = ("NO_FINISH", "FINISH_NEVER", "TOUCH", "ATOMIC")   # ROWS_SUMS_<name>=1


def _part(rows, cols):
    """The partial rows' buffer: (rows, cols) f32, each row PAD elements longer."""
    return torch.empty(rows, cols + PAD, device="cuda")[:, :cols]


def _time(fn) -> float:
    """µs of one call: the median of three rounds of CALLS calls (CUDA events); with
    --once, one call, untimed (nan)."""
    if "--once" in sys.argv:
        fn()
        torch.cuda.synchronize()
        return float("nan")
    return event_time(fn, CALLS, 3) * 1e6


def _sums_error(part, expected) -> float:
    """The largest relative error of the partial rows' column sums (added in float64)
    against float64 references starting at the given columns of `part`."""
    total = part.double().sum(0)
    return max(float((total[c:c + len(ref)] - ref).abs().max() / ref.abs().max())
               for c, ref in expected)


def _touch_early():
    """ColumnSums of split rows store zeros to the wave's stretch of its partial row first."""
    init = ColumnSums.__init__

    def touched(self, rows, part, first=0):
        init(self, rows, part, first)
        if rows.split:
            pk.store(part, pk.col_sum(pk.zeros(rows.block)),
                     (pk.program_id(0), self._col(0)), end=self._end(), inside=rows.exact)
    ColumnSums.__init__ = touched


def _atomic_finish():
    """ColumnSums of split rows (one row a wave) add into row 0 of part atomically."""
    finish = ColumnSums.finish

    def atomic(self):
        if not (self.rows.split and self.rows.rows == 1):
            return finish(self)
        for j in pk.static_range(self.rows.nblocks):
            pk.atomic_add(self.part, self.acc[j], (0, self._col(j)), end=self._end())
    ColumnSums.finish = atomic


def main() -> int:
    if os.environ.get("ROWS_SUMS_TOUCH") == "1":
        _touch_early()
    if os.environ.get("ROWS_SUMS_ATOMIC") == "1":
        _atomic_finish()
    if os.environ.get("ROWS_SUMS_NO_FINISH") == "1":
        ColumnSums.finish = lambda self: None
    if os.environ.get("ROWS_SUMS_FINISH_NEVER") == "1":      # sums kept, never stored
        finish = ColumnSums.finish

        def never(self):
            with pk.if_(self.rows.m < 0):
                finish(self)
        ColumnSums.finish = never
    results = []
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy, ds, dx = torch.randn_like(x), torch.randn_like(x), torch.empty_like(x)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        stats = torch.rand(2, m, device="cuda") + 0.5
        xhat = (x.double() - stats[0].double()[:, None]) * stats[1].double()[:, None]
        grid, consts = ln_grad_launch({"x": x, "dy": dy}, "sm_90a", True, True)
        plans = [((1, 1), grid, consts), ((1, 0), grid, consts), ((0, 1), grid, consts),
                 ((0, 0), grid, consts)]
        for waves in LN_WAVES:                  # other shares of a row, both sums
            if n % (waves * rows.STAGE_COLS) or waves == consts["num_waves"]:
                continue                        # ragged, or the rule's own share
            (g,), c = rows.staged_plan(m, n, "sm_90a", 2, 2, 2, waves=waves)
            plans.append(((1, 1), (g,), {**c, "EXACT": int(rows.exact(n, c))}))
        for (dw, db), grid, consts in plans:
            part = _part(ColumnSums.partial_rows(grid[0], consts), 2 * n)
            us = _time(lambda: pk.launch(layernorm_bwd, grid=grid, x=x, dy=dy, w=w,
                                         stats=stats, dx=dx, part=part, **consts, DW=dw,
                                         DB=db))
            err = _sums_error(part, [(0, (dy.double() * xhat).sum(0)),
                                     (dbias_column(n), dy.double().sum(0))]) \
                if (dw, db) == (1, 1) else None
            results.append({"op": "layernorm_bwd", "shape": [m, n], "DW": dw, "DB": db,
                            "consts": consts, "us": us, "of_bytes": 3 * m * n * 2 / us / 1e6,
                            "sums_rel_err": err})
            print(f"layernorm_bwd {m}x{n} DW={dw} DB={db} {us:7.1f} µs "
                  f"{results[-1]['of_bytes']:.2f} TB/s sums {err or 0:.1e} {consts}",
                  flush=True)
        for residual in (0, 1):
            grid, consts = rms_grad_launch({"x": x, "dy": dy, "ds": ds if residual else None},
                                           "sm_90a", bool(residual), True)
            plans = [(dw, grid, consts) for dw in (1, 0)]
            for waves in RMS_WAVES:              # other shares of a row, with dweight
                if n % (waves * rows.STAGE_COLS) or waves == consts["num_waves"]:
                    continue
                (g,), c = rows.staged_plan(m, n, "sm_90a", 2, 2 + residual, 1, waves=waves)
                plans.append((1, (g,), {**c, "EXACT": int(rows.exact(n, c)),
                                        "RESIDUAL": residual}))
            for dw, grid, consts in plans:
                part = _part(ColumnSums.partial_rows(grid[0], consts), n)
                us = _time(lambda: pk.launch(rmsnorm_bwd, grid=grid, x=x, dy=dy, w=w,
                                             rstd=stats[1], ds=ds, dx=dx, dw_part=part,
                                             **consts, DW=dw))
                moved = (3 + residual) * m * n * 2
                err = _sums_error(part, [(0, (dy.double() * x.double() *
                                              stats[1].double()[:, None]).sum(0))]) \
                    if dw else None
                results.append({"op": "rmsnorm_bwd", "shape": [m, n], "RESIDUAL": residual,
                                "DW": dw, "consts": consts, "us": us,
                                "of_bytes": moved / us / 1e6, "sums_rel_err": err})
                print(f"rmsnorm_bwd   {m}x{n} RES={residual} DW={dw} {us:7.1f} µs "
                      f"{results[-1]['of_bytes']:.2f} TB/s sums {err or 0:.1e} {consts}",
                      flush=True)
    out = os.environ.get("OUT")
    if out:
        name = "rows_sums" + "".join(f"_{v.lower()}" for v in VARIANTS
                                     if os.environ.get(f"ROWS_SUMS_{v}") == "1") + ".json"
        with open(os.path.join(out, name), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
