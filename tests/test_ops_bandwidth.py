"""bench/ops_bandwidth.py (the H200 measurement of every op) without a GPU: its ops step on CPU
tensors at a small shape (pykittens in the emulator, a stand-in timer), the short table and the
Markdown and PNG reports; --prebuild building exactly the launches the ops make; and the run
saying what it needs without a GPU."""
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import bench_script  # noqa: E402

pytestmark = pytest.mark.usefixtures("module_cache")


@pytest.fixture
def ob(monkeypatch):
    mod = bench_script("ops_bandwidth")
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "SHAPES", ((5, 256),))             # ragged rows; 2 heads of 128
    monkeypatch.setattr(mod, "BLOCK", (24, 256))
    monkeypatch.setattr(mod, "_host_inputs", lambda: {n: (3, 256) for n in (
        "layer_norm", "rms_norm", "add_rms_norm", "softmax", "rope", "linear")})
    return mod


def test_ops_step_checks_times_and_reports(ob, tmp_path, monkeypatch):
    from pykittens.bench import ops as bench_ops
    from pykittens.ops import run as ops_run
    monkeypatch.setattr(ops_run, "EMULATE_TARGET", "sm_90a")
    calls = []

    def stand_in(fn, reps):                 # forward 1 ms, forward+backward 3 ms
        fn()
        calls.append(1)
        return (1e-3 if len(calls) % 2 else 3e-3), "stand-in"
    monkeypatch.setattr(bench_ops, "_time", stand_in)
    # every launch the ops make at this shape, as the prebuild keys them
    launched = set()
    for name in ("matmul", "norms", "rope", "softmax"):
        mod = sys.modules[f"pykittens.ops.{name}"]

        def recording(kernel, args, grid, consts, outputs=(), run=mod.run):
            launched.add(ob.launch_key(kernel, args, consts)[0])
            return run(kernel, args, grid, consts, outputs)
        monkeypatch.setattr(mod, "run", recording)
    ob._state["copy"] = 2e12
    rows, details = [], []
    ob.step_ops(rows, details)
    results = ob._state["results"]
    assert {r["op"] for r in results} == {"layer_norm", "rms_norm", "add_rms_norm", "softmax",
                                         "rope", "linear"}
    assert not [r for r in results if "error" in r], results
    assert all(r["rel_err"] < ob.TOL for r in results)
    r = next(r for r in results if r["op"] == "rms_norm" and r["contender"] == "pykittens")
    assert (r["fwd_s"], r["bwd_s"]) == (1e-3, 2e-3)
    assert r["fwd_bytes_per_s"] == 2 * 5 * 256 * 2 / 1e-3 and r["fwd_of_copy"] == \
        r["fwd_bytes_per_s"] / 2e12
    assert "fwd_tflops" in next(r for r in results if r["op"] == "linear")
    table = [row for row in rows if row[0] == "rms_norm"]
    assert [row[1] for row in table] == ["fwd % of copy", "bwd % of copy"]
    assert not any(str(row[-1]).endswith("FAIL") for row in rows)
    monkeypatch.setenv("OUT", str(tmp_path))
    ob.step_report(rows, details)
    md = (tmp_path / "ops_bandwidth.md").read_text()
    assert "| rms_norm | 5x256 | pykittens | 1.000 |" in md and "% of copy" in md
    assert (tmp_path / "ops_bandwidth.png").read_bytes()[:4] == b"\x89PNG"

    # the prebuild builds every one of those launches (and the host and graph steps')
    built = ob.prebuild_all(verbose=False)
    assert launched and launched <= set(built)
    assert {k[0] for k in built} >= {"layernorm", "layernorm_bwd", "column_sum", "rmsnorm",
                                     "rmsnorm_bwd", "add_rmsnorm", "softmax", "softmax_bwd",
                                     "rope", "gemm_ws"}


def test_without_a_gpu_it_says_what_it_needs(ob, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["ops_bandwidth.py"])
    assert ob.main() == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
