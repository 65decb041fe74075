"""The attention backward's CDNA schedule (pykittens/kernels/attention_bwd_cdna.py): every
variant on gfx942 and gfx950 in the lane emulator against float64 gradients written out
from the math (tests/test_attention_bwd.py's reference_grads, itself checked against torch's
float64 autograd), the code objects on the ISA emulator, static checks of the code objects
(no scratch or spills in any pass or element type, the products and their priorities and
barriers in the executed loops, pinned accumulators, no wait-state hazards), the launcher,
pykittens.ops.attention's backward on CPU tensors emulated for a CDNA chip, and the notes'
HipKittens figures cited as theirs. O and LSE come from a float64 forward here, so each case
runs only the backward."""
import math

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, isa
from pykittens.analysis import hsaco
from pykittens.kernels.attention_bwd import (attention_bwd, attention_bwd_dq,
                                             attention_bwd_launch, attention_bwd_prep)
from pykittens.kernels.attention_bwd_cdna import BLOCK_KEYS, DQ_ROWS, WAVES
from pykittens.toolchain import amdgpu
from test_attention_bwd import DT, check, inputs, reference_grads

CDNA = ("gfx942", "gfx950")


def forward64(q, k, v, scale, causal):
    """O (in the inputs' dtype, as the forward kernel leaves it) and the natural-log LSE
    (-inf for rows that see no key) from float64."""
    g = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(x.astype(np.float64), g, 1) for x in (k, v))
    s = q.astype(np.float64) @ kk.swapaxes(-1, -2) * scale
    nq, nk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(nk) <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    seen = total > 0
    o = np.where(seen, e / np.where(seen, total, 1), 0) @ vv
    lse = np.where(seen, np.where(np.isfinite(m), m, 0) + np.log(np.where(seen, total, 1)),
                   -np.inf)[..., 0]
    return o.astype(q.dtype), lse.astype(np.float32)


def bhnd_view(x):
    """x as a (B, H, N, D) view of a (B, N, H, D) array, as ops.attention passes tensors."""
    return np.ascontiguousarray(x.swapaxes(1, 2)).swapaxes(1, 2)


def backward(target, q, k, v, do, causal, isa_run=False):
    """The three passes as ops.attention runs them, the main and dQ passes on `target`
    (the ISA emulator with isa_run), on (B, H, N, D) views; returns (dq, dk, dv) and the
    float64 gradients."""
    q, k, v, do = (bhnd_view(x) for x in (q, k, v, do))
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = forward64(q, k, v, scale, causal)
    (pg, pc), (mg, mc), (dg, dc) = attention_bwd_launch({"q": q, "k": k}, target,
                                                        CAUSAL=causal)
    delta = pk.emulate(attention_bwd_prep, o, do, np.zeros(q.shape[:3], np.float32),
                       grid=pg, target=target, **pc)["delta"]
    nan = lambda x: np.full(x.shape, np.nan, x.dtype)  # noqa: E731  (unwritten: fails)
    out = pk.emulate(attention_bwd, q, k, v, do, lse, delta, np.zeros((1, 1, 1, 16), np.float32),
                     nan(k), nan(v), scale, grid=mg, target=target, isa=isa_run, **mc)
    dq = pk.emulate(attention_bwd_dq, q, k, v, do, lse, delta, nan(q), scale, grid=dg,
                    target=target, isa=isa_run, **dc)["dq"]
    return (dq, out["dk"], out["dv"]), reference_grads(q, k, v, do, scale, causal)


# (B, Hq, Hkv, Nq, Nk): ragged lengths, Nq < Nk and Nq > Nk (causal: rows 0..Nq-Nk-1 of
# the second see no key); two key blocks of 128 and two query blocks of the dQ pass
SHAPES = {"mha": (1, 2, 2, 70, 150), "gqa": (1, 4, 1, 140, 100)}


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_gradients_match_float64(target, d, causal, heads, dt, rng):
    got, want = backward(target, *inputs(rng, *SHAPES[heads], d, dt), causal)
    check(got, want)


def autograd64(q, k, v, do, scale, causal):
    """dQ, dK, dV by torch's autograd of the float64 forward (B, H, N, D): K/V heads
    repeated over their group (autograd sums the copies' gradients), rows that see no key
    with P = 0 (the shift by the row max is detached: softmax does not depend on it)."""
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale
    nq, nk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + nk - nq,
                          -math.inf)
    m = s.detach().amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    o = p @ v.repeat_interleave(g, 1)
    (o * torch.tensor(do.astype(np.float64))).sum().backward()
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


@pytest.mark.parametrize("shape", [*SHAPES.values(), (1, 4, 1, 120, 40), (1, 4, 1, 270, 300)],
                         ids=[*SHAPES, "no-key-rows", "long-walk"])
@pytest.mark.parametrize("causal", [0, 1])
def test_reference_is_float64_autograd(shape, causal, rng):
    """The gradients the kernels are checked against (written out from the math) are those
    of torch's float64 autograd, for every shape and mask above: GQA group sums, ragged
    lengths, causal rows that see no key."""
    q, k, v, do = inputs(rng, *shape, 64)
    scale = 1 / 8
    for want, got in zip(autograd64(q, k, v, do, scale, causal),
                         reference_grads(q, k, v, do, scale, causal)):
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_rows_that_see_no_key_get_zero_gradients(rng):
    """Causal with Nq > Nk: the first Nq - Nk queries see no key (LSE = -inf); their dQ is
    exactly 0 and they add nothing to dK and dV."""
    q, k, v, do = inputs(rng, 1, 2, 1, 120, 40, 64)
    (dq, dk, dv), want = backward("gfx950", q, k, v, do, 1)
    assert not dq[:, :, :80].astype(np.float64).any()
    check((dq, dk, dv), want)


def test_a_long_walk(rng):
    """A GQA group of 4 heads over 3 key blocks and 9 query blocks each, causal: the walk
    crosses heads with its prefetch and starts at the diagonal."""
    got, want = backward("gfx942", *inputs(rng, 1, 4, 1, 270, 300, 64), 1)
    check(got, want)


# ---- the code objects on the ISA emulator ---------------------------------------------------

@pytest.mark.parametrize("target,d,dt", [("gfx950", 128, "bf16"), ("gfx942", 64, "f16")])
def test_code_objects_compute_the_gradients(target, d, dt, rng):
    got, want = backward(target, *inputs(rng, 1, 2, 1, 40, 70, d, dt), 1, isa_run=True)
    check(got, want)


# ---- static checks of the code objects ------------------------------------------------------

def plans(target, d, causal):
    shape = {"q": np.empty((1, 4, 512, d)), "k": np.empty((1, 2, 512, d))}
    _, main, dq = attention_bwd_launch(shape, target, CAUSAL=causal)
    return {attention_bwd: {"DT": "bf16", **main[1]}, attention_bwd_dq: {"DT": "bf16", **dq[1]}}


def executed_loop(kernel, target, consts):
    """(report, the main loop's instructions an interior block runs, assembly)."""
    rep = compiler.report(kernel, target, **consts)
    asm = compiler.assembly(kernel, target, **consts)
    insts, labels = hsaco.instructions(asm, kernel.name)
    lines = hsaco.line_of_addresses(compiler.code_object(kernel, target, **consts),
                                    hsaco.addresses(asm, kernel.name))
    path = hsaco.interior_path(insts, labels, hsaco.main_loop(insts, labels), lines)
    return rep, [insts[i] for i in path], asm


# MFMAs per step of the walk: S, dP, dV^T, dK^T in the main pass; S^T, dP^T, dQ^T in the dQ
# pass; each D / K of one 32x32 MFMA (K = 16 on gfx950, 8 on gfx942)
PRODUCTS = {attention_bwd: 4, attention_bwd_dq: 3}
MFMA_K = {"gfx942": 8, "gfx950": 16}


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_code_object_static_checks(target, d, causal):
    for kernel, consts in plans(target, d, causal).items():
        rep, path, asm = executed_loop(kernel, target, consts)
        where = (kernel.name, rep)
        assert rep["scratch_bytes"] == 0 and rep["vgpr_spill"] == rep["sgpr_spill"] == 0, where
        assert rep["num_waves"] == WAVES and rep["occupancy_waves_per_simd"] >= 1, where
        # Q and dO (main) or K and V (dQ pass): 32 rows each, two stages
        assert rep["lds_bytes"] == 4 * 32 * d * 2, where
        # the accumulators stay pinned in AGPRs: dK^T, dV^T (main) or dQ^T, D / 2 each
        assert rep["agpr"] == d // 2 * (2 if kernel is attention_bwd else 1), where
        ops = [op for op, _ in path]
        mfma = [i for i, op in enumerate(ops) if op.startswith("v_mfma")]
        assert len(mfma) == rep["loop_executed"]["mfma"] == PRODUCTS[kernel] * d // MFMA_K[target]
        # the pinned accumulators update in place; LLVM's own products (S, dP) write VGPRs
        operands = [[x.strip() for x in path[i][1].split(",")] for i in mfma]
        pinned = [o for o in operands if o[0].startswith("a[")]
        assert all(o[0] == o[-1] for o in pinned) and len(pinned) == len(mfma) // PRODUCTS[
            kernel] * (PRODUCTS[kernel] - 2), where
        assert all(o[0].startswith(("a[", "v[")) for o in operands), where
        # two compute clusters a step, every MFMA inside one, at raised priority
        prio = [(i, path[i][1]) for i, op in enumerate(ops) if op == "s_setprio"]
        assert len(prio) == 4, (where, prio)
        spans = [(a, b) for (a, x), (b, y) in zip(prio, prio[1:]) if (x, y) == ("1", "0")]
        spans += [(prio[-1][0], len(ops))] if prio[-1][1] == "1" else []
        spans += [(-1, prio[0][0])] if prio[0][1] == "0" else []
        assert all(any(a < i < b for a, b in spans) for i in mfma), where
        assert ops.count("s_barrier") == 1                   # once a step: the next stage
        dma = [a for op, a in path if op.startswith("buffer_load") and a.endswith(" lds")]
        per_lane = {"gfx942": 4, "gfx950": 16}[target]
        assert len(dma) == 2 * 32 * d * 2 // (WAVES * 64 * per_lane)   # the next block's two
        assert isa.check_hazards(asm, target) == [], where


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("target", CDNA)
def test_every_pass_and_element_type_compiles_without_spills(target, d):
    """The three passes ops.attention runs (delta, dK/dV, dQ), bf16 and f16, causal or not:
    no spilled register and no scratch in any code object."""
    shape = {"q": np.empty((1, 4, 512, d)), "k": np.empty((1, 2, 512, d))}
    for causal in (0, 1):
        passes = attention_bwd_launch(shape, target, CAUSAL=causal)
        for kernel, (_, consts) in zip((attention_bwd_prep, attention_bwd, attention_bwd_dq),
                                       passes):
            for dt in ("bf16", "f16"):
                if kernel is attention_bwd_prep and causal:
                    continue                                    # the same pass
                rep = compiler.report(kernel, target, DT=dt, **consts)
                assert rep["scratch_bytes"] == 0, (kernel.name, dt, causal, rep)
                assert rep["vgpr_spill"] == rep["sgpr_spill"] == 0, (kernel.name, dt, causal, rep)


def test_compute_clusters_interleave_their_reads_and_exponentials():
    """The 4-wave interleave in the executed loop: between the MFMAs of S and dP sit the
    reads of Q and dO from LDS, and the exponentials of P run under dP's MFMAs."""
    consts = plans("gfx950", 128, 0)[attention_bwd]
    _, path, _ = executed_loop(attention_bwd, "gfx950", consts)
    ops = [op for op, _ in path]
    raised = [i for i, (op, arg) in enumerate(path) if (op, arg) == ("s_setprio", "1")]
    clusters = [ops[i:ops.index("s_setprio", i + 1)] for i in raised]
    cluster = next(c for c in clusters if "v_exp_f32_e32" in c)        # S and dP
    mfma = [i for i, op in enumerate(cluster) if op.startswith("v_mfma")]
    exps = [i for i, op in enumerate(cluster) if op == "v_exp_f32_e32"]
    reads = [i for i, op in enumerate(cluster) if op.startswith("ds_read")]
    assert len(mfma) == 16 and len(exps) == 16
    assert sum(mfma[0] < i < mfma[-1] for i in reads) >= 8       # reads between the MFMAs
    assert sum(mfma[8] < i < mfma[-1] for i in exps) >= 12       # P under dP = dO V^T


# ---- launcher ---------------------------------------------------------------------------------

def test_launch_plans_and_errors():
    shape = {"q": np.empty((2, 8, 300, 128)), "k": np.empty((2, 2, 500, 128))}
    prep, main, dq = attention_bwd_launch(shape, "gfx950", CAUSAL=1)
    assert prep == ((5, 8, 2), {"D": 128})
    assert main == ((2 * 2 * -(-500 // BLOCK_KEYS),),
                    {"D": 128, "CAUSAL": 1, "MAP": "head-first", "num_waves": 4,
                     "TARGET": "gfx950", "BM": 32, "DQ_ATOMIC": 0})
    assert dq == ((2 * 8 * -(-300 // (DQ_ROWS * WAVES)),),
                  {"D": 128, "CAUSAL": 1, "MAP": "head-first", "num_waves": 4,
                   "TARGET": "gfx950", "BN": 32})
    with pytest.raises(ValueError, match="dq='atomic' is not available on gfx942: .* use "
                                         "dq='pass'"):
        attention_bwd_launch(shape, "gfx942", dq="atomic")
    with pytest.raises(pk.NotSupportedYet, match="dq='atomic' is not available on gfx950"):
        compiler.tile_ir(attention_bwd, **{**main[1], "DQ_ATOMIC": 1, "DT": "bf16"})
    with pytest.raises(ValueError, match="grid mapping 'zigzag'"):
        attention_bwd_launch(shape, "gfx942", MAP="zigzag")
    with pytest.raises(ValueError, match="6 query heads are not a multiple of 4"):
        attention_bwd_launch({"q": np.empty((1, 6, 64, 64)), "k": np.empty((1, 4, 64, 64))},
                             "gfx950")
    with pytest.raises(pk.KernelError, match="walks 32-row query blocks, not BM=64"):
        compiler.tile_ir(attention_bwd, **{**main[1], "BM": 64, "DT": "bf16"})


@pytest.mark.parametrize("target", CDNA)
def test_the_grid_is_head_first(target, rng):
    """MAP='naive' walks the same blocks in another order: the same gradients."""
    q, k, v, do = inputs(rng, 2, 2, 1, 40, 200, 64)
    scale = 1 / 8
    o, lse = forward64(q, k, v, scale, 0)
    delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1).astype(np.float32)
    runs = []
    for mapping in ("head-first", "naive"):
        _, (mg, mc), _ = attention_bwd_launch({"q": q, "k": k}, target, MAP=mapping)
        runs.append(pk.emulate(attention_bwd, q, k, v, do, lse, delta,
                               np.zeros((1, 1, 1, 16), np.float32), np.zeros_like(k),
                               np.zeros_like(v), scale, grid=mg, target=target, **mc))
    assert all(np.array_equal(runs[0][n], runs[1][n]) for n in ("dk", "dv"))


# ---- pykittens.ops.attention on CPU tensors, emulated for a CDNA chip ------------------------

@pytest.mark.parametrize("target,causal,dtype", [("gfx950", True, "bfloat16"),
                                                 ("gfx942", False, "float16")])
def test_op_backward_on_cdna(target, causal, dtype, monkeypatch):
    """Gradients through O and the LSE against torch autograd of the float64 reference,
    with the emulator running the CDNA kernels (forward and backward)."""
    pytest.importorskip("torch")
    from pykittens.ops import run as ops_run
    from test_attention_bwd import op_gradients_match
    monkeypatch.setattr(ops_run, "EMULATE_TARGET", target)
    op_gradients_match(causal, dtype)


# ---- docs/targets/cdna.md: HipKittens' figures as theirs, no AMD speed of ours -------------

def test_the_notes_cite_hipkittens_figures_as_theirs():
    """The backward section sets HipKittens' MI355X figures beside the schedule as their
    measurements and claims no AMD speed; a TFLOP/s figure other than theirs would have to
    be labelled modeled."""
    import os
    import re
    from conftest import ROOT
    with open(os.path.join(ROOT, "docs", "targets", "cdna.md")) as f:
        text = f.read()
    section = text[text.index("## Attention backward"):]
    section = section[:section.index("\n## ", 1)]
    against = " ".join(section[section.index("**Against HipKittens.**"):].split())
    for figure, what in (("1119", "MHA"), ("1176", "GQA"), ("995", "GQA, causal")):
        assert re.search(rf"{figure} TFLOP/s \({what}\)", against), figure
    assert "N = 16384" in against and "MI355X" in against
    assert "Those are their measurements of their kernels" in against
    assert "No AMD speed is measured or claimed here" in against
    for m in re.finditer(r"([\d.,]+)\s*TFLOP/s", section):
        line = section[section.rfind("\n", 0, m.start()) + 1:section.find("\n", m.end())]
        assert m.group(1) in ("1119", "1176", "995") or "modeled" in line, line
