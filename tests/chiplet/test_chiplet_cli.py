"""`pykittens chiplet` through its hooks: add_parser(subparsers) and run(args)."""
from __future__ import annotations

import argparse
import json

import pytest

from pykittens.chiplet import cli


@pytest.fixture
def parser():
    p = argparse.ArgumentParser(prog="pykittens")
    cli.add_parser(p.add_subparsers(dest="command", required=True))
    return p


def run_json(parser, capsys, *argv):
    assert cli.run(parser.parse_args(["chiplet", *argv, "--json"])) == 0
    return json.loads(capsys.readouterr().out)


def test_gemm_json(parser, capsys):
    d = run_json(parser, capsys, "--op", "gemm", "--shape", "9216", "9216", "9216",
                 "--target", "gfx950", "--mapping", "xcd:W=5,C=25")
    assert {"l2_hit_rate", "llc_hit_rate", "hbm_bytes", "mapping"} <= set(d)
    assert d["mapping"] == "xcd:W=5,C=25"
    assert 0.65 <= d["l2_hit_rate"] <= 0.85 and d["llc_hit_rate"] > 0.85
    assert d["hbm_bytes"] == d["hbm_read_bytes"] + d["hbm_write_bytes"]
    assert d["hbm_write_bytes"] == 9216 * 9216 * 2
    assert d["grid"] == [36, 36] and d["workgroups"] == 1296 and d["resident"] == 256
    rm = run_json(parser, capsys, "--op", "gemm", "--shape", "9216", "9216", "9216",
                  "--mapping", "row-major")
    assert rm["l2_hit_rate"] < d["l2_hit_rate"] - 0.1


def test_attention_auto_json(parser, capsys):
    d = run_json(parser, capsys, "--op", "attention", "--shape", "2", "16", "2048", "128",
                 "--kv-heads", "4", "--mapping", "auto", "--tile", "128", "64")
    assert d["mapping"].startswith("head-first")
    assert d["grid"] == [2, 16, 16]
    names = [c["mapping"] for c in d["candidates"]]
    assert "naive" in names and d["mapping"] in names
    naive = next(c for c in d["candidates"] if c["mapping"] == "naive")
    assert d["l2_hit_rate"] >= naive["l2_hit_rate"]


def test_hopper_json_has_null_llc(parser, capsys):
    d = run_json(parser, capsys, "--op", "gemm", "--shape", "2048", "2048", "2048",
                 "--target", "sm_90a", "--mapping", "grouped:W=4")
    assert d["llc_hit_rate"] is None and d["target"] == "sm_90a"


def test_text_table_and_plot(parser, capsys, tmp_path):
    png = tmp_path / "tiles.png"
    args = parser.parse_args(["chiplet", "--op", "gemm", "--shape", "2048", "2048", "1024",
                              "--mapping", "auto", "--plot", str(png)])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "<- chosen" in out and "row-major" in out and "modeled" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("argv,msg", [
    (["--op", "gemm", "--shape", "64", "64"], "gemm shape must be M N K"),
    (["--op", "gemm", "--shape", "64", "64", "64", "--mapping", "zorder"],
     "unknown gemm mapping 'zorder'"),
    (["--op", "attention", "--shape", "1", "6", "64", "64", "--kv-heads", "4"],
     "must divide heads"),
    (["--op", "gemm", "--shape", "64", "64", "64", "--tile", "64", "64"],
     "--tile for gemm takes 3 sizes"),
    (["--op", "gemm", "--shape", "64", "64", "64", "--kv-heads", "2"], "attention only"),
])
def test_bad_input_exits_2_with_a_message(parser, capsys, argv, msg):
    assert cli.run(parser.parse_args(["chiplet", *argv])) == 2
    err = capsys.readouterr().err
    assert err.startswith("pykittens chiplet: error:") and msg in err


def test_demo_report(monkeypatch, tmp_path):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path))
    text = cli.demo_report()
    lines = text.splitlines()
    assert "gfx950" in lines[0]
    assert sum("gemm 9216^3" in line for line in lines) == 3
    assert any("head-first" in line for line in lines)
    assert "%" in text and "HipKittens" in text


@pytest.mark.parametrize("target", ["sm_90a", "gfx950"])
def test_auto_picks_what_the_library_picks(parser, capsys, target):
    """--mapping auto chooses as chiplet.auto_mapping (the library's kernels) does, also on
    Hopper, whose default machine for explicit mappings is the partitioned model."""
    from pykittens import chiplet
    d = run_json(parser, capsys, "--op", "gemm", "--shape", "8192", "8192", "8192",
                 "--target", target, "--mapping", "auto")
    op = chiplet.Gemm(8192, 8192, 8192)
    assert d["mapping"] == chiplet.auto_mapping(op, target=target, use_disk_cache=False).spec
