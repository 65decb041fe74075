"""The HIP launch path without a GPU: the argument buffer is checked against real code-object
metadata from AMD's LLVM, and launching where no HIP runtime exists says what to do."""
import ctypes
import struct

import pytest

from pykittens.analysis import hsaco
from pykittens.ir import types as T
from pykittens.ir.nodes import Param
from pykittens.ir import abi
from pykittens.runtime import hip
from pykittens.toolchain import amdgpu

PARAMS = [Param("x", "gl", T.GlobalType(T.f32, (None, None))),
          Param("alpha", "scalar", T.ScalarType(T.f32)),
          Param("n", "scalar", T.ScalarType(T.i32))]


def scale_ir(size0_type: str = "i32", hidden: bool = False) -> str:
    """x[r, c] = alpha * x[r, c] + n for r < size0 (workgroup id), c < size1 (lane), with the
    parameters abi.kernel_args gives for PARAMS. `hidden` reads the workgroup size from the
    implicit arguments, which keeps LLVM from dropping the hidden_* kernel arguments."""
    ext = "" if size0_type == "i32" else f"\n  %s0 = trunc {size0_type} %x.size0 to i32"
    s0 = "%x.size0" if size0_type == "i32" else "%s0"
    col = "%col = call i32 @llvm.amdgcn.workitem.id.x()"
    if hidden:   # code object v5: hidden_group_size_x is an i16 at implicit-argument offset 12
        col = """%imp = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
  %gsp = getelementptr i8, ptr addrspace(4) %imp, i64 12
  %gs16 = load i16, ptr addrspace(4) %gsp
  %gs = zext i16 %gs16 to i32
  %lane = call i32 @llvm.amdgcn.workitem.id.x()
  %col = urem i32 %lane, %gs"""
    return f"""
target triple = "amdgcn-amd-amdhsa"
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()

define amdgpu_kernel void @scale(ptr addrspace(1) %x, {size0_type} %x.size0, i32 %x.size1, i32 %x.stride0, i32 %x.stride1, float %alpha, i32 %n) #0 {{
entry:{ext}
  %row = call i32 @llvm.amdgcn.workgroup.id.x()
  {col}
  %in0 = icmp slt i32 %row, {s0}
  %in1 = icmp slt i32 %col, %x.size1
  %in = and i1 %in0, %in1
  br i1 %in, label %body, label %done
body:
  %o0 = mul i32 %row, %x.stride0
  %o1 = mul i32 %col, %x.stride1
  %o = add i32 %o0, %o1
  %p = getelementptr float, ptr addrspace(1) %x, i32 %o
  %v = load float, ptr addrspace(1) %p
  %nf = sitofp i32 %n to float
  %s = fmul float %v, %alpha
  %r = fadd float %s, %nf
  store float %r, ptr addrspace(1) %p
  br label %done
done:
  ret void
}}
attributes #0 = {{ "amdgpu-flat-work-group-size"="64,64" }}
"""


class DeviceTensor:
    """What pack_kernargs reads from a torch tensor: data_ptr(), shape, stride()."""

    def __init__(self, ptr, shape, strides):
        self.ptr, self.shape, self._strides = ptr, shape, strides

    def data_ptr(self):
        return self.ptr

    def stride(self, d):
        return self._strides[d]


VALUES = {"x": DeviceTensor(0x7F00_1234_5000, (96, 48), (64, 1)), "alpha": 1.5, "n": -7}


pytestmark = pytest.mark.usefixtures("module_cache")     # a private code-object cache


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("hidden", [False, True])
def test_packed_arguments_match_the_code_object(target, hidden):
    obj = amdgpu.compile_ir(scale_ir(hidden=hidden), target)
    k = hsaco.kernel(obj, "scale")
    args = abi.kernel_args(PARAMS)
    explicit = [m for m in k.args if not m[".value_kind"].startswith("hidden_")]
    # the ABI's own offsets and sizes are what LLVM laid out
    assert [(m[".offset"], m[".size"]) for m in explicit] == \
        [(o, a.size) for o, a in zip(abi.offsets(args), args)]
    assert [m[".name"] for m in explicit] == [a.name for a in args]
    hidden_args = [m for m in k.args if m[".value_kind"].startswith("hidden_")]
    assert bool(hidden_args) == hidden
    buf = hip.pack_kernargs(args, VALUES, list(k.args), segment_size=k.kernarg_segment_size)
    assert len(buf) == k.kernarg_segment_size
    at = {m[".name"]: m[".offset"] for m in explicit}
    assert struct.unpack_from("<Q", buf, at["x"])[0] == 0x7F00_1234_5000
    assert struct.unpack_from("<4i", buf, at["x.size0"]) == (96, 48, 64, 1)
    assert struct.unpack_from("<f", buf, at["alpha"])[0] == 1.5
    assert struct.unpack_from("<i", buf, at["n"])[0] == -7
    end = max(m[".offset"] + m[".size"] for m in explicit)
    assert buf[end:] == bytes(len(buf) - end)        # hidden arguments: left to ROCm
    if hidden:   # v5 layout: 256 bytes of implicit arguments from the next 8-byte boundary
        first = min(m[".offset"] for m in hidden_args)
        assert first == 32 and k.kernarg_segment_size == first + 256
        kinds = {m[".value_kind"]: m[".offset"] for m in hidden_args}
        assert kinds["hidden_group_size_x"] == first + 12    # where the IR reads it


def test_a_layout_disagreement_is_caught():
    # x.size0 as i64 shifts every later argument: the code object no longer matches the ABI.
    obj = amdgpu.compile_ir(scale_ir(size0_type="i64"), "gfx942")
    k = hsaco.kernel(obj)
    with pytest.raises(hip.KernargMismatch, match=r"'x.size0'.*offset 8 size 4.*offset 8 size 8"):
        hip.pack_kernargs(abi.kernel_args(PARAMS), VALUES, list(k.args))


def test_a_swap_that_offsets_cannot_see_is_caught_by_name():
    ir = scale_ir().replace("float %alpha, i32 %n)", "i32 %n, float %alpha)")
    k = hsaco.kernel(amdgpu.compile_ir(ir, "gfx950"))
    with pytest.raises(hip.KernargMismatch, match="5 is 'alpha' in the pykittens ABI but 'n'"):
        hip.pack_kernargs(abi.kernel_args(PARAMS), VALUES, list(k.args))


def test_values_by_address_and_by_name():
    obj = amdgpu.compile_ir(scale_ir(), "gfx950")
    k = hsaco.kernel(obj)
    args = abi.kernel_args(PARAMS)
    by_name = {"x": 0x1000, "x.size0": 96, "x.size1": 48, "x.stride0": 64, "x.stride1": 1,
               "alpha": 1.5, "n": -7}
    vals = dict(VALUES, x=DeviceTensor(0x1000, (96, 48), (64, 1)))
    assert hip.pack_kernargs(args, by_name, list(k.args)) == \
        hip.pack_kernargs(args, vals, list(k.args))
    with pytest.raises(KeyError, match="x.size1"):
        hip.pack_kernargs(args, {"x": 0x1000, "x.size0": 1, "alpha": 1.0, "n": 1},
                          list(k.args))
    with pytest.raises(OverflowError, match="'n' = 2147483648"):
        hip.pack_kernargs(args, dict(VALUES, n=2**31), list(k.args))
    with pytest.raises(TypeError, match="'alpha' must be a number"):
        hip.pack_kernargs(args, dict(VALUES, alpha="1.5"), list(k.args))
    with pytest.raises(hip.KernargMismatch, match="smaller"):
        hip.pack_kernargs(args, VALUES, list(k.args), segment_size=8)


def test_launch_without_hip_says_to_emulate(monkeypatch, tmp_path):
    obj = amdgpu.compile_ir(scale_ir(), "gfx942")
    monkeypatch.setenv("PYKITTENS_HIP_LIB", str(tmp_path / "libamdhip64.so"))
    monkeypatch.setattr(hip, "_HIP", None)
    with pytest.raises(hip.HipError) as e:
        hip.launch(obj, "scale", PARAMS, VALUES, grid=96, num_waves=1)
    assert str(e.value) == hip.NO_HIP
    assert "libamdhip64.so" in str(e.value) and "pk.emulate" in str(e.value)
    # argument and launch-shape problems are reported before HIP is needed
    with pytest.raises(ValueError, match="at most 1 waves"):
        hip.launch(obj, "scale", PARAMS, VALUES, grid=96, num_waves=2)
    with pytest.raises(ValueError, match="65536"):
        hip.launch(obj, "scale", PARAMS, VALUES, grid=96, num_waves=1,
                   dynamic_lds_bytes=65 << 10)


def test_this_machine_has_no_hip_runtime(monkeypatch):
    monkeypatch.delenv("PYKITTENS_HIP_LIB", raising=False)
    for path in hip.hip_library_candidates():
        try:
            ctypes.CDLL(path)
        except OSError:
            continue
        pytest.skip(f"a HIP runtime is installed here ({path})")
    monkeypatch.setattr(hip, "_HIP", None)
    with pytest.raises(hip.HipError, match="no HIP runtime found"):
        hip.hip_runtime()
