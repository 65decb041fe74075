"""The performance model (`pykittens model`, analysis/model.py): the CLI and its JSON, and
invariants that a wrong reading of the code objects or a wrong constant would break."""
import json
import re

import pytest

from pykittens.analysis.model import matrix_peak_flops, model as _model
from pykittens.cli import library_plan, main
from pykittens.targets import get as get_target

from conftest import needs_amd_llvm, needs_sass

pytestmark = pytest.mark.usefixtures("module_cache")

KEYS = ("modeled_tflops", "bound", "cycles", "time_s", "assumptions", "constants")


def model(*args, **kw):
    return _model(*args, plan=library_plan, **kw)


@pytest.fixture(scope="module")
def cdna():
    """The CDNA models the tests share (each compiles once)."""
    return {(t, d): model("gemm_pingpong", t, (8192, 8192, 8192), d)
            for t, d in (("gfx950", "bf16"), ("gfx950", "e4m3"), ("gfx942", "bf16"))}


@needs_amd_llvm
def test_cli_json_has_the_keys(capsys):
    assert main(["model", "gemm_pingpong", "--target", "gfx950", "--shape", "4096", "4096",
                 "4096", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for key in KEYS:
        assert key in res
    assert set(res["cycles"]) >= {"matrix", "issue", "lds", "dram"}
    assert res["bound"] in res["cycles"]
    for name, (value, source) in res["constants"].items():
        assert value > 0 and source, name          # every constant says where it is from


@needs_amd_llvm
def test_cli_table(capsys):
    assert main(["model", "gemm_pingpong", "--target", "gfx942", "--shape", "512", "512",
                 "1024"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"modeled \d+ TFLOP/s", out) and "<- bound" in out and "assumptions" in out


@pytest.mark.parametrize("argv,needle", [
    (["model", "scaled_add", "--target", "gfx950", "--shape", "1", "2", "3"],
     "no performance model"),
    (["model", "gemm_sk", "--target", "sm_90a", "--shape", "128", "4096", "14336"],
     "gemm_sk is not: its consumers wait for the ring's copies"),
    (["model", "softmax", "--target", "gfx950", "--shape", "64", "64"], "pick --target sm_90a"),
    (["model", "softmax", "--target", "sm_90a", "--shape", "64", "64", "64"],
     "takes --shape ROWS COLS"),
    (["model", "attention_fwd", "--target", "sm_90a", "--shape", "1", "2", "128"],
     "takes --shape B Hq Hkv N D"),
    (["model", "rmsnorm", "--target", "sm_90a", "--shape", "64", "64", "--chip", "H100"],
     "pick --chip H200"),
    (["model", "gemm_ws", "--target", "gfx950", "--shape", "64", "64", "64"], "pick --target sm_90a"),
    (["model", "gemm_pingpong", "--target", "sm_90a", "--shape", "64", "64", "64"],
     "pick --target gfx942"),
])
def test_cli_errors_name_the_fix(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_model_without_a_plan_says_what_to_pass():
    with pytest.raises(ValueError, match="library_plan"):
        _model("gemm_ws", "sm_90a", (128, 128, 128))


@needs_amd_llvm
def test_never_above_the_matrix_peak(cdna):
    for (t, d), res in cdna.items():
        peak = matrix_peak_flops(t, d) / 1e12
        assert 0 < res["modeled_tflops"] <= peak * (1 + 1e-9), (t, d)
        assert res["matrix_peak_tflops"] == pytest.approx(peak)


@needs_amd_llvm
def test_fp8_doubles_the_matrix_rate_on_gfx950(cdna):
    bf16, fp8 = cdna["gfx950", "bf16"], cdna["gfx950", "e4m3"]
    assert fp8["matrix_flops_per_clk"] / bf16["matrix_flops_per_clk"] == pytest.approx(2, rel=0.05)
    # and the MI355X data sheet's dense peaks: 2.5 PFLOP/s bf16, 5.0 fp8
    assert matrix_peak_flops("gfx950", "e4m3") == pytest.approx(2 * matrix_peak_flops("gfx950"))


@needs_amd_llvm
def test_a_bigger_k_step_never_lowers_compute_cycles():
    small = model("gemm_pingpong", "gfx950", (2048, 2048, 2048), BK=16)
    big = model("gemm_pingpong", "gfx950", (2048, 2048, 2048), BK=32)
    assert big["cycles"]["matrix"] >= small["cycles"]["matrix"] > 0
    assert big["code_object"]["mfma_per_wave"] >= small["code_object"]["mfma_per_wave"]
    # the matrix core's rate does not depend on how the loop is cut
    assert big["matrix_flops_per_clk"] == pytest.approx(small["matrix_flops_per_clk"])


@needs_amd_llvm
def test_more_mfmas_never_lower_compute_cycles():
    """The cycle count over an executed path, with its MFMAs repeated."""
    from pykittens import targets
    from pykittens.analysis import model as m
    t = targets.get("gfx950")
    lp = library_plan("gemm_pingpong", "gfx950", 1024, 1024, 1024, "bf16", "bf16")
    rep, path = m._cdna_loop(lp.kernel, t, {**lp.consts, "DT": "bf16", "OUT": "bf16"})
    base, _, _ = m._cdna_cycles(t, rep, path, {})
    more, _, _ = m._cdna_cycles(t, rep, path + [p for p in path if p[0].startswith("v_mfma")], {})
    assert more["matrix"] == 2 * base["matrix"] and more["issue"] > base["issue"]


@needs_amd_llvm
def test_a_thin_long_product_is_memory_bound():
    """M = 64 (one row of 256-row blocks), N, K large: every byte of B read once for little
    work, so DRAM, not the matrix core, bounds it."""
    res = model("gemm_pingpong", "gfx950", (64, 65536, 8192))
    assert res["bound"] == "dram"
    assert res["cycles"]["dram"] > res["cycles"]["matrix"]


@needs_sass
def test_hopper_gemm_ws_reads_the_wgmma_loop():
    res = model("gemm_ws", "sm_90a", (4096, 4096, 4096))
    assert res["code_object"]["wgmma_shape"] == "64x256x16"
    assert res["modeled_tflops"] <= matrix_peak_flops("sm_90a") / 1e12
    assert model("gemm_ws", "sm_90a", (128, 65536, 8192))["bound"] == "dram"


@needs_sass
def test_h200_runs_at_its_measured_clock_under_load():
    """The H200's time comes from its measured clock under a tensor-bound load
    (load_clock_hz, cited); the H100, with none measured, keeps the peak clock: the same
    code object and cycles, times in the ratio of the clocks. Per-clock rates are the
    hardware's either way."""
    from pykittens.targets import get
    h200 = model("gemm_ws", "sm_90a", (4096, 4096, 4096), chip="H200")
    h100 = model("gemm_ws", "sm_90a", (4096, 4096, 4096), chip="H100")
    load, src = get("sm_90a").fact("load_clock_hz/H200")
    peak = get("sm_90a").fact("clock_hz/H200")[0]
    assert "measured" in src and load < peak
    assert h200["cycles"]["matrix"] == h100["cycles"]["matrix"]
    assert h200["time_s"] == pytest.approx(h100["time_s"] * peak / load, rel=0.02)
    assert "load_clock_hz/H200" in h200["constants"]
    assert "load_clock_hz/H200" not in h100["constants"]
    # the tensor cores' rate per clock: what back-to-back wgmma reach, measured (cited)
    rate, src = get("sm_90a").fact("wgmma_flops_per_clk/bf16")
    assert "measured" in src and rate < 4096
    flops = 2 * 64 * 256 * 16 * sum(h200["code_object"]["wgmma_per_loop"])
    assert h200["cycles"]["matrix"] == pytest.approx(flops / rate, rel=1e-3)


@needs_amd_llvm
def test_deterministic(cdna):
    again = model("gemm_pingpong", "gfx950", (8192, 8192, 8192), "bf16")
    assert json.dumps(again, sort_keys=True, default=str) == \
        json.dumps(cdna["gfx950", "bf16"], sort_keys=True, default=str)


@needs_sass
def test_attention_reads_the_consumers_loops_interior_path():
    """attention_fwd (D = 128): two consumer warpgroups' loops, each an interior iteration of
    16 wgmma 64x128x16 (Q K^T and P V over a 128-key block) and 64 exponentials a thread
    (64 rows x 128 keys over 128 threads), on the loop's shortest path: the masked block's
    and O's rescale's instructions left out."""
    res = model("attention_fwd", "sm_90a", (4, 16, 16, 4096, 128))
    co = res["code_object"]
    assert co["wgmma_loops"] == 2 and co["wgmma_per_loop"] == [16, 16]
    assert co["wgmma_shape"] == "64x128x16"
    assert all(64 <= m <= 66 for m in co["mufu_per_loop"]), co
    # 32 results a warp instruction, 4 a clock on each sub-partition, two warps on each
    assert res["cycles"]["mufu"] == pytest.approx(sum(co["mufu_per_loop"]) * 8)
    assert res["modeled_tflops"] <= matrix_peak_flops("sm_90a") / 1e12
    # causal: about half the iterations of the busiest SM, FLOPs halved too
    causal = model("attention_fwd", "sm_90a", (4, 16, 16, 4096, 128), causal=True)
    assert causal["iterations_per_cu"] < 0.75 * res["iterations_per_cu"]
    assert causal["cycles"]["matrix"] == res["cycles"]["matrix"]


def test_shortest_cycle_leaves_out_the_optional_blocks():
    """Header 0 -> 1 -> (2: 10 instructions, optional) -> 3 -> back to 0: the interior path
    is 0, 1, 3."""
    from pykittens.analysis.model import _shortest_cycle
    blocks = [[0, 1], [2], list(range(3, 13)), [13, 14], [15]]
    succs = [[1], [2, 3], [3], [0, 4], []]
    assert _shortest_cycle(0, {0, 1, 2, 3}, blocks, succs) == [0, 1, 3]


def test_row_kernels_stream_their_bytes_at_the_measured_copy_rate():
    """A row kernel's modeled time is a copy kernel's of as many bytes on the H200: its
    measured fixed start and drain plus the bytes at the measured copy bandwidth (both
    cited); a norm's backward also writes its partial column sums, which column_sum reads
    back."""
    from pykittens.targets import get
    bw, src = get("sm_90a").fact("copy_bytes_per_s/H200")
    assert "measured" in src and 4e12 < bw < 4.8e12
    fixed, src = get("sm_90a").fact("kernel_fixed_s/H200")
    assert "measured" in src and 0 < fixed < 1e-5
    m, n = 4096, 12288
    fwd = model("rmsnorm", "sm_90a", (m, n))
    assert fwd["bound"] == "dram"
    assert fwd["time_s"] == pytest.approx(fixed + (2 * m * n * 2 + n * 2 + 4 * m) / bw)
    assert "kernel_fixed_s/H200" in fwd["constants"]
    bwd = model("rmsnorm_bwd", "sm_90a", (m, n))
    grid = library_plan("rmsnorm_bwd", "sm_90a", (m, n), "bf16").grid
    assert bwd["dram_bytes"] > 3 * m * n * 2 + 4 * n * grid[0] - 1
    assert model("add_rmsnorm_bwd", "sm_90a", (m, n))["dram_bytes"] == \
        bwd["dram_bytes"] + m * n * 2                       # ds, read and added


@pytest.mark.parametrize("walk", ["layernorm_bwd", "rmsnorm_bwd", "add_rmsnorm_bwd"])
def test_fused_norm_backward_is_its_walk_and_column_sum_in_one_launch(walk):
    """A fused backward (rows.FUSED_SUMS) moves the walk's bytes and column_sum's over its
    partial rows, with one launch's fixed start instead of two; it is modeled only where
    the ops can take it (the whole grid resident), and says what to model elsewhere."""
    fixed = get_target("sm_90a").fact("kernel_fixed_s/H200")[0]
    m, n = 4096, 12288
    apart = model(walk, "sm_90a", (m, n))
    sums = model("column_sum", "sm_90a", apart["partial_sums"])
    fused = model(walk + "_fused", "sm_90a", (m, n))
    assert fused["partial_sums"] == []
    assert fused["dram_bytes"] == apart["dram_bytes"] + sums["dram_bytes"]
    assert fused["time_s"] == pytest.approx(apart["time_s"] + sums["time_s"] - fixed)
    assert any("barrier" in a for a in fused["assumptions"])
    with pytest.raises(ValueError, match="whole grid is resident.*model those"):
        model(walk + "_fused", "sm_90a", (64, 256))


@needs_sass
def test_attention_backward_reads_its_five_products_and_the_interior_loop():
    """attention_bwd's main pass (D = 128): each consumer's iteration (a 64-row query block
    against its 64 keys) makes S^T, dP^T, dV, dK (64 x 64 x 128 each: 24 wgmma 64x64x16) and
    dQ (64 x 128 x 64: 8 of 64x128x16); causal launches give the masked blocks a loop of
    their own, and an interior iteration takes the unmasked one: the same cycles."""
    res = model("attention_bwd", "sm_90a", (4, 16, 16, 4096, 128))
    assert res["code_object"]["wgmma_loops"] == 2
    assert res["cycles"]["matrix"] == pytest.approx(
        2 * (24 * 2 * 64 * 64 * 16 + 8 * 2 * 64 * 128 * 16)
        / res["constants"]["wgmma_flops_per_clk/bf16"][0], rel=1e-3)
    causal = model("attention_bwd", "sm_90a", (4, 16, 16, 4096, 128), causal=True)
    assert causal["cycles"]["matrix"] == res["cycles"]["matrix"]
    assert causal["iterations_per_cu"] < 0.6 * res["iterations_per_cu"]


@needs_sass
def test_attention_backward_consumers_fence_and_hand_over_ds():
    """Each consumer of attention_bwd's main pass (D = 128) fences twice an iteration (dS
    stored for the other group, its dQ block for the writer) and waits once for the other
    group's dS; stepped with the measured fence, the waits bound the pass, above the
    tensor cores' time."""
    res = model("attention_bwd", "sm_90a", (4, 16, 16, 4096, 128))
    from pykittens.analysis.model import _hopper_loops
    from pykittens.targets import get
    lp = library_plan("attention_bwd", "sm_90a", (4, 16, 16, 4096, 128), "bf16")
    _, loops = _hopper_loops(lp.kernel, get("sm_90a"), {**lp.consts, "DT": "bf16"})
    for *_, events in loops:
        kinds = [e[0] for e in events]
        assert kinds.count("fence") == 2 and kinds.count("sync") == 1
    assert res["bound"] == "waits" and res["cycles"]["waits"] > 1.2 * res["cycles"]["matrix"]
    assert "async_fence_clk" in res["constants"]


def test_the_fence_benchmark_multiplies_and_stores():
    """bench/gpu_clock.py's fence_loop (what the fence's cost was measured with), in the
    emulator, in its fenced form: each workgroup's 64 rows of c are STEPS x (a @ b.T)."""
    import os
    import sys

    import ml_dtypes
    import numpy as np

    import pykittens as pk
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    from gpu_clock import fence_loop
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)
    c = np.zeros((128, 128), np.float32)
    out = pk.emulate(fence_loop, a, b, c, grid=2, STEPS=3, target="sm_90a")["c"]
    want = 3 * (a.astype(np.float64) @ b.astype(np.float64).T)
    assert np.allclose(out[:64], want, rtol=1e-5, atol=1e-3)
    assert np.allclose(out[64:], want, rtol=1e-5, atol=1e-3)


# ---- the consumers' waits (Hopper): their events read from SASS, then stepped through

def _sass(opcode, operands=""):
    from pykittens.analysis.cubin import Instr
    return Instr(0, "", opcode, operands)


def test_loop_events_split_at_groups_and_waits():
    """A group ends at the HGMMA marked gsb0 (two 64x128x16: one group of 2 x 2 x 64 x 128 x
    16 FLOPs); every instruction, the HGMMAs and waits too, takes an issue slot; MUFUs are
    counted apart."""
    from pykittens.analysis.model import _loop_events
    path = [_sass("WARPGROUP.ARRIVE"),
            _sass("HGMMA.64x128x16.F32.BF16", "R24, gdesc[UR8], RZ, !UPT"),
            _sass("HGMMA.64x128x16.F32.BF16", "R24, gdesc[UR12], R24, gsb0"),
            _sass("WARPGROUP.DEPBAR.LE", "gsb0, 0x1"),
            _sass("FADD", "R1, R2, R3"), _sass("MUFU.EX2", "R4, R4"),
            _sass("WARPGROUP.DEPBAR.LE", "gsb0, 0x0"),
            _sass("F2FP.BF16.F32.PACK_AB", "R5, R6, R7")]
    assert _loop_events(path) == [("alu", 3, 0), ("mma", 2 * 2 * 64 * 128 * 16),
                                  ("alu", 1, 0), ("wait", 1), ("alu", 3, 1), ("wait", 0),
                                  ("alu", 1, 0)]


def test_loop_events_mark_fences_and_hand_overs():
    """A MEMBAR (fence.proxy.async's) is a fence; an mbarrier the consumer arrives at and
    then waits on is a hand-over between consumers (numbered in the iteration), while a wait
    on a barrier it did not arrive at (a producer's copy) is not an event."""
    from pykittens.analysis.model import _loop_events
    path = [_sass("SYNCS.PHASECHK.TRANS64.TRYWAIT", "P1, [R9+URZ+0x20800], R0"),
            _sass("STSM.16.MT88.4", "[R153], R188"), _sass("MEMBAR.ALL.CTA"),
            _sass("FENCE.VIEW.ASYNC.S"), _sass("SYNCS.ARRIVE.TRANS64.A1T0", "RZ, [UR9], RZ"),
            _sass("SYNCS.PHASECHK.TRANS64.TRYWAIT", "P1, [UR9], R20"),
            _sass("STS.128", "[R7+UR8+0x29000], R152"), _sass("MEMBAR.ALL.CTA"),
            _sass("SYNCS.ARRIVE.TRANS64.A1T0", "RZ, [UR6], RZ"),
            _sass("SYNCS.ARRIVE.TRANS64.A1T0", "RZ, [UR4], RZ"),
            _sass("SYNCS.PHASECHK.TRANS64.TRYWAIT", "P1, [UR4], R21")]
    assert _loop_events(path) == [("alu", 3, 0), ("fence",), ("alu", 3, 0), ("sync", 0),
                                  ("alu", 2, 0), ("fence",), ("alu", 3, 0), ("sync", 1)]


RATE = 1000.0                       # FLOPs a clock: a group of F FLOPs takes F / 1000 clocks


def _wait_loop(product_clocks, instructions, mufu=0):
    return [("mma", product_clocks * RATE), ("wait", 0), ("alu", instructions, mufu)]


def test_one_consumer_does_in_turn_what_it_waits_for():
    """Alone, a consumer that waits for its product before its instructions takes their sum
    (1000 + 500); 100 MUFU instructions at 8 clocks each take 800 however few the other
    instructions; with two groups and `wait 1`, the 300 instructions after it run under the
    second group: 500 + 500 + 200."""
    from pykittens.analysis.model import _overlap_cycles
    assert _overlap_cycles([_wait_loop(1000, 500)], RATE, 1, 8, False) == \
        pytest.approx(1500, abs=4)
    assert _overlap_cycles([_wait_loop(1000, 10, 100)], RATE, 1, 8, False) == \
        pytest.approx(1800, abs=4)
    two = [("mma", 500 * RATE), ("alu", 10, 0), ("mma", 500 * RATE), ("wait", 1),
           ("alu", 300, 0), ("wait", 0), ("alu", 200, 0)]
    assert _overlap_cycles([two], RATE, 1, 8, False) == pytest.approx(1200, abs=4)


def test_a_waited_group_adds_its_latency_and_a_pipelined_one_does_not():
    """With a 60-clock latency, a consumer that waits for its one group before 500
    instructions takes 1000 + 60 + 500; with two groups and `wait 1`, the first group's
    latency passes under the second's products (500 + 500 + 60 + 200 where the 300
    instructions after `wait 1` run under the second group: 1260, not 1320)."""
    from pykittens.analysis.model import _overlap_cycles
    assert _overlap_cycles([_wait_loop(1000, 500)], RATE, 1, 8, False, latency=60) == \
        pytest.approx(1560, abs=4)
    two = [("mma", 500 * RATE), ("alu", 10, 0), ("mma", 500 * RATE), ("wait", 1),
           ("alu", 300, 0), ("wait", 0), ("alu", 200, 0)]
    assert _overlap_cycles([two], RATE, 1, 8, False, latency=60) == \
        pytest.approx(1260, abs=4)


def test_a_fence_completes_after_the_products_and_its_own_time():
    """A fence after `wait 1` holds the consumer until its group in flight is done (1000)
    and then 100 clocks; with nothing in flight only the 100 (the H200's fenced arrive,
    bench/gpu_clock.py --fence: it took the group's time with one in flight)."""
    from pykittens.analysis.model import _overlap_cycles
    fenced = [("mma", 1000 * RATE), ("wait", 1), ("alu", 10, 0), ("fence",), ("alu", 10, 0)]
    assert _overlap_cycles([fenced], RATE, 1, 8, False, fence=100) == \
        pytest.approx(1000 + 100 + 10, abs=4)
    waited = [("mma", 1000 * RATE), ("wait", 0), ("alu", 10, 0), ("fence",), ("alu", 10, 0)]
    assert _overlap_cycles([waited], RATE, 1, 8, False, fence=100) == \
        pytest.approx(1000 + 10 + 100 + 10, abs=4)
    assert _overlap_cycles([waited], RATE, 1, 8, False) == pytest.approx(1020, abs=4)


def test_a_hand_over_holds_each_consumer_until_all_arrive():
    """Two consumers started 500 clocks apart, each a 500-clock product (waited) and 400
    instructions: apart, each issues under the other's product (1000 an iteration: the
    tensor cores). With a hand-over after the product each waits for the other's, so they
    run in step: both products share the tensor cores (1000), then both consumers' 400
    instructions at half a slot each (800): 1800. Loops with differing numbers of
    hand-overs are stepped without them."""
    from pykittens.analysis.model import _overlap_cycles
    free = [("mma", 500 * RATE), ("wait", 0), ("alu", 400, 0)]
    synced = [("mma", 500 * RATE), ("wait", 0), ("sync", 0), ("alu", 400, 0)]
    assert _overlap_cycles([free] * 2, RATE, 1, 8, False, stagger=500) == \
        pytest.approx(1000, rel=0.01)
    assert _overlap_cycles([synced] * 2, RATE, 1, 8, False, stagger=500) == \
        pytest.approx(1800, rel=0.01)
    assert _overlap_cycles([synced, free], RATE, 1, 8, False, stagger=500) == \
        pytest.approx(1000, rel=0.01)


def test_two_consumers_in_step_or_apart():
    """Two such consumers started together share the tensor cores (both products done at
    2000) and then the issue slots (500 instructions each at half a slot: 1000): 3000 an
    iteration, and they stay in step. Started 750-1000 clocks apart, one issues under the
    other's product: the tensor cores' 2000. The waits' figure is the mean over starts,
    between the two."""
    from pykittens.analysis.model import PHASES, _overlap_cycles, _waits_cycles
    loops = [_wait_loop(1000, 500)] * 2
    assert _overlap_cycles(loops, RATE, 1, 8, False) == pytest.approx(3000, rel=0.01)
    for apart in (750, 1000):
        assert _overlap_cycles(loops, RATE, 1, 8, False, stagger=apart) == \
            pytest.approx(2000, rel=0.01)
    mean, per_phase = _waits_cycles(loops, RATE, 1, 8, False)
    assert len(per_phase) == PHASES and mean == pytest.approx(sum(per_phase) / PHASES)
    assert 2000 * 0.99 <= min(per_phase) and max(per_phase) <= 3000 * 1.01
    assert 2000 < mean < 3000


def test_pingpong_turns_keep_consumers_from_committing_together():
    """Groups A and B with 300 instructions between them, then the wait and 100 more. Two
    consumers started together without turns: both A's and both B's share the tensor cores
    (2000), then both 100s share the issue slots (200): 2200. With ping-pong's turns the
    second commits its A only after the first's B, and the products keep the tensor cores
    busy: 2000."""
    from pykittens.analysis.model import _overlap_cycles
    loop = [("mma", 500 * RATE), ("alu", 300, 0), ("mma", 500 * RATE), ("wait", 0),
            ("alu", 100, 0)]
    assert _overlap_cycles([loop] * 2, RATE, 1, 8, False) == pytest.approx(2200, rel=0.01)
    assert _overlap_cycles([loop] * 2, RATE, 1, 8, True) == pytest.approx(2000, rel=0.01)


@needs_sass
def test_attention_waits_for_its_products():
    """attention_fwd (D = 128): each consumer waits for Q K^T before its softmax and for P V
    before its exponentials, so two consumers in step leave the tensor cores idle while
    both compute (at least 1.3x the matrix cycles) and half an iteration apart keep them
    busy (the matrix cycles); the model is bound by the waits' mean over starts."""
    res = model("attention_fwd", "sm_90a", (4, 16, 16, 4096, 128))
    matrix, phases = res["cycles"]["matrix"], res["code_object"]["waits_cycles_per_phase"]
    assert phases[0] >= 1.3 * matrix
    assert min(phases) == pytest.approx(matrix, rel=0.01)
    assert res["bound"] == "waits"
    assert res["cycles"]["waits"] == pytest.approx(sum(phases) / len(phases), abs=1)


@needs_sass
def test_attention_backward_adds_dq_at_the_measured_reduce_rate():
    """With the atomic dQ schedule each iteration adds its 64-row query block's dQ over the
    workgroup's keys (64 x D f32) into L2 by the TMA unit, as every key block of the head
    does into the same rows (N / 128 of them): the SMs' bytes at the rate measured for that
    many workgroups a tile (the nearest measured), in cycles at the kernel's clock, shown
    beside the resources (docs/PERF.md run OA: not what bounds the pass)."""
    from pykittens.analysis.model import _nearest_share
    from pykittens.targets import get
    t = get("sm_90a")
    assert [_nearest_share(t, s) for s in (1, 2, 5, 12, 32, 60, 128, 1024)] == \
        [1, 1, 8, 8, 32, 32, 132, 132]
    for d, n, share in ((64, 4096, 32), (128, 4096, 32), (128, 16384, 132)):
        res = model("attention_bwd", "sm_90a", (1, 4, 4, n, d))
        rate, src = t.fact(f"tma_reduce_bytes_per_s/{share}")
        clock = res["constants"]["load_clock_hz/H200"][0]
        assert "measured" in src
        assert res["beside"]["reduce"] == pytest.approx(64 * d * 4 * 132 / rate * clock,
                                                        abs=0.1)
        assert "reduce" not in res["cycles"]          # beside the resources, not a bound
    lp = library_plan("attention_bwd", "sm_90a", (2, 4, 4, 2048, 128), "bf16")
    assert lp.reduce_bytes == 64 * 128 * 4 and lp.consts["DQ_ATOMIC"] == 1


def test_the_reduce_benchmark_adds_each_tile_once_per_step():
    """bench/gpu_clock.py's tma_reduce_loop (what the reduce rate was measured with), in the
    emulator: 4 workgroups, 2 a tile, 3 steps: every element of both tiles gets 2 x 3 ones,
    nothing else is written."""
    import os
    import sys

    import numpy as np

    import pykittens as pk
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    from gpu_clock import tma_reduce_loop
    c = np.zeros((3 * 64, 64), np.float32)
    out = pk.emulate(tma_reduce_loop, c, grid=4, SHARE=2, STEPS=3, target="sm_90a")["c"]
    assert (out[:128] == 6).all() and (out[128:] == 0).all()


def test_a_loop_without_its_own_groups_is_not_stepped():
    """A consumer loop whose wgmma groups are committed outside it has nothing to wait for
    in the loop: no waits figure (rather than a stall or an error)."""
    from pykittens.analysis.model import _waits_cycles
    assert _waits_cycles([[("alu", 10, 0), ("wait", 0)]] * 2, RATE, 1, 8, False) == (0.0, [])
