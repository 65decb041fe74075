"""Tile IR -> lane IR. One lowering serves every target; target facts (wave size, layouts,
matrix instructions) come from `pykittens.targets` through `layouts`."""
from .lane import LaneProgram, LaneType
from .lower import lower

__all__ = ["lower", "LaneProgram", "LaneType"]
