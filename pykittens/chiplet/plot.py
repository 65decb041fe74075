"""Picture of a mapping: which XCD computes each output tile, and the simulated hit rates."""
from __future__ import annotations

import numpy as np

from .mapping import Mapping, dispatch_xcd
from .sim import Machine, SimResult, start_steps


def tile_xcd_grid(mapping: Mapping, machine: Machine, steps: int, timing) -> tuple:
    """(xcd, wave) per tile as 2-D arrays (attention grids are drawn (batch*head, q_block)),
    wave = the launch round in which the tile's workgroup starts."""
    n = mapping.size
    pid = np.arange(n, dtype=np.int64)
    coords = mapping(pid)
    grid = mapping.grid
    flat = np.ravel_multi_index(tuple(np.asarray(c) for c in coords), grid)
    xcd = np.empty(n, np.int64)
    xcd[flat] = dispatch_xcd(pid, machine.num_xcds, machine.round_robin)
    wave = np.empty(n, np.int64)
    wave[flat] = start_steps(n, steps, machine.resident, timing) // steps
    shape = (int(np.prod(grid[:-1])), grid[-1])
    return xcd.reshape(shape), wave.reshape(shape)


def plot_mapping(path: str, op, mapping: Mapping, result: SimResult, machine: Machine,
                 timing) -> None:
    """Write a PNG: tiles coloured by XCD (by launch wave where there is one L2), the first
    wave's tiles dotted; per-XCD L2 hit rates with the overall L2 and LLC rates."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    xcd, wave = tile_xcd_grid(mapping, machine, op.steps, timing)
    nx = machine.num_xcds
    cmap = ListedColormap(plt.get_cmap("tab10" if nx <= 10 else "tab20").colors[:max(nx, 1)])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 5.2),
                                 gridspec_kw={"width_ratios": [3, 2]})
    if nx > 1:
        ax.imshow(xcd, cmap=cmap, vmin=-0.5, vmax=nx - 0.5, interpolation="nearest",
                  aspect="auto")
        handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(nx)]
        labels = [f"XCD {i}" for i in range(nx)]
        ax.set_title(f"{mapping.spec}: XCD of each tile", fontsize=11)
    else:                               # one L2: show the launch order instead
        im = ax.imshow(wave, cmap="viridis", interpolation="nearest", aspect="auto")
        fig.colorbar(im, ax=ax, label="launch wave", fraction=0.04)
        handles, labels = [], []
        ax.set_title(f"{mapping.spec}: launch wave of each tile (one L2)", fontsize=11)
    r, c = np.nonzero(wave == 0)
    if len(r) <= 4096:                  # dots stay readable; mark the first wave's tiles
        handles.append(ax.scatter(c, r, s=6, c="black" if nx > 1 else "white", marker="."))
        labels.append("first wave")
    if nx > 1:
        ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    elif handles:
        ax.legend(handles, labels, loc="lower right", fontsize=8, facecolor="lightgray")
    if op.kind == "gemm":
        ax.set_xlabel("output tile column (B block)")
        ax.set_ylabel("output tile row (A block)")
    else:
        ax.set_xlabel("q block")
        ax.set_ylabel("batch * heads + head")

    rates = [np.nan if v is None else v for v in result.xcd_l2_hit_rates]
    bx.bar(range(nx), rates, color=[cmap(i) for i in range(nx)])
    bx.axhline(result.l2_hit_rate, color="black", lw=1.5,
               label=f"L2 hit rate {result.l2_hit_rate:.1%}")
    if result.llc_hit_rate is not None:
        bx.axhline(result.llc_hit_rate, color="tab:red", lw=1.5, ls="--",
                   label=f"LLC hit rate {result.llc_hit_rate:.1%}")
    bx.set_ylim(0, 1.05)
    bx.set_xticks(range(nx))
    bx.set_xlabel("XCD")
    bx.set_ylabel("L2 hit rate (bytes)")
    bx.legend(loc="lower right", fontsize=9)
    bx.set_title(f"L2 misses {result.llc_request_bytes / 1e9:.2f} GB, "
                 f"HBM {result.hbm_bytes / 1e9:.2f} GB", fontsize=11)
    fig.suptitle(f"{op.describe()} on {machine.name} (modeled)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
