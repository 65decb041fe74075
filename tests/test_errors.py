"""Bad input and bad kernels: each error says what went wrong and, for kernel errors, names
the user's file and line."""
import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens.emulator import (BarrierMismatch, MissingBarrier, OutOfBounds, Race,
                                UnwrittenRead)

from conftest import TARGETS, assert_names_line, line_of, poison

HERE = __file__
F32 = np.float32


def x8():
    return np.random.default_rng(7).standard_normal((8, 64)).astype(F32)


# ---- arguments ----------------------------------------------------------------------------

@pk.kernel  # MARK-copy
def copy_k(x: pk.gl[pk.f32, (None, 64)], out: pk.gl[pk.f32, 2], a: pk.f32, n: pk.i32):
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), x) * a)


@pytest.mark.parametrize("args, kw, msg", [
    ((x8().astype(ml_dtypes.bfloat16), x8(), 1.0, 1), {},
     "argument 'x' of copy_k has element type bf16 but the kernel expects f32"),
    ((x8(), x8().reshape(-1), 1.0, 1), {}, "argument 'out' of copy_k has rank 1 but the kernel "
                                           "expects rank 2"),
    ((x8()[:, :32].copy(), x8(), 1.0, 1), {},
     "argument 'x' of copy_k has size 32 in dim 1 but the kernel is compiled for 64"),
    ((x8(), x8(), 1.0), {}, r"missing argument\(s\) \['n'\]"),
    ((x8(), x8(), 1.0, 1, 2), {}, "copy_k takes 4 tensor/scalar arguments"),
    ((x8(), x8(), 1.0, 1), {"a": 2.0}, "argument 'a' given twice"),
    ((x8().tolist(), x8(), 1.0, 1), {}, "must be a numpy array or torch tensor, not list"),
    ((x8(), x8(), "1.0", 1), {}, r"argument 'a' of copy_k must be a number \(f32\), not str"),
    ((x8(), x8(), 1.0, 1.5), {}, r"argument 'n' of copy_k must be an integer \(i32\)"),
    ((x8(), x8(), True, 1), {}, "must be a number"),
])
def test_bad_arguments(args, kw, msg):
    with pytest.raises(pk.KernelError, match=msg) as e:
        pk.emulate(copy_k, *args, grid=1, **kw)
    assert_names_line(e.value, HERE, "# MARK-copy")


def test_dtype_const_inferred_and_checked():
    @pk.kernel
    def k(x: pk.gl["DT", 2], out: pk.gl["DT", 2], DT: pk.const = None):
        pk.store(out, pk.load(pk.rt((8, 64), pk.f32), x))

    xb = x8().astype(ml_dtypes.bfloat16)
    assert np.array_equal(pk.emulate(k, xb, xb * 0, grid=1)["out"], xb)
    with pytest.raises(pk.KernelError, match="has element type f32 but the kernel expects bf16"):
        pk.emulate(k, xb, x8(), grid=1)


def test_bad_grid():
    with pytest.raises(ValueError, match="grid must be 1 to 3 positive sizes"):
        pk.emulate(copy_k, x8(), x8(), 1.0, 1, grid=(1, 0))
    with pytest.raises(ValueError, match="unknown target 'gfx90a'"):
        pk.emulate(copy_k, x8(), x8(), 1.0, 1, grid=1, target="gfx90a")


# ---- target limits --------------------------------------------------------------------------

@pk.kernel
def lds_k(x: pk.gl[pk.f32, 2], NT: pk.const = 2):
    for i in range(NT):
        pk.empty(pk.st((128, 128), pk.f32))  # MARK-lds


def test_lds_limit_per_target():
    with pytest.raises(pk.KernelError, match="shared tiles need 131072 bytes of LDS/shared "
                                             "memory but gfx942 has 65536") as e:
        pk.emulate(lds_k, x8(), grid=1, target="gfx942")
    assert_names_line(e.value, HERE, "# MARK-lds")
    pk.emulate(lds_k, x8(), grid=1, target="gfx942", NT=1)      # 64 KiB fits exactly
    pk.emulate(lds_k, x8(), grid=1, target="gfx950")            # 160 KiB on CDNA4
    pk.emulate(lds_k, x8(), grid=1, target="sm_90a")            # 227 KiB per block
    with pytest.raises(pk.KernelError, match="but gfx950 has 163840"):
        pk.emulate(lds_k, x8(), grid=1, target="gfx950", NT=3)


@pk.kernel
def fp8_k(x: pk.gl[pk.f32, 2], out: pk.gl["OT", 2], MID: pk.const = "e4m3fnuz",
          OT: pk.const = None):
    t = pk.load(pk.rt((8, 64), pk.f32), x)
    pk.store(out, pk.cast(t, MID))  # MARK-fp8


def test_unsupported_dtype_on_target():
    with pytest.raises(pk.KernelError, match=r"tile element type e4m3fnuz is not supported on "
                                             r"gfx950 \(gfx942 uses the FNUZ") as e:
        pk.emulate(fp8_k, x8(), poison((8, 64)), grid=1, target="gfx950")
    assert_names_line(e.value, HERE, "# MARK-fp8")
    with pytest.raises(pk.KernelError, match="parameter 'out' element type e4m3fnuz is not "
                                             "supported on sm_90a"):
        pk.emulate(fp8_k, x8(), np.zeros((8, 64), ml_dtypes.float8_e4m3fnuz), grid=1,
                   target="sm_90a", MID="f32")
    with pytest.raises(pk.KernelError, match="tile element type e4m3 is not supported on gfx942"):
        pk.emulate(fp8_k, x8(), poison((8, 64)), grid=1, target="gfx942", MID="e4m3")
    pk.emulate(fp8_k, x8(), poison((8, 64)), grid=1, target="gfx942")


@pk.kernel
def pin_k(x: pk.gl[pk.f32, 2], P1: pk.const = "a0", P2: pk.const = ""):
    pk.zeros(pk.rt((32, 64), pk.f32, pin=P1))  # MARK-pin1
    if P2:
        pk.zeros(pk.rt((32, 64), pk.f32, pin=P2))  # MARK-pin2


def test_pins():
    pk.emulate(pin_k, x8(), grid=1, target="gfx942", P1="a224", P2="a192")   # 32 regs each
    pk.emulate(pin_k, x8(), grid=1, target="gfx950", P1="v64", P2="a0")
    with pytest.raises(pk.KernelError, match=r"starts at v0: keep v0..v63 for the compiler's "
                                             r"own values") as e:
        pk.emulate(pin_k, x8(), grid=1, target="gfx950", P1="v0")
    assert_names_line(e.value, HERE, "# MARK-pin1")
    with pytest.raises(pk.KernelError, match=r"pinned tile rt<f32>\[32x64,row\] @a250 needs "
                                             r"a250..a281 but gfx942 has only a0..a255") as e:
        pk.emulate(pin_k, x8(), grid=1, target="gfx942", P1="a250")
    assert_names_line(e.value, HERE, "# MARK-pin1")
    with pytest.raises(pk.KernelError, match=r"\(a16..a47\) overlaps the tile pinned at line "
                                             r"\d+ \(a0..a31\)") as e:
        pk.emulate(pin_k, x8(), grid=1, target="gfx950", P1="a0", P2="a16")
    assert_names_line(e.value, HERE, "# MARK-pin2")
    with pytest.raises(pk.KernelError, match="register pinning is a CDNA feature; on sm_90a"):
        pk.emulate(pin_k, x8(), grid=1, target="sm_90a")


def test_pins_count_packed_registers():
    """A 32x64 bf16 tile is 32 elements per lane, packed two to a 32-bit register: 16."""
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], P: pk.const = "a240"):
        pk.zeros(pk.rt((32, 64), pk.bf16, pin=P))

    pk.emulate(k, x8(), grid=1, target="gfx942")
    with pytest.raises(pk.KernelError, match=r"needs a241..a256 but gfx942 has only a0..a255"):
        pk.emulate(k, x8(), grid=1, target="gfx942", P="a241")


def test_register_budget_and_wave_limits():
    @pk.kernel
    def big(x: pk.gl[pk.f32, 2]):
        pk.zeros(pk.rt((256, 256), pk.f32))

    with pytest.raises(pk.KernelError, match="about 1024 32-bit registers per lane at their "
                                             "peak, over gfx942's 512"):
        pk.emulate(big, x8(), grid=1, target="gfx942")

    @pk.kernel
    def small(x: pk.gl[pk.f32, 2]):     # each wave its own rows (waves past 8 rows: none)
        r0 = pk.wave_id() * 4
        pk.store(x, pk.load(pk.rt((4, 8), pk.f32), x, (r0, 0)), (r0, 0))  # MARK-small

    pk.emulate(small, x8(), grid=1, target="sm_90a")             # 32 elements, 32 lanes
    with pytest.raises(pk.KernelError, match=r"register tile \(4, 8\) has 32 elements, not a "
                                             "multiple of the 64 lanes of a gfx950 wave") as e:
        pk.emulate(small, x8(), grid=1, target="gfx950")
    assert_names_line(e.value, HERE, "# MARK-small")
    with pytest.raises(pk.KernelError, match="num_waves=17 exceeds gfx942's limit of 16"):
        pk.emulate(small, x8(), grid=1, target="gfx942", num_waves=17)
    pk.emulate(small, x8(), grid=1, target="sm_90a", num_waves=17)


# ---- matrix instructions --------------------------------------------------------------------

@pk.kernel
def mma_k(x: pk.gl[pk.bf16, 2]):
    d = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))  # MARK-acc
    a = pk.load(pk.rt((32, 16), pk.bf16, role="a"), x)
    b = pk.load(pk.rt((16, 32), pk.bf16, "col", role="b"), x)
    pk.mma_AB(d, a, b)  # MARK-mma


def test_mma_runs_everywhere_and_sizes_are_checked_per_target():
    """mma lowers on every target (MFMA on CDNA, mma.sync on Hopper); an instruction size a
    target lacks is reported at the tile's line."""
    x = x8().astype(ml_dtypes.bfloat16)
    for target in ("gfx942", "gfx950", "sm_90a"):
        pk.emulate(mma_k, x, grid=1, target=target)

    @pk.kernel
    def wide(x: pk.gl[pk.bf16, 2]):
        d = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", mma=32))  # MARK-wide
        pk.store(x, d.cast(pk.bf16))

    with pytest.raises(pk.NotSupportedYet, match="sm_90a has no matrix instruction with "
                                                 "M=32") as e:
        pk.emulate(wide, np.zeros((32, 32), ml_dtypes.bfloat16), grid=1, target="sm_90a")
    assert_names_line(e.value, HERE, "# MARK-wide")


# ---- shared memory: unwritten reads, races, barriers, bounds ---------------------------------

@pk.kernel(num_waves=2)
def swap_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], PRE: pk.const = True,
           SYNC: pk.const = True):
    """Each wave writes its 4 rows into the shared tile, then reads the other wave's rows."""
    s = pk.empty(pk.st((8, 64), pk.f32))
    if PRE:
        pk.load(s, x)
        pk.barrier()
    w = pk.wave_id()
    pk.store(s, pk.load(pk.rt((4, 64), pk.f32), x, (w * 4, 0)) * 2.0, (w * 4, 0))  # MARK-swap-w
    if SYNC:
        pk.barrier()
    u = pk.load(pk.rt((4, 64), pk.f32), s, ((1 - w) * 4, 0))  # MARK-swap-r
    pk.store(out, u, (w * 4, 0))


@pytest.mark.parametrize("target", TARGETS)
def test_barrier_makes_the_exchange_correct(target):
    x = x8()
    for pre in (True, False):
        got = pk.emulate(swap_k, x, poison((8, 64)), grid=1, target=target, PRE=pre)["out"]
        assert np.array_equal(got, 2 * np.concatenate([x[4:], x[:4]]))


@pytest.mark.parametrize("target", TARGETS)
def test_race_without_barrier(target):
    with pytest.raises(Race, match="race: writes shared memory that another wave read since "
                                   r"the last barrier; add pk.barrier\(\) between them "
                                   r"\(workgroup \(0, 0, 0\), wave 1, op lds_store\)") as e:
        pk.emulate(swap_k, x8(), poison((8, 64)), grid=1, target=target, SYNC=False)
    assert_names_line(e.value, HERE, "# MARK-swap-w")
    assert "[kernel swap_k]" in str(e.value)


@pk.kernel(num_waves=2)
def raw_race_k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], SYNC: pk.const = False):
    s = pk.empty(pk.st((8, 64), pk.f32))
    w = pk.wave_id()
    with pk.if_(w == 0):
        pk.store(s, pk.load(pk.rt((8, 64), pk.f32), x))
    if SYNC:
        pk.barrier()
    with pk.if_(w == 1):
        pk.store(out, pk.load(pk.rt((8, 64), pk.f32), s))  # MARK-raw


def test_read_after_write_race():
    with pytest.raises(Race, match="reads shared memory that wave 0 wrote since the last "
                                   "barrier") as e:
        pk.emulate(raw_race_k, x8(), poison((8, 64)), grid=1, target="gfx942")
    assert_names_line(e.value, HERE, "# MARK-raw")
    got = pk.emulate(raw_race_k, x8(), poison((8, 64)), grid=1, target="gfx942", SYNC=True)
    assert np.array_equal(got["out"], x8())


@pytest.mark.parametrize("target", TARGETS)
def test_unwritten_shared_read(target):
    # the other wave writes these bytes later: a missing barrier, not a missing store
    with pytest.raises(MissingBarrier, match=r"missing barrier: reads shared memory \(byte "
                                             r"1024 of st0\) that no wave has written yet") as e:
        pk.emulate(swap_k, x8(), poison((8, 64)), grid=1, target=target, PRE=False,
                   SYNC=False)
    assert isinstance(e.value, UnwrittenRead) and isinstance(e.value, Race)
    assert_names_line(e.value, HERE, "# MARK-swap-r")


def test_shared_tile_nobody_writes(target):
    @pk.kernel(num_waves=2)
    def k(out: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((8, 64), pk.f32))
        pk.store(out, pk.load(pk.rt((4, 64), pk.f32), s, (pk.wave_id() * 4, 0)),
                 (pk.wave_id() * 4, 0))  # MARK-nobody

    with pytest.raises(UnwrittenRead, match=r"read of shared memory that was never written "
                                            r"\(byte 0 of st0\)") as e:
        pk.emulate(k, poison((8, 64)), grid=1, target=target)
    assert not isinstance(e.value, MissingBarrier)


def test_unwritten_register_tile():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], WHERE: pk.const = "empty"):
        if WHERE == "empty":
            t = pk.empty(pk.rt((8, 64), pk.f32))
        else:
            with pk.if_(pk.program_id(0) == 1):
                t = pk.load(pk.rt((8, 64), pk.f32), x)
        pk.store(x, t + 1.0)  # MARK-unset

    for where in ("empty", "branch"):
        with pytest.raises(UnwrittenRead, match="before anything was written to it") as e:
            pk.emulate(k, x8(), grid=1, WHERE=where)
        assert_names_line(e.value, HERE, "# MARK-unset")
        assert "internal" not in str(e.value)


@pk.kernel(num_waves=2)
def mismatch_k(x: pk.gl[pk.f32, 2]):
    with pk.if_(pk.wave_id() == 0):
        pk.barrier()  # MARK-bm


@pytest.mark.parametrize("target", TARGETS)
def test_barrier_mismatch_is_a_deadlock(target):
    with pytest.raises(BarrierMismatch, match=r"barrier mismatch \(deadlock\): waves \[0\] wait "
                                              r"at a barrier that waves \[1\] never reach") as e:
        pk.emulate(mismatch_k, x8(), grid=1, target=target)
    assert_names_line(e.value, HERE, "# MARK-bm")


@pk.kernel(num_waves=2)
def lds_oob_k(x: pk.gl[pk.f32, 2]):
    s = pk.empty(pk.st((4, 64), pk.f32))
    s2 = pk.empty(pk.st((4, 64), pk.f32))
    pk.load(s, x)
    pk.load(s2, x)
    pk.barrier()
    pk.load(pk.rt((4, 64), pk.f32), s, (pk.wave_id() * 4, 0))  # MARK-oob


@pytest.mark.parametrize("target", TARGETS)
def test_lds_out_of_bounds(target):
    """Wave 1 reads rows 4..7 of a 4-row shared tile: the bytes exist (they belong to the
    next tile) but are outside this one."""
    with pytest.raises(OutOfBounds, match=r"LDS access to element \(4, 0\) is outside shared "
                                          r"tile st0 of shape \(4, 64\) \(workgroup "
                                          r"\(0, 0, 0\), wave 1") as e:
        pk.emulate(lds_oob_k, x8(), grid=1, target=target)
    assert_names_line(e.value, HERE, "# MARK-oob")


def test_integer_division_by_zero():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], n: pk.i32):
        pk.store(x, pk.full(pk.rt((8, 64), pk.f32), 64 // n))  # MARK-div0

    with pytest.raises(pk.KernelError, match="integer division by zero") as e:
        pk.emulate(k, x8(), 0, grid=1)
    assert_names_line(e.value, HERE, "# MARK-div0")


def test_emulator_errors_are_kernel_errors():
    from pykittens.emulator import EmulatorError
    for cls in (BarrierMismatch, OutOfBounds, Race, UnwrittenRead):
        assert issubclass(cls, EmulatorError) and issubclass(cls, pk.KernelError)


# ---- silent mistakes that should be errors ---------------------------------------------------

def test_rebinding_a_tile_inside_range_is_reported():
    @pk.kernel
    def k(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        t = pk.rt((8, 64), pk.f32)
        acc = pk.zeros(t)
        for _ in pk.range(3):
            acc = acc + pk.load(t, x)       # should be `acc += ...`
        pk.store(out, acc)

    with pytest.raises(pk.KernelError, match="in place"):
        pk.emulate(k, x8(), poison((8, 64)), grid=1)
