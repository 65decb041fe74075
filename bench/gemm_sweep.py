"""The Hopper GEMM against cuBLAS on the whole sweep: squares 2048³ to 16384³ and the linear
layers of Llama-3 8B / 70B at 4096 to 16384 tokens, bf16 (C = X W^T, W stored N x K), with
gemm_ws's launch rule, every autotuner candidate (ops.matmul.gemm_ws_candidates, timed
through pykittens.ops.linear with PYKITTENS_AUTOTUNE on, which keeps the fastest on disk),
and the op replaying the tuned choice; then gemm_ws reading MN-major operands as stored
(LAYOUT "nn", "tn": a linear layer's backward) against cuBLAS on the same products, and fp8
(e4m3, promoted) against torch._scaled_mm's default accumulation.

    PYKITTENS_CACHE=$PWD/.pkc_gemm python3 bench/gemm_sweep.py --prebuild    # no GPU: PTX
                                            # (--prebuild store: that step's builds only)
    PYKITTENS_CACHE=$PWD/.pkc_gemm PYTHONPATH=. python3 bench/gemm_sweep.py   # on the GPU
    ... bench/gemm_sweep.py layouts fp8     # only those steps (STEPS)

`store`, `cluster`, `early`, `fence`, `stream` and `grid` time the launch rule against one
other launch of each shape: C stored another way; the same launch in clusters of two
workgroups that share B's blocks (TMA multicast); the same launch as usual instead of
early (runtime.cuda.EARLY_LAUNCH); every ring release fenced; the last blocks split in K
(gemm_sk, stream-K); the fewest workgroups that take as many rounds. `skinny` times
products of 128 to 1024 rows (gemm_ws's rule, gemm_sk at either block width, cuBLAS),
`decode` products of 1 to 64 rows (A's rows copied or whole 128-row blocks; `decode_fp8`
in e4m3 against torch._scaled_mm), and
`split_op` pykittens.ops.linear where it splits K (checked on replayed calls, a second
stream, a CUDA graph and its gradients).
`candidates` first launches every autotuner candidate of 2048³ and 4096³ once, each in a
child process with a time limit, so a build that faults or hangs the GPU is named before the
tuner times it.

Times are medians of CUDA-graph replays (pykittens.tune.graph_time) over three rounds that
time the contenders in turn (the H200's clock drifts by several percent over a run, so
back-to-back blocks would favour whichever ran first), TFLOP/s = 2MNK / time.
Each product is checked against cuBLAS's result first. Writes $OUT/gemm_sweep.json; prints
the table last (ratios: pykittens / cuBLAS, so above 1 is faster)."""
from __future__ import annotations

import math
import os
import sys
import time
from unittest import mock

SQUARES = (2048, 4096, 8192, 16384)
LLAMA = ((4096, 4096), (14336, 4096), (4096, 14336),       # (N, K): 8B's attention, MLP
         (8192, 8192), (28672, 8192), (8192, 28672))      # 70B's
TOKENS = (4096, 8192, 16384)
LAYOUT_SHAPES = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                 (16384, 8192, 8192))
FP8_SQUARES = (4096, 8192)
TARGET = "sm_90a"


def sweep_shapes() -> list[tuple[int, int, int]]:
    """(M, N, K) of the sweep: the squares, then the Llama layers at each token count."""
    return [(s, s, s) for s in SQUARES] + [(m, n, k) for m in TOKENS for n, k in LLAMA]


def _plan(layout, m, n, k, itemsize=2, **rule):
    """gemm_ws_launch's (grid, consts) for the product stored as `layout`, bf16 C."""
    from pykittens.kernels import gemm_ws_launch
    from pykittens.ops.matmul import ws_operands
    return gemm_ws_launch(ws_operands(layout, m, k, n, itemsize, out_itemsize=2), TARGET,
                          layout=layout, **rule)


STEPS = ("candidates", "sweep", "store", "cluster", "early", "fence", "stream", "grid",
         "skinny", "decode", "decode_fp8", "split_op", "layouts", "fp8")     # GPU run's


def builds(steps=STEPS):
    """(constants) of every gemm_ws build the GPU run's `steps` make (DT, OUT included)."""
    from pykittens.ops.matmul import gemm_ws_candidates
    if {"candidates", "sweep"} & set(steps):  # (the candidates step's shapes among them)
        for m, n, k in sweep_shapes():
            for c in gemm_ws_candidates(TARGET, m, k, n, 2):
                yield {**c, "DT": "bf16", "OUT": "bf16"}
    for step, plans in (("store", _store_plans), ("cluster", _cluster_plans),
                        ("early", _early_plans), ("fence", _fence_plans),
                        ("stream", _stream_plans), ("grid", _grid_plans)):
        if step in steps:
            for m, n, k in sweep_shapes():
                for plan in plans(m, n, k).values():
                    yield {**plan, "DT": "bf16", "OUT": "bf16"}
    for step, tokens, layers, plans, dt in (
            ("skinny", SKINNY_TOKENS, SKINNY_LAYERS, _skinny_plans, "bf16"),
            ("decode", DECODE_TOKENS, DECODE_LAYERS, _decode_plans, "bf16"),
            ("decode_fp8", DECODE_TOKENS, DECODE_LAYERS, _decode_fp8_plans, "e4m3")):
        if step in steps:
            for m in tokens:
                for n, k in layers:
                    for plan in plans(m, n, k).values():
                        yield {**plan, "DT": dt, "OUT": "bf16"}
    if "split_op" in steps:                  # the forward's and the gradients' products
        import importlib
        from pykittens.kernels.gemm import gemm_sk
        M = importlib.import_module("pykittens.ops.matmul")
        for m, n, k in SPLIT_OP_SHAPES:
            for form, dims in (("nt", (m, k, n)), ("nn", (m, n, k)), ("tn", (n, m, k))):
                kernel, _, consts, _ = M._plan(TARGET, form, *dims, 2)
                yield {**consts, "DT": "bf16", "OUT": "bf16",
                       **({STREAM: True} if kernel is gemm_sk else {})}
    if "layouts" in steps:
        for layout in ("nt", "nn", "tn"):
            for m, n, k in LAYOUT_SHAPES + ((1000, 1528, 776),):
                yield {**_plan(layout, m, n, k)[1], "DT": "bf16", "OUT": "bf16"}
    if "fp8" in steps:
        for s in FP8_SQUARES:
            for _, _, plan in _fp8_plans(s):
                yield {**plan, "DT": "e4m3", "OUT": "bf16"}


def prebuild(steps) -> int:
    """PTX of the builds the named steps (all when none is named) launch, into the cache."""
    from pykittens import compiler
    from pykittens.toolchain import nvptx
    t0, seen = time.time(), set()
    for plan in builds(steps or STEPS):
        key = repr(sorted(plan.items()))
        if key not in seen:
            seen.add(key)
            kernel, building = _kernel_of(plan)
            with building():
                nvptx.compile_ptx(compiler.llvm_ir(kernel, TARGET, aligned=True,
                                                   **_launch_of(plan)[0]), TARGET)
    print(f"{len(seen)} builds in {time.time() - t0:.0f} s")
    return 0


# ---- on the GPU -------------------------------------------------------------------------

def _reps(flops: float) -> int:
    """CUDA-graph length: about 20 ms of work a replay, 2 to 20 calls."""
    return max(2, min(20, round(0.02 / (flops / 700e12))))


def _rel(x, ref) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def _rand(*shape, dtype=None):
    import torch
    return (torch.randn(*shape, device="cuda") / 4).to(dtype or torch.bfloat16)


def step_sweep(rows, details):
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    from pykittens import tune
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    M = sys.modules["pykittens.ops.matmul"]
    M.AUTOTUNE = True
    ratios = []
    for m, n, k in sweep_shapes():
        flops, reps = 2 * m * n * k, _reps(2 * m * n * k)
        x, w = _rand(m, k), _rand(n, k)
        ref = F.linear(x, w)
        grid, consts = _plan("nt", m, n, k)
        y = torch.empty_like(ref)
        launch(gemm_ws, grid=grid, a=x, b=w, c=y, **consts)
        err = _rel(y, ref)
        t0 = time.time()
        y_op = pko.linear(x, w)                      # tunes (or reads the disk's choice)
        tune_s = time.time() - t0
        err = max(err, _rel(y_op, ref))
        t_cublas, t_default, t_op = interleaved(
            [lambda: F.linear(x, w), lambda: launch(gemm_ws, grid=grid, a=x, b=w, c=y, **consts),
             lambda: pko.linear(x, w)], reps)
        entry = tune.entry("gemm_ws", M.gemm_ws_problem(x, "nt", m, k, n),
                           M.gemm_ws_candidates(TARGET, m, k, n, 2))
        best = entry["best"] if entry else None
        r = t_cublas / t_op
        ratios.append(r)
        row = dict(shape=[m, n, k], cublas_tflops=flops / t_cublas / 1e12,
                   default_tflops=flops / t_default / 1e12, op_tflops=flops / t_op / 1e12,
                   op_over_cublas=r, default_over_cublas=t_cublas / t_default, rel_err=err,
                   tune_seconds=tune_s, default=consts, tuned=best,
                   timings=entry["timings"] if entry else None)
        details.append(row)
        print(f"{m}x{n}x{k}: cuBLAS {row['cublas_tflops']:.0f}, default "
              f"{row['default_tflops']:.0f}, tuned op {row['op_tflops']:.0f} TFLOP/s "
              f"({r:.3f}x; {_short(best)}), err {err:.1e}, tuning {tune_s:.1f} s", flush=True)
        rows.append(["sweep", f"{m}x{n}x{k}", f"{row['cublas_tflops']:.0f}",
                     f"{row['default_tflops']:.0f}", f"{row['op_tflops']:.0f}", f"{r:.3f}",
                     _short(best), "ok" if err < 1e-2 else "FAIL"])
        del x, w, ref, y, y_op
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    rows.append(["sweep", f"{len(ratios)} shapes", "", "", "", f"geomean {geo:.3f}",
                 f"min {min(ratios):.3f}", ""])


def _store_plans(m, n, k) -> dict:
    """The launch rule's constants ("rule": C staged for the TMA unit, 256-wide blocks in
    64-column pieces) and another launch ("other": 256-wide blocks storing C from
    registers; where the rule takes 128-wide blocks, too few 256-wide ones to fill the
    SMs, 256-wide blocks in pieces)."""
    _, rule = _plan("nt", m, n, k)
    if rule["BN"] == 128:
        return {"rule": rule, "other": _plan("nt", m, n, k, bn=256)[1]}
    return {"rule": rule, "other": {**rule, "TMA_STORE": 0}}


def _cluster_plans(m, n, k) -> dict:
    """The launch rule's constants ("rule") and the same launch in clusters of two
    workgroups sharing each block of B ("other": CLUSTER=2; CLUSTER=1 where the rule's
    block rows TM are odd, so the two columns then time the same build)."""
    _, rule = _plan("nt", m, n, k)
    other = {**rule, "CLUSTER": 2} if rule["TM"] % 2 == 0 else rule
    return {"rule": rule, "other": other}


# plan keys for how it is built and launched: EARLY False launches it as usual (runtime.cuda's
# EARLY_LAUNCH off for the call), not early; BUILD {"module.NAME": value} builds it with
# those pykittens module constants set (e.g. the codegen's fence rule, gemm's promotion runs)
EARLY = "early launch"
BUILD = "built with"
STREAM = "stream-K"          # the plan's gemm_ws launch as gemm_sk (kernels.gemm_sk_plan)
GRID = "grid"                # the plan's persistent grid, where not the launch rule's


def _ws_consts(plan) -> dict:
    """A plan's gemm_ws constants: the plan without this script's own keys."""
    return {k: v for k, v in plan.items() if k not in (EARLY, BUILD, STREAM, GRID)}


def _launch_of(plan) -> tuple[dict, bool]:
    """(gemm_ws's constants, launched early where pk.launch would) of a plan (for a STREAM
    plan, gemm_sk's: gemm_ws's but those gemm_sk fixes)."""
    from pykittens.kernels import SK_FIXED
    consts = _ws_consts(plan)
    if plan.get(STREAM):
        consts = {k: v for k, v in consts.items() if k not in SK_FIXED}
    return consts, plan.get(EARLY, True)


def _grid_of(plan, k) -> tuple[int]:
    """The grid of a plan for K = k."""
    from pykittens.kernels import gemm_sk_plan, gemm_ws_grid
    if plan.get(STREAM):
        return gemm_sk_plan(_ws_consts(plan), TARGET, k, grid=plan.get(GRID))[0]
    if GRID in plan:
        return (plan[GRID],)
    return gemm_ws_grid(_ws_consts(plan), TARGET)


def _stream_args(plan, k) -> dict:
    """gemm_sk's `part` and `flags` for a STREAM plan over K = k (none for others)."""
    if not plan.get(STREAM):
        return {}
    import torch
    from pykittens.kernels import gemm_sk_plan
    _, consts, slots = gemm_sk_plan(_ws_consts(plan), TARGET, k, grid=plan.get(GRID))
    return {"part": torch.empty(128 * slots, consts["BN"], device="cuda"),
            "flags": torch.zeros(8 * slots, device="cuda", dtype=torch.int32)}


def _time_plans(plans: dict, m, n, k, weights: int = 1) -> tuple[dict, float]:
    """({"cublas": TFLOP/s, name: TFLOP/s of each plan}, the largest relative error of the
    plans' products against cuBLAS's) on random (m, k) x (n, k) operands: each plan
    launched once on a NaN-poisoned C and checked, then all timed with F.linear in
    interleaved rounds. weights=n: calls take n copies of the (n, k) operand in turn (so
    that, together larger than L2, each call reads its weight from DRAM)."""
    import itertools
    import torch
    import torch.nn.functional as F
    from pykittens.runtime import cuda as rc
    from pykittens.runtime.launch import launch
    flops = 2 * m * n * k
    x, ws = _rand(m, k), [_rand(n, k) for _ in range(weights)]
    ref = F.linear(x, ws[0])

    def turns():                    # each caller's own turn through the copies
        return itertools.cycle(ws).__next__

    def call_of(plan):
        c, early = _launch_of(plan)
        kernel, building = _kernel_of(plan)
        y, extra, grid = torch.full_like(ref, float("nan")), _stream_args(plan, k), \
            _grid_of(plan, k)
        w = turns()

        def call():
            with mock.patch.object(rc, "EARLY_LAUNCH", rc.EARLY_LAUNCH and early), building():
                launch(kernel, grid=grid, a=x, b=w(), c=y, **extra, **c)
        return call, y
    calls, err = {}, 0.0
    for name, plan in plans.items():
        calls[name], y = call_of(plan)
        calls[name]()
        err = max(err, _rel(y, ref))
    peer = turns()
    times = interleaved([lambda: F.linear(x, peer())] + list(calls.values()), _reps(flops))
    return {name: flops / t / 1e12 for name, t in zip(["cublas", *calls], times)}, err


_KERNELS: dict = {}


def _kernel_of(plan):
    """(the gemm_ws kernel object to launch, a function giving the context its first launch
    builds under): for a plan with BUILD, a Kernel of its own over gemm_ws's function (so
    that its build, traced with those module constants set, does not share gemm_ws's
    launch cache) and the patches."""
    import contextlib
    import importlib
    from pykittens.kernels.gemm import gemm_sk, gemm_ws
    patches = tuple(sorted(plan.get(BUILD, {}).items()))
    if plan.get(STREAM):
        if patches:
            raise ValueError("a stream-K plan is built as the library builds it")
        return gemm_sk, contextlib.nullcontext
    if not patches:
        return gemm_ws, contextlib.nullcontext
    if patches not in _KERNELS:
        import pykittens as pk
        _KERNELS[patches] = pk.Kernel(gemm_ws.fn, gemm_ws.num_waves)

    def building():
        stack = contextlib.ExitStack()
        for name, value in patches:
            module, attr = name.rsplit(".", 1)
            stack.enter_context(mock.patch.object(
                importlib.import_module(f"pykittens.{module}"), attr, value))
        return stack
    return _KERNELS[patches], building


def _fence_plans(m, n, k) -> dict:
    """The launch rule's constants ("rule") and the same build with every ring release
    fenced ("other", the rule before the TMA store's fence covered it)."""
    _, rule = _plan("nt", m, n, k)
    return {"rule": rule, "other": {**rule, BUILD: {"codegen.nvptx.STORE_FENCE_COVERS": False}}}


def _describe_fence(plans) -> str:
    return f"{plans['rule']['BN']} store's fence covers / releases fenced"


def _early_plans(m, n, k) -> dict:
    """The launch rule's constants, launched early where pk.launch would ("rule") and as
    usual ("other")."""
    _, rule = _plan("nt", m, n, k)
    return {"rule": rule, "other": {**rule, EARLY: False}}


def _stream_plans(m, n, k) -> dict:
    """The launch rule's constants ("rule") and the same launch with its last blocks split
    in K (gemm_sk, "other"), where anything splits."""
    _, rule = _plan("nt", m, n, k)
    from pykittens.kernels import gemm_sk_plan
    return {"rule": rule, "other": {**rule, STREAM: gemm_sk_plan(rule, TARGET, k) is not None}}


def _grid_plans(m, n, k) -> dict:
    """The launch rule ("rule": one workgroup per SM) and the same launch on the fewest
    workgroups that walk its blocks in as many rounds ("other": for 2^k blocks on 132
    SMs, 128, so every round is whole)."""
    from pykittens.kernels import gemm_ws_grid
    _, rule = _plan("nt", m, n, k)
    blocks, (grid,) = rule["TM"] * rule["TN"], gemm_ws_grid(rule, TARGET)
    rounds = -(-blocks // grid)
    return {"rule": rule, "other": {**rule, GRID: -(-blocks // rounds)}}


def _describe_grid(plans) -> str:
    return f"{plans['rule']['BN']} one per SM / {plans['other'][GRID]} workgroups"


def _describe_stream(plans) -> str:
    return f"{plans['rule']['BN']} rule / " + \
        ("stream-K" if plans["other"][STREAM] else "the same (nothing splits)")


def _describe_early(plans) -> str:
    return f"{plans['rule']['BN']} early / as usual"


def _describe_store(plans) -> str:
    how = {0: "registers", 1: "whole", 2: "pieces"}
    return " / ".join(f"{plans[p]['BN']} {how[plans[p].get('TMA_STORE', 0)]}"
                      for p in ("rule", "other"))


def _describe_cluster(plans) -> str:
    return " / ".join(f"{plans[p]['BN']} cluster {plans[p].get('CLUSTER', 1)}"
                      for p in ("rule", "other"))


def step_store(rows, details):
    """How C leaves: the launch rule against the same launch storing C the other way
    (_store_plans), and cuBLAS, on the sweep's shapes."""
    _step_pair("store", _store_plans, _describe_store, rows, details)


def step_cluster(rows, details):
    """The launch rule against the same launch in clusters of two sharing B's blocks
    (_cluster_plans), and cuBLAS, on the sweep's shapes; first, how many clusters of two
    the GPU holds at once."""
    rows.append(["cluster", "clusters of 2 at once", "", "", "", str(_max_clusters()), "", ""])
    _step_pair("cluster", _cluster_plans, _describe_cluster, rows, details)


def step_early(rows, details):
    """The launch rule launched early (as pk.launch does where the grid allows it) against
    the same launches as usual, and cuBLAS, on the sweep's shapes."""
    _step_pair("early", _early_plans, _describe_early, rows, details)


def step_stream(rows, details):
    """The launch rule against the same launch with its last blocks split in K between
    workgroups (gemm_sk: every workgroup the same number of K steps), and cuBLAS, on the
    sweep's shapes."""
    _step_pair("stream", _stream_plans, _describe_stream, rows, details)


# M of the skinny step: few blocks, long K (GEMM_SKINNY_TOKENS="16,64,..." for others),
# against the Llama layers' (N, K) or GEMM_SKINNY_LAYERS="4096x8192,..."
SKINNY_TOKENS = tuple(int(m) for m in os.environ.get("GEMM_SKINNY_TOKENS",
                                                     "128,256,512,1024").split(","))
SKINNY_LAYERS = tuple(tuple(int(d) for d in nk.split("x"))
                      for nk in os.environ["GEMM_SKINNY_LAYERS"].split(",")) \
    if os.environ.get("GEMM_SKINNY_LAYERS") else LLAMA


def _skinny_plans(m, n, k) -> dict:
    """The launch rule (gemm_ws), the same blocks split in K (gemm_sk), and gemm_sk with
    the other block width, where each splits anything."""
    from pykittens.kernels import gemm_sk_plan, narrow_split, split_grid
    from pykittens.targets import get as get_target
    _, rule = _plan("nt", m, n, k)
    plans = {"rule": rule}
    sms, steps = get_target(TARGET).num_cus, -(-k * 2 // 128)       # bf16 K steps
    for bn in (rule["BN"], 384 - rule["BN"]):
        _, c = _plan("nt", m, n, k, bn=bn)
        if gemm_sk_plan(c, TARGET, k) is not None:
            plans[f"split {bn}"] = {**c, STREAM: True}
            if bn == 128 and SKINNY_STAGES:           # more of B in flight a workgroup
                plans[f"split {bn} x{SKINNY_STAGES}"] = {**c, STREAM: True,
                                                         "STAGES": SKINNY_STAGES}
            grid = split_grid(c["TM"] * c["TN"], steps, sms)
            if bn == 128 and SKINNY_ALIGNED and grid and grid != sms:
                # as many workgroups as split every block into equal runs: none crosses
                # from one block into the next
                plans[f"split {bn} on {grid}"] = {**c, STREAM: True, GRID: grid}
            if bn == 128 and SKINNY_64:               # 64-wide blocks, C from registers
                narrow = narrow_split(c, n)
                for stages in (4, 8):
                    plans[f"split 64 x{stages}"] = {**narrow, STREAM: True, "STAGES": stages}
                grid64 = split_grid(narrow["TM"] * narrow["TN"], steps, sms)
                if SKINNY_ALIGNED and grid64:
                    plans[f"split 64 x8 on {grid64}"] = {**narrow, STREAM: True, "STAGES": 8,
                                                         GRID: grid64}
    return plans


# GEMM_SKINNY_64=1: the skinny step also times 64-wide split blocks (4 and 8 ring stages)
SKINNY_64 = os.environ.get("GEMM_SKINNY_64", "0") == "1"


# GEMM_SKINNY_ALIGNED=1: the skinny step also times 128-wide split blocks on the workgroups
# that split every block into equal runs (a multiple of the blocks, at most one an SM: what
# pykittens.ops takes since runs UF, UG, kernels.split_grid) beside one workgroup an SM
SKINNY_ALIGNED = os.environ.get("GEMM_SKINNY_ALIGNED", "0") == "1"


# GEMM_SKINNY_STAGES=n: the skinny step also times 128-wide split blocks with n ring
# stages (six fit beside C's staging: docs/PERF.md run TL)
SKINNY_STAGES = int(os.environ.get("GEMM_SKINNY_STAGES", "0"))


def step_skinny(rows, details):
    """Skinny products (M = SKINNY_TOKENS rows against the Llama layers' weights: fewer
    blocks than SMs, or not many more): gemm_ws's launch rule against its blocks split in K
    between workgroups (gemm_sk, split-K where the blocks are fewer than the SMs), at
    either block width, and cuBLAS; medians of interleaved rounds."""
    best = []
    for m in SKINNY_TOKENS:
        for n, k in SKINNY_LAYERS:
            plans = _skinny_plans(m, n, k)
            tf, err = _time_plans(plans, m, n, k)
            top = max(plans, key=lambda nm: tf[nm])
            best.append(tf[top] / tf["cublas"])
            details.append({"step": "skinny", "shape": [m, n, k], "tflops": tf, "rel_err": err,
                            "plans": plans})
            line = ", ".join(f"{nm} {tf[nm]:.0f}" for nm in plans)
            print(f"{m}x{n}x{k}: cuBLAS {tf['cublas']:.0f}, {line} TFLOP/s, err {err:.1e}",
                  flush=True)
            rows.append(["skinny", f"{m}x{n}x{k}", f"{tf['cublas']:.0f}", f"{tf['rule']:.0f}",
                         f"{tf[top]:.0f}", f"{tf['rule'] / tf['cublas']:.3f} / "
                         f"{tf[top] / tf['cublas']:.3f}", top, "ok" if err < 1e-2 else "FAIL"])
    geo = math.exp(sum(map(math.log, best)) / len(best))
    rows.append(["skinny", f"best: {len(best)} shapes", "", "", "", f"geomean {geo:.3f}",
                 f"min {min(best):.3f}", ""])


# M of the decode step: a decode batch's tokens (GEMM_DECODE_TOKENS="1,8,..." for others)
# against the weights a decode step reads: Llama-3 8B's fused QKV, output, fused gate and
# up, down and LM head; 70B's output and down (N, K)
DECODE_TOKENS = tuple(int(m) for m in os.environ.get("GEMM_DECODE_TOKENS",
                                                     "1,16,64").split(","))
# the decode step's weight copies together at least this large (the H200's L2 twice)
DECODE_WEIGHT_BYTES = 100 << 20
DECODE_LAYERS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096),
                 (8192, 8192), (8192, 28672))


def _decode_plans(m, n, k) -> dict:
    """pykittens.ops.linear's launch (A_ROWS: A's rows copied, no more), the same launch
    copying 128-row blocks of A, and the others the launch rule chooses among: 128-wide
    blocks (split in K where they are few: 4, 6 and 8 ring stages), 64-wide blocks split
    evenly (8 and 12 stages) and, where 64-wide blocks fill more than half the SMs, over
    all of K (kernels.DECODE_WHOLE_K), where 32-wide or 48-wide ones do, those over all of
    K (12 and 18 stages; 8 and 12); each once (those equal to the op's left out)."""
    from pykittens.kernels import DECODE_WHOLE_K, SK_FIXED, gemm_split_k, narrow_split, \
        split_grid
    from pykittens.targets import get as get_target

    def as_launched(c):             # gemm_sk where the rule splits K
        split = gemm_split_k(c, TARGET, k, m=m, n=n)
        return c if split is None else {**split[1], **SK_FIXED, STREAM: True,
                                        GRID: split[0][0]}
    op = as_launched(_plan("nt", m, n, k)[1])
    # (at most 8 stages: 12 of 64-wide blocks with two 64-row tiles of A overflow shared
    # memory)
    whole = {key: v for key, v in op.items() if key != "A_ROWS"}
    plans = {"op": op, "A 128 rows": {**whole, "STAGES": min(op["STAGES"], 8)}}
    sms = get_target(TARGET).num_cus
    wide = _plan("nt", m, n, k, bn=128)[1]
    split = as_launched(wide)
    narrow = narrow_split(wide, n)
    others = {}
    if split.get(STREAM):
        for stages in (4, 6, 8):                        # more of B in flight a workgroup
            others[f"split 128 x{stages}"] = {**split, "STAGES": stages}
        grid = split_grid(narrow["TM"] * narrow["TN"], -(-k * 2 // 128), sms)
        if grid:
            for stages in (8, 12):
                others[f"split 64 x{stages}"] = {**narrow, STREAM: True, GRID: grid,
                                                 "STAGES": stages}
    if sms // 2 < narrow["TN"] <= sms:                  # 64-wide blocks fill the SMs: whole K
        others["64 x12"] = {**narrow, **DECODE_WHOLE_K}
    others.update(_whole_k(narrow, n, sms, ((32, 12), (32, 18), (48, 8), (48, 12))))
    plans.update({name: p for name, p in others.items() if p != op})
    return plans


def _whole_k(narrow: dict, n: int, sms: int, forms) -> dict:
    """{"W xS": `narrow`'s launch in W-wide blocks over all of K with S ring stages} for each
    (W, S) of `forms` whose blocks fill more than half the SMs and at most all."""
    out = {}
    for width, stages in forms:
        tn = -(-n // width)
        if sms // 2 < tn <= sms:
            out[f"{width} x{stages}"] = {**narrow, "BN": width, "TN": tn, "STAGES": stages}
    return out


def step_decode(rows, details):
    """Decode-sized products (M = DECODE_TOKENS rows, 1 to 64, against a decode step's
    weights): the op's launch, which copies only A's rows, against the same launch copying
    whole 128-row blocks of A (the TMA unit zero-filling the rest), the other launches
    _decode_plans lists, and cuBLAS; medians of interleaved rounds. Each call reads its
    weight from DRAM, as in a model's decode step: calls take turns over copies of it that
    together fill L2 twice (DECODE_WEIGHT_BYTES)."""
    best = []
    for m in DECODE_TOKENS:
        for n, k in DECODE_LAYERS:
            plans = _decode_plans(m, n, k)
            tf, err = _time_plans(plans, m, n, k,
                                  weights=-(-DECODE_WEIGHT_BYTES // (2 * n * k)))
            top = max(plans, key=lambda nm: tf[nm])
            best.append(tf["op"] / tf["cublas"])
            details.append({"step": "decode", "shape": [m, n, k], "tflops": tf,
                            "rel_err": err, "plans": plans})
            line = ", ".join(f"{nm} {tf[nm]:.1f}" for nm in plans)
            print(f"{m}x{n}x{k}: cuBLAS {tf['cublas']:.1f}, {line} TFLOP/s, err {err:.1e}",
                  flush=True)
            rows.append(["decode", f"{m}x{n}x{k}", f"{tf['cublas']:.1f}", f"{tf['op']:.1f}",
                         f"{tf[top]:.1f}", f"{tf['op'] / tf['cublas']:.3f} (128 rows "
                         f"{tf['A 128 rows'] / tf['cublas']:.3f})", top,
                         "ok" if err < 1e-2 else "FAIL"])
    geo = math.exp(sum(map(math.log, best)) / len(best))
    rows.append(["decode", f"op: {len(best)} shapes", "", "", "", f"geomean {geo:.3f}",
                 f"min {min(best):.3f}", ""])


def _decode_fp8_plans(m, n, k) -> dict:
    """e4m3 decode products: the launch rule (promoted every K step, A_ROWS), the same
    copying 128-row blocks of A (at most 8 stages), 64-wide promoted blocks over all of K
    (12 stages) where they take at most every SM, 48-wide (8 and 12 stages) and 32-wide
    (12) ones where they fill more than half the SMs and at most all, and the tensor
    cores' own accumulation (the rule's with promote=False)."""
    from pykittens.kernels import DECODE_WHOLE_K, narrow_split
    from pykittens.targets import get as get_target
    _, rule = _plan("nt", m, n, k, 1)
    whole = {key: v for key, v in rule.items() if key != "A_ROWS"}
    plans = {"op": rule, "A 128 rows": {**whole, "STAGES": min(rule["STAGES"], 8)}}
    narrow = narrow_split(rule, n)
    sms = get_target(TARGET).num_cus
    if narrow["TN"] <= sms and rule["BN"] != 64:
        plans["64 x12"] = {**narrow, **DECODE_WHOLE_K}
    plans.update({name: p for name, p in
                  _whole_k(narrow, n, sms, ((48, 8), (48, 12), (32, 12))).items()
                  if p["BN"] != rule["BN"]})
    plans["tensor-core accumulation"] = _plan("nt", m, n, k, 1, promote=False)[1]
    return plans


def step_decode_fp8(rows, details):
    """e4m3 decode products (DECODE_TOKENS rows against DECODE_LAYERS, bf16 out, unit
    scales, weights read from DRAM as in step_decode) against torch._scaled_mm's default
    accumulation (the tensor cores' own: against use_fast_accum=True)."""
    import itertools
    import torch
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    one = torch.ones((), device="cuda")
    ratios = []
    for m in DECODE_TOKENS:
        for n, k in DECODE_LAYERS:
            flops = 2 * m * n * k
            a = _rand(m, k).float().to(torch.float8_e4m3fn)
            ws = [_rand(n, k).float().to(torch.float8_e4m3fn)
                  for _ in range(-(-DECODE_WEIGHT_BYTES // (n * k)))]
            ref = a.double() @ ws[0].double().t()
            plans = _decode_fp8_plans(m, n, k)

            def peer(fast):
                w = itertools.cycle(ws).__next__
                return lambda: torch._scaled_mm(a, w().t(), one, one,
                                                out_dtype=torch.bfloat16, use_fast_accum=fast)

            def ours(plan):
                w, c = itertools.cycle(ws).__next__, torch.empty(m, n, device="cuda",
                                                                 dtype=torch.bfloat16)
                grid = gemm_ws_grid(plan, TARGET)
                return lambda: launch(gemm_ws, grid=grid, a=a, b=w(), c=c, **plan) or c
            fns = [peer(False), peer(True)] + [ours(p) for p in plans.values()]
            errs = [_rel(fn(), ref) for fn in fns]
            times = interleaved(fns, _reps(flops))
            tf = {name: flops / t / 1e12 for name, t in
                  zip(["scaled_mm", "scaled_mm fast", *plans], times)}
            details.append({"step": "decode_fp8", "shape": [m, n, k], "tflops": tf,
                            "rel_errs": errs, "plans": plans})
            print(f"{m}x{n}x{k} e4m3: " + ", ".join(f"{nm} {v:.1f}" for nm, v in tf.items())
                  + f" TFLOP/s, errors {', '.join(f'{e:.1e}' for e in errs)}", flush=True)
            top = max(plans, key=lambda nm: tf[nm] if nm != "tensor-core accumulation" else 0)
            rows.append(["decode fp8", f"{m}x{n}x{k}", f"{tf['scaled_mm']:.1f}",
                         f"{tf['op']:.1f}", f"{tf[top]:.1f}",
                         f"{tf['op'] / tf['scaled_mm']:.3f} (128 rows "
                         f"{tf['A 128 rows'] / tf['scaled_mm']:.3f}; tensor-core "
                         f"accumulation / fast "
                         f"{tf['tensor-core accumulation'] / tf['scaled_mm fast']:.3f})",
                         top, "ok" if max(errs[2:]) < 2e-2 else "FAIL"])
            ratios.append(tf["op"] / tf["scaled_mm"])
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    rows.append(["decode fp8", f"op: {len(ratios)} shapes", "", "", "", f"geomean {geo:.3f}",
                 f"min {min(ratios):.3f}", ""])


def step_grid(rows, details):
    """The launch rule (a workgroup per SM) against the same launch on the fewest
    workgroups that take as many rounds of blocks (_grid_plans), and cuBLAS."""
    _step_pair("grid", _grid_plans, _describe_grid, rows, details)


# the split_op step's products (M x N x K), or GEMM_SPLIT_OP_SHAPES="16x4096x14336,..."
SPLIT_OP_SHAPES = tuple(tuple(int(d) for d in mnk.split("x")) for mnk in os.environ.get(
    "GEMM_SPLIT_OP_SHAPES", "128x4096x14336,256x4096x4096,128x8192x28672").split(","))


def step_split_op(rows, details):
    """pykittens.ops.linear at SPLIT_OP_SHAPES (by default products the launch rule splits
    in K: gemm_sk through the op's per-stream workspace): forward and backward against
    float32 torch, calls replayed on one stream and on a second one, a CUDA graph of the op
    replayed twice (its captured workspace zeroed by the capture's own memset), and the
    op's time against cuBLAS's."""
    import torch
    import torch.nn.functional as F
    import pykittens.ops as pko
    M = sys.modules["pykittens.ops.matmul"]
    for m, n, k in SPLIT_OP_SHAPES:
        x, w = _rand(m, k), _rand(n, k) / 4
        kernel = M._plan(TARGET, "nt", m, k, n, 2)[0]
        ref = F.linear(x.float(), w.float())
        errs = [_rel(pko.linear(x, w), ref) for _ in range(3)]          # full, then replayed
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            errs += [_rel(pko.linear(x, w), ref) for _ in range(3)]
        torch.cuda.current_stream().wait_stream(side)
        graph, out = torch.cuda.CUDAGraph(), None
        with torch.cuda.graph(graph):
            out = pko.linear(x, w)
        for _ in range(2):
            out.fill_(float("nan"))
            graph.replay()
            errs.append(_rel(out, ref))
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        dy = _rand(m, n)
        pko.linear(xg, wg).backward(dy)
        xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
        F.linear(xf, wf).backward(dy.float())
        errs += [_rel(xg.grad, xf.grad), _rel(wg.grad, wf.grad)]
        t_cublas, t_op = interleaved([lambda: F.linear(x, w), lambda: pko.linear(x, w)],
                                     _reps(2 * m * n * k))
        flops = 2 * m * n * k
        err = max(errs)
        details.append({"step": "split_op", "shape": [m, n, k], "kernel": kernel.name,
                        "rel_errs": errs, "cublas_tflops": flops / t_cublas / 1e12,
                        "op_tflops": flops / t_op / 1e12})
        print(f"{m}x{n}x{k}: {kernel.name}, errors {', '.join(f'{e:.1e}' for e in errs)}; "
              f"cuBLAS {flops / t_cublas / 1e12:.0f}, op {flops / t_op / 1e12:.0f} TFLOP/s",
              flush=True)
        rows.append(["split_op", f"{m}x{n}x{k}", f"{flops / t_cublas / 1e12:.0f}", "",
                     f"{flops / t_op / 1e12:.0f}", f"{t_cublas / t_op:.3f}", kernel.name,
                     "ok" if err < 2e-2 else "FAIL"])


def step_fence(rows, details):
    """The launch rule against the same build with every ring release fencing shared
    memory (before the TMA store's fence covered it), and cuBLAS, on the sweep's shapes."""
    _step_pair("fence", _fence_plans, _describe_fence, rows, details)


def _max_clusters() -> int:
    """cuOccupancyMaxActiveClusters of gemm_ws in clusters of two (4096³'s build)."""
    import ctypes
    import torch
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime import launch as L
    c = _cluster_plans(4096, 4096, 4096)["other"]
    x = _rand(4096, 4096)
    L.launch(gemm_ws, grid=gemm_ws_grid(c, TARGET), a=x, b=x, c=torch.empty_like(x), **c)
    fn, prog = next(e for k, (kern, e) in L._modules.items()
                    if kern is gemm_ws and e[1].cluster == 2)

    from pykittens.runtime.cuda import _LaunchConfig        # CUlaunchConfig, no attributes
    cfg = _LaunchConfig(132, 1, 1, prog.num_waves * prog.wave_size, 1, 1, prog.lds_bytes,
                        None, None, 0)
    out = ctypes.c_int(0)
    lib = ctypes.CDLL("libcuda.so.1")
    err = lib.cuOccupancyMaxActiveClusters(ctypes.byref(out), ctypes.c_void_p(int(fn.handle)),
                                           ctypes.byref(cfg))
    return out.value if err == 0 else -err


def _step_pair(step, plans_of, describe, rows, details):
    """The launch rule against another launch (plans_of(m, n, k): {"rule", "other"}) and
    cuBLAS on the sweep's shapes, medians of interleaved rounds."""
    ratios = {"rule": [], "other": []}
    for m, n, k in sweep_shapes():
        plans = plans_of(m, n, k)
        tf, err = _time_plans(plans, m, n, k)
        for name in plans:
            ratios[name].append(tf[name] / tf["cublas"])
        details.append({"step": step, "shape": [m, n, k], "tflops": tf, "rel_err": err,
                        "plans": plans})
        names = describe(plans)
        print(f"{m}x{n}x{k}: cuBLAS {tf['cublas']:.0f}, rule {tf['rule']:.0f}, other "
              f"{tf['other']:.0f} TFLOP/s ({names}), err {err:.1e}", flush=True)
        rows.append([step, f"{m}x{n}x{k}", f"{tf['cublas']:.0f}", f"{tf['rule']:.0f}",
                     f"{tf['other']:.0f}", f"{tf['rule'] / tf['cublas']:.3f} / "
                     f"{tf['other'] / tf['cublas']:.3f}", names,
                     "ok" if err < 1e-2 else "FAIL"])
    for name, r in ratios.items():
        if r:
            geo = math.exp(sum(map(math.log, r)) / len(r))
            rows.append([step, f"{name}: {len(r)} shapes", "", "", "",
                         f"geomean {geo:.3f}", f"min {min(r):.3f}", ""])


def interleaved(fns, reps, rounds=3) -> list[float]:
    """Median seconds of each of `fns` over `rounds` rounds that time each in turn, so the
    GPU's clock drift (temperature, power) falls on all of them alike."""
    import statistics
    from pykittens.tune import graph_time
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(graph_time(fn, reps))
    return [statistics.median(t) for t in times]


def _short(c) -> str:
    """A tuned choice in a few characters: its block order and width."""
    if not c:
        return "-"
    return f"{c['MAP']} BN{c['BN']}" + ("" if c.get("PERSISTENT", 1) else " per block")


def step_layouts(rows, details):
    """gemm_ws reading each operand as stored, against cuBLAS on the same product."""
    import torch
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.ops.matmul import ws_stored
    from pykittens.runtime.launch import launch
    for m, n, k in ((1000, 1528, 776),) + LAYOUT_SHAPES:
        flops, reps = 2 * m * n * k, _reps(2 * m * n * k)
        for layout in ("nt", "nn", "tn"):
            a, b = ws_stored(layout, m, k, n, lambda shape: _rand(*shape)).values()
            A = a if layout[0] == "n" else a.t()
            B = b.t() if layout[1] == "t" else b

            def cublas():
                return torch.matmul(A, B)
            ref = cublas()
            grid, consts = _plan(layout, m, n, k)
            c = torch.empty_like(ref)
            launch(gemm_ws, grid=grid, a=a, b=b, c=c, **consts)
            err = _rel(c, ref)
            t_cu, t_pk = interleaved(
                [cublas, lambda: launch(gemm_ws, grid=grid, a=a, b=b, c=c, **consts)], reps)
            row = dict(shape=[m, n, k], layout=layout, rel_err=err, consts=consts,
                       pk_tflops=flops / t_pk / 1e12, cublas_tflops=flops / t_cu / 1e12)
            details.append(row)
            print(f"{layout} {m}x{n}x{k}: gemm_ws {row['pk_tflops']:.0f}, cuBLAS "
                  f"{row['cublas_tflops']:.0f} TFLOP/s, err {err:.1e}", flush=True)
            rows.append([f"layout {layout}", f"{m}x{n}x{k}", f"{row['cublas_tflops']:.0f}",
                         f"{row['pk_tflops']:.0f}", "", f"{t_cu / t_pk:.3f}", "",
                         "ok" if err < 1e-2 else "FAIL"])


FP8_VARIANTS = {"promoted every K step": True, "promoted every 4": 4,
                "tensor-core accumulation": False}


def _fp8_plans(s):
    """(label, grid, plan) of each fp8 build timed: the launch rule's (promoting every K
    step: 128-wide blocks, a group in flight while the one before is added, in runs of
    gemm.PROMOTE_RUN steps), the same in runs of 2, 256-wide blocks promoting each
    128-column half after its group, promotion every 4 steps (128 wide), and the tensor
    cores' own accumulation (256 and 128 wide)."""
    plans = [(label, *_plan("nt", s, s, s, 1, promote=p)) for label, p in FP8_VARIANTS.items()]
    rule_grid, rule = plans[0][1:]
    _, fast_narrow = _plan("nt", s, s, s, 1, promote=False, bn=128)
    return plans + [
        ("promoted every K step, runs of 2", rule_grid,
         {**rule, BUILD: {"kernels.gemm.PROMOTE_RUN": 2}}),
        ("promoted every K step, 256 wide by halves", *_plan("nt", s, s, s, 1, promote=True,
                                                               bn=256)),
        ("tensor-core accumulation, 128 wide", rule_grid, fast_narrow)]


def step_fp8(rows, details):
    """e4m3 against torch._scaled_mm's default accumulation (use_fast_accum=False), bf16 out,
    unit scales: gemm_ws promoting to f32 every 1, 2 or 4 K steps, and with the tensor
    cores' own accumulation (against use_fast_accum=True)."""
    import torch
    from pykittens.runtime.launch import launch
    for s in FP8_SQUARES:
        flops, reps = 2 * s ** 3, _reps(2 * s ** 3) * 2
        a, b = (_rand(s, s).float().to(torch.float8_e4m3fn) for _ in range(2))
        one = torch.ones((), device="cuda")
        c = torch.empty(s, s, device="cuda", dtype=torch.bfloat16)
        ref = (a.double() @ b.double().t())
        plans = _fp8_plans(s)

        def peer(fast):
            return lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,
                                            use_fast_accum=fast)
        def ours(grid, plan):
            kernel, building = _kernel_of(plan)

            def call():
                with building():
                    launch(kernel, grid=grid, a=a, b=b, c=c, **_launch_of(plan)[0])
            return call
        fns = [peer(False), peer(True)] + [ours(grid, plan) for _, grid, plan in plans]
        errs = []
        for fn in fns:
            out = fn()
            errs.append(_rel(c if out is None else out, ref))
        times = interleaved(fns, reps)
        for (label, _, consts), t, err in zip(plans, times[2:], errs[2:]):
            fast = label.startswith("tensor")
            t_peer, e_peer = (times[1], errs[1]) if fast else (times[0], errs[0])
            row = dict(shape=[s] * 3, variant=label, pk_tflops=flops / t / 1e12,
                       scaled_mm_tflops=flops / t_peer / 1e12, fast_accum=fast,
                       rel_err=err, scaled_mm_rel_err=e_peer, consts=consts)
            details.append(row)
            rows.append([f"fp8 {label}", f"{s}³", f"{row['scaled_mm_tflops']:.0f}",
                         f"{row['pk_tflops']:.0f}", "", f"{t_peer / t:.3f}",
                         f"err {err:.1e} / {e_peer:.1e}", "ok" if err < 2e-2 else "FAIL"])


CANDIDATE_SHAPES = ((2048, 2048, 2048), (4096, 4096, 4096))
CANDIDATE_S = 60          # a candidate's launch taking longer than this: reported as a hang


def probed_candidates(m, n, k) -> list[dict]:
    """What step_candidates runs: every autotuner candidate of the product (the build that
    hung, gemm_ws now refuses: bench/litmus/gemm_hang.py)."""
    from pykittens.ops.matmul import gemm_ws_candidates
    return gemm_ws_candidates(TARGET, m, k, n, 2)


def step_candidates(rows, details):
    """Each candidate launched once in a child process with a time limit, checked against
    cuBLAS: which ones fault or hang (a hung kernel cannot be stopped, only its process)."""
    import json
    import subprocess
    for m, n, k in CANDIDATE_SHAPES:
        for i, c in enumerate(probed_candidates(m, n, k)):
            cmd = [sys.executable, __file__, "--one", json.dumps([m, n, k, i])]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=CANDIDATE_S)
                lines = r.stdout.strip().splitlines()
                got = json.loads(lines[-1]) if r.returncode == 0 and lines else \
                    {"error": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}
            except subprocess.TimeoutExpired:
                got = {"error": f"no result in {CANDIDATE_S} s (hung)"}
            details.append({"shape": [m, n, k], "consts": c, **got})
            ok = "rel_err" in got and got["rel_err"] < 1e-2
            rows.append(["candidate", f"{m}x{n}x{k}", "", "", "",
                         f"{got['rel_err']:.1e}" if "rel_err" in got else "",
                         _short(c) + (" TMA C" if c.get("TMA_STORE") else "") +
                         (" ping-pong" if c.get("PINGPONG") else ""),
                         "ok" if ok else f"{got.get('error', 'wrong')} FAIL"])


def run_one(spec: str) -> int:
    """Child of step_candidates: candidate i of (m, n, k) launched once, its error against
    cuBLAS printed as JSON."""
    import json
    import torch
    import torch.nn.functional as F
    from pykittens.kernels import gemm_ws_grid
    from pykittens.kernels.gemm import gemm_ws
    from pykittens.runtime.launch import launch
    m, n, k, i = json.loads(spec)
    c = probed_candidates(m, n, k)[i]
    x, w = _rand(m, k), _rand(n, k)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(gemm_ws, grid=gemm_ws_grid(c, TARGET), a=x, b=w, c=y, **c)
    torch.cuda.synchronize()
    print(json.dumps({"rel_err": _rel(y, F.linear(x, w))}))
    return 0


def main() -> int:
    import torch
    from pykittens.bench import run_steps
    env = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
           f"CUDA {torch.version.cuda}")
    header = ["step", "M x N x K", "peer TFLOP/s", "default", "tuned op", "ratio", "choice",
              "check"]
    return run_steps("gemm_sweep", {"candidates": step_candidates, "layouts": step_layouts,
                                    "sweep": step_sweep, "fp8": step_fp8,
                                    "store": step_store, "cluster": step_cluster,
                                    "early": step_early, "fence": step_fence,
                                    "stream": step_stream, "grid": step_grid,
                                    "skinny": step_skinny, "decode": step_decode,
                                    "decode_fp8": step_decode_fp8,
                                    "split_op": step_split_op}, env,
                     header=header)


if __name__ == "__main__":
    if "--prebuild" in sys.argv:
        sys.exit(prebuild([a for a in sys.argv[1:] if not a.startswith("--")]))
    if "--one" in sys.argv:
        sys.exit(run_one(sys.argv[sys.argv.index("--one") + 1]))
    sys.exit(main())
