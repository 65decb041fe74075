"""A kernel's timeline as a chart: spans of time (a phase of a workgroup's work, from
pk.timestamp records) drawn as bars on the rows of the compute units they ran on, so the
start ramp, the stragglers and the tail show at a glance. The timeline scripts (bench/
chiplet_timeline.py, rows_timeline.py, split_timeline.py) build the spans."""
from __future__ import annotations

from dataclasses import dataclass

# the phases' colours, in the order the legend lists them (matplotlib's tab10)
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray")


@dataclass(frozen=True)
class Span:
    """`phase` of some work on `unit` (a compute unit, or a row of one), from `start` to
    `end` (µs)."""
    unit: int
    start: float
    end: float
    phase: str


def chart(spans: list[Span], title: str, path: str, rows: str = "compute unit") -> None:
    """A PNG at `path`: a row per unit (sorted; `rows` names them), a bar per span
    coloured by its phase (the phases in the order they first appear), time in µs from
    the first start."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not spans:
        raise ValueError("a timeline chart needs at least one span")
    bad = [s for s in spans if s.end < s.start]
    if bad:
        raise ValueError(f"a span ends before it starts: {bad[0]}")
    phases = list(dict.fromkeys(s.phase for s in spans))
    if len(phases) > len(PALETTE):
        raise ValueError(f"at most {len(PALETTE)} phases, not {len(phases)}")
    units = sorted({s.unit for s in spans})
    row = {u: i for i, u in enumerate(units)}
    t0 = min(s.start for s in spans)
    fig, ax = plt.subplots(figsize=(10, max(2.5, min(12.0, 0.06 * len(units) + 1.5))))
    for p, colour in zip(phases, PALETTE):
        mine = [s for s in spans if s.phase == p]
        ax.barh([row[s.unit] for s in mine], [s.end - s.start for s in mine],
                left=[s.start - t0 for s in mine], height=0.8, color=colour, label=p,
                linewidth=0)
    ax.set_xlabel("µs from the first start")
    ax.set_ylabel(f"{rows} ({len(units)})")
    ax.set_yticks([])
    ax.set_ylim(-0.5, len(units) - 0.5)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
