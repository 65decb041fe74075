"""The `pykittens` command: demo, compile (every stage), emulate, errors."""
import json
import textwrap

import pytest

from pykittens.cli import main

from conftest import needs_amd_llvm, needs_ptxas


def test_demo_quick_runs_every_section(capsys):
    assert main(["demo", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "no GPU here" in out and "all emulator checks passed" in out
    for name in ("scaled_add", "softmax", "layernorm", "gemm_basic"):
        for target in ("gfx942", "gfx950", "sm_90a"):
            assert any(line.startswith(name) and target in line and " ok " in line
                       for line in out.splitlines()), (name, target)
    assert "2. Code objects" in out and "Chiplet" in out
    comm = out[out.index("4. Tile-level communication"):]
    assert sum(line.startswith("all-gather + GEMM") and line.rstrip().endswith("ok")
               for line in comm.splitlines()) == 3
    assert "(the GEMM waits for nothing): reported: race on global tensor" in comm


@pytest.mark.parametrize("stage,needle", [("tile", "kernel softmax("), ("lane", "lane_program"),
                                          ("llvm", "define amdgpu_kernel void @softmax"),
                                          pytest.param("asm", "v_exp_f32",
                                                       marks=needs_amd_llvm)])
def test_compile_stages(stage, needle, capsys):
    assert main(["compile", "softmax", "--target", "gfx950", "--emit", stage]) == 0
    assert needle in capsys.readouterr().out


@needs_amd_llvm          # the report reads the disassembly
def test_compile_report_json(capsys):
    assert main(["compile", "gemm_basic", "--target", "gfx942", "--report", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    for key in ("vgpr", "agpr", "sgpr", "lds_bytes", "scratch_bytes",
                "occupancy_waves_per_simd", "loop_mfma", "loop_instructions"):
        assert key in rep
    assert rep["loop_mfma"] > 0 and rep["scratch_bytes"] == 0 and rep["lds_bytes"] == 8192


@needs_ptxas
def test_compile_report_json_hopper(capsys):
    assert main(["compile", "gemm_basic", "--target", "sm_90a", "--report", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["spill_bytes"] == 0 and rep["smem_bytes"] == 8192 and rep["registers"] > 0


def test_emulate_library_and_user_kernels(tmp_path, capsys):
    assert main(["emulate", "layernorm", "--target", "gfx942", "--dtype", "bf16",
                 "--shape", "9", "300"]) == 0
    assert "ok" in capsys.readouterr().out
    f = tmp_path / "mine.py"
    f.write_text(textwrap.dedent('''
        import numpy as np
        import pykittens as pk
        from pykittens.kernels import KernelSpec

        @pk.kernel
        def double(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
            pk.store(out, pk.load(pk.rt((4, 64), pk.f32), x, (0, 0)) * 2.0, (0, 0))

        SPEC = KernelSpec("double", double,
                          lambda s, d, rng: {"x": rng.standard_normal(s).astype(np.float32),
                                             "out": np.zeros(s, np.float32)},
                          lambda i: {"out": 2.0 * i["x"]},
                          lambda i, t: ((1,), {}), ("out",), shapes=((4, 64),))
    '''))
    assert main(["emulate", f"{f}:SPEC", "--target", "sm_90a", "--shape", "3", "50"]) == 0
    assert main(["compile", f"{f}:double", "--target", "sm_90a", "--emit", "llvm"]) == 0
    assert "ptx_kernel" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["emulate", f"{f}:double", "--target", "sm_90a"]) == 2
    assert "bare kernel" in capsys.readouterr().err


def test_cli_errors(capsys):
    assert main(["compile", "nope", "--target", "gfx942"]) == 2
    assert "unknown kernel 'nope'" in capsys.readouterr().err
    assert main(["compile", "softmax", "--target", "gfx999"]) == 2
    assert "invalid choice: 'gfx999'" in capsys.readouterr().err
    assert main(["compile", "softmax", "--target", "gfx942", "-D", "oops"]) == 2
    assert "-D takes NAME=VALUE" in capsys.readouterr().err
    assert main(["compile", "softmax", "--target", "gfx942", "-D", "NOPE=1"]) == 1
    assert "unknown compile-time constant" in capsys.readouterr().err
