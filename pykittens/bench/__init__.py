"""Benchmark and device-check harness. `gpu` (needs torch and a GPU): timing with CUDA
graphs, library kernels against float64 references and against the emulator, copy ceilings.
The scripts in bench/ and `pykittens demo` use it."""
from __future__ import annotations


def text_table(rows: list[list], header: list | None = None) -> str:
    """Rows as left-aligned columns, two spaces apart; a header gets a dashed rule under it."""
    cols = ([header] if header else []) + rows
    w = [max(len(str(r[i])) for r in cols) for i in range(len(cols[0]))]

    def line(r):
        return "  ".join(str(x).ljust(w[i]) for i, x in enumerate(r))
    head = [line(header), "  ".join("-" * x for x in w)] if header else []
    return "\n".join(head + [line(r) for r in rows])
