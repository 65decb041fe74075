"""Chiplet-aware grid scheduling: grid mappings and the L2/LLC cache simulator.

    from pykittens import chiplet
    op = chiplet.Gemm(9216, 9216, 9216)
    m = chiplet.parse_mapping("xcd:W=5,C=25", op, "gfx950")    # or chiplet.auto_mapping(op)
    chiplet.simulate(op, m, "gfx950").l2_hit_rate
    row, col = chiplet.tile_of(m, pk.program_id(0))            # in a kernel's prologue
"""
from .auto import (auto_mapping, best, candidates, make_op, parse_mapping, sweep)
from .mapping import (Grouped, Mapping, Split, XCDChunk, attention_head_first,
                      attention_naive, compose, dispatch_xcd, gemm_grouped, gemm_row_major,
                      gemm_xcd, grouped, split, tile_of, xcd_chunk)
from .ops import Attention, Gemm
from .sim import Machine, Schedule, SimResult, Timing, lru_misses, simulate

__all__ = [
    "Attention", "Gemm", "Grouped", "Machine", "Mapping", "Schedule", "SimResult", "Split",
    "Timing",
    "XCDChunk", "attention_head_first", "attention_naive", "auto_mapping", "best",
    "candidates", "compose", "dispatch_xcd", "gemm_grouped", "gemm_row_major", "gemm_xcd",
    "grouped", "lru_misses", "make_op", "parse_mapping", "simulate", "split", "sweep",
    "tile_of", "xcd_chunk",
]
