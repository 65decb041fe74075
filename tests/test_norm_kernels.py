"""The row kernels (norms, softmax, their backward passes; rope) in the emulator against
float64, beyond the library's default launch that tests/test_kernels.py runs: every row
schedule (held by one wave, split across waves, looped) on sm_90a and gfx950, rows from 256
to 65536 columns, workgroups walking many rows into partial column sums, LayerNorm without
weight or bias, RoPE's layouts; the launch rule; pk.xor_cols."""
import re

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels import KERNELS, rows
from pykittens.kernels.layernorm import layernorm
from pykittens.kernels.rope import rope, rope_launch
from conftest import needs_ptxas, rel_err

SCHEDULES = {
    "resident": (4, {"RESIDENT": 1, "N_MAX": 1024, "CHUNK": 512}),
    "split": (1, {"SPLIT": 1, "ROWS": 1, "N_MAX": 1024, "CHUNK": 512, "num_waves": 2}),
    "loop": (4, {"ROWS": 1, "COLS": 256}),
}
ROW_KERNELS = ("layernorm", "rmsnorm", "add_rmsnorm", "softmax", "layernorm_bwd",
               "rmsnorm_bwd", "softmax_bwd")
# each kernel, schedule and target once; the dtype alternates over them
CASES = [(name, sched, target, ("f32", "bf16")[(i + j) % 2])
         for i, name in enumerate(ROW_KERNELS) for j, sched in enumerate(SCHEDULES)
         for target in ("sm_90a", "gfx950")]


def run_spec(name, shape, dtype, target, consts=None, grid=None):
    """Emulate library kernel `name` on its spec's inputs (outputs poisoned), with the
    spec's launch or the given schedule; the per-output errors against float64."""
    spec = KERNELS[name]
    inputs = spec.poison(spec.make_inputs(shape, pk.dtype_of(dtype),
                                          np.random.default_rng(sum(shape))))
    default_grid, default = spec.launch(inputs, target)
    if consts is not None:                       # the spec's other constants, this schedule
        consts = {**{k: v for k, v in default.items() if k in ("STATS", "RESIDUAL")},
                  **consts}
    got = pk.emulate(spec.kernel, grid=grid or default_grid, target=target, **inputs,
                     **(default if consts is None else consts))
    return spec, spec.errors(got, spec.reference(inputs))


@pytest.mark.parametrize("name,sched,target,dtype", CASES,
                         ids=[f"{n}-{s}-{t}-{d}" for n, s, t, d in CASES])
def test_every_schedule(name, sched, target, dtype):
    """Ragged rows and columns (19 x 700: not a multiple of any tile). Backward kernels run
    on few workgroups, so each walks several row groups into its partial sums."""
    per, consts = SCHEDULES[sched]
    grid = -(-19 // per)
    if name in ("layernorm_bwd", "rmsnorm_bwd"):
        grid = min(grid, 2)
    spec, errs = run_spec(name, (19, 700), dtype, target, consts, (grid,))
    for out, e in errs.items():
        assert e["rel_err"] <= spec.tolerance(dtype), (out, e)


@pytest.mark.parametrize("name,target,dtype", [
    ("rmsnorm", "sm_90a", "f32"), ("rmsnorm", "sm_90a", "bf16"),
    ("layernorm_bwd", "sm_90a", "bf16"), ("layernorm", "gfx942", "f32"),
    ("softmax", "gfx950", "bf16"), ("softmax_bwd", "gfx942", "f32"),
    ("add_rmsnorm", "gfx950", "f32"), ("rmsnorm_bwd", "gfx950", "bf16")])
def test_rows_of_65536_columns(name, target, dtype):
    """The widest rows, on the library's own launch: split across 16-32 waves, or looped."""
    spec, errs = run_spec(name, (2, 65536), dtype, target)
    for out, e in errs.items():
        assert e["rel_err"] <= spec.tolerance(dtype), (out, e)


def test_launch_rule_covers_256_to_65536_columns():
    """Every width gets a schedule its targets can run: held rows fit the workgroup (waves,
    a power-of-2 share each, covering the row); wider rows loop."""
    from pykittens.targets import get
    for target in ("gfx942", "gfx950", "sm_90a"):
        for row_bytes in (2, 4, 12, 16):
            for n in (256, 300, 1000, 4096, 12288, 65536):
                per, c = rows.plan(8, n, target, row_bytes)
                if c.get("SPLIT"):
                    assert c["N_MAX"] >= n and c["num_waves"] <= get(target).max_waves_per_workgroup
                    share = c["N_MAX"] // c["num_waves"]
                    assert share % c["CHUNK"] == 0 and share & (share - 1) == 0
                elif c.get("RESIDENT"):
                    assert c["N_MAX"] >= n and per == rows.WAVES
                else:
                    assert c == rows.LOOP
    assert rows.plan(8, 65536, "sm_90a", 2)[1]["num_waves"] == 32        # bf16: split
    assert rows.plan(8, 65536, "sm_90a", 4)[1] == rows.LOOP              # f32: looped
    # a backward pass holding x, dy and two f32 sums gets shares of a CHUNK
    assert rows.plan(8, 3000, "sm_90a", 12)[1]["num_waves"] == 6
    grid, consts = rows.walk_plan(100000, 1024, "sm_90a", 12)
    assert grid == (132 * rows.BWD_PROGRAMS_PER_CU,)                    # a bounded grid
    with pytest.raises(ValueError, match="cannot hold one workgroup's 4"):
        rows.walk_plan(8, 65536, "sm_90a", 16, parts=2)


STAGED = ("layernorm_bwd", "rmsnorm_bwd", "softmax_bwd", "layernorm", "rmsnorm",
          "add_rmsnorm")


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_staged_walk(name, dtype):
    """Rows staged in shared memory by the TMA unit (rows.Feed, STAGES >= 2) on sm_90a: 3
    workgroups walk 19 ragged rows of 2104 columns (not a multiple of the 256-column box:
    the boxes past the row read as zero), two and three stages deep, against float64. The
    emulator checks every stage's TMA copy against the waves' reads of it (races)."""
    nt = {"add_rmsnorm": 2, "layernorm_bwd": 2, "rmsnorm_bwd": 3, "softmax_bwd": 2}.get(name, 1)
    for stages in (2, 3):
        _, consts = rows.staged_plan(19, 2104, "sm_90a", 2 if dtype == "bf16" else 4, nt,
                                     waves=4, stages=stages, programs=1)
        if name == "rmsnorm_bwd":
            consts["RESIDUAL"] = 1
        spec, errs = run_spec(name, (19, 2104), dtype, "sm_90a", consts, (3,))
        for out, e in errs.items():
            assert e["rel_err"] <= spec.tolerance(dtype), (stages, out, e)


def test_staged_plan():
    """Only Hopper, only rows of at least 2048 columns and whole 16-byte rows, only stages
    that fit; workgroups per SM within the share's warps (STAGED_SHARES) and the
    shared-memory budget."""
    assert rows.staged_plan(16384, 8192, "gfx950", 2, 2) is None
    assert rows.staged_plan(16384, 1024, "sm_90a", 2, 2) is None
    assert rows.staged_plan(16384, 4100, "sm_90a", 2, 2) is None     # 8200-byte rows
    assert rows.staged_plan(16384, 65536, "sm_90a", 2, 2) is None    # 512 KiB a stage
    for n, sums in ((4096, 1), (8192, 1), (12288, 1), (8192, 2), (6000, 2)):
        (grid,), c = rows.staged_plan(16384, n, "sm_90a", 2, 2, sums)
        assert c["N_MAX"] >= n and c["N_MAX"] % (c["num_waves"] * rows.STAGE_COLS) == 0
        assert c["PROGRAMS"] * c["num_waves"] <= max(c["num_waves"],
                                                     rows.staged_share(n, sums)[1])
        assert c["STAGES"] * 2 * c["N_MAX"] * 2 * c["PROGRAMS"] <= rows.STAGE_BUDGET
        most = 132 * c["PROGRAMS"]       # or fewer, in full steps (one more at most)
        assert grid == most or 16384 % grid == 0 and \
            -(-16384 // most) <= 16384 // grid <= -(-16384 // most) + 1
    assert rows.staged_plan(5, 8192, "sm_90a", 2, 2)[0] == (5,)       # no idle workgroups
    # 4096 rows: 128 workgroups in 32 full steps rather than 132 in 31 and a step of 4;
    # 16384 rows of 4096: 256 in 64 rather than 264 in 62 and a step of 16
    for sums in (0, 1, 2):
        assert rows.staged_plan(4096, 12288, "sm_90a", 2, 2, sums)[0] == (128,)
    assert rows.staged_plan(16384, 4096, "sm_90a", 2, 2, 1)[0] == (256,)
    assert rows.staged_plan(4100, 12288, "sm_90a", 2, 2)[0] == (132,)   # none divides
    assert rows.staged_plan(16384, 8192, "sm_90a", 2, 2)[0] == (132,)   # not in 126
    # 512 columns a wave; two sums: 1024 where a row would take more than 16 such waves
    # two sums alone on an SM: three stages
    for n, sums, waves, programs, stages in ((8192, 1, 16, 1, 2), (8192, 2, 16, 1, 3),
                                             (4096, 2, 8, 2, 2), (12288, 2, 12, 1, 3),
                                             (12288, 1, 24, 1, 2)):
        c = rows.staged_plan(16384, n, "sm_90a", 2, 2, sums)[1]
        assert (c["num_waves"], c["PROGRAMS"], c["STAGES"]) == (waves, programs, stages), n


def test_ops_stage_only_tma_ready_backward_inputs():
    """The backward launch rules stage x and dy only where the TMA unit can copy them
    (16-byte aligned rows), and never the forward passes."""
    from pykittens.kernels import ln_grad_launch, rms_grad_launch, row_launch
    x = np.zeros((64, 4096), np.float16)
    assert rms_grad_launch({"x": x, "dy": x}, "sm_90a", residual=False)[1].get("STAGES")
    assert ln_grad_launch({"x": x, "dy": x}, "sm_90a")[1].get("STAGES")
    assert not row_launch({"x": x}, "sm_90a")[1].get("STAGES")
    assert not rms_grad_launch({"x": x, "dy": x}, "gfx950", residual=False)[1].get("STAGES")
    torch = pytest.importorskip("torch")
    t = torch.zeros(64 * 4096 + 1, dtype=torch.float16)[1:].view(64, 4096)   # 2 bytes off
    assert not ln_grad_launch({"x": t, "dy": t}, "sm_90a")[1].get("STAGES")


def test_layernorm_of_rows_with_a_large_mean():
    """Statistics from sums of deviations from the row's first element: rows whose mean is
    1000 standard deviations keep their variance (x^2's mean less the squared mean would
    lose it to f32 rounding); every schedule against float64."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((19, 700)) + 1000).astype(np.float32)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(1), x64.var(1)
    for sched in list(SCHEDULES) + ["tma"]:
        per, consts = SCHEDULES.get(sched, (4, {"TMA": 1, "N_MAX": 1024, "CHUNK": 256}))
        got = pk.emulate(layernorm, x, np.zeros(1, np.float32), np.zeros(1, np.float32),
                         np.full_like(x, np.nan), np.zeros((2, 19), np.float32), 1e-5,
                         grid=-(-19 // per), target="sm_90a", WEIGHT=0, BIAS=0, STATS=1,
                         **consts)
        assert rel_err(got["stats"][1], 1 / np.sqrt(var + 1e-5)) < 1e-4, sched
        assert rel_err(got["stats"][0], mu) < 1e-6, sched


@pytest.mark.parametrize("sched", list(SCHEDULES) + ["tma"])
def test_layernorm_without_weight_or_bias_and_its_statistics(sched):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((19, 700)) * 2 + 3).astype(np.float32)
    per, consts = SCHEDULES.get(sched, (4, {"TMA": 1, "N_MAX": 1024, "CHUNK": 256}))
    targets = ("sm_90a",) if sched == "tma" else ("sm_90a", "gfx950")
    for target in targets:
        got = pk.emulate(layernorm, x, np.zeros(1, np.float32), np.zeros(1, np.float32),
                         np.full_like(x, np.nan), np.zeros((2, 19), np.float32), 1e-5,
                         grid=-(-19 // per), target=target, WEIGHT=0, BIAS=0, STATS=1,
                         **consts)
        mu, var = x.astype(np.float64).mean(1), x.astype(np.float64).var(1)
        assert rel_err(got["out"], (x - mu[:, None]) / np.sqrt(var[:, None] + 1e-5)) < 1e-5
        assert rel_err(got["stats"][0], mu) < 1e-6
        assert rel_err(got["stats"][1], 1 / np.sqrt(var + 1e-5)) < 1e-5


@pytest.mark.parametrize("shape", [(8, 1024), (3, 4096)])
def test_layernorm_of_exact_rows(shape):
    """Held rows that fill their windows (exactly the held width, no workgroup row past the
    last): the launch rule promises it (EXACT=1: no bounds checks, no column masks) and the
    statistics are float64's. The same promise on ragged rows is reported by the emulator
    (the GPU code would read past their ends), and rows a resident workgroup would take past
    the last get no promise."""
    from pykittens.emulator.machine import OutOfBounds
    from pykittens.kernels import ln_launch
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32) + 2
    grid, consts = ln_launch({"x": x}, "sm_90a")
    assert consts.get("EXACT") == 1 and consts["N_MAX"] == shape[1]
    ragged = x[:, :shape[1] - 100].copy()
    assert not ln_launch({"x": ragged}, "sm_90a")[1].get("EXACT")
    resident = np.zeros((7, 512), np.float32)             # one row a wave, 4 a workgroup
    assert ln_launch({"x": resident}, "sm_90a")[1].get("RESIDENT") == 1
    assert not ln_launch({"x": resident}, "sm_90a")[1].get("EXACT")
    assert ln_launch({"x": resident[:4]}, "sm_90a")[1].get("EXACT") == 1

    def stats(x, consts):
        got = pk.emulate(layernorm, x, np.zeros(1, np.float32), np.zeros(1, np.float32),
                         np.full_like(x, np.nan), np.zeros((2, len(x)), np.float32), 1e-5,
                         grid=grid, target="sm_90a", WEIGHT=0, BIAS=0, STATS=1, **consts)
        return got["stats"]
    x64 = x.astype(np.float64)
    got = stats(x, consts)
    assert rel_err(got[0], x64.mean(1)) < 1e-6
    assert rel_err(got[1], 1 / np.sqrt(x64.var(1) + 1e-5)) < 1e-5
    with pytest.raises(OutOfBounds, match="promised inside"):
        stats(ragged, consts)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "add_rmsnorm", "softmax",
                                  "softmax_bwd"])
@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_exact_rows_against_float64(name, target):
    """The row kernels as their launch rules build them for exact rows (EXACT=1), every
    output against float64."""
    shape = (8, 4096)
    spec = KERNELS[name]
    x = np.zeros(shape, np.float32)
    i = {"x": x, "residual": x, "y": x}
    assert spec.launch(i, target)[1].get("EXACT") == 1
    spec, errs = run_spec(name, shape, "bf16", target)
    for out, e in errs.items():
        assert e["rel_err"] <= spec.tolerance("bf16"), (out, e)


def test_column_sum_of_many_partials():
    spec, errs = run_spec("column_sum", (300, 1030), "bf16", "gfx950")
    assert errs["out"]["rel_err"] <= spec.tolerance("bf16")


@pytest.mark.parametrize("parts,n", [(300, 1030), (37, 1100), (132, 64)])
def test_column_sum_unrolled_over_known_partials(parts, n, rng):
    """The ops' schedule (the number of partial rows known at launch, loads unrolled):
    ragged rows and columns, against float64 sums."""
    from pykittens.kernels.rows import SUM_SCHEDULE, column_sum, column_sum_launch
    part = rng.standard_normal((parts, n)).astype(np.float32)
    grid, consts = column_sum_launch(n, parts)
    assert consts == {"PARTS": parts, **SUM_SCHEDULE}
    out = pk.emulate(column_sum, part, np.zeros(n, np.float32), grid=grid, target="sm_90a",
                     PT="f32", DT="f32", **consts)["out"]
    assert np.allclose(out, part.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)


def rope_reference(x, cos, sin, pos, interleaved, inverse):
    x = x.astype(np.float64)
    half = cos.shape[1]
    c = cos.astype(np.float64)[pos][:, :, None, :]
    s = sin.astype(np.float64)[pos][:, :, None, :] * (-1 if inverse else 1)
    a, b = (x[..., 0:2 * half:2], x[..., 1:2 * half:2]) if interleaved else \
        (x[..., :half], x[..., half:2 * half])
    out = x.copy()
    if interleaved:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        out[..., :half], out[..., half:2 * half] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize("target", ["sm_90a", "gfx950"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("shape,half,dtype", [((2, 5, 3, 64), 32, "bf16"),
                                              ((1, 7, 5, 80), 16, "f32"),
                                              ((1, 3, 42, 128), 64, "bf16")])
def test_rope_layouts(target, interleaved, shape, half, dtype):
    """GPT-NeoX halves and GPT-J pairs, whole and partial rotary dims (the rest passes
    through), the inverse rotation (the backward), explicit positions; more heads than a
    wave's tile holds (the grid walks blocks of heads, the last one ragged, in both of its
    orders)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(pk.dtype_of(dtype).np)
    ang = rng.uniform(-3, 3, (shape[1] + 3, half))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    tables = [np.repeat(t, 2, 1) if interleaved else t for t in (cos, sin)]
    for inverse, positions in ((0, None), (1, rng.integers(0, shape[1] + 3, shape[:2]))):
        grid, consts = rope_launch(shape, half, interleaved, target, INVERSE=inverse,
                                   POSITIONS=int(positions is not None))
        orders = (1,)
        if shape[2] == 42:
            blocks = -(-42 // consts["HEADS"])
            assert blocks > 1 and grid == (-(-shape[0] * shape[1] // 4) * blocks,)
            orders = (1, 0)
        pos = np.zeros((1, 1), np.int32) if positions is None else positions.astype(np.int32)
        want = rope_reference(x, cos, sin, np.broadcast_to(np.arange(shape[1]), shape[:2])
                              if positions is None else positions, interleaved, inverse)
        for order in orders:
            got = pk.emulate(rope, x, *tables, pos, np.full_like(x, np.nan), grid=grid,
                             target=target, **{**consts, "HEADS_FIRST": order})["out"]
            assert rel_err(got, want) < (1e-6 if dtype == "f32" else 1e-2)


def test_xor_cols_exchanges_columns_in_registers(rng):
    @pk.kernel
    def swap(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], MASK: pk.const = 1):
        pk.store(out, pk.xor_cols(pk.load(pk.rt((4, 128), pk.f32), x), MASK))

    x = rng.standard_normal((4, 128)).astype(np.float32)
    for target in ("gfx942", "gfx950", "sm_90a"):
        for mask in (1, 2):
            got = pk.emulate(swap, x, np.zeros_like(x), grid=1, target=target, MASK=mask)
            assert np.array_equal(got["out"], x[:, np.arange(128) ^ mask])
    assert "slots(" in compiler.emit(swap, "sm_90a", "lane") and \
        "bfly(" not in compiler.emit(swap, "sm_90a", "lane")          # no lane traffic
    with pytest.raises(pk.KernelError, match="exchanges columns held by different lanes"):
        pk.emulate(swap, x, np.zeros_like(x), grid=1, target="gfx950", MASK=8)
    with pytest.raises(pk.KernelError, match="must be a power of two below"):
        pk.emulate(swap, x, np.zeros_like(x), grid=1, target="gfx950", MASK=3)


def test_softmax_backward_takes_wide_shares_where_the_default_needs_many_waves():
    """softmax_grad_launch: 16-bit rows whose default split needs more than 16 waves take
    2048-column shares on Hopper when 8 waves cover the row (12288 columns: 6 waves instead
    of 24); other widths, f32 and CDNA keep the default; the wide build against float64."""
    from pykittens.kernels import softmax_grad_launch
    def waves(n, dt=np.float16, target="sm_90a"):
        return softmax_grad_launch({"y": np.zeros((8, n), dt)}, target)[1].get("num_waves")
    assert waves(12288) == 6
    assert waves(8192) == 16 and waves(20000) == 20 and waves(12288, np.float32) == 24
    assert waves(12288, target="gfx950") == 12
    spec, errs = run_spec("softmax_bwd", (3, 12288), "bf16", "sm_90a")
    assert errs["dx"]["rel_err"] <= spec.tolerance("bf16")


def test_split_rows_take_one_more_workgroup_where_its_registers_fit(monkeypatch):
    """split_programs raises PROGRAMS by one where a Hopper split row leaves fewer than
    three workgroups on an SM, one more fits the SM's 64 warp slots, and the capped build
    spills at most 16 bytes a lane (ptxas' report, stood in for here): registers, spills
    and warps decide, nothing else."""
    from pykittens.ops import norms as K
    consts = {"SPLIT": 1, "ROWS": 1, "N_MAX": 12288, "CHUNK": 512, "num_waves": 12}
    reports = {}

    def fits(kernel, target, items, dtype):
        return reports[dict(items).get("PROGRAMS", 0)]
    monkeypatch.setattr(K, "_fits", fits)
    kernel = KERNELS["rmsnorm"].kernel
    reports.update({0: (69, 0), 3: (56, 0)})         # 12 warps x 72 registers: 2 an SM
    assert K.split_programs(kernel, "sm_90a", consts, "bf16")["PROGRAMS"] == 3
    reports[3] = (56, 16)                             # a small spill: still taken
    assert K.split_programs(kernel, "sm_90a", consts, "bf16")["PROGRAMS"] == 3
    reports[3] = (56, 24)                             # a larger one: not taken
    assert K.split_programs(kernel, "sm_90a", consts, "bf16") == consts
    reports.update({0: (40, 0), 4: (32, 0)})         # already 4 an SM: left alone
    assert K.split_programs(kernel, "sm_90a", consts, "bf16") == consts
    wide = {**consts, "N_MAX": 24576, "num_waves": 24}
    reports.update({0: (40, 0), 3: (24, 0)})         # 2 an SM; 3 x 24 warps exceed 64
    assert K.split_programs(kernel, "sm_90a", wide, "bf16") == wide
    reports.clear()                                   # (none consulted below)
    for target, c in (("gfx950", consts), ("sm_90a", {**consts, "SPLIT": 0}),
                      ("sm_90a", {**consts, "PROGRAMS": 2})):
        assert K.split_programs(kernel, target, c, "bf16") == c
    monkeypatch.setattr(K, "_fits", lambda *a: None)  # no ptxas: the launch rule as is
    assert K.split_programs(kernel, "sm_90a", consts, "bf16") == consts


@needs_ptxas
def test_split_programs_with_ptxas():
    """With the real report, at 12288 bf16 columns: layer_norm's 12-wave rows take three
    workgroups an SM (a cap that spills 16 bytes); rms_norm's already fit three by their
    registers, and add_rms_norm's 24-wave rows cannot take a third (72 warps): unchanged."""
    from pykittens.kernels import ln_launch, stats_launch
    from pykittens.ops.norms import split_programs
    x = np.empty((4096, 12288), pk.bf16.np)
    _, ln = stats_launch({"x": x}, "sm_90a", launch=ln_launch)
    ln = {**ln, "WEIGHT": 1, "BIAS": 1}
    assert split_programs(KERNELS["layernorm"].kernel, "sm_90a", ln, "bf16") == \
        {**ln, "PROGRAMS": 3}
    _, rms = stats_launch({"x": x}, "sm_90a")
    _, add = stats_launch({"x": x}, "sm_90a", row_bytes=4)
    for name, c in (("rmsnorm", rms), ("add_rmsnorm", add)):
        c = {**c, "WEIGHT": 1}
        assert split_programs(KERNELS[name].kernel, "sm_90a", c, "bf16") == c


@pytest.mark.parametrize("name", ["layernorm_bwd", "rmsnorm_bwd"])
@pytest.mark.parametrize("shape,dtype,target,schedule", [
    ((19, 2048), "bf16", "sm_90a", "STAGES"),      # staged split rows, 8 workgroups
    ((19, 2048), "bf16", "gfx942", "SPLIT"),       # split rows in registers
    ((19, 512), "f32", "sm_90a", "RESIDENT")])     # a row a wave: steps past the end
def test_exact_backward_walks(name, shape, dtype, target, schedule):
    """Backward walks over rows of exactly the held width (EXACT=1: no bounds checked in a
    row's windows) on fewer workgroups than rows, so workgroups walk different numbers of
    rows (split rows) or the last step passes the end (a row a wave: its stores test the
    row); every output against float64."""
    spec = KERNELS[name]
    inputs = spec.make_inputs(shape, pk.dtype_of(dtype), np.random.default_rng(3))
    grid, consts = spec.launch(inputs, target)
    assert consts.get("EXACT") == 1 and consts.get(schedule) and grid[0] < shape[0]
    spec, errs = run_spec(name, shape, dtype, target)
    for out, e in errs.items():
        assert e["rel_err"] <= spec.tolerance(dtype), (out, e)


def _global_stores(ptx: str) -> dict:
    """{'vector': n, 'scalar': n} of the PTX's 32-bit-element global stores."""
    found = re.findall(r"st\.global\.(v[24]\.)?b32", ptx)
    return {"vector": sum(1 for v in found if v), "scalar": sum(1 for v in found if not v)}


@pytest.mark.parametrize("n", [12288, 2104])
def test_dbias_partial_rows_are_stored_as_dweights_are(n):
    """LayerNorm's backward writes its two partial column sums side by side in `part`,
    dbias's from dbias_column(n) on, an offset the compiler sees is aligned though n is a
    run-time value: dbias's partial rows are stored as dweight's are (16-byte vectors, and
    4-byte ones only on a ragged row's edge path); rows held exactly (12288 columns, EXACT)
    leave in 16-byte stores alone. At column n itself they went out in 4-byte pieces (10 µs
    on the H200 at 4096x12288, docs/PERF.md)."""
    _, consts = KERNELS["layernorm_bwd"].launch(
        dict.fromkeys(("x", "dy"), np.empty((4096, n), pk.dtype_of("bf16").np)), "sm_90a")
    kernel = KERNELS["layernorm_bwd"].kernel
    both, dweight, dx = (_global_stores(compiler.assembly(kernel, "sm_90a", DT="bf16",
                                                          **consts, DW=dw, DB=db))
                         for dw, db in ((1, 1), (1, 0), (0, 0)))
    # what dbias's row adds: vectors, and no more 4-byte stores than dweight's adds
    assert both["vector"] > dweight["vector"], (both, dweight, dx)
    assert both["scalar"] - dweight["scalar"] <= dweight["scalar"] - dx["scalar"], \
        (both, dweight, dx)
    assert rows.exact(n, consts) == (n == 12288)
    if n == 12288:
        assert both["scalar"] == 0 and both["vector"] >= 16, both
