"""attention_fwd's CDNA schedule (pykittens/kernels/attention_cdna.py) and its packed
variable-length form: every variant on gfx942 and gfx950 in the lane emulator against a
float64 numpy reference, a few from the code objects on the ISA emulator, and static checks
of the code objects (no scratch, MFMAs and the ping-pong's priorities and barriers in the
executed main loop, no wait-state hazards). Expected values come from numpy, never from the
kernel's own helpers."""
import math

import ml_dtypes
import numpy as np
import pytest

import pykittens as pk
from pykittens import chiplet, compiler, isa
from pykittens.analysis import hsaco
from pykittens.kernels.attention import (attention_fwd, attention_fwd_launch,
                                         attention_fwd_varlen, attention_fwd_varlen_launch)
from pykittens.kernels.attention_cdna import BLOCK_KEYS, cdna_grid
from pykittens.toolchain import amdgpu
from conftest import rel_err

CDNA = ("gfx942", "gfx950")
DT = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
TOL = 1e-2                           # 16-bit P and V, f32 accumulation (the library's bf16 tolerance)


# ---- the reference ---------------------------------------------------------------------------

def reference(q, k, v, scale, causal):
    """float64 attention over (..., H, N, D) arrays, K/V heads repeated for GQA; causal
    masks bottom-right aligned (query i sees keys <= i + Nk - Nq); rows that see no key
    give O = 0 and LSE = -inf. Returns O and the natural-log LSE."""
    hq, nq = q.shape[-3], q.shape[-2]
    hkv, nk = k.shape[-3], k.shape[-2]
    qd, kd, vd = (x.astype(np.float64) for x in (q, k, v))
    kd, vd = (np.repeat(x, hq // hkv, axis=-3) for x in (kd, vd))
    s = qd @ np.swapaxes(kd, -1, -2) * scale
    keep = np.ones((nq, nk), bool)
    if causal:
        keep = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
    s = np.where(keep, s, -np.inf)
    seen = keep.any(1)[:, None]
    mx = np.where(seen, s.max(-1, keepdims=True, initial=-np.inf), 0.0)
    e = np.exp(s - mx)
    total = e.sum(-1, keepdims=True)
    o = np.where(seen, e / np.where(seen, total, 1.0), 0.0) @ vd
    lse = np.where(seen, mx + np.log(np.where(seen, total, 1.0)), -np.inf)[..., 0]
    return o, lse


def check(o, lse, want_o, want_lse):
    assert rel_err(o, want_o) < TOL
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse)), "rows with no key"
    fin = np.isfinite(want_lse)
    assert np.max(np.abs(lse[fin] - want_lse[fin]), initial=0.0) < 1e-3
    if not fin.all():
        assert np.all(o[..., ~fin, :] == 0)


def dense_inputs(rng, b, hq, hkv, nq, nk, d, dt):
    """q, k, v as (B, H, N, D) views of (B, N, H, D) arrays (strided, last stride 1), and
    outputs poisoned with NaN so that unwritten elements fail."""
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(DT[dt]).swapaxes(1, 2)
               for n, h in ((nq, hq), (nk, hkv), (nk, hkv)))
    return q, k, v, np.full((b, hq, nq, d), np.nan, DT[dt]), np.full((b, hq, nq), np.nan,
                                                                     np.float32)


def run_dense(target, b, hq, hkv, nq, nk, d, causal, dt, rng, isa_run=False, **over):
    q, k, v, o, lse = dense_inputs(rng, b, hq, hkv, nq, nk, d, dt)
    grid, consts = attention_fwd_launch({"q": q, "k": k, "v": v}, target, CAUSAL=causal,
                                        **over)
    scale = 1 / math.sqrt(d)
    got = pk.emulate(attention_fwd, q, k, v, o, lse, scale, grid=grid, target=target,
                     isa=isa_run, **consts)
    want_o, want_lse = reference(q, k, v, scale, causal)
    check(got["o"].astype(np.float64), got["lse"], want_o, want_lse)
    return consts


# ---- lane emulator: every variant on both chips ---------------------------------------------

# (B, Hq, Hkv, Nq, Nk): GQA 2:1, ragged Nq != Nk both ways; the causal cases with Nq > Nk
# have rows that see no key
SMALL = {64: (1, 4, 2, 40, 70), 128: (1, 2, 1, 70, 40)}


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_attention_matches_float64(target, d, causal, dt, rng):
    run_dense(target, *SMALL[d], d, causal, dt, rng)


@pytest.mark.parametrize("target", CDNA)
@pytest.mark.parametrize("shape", [(2, 2, 2, 300, 100, 64, 1),     # 2 query blocks, MHA
                                   (1, 3, 1, 33, 300, 128, 0),     # MQA, 10 key blocks
                                   (1, 2, 1, 1, 1, 64, 1)])        # one query, one key
def test_attention_longer_and_degenerate_shapes(target, shape, rng):
    *s, d, causal = shape
    run_dense(target, *s, d, causal, "bf16", rng)


def varlen_inputs(rng, lq, lk, hq, hkv, d, dt):
    """Packed (total, H, D) tensors passed as (H, total, D) views, and the offsets."""
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = rng.standard_normal((cq[-1], hq, d)).astype(DT[dt]).swapaxes(0, 1)
    k, v = (rng.standard_normal((ck[-1], hkv, d)).astype(DT[dt]).swapaxes(0, 1)
            for _ in range(2))
    o = np.full((hq, cq[-1], d), np.nan, DT[dt])
    return q, k, v, o, np.full((hq, cq[-1]), np.nan, np.float32), cq, ck


def run_varlen(target, lq, lk, hq, hkv, d, causal, dt, rng, isa_run=False, **over):
    q, k, v, o, lse, cq, ck = varlen_inputs(rng, lq, lk, hq, hkv, d, dt)
    i = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    grid, consts = attention_fwd_varlen_launch(i, target, CAUSAL=causal, **over)
    scale = 1 / math.sqrt(d)
    got = pk.emulate(attention_fwd_varlen, q, k, v, o, lse, cq, ck, scale, grid=grid,
                     target=target, isa=isa_run, **consts)
    for b in range(len(lq)):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        want_o, want_lse = reference(q[:, qs:qe], k[:, ks:ke], v[:, ks:ke], scale, causal)
        check(got["o"][:, qs:qe].astype(np.float64), got["lse"][:, qs:qe], want_o, want_lse)


# sequence lengths: an empty query sequence, one without keys, longer and shorter keys
LQ, LK = [40, 0, 9, 77], [70, 30, 5, 0]


@pytest.mark.parametrize("causal,dt", [(0, "bf16"), (1, "f16")])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_varlen_matches_float64_per_sequence(target, d, causal, dt, rng):
    run_varlen(target, LQ, LK, 4, 2, d, causal, dt, rng)


def test_varlen_sequences_longer_than_a_block(rng):
    run_varlen("gfx950", [300, 20], [90, 260], 2, 1, 64, 1, "bf16", rng)


# ---- the code objects on the ISA emulator ---------------------------------------------------

@pytest.mark.parametrize("target", CDNA)
def test_code_objects_compute_attention(target, rng):
    run_dense(target, 1, 2, 1, 40, 70, 64, 1, "bf16", rng, isa_run=True)
    run_varlen(target, [20, 7], [35, 0], 2, 2, 128, 0, "f16", rng, isa_run=True)


@pytest.mark.parametrize("target", CDNA)
def test_pinned_output_accumulator_on_the_isa_emulator(target, rng):
    """PIN='a0': O^T lives in a0.. for the whole kernel (its MFMAs inline asm on the pinned
    range, its rescale word by word through v_accvgpr_read/write)."""
    run_dense(target, 1, 2, 1, 40, 70, 128, 1, "bf16", rng, isa_run=True, PIN="a0")


# ---- static checks of the code objects ------------------------------------------------------

def build(kernel, target, **consts):
    """(report, main-loop instructions, assembly) of one compiled kernel."""
    obj = compiler.code_object(kernel, target, **consts)
    rep = compiler.report(kernel, target, **consts)
    insts, labels = hsaco.instructions(amdgpu.disassemble(obj, target), rep["kernel"])
    return rep, hsaco.main_loop(insts, labels).instructions(insts), \
        compiler.assembly(kernel, target, **consts)


def launch_consts(target, d, causal, **over):
    shape = np.zeros((1, 1, 1, d))
    return attention_fwd_launch({"q": shape, "k": shape, "v": shape}, target, CAUSAL=causal,
                                **over)[1]


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_code_object_static_checks(target, d, causal):
    consts = launch_consts(target, d, causal, DT="bf16")
    rep, body, asm = build(attention_fwd, target, **consts)
    assert rep["scratch_bytes"] == 0 and (rep["vgpr_spill"], rep["sgpr_spill"]) == (0, 0), rep
    assert rep["unified_vgpr"] <= 256 and rep["occupancy_waves_per_simd"] == 2, rep
    bn = BLOCK_KEYS[target, d]
    assert rep["lds_bytes"] == 4 * bn * d * 2                  # K and V, two stages each
    # per block: S^T = K Q^T and O^T += V^T P^T, all in the executed loop
    per = {"gfx942": 8, "gfx950": 16}[target]                  # K of one bf16 MFMA
    want = bn // 32 * (d // per) + d // 32 * (bn // per)       # S^T = K Q^T, O^T += V^T P^T
    assert rep["loop_mfma"] == rep["loop_executed"]["mfma"] == want, rep
    dma = [a for o, a in body if o.startswith("buffer_load") and a.endswith(" lds")]
    per_wave = bn * d * 2 // (8 * 64 * {"gfx942": 4, "gfx950": 16}[target])
    assert len(dma) == rep["loop_executed"]["vmem"] == 2 * per_wave      # K and V: DMA only
    ops = [op for op, _ in body]
    assert ops.count("s_barrier") == 4                          # four clusters a block
    first = ops.index("s_setprio")
    assert body[first][1] == "1" and [a for o, a in body if o == "s_setprio"] == ["1", "0"] * 2
    mfma_at = [i for i, o in enumerate(ops) if o.startswith("v_mfma")]
    prio = [i for i, o in enumerate(ops) if o == "s_setprio"]
    for i in mfma_at:                                           # every MFMA at raised priority
        assert any(prio[2 * c] < i < prio[2 * c + 1] for c in range(2)), body[i]
    assert isa.check_hazards(asm, target) == []


@pytest.mark.parametrize("target", CDNA)
def test_pinned_accumulator_code_object(target):
    """O^T pinned at a0: its D/2 AGPRs come out of the wave's 256 registers (the VGPRs LLVM
    may use are capped below them), and its MFMAs are inline asm on a[0:...]."""
    consts = launch_consts(target, 128, 1, DT="bf16", PIN="a0")
    rep, body, asm = build(attention_fwd, target, **consts)
    assert rep["agpr"] == 64 and rep["unified_vgpr"] <= 256, rep
    assert rep["occupancy_waves_per_simd"] == 2 and rep["scratch_bytes"] == 0, rep
    pinned = [a for o, a in body if o.startswith("v_mfma") and a.startswith("a[")]
    assert pinned and all(a.split(",")[0] == a.split(",")[-1].strip() for a in pinned)
    assert isa.check_hazards(asm, target) == []


# ---- grid order, launchers and errors -------------------------------------------------------

@pytest.mark.parametrize("batch,heads,q_blocks,group", [(2, 8, 3, 4), (1, 4, 5, 1), (4, 16, 8, 8)])
def test_grid_decode_is_the_chiplet_mapping(batch, heads, q_blocks, group):
    pid = np.arange(batch * heads * q_blocks)
    for name, mapping in (("head-first", chiplet.attention_head_first(batch, heads, q_blocks,
                                                                       group, 8)),
                          ("naive", chiplet.attention_naive(batch, heads, q_blocks))):
        got = cdna_grid(pid, batch, heads, q_blocks, group, 8, name)
        assert all(np.array_equal(a, b) for a, b in zip(got, mapping(pid)))
    b, h, _ = cdna_grid(pid, batch, heads, q_blocks, group, 8)
    if batch * heads * q_blocks % (8 * group * q_blocks) == 0:      # whole runs: one XCD each
        kv = b * (heads // group) + h // group
        assert all(len(set(pid[kv == i] % 8)) == 1 for i in np.unique(kv))


def test_launch_picks_the_cdna_schedule():
    q = np.zeros((2, 8, 300, 128))
    k = np.zeros((2, 2, 500, 128))
    grid, consts = attention_fwd_launch({"q": q, "k": k, "v": k}, "gfx950", CAUSAL=1)
    assert grid == (2 * 8 * 2,)
    assert consts == {"D": 128, "CAUSAL": 1, "BN": 32, "MAP": "head-first", "PIN": "",
                      "num_waves": 8, "TARGET": "gfx950"}
    with pytest.raises(ValueError, match="not a multiple of 3 key/value heads"):
        attention_fwd_launch({"q": q, "k": k[:, :1].repeat(3, 1), "v": k[:, :1].repeat(3, 1)},
                             "gfx942")
    with pytest.raises(ValueError, match="grid mapping 'zigzag'"):
        attention_fwd_launch({"q": q, "k": k, "v": k}, "gfx942", MAP="zigzag")


def test_varlen_launch_and_hopper():
    q = np.zeros((4, 50, 64))
    k = np.zeros((2, 80, 64))
    i = {"q": q, "k": k, "v": k, "cu_seqlens_q": np.array([0, 10, 50], np.int32),
         "cu_seqlens_k": np.array([0, 60, 80], np.int32)}
    grid, consts = attention_fwd_varlen_launch(i, "gfx942")
    assert grid == (2 * 4 * 1,) and consts["BN"] == 32 and consts["D"] == 64
    with pytest.raises(ValueError, match="non-decreasing"):
        attention_fwd_varlen_launch({**i, "cu_seqlens_k": np.array([0, 90, 80], np.int32)},
                                    "gfx950")
    grid, consts = attention_fwd_varlen_launch(i, "sm_90a")   # 3 consumers of 64 rows
    assert grid == (1, 4, 2) and consts["WG"] == 3 and consts["TARGET"] == "sm_90a"
    with pytest.raises(pk.NotSupportedYet, match="attention_fwd_varlen has no schedule"):
        compiler.tile_ir(attention_fwd_varlen, DT="bf16", D=64, TARGET="sm_80")
