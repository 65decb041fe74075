"""Benchmark and device-check harness. `gpu` (needs torch and a GPU): timing with CUDA
graphs, library kernels against float64 references and against the emulator, copy ceilings.
The scripts in bench/ and `pykittens demo` use it."""
from __future__ import annotations

import json
import os
import sys
import time


def text_table(rows: list[list], header: list | None = None) -> str:
    """Rows as left-aligned columns, two spaces apart (short rows padded); a header gets a
    dashed rule under it."""
    width = max(len(r) for r in ([header] if header else []) + rows)
    cols = [list(r) + [""] * (width - len(r)) for r in ([header] if header else []) + rows]
    header, rows = (cols[0], cols[1:]) if header else (None, cols)
    w = [max(len(str(r[i])) for r in cols) for i in range(width)]

    def line(r):
        return "  ".join(str(x).ljust(w[i]) for i, x in enumerate(r))
    head = [line(header), "  ".join("-" * x for x in w)] if header else []
    return "\n".join(head + [line(r) for r in rows])


def per_call_us(fn, calls: int, rounds: int, warm: int = 20, sync=None) -> float:
    """Host microseconds per call of `fn`: `warm` calls first, then `rounds` rounds of
    `calls` calls back to back, the median round's time per call (one round slowed by
    the host — interrupts, other processes — does not decide it); `sync` (e.g.
    torch.cuda.synchronize) after the warm-up and after each round, outside the timing."""
    import statistics
    for _ in range(warm):
        fn()
    if sync is not None:
        sync()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls)
        if sync is not None:
            sync()
    return statistics.median(per_call) * 1e6


def run_steps(name: str, steps: dict, env: dict, argv=None, header=None) -> int:
    """A GPU script's main: run its steps (name -> fn(rows, details)), or only those named on
    the command line, each failure a row rather than the end of the run; write
    $OUT/<name>.json when OUT is set; print the environment and the table of rows (under
    `header`, if given) last. Exit status 1 when a row ends in FAIL or holds ERROR."""
    t0 = time.time()
    only = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--")]
    rows, details = [], []
    for step, fn in steps.items():
        if only and step not in only:
            continue
        print(f"[{time.time() - t0:.0f}s] {step} ...", flush=True)
        try:
            fn(rows, details)
        except Exception as e:  # noqa: BLE001 - report and continue with the next step
            import traceback
            traceback.print_exc()
            rows.append([step, "ERROR", "", "", type(e).__name__, str(e)[:80]])
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump({"env": env, "results": details}, f, indent=2, default=str)
    print(f"\n{env}  ({time.time() - t0:.0f}s)")
    print(text_table(rows, header))
    return 1 if any(str(r[-1]).endswith("FAIL") or "ERROR" in r for r in rows) else 0
