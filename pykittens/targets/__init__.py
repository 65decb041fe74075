"""Hardware descriptions, the only home of target facts. `get("gfx950")` returns one."""
from .base import LaneLayout, MMAInstr, Target, row_major_lane_layout
from . import gfx942, gfx950, sm90a

TARGETS: dict[str, Target] = {t.name: t for t in (gfx942.TARGET, gfx950.TARGET, sm90a.TARGET)}
NAMES = tuple(TARGETS)
# The instruction classes scheduling hints may name (pk.sched_group("mfma", 1)), over all
# targets; a target without such hints ignores them.
SCHED_CLASSES = tuple(dict.fromkeys(c for t in TARGETS.values() for c, _ in t.sched_classes))


def get(name: str | Target) -> Target:
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(NAMES)}") from None


__all__ = ["LaneLayout", "MMAInstr", "Target", "TARGETS", "NAMES", "SCHED_CLASSES", "get",
           "row_major_lane_layout"]
