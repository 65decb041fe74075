"""The AMD toolchain for real: AMD's LLVM (rocm-llvm-python) and ld.lld build code objects
from hand-written IR; failures come back as ToolchainError, never as a dead test process."""
import os
import re
import tempfile

import pytest

from pykittens.analysis import hsaco
from pykittens.toolchain import ToolchainError, amdgpu

from conftest import needs_amd_llvm

# The bf16 MFMA of each chip: its intrinsic, operand type, and the mnemonic it assembles to.
MFMA = {
    "gfx942": ("llvm.amdgcn.mfma.f32.32x32x8bf16.1k", "<4 x i16>", "v_mfma_f32_32x32x8_bf16"),
    "gfx950": ("llvm.amdgcn.mfma.f32.32x32x16.bf16", "<8 x bfloat>", "v_mfma_f32_32x32x16_bf16"),
}


def mfma_loop_ir(target: str) -> str:
    """acc += A_i * A_i over %k steps, one MFMA per iteration."""
    intr, ty, _ = MFMA[target]
    return f"""
target triple = "amdgcn-amd-amdhsa"

declare <16 x float> @{intr}({ty}, {ty}, <16 x float>, i32, i32, i32)
declare i32 @llvm.amdgcn.workitem.id.x()

define amdgpu_kernel void @mma_loop(ptr addrspace(1) %a, ptr addrspace(1) %out, i32 %k) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%i.next, %loop]
  %acc = phi <16 x float> [zeroinitializer, %entry], [%acc.next, %loop]
  %row = mul i32 %i, 64
  %idx = add i32 %row, %tid
  %p = getelementptr {ty}, ptr addrspace(1) %a, i32 %idx
  %v = load {ty}, ptr addrspace(1) %p
  %acc.next = call <16 x float> @{intr}({ty} %v, {ty} %v, <16 x float> %acc, i32 0, i32 0, i32 0)
  %i.next = add i32 %i, 1
  %more = icmp slt i32 %i.next, %k
  br i1 %more, label %loop, label %exit
exit:
  %o = getelementptr <16 x float>, ptr addrspace(1) %out, i32 %tid
  store <16 x float> %acc.next, ptr addrspace(1) %o
  ret void
}}

attributes #0 = {{ "amdgpu-flat-work-group-size"="256,256" }}
"""


def pinned_ir(target: str) -> str:
    """An MFMA written as inline asm on pinned registers: operands in v[0:1]/v[2:3] (v[0:3]/
    v[4:7] on gfx950) through constraints, the accumulator in a[0:15] named in the text and
    declared clobbered, read back with v_accvgpr_read — how HipKittens pins tiles."""
    _, ty, mnem = MFMA[target]
    a, b = ("v[0:1]", "v[2:3]") if target == "gfx942" else ("v[0:3]", "v[4:7]")
    clobbers = ",".join(f"~{{a{i}}}" for i in range(16))
    return f"""
target triple = "amdgcn-amd-amdhsa"

define amdgpu_kernel void @pinned(ptr addrspace(1) %out, ptr addrspace(1) %in) {{
  %x = load {ty}, ptr addrspace(1) %in
  call void asm sideeffect "v_accvgpr_write_b32 a0, 0", "~{{a0}}"()
  call void asm sideeffect "{mnem} a[0:15], {a}, {b}, a[0:15]", "{{{a}}},{{{b}}},{clobbers}"({ty} %x, {ty} %x)
  %r = call float asm sideeffect "v_accvgpr_read_b32 $0, a15", "=v"()
  store float %r, ptr addrspace(1) %out
  ret void
}}
"""


def lds_ir(kib: int) -> str:
    n = kib * 256
    return f"""
target triple = "amdgcn-amd-amdhsa"
@tile = internal addrspace(3) global [{n} x float] poison, align 16
declare i32 @llvm.amdgcn.workitem.id.x()
declare void @llvm.amdgcn.s.barrier()

define amdgpu_kernel void @lds_user(ptr addrspace(1) %out) #0 {{
  %t = call i32 @llvm.amdgcn.workitem.id.x()
  %p = getelementptr [{n} x float], ptr addrspace(3) @tile, i32 0, i32 %t
  store float 1.0, ptr addrspace(3) %p
  call void @llvm.amdgcn.s.barrier()
  %q = getelementptr [{n} x float], ptr addrspace(3) @tile, i32 0, i32 {n - 1}
  %v = load float, ptr addrspace(3) %q
  store float %v, ptr addrspace(1) %out
  ret void
}}
attributes #0 = {{ "amdgpu-flat-work-group-size"="256,256" }}
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where failed IR is saved


@pytest.mark.parametrize("target", list(MFMA))
def test_mfma_loop_builds_a_v5_code_object(target):
    obj = amdgpu.compile_ir(mfma_loop_ir(target), target)
    assert obj[:4] == b"\x7fELF"
    md = hsaco.metadata(obj)
    assert md["amdhsa.version"] == [1, 2]                  # code object v5 metadata
    assert hsaco.code_object_version(obj) == 5
    assert md["amdhsa.target"] == f"amdgcn-amd-amdhsa--{target}"
    (k,) = md["amdhsa.kernels"]
    assert k[".name"] == "mma_loop" and k[".symbol"] == "mma_loop.kd"
    assert k[".agpr_count"] > 0 or k[".vgpr_count"] >= 16   # the 16-float accumulator lives somewhere
    asm = amdgpu.disassemble(obj, target)
    assert MFMA[target][2] in asm
    # the loop is visible: a conditional branch back to a label defined above it
    branch = re.search(r"s_cbranch_\w+ (\.L[0-9a-f]+)", asm)
    assert branch and asm.index(branch.group(1) + ":") < branch.start()


def test_code_object_version_is_a_choice():
    ir = mfma_loop_ir("gfx942")
    v6 = amdgpu.compile_ir(ir, "gfx942", code_object_version=6)
    assert hsaco.code_object_version(v6) == 6             # e_ident[EI_ABIVERSION] = 4
    assert hsaco.metadata(v6)["amdhsa.version"] == [1, 2]  # v6 kept the v5 metadata version
    assert amdgpu.compile_ir(ir, "gfx942", code_object_version=5) != v6
    with pytest.raises(ValueError, match="code_object_version"):
        amdgpu.compile_ir(ir, "gfx942", code_object_version=3)


def test_a_module_flag_in_the_ir_must_agree():
    ir = mfma_loop_ir("gfx942") + (
        '!llvm.module.flags = !{!0, !1}\n'
        '!0 = !{i32 1, !"amdhsa_code_object_version", i32 400}\n'
        '!1 = !{i32 1, !"wchar_size", i32 4}\n')
    with pytest.raises(ValueError, match="amdhsa_code_object_version 400"):
        amdgpu.compile_ir(ir, "gfx942")
    assert hsaco.code_object_version(amdgpu.compile_ir(ir, "gfx942",
                                                       code_object_version=4)) == 4


def test_other_module_flags_are_kept():
    ir = mfma_loop_ir("gfx950") + ('!llvm.module.flags = !{!0}\n'
                                   '!0 = !{i32 1, !"wchar_size", i32 4}\n')
    assert hsaco.code_object_version(amdgpu.compile_ir(ir, "gfx950")) == 5


@pytest.mark.parametrize("target", list(MFMA))
def test_inline_asm_on_pinned_agprs(target):
    obj = amdgpu.compile_ir(pinned_ir(target), target)
    asm = amdgpu.disassemble(obj, target)
    a, b = ("v[0:1]", "v[2:3]") if target == "gfx942" else ("v[0:3]", "v[4:7]")
    assert f"{MFMA[target][2]} a[0:15], {a}, {b}, a[0:15]" in asm
    assert "v_accvgpr_read_b32 v0, a15" in asm or re.search(r"v_accvgpr_read_b32 v\d+, a15", asm)
    assert hsaco.kernels(obj)["pinned"].agpr_count == 16


def test_llvm_crash_is_an_error_not_a_dead_process():
    # AMD's LLVM segfaults on an inline-asm output of 16 floats pinned to the single AGPR
    # a0; only the compile subprocess dies, and the caller gets an error with the IR kept.
    ir = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @bad(ptr addrspace(1) %out, <4 x i16> %x) {
  %r = call [16 x float] asm sideeffect "v_mfma_f32_32x32x8_bf16 $0, $1, $2, 0", "={a0},v,v"(<4 x i16> %x, <4 x i16> %x)
  store [16 x float] %r, ptr addrspace(1) %out
  ret void
}
"""
    with pytest.raises(ToolchainError, match="crashed the compiler process") as e:
        amdgpu.compile_ir(ir, "gfx942")
    saved = re.search(r"saved to (\S+\.ll)", str(e.value)).group(1)
    with open(saved) as f:
        assert "@bad" in f.read()


def test_machine_verifier_errors_are_reported():
    # A <16 x float> inline-asm result pinned to a[0:15]: LLVM's machine verifier rejects
    # the copy out of it ("Operand has incorrect register class"), reported once with a count.
    ir = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @bad(ptr addrspace(1) %out, <4 x i16> %x) {
  %r = call <16 x float> asm sideeffect "v_mfma_f32_32x32x8_bf16 $0, $1, $2, 0", "={a[0:15]},v,v"(<4 x i16> %x, <4 x i16> %x)
  store <16 x float> %r, ptr addrspace(1) %out
  ret void
}
"""
    with pytest.raises(ToolchainError, match=r"LLVMError: Illegal instruction detected: "
                                             r"Operand has incorrect register class\.? \(x\d+\)"):
        amdgpu.compile_ir(ir, "gfx942")


def test_lds_over_the_chip_limit_is_a_clear_error():
    with pytest.raises(ToolchainError, match=r"local memory \(131072\) exceeds limit \(65536\)"):
        amdgpu.compile_ir(lds_ir(128), "gfx942")
    # CDNA4 has 160 KiB of LDS: the same kernel is fine there.
    obj = amdgpu.compile_ir(lds_ir(128), "gfx950")
    assert hsaco.kernels(obj)["lds_user"].group_segment_fixed_size == 128 << 10


@needs_amd_llvm          # the message of AMD's LLVM (llvmlite words it differently)
def test_bad_ir_names_the_problem_and_keeps_the_ir():
    with pytest.raises(ToolchainError, match="could not parse the IR") as e:
        amdgpu.compile_ir("define amdgpu_kernel void @k( {", "gfx942")
    saved = re.search(r"saved to (\S+\.ll)", str(e.value)).group(1)
    assert os.path.exists(saved)


def test_inline_asm_assembler_errors_are_reported():
    ir = pinned_ir("gfx942").replace("a[0:15], v[0:1]", "a[0:15], a[0:15]", 1)
    with pytest.raises(ToolchainError, match="invalid operand for instruction"):
        amdgpu.compile_ir(ir, "gfx942")


def test_a_missing_device_function_fails_at_link_time():
    ir = """
target triple = "amdgcn-amd-amdhsa"
declare float @__ocml_exp_f32(float)
define amdgpu_kernel void @k(ptr addrspace(1) %p) {
  %v = load float, ptr addrspace(1) %p
  %e = call float @__ocml_exp_f32(float %v)
  store float %e, ptr addrspace(1) %p
  ret void
}
"""
    with pytest.raises(ToolchainError, match="failed to link.*undefined symbol: __ocml_exp_f32"):
        amdgpu.compile_ir(ir, "gfx950")


def test_cache_returns_the_same_bytes_without_compiling(tmp_path, monkeypatch):
    ir = mfma_loop_ir("gfx942")
    first = amdgpu.compile_ir(ir, "gfx942")
    assert len(os.listdir(tmp_path / "cache" / "hsaco")) == 1

    def no_compile(*a, **k):
        raise AssertionError("compiled again despite a cache hit")

    monkeypatch.setattr(amdgpu, "run_isolated", no_compile)
    assert amdgpu.compile_ir(ir, "gfx942") == first
    with pytest.raises(AssertionError, match="compiled again"):    # another target misses
        amdgpu.compile_ir(ir, "gfx950")


def test_llvmlite_fallback_without_inline_asm(monkeypatch):
    monkeypatch.setenv("PYKITTENS_AMDGPU_CODEGEN", "llvmlite")
    obj = amdgpu.compile_ir(mfma_loop_ir("gfx950"), "gfx950")
    assert hsaco.code_object_version(obj) == 5
    assert "v_mfma_f32_32x32x16_bf16" in amdgpu.disassemble(obj, "gfx950")
    with pytest.raises(ToolchainError, match="inline asm.*rocm-llvm-python"):
        amdgpu.compile_ir(pinned_ir("gfx950"), "gfx950")


def test_without_rocm_llvm_python(monkeypatch):
    # as on a machine where the wheel does not exist (e.g. Python 3.13 or aarch64)
    monkeypatch.setattr(amdgpu, "_have_rocm", lambda: False)
    with pytest.raises(ToolchainError, match="inline asm.*rocm-llvm-python"):
        amdgpu.compile_ir(pinned_ir("gfx942"), "gfx942")
    obj = amdgpu.compile_ir(mfma_loop_ir("gfx942"), "gfx942")        # llvmlite builds it
    assert hsaco.kernels(obj)["mma_loop"].wavefront_size == 64
    with pytest.raises(ToolchainError, match="disassembling gfx942 code needs AMD's LLVM"):
        amdgpu.disassemble(obj, "gfx942")
    assert amdgpu.toolchain_version().startswith("llvmlite ")


def test_missing_linker_says_what_to_install(monkeypatch, tmp_path):
    if os.path.exists("/opt/rocm/llvm/bin/ld.lld"):
        pytest.skip("ROCm's ld.lld is always found")
    monkeypatch.delenv("PYKITTENS_LD_LLD", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match="apt-get install lld-19"):
        amdgpu.find_lld()
    monkeypatch.setenv("PYKITTENS_LD_LLD", str(tmp_path / "nope"))
    with pytest.raises(ToolchainError, match="PYKITTENS_LD_LLD"):
        amdgpu.compile_ir(mfma_loop_ir("gfx942"), "gfx942")


def test_only_amd_targets():
    with pytest.raises(ValueError, match="not an AMD target"):
        amdgpu.compile_ir(mfma_loop_ir("gfx942"), "sm_90a")


@needs_amd_llvm
def test_toolchain_version_names_both_tools():
    v = amdgpu.toolchain_version()
    assert re.match(r"rocm-llvm-python \d+\.\d+", v) and "LLD" in v
