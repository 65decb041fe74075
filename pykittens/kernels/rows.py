"""Row kernels: kernels that reduce along the rows of a 2-D tensor (the norms, the softmax,
their gradients) are written once against `Rows`, whatever schedule holds the rows. The
schedule is a set of compile-time constants that `plan` picks per shape:

- RESIDENT=1: one row per wave, read once into registers in its storage type (N_MAX
  columns, a power of two), worked on CHUNK columns at a time (pk.subtile);
- SPLIT=1: ROWS rows per workgroup split across its waves (N_MAX // num_waves columns
  each), read once; pk.workgroup_sum / workgroup_max combine the waves' partial reductions;
- neither: ROWS rows per wave, any width, read from memory in blocks of COLS on every pass
  over them (the passes after the first mostly from L2).

Kernels whose workgroups walk many row groups (the backward passes, with per-column sums)
read each step's inputs through a `Feed`: per-row values a step ahead, and on Hopper, with
STAGES >= 2 (`staged_plan`), the split rows themselves copied into shared memory by the TMA
unit steps ahead of the waves that read them.
"""
from __future__ import annotations

import functools
import math

import numpy as np

import pykittens as pk

WAVES = 4                        # num_waves of the row kernels' RESIDENT and looped schedules
CHUNK = 512                      # a multiple of every target's wave sweep (64 lanes x 8)
SPLIT_SHARE_REGS = 16            # registers per lane for a wave's share of a held row
SPLIT_WIDE_WAVES = 4             # ... or 4 waves with twice that, where they cover the row
LOOP = {"ROWS": 1, "COLS": 1024}     # rows no workgroup can hold: one per wave, in blocks


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1)))))


def plan(m: int, n: int, target: str, row_bytes: int, share_regs: int = SPLIT_SHARE_REGS,
         loop: dict = LOOP):
    """(rows per workgroup, schedule constants) for m rows of n columns whose kernel holds
    `row_bytes` register bytes per column of a row (its element size for a forward pass over
    x; more where a backward pass holds x and dy and per-column sums).

    A row is read once wherever a workgroup can hold it in registers. Rows of up to one share
    (share_regs registers per lane) stay in one wave (RESIDENT); longer rows are split across
    the waves of a workgroup (SPLIT), a power-of-2 share each: one share per wave, except
    that rows needing exactly 4 double shares take 4 waves of those (the better of the two
    at 8192 columns). Measured on the H200 (LayerNorm, bf16, docs/PERF.md): 2048-12288
    columns reach 71-89% of copy bandwidth this way, the looped schedule 53-67%. Rows longer
    than a workgroup can hold are walked in column blocks (`loop`: ROWS, COLS and what else
    the kernel's looped schedule takes)."""
    from ..targets import get
    t = get(target)
    share = max(CHUNK, _pow2_floor(share_regs * 4 * t.wave_size / row_bytes))

    def split(share):
        return 1, {"SPLIT": 1, "ROWS": 1, "N_MAX": share * -(-n // share), "CHUNK": CHUNK,
                   "num_waves": -(-n // share)}

    if n <= share:
        return WAVES, {"RESIDENT": 1, "N_MAX": max(CHUNK, 1 << (max(n, 1) - 1).bit_length()),
                       "CHUNK": CHUNK}
    if -(-n // (2 * share)) == SPLIT_WIDE_WAVES:
        return split(2 * share)
    for s in (share, 2 * share):
        if -(-n // s) <= t.max_waves_per_workgroup:
            return split(s)
    return WAVES * loop["ROWS"], dict(loop)


STAGED = True              # take the staged walk where it applies (False: the register
                           # schedules everywhere, e.g. to compare them)
STAGE_COLS = 256            # a TMA box's row (at most 256 elements): the staged CHUNK
# (columns of a staged row per wave, warps per SM the walk is built for), by the
# per-column sums the walk holds: the first share whose waves a row fits within those warps
# (else the last). More warps leave each lane fewer registers (pk.programs_per_cu), and a
# kernel that must spill to fit runs at a fraction of the speed (bench/rows_staged.py). On
# the H200 (bench/ops_bandwidth.py variants, docs/PERF.md) 512 columns took rms_norm's and
# add_rms_norm's backward from 91/86/85 to 94/90/85% and 96/91/90 to 98/92/90% of copy
# bandwidth at 16384x8192 / 16384x4096 / 4096x12288 bf16; layer_norm's, holding two sums,
# went from 87/78/70% (1024 columns, 12 warps) to 87/84/63% with 512 and 16 warps (run FI):
# 512 where a row takes at most 16 such waves, 1024 and 12 warps past that
STAGED_SHARES = {0: ((512, 16),), 1: ((512, 16),), 2: ((512, 16), (1024, 12))}
STAGED_MIN_COLS = 2048      # shorter rows stay in registers (one wave or a few hold them)
STAGE_BUDGET = 200 * 1024   # shared memory per SM that the stages of its workgroups take
STAGED_PROGRAMS = 3         # at most this many walking workgroups per SM
STAGED_STAGES = 2           # shared-memory stages of the walk (the rows of STAGES - 1 steps
                            # in flight ahead of the one computing)
# ... of a walk holding two per-column sums whose workgroup is alone on its SM: layer_norm's
# backward at 16384x8192 bf16 went from 87.1 / 87.8% of copy bandwidth to 89.6 / 90.0% with
# three (runs FI, FN; the same at 4096x12288, and rms_norm's one sum lost 2 points)
STAGED_STAGES_ALONE = 3
STAGED_FULL_STEPS = True    # fewer workgroups where they walk the rows in as many full
                            # steps (staged_plan; False: as many as the SMs hold, to compare)
STAGED_EXTRA_STEPS = 1      # ... or in up to this many more steps, every one full


def staged_share(n: int, sums: int) -> tuple[int, int]:
    """(columns per wave, warps per SM) of a staged walk over rows of n columns holding
    `sums` per-column sums (STAGED_SHARES)."""
    shares = STAGED_SHARES[min(sums, 2)]
    return next((s for s in shares if -(-n // s[0]) <= s[1]), shares[-1])


def staged_plan(m: int, n: int, target: str, itemsize: int, tensors: int, sums: int = 1,
                waves: int | None = None, stages: int | None = None,
                programs: int | None = None):
    """(grid, consts) of the staged walk of a backward row kernel (Feed with STAGES >= 2:
    `tensors` inputs of `itemsize` bytes per element copied into shared memory by the TMA
    unit, STAGES - 1 steps ahead; `sums` per-column sums held), or None where it does not
    apply: not Hopper, rows shorter than STAGED_MIN_COLS, rows whose bytes are not a
    multiple of 16 (TMA strides), or stages that do not fit. A workgroup takes one row per
    step, a share of STAGED_SHARES' columns per wave (4 to the target's most waves), two
    stages; as many workgroups per SM as its warps and the shared-memory budget allow (at most
    STAGED_PROGRAMS), each built to fit (PROGRAMS: its registers capped), fewer where
    fewer walk the rows in as many full steps (or STAGED_EXTRA_STEPS more); a workgroup
    alone on its SM holding two sums takes STAGED_STAGES_ALONE stages where they fit.
    waves / stages / programs override the choice (sweeps)."""
    from ..targets import get
    t = get(target)
    if t.family != "hopper" or n < STAGED_MIN_COLS or (n * itemsize) % 16:
        return None
    wave_cols, warps = staged_share(n, sums)
    nw = waves or min(max(4, -(-n // wave_cols)), t.max_waves_per_workgroup)
    n_max = -(-n // (nw * STAGE_COLS)) * nw * STAGE_COLS
    stage = tensors * n_max * itemsize
    chosen = stages or STAGED_STAGES
    if chosen * stage > STAGE_BUDGET:
        return None
    programs = programs or max(1, min(STAGED_PROGRAMS, STAGE_BUDGET // (chosen * stage),
                                      warps // nw))
    if not stages and programs == 1 and sums >= 2 and \
            STAGED_STAGES_ALONE * stage <= STAGE_BUDGET:
        chosen = STAGED_STAGES_ALONE
    stages = chosen
    grid = max(1, min(m, t.num_cus * programs))
    # fewer workgroups where they take as many steps, or one more, every one full: a last
    # step of a few workgroups costs more than a few idle SMs (on the H200, runs RD-RF:
    # 4096 rows in 32 steps of 128 workgroups, not 31 of 132 and one of 4, +0.6-2.2 points
    # of copy on the norms' backward; 16384 rows in 64 of 256, not 62 of 264 and one of
    # 16, +0.1-1.0; a last step merely fuller, 261 of 264, did not gain)
    steps = -(-m // grid)
    full = [s for s in range(steps, steps + STAGED_EXTRA_STEPS + 1) if m % s == 0]
    if STAGED_FULL_STEPS and full:
        grid = m // full[0]
    return (grid,), {
        "SPLIT": 1, "ROWS": 1, "N_MAX": n_max, "CHUNK": STAGE_COLS, "num_waves": nw,
        "STAGES": stages, "PROGRAMS": programs}


def tma_ready(t) -> bool:
    """A tensor the TMA unit can copy rows of: 16-byte aligned start and row stride (an
    emulated array always)."""
    if not hasattr(t, "data_ptr"):
        return True
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


BWD_PROGRAMS_PER_CU = 2         # workgroups per CU / SM walking the rows of a backward pass


def exact(n: int, consts: dict, m: int | None = None, per: int | None = None) -> bool:
    """Whether a held schedule (`consts`) over rows of n columns can promise EXACT (Rows):
    rows of exactly N_MAX columns, and for kernels that do not walk the rows (m rows, `per`
    a workgroup) m a multiple of per, so no workgroup row lies past the last."""
    held = consts.get("SPLIT") or consts.get("RESIDENT")
    return bool(held) and n == consts["N_MAX"] and (per is None or m % per == 0)


def walk_plan(m: int, n: int, target: str, row_bytes: int, parts: int | None = None,
              staged=None):
    """(grid, consts) of a backward row kernel whose workgroups walk the rows
    (Rows.steps) adding per-column partial sums (ColumnSums): the staged walk `staged`
    (a staged_plan) where given, else at most BWD_PROGRAMS_PER_CU workgroups per CU / SM,
    so the partial sums stay small beside x; and at most as many as `parts` rows of partial
    sums hold (ColumnSums.partial_rows)."""
    from ..targets import get
    if staged is not None:
        (grid,), consts = staged
    else:
        per, consts = plan(m, n, target, row_bytes)
        grid = min(max(1, -(-m // per)), get(target).num_cus * BWD_PROGRAMS_PER_CU)
    if exact(n, consts):
        consts = {**consts, "EXACT": 1}
    if parts is not None:
        per_program = ColumnSums.partial_rows(1, consts)
        if parts < per_program:
            raise ValueError(f"{parts} rows of partial sums cannot hold one workgroup's "
                             f"{per_program}")
        grid = min(grid, parts // per_program)
    return (grid,), consts


def itemsize(x) -> int:
    """Bytes per element of a numpy array or torch tensor."""
    return x.itemsize


class Rows:
    """Where one wave finds the rows it works on, by schedule (see the module docstring).

    `r0` is the first row of the wave's (rows x cols) f32 blocks `block`; block j starts at
    column `c0 + j * cols`; `blocks()` walks j (unrolled when the rows are held, a loop
    otherwise). `hold(t)` gives block j of tensor t's rows; `total` / `peak` turn a wave's
    partial row sums / maxima into the whole row's."""

    def __init__(self, x, RESIDENT, SPLIT, ROWS, COLS, N_MAX, CHUNK, EXACT=0):
        nw = pk.num_waves()
        self.m, self.n = x.shape
        self.split, self.held = bool(SPLIT), bool(RESIDENT or SPLIT)
        self.walked = False                   # set by Feed.walk: rows past the end occur
        if SPLIT:
            self.rows, self.width = ROWS, N_MAX // nw          # this wave's share of a row
            self.first, self.c0 = pk.program_id(0) * ROWS, pk.wave_id() * self.width
            self.per_program = ROWS
        elif RESIDENT:
            self.rows, self.width = 1, N_MAX
            self.first, self.c0 = pk.program_id(0) * nw + pk.wave_id(), 0
            self.per_program = nw
        else:
            self.rows, self.width = ROWS, None
            self.first, self.c0 = (pk.program_id(0) * nw + pk.wave_id()) * ROWS, 0
            self.per_program = nw * ROWS
        self.cols = CHUNK if self.held else COLS
        self.unrolled = self.held             # blocks in registers: one static window each
        self.nblocks = self.width // CHUNK if self.held else (self.n + COLS - 1) // COLS
        # EXACT: the launch rule promises held rows of exactly N_MAX columns and, unless
        # the rows are walked (Feed), no workgroup row past the last (rows.exact): the
        # windows of a row lie inside the tensors, so they check no bounds (the emulator
        # checks the promise) and no column needs masking. A walk's last step may pass
        # the last row: its stores then test the row, once (one row a wave)
        self.exact = bool(EXACT) and self.held and self.rows == 1
        self.r0 = self.first
        self.block = pk.rt((self.rows, self.cols), pk.f32)
        self.row, self.col = pk.rv(self.block, "row"), pk.rv(self.block, "col")

    # ---- walking ------------------------------------------------------------------------

    def blocks(self):
        return pk.static_range(self.nblocks) if self.unrolled else pk.range(self.nblocks)

    def steps(self):
        """Row groups each wave takes when a grid of fewer workgroups than row groups walks
        all rows (`for i in pk.range(rows.steps()): rows.step(i)`): the same count in every
        wave of a workgroup, so its reductions stay matched. A split row's workgroup walks
        its own rows, all of which exist; other schedules walk as many steps as the first
        workgroup, and their rows past the end read as zero."""
        if self.split and self.rows == 1:
            return (self.m - self.first + self.stride() - 1) // self.stride()
        return (self.m + self.stride() - 1) // self.stride()

    def past_end(self) -> bool:
        """Whether a step can hold rows past the last (walked rows, not split)."""
        return self.walked and not (self.split and self.rows == 1)

    def stride(self):
        return pk.num_programs(0) * self.per_program

    def step(self, i):
        self.r0 = self.first if isinstance(i, int) and i == 0 else \
            self.first + i * self.stride()

    def at(self, j):
        return (self.r0, self.col_of(j))

    def col_of(self, j):
        """The first column of block j."""
        if isinstance(j, int) and j == 0:
            return self.c0
        return j * self.cols if isinstance(self.c0, int) and self.c0 == 0 else \
            self.c0 + j * self.cols

    # ---- data ---------------------------------------------------------------------------

    def hold(self, t, fill=0.0):
        """Block j of tensor t's rows as an f32 tile, as a function of j. Held rows are read
        once here, in t's storage type, and converted block by block; otherwise every call
        reads the block from memory. Elements outside t read as `fill`."""
        if not self.held:
            return lambda j: pk.load(self.block, t, self.at(j), fill=fill)
        regs = pk.load(pk.rt((self.rows, self.width), t.dtype), t, self.at(0),
                       fill=fill, inside=self.exact and not self.past_end())
        return lambda j: self.window(regs, j)

    def window(self, regs, j):
        """Block j of a held (rows x width) register tile, in f32."""
        return pk.subtile(regs, (0, j * self.cols), (self.rows, self.cols)).cast(pk.f32)

    def vec(self, w, j):
        """Block j's columns of the 1-D tensor w, as an f32 column vector."""
        return pk.load(self.col, w, (self.col_of(j),), inside=self.exact)

    def vecs(self, w, present=True, held=None):
        """vec(w, j) as a function of j, or None where w is absent (`present` false). Held
        (the default for held rows; e.g. across a walk over many row groups): every
        block's read now, once; otherwise each call reads its block (from cache after the
        first workgroup)."""
        if not present:
            return None
        if not (self.held if held is None else held):
            return lambda j: self.vec(w, j)
        held = [self.vec(w, j) for j in range(self.nblocks)]
        return lambda j: held[j]

    def mask(self, t, j, value=0.0):
        """t with the elements outside the tensor (ragged rows and columns) set to value
        (none where the rows are exact)."""
        if self.exact:
            return t
        return pk.mask_outside(t, self.at(j), (self.m, self.n), value=value)

    def store(self, dst, t, j):
        if self.exact and self.past_end():
            with pk.if_(self.r0 < self.m):
                pk.store(dst, t, self.at(j), inside=True)
            return
        pk.store(dst, t, self.at(j), inside=self.exact)

    def store_rows(self, dst, v, at=None):
        """A value per row (a row vector: the statistics) into the 1-D tensor dst, or into
        row `at` of a 2-D one; in a split row every wave holds it, and wave 0 writes it."""
        coord = (self.r0,) if at is None else (at, self.r0)
        if not self.split:
            pk.store(dst, v, coord)
            return
        with pk.if_(pk.wave_id() == 0):
            pk.store(dst, v, coord)

    def total(self, v):
        return pk.workgroup_sum(v) if self.split else v

    def peak(self, v):
        return pk.workgroup_max(v) if self.split else v


class Feed:
    """What a kernel whose workgroups walk the rows (Rows.steps) reads at each step: row
    blocks of its 2-D inputs (`tensors`) and per-row values of others (`per_row`: pairs
    (tensor, index): row r's value is tensor[r], or tensor[index, r] for a 2-D one, e.g.
    a norm's statistics). `step(i)` moves the rows to step i and returns (one block
    function j -> f32 tile per 2-D input, one row vector per per-row input).

    Per-row values are loaded a step early into registers carried around the loop, so no
    step waits for them. With STAGES >= 2 (split rows, Hopper) the TMA unit copies the rows
    of the next STAGES - 1 steps into shared memory (a pk.Ring), each wave its own share in
    CHUNK-wide boxes, and the waves read their blocks from there: the next steps' loads are
    in flight while this one computes, and hold no registers. Otherwise each step reads
    its blocks as rows.hold does. PROGRAMS > 0 builds the kernel for that many workgroups
    per SM (pk.programs_per_cu: the registers of each capped to fit)."""

    def __init__(self, rows: Rows, tensors, per_row=(), STAGES: int = 0, PROGRAMS: int = 0):
        self.rows, self.tensors, self.ring, self.loop = rows, list(tensors), None, True
        if PROGRAMS:
            pk.programs_per_cu(PROGRAMS)
        self.per_row = [(t, at, self._load_row_values(rows.row, t, at, rows.r0))
                        for t, at in per_row]
        if STAGES >= 2:
            if not rows.split:
                raise ValueError("STAGES >= 2 stages split rows (SPLIT=1) in shared memory")
            boxes = rows.nblocks * pk.num_waves()        # CHUNK-wide boxes per row
            # (a shared tile has a power of 2 or a multiple of 8 rows)
            tile_rows = boxes if boxes & (boxes - 1) == 0 else -(-boxes // 8) * 8
            self.ring = pk.Ring(STAGES, fill=len(self.tensors) * boxes,
                                drain=pk.num_waves(),
                                **{f"t{k}": pk.st((tile_rows, rows.cols), t.dtype)
                                   for k, t in enumerate(self.tensors)})
            self.ahead = STAGES - 1
            for k in pk.static_range(self.ahead):
                with pk.if_(k < rows.steps()):
                    self._issue(k)

    @staticmethod
    def _coord(at, r):
        return (r,) if at is None else (at, r)

    def _load_row_values(self, dst, t, at, r):
        """Row r's values of per-row input t into dst. Exact rows read the last row's in
        place of rows past it, so no bounds are checked: those are the values loaded ahead
        of a walk's last step (never used) and those of rows past the end (whose inputs
        read as zero and whose stores are skipped), so they touch nothing."""
        rows = self.rows
        if rows.exact:
            r = pk.minimum(r, rows.m - 1)
        return pk.load(dst, t, self._coord(at, r), inside=rows.exact)

    def _box(self, j):
        """The row of a stage's tile holding this wave's block j."""
        return pk.wave_id() * self.rows.nblocks + j

    def _issue(self, step):
        """This wave's boxes of the rows of `step` into their stage (free once every wave
        released its use STAGES steps earlier)."""
        rows = self.rows
        stage = self.ring.acquire(step)
        r = rows.first + step * rows.stride()
        for k, t in enumerate(self.tensors):
            for j in pk.static_range(rows.nblocks):
                pk.tma_load(getattr(stage, f"t{k}"), t, (r, rows.col_of(j)), stage.full,
                            rows=1, at=self._box(j))

    def step(self, i):
        rows = self.rows
        rows.step(i)
        values = []
        if not self.loop:                               # the only step: nothing ahead
            return [rows.hold(t) for t in self.tensors], [a for _, _, a in self.per_row]
        for t, at, ahead in self.per_row:
            now = pk.empty(rows.row)
            now.set(ahead)
            self._load_row_values(ahead, t, at, rows.r0 + rows.stride())
            values.append(now)
        if self.ring is None:
            return [rows.hold(t) for t in self.tensors], values
        with pk.if_(i > 0):
            self.ring.release(i - 1)                    # this wave has read the last step
        with pk.if_(i + self.ahead < rows.steps()):
            self._issue(i + self.ahead)
        stage = self.ring.wait(i)
        blocks = [functools.partial(self._read, getattr(stage, f"t{k}"))
                  for k in range(len(self.tensors))]
        return blocks, values

    def walk(self, loop: bool = True):
        """`for blocks, values in feed.walk():` the steps of the walk (a pk.range loop),
        each as step(i) returns them; loop=False where the grid covers every row group
        (one step, no loop: nothing is held across steps or loaded for a next one)."""
        self.loop = loop or self.ring is not None
        self.rows.walked = self.loop
        if not self.loop:
            yield self.step(0)
            return
        for i in pk.range(self.rows.steps()):
            yield self.step(i)

    def _read(self, tile, j):
        return pk.load(self.rows.block, tile, (self._box(j), 0))


class ColumnSums:
    """Per-column sums over every row a workgroup walks (a norm's dweight and dbias), kept
    as partial sums in the f32 tensor `part`, in its columns first .. first + n - 1 (so
    that several sums can share one tensor), for `column_sum` to add up. Held rows keep
    them in registers and write one partial row per workgroup at the end (`finish`); looped
    rows add each block into the wave's own partial row in memory (one row per wave, no
    synchronisation)."""

    def __init__(self, rows: Rows, part, first=0):
        self.rows, self.part, self.first = rows, part, first
        self.acc = [pk.zeros(rows.block) for _ in range(rows.nblocks)] if rows.held else None

    def add(self, t, j):
        rows = self.rows
        if rows.held:
            self.acc[j] += t
            return
        p = pk.program_id(0) * pk.num_waves() + pk.wave_id()
        c = self._col(j)
        have = pk.load(rows.col, self.part, (p, c))
        pk.store(self.part, have + pk.col_sum(t), (p, c), end=self._end())

    def add_product(self, a, b, j):
        """add(a * b, j), the product and the sum one fused multiply-add where held."""
        if self.rows.held:
            self.acc[j].set(pk.fma(a, b, self.acc[j]))
            return
        self.add(a * b, j)

    def finish(self):
        rows = self.rows
        if not rows.held:
            return
        for j in pk.static_range(rows.nblocks):
            v = pk.col_sum(self.acc[j])
            c = (pk.program_id(0), self._col(j))
            if rows.split:                     # each wave holds its own columns
                pk.store(self.part, v, c, end=self._end(), inside=rows.exact)
            else:                              # each wave holds its own rows
                v = pk.workgroup_sum(v)
                with pk.if_(pk.wave_id() == 0):
                    pk.store(self.part, v, c, end=self._end())

    def _end(self):
        """Stores stop at the last column: another ColumnSums may follow in `part`."""
        return (None, self.first + self.rows.n)

    def _col(self, j):
        c = self.rows.col_of(j)
        return c if isinstance(self.first, int) and self.first == 0 else c + self.first

    @staticmethod
    def partial_rows(grid: int, consts: dict) -> int:
        """Rows of `part` a launch of `grid` workgroups with these schedule constants
        writes."""
        held = consts.get("RESIDENT") or consts.get("SPLIT")
        return grid if held else grid * WAVES


SUM_COLS = 32     # columns per column_sum workgroup: 128 workgroups over 4096 columns


@pk.kernel(num_waves=4)
def column_sum(part: pk.gl["PT", 2], out: pk.gl["DT", 1], PT: pk.const = None,
               DT: pk.const = None, ROWS: pk.const = 32, COLS: pk.const = SUM_COLS,
               PARTS: pk.const = 0, DISCARD: pk.const = 0):
    """out[c] = sum over rows r of part[r, c], summed in f32 and rounded once to out's type:
    the reduction after per-block partial column sums (a norm's dweight, a bias's
    gradient). A workgroup takes COLS columns, its waves every num_waves-th block of ROWS
    rows, added up across the waves at the end: narrow column slices give a grid of many
    workgroups for the few hundred rows a backward pass leaves (one per workgroup).
    PARTS=p: part has p rows (known at launch), so each wave's loads are unrolled and all
    in flight at once instead of one after another. DISCARD=1: part is scratch, dead once
    read (pk.discard: its lines leave L2 without being written back to memory)."""
    sum_columns(part, out, pk.program_id(0) * COLS, ROWS, COLS, PARTS, DISCARD)


def sum_columns(part, out, c0, ROWS, COLS, PARTS=0, DISCARD=0, first=0, shared=False):
    """column_sum's body for one slice: out[c0 .. c0 + COLS) = the sums over part's rows
    of its columns first + c0 .. (f32, rounded once to out's type), the workgroup's waves
    taking every num_waves-th block of ROWS rows. shared: part holds other sums' columns
    beside these, so loads and discards stop where out's columns do."""
    p = part.shape[0]
    step = pk.num_waves() * ROWS
    tile = pk.rt((ROWS, COLS), pk.f32)
    acc = pk.zeros(tile)
    r0 = pk.wave_id() * ROWS
    col = c0 if isinstance(first, int) and first == 0 else c0 + first
    bound = {"end": (None, first + out.shape[0])} if shared else {}

    def blocks():
        return pk.static_range(-(-PARTS // step)) if PARTS else \
            pk.range((p + step - 1) // step)
    for i in blocks():
        acc += pk.load(tile, part, (i * step + r0, col), **bound)
    if DISCARD:          # after the loop: every load of the wave's rows is in its sum
        for i in blocks():
            pk.discard(part, tile, (i * step + r0, col), **bound)
    total = pk.workgroup_sum(pk.col_sum(acc))
    with pk.if_(pk.wave_id() == 0):
        pk.store(out, total, (c0,))


# the column sums added up inside a norm's backward (fused_column_sums): slices of
# column_sum's width, each wave 16 rows at a time
FUSED_ROWS = 16


def fused_column_sums(sums, flags, mark=None) -> None:
    """After a backward walk's partial rows (ColumnSums.finish): the walk's workgroups
    meet at a grid-wide barrier — each counts itself in flags[0] (release at GPU scope)
    and waits until all have — then workgroup w adds up column slices w, w + G, ... of
    every (part, out, first) of `sums` into out (sum_columns, the partial rows dropped
    from L2 once read), and counts itself in flags[1]; workgroup 0 waits for that count
    and zeroes both for the next launch. Instead of column_sum's launch: its fixed
    start and its read of the partial rows after the walk's kernel has ended. Every
    workgroup of the grid must be resident at once (Feed's PROGRAMS an SM, the grid at
    most that many an SM); flags is zero before the launch and left zero. mark(event),
    where given, is called by every wave when the workgroups have "met" and when its
    slices are "summed" (bench/rows_timeline.py)."""
    g = pk.num_programs(0)
    w = pk.program_id(0)
    pk.barrier()                         # every wave's partial rows are stored
    with pk.if_(pk.wave_id() == 0):
        pk.signal(flags, 0, 1, add=True, scope="gpu")
    pk.wait_flag(flags, 0, g, tma=False, scope="gpu")
    if mark is not None:
        mark("met")
    for part, out, first in sums:
        slices = (out.shape[0] + SUM_COLS - 1) // SUM_COLS
        for j in pk.range((slices - w + g - 1) // g):
            sum_columns(part, out, (w + j * g) * SUM_COLS, FUSED_ROWS, SUM_COLS,
                        DISCARD=1, first=first, shared=len(sums) > 1)
    if mark is not None:
        mark("summed")
    pk.barrier()
    with pk.if_(pk.wave_id() == 0):
        pk.signal(flags, 1, 1, add=True, scope="gpu")
    with pk.if_((w == 0) & (pk.wave_id() == 0)):
        pk.wait_flag(flags, 1, g, tma=False, scope="gpu")
        pk.signal(flags, 0, 0, scope="gpu")
        pk.signal(flags, 1, 0, scope="gpu")


# column_sum's schedule where the number of partial rows is known: 8 waves of 16-row loads,
# unrolled. On the H200 (bench/column_sum.py, run FF: partials of the norms' backward at
# the ops bench's shapes, resident in L2) 2.8-5.6 µs against 3.3-6.3 for the looped 4 waves
# of 32 rows; the kernel's own latency, not its bytes, sets that floor
SUM_SCHEDULE = {"ROWS": 16, "num_waves": 8}
# the norms' partial rows are scratch: column_sum drops them from L2 once read
# (DISCARD=1), so they are not written back to memory after the call
DISCARD_PARTS = True
# the norms' backward adds up its own column sums (the *_bwd_fused kernels:
# fused_column_sums) where its whole grid is resident, instead of launching column_sum:
# not measured on a GPU yet, so off (bench/ops_bandwidth.py's variants step times it)
FUSED_SUMS = False


def all_resident(grid: int, consts: dict, target) -> bool:
    """Whether every workgroup of a backward walk of `grid` workgroups under `consts` is
    resident at once: built to fit PROGRAMS workgroups an SM, and at most that many an SM
    (what fused_column_sums' barrier needs)."""
    from ..targets import get
    programs = consts.get("PROGRAMS", 0)
    return programs >= 1 and grid <= programs * get(target).num_cus


def fuses_sums(grid: int, consts: dict, target) -> bool:
    """Whether the ops' backward adds up its column sums itself (FUSED_SUMS, where
    all_resident)."""
    return FUSED_SUMS and all_resident(grid, consts, target)


def column_sum_launch(n: int, parts: int | None = None, **consts):
    """(grid, consts) of column_sum over n columns: with `parts` (part's rows) the unrolled
    SUM_SCHEDULE, else the looped default; consts override either (ROWS, COLS, num_waves:
    sweeps)."""
    c = {**({"PARTS": parts, **SUM_SCHEDULE} if parts else {}), **consts}
    return (max(1, -(-n // c.get("COLS", SUM_COLS))),), c
