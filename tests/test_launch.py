"""pk.launch: what can be checked without a GPU (the GPU runs are in bench/device_check.py)."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels import scaled_add


def test_launch_needs_gpu_tensors():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="argument 'x' of scaled_add is on the CPU; move "
                                             "it to the GPU"):
        pk.launch(scaled_add, x, x, x, 1.0, grid=1)

    @pk.kernel
    def no_tensors(n: pk.i32):
        pass

    with pytest.raises(pk.KernelError, match="needs at least one GPU tensor"):
        pk.launch(no_tensors, 1, grid=1)


def test_launch_checks_arguments_first():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="missing argument"):
        pk.launch(scaled_add, x, x, grid=1)
    with pytest.raises(pk.KernelError, match="element type i32 but the kernel expects f32"):
        pk.emulate(scaled_add, x, x, np.ones((4, 64), np.int32), 1.0, grid=1, DT="f32")


def test_hip_path_says_where_it_runs():
    """No ROCm here: the HIP launcher's own error names what is missing and what to do."""
    from pykittens.runtime import hip
    with pytest.raises(hip.HipError, match="no HIP runtime"):
        hip.hip_runtime()


def test_emulate_accepts_torch_cpu_tensors():
    torch = pytest.importorskip("torch", reason="torch is optional (tensor interop)")
    x = torch.randn(37, 100)
    out = pk.emulate(pk.kernels.softmax, x, torch.zeros(37, 100), grid=(3,),
                     target="gfx950")["out"]
    np.testing.assert_allclose(out, torch.softmax(x, 1).numpy(), atol=1e-6)
    with pytest.raises(pk.KernelError, match="element type bf16 but the kernel expects f32"):
        pk.emulate(scaled_add, x, x.bfloat16(), x, 1.0, grid=1, DT="f32")


def test_torch_references_match_numpy(rng):
    torch = pytest.importorskip("torch", reason="torch is optional (tensor interop)")
    from pykittens.kernels import KERNELS
    for spec in KERNELS.values():
        inputs = spec.make_inputs(spec.shapes[0], pk.f32, rng)
        t = {k: torch.from_numpy(v).double() if isinstance(v, np.ndarray) else v
             for k, v in inputs.items()}
        got = spec.torch_reference(t)[spec.outputs[0]].numpy()
        np.testing.assert_allclose(got, spec.reference(inputs)[spec.outputs[0]], atol=1e-12)
