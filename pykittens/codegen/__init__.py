"""Lane IR -> LLVM IR text: a shared SSA renderer plus one small dialect per GPU family."""
from __future__ import annotations

from ..lower.lane import LaneProgram
from .amdgpu import AMDGPURenderer
from .nvptx import NVPTXRenderer

RENDERERS = {"cdna": AMDGPURenderer, "hopper": NVPTXRenderer}


def render(prog: LaneProgram) -> str:
    return RENDERERS[prog.target.family](prog).render()


__all__ = ["render", "RENDERERS"]
