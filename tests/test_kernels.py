"""Every library kernel, emulated for every target at several shapes (ragged ones included),
against its float64 numpy reference."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels import KERNELS, check
from pykittens.kernels.spec import rel_err
from pykittens.targets import NAMES

CASES = [(name, target, dt, shape) for name, spec in KERNELS.items() for target in spec.targets
         for dt in spec.dtypes for shape in spec.shapes]


@pytest.mark.parametrize("name,target,dt,shape", CASES,
                         ids=[f"{n}-{t}-{d}-{'x'.join(map(str, s))}" for n, t, d, s in CASES])
def test_library_kernel_matches_reference(name, target, dt, shape):
    spec = KERNELS[name]
    res = check(spec, shape, dt, target, np.random.default_rng(hash(shape) % 2**32))
    for out, r in res.items():
        assert r["rel_err"] <= spec.tolerance(dt), (out, r)


@pytest.mark.parametrize("consts", [{"ROWS": 4, "COLS": 128}, {"ROWS": 1, "COLS": 1024},
                                    {"ROWS": 2, "COLS": 512, "PREFETCH": 1},
                                    {"RESIDENT": 1, "N_MAX": 2048, "CHUNK": 512},
                                    {"TMA": 1, "N_MAX": 2048, "CHUNK": 256},
                                    {"SPLIT": 1, "ROWS": 1, "N_MAX": 2048, "CHUNK": 512,
                                     "num_waves": 4},
                                    {"SPLIT": 1, "ROWS": 2, "N_MAX": 3072, "CHUNK": 512,
                                     "num_waves": 3}])
def test_layernorm_schedules_agree(consts, rng):
    """The library picks one LayerNorm schedule per shape; all of them must be right."""
    spec = KERNELS["layernorm"]
    for target in (("sm_90a",) if "TMA" in consts else NAMES):
        n = 1496 if "TMA" in consts else 1500   # TMA copies rows of a multiple of 16 bytes
        inputs = spec.make_inputs((9, n), pk.bf16, rng)
        rows = consts.get("ROWS", 1) * (1 if "SPLIT" in consts else 4)
        out = pk.emulate(spec.kernel, grid=(-(-9 // rows),), target=target,
                         **inputs, **consts)["out"]
        assert rel_err(out, spec.reference(inputs)["out"]) < 1e-2


def test_layernorm_launch_choice():
    spec = KERNELS["layernorm"]
    def launch(n, target, dtype=np.float16):
        return spec.launch({"x": np.zeros((8, n), dtype)}, target)

    assert launch(1000, "sm_90a") == ((2,), {"RESIDENT": 1, "N_MAX": 1024, "CHUNK": 512})
    # longer rows: one per workgroup, a power-of-2 share of 16 registers per lane per wave
    # (1024 bf16 on 32-lane waves, 2048 on 64-lane ones), read once; rows that fill the
    # held width exactly (and no workgroup row past the last) check no bounds (EXACT)
    split = {"SPLIT": 1, "ROWS": 1, "CHUNK": 512}
    exact = {**split, "EXACT": 1}
    assert launch(2001, "sm_90a") == ((8,), {**split, "N_MAX": 2048, "num_waves": 2})
    assert launch(2001, "gfx950")[1]["RESIDENT"] == 1
    assert launch(12288, "sm_90a") == ((8,), {**exact, "N_MAX": 12288, "num_waves": 12})
    assert launch(12288, "gfx942") == ((8,), {**exact, "N_MAX": 12288, "num_waves": 6})
    # rows that need exactly 4 double shares take 4 waves of those
    assert launch(8192, "sm_90a") == ((8,), {**exact, "N_MAX": 8192, "num_waves": 4})
    assert launch(7000, "sm_90a")[1]["num_waves"] == 4
    assert launch(8192, "sm_90a", np.float32)[1]["num_waves"] == 16
    assert launch(65536, "gfx942")[1]["num_waves"] == 16      # double shares: 16 x 4096
    # rows a workgroup cannot hold loop over column blocks
    assert launch(1 << 17, "gfx942")[1] == {"ROWS": 1, "COLS": 1024, "PREFETCH": 1}
    from pykittens.kernels import ln_tma_consts
    assert ln_tma_consts(2000) == {"TMA": 1, "N_MAX": 2048, "CHUNK": 256}
    with pytest.raises(ValueError, match="at most 8192 columns"):
        ln_tma_consts(12288)


def test_gemm_on_gfx950_reads_b_with_lds_transposes():
    """gfx950 loads the K x N operand tiles with ds_read_b64_tr_b16; the emulator runs the
    hardware's exchange (tests above) and the code object shows the instruction."""
    from pykittens import compiler
    from pykittens.ir.nodes import walk
    prog = compiler.lane_ir(KERNELS["gemm_basic"].kernel, "gfx950", DT="bf16", OUT="f32")
    assert any(op.kind == "lds_load_tr" for op in walk(prog.body))
    prog942 = compiler.lane_ir(KERNELS["gemm_basic"].kernel, "gfx942", DT="bf16", OUT="f32")
    assert not any(op.kind == "lds_load_tr" for op in walk(prog942.body))
    from pykittens.toolchain import amdgpu
    asm = amdgpu.disassemble(compiler.code_object(KERNELS["gemm_basic"].kernel, "gfx950",
                                                  DT="bf16", OUT="f32"), "gfx950")
    assert "ds_read_b64_tr_b16" in asm


@pytest.mark.parametrize("target,spec_", [("gfx942", "xcd:W=2,C=3"), ("gfx950", "xcd:W=1,C=2"),
                                          ("sm_90a", "grouped:W=2")])
def test_gemm_follows_a_chiplet_mapping(target, spec_, rng):
    """gemm_basic finds its tile through a grid mapping; any bijective mapping gives
    the same product (here over a ragged 3 x 5 tile grid)."""
    from pykittens.kernels import gemm_basic
    a = rng.standard_normal((150, 96)).astype(pk.bf16.np)
    b = rng.standard_normal((96, 300)).astype(pk.bf16.np)
    out = pk.emulate(gemm_basic, a, b, np.full((150, 300), np.nan, np.float32), grid=(15,),
                     target=target, MAP=spec_, TM=3, TN=5)["c"]
    assert rel_err(out, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("name", ["gemm_basic", "gemm_wgmma", "gemm_ws"])
def test_gemm_target_constant_is_the_compile_target(name):
    """The GEMMs' TARGET (pk.target) comes from the target they are compiled for; a
    different one passed by hand is an error, not a mapping for the wrong chip."""
    from pykittens import compiler
    from pykittens.ir.errors import KernelError
    kernel = KERNELS[name].kernel
    assert kernel.target_const == "TARGET"
    consts = dict(DT="bf16", OUT="f32", MAP="grouped:W=2", TM=2, TN=2)
    assert compiler.tile_ir(kernel, "sm_90a", **consts).consts["TARGET"] == "sm_90a"
    assert compiler.tile_ir(kernel, "sm_90a", TARGET="sm_90a", **consts).target == "sm_90a"
    with pytest.raises(KernelError, match="TARGET='gfx950' disagrees with the target this "
                                          "kernel is compiled for, 'sm_90a'"):
        compiler.lane_ir(kernel, "sm_90a", TARGET="gfx950", **consts)
    traced = kernel.specialize(TARGET="gfx950", **consts)     # traced for one, lowered for
    with pytest.raises(KernelError, match="traced for target 'gfx950'.*compiled for 'sm_90a'"):
        from pykittens.lower import lower                      # another
        lower(traced, "sm_90a")
