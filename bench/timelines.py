"""What the timeline scripts share (chiplet_timeline.py, rows_timeline.py,
split_timeline.py): a pk.timestamp record on the GPU, its stamps taken round by round,
the stamps' times, and the scripts' main (--prebuild, or measure and write
$OUT/<name>.json and <name>.npz, the table last)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

ROUNDS = 3            # timelines a launch, each after a warm launch


def record(rows: int):
    """A record of `rows` timestamps on the GPU (zeros) whose row pitch is 16 words: its
    strides keep the aligned build, as the library's own launches have."""
    import torch
    return torch.zeros(rows, 16, dtype=torch.int32, device="cuda")[:, :4]


def stamped_rounds(launch, rec, rounds: int = ROUNDS) -> list[np.ndarray]:
    """The record of `rounds` launches (int64 words), each launched once before to warm
    the caches and the clocks."""
    import torch
    out = []
    for _ in range(rounds):
        launch()
        rec.zero_()
        launch()
        torch.cuda.synchronize()
        out.append(rec.cpu().numpy().astype(np.int64))
    return out


def times(rec: np.ndarray) -> np.ndarray:
    """Each row's timer as one count: its low word, plus its high word shifted."""
    return rec[..., 0] + (rec[..., 1] << 32)


def medians(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds' analyses (dicts with the same keys)."""
    return {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}


def main(name: str, builds, measure, table) -> int:
    """--prebuild: the PTX of builds() into the cache; else measure() -> (details,
    stamps), written to $OUT/<name>.json and <name>.npz, and table(details) printed."""
    if "--prebuild" in sys.argv:
        import prebuild
        return prebuild.ptx(builds())
    details, stamps = measure()
    out = os.environ.get("OUT")
    if out:
        np.savez_compressed(os.path.join(out, f"{name}.npz"), **stamps)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(details, f, indent=1)
    print(table(details))
    return 0
