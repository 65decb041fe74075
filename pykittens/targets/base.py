"""Shared shape of a target description; each chip file fills one in.

Everything here is a fact about hardware, so it lives in one place and is cited where it is
defined. Lane layouts are written as *linear layouts*: each lane bit adds a fixed stride to
one tile coordinate, and each per-lane slot adds a fixed (row, col) offset. The MFMA and
wgmma operand layouts documented by AMD and NVIDIA are all of this form.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LaneLayout:
    """Where element (row, col) of a per-wave tile lives: which lane, which slot.

    lane_bits[i] = (dim, stride): lane bit i adds `stride` to coordinate `dim` (0=row, 1=col);
    dim None means lanes differing in that bit hold the same elements (replication).
    slots[s] = (row, col) offset added for slot s.
    """
    shape: tuple[int, int]
    lane_bits: tuple[tuple[int | None, int], ...]
    slots: tuple[tuple[int, int], ...]

    @property
    def lanes(self) -> int:
        return 1 << len(self.lane_bits)

    def __repr__(self) -> str:
        bits = ",".join("-" if d is None else f"{'rc'[d]}{s}" for d, s in self.lane_bits)
        return f"layout<{self.shape[0]}x{self.shape[1]} lanes[{bits}] slots={self.nslots}>"

    @property
    def nslots(self) -> int:
        return len(self.slots)

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols), each int64[lanes, nslots]: the element each (lane, slot) holds."""
        lane = np.arange(self.lanes)[:, None]
        base = [np.zeros((self.lanes, 1), np.int64), np.zeros((self.lanes, 1), np.int64)]
        for bit, (dim, stride) in enumerate(self.lane_bits):
            if dim is not None:
                base[dim] = base[dim] + ((lane >> bit) & 1) * stride
        off = np.array(self.slots, np.int64).reshape(-1, 2)
        return base[0] + off[None, :, 0], base[1] + off[None, :, 1]

    def lane_bits_of(self, dim: int) -> list[int]:
        return [i for i, (d, _) in enumerate(self.lane_bits) if d == dim]


@dataclass(frozen=True)
class MMAInstr:
    """One matrix instruction: D[m,n] (+)= sum_k A[m,k] B[k,n] with documented lane layouts."""
    name: str                 # mnemonic as in the vendor ISA guide
    m: int
    n: int
    k: int
    ab_dtype: str             # operand element type
    acc_dtype: str
    a_layout: LaneLayout      # A tile (m x k), row = m, col = k
    b_layout: LaneLayout      # B tile (k x n), row = k, col = n
    acc_layout: LaneLayout    # D tile (m x n)
    intrinsic: str = ""       # LLVM intrinsic name where one exists
    scaled: bool = False      # block-scaled (per-32-element E8M0 scales), CDNA4 f8f6f4
    scale_a_layout: LaneLayout | None = None    # (m, k/32) E8M0 scales of A, scaled only
    scale_b_layout: LaneLayout | None = None    # (k/32, n) E8M0 scales of B
    scale_block: int = 32     # K elements sharing one scale
    # CDNA: the f8f6f4 instruction without scales (LLVM selects it from the scale intrinsic
    # called with constant-zero scale operands), used for plain fp8 operands
    no_scale: bool = False
    # CDNA: passes of the MFMA through the matrix core (4 cycles each), the index of the
    # ISA's wait-state tables; 0 where not a CDNA MFMA
    passes: int = 0


@dataclass(frozen=True)
class MFMAWaitStates:
    """Wait states software must leave between dependent instructions around an XDL MFMA
    (the hardware does not interlock them). A wait state is one issued instruction, `s_nop N`
    counting N + 1. The tables are (passes of the producing MFMA, wait states) pairs."""
    valu_write_mfma_read: int       # a VALU (v_mov, v_accvgpr_write, ...) writes a VGPR/AGPR
                                    # that an MFMA then reads as A, B or C
    xdl_write_read: tuple[tuple[int, int], ...]   # an MFMA writes D; then a VALU/VMEM/DS
                                    # reads or a VALU writes it, or an MFMA reads it as A or B
    xdl_write_srcc_overlap: tuple[tuple[int, int], ...]   # an MFMA writes D; an MFMA reads
                                    # an overlapping, different range as C (the same: none)
    xdl_srcc_read_valu_write: tuple[tuple[int, int], ...]  # an MFMA reads C; a VALU then
                                    # overwrites it
    nop_max: int                    # most wait states one s_nop is written with

    @staticmethod
    def _at(table, passes: int) -> int:
        for p, w in table:
            if p == passes:
                return w
        raise KeyError(f"no wait-state entry for a {passes}-pass MFMA")

    def after_write(self, passes: int) -> int:
        return self._at(self.xdl_write_read, passes)

    def after_write_srcc_overlap(self, passes: int) -> int:
        return self._at(self.xdl_write_srcc_overlap, passes)

    def after_srcc_read(self, passes: int) -> int:
        return self._at(self.xdl_srcc_read_valu_write, passes)


@dataclass(frozen=True)
class Target:
    name: str                 # LLVM processor name: gfx942, gfx950, sm_90a
    family: str               # 'cdna' or 'hopper'
    chips: tuple[str, ...]
    wave_size: int            # lanes per wave (AMD wavefront / NVIDIA warp)
    max_waves_per_workgroup: int
    vgprs: int                # architectural vector registers per lane a wave may use
    agprs: int                # accumulation registers per lane (0 where none)
    unified_regs: int         # VGPR+AGPR per lane at 1 wave/SIMD (register file per lane)
    reg_granule: int          # allocation granularity of the unified register file
    sgprs: int
    max_waves_per_simd: int   # wave slots per SIMD (per SM sub-partition on Hopper)
    simds_per_cu: int
    lds_bytes_per_cu: int     # LDS per CU / shared memory per SM
    lds_bytes_per_workgroup: int
    num_xcds: int             # chiplets (XCDs); 1 for a monolithic die
    cus_per_xcd: int
    l2_bytes_per_xcd: int
    llc_bytes: int            # last-level cache shared by all XCDs (Infinity Cache); 0 if none
    cache_line_bytes: int
    hbm_bytes_per_s: float    # peak memory bandwidth (vendor datasheet)
    dtypes: frozenset[str]    # element types a kernel may use on this target
    fp8_flavor: str           # 'fnuz' (gfx942) or 'ocp' (gfx950, sm_90a)
    mma: tuple[MMAInstr, ...] = field(default=())
    triple: str = ""
    # How the hardware dispatcher hands consecutive workgroups to chiplets: round robin.
    dispatch_round_robin: bool = True
    # L2 partitions of one die, each caching data for the SMs attached to it and homing half
    # the address space (Hopper: two); 1 where the L2 is not split this way
    l2_partitions: int = 1
    # Where the dispatcher puts the workgroups of a launch of one per SM: the SM of the
    # w-th (measured; () where unknown), and the L2 partition beside each SM by its id
    dispatch_sms: tuple[int, ...] = ()
    sm_l2_partition: tuple[int, ...] = ()
    # Bytes per lane of a direct global -> LDS load (CDNA buffer_load ... lds); 0 = none.
    lds_dma_bytes: int = 0
    # LDS transpose reads of 16-bit data (gfx950 ds_read_b64_tr_b16)
    lds_read_tr16: bool = False
    # CDNA: wait states around MFMAs that software (here: the renderer, for inline asm)
    # must insert; None where the hardware interlocks or the target has no MFMA
    mfma_wait_states: MFMAWaitStates | None = None
    # LDS is allocated to a workgroup in granules of this many bytes (0: not modelled)
    lds_granule: int = 0
    # Scalar register file per SIMD and its allocation granule (0: not modelled)
    sgprs_per_simd: int = 0
    sgpr_granule: int = 0
    # Peak memory bandwidth of each chip of the target, where the chips differ (data
    # sheets); hbm_bytes_per_s is the first chip's
    hbm_bytes_per_s_by_chip: tuple[tuple[str, float], ...] = ()
    # CDNA register pinning: VGPRs kept below the lowest pinned VGPR for the compiler's own
    # values (0 where registers cannot be pinned)
    min_free_vgprs: int = 0
    # 32-bit registers per CU / SM where kernels budget them per warpgroup (Hopper's
    # setmaxnreg); 0 where that does not apply
    registers_per_cu: int = 0
    # Instruction classes of the scheduling hints (pk.sched_group, pk.sched_barrier) and
    # their masks in the target's intrinsics; () where the hints emit nothing
    sched_classes: tuple[tuple[str, int], ...] = ()
    # Byte offset of the first kernel parameter in the constant bank where over-aligned
    # parameters (Hopper's 64-byte tensor maps) are aligned by absolute offset (0: none)
    param_bank_base: int = 0
    # Throughput facts for the performance model (analysis/model.py), each (name, value,
    # source): clocks per chip, bytes per clock of LDS / shared memory and the memory path,
    # issue rates, published matrix peaks. Defined and cited in the chip's file.
    perf_facts: tuple[tuple[str, float, str], ...] = ()

    def entry_register_cap(self, threads: int) -> int:
        """Registers per thread a block of `threads` starts with where its kernel budgets
        warpgroups with setmaxnreg (ptxas's maxnreg: the whole block on one SM, a multiple
        of 8). setmaxnreg only moves registers between warpgroups: the block's roles
        together get at most this times `threads` (a consumer's increase otherwise waits
        forever for registers no one gives back)."""
        return min(self.vgprs // 8 * 8, self.registers_per_cu // threads // 8 * 8)

    def fact(self, name: str) -> tuple[float, str]:
        """(value, source) of a performance fact; KeyError naming the ones there are."""
        for n, v, src in self.perf_facts:
            if n == name:
                return v, src
        raise KeyError(f"{self.name} has no performance fact {name!r}; it has "
                       f"{', '.join(n for n, _, _ in self.perf_facts) or 'none'} "
                       "(add it, cited, to its file in pykittens/targets)")

    def has_fact(self, name: str) -> bool:
        """Whether the target's file states the performance fact `name`."""
        return any(n == name for n, _, _ in self.perf_facts)

    @property
    def num_cus(self) -> int:
        return self.num_xcds * self.cus_per_xcd

    def emulated_place(self, index: int, wave: int = 0) -> tuple[int, int]:
        """Where the emulators put wave `wave` of workgroup `index` of a launch, as
        pk.timestamp's unit and chiplet words: round robin over the XCDs, then over each
        one's CUs, the unit in the HW_ID register's form (WAVE_ID bits 0-3, CU_ID bits 8-11,
        SE_ID bits 13-15: the CU's index in its XCD by 16s); on one die the SM index and
        chiplet 0."""
        if self.num_xcds == 1 or not self.dispatch_round_robin:
            return index % self.num_cus, 0
        cu = index // self.num_xcds % self.cus_per_xcd
        return (wave & 0xF) | (cu % 16) << 8 | (cu // 16) << 13, index % self.num_xcds

    def sched_mask(self, classes) -> int:
        """The hint mask of instruction classes (names, or a raw mask as an int)."""
        if isinstance(classes, int):
            return classes
        table = dict(self.sched_classes)
        mask = 0
        for c in classes:
            mask |= table.get(c, 0)
        return mask

    def mma_for(self, m: int, n: int, k: int, ab_dtype: str) -> MMAInstr | None:
        for ins in self.mma:
            if (ins.m, ins.n, ins.k, ins.ab_dtype) == (m, n, k, ab_dtype):
                return ins
        return None


def linear(shape, lane_bits, slots) -> LaneLayout:
    return LaneLayout(tuple(shape), tuple(lane_bits), tuple(tuple(s) for s in slots))


def row_major_lane_layout(shape: tuple[int, int], wave: int, vec: int) -> LaneLayout:
    """Generic layout for non-matrix work: each lane owns `vec` consecutive columns, lanes
    sweep a row first (coalesced global access), then rows, then the pattern repeats in slots.
    """
    rows, cols = shape
    vec = min(vec, cols)
    while cols % vec or (rows * cols) % (wave * vec):
        vec //= 2
        if vec == 0:
            raise ValueError(f"tile {rows}x{cols} cannot be spread over a wave of {wave} lanes")
    lanes_per_row = min(cols // vec, wave)
    rows_per_pass = wave // lanes_per_row
    bits = []
    for b in range(lanes_per_row.bit_length() - 1):
        bits.append((1, vec << b))
    for b in range(rows_per_pass.bit_length() - 1):
        bits.append((0, 1 << b))
    col_reps = cols // (vec * lanes_per_row)
    row_reps = rows // rows_per_pass
    slots = [(rr * rows_per_pass, cr * vec * lanes_per_row + v)
             for rr in range(row_reps) for cr in range(col_reps) for v in range(vec)]
    return linear(shape, bits, slots)
