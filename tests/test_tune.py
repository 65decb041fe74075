"""pykittens.tune: the fastest candidate by a timing function, kept on disk per problem and
candidate list (timed once), failures skipped and named; gemm_ws's candidate constants."""
import json

import pytest

from pykittens import tune
from pykittens.toolchain import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path))
    return tmp_path


CANDS = [{"MAP": "row-major", "BN": 256}, {"MAP": "grouped:W=8", "BN": 256},
         {"MAP": "row-major", "BN": 128}]
TIMES = {0: 3.0, 1: 1.0, 2: 2.0}


def timer(calls):
    def measure(c):
        calls.append(c)
        return TIMES[CANDS.index(c)]
    return measure


def test_the_fastest_is_kept_and_timed_once(cache_dir):
    calls = []
    problem = {"m": 4096, "gpu": "NVIDIA H200"}
    assert tune.tune("gemm_ws", problem, CANDS, timer(calls)) == CANDS[1]
    assert calls == CANDS * 3                               # three interleaved rounds
    assert tune.tune("gemm_ws", problem, CANDS, timer(calls)) == CANDS[1]
    assert len(calls) == 9                                  # from disk: nothing timed
    entry = json.loads(next((cache_dir / tune.KIND).iterdir()).read_bytes()[44:])
    assert [t["seconds"] for t in entry["timings"]] == [3.0, 1.0, 2.0]


def test_candidates_are_ranked_by_their_median_over_interleaved_rounds(cache_dir):
    """A clock that slows as the run goes on: candidate 0, timed first in every round,
    wins one round by drift alone, but candidate 1 is faster in the median."""
    times = [0.97, 0.98, 2.0,    1.10, 1.01, 2.0,    1.20, 1.05, 2.0]
    rounds = iter(times)
    assert tune.tune("gemm_ws", {"m": 5}, CANDS, lambda c: next(rounds)) == CANDS[1]
    once = iter(times)                                      # one round: the drift decides
    assert tune.tune("gemm_ws", {"m": 7}, CANDS, lambda c: next(once), rounds=1) == CANDS[0]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        tune.tune("gemm_ws", {"m": 6}, CANDS, lambda c: 1.0, rounds=0)


def test_another_gpu_shape_or_candidate_list_tunes_again(cache_dir):
    calls = []
    tune.tune("gemm_ws", {"m": 4096, "gpu": "NVIDIA H200"}, CANDS, timer(calls))
    tune.tune("gemm_ws", {"m": 4096, "gpu": "NVIDIA H100"}, CANDS, timer(calls))
    tune.tune("gemm_ws", {"m": 8192, "gpu": "NVIDIA H200"}, CANDS, timer(calls))
    tune.tune("gemm_ws", {"m": 4096, "gpu": "NVIDIA H200"}, CANDS[1:], timer(calls))
    assert len(calls) == (3 * 3 + 2) * 3


def test_failures_are_skipped_and_named(cache_dir):
    def measure(c):
        if c["BN"] == 128:
            raise RuntimeError("out of shared memory")
        return TIMES[CANDS.index(c)]
    assert tune.tune("gemm_ws", {"m": 1}, CANDS, measure) == CANDS[1]

    def broken(c):
        raise RuntimeError(f"no {c['MAP']}")
    with pytest.raises(RuntimeError, match="every candidate failed.*no grouped:W=8"):
        tune.tune("gemm_ws", {"m": 2}, CANDS, broken)
    with pytest.raises(ValueError, match="no candidates"):
        tune.tune("gemm_ws", {"m": 3}, [], broken)


def test_a_hung_candidate_stops_the_tuning_and_is_named(cache_dir):
    """A kernel that never finishes leaves the GPU busy for good: no skipping it (every
    later candidate would wait behind it); the error names it, and nothing is stored."""
    t = [0.0]

    def clock():
        return t[0]

    def sleep(s):
        t[0] += s * 1000                        # the wait goes by fast
    tune.finish(iter([False, False, True]).__next__, 60, "work", clock, sleep)  # in time
    with pytest.raises(tune.KernelHang, match="the first call did not finish in 60 s"):
        tune.finish(lambda: False, 60, "the first call", clock, sleep)

    def measure(c):
        if c["BN"] == 128:
            raise tune.KernelHang("the first call did not finish in 60 s")
        return TIMES[CANDS.index(c)]
    with pytest.raises(tune.KernelHang, match=r"autotuning gemm_ws: candidate \{'MAP': "
                                              r"'row-major', 'BN': 128\}"):
        tune.tune("gemm_ws", {"m": 4}, CANDS, measure)
    assert tune.cached("gemm_ws", {"m": 4}, CANDS) is None


def test_a_corrupt_or_stale_entry_tunes_again(cache_dir):
    calls = []
    problem = {"m": 4096}
    tune.tune("gemm_ws", problem, CANDS, timer(calls))
    path = next((cache_dir / tune.KIND).iterdir())
    path.write_bytes(path.read_bytes()[:-3])                # truncated
    assert tune.tune("gemm_ws", problem, CANDS, timer(calls)) == CANDS[1]
    assert len(calls) == 18
    key = path.name                                          # an entry naming no candidate
    cache.store(tune.KIND, key, json.dumps({"best": {"MAP": "gone"}}).encode())
    assert tune.cached("gemm_ws", problem, CANDS) is None


def test_gemm_ws_candidates_start_with_the_launch_rule():
    from pykittens.chiplet import Gemm, parse_mapping
    from pykittens.kernels import Operand, gemm_ws_launch
    from pykittens.ops.matmul import gemm_ws_candidates
    m = n = k = 8192
    cands = gemm_ws_candidates("sm_90a", m, k, n, 2)
    i = {"a": Operand((m, k), 2), "b": Operand((n, k), 2), "c": Operand((m, n), 2)}
    assert cands[0] == gemm_ws_launch(i, "sm_90a")[1]
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands) >= 5
    for c in cands:                        # every order names a mapping of its block grid
        op = Gemm(c["TM"] * 128, c["TN"] * c["BN"], k, bm=128, bn=c["BN"], bk=64)
        assert parse_mapping(c["MAP"], op, "sm_90a").spec == c["MAP"]
    assert {c["BN"] for c in cands} == {128, 256}
    assert {c["PERSISTENT"] for c in cands} == {0, 1}
    (pingpong,) = [c for c in cands if c.get("PINGPONG")]       # C from registers
    assert pingpong["BN"] == 128 and not pingpong.get("TMA_STORE")
    fp8 = gemm_ws_candidates("sm_90a", m, k, n, 1)                 # promoting: no ping-pong
    assert not any(c.get("PINGPONG") for c in fp8)
    from pykittens.kernels import gemm_ws_grid
    per_tile = next(c for c in cands if not c["PERSISTENT"])
    assert gemm_ws_grid(per_tile, "sm_90a") == (per_tile["TM"] * per_tile["TN"],)
    assert gemm_ws_grid(cands[0], "sm_90a") == (132,)
    small = gemm_ws_candidates("sm_90a", 512, 2048, 4096, 2)       # too few 256-wide blocks
    assert small[0]["BN"] == 128 and any(c["BN"] == 256 for c in small)
    # 2048³: as many 256-wide blocks as fill a wave of 128-wide ones fill two
    assert gemm_ws_candidates("sm_90a", 2048, 2048, 2048, 2)[0]["BN"] == 256
    with pytest.raises(ValueError, match="128 or 256 wide"):
        gemm_ws_launch(i, "sm_90a", bn=64)
