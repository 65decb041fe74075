"""Text form of a lane program (`--emit lane`)."""
from __future__ import annotations

from ..ir.printer import format_block
from .lane import LaneProgram


def format_lane(p: LaneProgram) -> str:
    head = (f"lane_program {p.name} target={p.target.name} wave={p.wave_size} "
            f"num_waves={p.num_waves} lds_bytes={p.lds_bytes}")
    regions = [f"  lds {r.name} [{r.base}, {r.base + r.size})" for r in p.regions]
    body = format_block(p.body, 1, typed=lambda v: f"{v}:{v.type}")
    return "\n".join([head + " {"] + regions + body + ["}"])
