"""CUDA launcher, the parts that run without a GPU: argument packing per ir.abi, input
checks on stand-in tensors, the kernel-image layout check, and the clear errors on a machine
without cuda.bindings or an NVIDIA driver. bench/device_selftest_cuda.py runs the rest."""
import struct
import sys
from types import SimpleNamespace

import pytest

from pykittens.ir import types as T
from pykittens.ir.nodes import Param
from pykittens.runtime import cuda as rc
from pykittens.ir.abi import kernel_args
from pykittens.runtime.args import ArgumentError
from conftest import FakeGPUTensor as FakeTensor

PARAMS = [Param("x", "gl", T.GlobalType(T.f32, (None, None))),
          Param("out", "gl", T.GlobalType(T.f32, (None,))),
          Param("n", "scalar", T.ScalarType(T.i32)),
          Param("alpha", "scalar", T.ScalarType(T.f32))]


def test_pack_follows_abi_offsets():
    kargs = kernel_args(PARAMS)
    names = [a.name for a in kargs]
    assert names == ["x", "x.size0", "x.size1", "x.stride0", "x.stride1", "out", "out.size0",
                     "out.stride0", "n", "alpha"]
    x, out = FakeTensor((3, 5), ptr=0x1000), FakeTensor((7,), ptr=0x2000)
    got_kargs, values = rc.kernel_arg_values(PARAMS, {"x": x, "out": out, "n": 9,
                                                      "alpha": 0.5})
    assert values == [0x1000, 3, 5, 5, 1, 0x2000, 7, 1, 9, 0.5]
    buf = rc.pack(got_kargs, values)
    # x at 0, 4 x i32 at 8..24, out at 24 (8-aligned), out.size0 32, stride 36, n 40, alpha 44
    assert len(buf) == 48
    assert struct.unpack("<Q4iQ2iif", buf) == (0x1000, 3, 5, 5, 1, 0x2000, 7, 1, 9, 0.5)


def test_pack_pads_pointer_after_odd_scalar_count():
    buf = rc.pack_values([("i32", -1), ("ptr", 2**64 - 1), ("f32", 1.5)])
    assert len(buf) == 20 and buf[4:8] == b"\0" * 4           # pointer aligned to 8
    assert struct.unpack_from("<i", buf, 0)[0] == -1
    assert struct.unpack_from("<Q", buf, 8)[0] == 2**64 - 1
    assert struct.unpack_from("<f", buf, 16)[0] == 1.5


@pytest.mark.parametrize("pairs, exc, words", [
    ([("i32", 2**31)], OverflowError, "does not fit i32"),
    ([("ptr", -1)], OverflowError, "does not fit ptr"),
    ([("i32", 1.5)], TypeError, "must be an integer"),
    ([("i32", True)], TypeError, "must be an integer"),
    ([("f32", "1")], TypeError, "must be a number"),
    ([("i64", 1)], TypeError, "unsupported type 'i64'"),
])
def test_pack_rejects_bad_values(pairs, exc, words):
    with pytest.raises(exc, match=words):
        rc.pack_values(pairs)


def test_pack_count_mismatch_and_plain_values_need_kargs():
    kargs = kernel_args(PARAMS)
    with pytest.raises(ValueError, match="10 kernel arguments .* but 2 values"):
        rc.pack(kargs, [1, 2])
    with pytest.raises(TypeError, match="kargs="):
        rc.args_buffer([1, 2], None)
    assert rc.args_buffer(b"\1\2", None) == b"\1\2"
    assert rc.args_buffer([("i32", 7)], None) == struct.pack("<i", 7)


def test_dims3():
    assert rc.dims3(5, "grid") == (5, 1, 1)
    assert rc.dims3((2, 3), "grid") == (2, 3, 1)
    for bad in [(0,), (1, 2, 3, 4), (1.0,), (True,), ()]:
        with pytest.raises(ValueError, match="grid"):
            rc.dims3(bad, "grid")


@pytest.mark.parametrize("kwargs, tensor, exc, words", [
    ({}, FakeTensor((4,), device=("cpu", None)), ArgumentError, "on .*move it to the GPU"),
    ({"device": 1}, FakeTensor((4,)), ArgumentError,
     "on cuda:0 but the kernel is loaded on cuda:1"),
    ({"dtype": "f32"}, FakeTensor((4,), dtype="torch.bfloat16"), TypeError,
     "element type bf16 but the kernel expects f32"),
    ({"rank": 2}, FakeTensor((4,)), ValueError, "rank 1 but the kernel expects rank 2"),
    ({}, FakeTensor((4, 4), strides=(1, 4)), ValueError, r"last dimension contiguous.*contiguous\(\)"),
    ({}, FakeTensor((4, 4), strides=(-4, 1)), ValueError, "negative stride"),
    ({}, FakeTensor((2**31,)), ValueError, "i32"),
    ({}, FakeTensor((4,), ptr=0x1004), ValueError, "not 16-byte aligned"),
    ({}, object(), TypeError, "must be a torch tensor"),
])
def test_check_tensor_rejects(kwargs, tensor, exc, words):
    with pytest.raises(exc, match=words):
        rc.check_tensor(tensor, name="x", **kwargs)


def test_check_tensor_accepts():
    rc.check_tensor(FakeTensor((4, 8)), dtype="f32", rank=2, device=0)
    rc.check_tensor(FakeTensor((4, 1), strides=(1, 7)))       # size-1 last dim: any stride
    rc.check_tensor(FakeTensor((4,), ptr=0x1004), align=4)
    rc.check_tensor(FakeTensor((4,), ptr=0x1004), align=None)


def test_kernel_arg_values_checks_every_tensor_and_scalar():
    x, out = FakeTensor((3, 5)), FakeTensor((7,), dtype="torch.float16")
    with pytest.raises(TypeError, match="'out' has element type f16"):
        rc.kernel_arg_values(PARAMS, {"x": x, "out": out, "n": 1, "alpha": 1.0})
    with pytest.raises(ValueError, match="missing kernel argument 'alpha'"):
        rc.kernel_arg_values(PARAMS, {"x": x, "out": FakeTensor((7,)), "n": 1})
    with pytest.raises(TypeError, match="'n' must be an integer"):
        rc.kernel_arg_values(PARAMS, {"x": x, "out": FakeTensor((7,)), "n": 1.5, "alpha": 1.0})


def test_param_layout_check():
    kargs = kernel_args(PARAMS)
    good = [(0, 8), (8, 4), (12, 4), (16, 4), (20, 4), (24, 8), (32, 4), (36, 4), (40, 4),
            (44, 4)]
    rc.check_param_layout("k", good, 48, kargs)
    rc.check_param_layout("k", good, 48)
    with pytest.raises(rc.CudaError, match="take 48 bytes .* buffer has 40"):
        rc.check_param_layout("k", good, 40)
    shifted = good[:5] + [(28, 8)] + [(o + 8, s) for o, s in good[6:]]
    with pytest.raises(rc.CudaError, match="disagree on the kernel-argument ABI"):
        rc.check_param_layout("k", shifted, 56, kargs)


def test_stream_handle():
    assert rc.stream_handle(1234, 0) == 1234
    s = SimpleNamespace(cuda_stream=99, device=SimpleNamespace(index=0))
    assert rc.stream_handle(s, 0) == 99
    with pytest.raises(rc.CudaError, match="stream is on cuda:0 but the module is loaded on cuda:1"):
        rc.stream_handle(s, 1)
    with pytest.raises(TypeError, match="stream must be"):
        rc.stream_handle("default", 0)


def test_image_kind():
    assert rc.image_kind(b"\x7fELF\x02\x01") == "cubin"
    assert rc.image_kind(struct.pack("<I", 0xBA55ED50) + b"\0" * 12) == "fatbin"
    assert rc.image_kind("//\n.version 8.0\n.target sm_90a\n") == "ptx"
    with pytest.raises(rc.CudaError, match="neither a cubin"):
        rc.image_kind(b"hello")


class FakeResult(int):
    """Stands in for a cuda.bindings CUresult enum member (an int with a name)."""

    def __new__(cls, value, name):
        obj = int.__new__(cls, value)
        obj.name = name
        return obj


def test_check_unwraps_and_names_the_call():
    ok = FakeResult(0, "CUDA_SUCCESS")
    assert rc.check((ok, 5), "cuX") == 5
    assert rc.check((ok,), "cuX") is None
    assert rc.check((ok, 1, 2), "cuX") == (1, 2)
    with pytest.raises(rc.CudaError, match=r"cuModuleGetFunction\('k'\) failed with "
                                           r"CUDA_ERROR_NOT_FOUND \(500\): no kernel"):
        rc.check((FakeResult(500, "CUDA_ERROR_NOT_FOUND"), None), "cuModuleGetFunction('k')")


def test_missing_bindings_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(rc, "_DRIVER", None)
    monkeypatch.setitem(sys.modules, "cuda", None)            # import cuda -> ImportError
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(rc.CudaUnavailable, match="pip install cuda-bindings"):
        rc.Module(b"\x7fELF\x02\x01", device=0)


def _has_gpu():
    try:
        rc._init()
        return True
    except rc.CudaUnavailable:
        return False


@pytest.mark.skipif(_has_gpu(), reason="a CUDA GPU is present; bench/device_selftest_cuda.py "
                                       "tests the launcher there")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(rc.CudaUnavailable, match="cuda-bindings|NVIDIA driver|NVIDIA GPU"):
        rc.Module("//\n.version 8.0\n.target sm_90a\n", device=0)


def test_tensor_maps_are_encoded_in_the_device_context_where_none_is_current(monkeypatch):
    """autograd runs a backward on its own device thread, where no CUDA context may be
    current yet: encoding a tensor map there fails with INVALID_CONTEXT, so the encoder
    retries with the tensor's device's primary context made current."""
    import enum
    import ctypes

    class Result(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_CONTEXT = 201

    state = {"current": False, "calls": 0, "devices": []}
    cell = ctypes.create_string_buffer(b"\x07" * 128)

    def encode(*args):
        state["calls"] += 1
        if not state["current"]:
            return Result.CUDA_ERROR_INVALID_CONTEXT, None
        return Result.CUDA_SUCCESS, SimpleNamespace(getPtr=lambda: ctypes.addressof(cell))

    names = lambda *n: SimpleNamespace(**{x: x for x in n})          # noqa: E731
    fake = SimpleNamespace(
        CUresult=Result, cuTensorMapEncodeTiled=encode, cuuint32_t=int, cuuint64_t=int,
        CUtensorMapDataType=names("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
                                  "CU_TENSOR_MAP_DATA_TYPE_UINT8"),
        CUtensorMapSwizzle=names("CU_TENSOR_MAP_SWIZZLE_128B", "CU_TENSOR_MAP_SWIZZLE_NONE"),
        CUtensorMapInterleave=names("CU_TENSOR_MAP_INTERLEAVE_NONE"),
        CUtensorMapL2promotion=names("CU_TENSOR_MAP_L2_PROMOTION_L2_128B"),
        CUtensorMapFloatOOBfill=names("CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"))

    class OnDevice:
        def __init__(self, device):
            state["devices"].append(device)

        def __enter__(self):
            state["current"] = True

        def __exit__(self, *exc):
            state["current"] = False

    monkeypatch.setattr(rc, "driver", lambda: fake)
    monkeypatch.setattr(rc, "_OnDevice", OnDevice)
    t = FakeTensor((256, 64), dtype="torch.bfloat16", device=("cuda", 1), ptr=0x10000)
    t.dim = lambda: 2
    desc = SimpleNamespace(box=(64, 64), swizzle128=True)
    assert rc.encode_tensor_map(t, desc, "bf16") == b"\x07" * 128
    assert state["calls"] == 2 and state["devices"] == [1] and not state["current"]
    state["current"] = True                   # a context current: encoded at once, no switch
    assert rc.encode_tensor_map(t, desc, "bf16") == b"\x07" * 128
    assert state["calls"] == 3 and state["devices"] == [1]
