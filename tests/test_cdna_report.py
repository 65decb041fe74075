"""The resource report's executed loop and occupancy limits, on real CDNA code objects.

The executed loop is what an interior tile runs of the main loop: the renderer tags the
ragged-edge sides in the code object's line table and the report follows the loop without
them. Checked here against what the instructions themselves say: the in-bounds side moves
16-byte vectors, the edge side single elements."""
import runpy

import pytest

from pykittens import compiler
from pykittens.analysis import hsaco, waves_per_simd
from pykittens.kernels import KERNELS
from pykittens.toolchain import amdgpu
from conftest import ROOT

CDNA = ("gfx942", "gfx950")
pinned_gemm = runpy.run_path(f"{ROOT}/docs/examples/pinned_gemm.py")["pinned_gemm"]


def loop_and_path(kernel, target, **consts):
    obj = compiler.code_object(kernel, target, **consts)
    name = compiler.lane_ir(kernel, target, **consts).name
    asm = amdgpu.disassemble(obj, target)
    insts, labels = hsaco.instructions(asm, name)
    lines = hsaco.line_of_addresses(obj, hsaco.addresses(asm, name))
    loop = hsaco.main_loop(insts, labels)
    return insts, loop, hsaco.interior_path(insts, labels, loop, lines), lines


@pytest.mark.parametrize("target", CDNA)
def test_interior_iteration_of_the_pinned_gemm(target):
    insts, loop, path, lines = loop_and_path(pinned_gemm, target)
    ops = [insts[i][0] for i in loop.body]
    run = [insts[i][0] for i in path]
    assert set(path) < set(loop.body)
    assert "buffer_load_ushort" in ops                     # the loop holds the edge loads ...
    # per lane and tile: 4 runs of 4 bf16 (gfx942), 2 runs of 8 (gfx950), one vector load each
    assert [op for op in run if op.startswith("buffer_")] == \
        {"gfx942": ["buffer_load_dwordx2"] * 8, "gfx950": ["buffer_load_dwordx4"] * 4}[target]
    assert [op for op in run if op.startswith("v_mfma")] == \
        [op for op in ops if op.startswith("v_mfma")]      # ... an interior tile runs these
    assert run.count("v_mov_b32_e32") == 16                # both tiles into their pins
    rep = compiler.report(pinned_gemm, target)
    assert rep["loop_executed"] == hsaco.instruction_mix([insts[i] for i in path])
    assert rep["loop_executed"]["total"] < rep["loop_instructions"]["total"] / 4
    assert set(lines) <= {0, 1, 2}


@pytest.mark.parametrize("target", CDNA)
def test_library_gemm_interior_iteration(target):
    spec = KERNELS["gemm_basic"]
    insts, loop, path, _ = loop_and_path(spec.kernel, target, **spec.compile_consts)
    run = [insts[i][0] for i in path]
    body = [insts[i][0] for i in loop.body]
    assert [op for op in run if op.startswith("v_mfma")] == \
        [op for op in body if op.startswith("v_mfma")]
    assert "s_barrier" in run
    loads = {op for op in run if op.startswith("buffer_load")}
    assert loads and all(op.endswith(("dwordx4", "dwordx2", "dword")) for op in loads), loads
    assert "buffer_load_ushort" in body and "buffer_load_ushort" not in run


def test_code_objects_without_tags_count_the_whole_loop():
    """Without the renderer's line table (LLVM IR compiled as it is), the executed loop is
    the whole loop: nothing is known to be edge code."""
    ir = compiler.llvm_ir(pinned_gemm, "gfx950")
    ir = ir[:ir.index("!llvm.dbg.cu")].replace(" !dbg !2", "")
    ir = "\n".join(ln.split(", !dbg !")[0] for ln in ir.splitlines()) + "\n"
    obj = amdgpu.compile_ir(ir, "gfx950")
    assert hsaco.line_rows(obj) == []
    rep = hsaco.report(obj, "gfx950")
    assert rep["loop_executed"] == rep["loop_instructions"]


def test_line_table_covers_the_kernel():
    obj = compiler.code_object(pinned_gemm, "gfx942")
    text = next(s for s in amdgpu.elf_sections(obj) if s.name == ".text")
    rows = hsaco.line_rows(obj)
    assert rows and rows[-1][2]                             # ends its sequence
    assert all(text.addr <= a <= text.addr + text.size for a, _, _ in rows)


# ---- occupancy: scalar registers and allocation granules --------------------------------------

@pytest.mark.parametrize("sgprs,waves,limit", [
    (48, 8, "wave slots"),      # 800 / 48 = 16: the 8 wave slots bind
    (96, 8, "wave slots"),      # 800 / 96 = 8: a tie with the slots, which are named
    (97, 7, "sgprs"),           # 97 -> 112 allocated: 800 // 112 = 7
    (108, 7, "sgprs"),
])
def test_sgpr_limit(sgprs, waves, limit):
    o = waves_per_simd("gfx942", registers=32, lds_bytes=0, waves_per_workgroup=4, sgprs=sgprs)
    assert (o.waves_per_simd, o.limited_by, o.by_sgprs) == (waves, limit, min(waves, 8))


@pytest.mark.parametrize("target,lds,workgroups", [
    ("gfx942", 13000, 4),       # 13000 -> 13312 allocated (26 x 512): 65536 // 13312 = 4
    ("gfx942", 12800, 5),       # exactly 25 granules
    ("gfx950", 32768, 4),       # 32768 -> 33280 (26 x 1280): 163840 // 33280 = 4, not 5
    ("gfx950", 32000, 5),       # exactly 25 granules
])
def test_lds_allocation_granule(target, lds, workgroups):
    o = waves_per_simd(target, registers=32, lds_bytes=lds, waves_per_workgroup=4)
    assert (o.workgroups_per_cu, o.limited_by) == (workgroups, "lds")


@pytest.mark.parametrize("target", CDNA)
def test_report_occupancy_limits_and_bandwidth(target):
    rep = compiler.report(pinned_gemm, target)
    lim = rep["occupancy_limits"]
    assert lim["registers"] == rep["occupancy_waves_per_simd"] == 2
    assert lim["sgprs"] == min(8, 800 // (-(-rep["sgpr"] // 16) * 16))
    assert lim["lds"] is None and lim["wave slots"] == 8
    assert rep["hbm_bytes_per_s"] == {"gfx942": {"MI300X": 5.3e12, "MI325X": 6.0e12},
                                      "gfx950": {"MI350X": 8.0e12, "MI355X": 8.0e12}}[target]
