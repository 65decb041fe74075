"""Hopper: H100 / H200 (sm_90a).

Sources: NVIDIA H100 Tensor Core GPU Architecture white paper (132 SMs on SXM5, 228 KiB shared
memory per SM, 227 KiB per block, 64K 32-bit registers per SM, at most 255 per thread);
CUDA C Programming Guide, compute capability 9.0 table (64 resident warps per SM, 32 per
block); H200 data sheet (4.8 TB/s HBM3e). L2: PyTorch's device properties on an H200 read
60 MB. NVIDIA's Hopper (and A100) architecture white papers: the L2 is divided into two
partitions; each caches data for memory accesses from the SMs of the GPCs directly connected
to it, with hardware coherence between them (l2_partitions=2).

Matrix instructions: the warp-level `mma.sync.aligned.m16n8k16` (bf16/f16) and `m16n8k32`
(e4m3/e5m2) with the register fragments of PTX ISA 8.x section "Matrix Fragments for
mma.m16n8k16 / m16n8k32" (groupID = lane >> 2, threadID_in_group = lane % 4). The
warpgroup-wide wgmma.mma_async shapes (m64nNk16) are not in this table yet.
"""
import numpy as np

from .base import MMAInstr, Target, linear

REGISTERS_PER_SM = 65536          # 32-bit registers per SM (H100 white paper)
# Kernel parameters start at this byte of constant bank 0, and over-aligned parameters
# (64-byte CUtensorMaps) are aligned in absolute bank offsets: the first one after 0 bytes
# of parameters sits at parameter offset 48 (read back with cuFuncGetParamInfo on an H200).
PARAM_BANK_BASE = 0x210
WGMMA_SWIZZLE_128B = 1            # matrix-descriptor layout type (PTX ISA 8.x, bits 62-63)
# nanosleep between two polls of a pk.wait_flag (PTX ISA, "nanosleep": a hint, the sleep is
# in [0, 2 * t] ns): a pykittens choice, short against a cross-GPU round trip (microseconds)
FLAG_POLL_SLEEP_NS = 64

# ---- where workgroups land, and which L2 partition each SM sits beside (chiplet/sim.py) ----
# Measured on an H200 (bench/l2_topology.py, docs/perf/l2-topology-2026-12-03.json): a
# launch of one workgroup per SM puts workgroups 0-7 on SMs 124-131 every time and the
# rest on the SMs of DISPATCH_SM_CYCLE in order, starting at a point that moves from launch
# to launch (three launches started 0, 64 and 90 places into it); the SMs pair up (the two
# of a TPC) and GPCs take turns. SM_L2_PARTITION: the partition beside each SM (by %smid),
# from the latency of L2 hits: 66 SMs on each, an SM finding near every line another SM of
# its side brought in (copies are kept beside the SM that asked, as the model assumes) and
# about half of those another side brought in (the half homed beside it).
DISPATCH_FIRST_SMS = (124, 125, 126, 127, 128, 129, 130, 131)
DISPATCH_SM_CYCLE = (
    10, 11, 26, 27, 42, 43, 58, 59, 72, 73, 86, 87, 100, 101, 114, 115,
    12, 13, 28, 29, 44, 45, 60, 61, 74, 75, 88, 89, 102, 103, 116, 117,
    120, 121, 14, 15, 30, 31, 46, 47, 62, 63, 76, 77, 90, 91, 104, 105,
    118, 119, 122, 123, 0, 1, 16, 17, 32, 33, 48, 49, 2, 3, 18, 19,
    34, 35, 50, 51, 64, 65, 78, 79, 92, 93, 106, 107, 4, 5, 20, 21,
    36, 37, 52, 53, 66, 67, 80, 81, 94, 95, 108, 109, 6, 7, 22, 23,
    38, 39, 54, 55, 68, 69, 82, 83, 96, 97, 110, 111, 8, 9, 24, 25,
    40, 41, 56, 57, 70, 71, 84, 85, 98, 99, 112, 113,
)
SM_L2_PARTITION = (
    0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1,
    1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0,
    0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1,
    1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0,
    0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1,
    1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0,
)

# ---- throughput facts for the performance model (analysis/model.py) ----
# Dense tensor-core peaks of H100 SXM5 and H200 SXM (NVIDIA H100 Tensor Core GPU
# Architecture white paper, table "NVIDIA H100 vs A100": 989.4 BF16 / 1978.9 FP8 dense
# TFLOPS; NVIDIA H200 data sheet: 1,979 BF16 / 3,958 FP8 TFLOPS "with sparsity", half of
# it dense), at the 1830 MHz boost clock these peaks are computed for (989.4e12 / (132 SMs
# x 1.83e9) = 4096 flops per SM per clock; nvidia-smi reports a 1980 MHz maximum SM clock).
TENSOR_CLOCK_HZ = 1.83e9
DENSE_BF16_FLOPS = 989.4e12
DENSE_FP8_FLOPS = 1978.9e12
# Shared memory: 32 banks, each 32 bits per clock (CUDA C++ Programming Guide, compute
# capabilities, "Shared Memory" of 5.x, which 9.0 keeps) -> 128 bytes per clock per SM.
SMEM_BYTES_PER_CLK = 32 * 4
# Each of the 4 SM sub-partitions has one warp scheduler dispatching one warp instruction
# per clock (H100 white paper, "H100 SM architecture": "warp scheduler (32 thread/clk)").
ISSUE_PER_CLK = 1
# Under a long dense GEMM an H200 holds its 700 W power cap by lowering the SM clock:
# bench/gpu_clock.py sampled 1530 MHz (4096³) and 1485 MHz (8192³) medians during cuBLAS
# bf16 GEMMs, throttle reason "SW power cap" (docs/PERF.md, 2026-12-01). The model runs a
# kernel bound by the tensor cores at that clock; the per-clock rates above stay the
# hardware's.
H200_LOAD_CLOCK_HZ = 1.51e9
# Special functions (MUFU: ex2, rcp, rsqrt, ...): 16 results per clock per SM, 4 per
# sub-partition, so a warp's instruction holds its unit 8 clocks (FlashAttention-3, Shah et
# al. 2024: H100 SXM5 "has 989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of special
# functions": 3.9e12 / (132 SMs x 1.83e9) = 16.1).
MUFU_PER_CLK = 16
# A streaming kernel's ceiling: the device-to-device copy bench/ops_bandwidth.py times (a
# 1 GiB tensor copied, read + write bytes over the time): 4.27-4.30 TB/s in twelve runs on
# 2026-12-02, median 4.288 (docs/perf/ops-bandwidth-2026-12-02*.json); the data sheet's
# 4.8 TB/s is not reached by any copy.
H200_COPY_BYTES_PER_S = 4.288e12
# What a streaming kernel costs beyond its bytes among back-to-back kernels: an SM copy
# (torch.mul into another tensor) in CUDA graphs at 64 MiB to 1 GiB moved, the
# least-squares line through the five times 1.92 µs + bytes / 4.301 TB/s
# (bench/model_check.py --only ramp, docs/PERF.md 2026-12-04 fifth session, run TH)
H200_KERNEL_FIXED_S = 1.92e-6
# What back-to-back wgmma reach with nothing else to do: bench/gpu_clock.py's wgmma loop (one
# workgroup an SM, two warpgroups issuing m64n256 from registers and shared memory, no
# memory traffic), its FLOP/s over the SM clock sampled meanwhile: bf16 853 TFLOP/s at
# 1770 MHz, e4m3 1669 at 1725 (docs/PERF.md, 2026-12-03, run MA): 89% of the data sheet's
# per-clock rates (4096 / 8192).
WGMMA_BF16_FLOPS_PER_CLK = 3650
WGMMA_FP8_FLOPS_PER_CLK = 7328
# clocks a waited wgmma group's results take beyond its tensor-core time: one warpgroup an
# SM waiting for each K step's group before the next, against the same loop with one in
# flight (bench/gpu_clock.py wgmma_latency, docs/PERF.md run OC): 48-66 over seven forms
# (bf16 n64 / n128 / n256, e4m3 n128 / n256, A from registers or shared memory), median 61
WGMMA_LATENCY_CLK = 61
# clocks an arrive fenced for the async proxy costs (fence.proxy.async before the arrive
# that hands over a tile written by ordinary stores; SASS MEMBAR.ALL.CTA, FENCE.VIEW.ASYNC.S):
# one warpgroup an SM storing a 16 x 64 tile a wave each step, with the arrive against
# without it, its group waited for (bench/gpu_clock.py --fence, docs/PERF.md run UB): 544
# against 447 clocks a step. With the group in flight instead the fenced step took 416
# against 311: the fence does not complete before the group's products do.
ASYNC_FENCE_CLK = 97
# What the TMA unit's reductions into L2 reach with one wave an SM adding 64 x 64 f32 tiles
# one after another (bench/gpu_clock.py's tma_reduce_loop, docs/PERF.md run NC), by how many
# workgroups add into the same tile: TB/s over the chip.
TMA_REDUCE_BYTES_PER_S = {1: 3.12e12, 8: 2.31e12, 32: 1.75e12, 132: 1.38e12}
_WP = "NVIDIA H100 Tensor Core GPU Architecture white paper"
PERF_FACTS = (
    ("clock_hz/H100", TENSOR_CLOCK_HZ, f"{_WP}: the boost clock of its dense tensor peaks"),
    ("clock_hz/H200", TENSOR_CLOCK_HZ, "NVIDIA H200 data sheet: the same 989 dense BF16 "
                                       "TFLOPS over 132 SMs as H100 SXM5 (1830 MHz)"),
    ("load_clock_hz/H200", H200_LOAD_CLOCK_HZ,
     "measured on an H200 (bench/gpu_clock.py, docs/PERF.md): median SM clock under "
     "back-to-back cuBLAS bf16 GEMMs at the 700 W power cap, 1530 MHz (4096^3) and "
     "1485 MHz (8192^3)"),
    ("dense_bf16_flops", DENSE_BF16_FLOPS, f"{_WP}, H100 SXM5 peak dense BF16 (= H200 data "
                                           "sheet, 1,979 with sparsity / 2)"),
    ("dense_fp8_flops", DENSE_FP8_FLOPS, f"{_WP}, H100 SXM5 peak dense FP8 (= H200 data "
                                         "sheet, 3,958 with sparsity / 2)"),
    ("smem_bytes_per_clk", SMEM_BYTES_PER_CLK, "CUDA C++ Programming Guide, 'Shared Memory': "
                                               "32 banks x 32 bits per clock"),
    ("copy_bytes_per_s/H200", H200_COPY_BYTES_PER_S,
     "measured on an H200 (bench/ops_bandwidth.py copy, docs/PERF.md): a 1 GiB device-to-"
     "device copy, median of twelve runs, 4.27-4.30 TB/s"),
    ("kernel_fixed_s/H200", H200_KERNEL_FIXED_S,
     "measured on an H200 (bench/model_check.py --only ramp, docs/PERF.md run TH): an SM "
     "copy kernel in CUDA graphs at 64 MiB to 1 GiB moved, the fixed part of the line "
     "through its times (1.92 us + bytes / 4.301 TB/s)"),
    ("wgmma_flops_per_clk/bf16", WGMMA_BF16_FLOPS_PER_CLK,
     "measured on an H200 (bench/gpu_clock.py's wgmma loop, docs/PERF.md run MA): back-to-"
     "back bf16 wgmma m64n256k16, 853 TFLOP/s at 1770 MHz over 132 SMs; n128 and n64, A "
     "from registers or shared memory, and one warpgroup issuing alone: 3572-3663 (runs "
     "MC, NB)"),
    ("wgmma_flops_per_clk/e4m3", WGMMA_FP8_FLOPS_PER_CLK,
     "measured on an H200 (bench/gpu_clock.py's wgmma loop, docs/PERF.md run MA): back-to-"
     "back e4m3 wgmma m64n256k32, 1669 TFLOP/s at 1725 MHz over 132 SMs"),
    ("wgmma_latency_clk", WGMMA_LATENCY_CLK,
     "measured on an H200 (bench/gpu_clock.py's wgmma_latency, docs/PERF.md run OC): the "
     "clocks a group waited for takes beyond the same group pipelined, 48-66 over seven "
     "forms, median 61"),
    ("async_fence_clk", ASYNC_FENCE_CLK,
     "measured on an H200 (bench/gpu_clock.py --fence, docs/PERF.md run UB): a step of one "
     "warpgroup storing a tile and arriving fenced for the async proxy, 544 clocks against "
     "447 without the arrive (its wgmma group waited for); with the group in flight 416 "
     "against 311: the fence completes after the group's products"),
    *((f"tma_reduce_bytes_per_s/{share}", rate,
       "measured on an H200 (bench/gpu_clock.py's tma_reduce_loop, docs/PERF.md run NC): one "
       f"wave an SM adding 64 x 64 f32 tiles by the TMA unit, {share} workgroup"
       f"{'s' * (share > 1)} into each tile") for share, rate in TMA_REDUCE_BYTES_PER_S.items()),
    ("mufu_per_clk_per_sm", MUFU_PER_CLK, "FlashAttention-3 (Shah et al. 2024): 3.9 TFLOPS "
                                          "of special functions on H100 SXM5, 16 per SM "
                                          "and clock at 1.83 GHz"),
    ("issue_per_clk_per_subpartition", ISSUE_PER_CLK, f"{_WP}: one warp scheduler and "
                                                      "dispatch unit (32 thread/clk) per SM "
                                                      "sub-partition"),
)

# Lane bits 0-1 are threadID_in_group, bits 2-4 groupID (rows of A and C, columns of B).
_TG = lambda stride: [(1, stride), (1, 2 * stride)]            # noqa: E731  (cols)
_GROUP_ROWS = [(0, 1), (0, 2), (0, 4)]
_GROUP_COLS = [(1, 1), (1, 2), (1, 4)]


def _a(k):
    """A (16 x k): registers a0..a3 hold row g / g + 8 (a0, a1 / a2, a3 alternate) at columns
    t * per_reg + e, the second pair k/2 further; slots follow the register order."""
    per_reg = 2 if k == 16 else 4           # elements per 32-bit register (2 bf16, 4 fp8)
    slots = []
    for reg in range(4):
        for e in range(per_reg):
            slots.append((8 * (reg & 1), e + (k // 2) * (reg >> 1)))
    return linear((16, k), [(1, per_reg), (1, 2 * per_reg)] + _GROUP_ROWS, slots)


def _b(k):
    """B (k x 8): thread holds column g, rows t*per_reg + e (+ k/2 for the second register)."""
    per_reg = 2 if k == 16 else 4
    slots = [(e + (k // 2) * reg, 0) for reg in range(2) for e in range(per_reg)]
    return linear((k, 8), [(0, per_reg), (0, 2 * per_reg)] + _GROUP_COLS, slots)


_C = linear((16, 8), _TG(2) + _GROUP_ROWS, [(0, 0), (0, 1), (8, 0), (8, 1)])


def _mma(ab, k, ptx):
    return MMAInstr(f"mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx}.{ptx}.f32", 16, 8, k, ab,
                    "f32", _a(k), _b(k), _C)


def matrix_fragments(lay):
    """How ldmatrix / stmatrix (m8n8, b16) can move a 16-bit register layout: in their
    fragment, lane t's 32-bit register holds row t // 4, columns 2 (t % 4) and +1 of an 8x8
    matrix (PTX ISA, "Warp-level matrix load/store: ldmatrix, stmatrix"); with .trans it
    holds that matrix's column t // 4, rows 2 (t % 4) and +1. Returns (trans, origins): the
    (row, col) of each slot pair's matrix, every pair the same way round and on 8-column
    boundaries; None when some pair is not such a fragment (e.g. generic row tiles)."""
    if lay.lanes != 32 or lay.nslots % 2:
        return None
    rows, cols = lay.coords()
    t = np.arange(32)
    for trans in (False, True):
        origins = []
        for j in range(0, lay.nslots, 2):
            r, c = rows[:, j], cols[:, j]
            r0, c0 = int(r[0]), int(c[0])
            major, minor = (c - c0, r - r0) if trans else (r - r0, c - c0)
            step = (1, 0) if trans else (0, 1)        # the pair's second element
            if c0 % 8 or not (np.array_equal(major, t // 4) and
                              np.array_equal(minor, 2 * (t % 4)) and
                              np.array_equal(rows[:, j + 1], r + step[0]) and
                              np.array_equal(cols[:, j + 1], c + step[1])):
                break
            origins.append((r0, c0))
        else:
            return trans, tuple(origins)
    return None


TARGET = Target(
    name="sm_90a", family="hopper", chips=("H100", "H200"), triple="nvptx64-nvidia-cuda",
    wave_size=32, max_waves_per_workgroup=32,
    vgprs=255, agprs=0, unified_regs=255, reg_granule=8, sgprs=0,
    max_waves_per_simd=16, simds_per_cu=4,          # 4 SM sub-partitions, 64 warps per SM
    lds_bytes_per_cu=228 << 10, lds_bytes_per_workgroup=227 << 10,
    num_xcds=1, cus_per_xcd=132, l2_bytes_per_xcd=60_000_000, llc_bytes=0,
    cache_line_bytes=128, hbm_bytes_per_s=4.8e12,
    dtypes=frozenset({"f32", "bf16", "f16", "e4m3", "e5m2", "i8", "i32"}),
    fp8_flavor="ocp",
    mma=(_mma("bf16", 16, "bf16"), _mma("f16", 16, "f16"),
         _mma("e4m3", 32, "e4m3"), _mma("e5m2", 32, "e5m2")),
    dispatch_round_robin=False, l2_partitions=2,
    dispatch_sms=DISPATCH_FIRST_SMS + DISPATCH_SM_CYCLE, sm_l2_partition=SM_L2_PARTITION,
    param_bank_base=PARAM_BANK_BASE, registers_per_cu=REGISTERS_PER_SM,
    perf_facts=PERF_FACTS,
)
