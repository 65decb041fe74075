"""Mapping specs and auto-selection by simulation."""
from __future__ import annotations

import pytest

from pykittens import chiplet
from pykittens.chiplet import auto


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Keep the on-disk choice cache out of the user's cache directory."""
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path))
    auto._choose.cache_clear()
    return tmp_path


def test_specs_parse_and_round_trip():
    g = chiplet.Gemm(9216, 9216, 9216)
    for spec in ("row-major", "grouped:W=8", "xcd:W=5,C=25", "xcd:C=16"):
        m = chiplet.parse_mapping(spec, g, "gfx950")
        assert chiplet.parse_mapping(m.spec, g, "gfx950") == m
    assert chiplet.parse_mapping("xcd:C=16", g).spec == "xcd:W=1,C=16"
    a = chiplet.Attention(2, 8, 1024, 128, kv_heads=2)
    for spec in ("naive", "head-first", "head-first:C=8"):
        assert chiplet.parse_mapping(spec, a).spec == spec


@pytest.mark.parametrize("spec,op,msg", [
    ("zigzag", chiplet.Gemm(64, 64, 64), "unknown gemm mapping 'zigzag'; choose one of row-major"),
    ("head-first", chiplet.Gemm(64, 64, 64), "unknown gemm mapping"),
    ("row-major", chiplet.Attention(1, 2, 64, 64), "unknown attention mapping .* naive"),
    ("xcd:W=5", chiplet.Gemm(64, 64, 64), "xcd needs the chunk C"),
    ("xcd:W=0,C=4", chiplet.Gemm(64, 64, 64), "e.g. 'xcd:W=5,C=25'"),
    ("xcd:W=5,Q=4", chiplet.Gemm(64, 64, 64), "W=<positive int>, C=<positive int>"),
    ("grouped", chiplet.Gemm(64, 64, 64), "grouped needs W"),
    ("auto:W=3", chiplet.Gemm(64, 64, 64), "'auto' takes no parameters"),
])
def test_bad_specs_say_what_is_accepted(spec, op, msg):
    with pytest.raises(ValueError, match=msg):
        chiplet.parse_mapping(spec, op, "gfx950")


def test_make_op_checks_shapes():
    assert chiplet.make_op("gemm", (1, 2, 3)) == chiplet.Gemm(1, 2, 3)
    with pytest.raises(ValueError, match="gemm shape must be M N K"):
        chiplet.make_op("gemm", (1, 2))
    with pytest.raises(ValueError, match="attention shape must be B H N D"):
        chiplet.make_op("attention", (1, 2, 3))
    with pytest.raises(ValueError, match="choose 'gemm' or 'attention'"):
        chiplet.make_op("conv", (1, 2, 3))


def test_auto_picks_a_chiplet_aware_gemm_order_and_caches_it(private_cache, monkeypatch):
    runs = []
    real = auto.simulate
    monkeypatch.setattr(auto, "simulate", lambda *a, **k: runs.append(1) or real(*a, **k))
    m = chiplet.auto_mapping("gemm", (9216, 9216, 9216), "gfx950")
    simulated = len(runs)
    assert simulated > 1
    assert m.name == "xcd" and dict(m.params)["W"] > 1
    op = chiplet.Gemm(9216, 9216, 9216)
    pick = chiplet.simulate(op, m, "gfx950")
    plain = chiplet.simulate(op, chiplet.gemm_row_major(*op.grid), "gfx950")
    assert pick.l2_hit_rate > plain.l2_hit_rate + 0.1
    assert pick.hbm_bytes <= plain.hbm_bytes * (1 + auto.HBM_TOLERANCE)
    simulated = len(runs)
    # memoized in memory, and on disk for the next process: no simulation again
    assert chiplet.auto_mapping(op, target="gfx950") == m
    assert list((private_cache / "chiplet").iterdir())
    auto._choose.cache_clear()
    assert chiplet.auto_mapping(op, target="gfx950") == m
    assert len(runs) == simulated


def test_best_prefers_hbm_then_l2():
    mk = lambda name, l2, hbm: chiplet.SimResult("op", name, "t", l2, 0.5, hbm, hbm, 0, 1, 1, ())
    rs = [mk("a", 0.5, 100), mk("greedy", 0.9, 200), mk("b", 0.7, 100.5), mk("c", 0.7, 100)]
    assert rs[auto.best(rs)].mapping == "b"      # within 1% of least HBM, most L2; first of ties


def test_auto_on_hopper_and_for_attention():
    m = chiplet.auto_mapping("gemm", (4096, 4096, 4096), "sm_90a", bm=128, bn=256,
                             use_disk_cache=False)
    assert m.name in ("grouped", "row-major")
    mha = chiplet.auto_mapping("attention", (2, 16, 4096, 128), "gfx950", use_disk_cache=False)
    assert mha.name == "head-first"
    assert all(c.name != "head-first" for c in
               chiplet.candidates(chiplet.Attention(2, 16, 4096, 128), "sm_90a"))
