"""CDNA3: MI300X / MI325X (gfx942).

Sources: AMD Instinct MI300 ISA Reference Guide; AMD CDNA3 white paper (8 XCDs x 38 active CUs,
4 MiB L2 per XCD, 256 MiB Infinity Cache, 64 KiB LDS per CU); AMD Instinct MI300X data sheet
(5.3 TB/s peak memory bandwidth, HBM3) and MI325X data sheet (6 TB/s, HBM3E): both chips are
gfx942. MFMA mnemonics from the ISA guide ch. 7; fp8 on gfx942 is the FNUZ flavour
(v_mfma_f32_*_fp8_fp8 read E4M3FNUZ/E5M2FNUZ). Passes per MFMA: the AMD Matrix Instruction
Calculator's "Execution cycles" for CDNA3 / 4 (32x32 families 32 cycles, 16x16 families 16),
as LLVM's SIDPGFX942FullSpeedModel (Write8PassMAI / Write4PassMAI).
"""
from . import cdna
from .base import MMAInstr, Target


def _mfma(name, m, n, k, ab, intrinsic):
    return MMAInstr(name, m, n, k, ab, "f32", cdna.mfma_a(m, k), cdna.mfma_b(n, k),
                    cdna.mfma_acc(m, n), intrinsic, passes=8 if m == 32 else 4)


TARGET = Target(
    name="gfx942", family="cdna", chips=("MI300X", "MI325X"), triple="amdgcn-amd-amdhsa",
    wave_size=cdna.WAVE, max_waves_per_workgroup=cdna.MAX_WAVES_PER_WORKGROUP,
    vgprs=cdna.VGPRS, agprs=cdna.AGPRS, unified_regs=cdna.UNIFIED_REGS,
    reg_granule=cdna.REG_GRANULE, sgprs=cdna.SGPRS,
    max_waves_per_simd=cdna.MAX_WAVES_PER_SIMD, simds_per_cu=cdna.SIMDS_PER_CU,
    lds_bytes_per_cu=64 << 10, lds_bytes_per_workgroup=64 << 10,
    num_xcds=8, cus_per_xcd=38, l2_bytes_per_xcd=cdna.L2_PER_XCD, llc_bytes=cdna.LLC,
    cache_line_bytes=cdna.CACHE_LINE, hbm_bytes_per_s=5.3e12,
    hbm_bytes_per_s_by_chip=(("MI300X", 5.3e12), ("MI325X", 6.0e12)),
    dtypes=frozenset({"f32", "bf16", "f16", "e4m3fnuz", "e5m2fnuz", "i8", "i32"}),
    lds_dma_bytes=4,                 # CDNA3 ISA, MUBUF with LDS=1: dword per lane
    fp8_flavor="fnuz",
    mfma_wait_states=cdna.WAIT_STATES_CDNA3,
    lds_granule=cdna.LDS_GRANULE,
    sgprs_per_simd=cdna.SGPRS_PER_SIMD, sgpr_granule=cdna.SGPR_GRANULE,
    min_free_vgprs=cdna.MIN_FREE_VGPRS, sched_classes=tuple(cdna.SCHED_MASK.items()),
    # Peak engine clock 2100 MHz on both chips (AMD Instinct MI300X and MI325X data sheets;
    # MI300X: 1307.4 dense FP16/BF16 TFLOPS = 304 CUs x 2048 flops/clk x 2.1 GHz)
    perf_facts=cdna.perf_facts((
        ("MI300X", 2.1e9, "AMD Instinct MI300X data sheet: peak engine clock 2100 MHz"),
        ("MI325X", 2.1e9, "AMD Instinct MI325X data sheet: peak engine clock 2100 MHz"))),
    mma=(
        _mfma("v_mfma_f32_32x32x8_bf16", 32, 32, 8, "bf16", "llvm.amdgcn.mfma.f32.32x32x8bf16.1k"),
        _mfma("v_mfma_f32_16x16x16_bf16", 16, 16, 16, "bf16", "llvm.amdgcn.mfma.f32.16x16x16bf16.1k"),
        _mfma("v_mfma_f32_32x32x8_f16", 32, 32, 8, "f16", "llvm.amdgcn.mfma.f32.32x32x8f16"),
        _mfma("v_mfma_f32_16x16x16_f16", 16, 16, 16, "f16", "llvm.amdgcn.mfma.f32.16x16x16f16"),
        _mfma("v_mfma_f32_32x32x16_fp8_fp8", 32, 32, 16, "e4m3fnuz", "llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8"),
        _mfma("v_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, "e4m3fnuz", "llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8"),
        _mfma("v_mfma_f32_32x32x16_bf8_bf8", 32, 32, 16, "e5m2fnuz", "llvm.amdgcn.mfma.f32.32x32x16.bf8.bf8"),
        _mfma("v_mfma_f32_16x16x32_bf8_bf8", 16, 16, 32, "e5m2fnuz", "llvm.amdgcn.mfma.f32.16x16x32.bf8.bf8"),
    ),
)
