"""Reports on real code objects built from hand-written IR: registers, LDS, scratch,
occupancy and the main loop's instruction mix; loop finding on small disassembly texts."""
import re

import pytest

from pykittens.analysis import hsaco, waves_per_simd
from pykittens.analysis.cfg import dominators
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


pytestmark = pytest.mark.usefixtures("module_cache")     # a private code-object cache


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


def _text(*lines: str, name: str = "k") -> str:
    """Disassembly text as amdgpu.disassemble writes it: labels flush left, instructions
    tab-indented with a `// addr` comment."""
    out, addr = [f"{name}:"], 0
    for ln in lines:
        if ln.endswith(":"):
            assert re.fullmatch(r"\.L[0-9a-f]+:", ln), ln     # the disassembler's labels
            out.append(ln)
        else:
            out.append(f"\t{ln:<60} // {addr:x}")
            addr += 4
    return "\n".join(out) + "\n"


MFMA_I = "v_mfma_f32_32x32x8_bf16 a[0:15], v[4:5], v[6:7], a[0:15]"


def _loops(asm: str):
    insts, labels = hsaco.instructions(asm, "k")
    return insts, labels, hsaco.loops(insts, labels)


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
    blocks, succs = hsaco.basic_blocks(insts, labels)
    assert blocks == [range(0, 1), range(1, 2), range(2, 5), range(5, 8), range(8, 9),
                      range(9, 10)]
    assert succs == [[1], [2], [2, 3], [1, 4], [5], []]   # s_branch: no fall-through
    found = hsaco.loops(insts, labels)
    assert found == [hsaco.Loop(header=1, body=(1, 2, 3, 4, 5, 6, 7), innermost=False),
                     hsaco.Loop(header=2, body=(2, 3, 4), innermost=True)]
    assert hsaco.main_loop(insts, labels) == found[1]
    assert hsaco.instruction_mix(found[1].instructions(insts)) == {
        "mfma": 1, "vmem": 0, "ds": 1, "valu": 0, "smem": 0, "salu": 0, "branch": 1,
        "other": 0, "total": 3}
    with pytest.raises(ValueError, match="no function 'missing'"):
        hsaco.instructions(asm, "missing")


def test_latch_above_header_and_shared_exit_are_not_mistaken():
    """The pinned GEMM's layout: the entry jumps down to the loop header, the latch block with
    the MFMAs sits above the header and falls through into it; the epilogue branches back up
    to a shared s_endpgm. A backward-branch scan finds two 'loops' and takes the epilogue's
    (no MFMA) as innermost; the dominator tree finds the one real loop, MFMAs included."""
    asm = _text(
        "s_mov_b32 s0, 0",                               # 0  entry
        "s_branch .L1b",                                 # 1  down to the header
        ".L1a:",                                         #    latch
        MFMA_I,                                          # 2
        MFMA_I,                                          # 3
        "s_cbranch_scc0 .L1d",                           # 4  exit, else fall into the header
        ".L1b:",                                         #    header
        "buffer_load_dword v0, v1, s[4:7], 0 offen",     # 5
        "s_cbranch_execz .L1c",                          # 6
        "v_mov_b32_e32 v200, v0",                        # 7
        ".L1c:",
        "s_cmp_lg_u32 s0, 0",                            # 8
        "s_branch .L1a",                                 # 9  up to the latch
        ".L1d:",                                         #    epilogue
        "s_cbranch_execnz .L1f",                         # 10
        ".L1e:",
        "s_endpgm",                                      # 11 shared exit
        ".L1f:",
        "buffer_store_dword v0, v1, s[4:7], 0 offen",    # 12
        "s_cbranch_execz .L1e",                          # 13 backward, but to the exit
        "s_endpgm",                                      # 14
        "s_nop 0",                                       # 15 unreachable padding
    )
    insts, labels, found = _loops(asm)
    assert found == [hsaco.Loop(header=5, body=tuple(range(2, 10)), innermost=True)]
    main = hsaco.main_loop(insts, labels)
    assert main.header == 5 and main.mfma(insts) == 2


def test_main_loop_is_the_mfma_loop_not_a_nested_waterfall():
    """A K loop with an MFMA and, nested in it, a loop without MFMAs (e.g. a readfirstlane
    waterfall): the K loop is the main loop, though it is not innermost."""
    asm = _text(
        ".La:",
        "v_add_u32_e32 v0, 1, v0",               # 0
        ".Lb:",
        "v_readfirstlane_b32 s4, v0",            # 1
        "s_cbranch_execnz .Lb",                  # 2
        MFMA_I,                                  # 3
        "s_cbranch_scc1 .La",                    # 4
        "s_endpgm",                              # 5
    )
    insts, labels, found = _loops(asm)
    assert [(lp.header, lp.innermost) for lp in found] == [(0, False), (1, True)]
    assert hsaco.main_loop(insts, labels) == found[0]


def test_main_loop_picks_the_most_mfma_then_the_largest():
    asm = _text(
        ".La:",
        MFMA_I,                                  # 0: loop A, one MFMA
        "s_cbranch_scc1 .La",                    # 1
        ".Lb:",
        MFMA_I,                                  # 2: loop B, two MFMAs
        MFMA_I,                                  # 3
        "s_cbranch_scc1 .Lb",                    # 4
        ".Lc:",
        "v_add_f32_e32 v0, v1, v2",              # 5: loop C, no MFMA, the largest
        "v_add_f32_e32 v0, v1, v2",              # 6
        "v_add_f32_e32 v0, v1, v2",              # 7
        "s_cbranch_scc1 .Lc",                    # 8
        "s_endpgm",                              # 9
    )
    insts, labels, found = _loops(asm)
    assert [lp.header for lp in found] == [0, 2, 5] and all(lp.innermost for lp in found)
    assert hsaco.main_loop(insts, labels).header == 2
    no_mfma = asm.replace(MFMA_I, "v_mul_f32_e32 v0, v1, v2")
    insts, labels, found = _loops(no_mfma)
    assert hsaco.main_loop(insts, labels).header == 5       # the most instructions


def test_flow_ends_and_unknown_targets():
    asm = _text(
        ".L0:",
        "s_cbranch_scc1 65",                     # 0: not a label: fall-through only
        "s_setpc_b64 s[30:31]",                  # 1: return: no successor
        "s_branch .L0",                        # 2: unreachable: no loop
        "s_endpgm",                              # 3
    )
    insts, labels, found = _loops(asm)
    blocks, succs = hsaco.basic_blocks(insts, labels)
    assert succs == [[1], [], [0], []]
    assert found == [] and hsaco.main_loop(insts, labels) is None
    assert dominators(succs) == {0: {0}, 1: {0, 1}}           # reachable blocks only


@pytest.mark.parametrize("target,mfma", [("gfx942", 4), ("gfx950", 2)])
def test_report_of_the_pinned_gemm_counts_its_mfmas(target, mfma):
    """A real kernel whose K loop is laid out latch-above-header (see above)."""
    import pykittens as pk
    from pykittens import compiler

    from test_cdna_static import pinned_gemm   # the pinned GEMM of the CDNA checks

    obj = compiler.code_object(pinned_gemm, target)
    r = hsaco.report(obj, target, num_waves=1)
    insts, _ = hsaco.instructions(amdgpu.disassemble(obj, target), "pinned_gemm")
    assert sum(hsaco.classify(op) == "mfma" for op, _ in insts) == mfma
    assert r["loops"] == 1 and r["loop_mfma"] == mfma == r["loop_instructions"]["mfma"]
    assert r["loop_instructions"]["total"] < r["instructions"]


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
