"""Shared fixtures and helpers for the core tests (language, IR, lowering, emulator)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TARGETS = ("gfx942", "gfx950", "sm_90a")
# The fp8 flavours each target supports: FNUZ on CDNA3, OCP on CDNA4 and Hopper.
FP8 = {"gfx942": ("e4m3fnuz", "e5m2fnuz"), "gfx950": ("e4m3", "e5m2"),
       "sm_90a": ("e4m3", "e5m2")}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 1e-2}


@pytest.fixture
def rng():
    """A seeded generator: every test sees the same random (never zero) inputs."""
    return np.random.default_rng(20240611)


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


def rel_err(out, ref) -> float:
    """Relative Frobenius error of `out` against a float64 reference; NaN never passes."""
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    assert o.shape == r.shape, (o.shape, r.shape)
    if not np.all(np.isfinite(o)):
        return float("inf")
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


def poison(shape, dtype=np.float32):
    """An output buffer of NaNs, so elements the kernel fails to write make the test fail."""
    return np.full(shape, np.nan, dtype)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def line_of(path: str, marker: str) -> int:
    """1-based line of the only line in `path` ending with the comment `marker`."""
    with open(path) as f:
        hits = [i + 1 for i, line in enumerate(f) if line.rstrip().endswith(marker)]
    assert len(hits) == 1, f"marker {marker!r} found on lines {hits} of {path}"
    return hits[0]


def assert_names_line(err, path: str, marker: str):
    """The error message names `path` and the line carrying `marker` (the user's source)."""
    want = f"{path}:{line_of(path, marker)}"
    assert want in str(err), f"expected {want!r} in error message: {err}"
