"""Hopper: H100 / H200 (sm_90a).

Sources: NVIDIA H100 Tensor Core GPU Architecture white paper (132 SMs on SXM5, 228 KiB shared
memory per SM, 227 KiB per block, 64K 32-bit registers per SM, at most 255 per thread);
CUDA C Programming Guide, compute capability 9.0 table (64 resident warps per SM, 32 per
block); H200 data sheet (4.8 TB/s HBM3e). L2: PyTorch's device properties on an H200 read
60 MB (two partitions). PTX ISA 8.x "wgmma.mma_async" for the m64nNk16 / k32 shapes, whose
register fragments are per warpgroup (4 warps) and so are described with the Hopper backend.
"""
from .base import Target

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
    dispatch_round_robin=False,
)
