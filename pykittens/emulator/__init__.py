"""Runs lane programs on the CPU with numpy, lane-exactly, for a whole grid."""
from .machine import (BarrierMismatch, EmulatorError, Misaligned, MissingBarrier,
                      OutOfBounds, Race, UnwrittenRead, run_program)

__all__ = ["run_program", "EmulatorError", "BarrierMismatch", "Misaligned", "MissingBarrier",
           "OutOfBounds", "Race", "UnwrittenRead"]
