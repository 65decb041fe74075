#!/usr/bin/env python3
"""Mutation check of the CDNA lowering and code generation (and Hopper's wgmma descriptors,
which only a GPU would otherwise execute): plant one realistic bug at a
time in a private copy of the repository and run the part of the project's own test suite
that should notice it. Every mutation must be caught (its tests fail); one that is not is a
gap in the oracles.

    python3 tools/mutations.py                 # all mutations, a table, exit 1 if any missed
    python3 tools/mutations.py --list          # what each mutation plants, and where
    python3 tools/mutations.py NAME ...        # some of them
    python3 tools/mutations.py NAME --full     # run the whole subset: every test that fails
    python3 tools/mutations.py NAME --tests tests/isa   # another subset (exploring)
    python3 tools/mutations.py --baseline      # the subsets pass on the unmutated code

Each mutation is a list of exact text edits (each must match once). The tree is copied to a
temporary directory (the working tree is never touched), the edits applied there, and pytest
runs in a subprocess with PYTHONPATH at the copy and a private, empty PYKITTENS_CACHE, so no
code object built by the unmutated compiler is reused. Outcomes: `caught` (a test failed,
and that test passes again on an unmutated copy), `MISSED` (the subset passed), `broken` (the
mutated package does not import: not a valid mutation), `error` (pytest could not run the
subset, or its failing test fails without the mutation too) and `timeout`. Exit status 1
unless every mutation is caught.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "build", "dist", ".venv", ".whl",
             ".mypy_cache", ".ruff_cache", ".hypothesis"}


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple            # (path relative to the repository root, old text, new text)
    bug: str                # the bug, as a developer could have written it
    tests: tuple            # pytest arguments: the subset that must fail
    catches: str            # which oracle fails, for the table in docs/targets/cdna.md

    @property
    def where(self) -> str:
        """file: function (of the first edit)."""
        path, old, _ = self.edits[0]
        return f"{path}: {_enclosing(path, old)}"


def _enclosing(path: str, old: str) -> str:
    """The def/class (or top-level name) the text `old` sits in."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    at = text.find(old)
    if at < 0:
        return "?"
    head = text[:at]
    # the assignment or def on the line `old` starts on
    line = text[head.rfind("\n") + 1:text.find("\n", at)]
    m = re.match(r"([A-Z_][A-Z0-9_]*) =", line)
    if m:
        return m.group(1)
    defs = re.findall(r"^( {0,4})(?:def|class) (\w+)", head, re.M)     # not nested ones
    if not defs:
        return "module"
    indent, name = defs[-1]
    if indent:
        cls = [n for i, n in re.findall(r"^( *)class (\w+)", head, re.M) if not i]
        return f"{cls[-1]}.{name}" if cls else name
    return name


def _m(name, path, old, new, bug, tests, catches):
    return Mutation(name, ((path, old, new),), bug, tuple(tests), catches)


CDNA_PY = "pykittens/targets/cdna.py"
GFX942_PY = "pykittens/targets/gfx942.py"
GFX950_PY = "pykittens/targets/gfx950.py"
AMDGPU_PY = "pykittens/codegen/amdgpu.py"
LLVM_PY = "pykittens/codegen/llvm.py"
NVPTX_PY = "pykittens/codegen/nvptx.py"
LANE_PY = "pykittens/lower/lane.py"
EMULATOR_PY = "pykittens/emulator/machine.py"
LOWER_PY = "pykittens/lower/lower.py"
MODEL_PY = "pykittens/analysis/model.py"
LIB = "tests/isa/test_isa_kernels.py"          # library kernels from their code objects
HAZ = "tests/test_cdna_hazards.py"
PINNED_WAITS = "tests/isa/test_isa_hazards.py::test_pinned_mfma_accumulator_read_waits"
WGMMA_DESC = "tests/test_hopper_static.py::test_wgmma_descriptors_follow_the_ptx_isa"

MUTATIONS: list[Mutation] = [
    # -- hardware facts: targets/ ----------------------------------------------------------
    _m("dpp-quad-perm", CDNA_PY,
       "DPP_QUAD_PERM_XOR = {1: 0b10_11_00_01, 2: 0b01_00_11_10}",
       "DPP_QUAD_PERM_XOR = {1: 0b01_00_11_10, 2: 0b10_11_00_01}",
       "quad_perm selectors packed first lane highest: lane ^ 1 reads [2,3,0,1] and "
       "lane ^ 2 reads [1,0,3,2]",
       [LIB, "-k", "library_kernel and f32 and (softmax or layernorm)"],
       "ISA emulator against the lane emulator, bitwise: the f32 softmax/layernorm row sums "
       "come out in another order (`test_library_kernel_from_its_code_object`)"),
    _m("ds-swizzle-xor", CDNA_PY,
       "return 0x1F | (mask << 10)",
       "return 0x1F | (mask << 5)",
       "ds_swizzle offset: the mask in the or_mask field (bits 9:5) instead of xor_mask "
       "(14:10)",
       [LIB, "-k", "library_kernel and (softmax or layernorm)"],
       "ISA emulator against float64: softmax/layernorm rows reduced over the wrong lanes "
       "(`test_library_kernel_from_its_code_object`, `test_docs_cdna_examples_agree`)"),
    _m("mfma-acc-rows", CDNA_PY,
       "    bits += [(0, 4 << b) for b in range(groups.bit_length() - 1)]\n"
       "    slots = [(4 * groups * (s // 4) + s % 4, 0) for s in range(m * n // WAVE)]",
       "    bits += [(0, (m * n // WAVE) << b) for b in range(groups.bit_length() - 1)]\n"
       "    slots = [(s, 0) for s in range(m * n // WAVE)]",
       "32x32 accumulators as two contiguous halves (lanes 32-63 rows 16-31) instead of runs "
       "of 4 rows alternating between the lane groups",
       [LIB, "-k", "library_kernel and gemm"],
       "ISA emulator (its own D layout) against float64: every gemm; the documented lanes "
       "(`test_layouts::test_lane_id_of_an_accumulator`, the guide)"),
    _m("waitcnt-vmcnt-high", CDNA_PY,
       "((vm >> 4) << 14)",
       "((vm >> 4) << 12)",
       "s_waitcnt: vmcnt bits 5:4 placed at 13:12 instead of 15:14",
       ["tests/test_schedule.py::test_waitcnt_encoding_and_rendering"],
       "the S_WAITCNT fields as the CDNA3 ISA gives them (`test_schedule::"
       "test_waitcnt_encoding_and_rendering`: waiting for nothing is 0xCF7F)"),
    _m("f8f6f4-operand-runs", CDNA_PY,
       "    bits += [(other, sixteen << b) for b in range(groups.bit_length() - 1)]\n"
       "    runs = [r * (k // 2) + s for r in range(2) for s in range(sixteen)]",
       "    bits += [(other, 2 * sixteen << b) for b in range(groups.bit_length() - 1)]\n"
       "    runs = [sixteen * r + s for r in range(2) for s in range(sixteen)]",
       "fp8 operands of the f8f6f4 MFMAs as 32 consecutive K per lane (the FP4 packing) "
       "instead of two runs of 16, K/2 apart",
       ["tests/test_mx_layout.py"],
       "lanes written out from the CDNA4 ISA (`test_mx_layout::"
       "test_operand_lanes_are_the_documented_ones`); block-scaled products on the ISA "
       "emulator; the guides' examples from their code objects"),
    _m("f8f6f4-format-codes", CDNA_PY,
       'F8F6F4_FORMAT = {"e4m3": 0, "e5m2": 1, "e2m3p": 2, "e3m2p": 3, "e2m1x2": 4}',
       'F8F6F4_FORMAT = {"e4m3": 1, "e5m2": 0, "e2m3p": 2, "e3m2p": 3, "e2m1x2": 4}',
       "cbsz/blgp format codes swapped: E4M3 operands decoded as E5M2 and back",
       ["tests/test_mma.py::test_block_scaled_mma_on_gfx950", "tests/test_mx_layout.py"],
       "ISA emulator against float64 (`test_mma::test_block_scaled_mma_on_gfx950`); the "
       "modifiers LLVM prints (`test_mx_layout`); pinned MX kernels (`test_cdna_hazards`)"),
    _m("fp6-format-codes", CDNA_PY,
       'F8F6F4_FORMAT = {"e4m3": 0, "e5m2": 1, "e2m3p": 2, "e3m2p": 3, "e2m1x2": 4}',
       'F8F6F4_FORMAT = {"e4m3": 0, "e5m2": 1, "e2m3p": 3, "e3m2p": 2, "e2m1x2": 4}',
       "the FP6 formats' cbsz/blgp codes swapped: E2M3 operands decoded as E3M2 and back",
       ["tests/test_mma.py::test_block_scaled_fp6_mma_on_gfx950"],
       "the ISA emulator's FP6 decoding (its own OCP bit fields) against float64 from "
       "ml_dtypes (`test_mma::test_block_scaled_fp6_mma_on_gfx950`)"),
    _m("fp6-operand-runs", CDNA_PY,
       "    sixteen = 12 if fp6 else 16              # bytes of 16 values",
       "    sixteen = 16",
       "FP6 operands laid out as FP8's: runs of 16 bytes, 16 K values read from 12",
       ["tests/test_mma.py::test_block_scaled_fp6_mma_on_gfx950"],
       "registers placed by the lane layout but read by the ISA emulator's own FP6 layout "
       "(`test_mma::test_block_scaled_fp6_mma_on_gfx950`, isa=True)"),
    _m("fp4-operand-bytes", CDNA_PY,
       "        runs = list(range(16))",
       "        runs = [*range(8, 16), *range(8)]",
       "FP4 operands of the f8f6f4 MFMAs with a lane's two 8-byte halves exchanged (registers "
       "0-1 and 2-3)",
       ["tests/test_mx_layout.py", "tests/test_mma.py::test_block_scaled_fp4_mma_on_gfx950"],
       "lanes written out from AMD's fp4 example (`test_mx_layout::"
       "test_fp4_operand_bytes_are_the_documented_ones`); the ISA emulator's products against "
       "float64 (`test_mma::test_block_scaled_fp4_mma_on_gfx950`)"),
    _m("fp4-sign-bit", EMULATOR_PY,
       "_E2M1 = np.concatenate([_E2M1, -_E2M1])",
       "_E2M1 = np.stack([_E2M1, -_E2M1], axis=1).reshape(-1)",
       "the lane emulator takes an FP4 value's sign from bit 0 of its code instead of bit 3 "
       "(a pair's nibble order alone cannot be seen: swapping it in A and B alike permutes "
       "K in both)",
       ["tests/test_mma.py::test_block_scaled_fp4_mma_on_gfx950",
        "tests/test_gemm_cdna.py::test_mxfp4_in_both_emulators"],
       "the lane emulator against float64 with ml_dtypes' decoding and against the ISA "
       "emulator (`test_mma::test_block_scaled_fp4_mma_on_gfx950`, "
       "`test_gemm_cdna::test_mxfp4_in_both_emulators`)"),
    _m("tr16-source", CDNA_PY,
       "return 4 * element + lane // 4, lane % 4",
       "return 4 * element + lane % 4, lane // 4",
       "ds_read_b64_tr_b16's exchange: source lane and element within the 16-lane group "
       "swapped",
       ["tests/test_kernels.py::test_gemm_on_gfx950_reads_b_with_lds_transposes"],
       "`layouts.tr16_source` checks its read pattern against this function and falls back "
       "to plain LDS reads: `test_kernels::test_gemm_on_gfx950_reads_b_with_lds_transposes` "
       "finds no transposes"),
    _m("cdna4-wait-states", CDNA_PY,
       "WAIT_STATES_CDNA4 = _xdl_wait_states(1)",
       "WAIT_STATES_CDNA4 = _xdl_wait_states(0)",
       "gfx950 given gfx942's MFMA wait states (one short after a 4-, 8- or 16-pass result)",
       [PINNED_WAITS, HAZ],
       "`isa.check_hazards` and the scanner of `test_cdna_hazards`, each written from the "
       "CDNA4 table, on the pinned kernels"),
    _m("krun-group-stride", CDNA_PY,
       "    bits += [(other, run << b) for b in range(groups.bit_length() - 1)]",
       "    bits += [(other, per_lane << b) for b in range(groups.bit_length() - 1)]",
       "krun operand layouts keep the plain lane-group stride along K (the per-lane count) "
       "instead of the run length",
       ["tests/test_layout_convert.py::test_transposed_attention_converts_through_krun_operands"],
       "attention through krun=4 operands against numpy (`test_layout_convert`; gfx950: on "
       "gfx942 a lane's K run is 4 long anyway)"),
    _m("gfx942-mfma-passes", GFX942_PY,
       "intrinsic, passes=8 if m == 32 else 4)",
       "intrinsic, passes=4)",
       "gfx942: every MFMA taken as 4 passes (the 32x32 ones take 8): too few wait states "
       "after a pinned 32x32 result",
       [PINNED_WAITS, HAZ],
       "`isa.check_hazards` (its own pass table) and `test_cdna_hazards` on the pinned "
       "32x32 kernels"),
    _m("f8f6f4-passes", GFX950_PY,
       "passes = (16 if m == 32 else 8) if f8f6f4 else (8 if m == 32 else 4)",
       "passes = 8 if m == 32 else 4",
       "gfx950: the f8f6f4 MFMAs given the 16-bit MFMAs' pass counts (8/4 instead of 16/8)",
       [f"{HAZ}::test_pinned_kernels_leave_the_documented_wait_states"],
       "the hazard scanner's own cycle table (f8f6f4 with fp8 data: 64/32 cycles) on the "
       "pinned fp8 kernels (`test_cdna_hazards`)"),
    # -- code generation: codegen/ ----------------------------------------------------------
    _m("mfma-operand-order", AMDGPU_PY,
       '            args = [str(av), str(bv), str(cv), "i32 0", "i32 0", "i32 0"]',
       '            args = [str(bv), str(av), str(cv), "i32 0", "i32 0", "i32 0"]',
       "the MFMA intrinsic called with B as src0 and A as src1",
       [LIB, "-k", "library_kernel and gemm"],
       "ISA emulator against float64: every gemm (`test_library_kernel_from_its_code_object`)"),
    _m("buffer-num-records", AMDGPU_PY,
       '            s0 = self.op(f"zext i32 %{gl.name}.stride0 to i64", "i64", 0)',
       '            s0 = self.op(f"zext i32 %{gl.name}.size{gl.type.rank - 1} to i64", "i64", 0)',
       "a buffer's num_records from the last dim's size instead of the row stride: the "
       "tail of a tensor with padded rows reads 0",
       [LIB, "-k", "library_kernel and padded and (scaled_add or softmax)"],
       "ISA emulator with rows padded to 16 elements (`pad_rows`): the last rows read 0 "
       "(`test_library_kernel_from_its_code_object[...-padded]`, `test_dispatch_state`)"),
    _m("one-row-column-bound", AMDGPU_PY,
       '            room = self.op(f"sub i32 {left.text}, {i + 1}", "i32", 0)      # < 0: past the end',
       '            room = self.op(f"sub i32 {left.text}, {i}", "i32", 0)      # < 0: past the end',
       "the column bound of a one-row window (an i32 per element, the row kernels' tiles) "
       "off by one: the element just past a row's end counts as inside",
       [LIB, "-k", "library_kernel and (softmax or layernorm)"],
       "ISA emulator at ragged shapes: softmax/layernorm rows take in the next row's first "
       "element"),
    _m("pinned-wait-gap", AMDGPU_PY,
       "            return self.hz_pos - pos - 1",
       "            return self.hz_pos - pos",
       "the pinned-register hazard tracker counts the producer itself as a wait state",
       [PINNED_WAITS, HAZ],
       "`isa.check_hazards` and `test_cdna_hazards`: each pinned kernel one wait state "
       "short somewhere"),
    _m("pinned-agpr-vgpr-budget", AMDGPU_PY,
       "            left = min((share - agprs) // 4 * 4, t.vgprs)",
       "            left = (share - agprs) // 4 * 4",
       "with AGPRs pinned at one wave per SIMD, LLVM given a VGPR budget above 256: it "
       "selects the AGPR forms of its own MFMAs and puts their results on the pinned AGPRs",
       ["tests/test_cdna_static.py::test_llvms_mfmas_keep_off_pinned_agprs"],
       "the MFMA destinations in the code object and the ISA emulator against float64 "
       "(`test_llvms_mfmas_keep_off_pinned_agprs`; the attention backward's code objects)"),
    _m("lds-dma-wave-base", AMDGPU_PY,
       '        wave_first = self.op(f"and i32 {self.tid.text}, {-self.p.wave_size}", "i32", 0)',
       '        wave_first = self.op(f"and i32 {self.tid.text}, {self.p.wave_size - 1}", "i32", 0)',
       "the LDS DMA's base from tid & 63 (the lane) instead of tid & -64 (the wave's first "
       "lane): every wave writes where wave 0's chunks go",
       [f"{LIB}::test_direct_to_lds_from_the_code_object"],
       "ISA emulator: the tile read back is not the tensor (`test_direct_to_lds_from_the_"
       "code_object`, the guide's `stage` example)"),
    _m("wave-id-shift", AMDGPU_PY,
       '            w = self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length() - 1}", "i32", 0)',
       '            w = self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length()}", "i32", 0)',
       "the uniform wave id (readfirstlane of tid >> 6) shifted by 7: waves 2k and 2k+1 "
       "both see k",
       [LIB, "-k", "library_kernel and scaled_add"],
       "ISA emulator: every multi-wave kernel leaves rows unwritten (NaN) or wrong"),
    _m("bpermute-lane-address", AMDGPU_PY,
       '            addr = self.op(f"shl i32 {addr.text}, 2", "i32", 0)\n',
       "",
       "ds_bpermute given the source lane's index instead of its byte address (lane * 4)",
       [LIB, "-k", "library_kernel and layernorm"],
       "ISA emulator against float64: layernorm's reductions across the wave's halves"),
    _m("mx-scale-operands-swapped", AMDGPU_PY,
       '                    str(self._scale_operand(op.srcs[3], op.attrs["sa_slots"])), "i32 0",\n'
       '                    str(self._scale_operand(op.srcs[4], op.attrs["sb_slots"]))]',
       '                    str(self._scale_operand(op.srcs[4], op.attrs["sb_slots"])), "i32 0",\n'
       '                    str(self._scale_operand(op.srcs[3], op.attrs["sa_slots"]))]',
       "the block-scaled MFMA intrinsic given B's E8M0 scales for A and A's for B",
       ["tests/test_mma.py::test_block_scaled_mma_on_gfx950"],
       "ISA emulator against float64 (`test_mma::test_block_scaled_mma_on_gfx950`, the "
       "language guide's MX example)"),
    _m("barrier-without-fences", AMDGPU_PY,
       """        self.ins('fence syncscope("workgroup") release')
        self.call("void", "llvm.amdgcn.s.barrier", [])
        self.ins('fence syncscope("workgroup") acquire')""",
       """        self.call("void", "llvm.amdgcn.s.barrier", [])""",
       "pk.barrier() as a bare s_barrier, without the workgroup fences that make LLVM wait "
       "for the wave's LDS accesses (s_waitcnt lgkmcnt(0)) first",
       [LIB, "-k", "library_kernel and gemm"],
       "ISA emulator: another wave touches LDS bytes whose DS write is still in flight "
       "(every gemm; `test_direct_to_lds_from_the_code_object`)"),
    _m("float-to-int-truncates", LLVM_PY,
       "                                   [str(r)]), e, n)",
       "                                   [str(v)]), e, n)",
       "f32 -> int casts convert the value instead of its llvm.rint: they round toward zero",
       [f"{LIB}::test_casts_from_the_code_object"],
       "ISA emulator against numpy's round-to-nearest-even (`test_casts_from_the_code_object`)"),
    _m("lds-swizzle-mask-codegen", LLVM_PY,
       '        rs = self.op(f"and i32 {row.text}, {t.swizzle - 1}", "i32", 0)',
       '        rs = self.op(f"and i32 {row.text}, {t.swizzle}", "i32", 0)',
       "the LDS swizzle XORs the chunk index with row & swizzle instead of "
       "row & (swizzle - 1)",
       [f"{LIB}::test_shared_tiles_from_the_code_object",
        f"{LIB}::test_direct_to_lds_from_the_code_object"],
       "ISA emulator against numpy: swizzle=8 tiles, through registers and by DMA "
       "(`test_shared_tiles_from_the_code_object`, `test_direct_to_lds_from_the_code_object`)"),
    _m("lds-region-base", LLVM_PY,
       '        return self.op(f"add i32 {a.text}, {self.region_base(region).text}", "i32", 0)',
       "        return a",
       "shared-tile addresses without the region's base: every tile starts at LDS byte 0",
       [LIB, "-k", "library_kernel and gemm"],
       "ISA emulator against float64: gemm's A and B tiles overlap"),
    _m("edge-mask-off-by-one", LLVM_PY,
       '        hi = self.op(f"icmp slt i32 {v.text}, {size.text}", "i1", 0)',
       '        hi = self.op(f"icmp sle i32 {v.text}, {size.text}", "i1", 0)',
       "per-lane bounds on the edge path test index <= size: one element past a row's end "
       "is read and written",
       [LIB, "-k", "library_kernel and (column_sum or gemm)"],
       "ISA emulator at ragged shapes: column_sum's rows take in the next row's first "
       "element; gemm's ragged K (the row kernels' one-row tiles bound their columns in "
       "amdgpu.py: `one-row-column-bound`)"),
    _m("edge-store-run-vector", LLVM_PY,
       '                v_l, e_l, j_l = self.branch(run_full, "run_vec", "run_elem", "run_join")\n'
       "                self.start_block(v_l)\n"
       "                self.align = align\n"
       "                self.store_run(",
       '                v_l, e_l, j_l = self.branch(ok, "run_vec", "run_elem", "run_join")\n'
       "                self.start_block(v_l)\n"
       "                self.align = align\n"
       "                self.store_run(",
       "on the edge path a run is stored as one vector when its row is inside, without "
       "checking its columns: stores run past the row's end",
       [LIB, "-k", "library_kernel and scaled_add"],
       "ISA emulator at ragged shapes: elements past a row's end overwritten "
       "(scaled_add, layernorm)"),
    # -- lowering: lower/ --------------------------------------------------------------------
    _m("lds-swizzle-mask-lane", LANE_PY,
       "            b = (((b >> 4) ^ (row & (t.swizzle - 1))) << 4) | (b & 15)",
       "            b = (((b >> 4) ^ (row & t.swizzle)) << 4) | (b & 15)",
       "LDSRegion.byte_offset (the lane emulator's LDS addresses) XORs with row & swizzle",
       ["tests/test_emulator.py::test_shared_round_trip",
        "tests/test_codegen.py::test_direct_global_to_lds"],
       "lane emulator against numpy: swizzled tiles collide (`test_emulator::"
       "test_shared_round_trip`); the guide's example from its code object"),
    _m("mma-base-slots", LOWER_PY,
       "        index = i * (v.type.shape[1] // base.shape[1]) + j",
       "        index = i * (v.type.shape[0] // base.shape[0]) + j",
       "base tile (i, j) of a role tile numbered with the tile's row count instead of its "
       "column count",
       ["tests/test_mma.py::test_gemm_bf16_matches_numpy", f"{LIB}::test_pinned_gemm_example"],
       "both emulators against numpy: every multi-tile mma (`test_mma`, `test_kernels`, "
       "`test_library_kernel_from_its_code_object`)"),
    # -- Hopper's wgmma descriptors (only a GPU runs them; the check reads the IR) -----------
    _m("wgmma-desc-stride", NVPTX_PY,
       "(1024 >> 4) << 32",
       "(512 >> 4) << 32",
       "wgmma descriptor: the stride byte offset of a 128B-swizzled operand as 512 bytes (4 "
       "rows) instead of one 8-row core-matrix group",
       [WGMMA_DESC],
       "the descriptor fields against the PTX ISA's Matrix Descriptor Format "
       "(`test_hopper_static::test_wgmma_descriptors_follow_the_ptx_isa`)"),
    _m("wgmma-kstep-block", NVPTX_PY,
       "return (kbyte // 128) * t.shape[0] * 128 + kbyte % 128",
       "return kbyte",
       "K steps of a K-major operand wider than 128 bytes run on along the row instead of "
       "into the next 128-byte column block",
       [WGMMA_DESC],
       "the start addresses of the K16 steps against the 128B-swizzle atom layout "
       "(`test_hopper_static::test_wgmma_descriptors_follow_the_ptx_isa`)"),
    # -- the performance model's consumers stepped through their waits ----------------------
    _m("model-waits-ignored", MODEL_PY,
       "                    if len(queue[c]) + len(draining[c]) > arg[0]:",
       "                    if False:",
       "a consumer's WARPGROUP.DEPBAR never holds it: its instructions run under the products "
       "they wait for",
       ["tests/test_model.py::test_one_consumer_does_in_turn_what_it_waits_for"],
       "hand-derived cycles of one consumer doing in turn what it waits for "
       "(`test_model::test_one_consumer_does_in_turn_what_it_waits_for`)"),
    _m("model-tensor-first-come", MODEL_PY,
       "            queue[c][0] -= rate / len(busy) * step",
       "            queue[c][0] -= (rate if c == busy[0] else 0) * step",
       "the tensor cores serve the lowest-numbered consumer with groups first instead of "
       "sharing their rate",
       ["tests/test_model.py::test_two_consumers_in_step_or_apart"],
       "hand-derived cycles of two consumers started together "
       "(`test_model::test_two_consumers_in_step_or_apart`)"),
    _m("model-latency-ignored", MODEL_PY,
       "                    draining[c].append(clock + step + latency)",
       "                    draining[c].append(clock)",
       "a waited wgmma group's results are taken to be there as soon as its products are "
       "done (the measured latency dropped)",
       ["tests/test_model.py::test_a_waited_group_adds_its_latency_and_a_pipelined_one_does_not"],
       "hand-derived cycles with a 60-clock latency "
       "(`test_model::test_a_waited_group_adds_its_latency_and_a_pipelined_one_does_not`)"),
    _m("early-launch-no-wait", NVPTX_PY,
       'EARLY_LAUNCH_PROLOGUE = ("griddepcontrol.launch_dependents;", "griddepcontrol.wait;")',
       'EARLY_LAUNCH_PROLOGUE = ("griddepcontrol.launch_dependents;",)',
       "Hopper kernels let the next grid launch but do not wait for the previous one: an "
       "early-launched kernel would read and write memory beside the kernel before it",
       ["tests/runtime/test_launch_fast.py"],
       "the prologue before any memory access in the PTX, and such code launched as usual "
       "(`test_launch_fast::test_code_launches_early_only_where_every_kernel_waits_first`)"),
    _m("early-launch-persistent", "pykittens/runtime/cuda.py",
       "        return math.prod(grid) > per_sm * self.sms",
       "        return True",
       "grids the GPU holds at once (persistent walks) are launched early too, and placed on "
       "SMs as the previous grid leaves them",
       ["tests/runtime/test_launch_fast.py"],
       "a fake driver's SM count either side of the grid "
       "(`test_launch_fast::test_grids_the_gpu_holds_at_once_are_launched_as_usual`)"),
    _m("dbias-at-column-n", "pykittens/kernels/layernorm.py",
       "    return (n + 15) // 16 * 16\n",
       "    return n\n",
       "LayerNorm's backward starts dbias's partial sums at column n, an offset the compiler "
       "cannot prove aligned: they are stored in 4-byte pieces",
       ["tests/test_norm_kernels.py"],
       "the global stores of LayerNorm's backward in the PTX "
       "(`test_norm_kernels::test_dbias_partial_rows_are_stored_as_dweights_are`)"),
]


def _copy_tree(dst: str):
    """The repository's files (not .git, caches or build outputs) under dst."""
    def ignore(d, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith((".pyc", ".egg-info"))]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def apply(m: Mutation, repo: str):
    """Apply the mutation's edits to the tree at `repo` (each old text exactly once)."""
    for path, old, new in m.edits:
        p = os.path.join(repo, path)
        with open(p) as f:
            text = f.read()
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{m.name}: the text to replace occurs {n} times in {path}: {old!r}")
        with open(p, "w") as f:
            f.write(text.replace(old, new))


def check_applies(m: Mutation):
    """The mutation's edits match the working tree once each (read only)."""
    for path, old, _ in m.edits:
        with open(os.path.join(ROOT, path)) as f:
            n = f.read().count(old)
        if n != 1:
            raise ValueError(f"{m.name}: the text to replace occurs {n} times in {path}: {old!r}")


def _env(repo: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = repo
    env["PYKITTENS_CACHE"] = cache
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _module(path: str) -> str:
    return path[:-3].replace("/", ".") if path.endswith(".py") else "pykittens"


@dataclass
class Result:
    name: str
    outcome: str            # caught / MISSED / broken / error / timeout
    seconds: float
    failed: list            # failing test ids (the first only, unless --full)
    log: str


def run_one(m: Mutation | None, tests, timeout: float, full: bool, keep: bool = False,
            name: str | None = None) -> Result:
    """Copy the tree, apply `m` (None: unmutated), import the mutated modules, run pytest."""
    name = name or (m.name if m else "baseline")
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=f"pk-mut-{name}-")
    try:
        repo, cache = os.path.join(tmp, "repo"), os.path.join(tmp, "cache")
        _copy_tree(repo)
        os.mkdir(cache)
        env = _env(repo, cache)
        mods = sorted({_module(p) for p, _, _ in m.edits}) if m else ["pykittens"]
        if m:
            apply(m, repo)
        probe = (f"import importlib, os\nroot = os.path.realpath({repo!r})\n"
                 f"for name in {mods!r}:\n"
                 "    f = os.path.realpath(importlib.import_module(name).__file__)\n"
                 "    assert f.startswith(root), f'{name} imported from {f}, not the copy'\n"
                 "import pykittens.compiler, pykittens.codegen.amdgpu\n")
        r = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=120)
        if r.returncode:
            return Result(name, "broken", time.time() - t0, [], r.stdout + r.stderr)
        cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
               "--no-header", *([] if full else ["-x"]), *tests]
        try:
            r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            return Result(name, "timeout", time.time() - t0, [], out)
        log = r.stdout + r.stderr
        failed = re.findall(r"^FAILED (\S+)", log, re.M)
        outcome = {0: "MISSED" if m else "passed", 1: "caught" if m else "FAILED"}.get(
            r.returncode, "error")
        return Result(name, outcome, time.time() - t0, failed, log)
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_confirmed(m: Mutation, tests, timeout: float, full: bool, keep: bool) -> Result:
    """run_one, and for a catch, the first failing test once more on the unmutated tree: it
    must pass there, or the failure was not the mutation's doing."""
    r = run_one(m, tests, timeout, full, keep)
    if r.outcome == "caught" and r.failed:
        b = run_one(None, [r.failed[0]], timeout, False, keep, name=f"{m.name}-unmutated")
        r.seconds += b.seconds
        if b.outcome != "passed":
            r.outcome = "error"
            r.log += f"\n{r.failed[0]} fails without the mutation too:\n{b.log}"
    return r


def table(results, by_name) -> str:
    rows = ["| mutation | where | outcome | s | first failing test |", "|---|---|---|---|---|"]
    for r in results:
        m = by_name.get(r.name)
        where = m.where if m else ""
        first = r.failed[0] if r.failed else ""
        rows.append(f"| {r.name} | {where} | {r.outcome} | {r.seconds:.0f} | {first} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="mutations run at once (default: 2, or 1 on one core)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutation")
    ap.add_argument("--full", action="store_true",
                    help="run each subset to the end and list every failing test")
    ap.add_argument("--tests", nargs="+", help="pytest arguments replacing the subsets")
    ap.add_argument("--baseline", action="store_true",
                    help="run the subsets on the unmutated code (they must pass)")
    ap.add_argument("--no-confirm", action="store_true",
                    help="do not rerun the first failing test on the unmutated tree")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; see --list")
    chosen = [by_name[n] for n in args.names] if args.names else list(MUTATIONS)
    if args.list:
        for m in chosen:
            print(f"{m.name:26} {m.where}\n{'':26} {m.bug}\n{'':26} tests: {' '.join(m.tests)}")
        return 0
    for m in chosen:
        check_applies(m)
    if args.baseline:
        subsets = list(dict.fromkeys(tuple(args.tests) if args.tests else m.tests
                                     for m in chosen))
        ok = True
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for tests, r in zip(subsets, pool.map(
                    lambda t: run_one(None, t, args.timeout, True, args.keep), subsets)):
                print(r.log if args.verbose or r.outcome != "passed" else "", end="")
                print(f"baseline {r.outcome:6} {r.seconds:5.0f} s  {' '.join(tests)}", flush=True)
                ok = ok and r.outcome == "passed"
        return 0 if ok else 1
    t0 = time.time()
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        run = run_one if args.no_confirm else run_confirmed
        futs = {pool.submit(run, m, args.tests or m.tests, args.timeout, args.full,
                            args.keep): m for m in chosen}
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            results[r.name] = r
            extra = f": {', '.join(r.failed) if args.full else (r.failed or [''])[0]}"
            print(f"{r.name:26} {r.outcome:8} {r.seconds:5.0f} s{extra}", flush=True)
            if args.verbose or r.outcome not in ("caught",):
                print(r.log[-6000:], flush=True)
    ordered = [results[m.name] for m in chosen]
    print()
    print(table(ordered, by_name))
    bad = [r.name for r in ordered if r.outcome != "caught"]
    print(f"\n{len(ordered) - len(bad)}/{len(ordered)} mutations caught in "
          f"{time.time() - t0:.0f} s" + (f"; not caught: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
