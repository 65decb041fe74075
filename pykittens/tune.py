"""Autotuning: time a kernel's candidate compile-time constants on the GPU present and keep
the fastest, cached on disk per (kernel, problem, GPU) so the timing runs once.

    best = tune("gemm_ws", {"m": m, "n": n, "k": k, "dtype": "bf16", "gpu": name},
                candidates, measure)     # measure(consts) -> seconds

The cache lives with the code objects ($PYKITTENS_CACHE, kind "tune"); its key covers the
problem, the candidates themselves (a changed candidate list tunes again) and pykittens'
version. A candidate that fails to build or run is skipped and reported in the entry; when
every one fails, tune raises with their errors. One whose first call does not finish in a
minute (graph_time) stops the tuning with KernelHang naming it. `pykittens.ops.linear` /
`matmul` tune the Hopper GEMM this way when PYKITTENS_AUTOTUNE=1
(ops.matmul.gemm_ws_candidates)."""
from __future__ import annotations

import json
import statistics

from .toolchain.cache import cache_key, lookup, store

KIND = "tune"


def _key(name: str, problem: dict, candidates: list[dict]) -> str:
    return cache_key(KIND, name, json.dumps(problem, sort_keys=True),
                     json.dumps(candidates, sort_keys=True))


def entry(name: str, problem: dict, candidates: list[dict]) -> dict | None:
    """The stored record of tuning this problem over these candidates (its "best", the
    "timings" of every candidate, the "failed" ones), or None (not tuned yet, or an entry
    that is not one)."""
    raw = lookup(KIND, _key(name, problem, candidates))
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def cached(name: str, problem: dict, candidates: list[dict]) -> dict | None:
    """The choice stored for this problem and candidate list, or None (not tuned yet, or
    an entry that no longer names one of the candidates)."""
    best = (entry(name, problem, candidates) or {}).get("best")
    return best if best in candidates else None


def tune(name: str, problem: dict, candidates: list[dict], measure, rounds: int = 3) -> dict:
    """The candidate (a dict of constants) that `measure(candidate) -> seconds` times
    fastest, from the disk cache when this problem was tuned before with these candidates.
    `problem` (JSON values) names what the choice depends on: shapes, types, the GPU.

    Each candidate is timed `rounds` times, the rounds interleaved (every candidate once,
    then again), and ranked by its median: a GPU's clock drifts with its temperature and
    power over a tuning run (several percent on the H200), so timing each candidate in one
    block would favour whichever ran while the chip was coolest."""
    if not candidates:
        raise ValueError(f"autotuning {name}: no candidates to time")
    if rounds < 1:
        raise ValueError(f"autotuning {name}: rounds must be at least 1, not {rounds}")
    hit = cached(name, problem, candidates)
    if hit is not None:
        return hit
    times: dict[int, list[float]] = {}
    failed = []
    for r in range(rounds):
        for i, c in enumerate(candidates):
            if r and i not in times:                    # failed in the first round
                continue
            try:
                times.setdefault(i, []).append(float(measure(c)))
            except KernelHang as e:                     # the GPU is lost to this process
                raise KernelHang(f"autotuning {name}: candidate {c}: {e}") from None
            except Exception as e:   # noqa: BLE001 - a candidate that cannot run is skipped
                times.pop(i, None)
                failed.append({"consts": c, "error": repr(e)})
    if not times:
        errors = "; ".join(f"{f['consts']}: {f['error']}" for f in failed)
        raise RuntimeError(f"autotuning {name}: every candidate failed ({errors})")
    median = {i: statistics.median(t) for i, t in times.items()}
    best = candidates[min(median, key=lambda i: (median[i], i))]
    entry = {"problem": problem, "best": best, "failed": failed,
             "timings": [{"consts": candidates[i], "seconds": median[i], "rounds": times[i]}
                         for i in sorted(times)]}
    store(KIND, _key(name, problem, candidates), json.dumps(entry).encode())
    return best


FIRST_CALL_S = 60.0       # a candidate's first call longer than this: taken for a hang


class KernelHang(RuntimeError):
    """GPU work did not finish in its time: a kernel that waits for something that never
    comes (the GPU stays busy with it; the process cannot use the GPU again)."""


def finish(query, seconds: float, what: str, clock=None, sleep=None) -> None:
    """Wait until `query()` (an event's) says the GPU work is done, at most `seconds`;
    raise KernelHang naming `what` after that, rather than wait forever."""
    import time
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    end = clock() + seconds
    while not query():
        if clock() > end:
            raise KernelHang(f"{what} did not finish in {seconds:.0f} s: a hung kernel (the "
                             "GPU is still running it; restart the process)")
        sleep(1e-4)


def graph_time(fn, reps: int = 20) -> float:
    """Median seconds of one call of `fn` (GPU work on torch's current stream), replaying a
    CUDA graph of `reps` calls so no launch gap is timed: how the tuner and the benchmarks
    time kernels."""
    import torch
    fn()
    done = torch.cuda.Event()
    done.record()
    finish(done.query, FIRST_CALL_S, "the first call of a timed kernel")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()                  # warm up off the capture stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps * 1e-3)
    return float(statistics.median(times))
