"""Facts shared by CDNA3 and CDNA4, and the MFMA lane layouts.

Sources:
- AMD Instinct MI300 ISA Reference Guide (CDNA3), ch. 7 "Matrix Arithmetic Instructions",
  and the AMD Matrix Instruction Calculator (`--detail-instruction`) for the per-lane
  register layouts written below.
- AMD Instinct CDNA4 ISA Reference Guide (MI350/MI355), ch. 7, for the doubled-K MFMAs and
  the scaled f8f6f4 family.
- LLVM AMDGPUUsage ("Memory Model", "Register usage"): 512 unified VGPR+AGPR per lane for
  gfx90a/gfx942/gfx950, allocated in granules of 8; 8 wave slots per SIMD.
"""
from .base import MFMAWaitStates, linear

WAVE = 64
SIMDS_PER_CU = 4
MAX_WAVES_PER_SIMD = 8            # LLVM AMDGPU getMaxWavesPerEU for gfx90a+
VGPRS = 256                       # v0..v255
AGPRS = 256                       # a0..a255
UNIFIED_REGS = 512                # VGPR + AGPR per lane at one wave per SIMD
REG_GRANULE = 8
SGPRS = 102                       # s0..s101 addressable by a kernel (ISA guide, "SGPRs")
MAX_WAVES_PER_WORKGROUP = 16      # 1024 work-items / 64
# The scalar register file: 800 SGPRs per SIMD, allocated to a wave in granules of 16
# (LLVM AMDGPUBaseInfo getTotalNumSGPRs / getSGPRAllocGranule for GFX8-GFX9; AMDGPUUsage,
# COMPUTE_PGM_RSRC1 GRANULATED_WAVEFRONT_SGPR_COUNT: "GFX6-GFX9: roundup(.. / 16)").
SGPRS_PER_SIMD = 800
SGPR_GRANULE = 16
# LDS is given to a workgroup in blocks of 128 dwords on GFX7-GFX9 incl. gfx942 (AMDGPUUsage,
# COMPUTE_PGM_RSRC2 LDS_SIZE: "roundup(lds-size / (128 * 4))"); gfx950 in its own file.
LDS_GRANULE = 128 * 4
# VGPRs kept below the lowest pinned VGPR for the compiler's own values (addresses, loop
# counters, temporaries); fewer and the allocator fails or spills. A pykittens choice,
# not a hardware fact: HipKittens-style kernels pin in the upper half of the file.
MIN_FREE_VGPRS = 64
CACHE_LINE = 128                  # L2 cache line (MI300 ISA guide, "Memory hierarchy")
L2_PER_XCD = 4 << 20              # 4 MiB per XCD (MI300X/MI355X data sheets)
LLC = 256 << 20                   # 256 MiB AMD Infinity Cache
# Word 3 of a raw buffer resource (format/swizzle fields) for gfx90a/gfx94x/gfx950, as
# Composable Kernel's CK_BUFFER_RESOURCE_3RD_DWORD; num_records gives out-of-range -> zero.
BUFFER_RSRC_WORD3 = 0x00020000
# DPP quad_perm controls (CDNA3 ISA, "DPP_CTRL"): lane i of each quad reads lane perm[i];
# encoded perm[0] | perm[1] << 2 | perm[2] << 4 | perm[3] << 6.
DPP_QUAD_PERM_XOR = {1: 0b10_11_00_01, 2: 0b01_00_11_10}


# ---- throughput facts for the performance model (analysis/model.py), shared by CDNA3/4 ----
# An MFMA pass occupies the SIMD's matrix core for 4 cycles (CDNA3 / CDNA4 ISA guides ch. 7;
# the AMD Matrix Instruction Calculator's "Execution cycles" = passes x 4, e.g.
# v_mfma_f32_32x32x8_bf16: 8 passes, 32 cycles).
MFMA_PASS_CYCLES = 4
# A SIMD gets an issue slot every 4 clocks and a wave issues at most one instruction per
# slot (AMD "Graphics Cores Next" architecture white paper, "Compute Unit": the sequencer
# issues to each SIMD every 4 cycles, one instruction per wave; CDNA keeps the 16-lane SIMD
# that runs a wave64 VALU op in 4 cycles, CDNA3 white paper "Compute Unit").
ISSUE_CYCLES_PER_INSTRUCTION = 4
# LDS: 32 banks of one dword each per clock (CDNA3 ISA guide, "Local Data Share"; ROCm
# Compute Profiler's soc_gfx942.py / soc_gfx950.py: lds_banks_per_cu = 32, its LDS
# speed-of-light counting 4 bytes per bank per cycle) -> 128 bytes per clock per CU.
LDS_BYTES_PER_CLK = 32 * 4
# Vector L1 (TCP): one 64-byte request per clock per CU (ROCm Compute Profiler, "vL1D
# speed-of-light": peak = $cu_per_gpu x 64 B x $max_sclk).
VMEM_BYTES_PER_CLK = 64
# L2: 16 channels per XCD, each 128 bytes per clock (AMD CDNA3 white paper, "Cache
# hierarchy": 4 MiB L2 per XCD in 16 channels of 256 KiB, 128 B/clk each; ROCm Compute
# Profiler soc_gfx950.py: l2_banks = 16) -> 2048 bytes per clock per XCD.
L2_BYTES_PER_CLK_PER_XCD = 16 * 128
_SHARED_SRC = {
    "mfma_pass_cycles": "CDNA3/CDNA4 ISA guides ch. 7; AMD Matrix Instruction Calculator "
                        "(cycles = passes x 4)",
    "issue_cycles_per_instruction": "AMD GCN architecture white paper, 'Compute Unit': an "
                                    "issue slot per SIMD every 4 clocks, one instruction per "
                                    "wave",
    "lds_bytes_per_clk": "CDNA3 ISA guide 'Local Data Share' (32 dword banks); ROCm Compute "
                         "Profiler soc_gfx9xx lds_banks_per_cu = 32",
    "vmem_bytes_per_clk": "ROCm Compute Profiler vL1D speed-of-light: 64 B per clock per CU",
    "l2_bytes_per_clk_per_xcd": "AMD CDNA3 white paper: 16 L2 channels per XCD x 128 B/clk",
}


def perf_facts(clock_by_chip) -> tuple:
    """The shared CDNA facts plus each chip's peak engine clock, as Target.perf_facts rows.
    `clock_by_chip`: ((chip, Hz, source), ...)."""
    shared = (("mfma_pass_cycles", MFMA_PASS_CYCLES),
              ("issue_cycles_per_instruction", ISSUE_CYCLES_PER_INSTRUCTION),
              ("lds_bytes_per_clk", LDS_BYTES_PER_CLK),
              ("vmem_bytes_per_clk", VMEM_BYTES_PER_CLK),
              ("l2_bytes_per_clk_per_xcd", L2_BYTES_PER_CLK_PER_XCD))
    return tuple((n, v, _SHARED_SRC[n]) for n, v in shared) + tuple(
        (f"clock_hz/{chip}", hz, src) for chip, hz, src in clock_by_chip)


def ds_swizzle_xor(mask: int) -> int:
    """ds_swizzle offset in bit mode (CDNA3 ISA, DS_SWIZZLE_B32): and_mask=0x1f, or_mask=0,
    xor_mask=mask; each lane reads lane ((lane & and) | or) ^ xor within its 32-lane half."""
    assert 0 < mask < 32
    return 0x1F | (mask << 10)


# A byte offset no tensor reaches: buffer accesses there read 0 and drop stores.
BUFFER_OOB_OFFSET = 0x80000000
# s_sleep between two polls of a pk.wait_flag: the argument sleeps about 64 * n clocks
# (CDNA3 ISA, S_SLEEP); a pykittens choice, short against a cross-GPU round trip
FLAG_POLL_SLEEP = 1


def hwreg(reg_id: int, offset: int = 0, size: int = 32) -> int:
    """s_getreg_b32's operand: register id in bits 5:0, first bit in 10:6, size - 1 in
    15:11 (LLVM AMDGPU docs, hwreg)."""
    return reg_id | (offset << 6) | ((size - 1) << 11)


def hwreg_fields(operand: int) -> tuple[int, int, int]:
    """(register id, first bit, size) of an s_getreg_b32 operand (hwreg's inverse)."""
    return operand & 0x3F, (operand >> 6) & 0x1F, ((operand >> 11) & 0x1F) + 1


# pk.timestamp reads whole hardware registers: HW_ID (wave, SIMD, CU, shader array and
# engine ids) and, on CDNA3/4, XCC_ID (the chiplet); their ids, by LLVM's names for gfx940+
# (what the disassembler prints)
HW_REG_IDS = {"HW_REG_HW_ID": 4, "HW_REG_XCC_ID": 20}
HWREG_HW_ID = hwreg(HW_REG_IDS["HW_REG_HW_ID"])
HWREG_XCC_ID = hwreg(HW_REG_IDS["HW_REG_XCC_ID"])


def _mfma_ab(mn: int, k: int, name_dim: int, krun: int | None = None) -> tuple:
    """A (mn x k) or, transposed, B (k x mn) operand layout: lane l holds row/col l % mn and
    k-run (l // mn) * (k // (64 // mn)) + s. `name_dim` is the tile dim that mn runs along.

    krun=r relabels K (the same relabelling on both operands leaves the product unchanged):
    lane group g holds K in runs of r, run j of the lane at (j * groups + g) * r, which is
    where an accumulator's rows sit (mfma_acc: runs of 4 rows per lane group)."""
    groups = WAVE // mn                       # lane groups along k
    per_lane = k // groups                    # consecutive k values a lane holds
    run = per_lane if krun is None else min(krun, per_lane)
    other = 1 - name_dim
    bits = [(name_dim, 1 << b) for b in range(mn.bit_length() - 1)]
    bits += [(other, run << b) for b in range(groups.bit_length() - 1)]
    ks = [(s // run) * run * groups + s % run for s in range(per_lane)]
    slots = [((0, kk) if name_dim == 0 else (kk, 0)) for kk in ks]
    shape = (mn, k) if name_dim == 0 else (k, mn)
    return linear(shape, bits, slots)


def mfma_a(m: int, k: int, krun: int | None = None):
    return _mfma_ab(m, k, 0, krun)


def mfma_b(n: int, k: int, krun: int | None = None):
    return _mfma_ab(n, k, 1, krun)


def _f8f6f4_ab(mn: int, k: int, name_dim: int, fp4: bool = False,
               fp6: bool = False):
    """A or B operand of V_MFMA_[SCALE_]F32_{32X32X64,16X16X128}_F8F6F4 with fp8 data: lane l
    holds row/col l % mn and 32 K values in two runs of 16 that are K/2 apart: K = 16 * g + s
    for slots s = 0..15 and K/2 + 16 * g + (s - 16) for s = 16..31, g = l // mn (registers
    0-3 hold the first run, 4-7 the second). CDNA4 ISA, "Matrix multiply operand layouts"
    of the F8F6F4 MFMAs; the same in AMD's ROCm blog "Matrix Core Programming on AMD CDNA3
    and CDNA4" (fp8 32x32x64 example: lane l loads A[l % 32][(l / 32) * 16 + i * 32 + j],
    i = 0..1, j = 0..15) and in Triton's AMD backend (LinearLayoutConversions.cpp: "for
    mxfp6/mxfp8, there are 2 16-consecutive elements blocks").

    fp4=True: FP4 data in bytes of packed pairs (pk.e2m1x2, k counting bytes): lane l holds
    32 consecutive K values, K = 32 g .. 32 g + 31, in 16 bytes (4 registers; element 2i in
    bits 3:0 of byte i): the same blog's fp4 32x32x64 example (lane l loads bytes
    16 (l / 32) .. + 15 of row l % 32 of A); LLVM's MC tests for gfx950 give cbsz:4 blgp:4
    4-register operands.

    fp6=True: FP6 data packed densely (pk.e2m3p / pk.e3m2p, k counting bytes): the 8-bit
    runs of 16 values, 12 bytes each and k/2 bytes (K/2 values) apart, in 6 registers
    (Triton's "2 16-consecutive elements blocks" for mxfp6 as for mxfp8)."""
    groups = WAVE // mn
    other = 1 - name_dim
    bits = [(name_dim, 1 << b) for b in range(mn.bit_length() - 1)]
    sixteen = 12 if fp6 else 16              # bytes of 16 values
    bits += [(other, sixteen << b) for b in range(groups.bit_length() - 1)]
    runs = [r * (k // 2) + s for r in range(2) for s in range(sixteen)]
    if fp4:
        runs = list(range(16))
    slots = [((0, kk) if name_dim == 0 else (kk, 0)) for kk in runs]
    shape = (mn, k) if name_dim == 0 else (k, mn)
    return linear(shape, bits, slots)


def f8f6f4_a(m: int, k: int, fp4: bool = False, fp6: bool = False):
    return _f8f6f4_ab(m, k, 0, fp4, fp6)


def f8f6f4_b(n: int, k: int, fp4: bool = False, fp6: bool = False):
    return _f8f6f4_ab(n, k, 1, fp4, fp6)


def ds_read_tr16_b64_source(lane: int, element: int) -> tuple[int, int]:
    """gfx950 ds_read_b64_tr_b16: each lane of a 16-lane group reads 8 bytes (4 x 16-bit)
    and the group exchanges them as a 16 x 4 -> 4 x 16 transpose, so that, when lane i
    reads row i // 4, columns 4 * (i % 4) .. + 3 of a 4 x 16 block, lane j receives that
    block's column j (CDNA4 ISA, "LDS transpose loads"). Returns the (source lane in the
    group, source element) that lane `lane`'s element `element` comes from."""
    return 4 * element + lane // 4, lane % 4


# cbsz / blgp operand-format codes of the scaled f8f6f4 MFMAs (CDNA4 ISA): 0 = FP8 E4M3,
# 1 = BF8 E5M2, 2 = FP6 E2M3, 3 = BF6 E3M2, 4 = FP4 E2M1.
F8F6F4_FORMAT = {"e4m3": 0, "e5m2": 1, "e2m3p": 2, "e3m2p": 3, "e2m1x2": 4}


def mfma_scales(mn: int, k: int, name_dim: int):
    """E8M0 scales of a scaled f8f6f4 MFMA (CDNA4 ISA, V_MFMA_SCALE_F32_*_F8F6F4): one scale
    per lane (byte 0 of its scale register): lane l gives the scale of row (A) / column (B)
    l % mn for the 32-element K block l // mn, so 32x32x64 has blocks 0-1 in lanes 0-31 and
    32-63, 16x16x128 blocks 0-3 in lanes 0-15, ..., 48-63 (Triton's AMD backend,
    chooseScaledMfmaScaleLayout). With fp8 data a lane's operand registers hold K values
    of two blocks (`_f8f6f4_ab`): the hardware pairs each product with its block's scale,
    not with the lane's."""
    groups = WAVE // mn
    other = 1 - name_dim
    bits = [(name_dim, 1 << b) for b in range(mn.bit_length() - 1)]
    bits += [(other, 1 << b) for b in range(groups.bit_length() - 1)]
    shape = (mn, k // 32) if name_dim == 0 else (k // 32, mn)
    return linear(shape, bits, [(0, 0)])


def mfma_acc(m: int, n: int):
    """Accumulator: lane l holds column l % n; rows come in runs of 4 per lane group.
    32x32: row = 8*(s//4) + 4*(l//32) + s%4 (16 slots); 16x16: row = 4*(l//16) + s (4 slots)."""
    groups = WAVE // n
    bits = [(1, 1 << b) for b in range(n.bit_length() - 1)]
    bits += [(0, 4 << b) for b in range(groups.bit_length() - 1)]
    slots = [(4 * groups * (s // 4) + s % 4, 0) for s in range(m * n // WAVE)]
    return linear((m, n), bits, slots)


# Wait states around XDL MFMAs that software must insert (the hardware does not check
# these dependencies): AMD Instinct MI300 (CDNA3) ISA, section 4.5 "Manually Inserted Wait
# States (NOPs)" and section 7.6 "Dependency Resolution: Required Independent Instructions"
# (the XDL rows); the CDNA4 ISA's same table adds one wait state for 4-, 8- and 16-pass
# MFMAs where a later instruction reads or rewrites their result, and to the overlapping-C
# case. The same numbers are transcribed in LLVM's GCNHazardRecognizer.cpp
# (GFX940_XDL_N_PassWriteVgprVALUMemExpReadWaitStates / ..WawWaitStates /
# ..WritesVGPROverlappedSrcABWaitStates / ..SrcCWaitStates, with their IsGFX950 term;
# GFX940_XDL4PassReadVgprVALUWarWaitStates; LegacyVALUNotDotWritesVGPRWaitStates = 2) and in
# AMD's rocRoller (Scheduling/Observers/WaitState/MFMA: XDLWrite94x, XDLReadSrcC94x,
# VALUWrite). An s_nop's SIMM16[3:0] gives 1..16 wait states (CDNA3 ISA, S_NOP); LLVM writes
# at most 8 per s_nop (SIInstrInfo::insertNoops), and so do we.
def _xdl_wait_states(extra_after_write: int) -> MFMAWaitStates:
    return MFMAWaitStates(
        valu_write_mfma_read=2,
        xdl_write_read=tuple((p, p + 3 + (extra_after_write if p > 2 else 0))
                             for p in (2, 4, 8, 16)),
        xdl_write_srcc_overlap=tuple((p, p + 1 + extra_after_write) for p in (2, 4, 8, 16)),
        xdl_srcc_read_valu_write=((2, 1), (4, 3), (8, 7), (16, 15)),
        nop_max=8)


WAIT_STATES_CDNA3 = _xdl_wait_states(0)    # 2/4/8/16 passes: 5/7/11/19 after a write
WAIT_STATES_CDNA4 = _xdl_wait_states(1)    # 5/8/12/20


# llvm.amdgcn.sched.group.barrier / sched.barrier instruction-class masks (LLVM AMDGPUUsage,
# "AMDGPU Intrinsics": sched_group_barrier).
SCHED_MASK = {
    "none": 0x0, "alu": 0x1, "valu": 0x2, "salu": 0x4, "mfma": 0x8, "vmem": 0x10,
    "vmem_read": 0x20, "vmem_write": 0x40, "ds": 0x80, "ds_read": 0x100, "ds_write": 0x200,
    "trans": 0x400,
}


def waitcnt_imm(vmcnt: int | None = None, lgkmcnt: int | None = None,
                expcnt: int | None = None) -> int:
    """s_waitcnt simm16 on gfx9 (CDNA3 ISA, S_WAITCNT): vmcnt[3:0] and [15:14], expcnt[6:4],
    lgkmcnt[11:8]. A counter left None is not waited for (its maximum)."""
    vm = 63 if vmcnt is None else vmcnt
    lgkm = 15 if lgkmcnt is None else lgkmcnt
    exp = 7 if expcnt is None else expcnt
    if not (0 <= vm <= 63 and 0 <= lgkm <= 15 and 0 <= exp <= 7):
        raise ValueError("waitcnt: vmcnt 0..63, lgkmcnt 0..15, expcnt 0..7")
    return (vm & 0xF) | ((vm >> 4) << 14) | (exp << 4) | (lgkm << 8)
