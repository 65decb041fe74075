"""CDNA4: MI350X / MI355X (gfx950).

Sources: AMD Instinct CDNA4 ISA Reference Guide; AMD CDNA4 white paper (8 XCDs x 32 active
CUs, 4 MiB L2 per XCD, 256 MiB Infinity Cache, 160 KiB LDS per CU); MI350X and MI355X data
sheets (8 TB/s each). CDNA4 doubles K of the bf16/f16 MFMAs, uses OCP fp8 (E4M3FN/E5M2), and
adds the f8f6f4 MFMAs (32x32x64, 16x16x128), with or without one E8M0 scale per 32
K-elements. LDS is allocated in blocks of 320 dwords (AMDGPUUsage, COMPUTE_PGM_RSRC2
LDS_SIZE: "GFX950 roundup(lds-size / (320 * 4))").

Passes (4 cycles each) per MFMA, as LLVM's SIDPGFX950FullSpeedModel: 32x32x16 (bf16, f16,
fp8) 8, 16x16x32 4; f8f6f4 with fp8 data 16 (32x32x64) and 8 (16x16x128), twice the work per
pass: the plain fp8 MFMAs run at the 16-bit rate, the f8f6f4 ones at twice it (MI350X/MI355X
data sheets: dense FP8 at twice the dense FP16/BF16 rate). So plain fp8 operands use the f8f6f4
instructions without scales wherever a tile's K allows (`no_scale`), the 16x16x32 /
32x32x16 fp8 ones only for shorter K.
"""
from . import cdna
from .base import MMAInstr, Target


def _mfma(name, m, n, k, ab, intrinsic, scaled=False, f8f6f4=False):
    scales = (cdna.mfma_scales(m, k, 0), cdna.mfma_scales(n, k, 1)) if scaled else (None, None)
    a, b = (cdna.f8f6f4_a(m, k), cdna.f8f6f4_b(n, k)) if f8f6f4 else \
        (cdna.mfma_a(m, k), cdna.mfma_b(n, k))
    passes = (16 if m == 32 else 8) if f8f6f4 else (8 if m == 32 else 4)
    return MMAInstr(name, m, n, k, ab, "f32", a, b, cdna.mfma_acc(m, n), intrinsic, scaled,
                    *scales, no_scale=f8f6f4 and not scaled, passes=passes)


def _mx_narrow(m, k, ab):
    """The block-scaled f8f6f4 MFMA on FP4 (pk.e2m1x2, cbsz:4 blgp:4: k / 2 bytes a row of
    K = k values) or FP6 operands (pk.e2m3p / pk.e3m2p, cbsz:2 / 3: 3k / 4 bytes). Half the
    passes of 8-bit data: the MI355X data sheet's MXFP4 and MXFP6 rates are twice MXFP8's,
    and LLVM's gfx950 model pads a 16x16x128 FP4 result for 4 passes (ROCm 7.2's
    compiler)."""
    fp4 = ab == "e2m1x2"
    nbytes = k // 2 if fp4 else k * 3 // 4
    name = f"v_mfma_scale_f32_{m}x{m}x{k}_f8f6f4"
    return MMAInstr(name, m, m, nbytes, ab, "f32", cdna.f8f6f4_a(m, nbytes, fp4, not fp4),
                    cdna.f8f6f4_b(m, nbytes, fp4, not fp4), cdna.mfma_acc(m, m),
                    f"llvm.amdgcn.mfma.scale.f32.{m}x{m}x{k}.f8f6f4", True,
                    cdna.mfma_scales(m, k, 0), cdna.mfma_scales(m, k, 1),
                    passes=8 if m == 32 else 4)


TARGET = Target(
    name="gfx950", family="cdna", chips=("MI350X", "MI355X"), triple="amdgcn-amd-amdhsa",
    wave_size=cdna.WAVE, max_waves_per_workgroup=cdna.MAX_WAVES_PER_WORKGROUP,
    vgprs=cdna.VGPRS, agprs=cdna.AGPRS, unified_regs=cdna.UNIFIED_REGS,
    reg_granule=cdna.REG_GRANULE, sgprs=cdna.SGPRS,
    max_waves_per_simd=cdna.MAX_WAVES_PER_SIMD, simds_per_cu=cdna.SIMDS_PER_CU,
    lds_bytes_per_cu=160 << 10, lds_bytes_per_workgroup=160 << 10,
    num_xcds=8, cus_per_xcd=32, l2_bytes_per_xcd=cdna.L2_PER_XCD, llc_bytes=cdna.LLC,
    cache_line_bytes=cdna.CACHE_LINE, hbm_bytes_per_s=8.0e12,
    hbm_bytes_per_s_by_chip=(("MI350X", 8.0e12), ("MI355X", 8.0e12)),
    dtypes=frozenset({"f32", "bf16", "f16", "e4m3", "e5m2", "e8m0", "e2m1x2", "e2m3p",
                      "e3m2p", "i8", "i32"}),
    lds_dma_bytes=16,                  # CDNA4 ISA: buffer_load_dwordx4 ... lds (12 or 16 B/lane)
    lds_read_tr16=True,                # CDNA4 ISA: ds_read_b64_tr_b16
    fp8_flavor="ocp",
    mfma_wait_states=cdna.WAIT_STATES_CDNA4,
    lds_granule=320 * 4,
    sgprs_per_simd=cdna.SGPRS_PER_SIMD, sgpr_granule=cdna.SGPR_GRANULE,
    min_free_vgprs=cdna.MIN_FREE_VGPRS, sched_classes=tuple(cdna.SCHED_MASK.items()),
    # Peak engine clock (AMD Instinct MI350X / MI355X data sheets: 2200 / 2400 MHz; MI355X
    # 2.5 dense FP16/BF16 PFLOPS = 256 CUs x 4096 flops/clk x 2.4 GHz)
    perf_facts=cdna.perf_facts((
        ("MI350X", 2.2e9, "AMD Instinct MI350X data sheet: peak engine clock 2200 MHz"),
        ("MI355X", 2.4e9, "AMD Instinct MI355X data sheet: peak engine clock 2400 MHz"))),
    mma=(
        _mfma("v_mfma_f32_32x32x16_bf16", 32, 32, 16, "bf16", "llvm.amdgcn.mfma.f32.32x32x16.bf16"),
        _mfma("v_mfma_f32_16x16x32_bf16", 16, 16, 32, "bf16", "llvm.amdgcn.mfma.f32.16x16x32.bf16"),
        _mfma("v_mfma_f32_32x32x16_f16", 32, 32, 16, "f16", "llvm.amdgcn.mfma.f32.32x32x16.f16"),
        _mfma("v_mfma_f32_16x16x32_f16", 16, 16, 32, "f16", "llvm.amdgcn.mfma.f32.16x16x32.f16"),
        # Plain fp8: the f8f6f4 MFMAs without scales first (chosen when a tile's K is a
        # multiple of theirs), the fp8_fp8 / bf8_bf8 ones for shorter K.
        *(_mfma(f"v_mfma_f32_{m}x{m}x{k}_f8f6f4", m, m, k, ab,
                f"llvm.amdgcn.mfma.scale.f32.{m}x{m}x{k}.f8f6f4", f8f6f4=True)
          for m, k in ((32, 64), (16, 128)) for ab in ("e4m3", "e5m2")),
        _mfma("v_mfma_f32_32x32x16_fp8_fp8", 32, 32, 16, "e4m3", "llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8"),
        _mfma("v_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, "e4m3", "llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8"),
        _mfma("v_mfma_f32_32x32x16_bf8_bf8", 32, 32, 16, "e5m2", "llvm.amdgcn.mfma.f32.32x32x16.bf8.bf8"),
        _mfma("v_mfma_f32_16x16x32_bf8_bf8", 16, 16, 32, "e5m2", "llvm.amdgcn.mfma.f32.16x16x32.bf8.bf8"),
        # Block-scaled MX formats: E8M0 scales, operands as the plain f8f6f4 ones.
        *(_mfma(f"v_mfma_scale_f32_{m}x{m}x{k}_f8f6f4", m, m, k, ab,
                f"llvm.amdgcn.mfma.scale.f32.{m}x{m}x{k}.f8f6f4", scaled=True, f8f6f4=True)
          for m, k in ((32, 64), (16, 128)) for ab in ("e4m3", "e5m2")),
        # MXFP4 and MXFP6: the same instructions on packed FP4 pairs (K counted in bytes:
        # 32 / 64) and densely packed FP6 (48 / 96 bytes)
        *(_mx_narrow(m, k, ab) for ab in ("e2m1x2", "e2m3p", "e3m2p")
          for m, k in ((32, 64), (16, 128))),
    ),
)
