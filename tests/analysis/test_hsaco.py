"""Reports on real code objects built from hand-written IR: registers, LDS, scratch,
occupancy and the innermost loop's instruction mix."""
import pytest

from pykittens.analysis import hsaco, waves_per_simd
from pykittens.toolchain import amdgpu

MFMA = {
    "gfx942": ("llvm.amdgcn.mfma.f32.32x32x8bf16.1k", "<4 x i16>", "v_mfma_f32_32x32x8_bf16"),
    "gfx950": ("llvm.amdgcn.mfma.f32.32x32x16.bf16", "<8 x bfloat>", "v_mfma_f32_32x32x16_bf16"),
}


def nested_ir(target: str, lds_kib: int = 0) -> str:
    """for j < %n: { b = load B[j]; for i < %k: acc += mfma(A[i], b) }; out = acc.
    Two loops: the inner one holds the MFMA, the outer one a global load and the inner loop.
    With `lds_kib`, the tile of B also goes through an LDS buffer of that size."""
    intr, ty, _ = MFMA[target]
    n = lds_kib * 256
    lds_decl = f"@tile = internal addrspace(3) global [{n} x float] poison, align 16" if n else ""
    lds_use = f"""
  %lp = getelementptr [{n} x float], ptr addrspace(3) @tile, i32 0, i32 %tid
  store float 1.0, ptr addrspace(3) %lp
  call void @llvm.amdgcn.s.barrier()
  %lq = getelementptr [{n} x float], ptr addrspace(3) @tile, i32 0, i32 {n - 1}
  %lv = load float, ptr addrspace(3) %lq
  store float %lv, ptr addrspace(1) %out""" if n else ""
    return f"""
target triple = "amdgcn-amd-amdhsa"
{lds_decl}
declare <16 x float> @{intr}({ty}, {ty}, <16 x float>, i32, i32, i32)
declare i32 @llvm.amdgcn.workitem.id.x()
declare void @llvm.amdgcn.s.barrier()

define amdgpu_kernel void @gemm(ptr addrspace(1) %a, ptr addrspace(1) %b, ptr addrspace(1) %out, i32 %n, i32 %k) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x(){lds_use}
  br label %outer
outer:
  %j = phi i32 [0, %entry], [%j.next, %outer.end]
  %acc0 = phi <16 x float> [zeroinitializer, %entry], [%acc.next, %outer.end]
  %bi = add i32 %j, %tid
  %bp = getelementptr {ty}, ptr addrspace(1) %b, i32 %bi
  %bv = load volatile {ty}, ptr addrspace(1) %bp
  br label %inner
inner:
  %i = phi i32 [0, %outer], [%i.next, %inner]
  %acc = phi <16 x float> [%acc0, %outer], [%acc.next, %inner]
  %ai = add i32 %i, %tid
  %ap = getelementptr {ty}, ptr addrspace(1) %a, i32 %ai
  %av = load {ty}, ptr addrspace(1) %ap
  %acc.next = call <16 x float> @{intr}({ty} %av, {ty} %bv, <16 x float> %acc, i32 0, i32 0, i32 0)
  %i.next = add i32 %i, 1
  %more.i = icmp slt i32 %i.next, %k
  br i1 %more.i, label %inner, label %outer.end
outer.end:
  %j.next = add i32 %j, 1
  %more.j = icmp slt i32 %j.next, %n
  br i1 %more.j, label %outer, label %exit
exit:
  %o = getelementptr <16 x float>, ptr addrspace(1) %out, i32 %tid
  store <16 x float> %acc.next, ptr addrspace(1) %o
  ret void
}}

define amdgpu_kernel void @straight(ptr addrspace(1) %out, float %v) #0 {{
  store float %v, ptr addrspace(1) %out
  ret void
}}

attributes #0 = {{ "amdgpu-flat-work-group-size"="256,256" }}
"""


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PYKITTENS_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module", params=list(MFMA))
def built(request):
    return request.param, amdgpu.compile_ir(nested_ir(request.param), request.param)


def test_report_finds_the_mfma_in_the_innermost_loop(built):
    target, obj = built
    r = hsaco.report(obj, target, kernel_name="gemm")
    assert r["code_object_version"] == 5
    assert r["loops"] == 2
    assert r["loop_mfma"] == 1
    mix = r["loop_instructions"]
    assert mix["mfma"] == 1 and mix["branch"] == 1 and mix["vmem"] >= 1
    assert mix["total"] == sum(v for k, v in mix.items() if k != "total")
    assert mix["total"] < r["instructions"]          # the inner loop, not the whole kernel
    assert r["scratch_bytes"] == 0 and r["vgpr_spill"] == 0 and r["sgpr_spill"] == 0
    assert r["lds_bytes"] == 0
    assert r["unified_vgpr"] >= r["vgpr"] + r["agpr"]
    assert r["num_waves"] == 4                       # 256 work-items / 64
    occ = waves_per_simd(target, registers=r["unified_vgpr"], lds_bytes=0, waves_per_workgroup=4)
    assert r["occupancy_waves_per_simd"] == occ.waves_per_simd >= 1


def test_kernel_without_a_loop(built):
    target, obj = built
    r = hsaco.report(obj, target, kernel_name="straight")
    assert r["loops"] == 0 and r["loop_mfma"] == 0 and r["loop_instructions"] == {}
    assert r["kernarg_bytes"] == 12


def test_metadata_fields(built):
    target, obj = built
    k = hsaco.kernels(obj)["gemm"]
    assert k.wavefront_size == 64 and k.max_flat_workgroup_size == 256
    assert [(a[".offset"], a[".size"], a[".value_kind"]) for a in k.args] == [
        (0, 8, "global_buffer"), (8, 8, "global_buffer"), (16, 8, "global_buffer"),
        (24, 4, "by_value"), (28, 4, "by_value")]
    assert k.kernarg_segment_size >= 32 and k.kernarg_segment_align == 8
    assert k.sgpr_count > 0 and k.private_segment_fixed_size == 0
    with pytest.raises(ValueError, match="2 kernels"):
        hsaco.report(obj, target)
    with pytest.raises(ValueError, match="no kernel 'nope'"):
        hsaco.kernel(obj, "nope")


@pytest.mark.parametrize("target,waves", [("gfx942", 1), ("gfx950", 3)])
def test_lds_limits_occupancy(target, waves):
    # 48 KiB per workgroup: one workgroup fits in gfx942's 64 KiB, three in gfx950's 160 KiB.
    obj = amdgpu.compile_ir(nested_ir(target, lds_kib=48), target)
    r = hsaco.report(obj, target, kernel_name="gemm")
    assert r["lds_bytes"] == 48 << 10
    assert r["occupancy_waves_per_simd"] == waves
    assert r["occupancy_limited_by"] == "lds"


def test_loops_from_disassembly_text():
    asm = "\n".join([
        "k:",
        "\ts_mov_b32 s0, 0 // 0",
        ".L4:",
        "\tglobal_load_dwordx2 v[0:1], v[2:3], off // 4",
        ".Lc:",
        "\tds_read_b128 v[4:7], v8 // c",
        "\tv_mfma_f32_32x32x8_bf16 a[0:15], v[4:5], v[6:7], a[0:15] // 14",
        "\ts_cbranch_scc1 .Lc // 1c",
        "\ts_waitcnt vmcnt(0) // 20",
        "\tv_add_f32_e32 v0, v1, v2 // 24",
        "\ts_cbranch_vccnz .L4 // 28",
        "\ts_branch .L3c // 2c",
        ".L3c:",
        "\ts_endpgm // 3c",
        "other:",
        "\ts_endpgm // 40",
    ])
    insts, labels = hsaco.instructions(asm, "k")
    assert len(insts) == 10 and labels == {".L4": 1, ".Lc": 2, ".L3c": 9}
    found = hsaco.loops(insts, labels)
    assert found == [(2, 4), (1, 7)]                  # innermost first; s_branch forward
    assert hsaco.instruction_mix(insts[2:5]) == {
        "mfma": 1, "vmem": 0, "ds": 1, "valu": 0, "smem": 0, "salu": 0, "branch": 1,
        "other": 0, "total": 3}
    with pytest.raises(ValueError, match="no function 'missing'"):
        hsaco.instructions(asm, "missing")


@pytest.mark.parametrize("mnemonic,cls", [
    ("v_mfma_f32_16x16x32_bf16", "mfma"), ("v_smfmac_f32_32x32x32_bf16", "mfma"),
    ("buffer_load_dwordx4", "vmem"), ("global_store_dword", "vmem"), ("ds_write_b64", "ds"),
    ("v_accvgpr_read_b32", "valu"), ("s_load_dwordx4", "smem"), ("s_setprio", "salu"),
    ("s_cbranch_execz", "branch"), ("s_branch", "branch"), (".long", "other")])
def test_classify(mnemonic, cls):
    assert hsaco.classify(mnemonic) == cls


def test_not_a_code_object():
    with pytest.raises(ValueError, match="not a little-endian ELF64"):
        hsaco.metadata(b"garbage" * 20)
