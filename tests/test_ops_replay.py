"""ops' replay of cached calls (pykittens.ops.replay) on CPU tensors standing in for GPU
ones: `run`'s launches go to a stand-in plan that runs the kernel in the emulator on the
memory at the addresses it is handed, so a replayed call is right only if every kernel
argument's address (input, output, buffer, placeholder, offset) is. Replayed calls must
give what the full path gives for the same inputs, skip the op's body, and never be made
for signatures whose calls do more than allocate and launch."""
import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pykittens as pk  # noqa: E402
import pykittens.ops as pko  # noqa: E402
from pykittens.ops import replay  # noqa: E402
from pykittens.ops import run as run_mod  # noqa: E402
from pykittens.runtime import launch as launch_mod  # noqa: E402
from pykittens.runtime.args import ArgumentError  # noqa: E402


def at_address(ptr: int, shape, stride, dtype) -> torch.Tensor:
    """The tensor of this geometry at a CPU address (it aliases that memory)."""
    size = torch.empty((), dtype=dtype).element_size()
    span = (sum((d - 1) * s for d, s in zip(shape, stride)) + 1) * size
    raw = (ctypes.c_ubyte * span).from_address(ptr)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).as_strided(shape, stride)


class EmulatedPlan:
    """A launch plan whose launch emulates the kernel on the memory its arguments name:
    tensors given by address (as replay gives them, tensor-mapped ones too: the plan
    re-encodes their maps) or as tensors (the first, planning call)."""

    def __init__(self, kernel, grid, consts, args, log):
        self.kernel, self.grid, self.consts, self.log = kernel, grid, consts, log
        self.kernel_names = kernel.param_names
        self.peers, self.hip_entry = [], None
        self.geometry = {n: (tuple(v.shape), tuple(v.stride()), v.dtype)
                         for n, v in args.items() if isinstance(v, torch.Tensor)}

    def values(self, args, kwargs):
        return list(args) + [kwargs[n] for n in self.kernel_names[len(args):]]

    def launch(self, vals, stream, addresses=False):
        self.log.append(("launch", self.kernel.name))
        args = {}
        for name, v in zip(self.kernel_names, vals):
            if name in self.geometry:
                shape, stride, dtype = self.geometry[name]
                args[name] = at_address(v if type(v) is int else v.data_ptr(), shape, stride,
                                        dtype)
            else:
                args[name] = v
        got = pk.emulate(self.kernel, grid=self.grid, target="sm_90a", **args, **self.consts)
        for name in self.geometry:
            args[name].copy_(run_mod.from_numpy(got[name], args[name].dtype))


@pytest.fixture
def gpu_like(monkeypatch):
    """CPU tensors count as GPU tensors; launches go to EmulatedPlans. Returns the log of
    ('plan', kernel) (a launch through run, the op's body running) and ('launch', kernel)
    entries."""
    log = []

    def launch_plan(kernel, *args, grid, stream=None, **kwargs):
        names = kernel.param_names
        plan = EmulatedPlan(kernel, grid, {k: v for k, v in kwargs.items() if k not in names},
                            {n: kwargs[n] for n in names}, log)
        log.append(("plan", kernel.name))
        plan.launch(plan.values((), kwargs), stream)
        return plan

    monkeypatch.setattr(replay, "on_gpu", lambda t: True)
    monkeypatch.setattr(launch_mod, "launch_plan", launch_plan)
    return log


def _rand(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _tables(rows, half):
    angles = torch.arange(rows)[:, None] * torch.arange(1, half + 1)[None, :] * 0.01
    return angles.cos(), angles.sin()


# op, inputs(seed) -> (args, kwargs)
CASES = {
    "rms_norm": (pko.rms_norm, lambda s: ((_rand(3, 5, 64, seed=s), (64,),
                                           _rand(64, seed=s + 9)), {"eps": 1e-5})),
    "rms_norm of a slice": (pko.rms_norm, lambda s: ((_rand(9, 64, seed=s)[1:], (64,),
                                                     _rand(80, seed=s + 9)[16:]), {})),
    "rms_norm no weight": (pko.rms_norm, lambda s: ((_rand(8, 64, seed=s), (64,)), {})),
    "add_rms_norm": (pko.add_rms_norm, lambda s: ((_rand(8, 64, seed=s), _rand(8, 64, seed=s + 1),
                                                   _rand(64, seed=s + 2)), {})),
    "layer_norm f32": (pko.layer_norm, lambda s: ((_rand(8, 96, dtype=torch.float32, seed=s),
                                                   (96,), _rand(96, dtype=torch.float32),
                                                   _rand(96, dtype=torch.float32)), {})),
    "softmax": (pko.softmax, lambda s: ((_rand(2, 4, 128, seed=s),), {"dim": -1})),
    "rope": (pko.rope, lambda s: ((_rand(1, 8, 2, 64, seed=s), *_tables(8, 32)), {})),
    "linear": (pko.linear, lambda s: ((_rand(2, 40, 64, seed=s), _rand(48, 64, seed=s + 5)),
                                      {})),
    "matmul w.t()": (pko.matmul, lambda s: ((_rand(40, 64, seed=s),
                                             _rand(48, 64, seed=s + 5).t()), {})),
    "attention": (pko.attention, lambda s: ((_rand(1, 80, 2, 64, seed=s),
                                             _rand(1, 72, 1, 64, seed=s + 1),
                                             _rand(1, 72, 1, 64, seed=s + 2)),
                                            {"causal": True})),
    "scaled_dot_product_attention": (
        pko.scaled_dot_product_attention,
        lambda s: ((_rand(1, 2, 48, 64, seed=s), _rand(1, 1, 48, 64, seed=s + 1),
                    _rand(1, 1, 48, 64, seed=s + 2)), {"is_causal": True, "enable_gqa": True})),
    "attention with lse": (pko.attention, lambda s: ((_rand(1, 64, 2, 64, seed=s),
                                                      _rand(1, 64, 2, 64, seed=s + 1),
                                                      _rand(1, 64, 2, 64, seed=s + 2)),
                                                     {"return_lse": True})),
}


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_call_gives_the_full_paths_result(gpu_like, name):
    op, inputs = CASES[name]
    op.replay_calls.clear()
    for seed in (1, 2):                              # the first call, then the recorded one
        op(*inputs(seed)[0], **inputs(seed)[1])
    (entry,) = op.replay_calls.values()
    assert type(entry) is replay._Replay, name
    args, kwargs = inputs(3)
    gpu_like.clear()
    got = op(*args, **kwargs)
    assert gpu_like and all(kind == "launch" for kind, _ in gpu_like), \
        f"{name}: the op's body ran on a replayed call: {gpu_like}"
    want = op.__wrapped__(*args, **kwargs)           # the full path on the same inputs
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
        assert torch.equal(g, w), name
    # outputs are new tensors on every call, not the recorded call's
    assert all(g.data_ptr() != w.data_ptr() for g, w in zip(_flat(got), _flat(op(*args,
                                                                                  **kwargs))))


def _entry_after_two_calls(op, *args, **kwargs):
    op.replay_calls.clear()
    outs = [op(*args, **kwargs) for _ in range(2)]
    return list(op.replay_calls.values()), outs


def test_calls_doing_more_than_launching_always_take_the_full_path(gpu_like):
    x, w = _rand(8, 64), _rand(64)
    # inputs sharing memory: which one a kernel argument came from is ambiguous
    entries, outs = _entry_after_two_calls(pko.add_rms_norm, x, x, w)
    assert entries == [replay._FULL]
    want = pko.add_rms_norm.__wrapped__(x, x.clone(), w)
    assert all(torch.equal(a, b) for a, b in zip(outs[1], want))
    # the bias added by torch after the kernel: the kernel's output is not the result
    entries, _ = _entry_after_two_calls(pko.linear, _rand(40, 64), _rand(48, 64), _rand(48))
    assert entries == [replay._FULL]
    # positions converted by torch (a new tensor the kernel reads)
    x4 = _rand(1, 8, 2, 64)
    cos, sin = _tables(8, 32)
    entries, _ = _entry_after_two_calls(pko.rope, x4, cos, sin,
                                        positions=torch.arange(8))
    assert entries == [replay._FULL]


def test_calls_never_recorded(gpu_like, monkeypatch):
    x, w = _rand(8, 64), _rand(64)
    xg = x.clone().requires_grad_()
    entries, _ = _entry_after_two_calls(pko.rms_norm, xg, (64,), w)
    assert entries == []                              # a gradient needed: autograd's path
    with torch.no_grad():
        entries, _ = _entry_after_two_calls(pko.rms_norm, xg, (64,), w)
    assert len(entries) == 1 and type(entries[0]) is replay._Replay
    entries, _ = _entry_after_two_calls(pko.rms_norm, x, [64], w, eps=np.float32(1e-5))
    assert entries == []                              # a numpy scalar: not a key
    monkeypatch.setattr(replay, "ENABLED", False)
    entries, _ = _entry_after_two_calls(pko.rms_norm, x, (64,), w)
    assert entries == []


def test_each_signature_its_own_replay(gpu_like):
    op = pko.rms_norm
    op.replay_calls.clear()
    x, w = _rand(8, 64), _rand(64)
    for _ in range(2):
        op(x, (64,), w, 1e-5)
        op(x, (64,), w, 1e-6)                          # eps: a value in the key
        op(x[:, :32], (32,), w[:32], 1e-5)             # other shape and strides
        op(x.float(), (64,), w.float(), 1e-5)          # other dtype
    assert len(op.replay_calls) == 4
    assert all(type(e) is replay._Replay for e in op.replay_calls.values())
    got = op(x, (64,), w, 1e-6)
    assert torch.equal(got, op.__wrapped__(x, (64,), w, 1e-6))


def test_inputs_that_overlap_take_the_full_path(gpu_like):
    """A replay checks only what the signature does not fix: whether inputs share memory
    (the full path decides whether that is allowed: pk.launch refuses views that overlap
    without being the same)."""
    op = pko.add_rms_norm
    op.replay_calls.clear()
    x, r, w = _rand(8, 64), _rand(8, 64, seed=1), _rand(64)
    op(x, r, w)
    op(x, r, w)
    (entry,) = op.replay_calls.values()
    assert type(entry) is replay._Replay
    big = _rand(12, 64, seed=2)
    a, b = big[:8], big[4:]                          # same signature, rows 4..7 shared
    gpu_like.clear()
    with pytest.raises(ArgumentError, match="overlap in memory"):
        op(a, b, w)                                  # the full path's check, its message
    assert ("plan", "add_rmsnorm") in gpu_like
    got = op(a, b.clone(), w)                        # apart again: replayed
    assert torch.equal(got[0], op.__wrapped__(a, b.clone(), w)[0])


def test_overlap_check_pair_by_pair():
    """_overlapping finds a shared byte between any two tensors, not only neighbours;
    ranges that only touch, and tensors with no bytes, share nothing."""
    f = replay._overlapping
    assert not f([0, 100, 200], [100, 100, 100])              # touching end to start
    assert f([0, 100, 199], [100, 100, 100])                  # 1 and 2 share byte 199
    assert f([300, 0, 250], [100, 100, 100])                  # 0 and 2, not adjacent
    assert f([0, 50], [100, 10])                              # one inside the other
    assert not f([0, 50, 60], [0, 100, 0])                    # empty tensors share nothing
    assert not f([5], [100]) and not f([], [])


def test_signatures_kept_are_bounded(gpu_like, monkeypatch):
    monkeypatch.setattr(replay, "MAX_CALLS", 3)
    op = pko.softmax
    op.replay_calls.clear()
    for n in range(16, 16 * 6, 16):
        op(_rand(2, n))
    assert len(op.replay_calls) <= 3


def test_a_split_k_call_replays_on_its_own_streams_workspace(gpu_like, monkeypatch):
    """linear through gemm_sk (split-K; its rule's threshold lowered so the emulator's
    shape splits) keeps its partial sums and flags in a workspace of the stream: replayed
    calls pass the same workspace and give the full path's result, and a call on another
    stream takes the full path (its own workspace)."""
    import sys
    import pykittens.kernels as K
    M = sys.modules["pykittens.ops.matmul"]
    monkeypatch.setattr(K, "SPLIT_K_MIN_STEPS", 0)
    monkeypatch.setattr(run_mod, "_WORKSPACES", {})
    M._plan.cache_clear()
    try:
        x, w = _rand(128, 256), _rand(128, 256, seed=1)
        entries, _ = _entry_after_two_calls(pko.linear, x, w)
        (entry,) = entries
        assert type(entry) is replay._Replay and entry.stream == 0
        assert any(launched == ("plan", "gemm_sk") for launched in gpu_like)
        (flags,) = [v for k, v in run_mod._WORKSPACES.items() if k[2] == "gemm_sk.flags"]
        x2 = _rand(128, 256, seed=2)
        gpu_like.clear()
        got = pko.linear(x2, w)
        assert gpu_like == [("launch", "gemm_sk")]
        assert torch.equal(got, pko.linear.__wrapped__(x2, w)) and not flags.any()
        monkeypatch.setattr(replay, "current_stream", lambda device: 7)
        gpu_like.clear()
        assert torch.equal(pko.linear(x2, w), got)
        assert ("plan", "gemm_sk") in gpu_like                   # the full path ran
        assert len([k for k in run_mod._WORKSPACES if k[1] == 7]) == 2
    finally:
        M._plan.cache_clear()


def test_host_path_bench_replays_every_op_through_real_plans():
    """bench/host_path.py times each op's replayed call on CPU tensors with pk.launch's own
    _Plans (a stand-in driver call): every op's call must be recorded and replayed there,
    and the bench restores what it stood in for, keeping none of its replays."""
    from conftest import bench_script
    from pykittens.runtime import cuda
    host_path = bench_script("host_path")
    saved = replay.on_gpu, launch_mod._checked_launch, cuda.TensorMap
    before = [dict(r) for r in replay.RECORDS]         # public and custom ops alike
    plans = dict(launch_mod._plans)
    results = host_path.measure(calls=3, rounds=1)
    assert [r["op"] for r in results] == list(host_path._cases())
    assert all(r[k] > 0 for r in results for k in ("whole_us", "signature_us", "replay_us"))
    assert (replay.on_gpu, launch_mod._checked_launch, cuda.TensorMap) == saved
    assert replay.RECORDS == before
    assert launch_mod._plans == plans


# case -> the arguments that need gradients, and the kernels whose launches still run their
# op's body on every step
TRAINED = {"rms_norm": ((0, 2), ()), "add_rms_norm": ((0, 1, 2), ()),
           "layer_norm f32": ((0, 2, 3), ()), "softmax": ((0,), ()), "rope": ((0,), ()),
           "matmul w.t()": ((0, 1), ()), "attention": ((0, 1, 2), ()),
           # the LSE's gradient is subtracted from delta by torch: that backward is not
           # recorded, and runs its body
           "attention with lse": ((0, 1, 2), ("attention_bwd_prep", "attention_bwd",
                                              "attention_bwd_dq_finish"))}


@pytest.mark.parametrize("name", list(TRAINED))
def test_training_steps_replay_their_custom_ops(gpu_like, monkeypatch, name):
    """Inputs that need gradients keep the public op from replaying, but its custom ops'
    calls replay, forward and backward (ops.run.CustomOp.eager): a third training step on
    new inputs of the same signature runs no op body (TRAINED names the exceptions), and
    gives the outputs and gradients the full path (replay off) gives on the same inputs."""
    op, inputs = CASES[name]
    trained, still_planned = TRAINED[name]

    def step(seed):
        args, kwargs = inputs(seed)
        args = [a.clone().requires_grad_() if i in trained else a for i, a in enumerate(args)]
        outs = _flat(op(*args, **kwargs))
        g = torch.Generator().manual_seed(11)
        sum(((o.float() * torch.randn(o.shape, generator=g)).sum() for o in outs)
            ).backward()
        return [o.detach() for o in outs] + [args[i].grad for i in trained]

    for seed in (1, 2):                  # the first calls, then the recorded ones
        step(seed)
    gpu_like.clear()
    got = step(3)
    bodies = [k for kind, k in gpu_like if kind == "plan"]
    assert gpu_like and bodies == list(still_planned), \
        f"{name}: op bodies ran on the third step: {bodies}"
    monkeypatch.setattr(replay, "ENABLED", False)
    want = step(3)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), name


def test_custom_ops_whose_outputs_torch_zeroes_are_not_replayed(gpu_like):
    """The packed-batch attention's custom ops zero their outputs with torch (rows outside
    every sequence stay 0), which a replay, allocating outputs afresh, would not: they run
    their bodies on every call, training steps included."""
    import importlib
    varlen = importlib.import_module("pykittens.ops.attention_varlen")   # the module
    cu = torch.tensor([0, 24, 40], dtype=torch.int32)
    for seed in (1, 2, 3):
        q, k, v = (_rand(48, 2, 64, seed=seed + i).requires_grad_() for i in range(3))
        gpu_like.clear()
        pko.attention_varlen(q, k, v, cu, cu, 24, 24).float().sum().backward()
    assert ("plan", "attention_fwd_varlen") in gpu_like
    assert all(not hasattr(op.eager, "replay_calls") for op in (varlen._fwd, varlen._bwd))


def test_fused_norm_backward_replays_on_its_streams_scratch(gpu_like, monkeypatch):
    """With the column sums fused into the walk (rows.FUSED_SUMS), the walk writes and
    reads back its partial rows in one launch: they live in the stream's scratch
    (run.workspace), so training steps still replay, and give the full path's gradients."""
    from pykittens.kernels import rows as row_kernels
    monkeypatch.setattr(row_kernels, "FUSED_SUMS", True)
    m, n = 10, 4096                              # a staged plan: PROGRAMS workgroups an SM

    def step(seed):
        x, w = (t.requires_grad_() for t in (_rand(m, n, seed=seed), _rand(n, seed=seed + 1)))
        y = pko.rms_norm(x, (n,), w, 1e-6)
        y.float().mul(torch.randn(m, n, generator=torch.Generator().manual_seed(3))).sum() \
            .backward()
        return [y.detach(), x.grad, w.grad]

    for seed in (1, 2):
        step(seed)
    gpu_like.clear()
    got = step(3)
    assert ("launch", "rmsnorm_bwd_fused") in gpu_like
    assert not [k for kind, k in gpu_like if kind == "plan"]
    monkeypatch.setattr(replay, "ENABLED", False)
    assert all(torch.equal(a, b) for a, b in zip(got, step(3)))
