"""Lane IR -> LLVM IR text: a shared SSA renderer plus one small dialect per GPU family."""
from __future__ import annotations

from ..lower.lane import LaneProgram
from .amdgpu import AMDGPURenderer
from .nvptx import NVPTXRenderer

RENDERERS = {"cdna": AMDGPURenderer, "hopper": NVPTXRenderer}


def render(prog: LaneProgram, stride_divisor: int = 1) -> str:
    """LLVM IR of a lane program. With stride_divisor=16 the code assumes every non-last
    tensor stride is a multiple of 16 elements (and pointers 16-byte aligned), which lets
    adjacent elements move as aligned 16-byte vectors; launchers check before using it."""
    return RENDERERS[prog.target.family](prog, stride_divisor).render()


__all__ = ["render", "RENDERERS"]
