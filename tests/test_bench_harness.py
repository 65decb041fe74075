"""The GPU scripts' harness (pykittens.bench.run_steps), which needs no GPU itself: steps
chosen on the command line, a failing step reported as a row while the others run, JSON
under $OUT, the exit status."""
import json
import re

from pykittens.bench import run_steps


def test_run_steps_reports_failures_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))

    def good(rows, details):
        rows.append(["good", "x", "ok"])
        details.append({"check": "good"})

    def bad(rows, details):
        raise RuntimeError("no GPU kernel here")

    assert run_steps("demo", {"good": good}, {"gpu": "none"}, argv=[]) == 0
    assert json.loads((tmp_path / "demo.json").read_text())["results"] == [{"check": "good"}]
    assert run_steps("demo", {"good": good, "bad": bad}, {}, argv=[]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^bad +ERROR .*no GPU kernel here", out, re.M)
    assert run_steps("demo", {"good": good, "bad": bad}, {}, argv=["good"]) == 0
