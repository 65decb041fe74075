"""Occupancy: how many waves a SIMD holds at once, from a kernel's registers and LDS.

Occupancy decides whether a kernel can hide memory latency by switching waves, and the
8-wave ping-pong schedule needs exactly 2 waves per SIMD, so reports state it and what
limits it. The rules follow LLVM's AMDGPU backend (AMDGPUBaseInfo
getNumWavesPerEUWithNumVGPRs and getOccupancyWithNumSGPRs): per lane, the wave's vector
registers are rounded up to the allocation granule and the SIMD's register file is divided
among waves; the same for the SIMD's scalar registers; LDS, rounded up to its allocation
granule (gfx942 512 bytes, gfx950 1280), is shared by the workgroups resident on a CU. Every
number comes from pykittens.targets.

Hopper (sm_90a) is not modelled: its register file per SM sub-partition is not (yet) a fact
in targets/sm90a.py, and a number invented here would break the one-home rule.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import targets


@dataclass(frozen=True)
class Occupancy:
    waves_per_simd: int          # resident waves on the fullest SIMD; 0: a workgroup never fits
    limited_by: str              # 'registers', 'lds', 'wave slots' or 'sgprs'
    by_registers: int            # waves per SIMD the register file allows
    by_lds: int | None           # waves per SIMD LDS allows (None: no LDS used)
    workgroups_per_cu: int
    by_sgprs: int | None = None  # waves per SIMD the scalar register file allows (None: not
                                 # given)


def waves_per_simd(target, *, registers: int, lds_bytes: int,
                   waves_per_workgroup: int, sgprs: int = 0) -> Occupancy:
    """Occupancy of a CDNA kernel.

    `registers` is the per-lane count from the unified VGPR+AGPR file (the code object's
    `.vgpr_count`, which on gfx90a+ already includes AGPRs); `lds_bytes` is the LDS one
    workgroup allocates (static + dynamic); `sgprs` the wave's scalar registers as the code
    object's `.sgpr_count` gives them (VCC, FLAT_SCRATCH and XNACK included), 0 to leave them
    out. A workgroup's waves are spread over the CU's SIMDs, so waves are counted in whole
    workgroups.
    """
    t = targets.get(target)
    if t.family != "cdna":
        raise ValueError(f"occupancy is modelled for CDNA targets only; {t.name} needs its "
                         "register-file size per SM sub-partition in pykittens/targets first")
    if not 1 <= waves_per_workgroup <= t.max_waves_per_workgroup:
        raise ValueError(f"a workgroup has 1..{t.max_waves_per_workgroup} waves on {t.name}, "
                         f"not {waves_per_workgroup}")
    if registers > t.unified_regs:
        raise ValueError(f"{registers} registers per lane exceed the {t.unified_regs} of "
                         f"{t.name}'s unified register file")
    if lds_bytes > t.lds_bytes_per_workgroup:
        raise ValueError(f"{lds_bytes} bytes of LDS exceed the {t.lds_bytes_per_workgroup} a "
                         f"workgroup may use on {t.name}")
    granule = t.reg_granule
    alloc = -(-max(registers, 1) // granule) * granule
    regs_raw = t.unified_regs // alloc               # waves per SIMD the register file holds
    # Whole workgroups are resident or none: a workgroup puts ceil(waves / SIMDs) waves on
    # its fullest SIMD; workgroups smaller than the SIMD count share a "layer" of SIMDs.
    per_simd = -(-waves_per_workgroup // t.simds_per_cu)
    per_layer = max(t.simds_per_cu // waves_per_workgroup, 1)
    limits = {"registers": regs_raw // per_simd * per_layer,
              "wave slots": t.max_waves_per_simd // per_simd * per_layer}
    sgpr_raw = None
    if sgprs:
        if sgprs > t.sgprs_per_simd:
            raise ValueError(f"{sgprs} SGPRs exceed the {t.sgprs_per_simd} of a {t.name} SIMD")
        sgpr_raw = t.sgprs_per_simd // (-(-sgprs // t.sgpr_granule) * t.sgpr_granule)
        limits["sgprs"] = sgpr_raw // per_simd * per_layer
    if lds_bytes:
        granule = t.lds_granule or 1
        limits["lds"] = t.lds_bytes_per_cu // (-(-lds_bytes // granule) * granule)
    order = ("registers", "lds", "wave slots", "sgprs")  # who is named when limits tie
    limited_by = min(limits, key=lambda k: (limits[k], order.index(k)))
    wgs = limits[limited_by]

    def waves(n_wgs):
        return -(-n_wgs * waves_per_workgroup // t.simds_per_cu)

    return Occupancy(waves_per_simd=waves(wgs), limited_by=limited_by,
                     by_registers=min(regs_raw, t.max_waves_per_simd),
                     by_lds=waves(limits["lds"]) if lds_bytes else None,
                     workgroups_per_cu=wgs,
                     by_sgprs=None if sgpr_raw is None else min(sgpr_raw, t.max_waves_per_simd))
