"""Helpers for the ISA emulator's tests: run a few instructions on one wave and read
registers back as numbers."""
import numpy as np

from pykittens.isa.machine import execute  # noqa: F401  (re-exported for the tests)

LANE = np.arange(64)


def f32(w, r):
    """VGPR r (a0 = 256) of every lane as float32."""
    return w.v[r].view(np.float32)


def i32(w, r):
    return w.v[r].view(np.int32)


def u32(w, r):
    return w.v[r].copy()


def sgpr64(w, r):
    return w.s[r] | (w.s[r + 1] << 32)


def mask(lanes) -> int:
    return sum(1 << int(i) for i in lanes)
