"""pk.launch: what can be checked without a GPU (the GPU runs are in bench/device_check.py)."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels import scaled_add


def test_launch_needs_gpu_tensors():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="needs at least one GPU tensor"):
        pk.launch(scaled_add, x, x, x, 1.0, grid=1)


def test_launch_checks_arguments_first():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="missing argument"):
        pk.launch(scaled_add, x, x, grid=1)
    with pytest.raises(pk.KernelError, match="element type i32 but the kernel expects f32"):
        pk.launch(scaled_add, x, x, np.ones((4, 64), np.int32), 1.0, grid=1, DT="f32")


def test_hip_path_says_where_it_runs():
    """No ROCm here: the HIP launcher's own error names what is missing and what to do."""
    from pykittens.runtime import hip
    with pytest.raises(hip.HipError, match="no HIP runtime"):
        hip.hip_runtime()
