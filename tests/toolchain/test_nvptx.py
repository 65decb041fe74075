"""NVPTX toolchain: LLVM IR -> PTX always (llvmlite), PTX -> cubin when a ptxas is found."""
import os
import re
import stat

import pytest

from pykittens.toolchain import nvptx
from pykittens.toolchain.isolate import ToolchainError

NO_PTXAS = "ptxas not found: pip install nvidia-cuda-nvcc-cu12 (or the CUDA toolkit)"
needs_ptxas = pytest.mark.skipif(nvptx.find_ptxas() is None, reason=NO_PTXAS)

# The kernel ABI of ir.abi for (x: gl[f32, 1], alpha: f32), with a strided loop.
SCALE_IR = r"""
target triple = "nvptx64-nvidia-cuda"

define ptx_kernel void @scale(ptr addrspace(1) %x, i32 %x.size0, i32 %x.stride0, float %alpha) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %ntid = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %go = icmp slt i32 %tid, %x.size0
  br i1 %go, label %loop, label %exit
loop:
  %i = phi i32 [%tid, %entry], [%inext, %loop]
  %off = mul i32 %i, %x.stride0
  %p = getelementptr float, ptr addrspace(1) %x, i32 %off
  %v = load float, ptr addrspace(1) %p
  %m = fmul float %v, %alpha
  store float %m, ptr addrspace(1) %p
  %inext = add i32 %i, %ntid
  %c = icmp slt i32 %inext, %x.size0
  br i1 %c, label %loop, label %exit
exit:
  ret void
}

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
"""

# A wgmma main loop written with inline PTX: fence, m64n8k16 bf16 MMA on shared-memory
# descriptors, commit, wait. Only sm_90a has these instructions.
WGMMA_IR = r"""
target triple = "nvptx64-nvidia-cuda"

@smem = external addrspace(3) global [0 x i8], align 16

define ptx_kernel void @wgmma_loop(ptr addrspace(1) %out, i32 %out.size0, i32 %out.stride0, i32 %iters) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %sa = ptrtoint ptr addrspace(3) @smem to i32
  %sa64 = zext i32 %sa to i64
  %da = lshr i64 %sa64, 4
  %db = add i64 %da, 64
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%inext, %loop]
  %a0 = phi float [0.0, %entry], [%r0, %loop]
  %a1 = phi float [0.0, %entry], [%r1, %loop]
  %a2 = phi float [0.0, %entry], [%r2, %loop]
  %a3 = phi float [0.0, %entry], [%r3, %loop]
  call void asm sideeffect "wgmma.fence.sync.aligned;", "~{memory}"()
  %r = call {float, float, float, float} asm sideeffect "{\0A.reg .pred p;\0Asetp.ne.b32 p, $6, 0;\0Awgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {$0, $1, $2, $3}, $4, $5, p, 1, 1, 0, 0;\0A}", "=f,=f,=f,=f,l,l,r,0,1,2,3,~{memory}"(i64 %da, i64 %db, i32 1, float %a0, float %a1, float %a2, float %a3)
  call void asm sideeffect "wgmma.commit_group.sync.aligned;", "~{memory}"()
  call void asm sideeffect "wgmma.wait_group.sync.aligned 0;", "~{memory}"()
  %r0 = extractvalue {float, float, float, float} %r, 0
  %r1 = extractvalue {float, float, float, float} %r, 1
  %r2 = extractvalue {float, float, float, float} %r, 2
  %r3 = extractvalue {float, float, float, float} %r, 3
  %inext = add i32 %i, 1
  %c = icmp slt i32 %inext, %iters
  br i1 %c, label %loop, label %exit
exit:
  %s01 = fadd float %r0, %r1
  %s23 = fadd float %r2, %r3
  %s = fadd float %s01, %s23
  %off = mul i32 %tid, %out.stride0
  %p = getelementptr float, ptr addrspace(1) %out, i32 %off
  store float %s, ptr addrspace(1) %p
  ret void
}

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
"""


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path / "cache"))


def test_ptx_has_entry_target_and_abi_params():
    res = nvptx.compile_ir(SCALE_IR, "sm_90a")
    ptx = res["ptx"]
    assert ".target sm_90a" in ptx
    assert re.search(r"^\.version 8\.\d", ptx, re.M)
    assert res["kernels"] == ["scale"] and ".entry scale(" in ptx
    params = re.findall(r"\.param \.(\w+)[^,\n]* scale_param_(\d)", ptx)
    assert params == [("u64", "0"), ("u32", "1"), ("u32", "2"), ("f32", "3")]
    assert re.search(r"@%p\d+ bra\s+\$L__BB0_\d+", ptx)          # the loop survived
    assert res["target"] == "sm_90a"


def test_misspelled_intrinsic_names_the_function():
    bad = SCALE_IR.replace("sreg.ntid.x", "sreg.nitd.x")
    with pytest.raises(nvptx.UnresolvedFunctionError,
                       match=r"llvm\.nvvm\.read\.ptx\.sreg\.nitd\.x.*misspelled"):
        nvptx.compile_ir(bad)


def test_invalid_ir_reports_llvm_message():
    with pytest.raises(ToolchainError, match=r"invalid LLVM IR.*expected"):
        nvptx.compile_ptx("define void @f( {\n")


def test_amd_target_is_rejected():
    with pytest.raises(ValueError, match="not an NVIDIA target.*sm_90a"):
        nvptx.compile_ptx(SCALE_IR, "gfx942")


def test_extern_parser():
    ptx = """
.extern .shared .align 16 .b8 smem[];
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.extern .func  (.param .b32 func_retval0) llvm.nvvm.fooo
(
	.param .b32 llvm_param_0
)
;
.extern .func __nv_missing_helper;
"""
    assert nvptx.extern_functions(ptx) == ["llvm.nvvm.fooo", "__nv_missing_helper"]


def test_cache_hit_skips_both_compilers(monkeypatch, tmp_path):
    first = nvptx.compile_ir(SCALE_IR)

    def boom(*a, **k):
        raise AssertionError("recompiled despite a cache hit")
    monkeypatch.setattr(nvptx, "run_isolated", boom)
    monkeypatch.setattr(nvptx, "_run_ptxas", boom)
    again = nvptx.compile_ir(SCALE_IR)
    assert again == first
    assert os.listdir(tmp_path / "cache" / "ptx")
    # a different IR is a miss, and so reaches the (now failing) compiler
    with pytest.raises(AssertionError, match="recompiled"):
        nvptx.compile_ir(SCALE_IR.replace("fmul", "fadd"))


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_env_override_and_version(monkeypatch, tmp_path):
    fake = _script(tmp_path / "ptxas", 'echo "Cuda compilation tools, release 12.8, V12.8.93"')
    monkeypatch.setenv("PYKITTENS_PTXAS", fake)
    assert nvptx.find_ptxas() == fake
    assert "ptxas 12.8.93" in nvptx.toolchain_version()
    broken = _script(tmp_path / "ptxas-broken", "exit 1")
    monkeypatch.setenv("PYKITTENS_PTXAS", broken)
    with pytest.raises(ToolchainError, match="PYKITTENS_PTXAS=.*not a runnable ptxas"):
        nvptx.find_ptxas()


def test_without_ptxas_cubin_is_none(monkeypatch):
    monkeypatch.setattr(nvptx, "find_ptxas", lambda: None)
    res = nvptx.compile_ir(SCALE_IR)
    assert res["cubin"] is None and ".entry scale" in res["ptx"]
    assert "nvidia-cuda-nvcc" in res["ptxas_log"]


@needs_ptxas
def test_cubin_from_ptxas():
    res = nvptx.compile_ir(SCALE_IR)
    assert res["cubin"][:4] == b"\x7fELF"
    assert "Compiling entry function 'scale' for 'sm_90a'" in res["ptxas_log"]
    assert re.search(r"Used \d+ registers", res["ptxas_log"])


@needs_ptxas
def test_wgmma_inline_ptx_assembles_for_sm90a():
    res = nvptx.compile_ir(WGMMA_IR)
    assert "wgmma.fence.sync.aligned;" in res["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16" in res["ptx"]
    assert res["cubin"][:4] == b"\x7fELF"
    assert "Compiling entry function 'wgmma_loop'" in res["ptxas_log"]


@needs_ptxas
def test_ptxas_error_is_reported_with_saved_ptx():
    bad = SCALE_IR.replace("  %inext", '  call void asm sideeffect "wgmma.fence.sync.bogus;", ""()\n  %inext')
    with pytest.raises(ToolchainError, match=r"ptxas .*failed for sm_90a.*saved to .*\.ptx"):
        nvptx.compile_ir(bad)
