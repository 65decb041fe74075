"""Timelines of gemm_sk (blocks split in K between workgroups) on the H200, at the products
pykittens.ops.linear splits (a batch of tokens through a Llama layer): where its time goes
beyond B's bytes. Each consumer warpgroup's first wave stamps (pk.timestamp, through
ws_pipeline's `mark`) when it begins a piece of its walk, when the piece's products are
done, when an owner's lenders have all counted, and when the piece is stored or lent.
Per launch, in µs:

- span: the first piece's start to the last one's end;
- main: a piece's products (began to computed), median and slowest;
- wait: an owner's wait for its lenders after its own products (median, slowest);
- fixup: an owner's adding of the lenders' sums while storing C (median);
- lend: a lender's store of its sums and count (median);
- tail: the median piece's end to the last one's;
- B's rate over the main phase: B's bytes over the first start to the last piece's
  products done.

Beside them, gemm_sk's own time (CUDA graphs, as the op launches it).

    PYKITTENS_CACHE=$PWD/.pkc_st PYTHONPATH=.:bench python3 bench/split_timeline.py --prebuild
    PYKITTENS_CACHE=$PWD/.pkc_st PYTHONPATH=.:bench python3 bench/split_timeline.py   # H200

SPLIT_TIMELINE_SHAPES="MxNxK,..." picks products. Writes $OUT/split_timeline.json and
split_timeline.npz (the stamps); the table last."""
from __future__ import annotations

import os
import sys

import numpy as np

import pykittens as pk
import timelines
from pykittens.kernels.gemm import few_rows, output_tile, ws_pipeline, ws_store

SHAPES = tuple(tuple(int(d) for d in s.split("x")) for s in os.environ.get(
    "SPLIT_TIMELINE_SHAPES",
    "128x4096x14336,256x4096x4096,128x8192x28672,64x4096x14336").split(","))
EVENTS = ("began", "computed", "waited", "stored")
PIECES = 4            # pieces of its walk a workgroup stamps (a split-K walk has one)
TARGET = "sm_90a"


def rec_row(pid, t, event: str, g):
    """The record's row of consumer g's `event` in piece t of workgroup pid."""
    return ((pid * PIECES + t) * len(EVENTS) + EVENTS.index(event)) * 2 + g


@pk.kernel(num_waves=12)
def gemm_sk_timeline(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl["OUT", 2],
                     part: pk.gl[pk.f32, 2], flags: pk.gl[pk.i32, 1],
                     rec: pk.gl[pk.i32, (None, 4)], DT: pk.const = None,
                     OUT: pk.const = None, BN: pk.const = 256, STAGES: pk.const = 4,
                     TMA_STORE: pk.const = 0, MAP: pk.const = "row-major",
                     TM: pk.const = 0, TN: pk.const = 0, LAYOUT: pk.const = "nt",
                     A_ROWS: pk.const = 128, TARGET: pk.target = None):
    """gemm_sk (kernels/gemm.py) with every consumer warpgroup's first wave stamping its
    walk's events (module docstring) in rows rec_row(workgroup, piece, event, g)."""
    def mark(event, g, t, tile):
        with pk.if_((pk.wave_id() == 4 + 4 * g) & (t < PIECES)):
            pk.timestamp(rec, rec_row(pk.program_id(0), t, event, g))
    ws_pipeline(a, b, TM * TN, lambda i: output_tile(MAP, TM, TN, 128, BN, TARGET, i),
                ws_store(c, OUT, BN, TMA_STORE), DT=DT, BN=BN, STAGES=STAGES, PERSISTENT=1,
                PROMOTE=0, LAYOUT=LAYOUT, stream=(part, flags), A_ROWS=few_rows(A_ROWS, TM),
                mark=mark)


def plan(m, n, k):
    """(grid, constants, slots) of gemm_sk as pykittens.ops.linear launches the product,
    or None where the op does not split it."""
    import pykittens.ops  # noqa: F401  (pykittens.ops.matmul the module, not the op)
    from pykittens.kernels.gemm import gemm_sk
    kernel, grid, consts, slots = sys.modules["pykittens.ops.matmul"]._plan(
        TARGET, "nt", m, k, n, 2)
    return (grid, consts, slots) if kernel is gemm_sk else None


def record_rows(grid: int) -> int:
    return rec_row(grid, 0, EVENTS[0], 0)


def analyse(grid: int, rec: np.ndarray, b_bytes: int) -> dict:
    """The launch's span, main, wait, fixup, lend, tail (µs) and B's rate over the main
    phase (TB/s), from a record (int64 words); events never stamped are left out."""
    t = timelines.times(rec).reshape(grid * PIECES, len(EVENTS), 2)
    seen = t > 0
    seen[0, 0, 0] = True                   # (the emulator's first stamp counts from 0)
    began, computed, waited, stored = (np.where(seen[:, e], t[:, e], -1)
                                       for e in range(len(EVENTS)))
    live = (began >= 0) & (stored >= 0)                     # (piece, consumer) pairs
    t0, us = began[live].min(), 1e-3
    owner = live & (waited >= 0)
    lender = live & ~owner & (stored - computed >= 0)

    def med(x):
        return float(np.median(x)) * us if x.size else 0.0
    main = (computed - began)[live]
    return {"span_us": float(stored[live].max() - t0) * us,
            "main_us": med(main), "main_max_us": float(main.max()) * us,
            "wait_us": med((waited - computed)[owner]),
            "wait_max_us": float((waited - computed)[owner].max()) * us if owner.any() else 0,
            "fixup_us": med((stored - waited)[owner]),
            "lend_us": med((stored - computed)[lender]),
            "tail_us": float(stored[live].max() - np.median(stored[live])) * us,
            "b_tbps": b_bytes / max(float(computed[live].max() - t0), 1.0) / 1e3,
            "pieces": int(live[:, 0].sum()), "owners": int(owner[:, 0].sum())}


def spans(grid: int, rec: np.ndarray) -> list:
    """Every piece of the walk (its first consumer warpgroup's stamps) as chart spans
    (pykittens.bench.timeline) on its SM (a split-K walk's pieces follow each other on
    one): its products, then an owner's wait for its
    lenders and its store of C, a lender's store of its sums, or a whole block's store."""
    from pykittens.bench.timeline import Span
    t = timelines.times(rec).reshape(grid * PIECES, len(EVENTS), 2)[:, :, 0]
    sm = rec.reshape(grid * PIECES, len(EVENTS), 2, 4)[:, 0, 0, 2]
    out = []
    for i in np.flatnonzero(t[:, 3] > 0):
        began, computed, waited, stored = (t[i, e] / 1e3 for e in range(len(EVENTS)))
        unit = int(sm[i])
        out.append(Span(unit, began, computed, "products"))
        if waited > 0:
            out += [Span(unit, computed, waited, "owner waits for its lenders"),
                    Span(unit, waited, stored, "owner adds the sums, stores C")]
        else:
            out.append(Span(unit, computed, stored, "stores C or lends its sums"))
    return out


def measure():
    import torch
    from pykittens.bench.gpu import graph_time
    from pykittens.kernels.gemm import gemm_sk
    details, stamps = [], {}
    for m, n, k in SHAPES:
        p = plan(m, n, k)
        if p is None:
            print(f"{m}x{n}x{k}: pykittens.ops.linear does not split it; skipped")
            continue
        grid, consts, slots = p
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 4
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(128 * slots, consts["BN"], device="cuda")
        flags = torch.zeros(8 * slots, device="cuda", dtype=torch.int32)
        rec = timelines.record(record_rows(grid[0]))
        args = {"a": a, "b": b, "c": c, "part": part, "flags": flags}
        stamped = lambda: pk.launch(gemm_sk_timeline, grid=grid, rec=rec, **args, **consts)  # noqa
        plain = lambda: pk.launch(gemm_sk, grid=grid, **args, **consts)  # noqa: E731
        rounds = timelines.stamped_rounds(stamped, rec)
        err = float((c.double() - a.double() @ b.double().t()).norm() /
                    (a.double() @ b.double().t()).norm())
        stamps[f"{m}x{n}x{k}"] = np.stack(rounds)
        if os.environ.get("OUT"):
            from pykittens.bench.timeline import chart
            chart(spans(grid[0], rounds[-1]), f"gemm_sk {m}x{n}x{k}, {grid[0]} workgroups",
                  os.path.join(os.environ["OUT"], f"split-timeline-{m}x{n}x{k}.png"))
        got = [analyse(grid[0], r, n * k * 2) for r in rounds]
        d = {"shape": [m, n, k], "grid": grid[0], "consts": consts, "rel_err": err,
             "kernel_us": graph_time(plain, reps=20) * 1e6,
             "stamped_us": graph_time(stamped, reps=20) * 1e6, "rounds": got,
             **timelines.medians(got)}
        details.append(d)
        print(f"{m}x{n}x{k}: gemm_sk {d['kernel_us']:.1f} µs (stamped {d['stamped_us']:.1f}),"
              " " + ", ".join(f"{key} {d[key]:.2f}" for key in got[0]) +
              f", error {err:.1e}", flush=True)
    return details, stamps


def table(details) -> str:
    from pykittens.bench import text_table
    keys = ("span_us", "main_us", "main_max_us", "wait_us", "wait_max_us", "fixup_us",
            "lend_us", "tail_us", "b_tbps")
    rows = [["x".join(map(str, d["shape"])), str(d["grid"]), f"{d['kernel_us']:.1f}",
             f"{d['stamped_us']:.1f}", *(f"{d[key]:.2f}" for key in keys)] for d in details]
    return text_table(rows, ["M x N x K", "grid", "gemm_sk µs", "stamped µs", "span µs",
                             "main µs", "slowest", "wait µs", "slowest", "fixup µs",
                             "lend µs", "tail µs", "B TB/s (main)"])


def builds():
    """(kernel, constants) of every timeline and library launch (bench/prebuild.py's form)."""
    from pykittens.kernels.gemm import gemm_sk
    for m, n, k in SHAPES:
        p = plan(m, n, k)
        if p is not None:
            for kernel in (gemm_sk_timeline, gemm_sk):
                yield kernel, {"DT": "bf16", "OUT": "bf16", **p[1]}


def main() -> int:
    return timelines.main("split_timeline", builds, measure, table)

if __name__ == "__main__":
    sys.exit(main())
