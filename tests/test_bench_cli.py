"""`pykittens bench`: without a GPU it says what it needs and exits 1; its reports (JSON,
Markdown, PNG) from results; the harness itself on CPU tensors with a stand-in timer (the
pykittens contenders run in the emulator)."""
import dataclasses
import json

import pytest

from pykittens.bench import ops as bench_ops
from pykittens.cli import main


def test_without_a_gpu_it_says_what_it_needs(capsys, monkeypatch):
    monkeypatch.setattr(bench_ops, "gpu_present", lambda: False)
    assert main(["bench", "rms_norm", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a GPU that torch can use" in err
    assert main(["bench", "nope"]) == 2
    assert "unknown family nope; choose from layer_norm" in capsys.readouterr().err
    assert main(["bench", "--list"]) == 0
    assert capsys.readouterr().out.split() == list(bench_ops.FAMILY_NAMES)


def test_help_lists_the_families(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "FAMILY.json, FAMILY.md and" in out and "attention (default: all)" in out


def _results():
    R = bench_ops.Result
    return [R("rms_norm", (8192, 8192), "bf16", "fwd", "pykittens", 0.1, 2600.0, 1e-3,
              "cuda graph"),
            R("rms_norm", (8192, 8192), "bf16", "fwd", "torch", 0.2, 1300.0, 0.0, "cuda graph"),
            R("rms_norm", (8192, 8192), "bf16", "fwd", "quack", error="ImportError: no")]


def test_reports_from_results(tmp_path):
    paths = bench_ops.write_family("rms_norm", _results(), "GB/s", str(tmp_path),
                                   {"gpu": "H200", "torch": "2.x"})
    assert [p.rsplit(".", 1)[1] for p in paths] == ["json", "md", "png"]
    data = json.loads((tmp_path / "rms_norm.json").read_text())
    assert data["unit"] == "GB/s" and len(data["results"]) == 3
    md = (tmp_path / "rms_norm.md").read_text()
    assert "| dtype | shape | mode | pykittens (GB/s) | torch (GB/s) | quack (GB/s) | " \
           "pykittens / torch |" in md
    assert "| bf16 | 8192x8192 | fwd | 2.6e+03 (0.100 ms) | 1.3e+03 (0.200 ms) | error | " \
           "2.00x |" in md
    assert "quack bf16 8192x8192 fwd: ImportError: no" in md and "gpu: H200" in md
    assert (tmp_path / "rms_norm.png").read_bytes()[:4] == b"\x89PNG"


def test_harness_on_cpu_tensors(monkeypatch):
    """Families build their inputs and contenders; each result is checked against torch's
    and timed (here by a stand-in that calls the timed function once)."""
    monkeypatch.setattr(bench_ops, "DEVICE", "cpu")
    calls = []

    def fake_time(fn, reps):
        calls.append(fn())
        return 1e-3, "stand-in"
    monkeypatch.setattr(bench_ops, "_time", fake_time)
    fams = bench_ops._families()
    assert tuple(fams) == bench_ops.FAMILY_NAMES
    for name, shape in (("rms_norm", (4, 300)), ("linear", (40, 64, 48))):
        fam = fams[name]
        fam = dataclasses.replace(fam, quick=(shape,), contenders=lambda f=fam: {
            k: v for k, v in f.contenders().items() if k in ("pykittens", "torch",
                                                                "torch (cuBLAS)")})
        results = bench_ops.run_family(fam, ("bf16",), True, 1, None)
        assert len(results) == 4 and not [r.error for r in results if r.error]
        assert all(r.rel_err < 2e-2 for r in results if r.mode == "fwd")
        assert {r.timing for r in results} == {"stand-in"}
    assert len(calls) == 8


def test_readme_shows_the_help_as_it_is(capsys, monkeypatch):
    import os
    from conftest import ROOT
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    readme = open(os.path.join(ROOT, "README.md")).read()
    shown = readme.split("$ pykittens bench --help\n", 1)[1].split("```", 1)[0]
    assert shown == out
