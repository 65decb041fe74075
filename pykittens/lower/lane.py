"""Lane IR: what one lane of one wave executes.

Every value is a register holding `nslots` elements per lane (`uniform` registers hold one
value for the whole wave: SGPRs on CDNA). Ops write their `dst` register in place, so a
register named before a loop and written inside it is loop-carried without phi nodes.
The same program is rendered to LLVM IR and executed by the emulator.

Op kinds (attrs in brackets):
  const[value] special[name, axis] dim(gl)[axis] stride(gl)[axis]
  coord[layout, dim, scope]          element row/col each (lane, slot) holds under a layout
  mov(a)  bin(a, b)[op]  un(a)[op]  cmp(a, b)[op]  select(c, a, b)  cvt(a)
  fma(a, b, c)                       a * b + c, rounded once
  any(c)                             uniform: whether c holds in any slot of any lane
  slots(a)[index]                    static gather of slots
  slot_reduce(a)[op, groups]         reduce groups of slots, left to right
  bfly(a)[op, bits]                  butterfly across lanes, one lane bit at a time
  gload(gl, *lead, *origin)[layout, dims, scope, fill]  a window of a tensor: slot s of
                                     lane l reads element lead.., origin + layout(l, s) along
                                     `dims` (the tensor's last one or two); outside -> fill
  gstore(gl, *lead, *origin, val)[layout, dims, scope]  likewise; outside is not written
                                     (both: `ends`, optional, per window dim an extra
                                     exclusive bound register or None)
  sload(gl, *index)                  one element, uniform (0 outside the tensor)
  gatomic_add(gl, *lead, *origin, val)[layout, dims, scope, ends?]   gstore's window, each
                                     element added atomically
  gdiscard(gl, *lead, *origin)[layout, dims, scope, width, ends?]   gload's window (its
                                     last dim `width` wide) holds dead data: undefined after
                                     (the emulator poisons it); Hopper drops each 128-byte
                                     line wholly inside it from L2 unwritten
  lds_load(r0, c0)[region, layout, scope]  lds_store(r0, c0, val)[...]   a window of a
                                     shared tile (region.byte_offset gives the swizzle);
                                     lds_load(r0, c0, rank): in the cluster's workgroup rank
  lds_load_tr(r0, c0)[region, layout, source, scope]   gfx950 transpose read: each lane
                                     reads the 4-element row chunks of `source`, then 16-lane
                                     groups exchange them (targets.cdna.ds_read_tr16_b64_source)
  gload_lds(gl, *lead, *origin)[region, layout, dims, scope, vec]   a workgroup's copy of a
                                     tensor window into a whole shared tile, memory -> LDS
                                     (as gload then lds_store; CDNA renders one DMA per chunk)
  scope 'wave': lane = lane id; 'workgroup': lane = wave id * wave size + lane id
  mma(a, b, c)[instr, a_slots, b_slots, c_slots]    one matrix instruction (CDNA MFMA,
                                     Hopper mma.sync): the listed slots of a, b and c are its
                                     operand registers
  for(start, stop)[step]{body}  if(c){then}{else}  barrier  setprio[level]
  sched_barrier[mask]  sched_group[mask, size, sync_id]  waitcnt[vmcnt, lgkmcnt]
  mbar_init[region, count]  mbar_arrive[region]  mbar_wait(parity)[region]   Hopper
                                     mbarriers (one arrival per wave); mbar_arrive(cta)
                                     [region, remote]: on cluster workgroup cta's barrier
  cluster_sync                       every wave of every workgroup of the cluster meets
                                     (Hopper clusters: special cluster_rank)
  setmaxnreg[regs]                   the warpgroup's register budget (Hopper)
  tma_load(r0, c0, at)[gl, tmap, region, bar, multicast]   Hopper bulk tensor copy of
                                     tmap's box at (r0, c0) of `gl` into rows at.. of the
                                     shared tile, completing on mbarrier `bar`; multicast:
                                     into every workgroup of the cluster (each its own bar),
                                     the arrival expecting cluster-size boxes
  tma_store(r0, c0)[gl, tmap, region, add, wait]   Hopper bulk tensor copy of the shared
                                     tile to the box at (r0, c0) of `gl` (outside the tensor:
                                     dropped; add: added into the tensor, TMA's reduction);
                                     the wave waits until the tile is read unless wait=False
  tma_store_wait[pending]            wait until this wave's wait=False tma_stores, but the
                                     last `pending`, have read their tiles
  wgmma(a?, acc)[region, a_region, b_kmajor, a_kmajor, a_layout, acc_layout, n, k, kstep,
        a_dtype, in_flight]          Hopper warpgroup MMA: acc += a @ b, b the shared tile in
                                     `region` (K x N, or N x K when b_kmajor), a this wave's
                                     registers or `a_region` (64 x K, the warpgroup's rows;
                                     K x 64 unless a_kmajor);
                                     each wave owns 16 rows of acc. One commit group; returns
                                     once at most `in_flight` groups are still running
  wgmma_wait(*accs)[in_flight]       wait until at most `in_flight` groups run; accs readable
  peer(*members, rank)               one rank's tensor of a pk.peers (the members are its gl
                                     parameters): a tensor operand for the ops above
  signal(gl, *index, value)[add, scope]
                                     lane 0 of the wave: flags[index] = value (add: +=),
                                     release at `scope` ("system", or "gpu": this GPU)
  flag_wait(gl, *index, value)[tma, scope]
                                     the wave waits until flags[index] >= value (acquire at
                                     `scope`; tma: TMA copies may read what it publishes)
  timestamp(gl, row)                 lane 0 of the wave: gl[row, 0:4] = the timer's low and
                                     high words, the compute unit, the chiplet
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..ir.nodes import Block, Op, Value
from ..ir.types import DType


@dataclass(frozen=True)
class LaneType:
    dtype: DType
    nslots: int = 1
    uniform: bool = False
    pin: tuple[str, int] | None = None     # ('v'|'a', first physical register) on CDNA

    @property
    def dwords(self) -> int:
        """32-bit registers per lane (sub-dword elements packed)."""
        return -(-self.nslots * self.dtype.bits // 32)

    def __str__(self) -> str:
        if self.uniform:
            return f"s.{self.dtype}"
        pin = ""
        if self.pin:
            f, first = self.pin
            pin = f"@{f}[{first}:{first + self.dwords - 1}]"
        return f"v.{self.dtype}x{self.nslots}{pin}"


@dataclass(frozen=True)
class LDSRegion:
    """One shared tile's (or mbarrier's) slice of the workgroup's LDS. Stages allocated
    together (pk.empty(..., count=n)) are one region of `count` elements `stride` bytes
    apart; a stage picked by a runtime index carries that index's lane register in `stage`
    (its address is base + stage * stride), a static pick is a region of its own."""
    name: str
    base: int
    size: int
    tile: object = None          # its SharedTileType (shape, dtype, swizzle) or MBarrierType
    count: int = 1
    stride: int = 0
    stage: object = None         # lane register of a runtime stage index, or None

    def element(self, i: int) -> "LDSRegion":
        """Stage i as a region of its own (a static address). Of a single stage, the
        region itself: the name its mbarrier was initialised under, its whole size."""
        if self.count == 1:
            return LDSRegion(self.name, self.base, self.size, self.tile)
        return LDSRegion(f"{self.name}[{i}]", self.base + i * self.stride, self.stride,
                         self.tile)

    def byte_offset(self, row, col):
        """Byte address of element (row, col): row-major, 16-byte chunks of a row XORed with
        (row % swizzle) to spread LDS banks; a swizzle=8 tile with rows wider than 128 bytes
        is stored as 128-byte column blocks (SharedTileType.atoms). Works on ints and numpy
        arrays alike; a runtime stage must be resolved first (element)."""
        t = self.tile
        esz = t.dtype.bytes
        b = col * esz
        row_bytes = t.shape[1] * esz
        if t.atoms > 1:
            atom, b = b >> 7, b & 127
            row_bytes = 128
        if t.swizzle:
            b = (((b >> 4) ^ (row & (t.swizzle - 1))) << 4) | (b & 15)
        if t.atoms > 1:
            b = b + atom * (t.shape[0] * 128)
        return self.base + row * row_bytes + b


@dataclass(eq=False)
class LaneProgram:
    name: str
    target: object
    params: list              # tile-IR Params, in kernel-argument order
    param_values: dict        # name -> Value (gl Values are used directly as pointers)
    num_waves: int
    lds_bytes: int
    regions: list[LDSRegion]
    body: Block
    consts: dict
    tmaps: tuple = ()          # ir.abi.TMADesc of each tensor map the kernel reads
    programs_per_cu: int = 0   # workgroups built to fit one CU / SM (0: the compiler's)
    cluster: int = 1           # workgroups per cluster (pk.cluster; Hopper)

    @property
    def wave_size(self) -> int:
        return self.target.wave_size


class LaneBuilder:
    def __init__(self):
        self.blocks = [Block()]

    def reg(self, dtype, nslots=1, uniform=False, name="", pin=None) -> Value:
        return Value(LaneType(dtype, nslots, uniform, pin), name)

    def emit(self, kind, dst=None, srcs=(), loc=None, regions=None, **attrs):
        op = Op(kind, dst, tuple(srcs), attrs, regions or [], loc)
        self.blocks[-1].ops.append(op)
        return dst

    @contextlib.contextmanager
    def into(self, blk: Block):
        """Emit into `blk` (a nested region) for the duration of the `with`."""
        self.blocks.append(blk)
        try:
            yield blk
        finally:
            self.blocks.pop()
