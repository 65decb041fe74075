"""The host time of a replayed pykittens.ops call without its driver call: on any machine,
no GPU needed.

A replayed op call (pykittens.ops.replay) computes its signature, allocates its outputs,
writes their addresses into its launches' argument buffers (runtime.launch._Plan) and calls
the driver. On the H200's host the whole call takes 17–29 µs (docs/PERF.md), of which the
driver's cuLaunchKernel is a few; the rest is this Python path, which this script times on
CPU tensors standing in for GPU ones: each op is recorded and replayed as on the GPU, with
`_Plan`s made from the kernel's lowered parameters exactly as pk.launch makes them, and
the driver call (and tensor-map encoding, which replays find cached) replaced by a no-op C
call. So the figures are the Python path's, on this machine's CPU: compare them between
versions of pykittens on one machine, not with the H200's. Besides each replayed call, a
training step: the op's call on inputs that need gradients (the public op cannot replay
it; its custom ops' calls replay, ops.run.CustomOp) and its backward, through torch's
autograd (pk.launch's fast path takes every launch the replays do not).

    PYTHONPATH=. python3 bench/host_path.py [--calls N]

Writes $OUT/host_path.json where OUT is set; the table last."""
from __future__ import annotations

import ctypes
import functools
import sys

import torch

import pykittens.ops as pko
from pykittens.ir.abi import kernel_args
from pykittens.lang.kernel import const_key
from pykittens.bench import per_call_us
from pykittens.lower import lower
from pykittens.ops import replay
from pykittens.runtime import cuda
from pykittens.runtime import launch as launch_mod
from pykittens.runtime.args import bind_args, check_scalar

CALLS, ROUNDS = 2000, 7
TARGET = "sm_90a"
_NO_OP = ctypes.CDLL(None).memcmp          # memcmp(p, q, 0): a C call that does nothing


class _StandInFunction:
    """A loaded kernel's stand-in: a launch is a no-op C call with the argument buffer."""
    handle, module = 0, type("Module", (), {"device": 0})()

    def launches_early(self, *_):
        return False

    def launch_checked(self, grid, block, args, shared, stream):
        _NO_OP(args.extra, args.extra, None)


class _StandInTensorMap:
    """cuda.TensorMap without the driver: a map per address, kept (as replays find them)."""

    def __init__(self, t, desc, dtype):
        self._recent = {}

    def encode(self, address: int) -> bytes:
        return self._recent.setdefault(address, address.to_bytes(8, "little") * 16)


_programs: dict = {}


def stand_in_checked_launch(kernel, args, kwargs, grid, stream):
    """pk.launch's checked launch for CPU tensors: the _Plan it would make (the kernel
    lowered for sm_90a, its arguments packed by the ABI), launched on the stand-in
    function. pk.launch's own fast path (runtime.launch.launch_plan) keeps and reuses it,
    as on the GPU."""
    names = kernel.param_names
    bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    _, consts = bind_args(kernel, args, kwargs, what="pk.launch")   # with DT from the tensors
    key = (id(kernel), const_key(consts))
    prog = _programs.get(key)
    if prog is None:
        prog = _programs[key] = lower(kernel.specialize_for(TARGET, **consts), TARGET)
    kargs = kernel_args(prog.params, prog.tmaps)
    types = {p.name: p.type for p in prog.params}
    values = [cuda.tensor_value(a, bound[a.param]) if a.kind in ("ptr", "size", "stride")
              else bytes(128) if a.kind == "tmap"
              else check_scalar(bound[a.param], a.name, types[a.param].dtype) for a in kargs]
    plan = launch_mod._Plan(kernel, cuda.dims3(grid, "grid"), bound, prog.params,
                            function=_StandInFunction(),
                            block=(prog.num_waves * prog.wave_size, 1, 1),
                            shared=prog.lds_bytes, kargs=kargs, values=values,
                            buf=cuda.pack(kargs, values))
    # torch's current stream (on the GPU a partial of torch._C._cuda_getCurrentRawStream)
    plan.launcher.current_stream = functools.partial(int, 0)
    plan.launch(plan.values((), bound), stream)
    return plan


def _rand(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


# op -> the arguments a training step differentiates
TRAINED = {"layer_norm": (0, 2, 3), "rms_norm": (0, 2), "add_rms_norm": (0, 1, 2),
           "softmax": (0,), "rope": (0,), "linear": (0, 1), "attention": (0, 1, 2)}


def _cases() -> dict:
    """op -> (args, kwargs): the ops' tiny forward calls (as ops_bandwidth's host step:
    8 x 1024 bf16; attention a small causal call)."""
    m, n = 8, 1024
    angles = torch.arange(m)[:, None] * torch.arange(1, 65)[None, :] * 0.01
    return {
        "layer_norm": ((_rand(m, n), (n,), _rand(n), _rand(n), 1e-5), {}),
        "rms_norm": ((_rand(m, n), (n,), _rand(n), 1e-5), {}),
        "add_rms_norm": ((_rand(m, n), _rand(m, n), _rand(n), 1e-5), {}),
        "softmax": ((_rand(m, n), -1), {}),
        "rope": ((_rand(1, m, n // 128, 128), angles.cos(), angles.sin()), {}),
        "linear": ((_rand(m, n), _rand(n, n)), {}),
        # (small: its backward zeroes dQ's f32 sum, on the CPU a memset of all its bytes)
        "attention": (tuple(_rand(1, 64, 2, 64) for _ in range(3)), {"causal": True}),
    }


def _training_step(op, args, kwargs, name):
    """A call of `op` with TRAINED's arguments needing gradients, and its backward from a
    fixed gradient of each output: what a training step asks of the op (the gradients set
    to None first, as optimizers do, so that none is added up on the CPU)."""
    args = [a.clone().requires_grad_() if i in TRAINED[name] else a
            for i, a in enumerate(args)]
    out = op(*args, **kwargs)
    grads = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]

    def step():
        for i in TRAINED[name]:
            args[i].grad = None              # as optimizer.zero_grad(): no adding on the CPU
        outs = op(*args, **kwargs)
        torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
    return step


def measure(calls: int = CALLS, rounds: int = ROUNDS) -> list[dict]:
    """Each op's replayed call and its pieces, µs on this CPU (the module docstring)."""
    saved = replay.on_gpu, launch_mod._checked_launch, cuda.TensorMap
    cases = _cases()
    recorded = [dict(r) for r in replay.RECORDS]      # the public ops' and custom ops'
    plans = dict(launch_mod._plans)
    replay.on_gpu = lambda t: True
    launch_mod._checked_launch, cuda.TensorMap = stand_in_checked_launch, _StandInTensorMap
    try:
        out, warm = [], calls // 10
        for name, (args, kwargs) in cases.items():
            op = getattr(pko, name)
            for _ in range(3):                    # the first call, the recorded one, a replay
                op(*args, **kwargs)
            key, tensors, addresses = replay._signature(args, kwargs)
            entry = op.replay_calls.get(key)
            if type(entry) is not replay._Replay:
                raise RuntimeError(f"{name}: its call was not recorded for replay ({entry})")
            out.append({
                "op": name,
                "whole_us": per_call_us(lambda: op(*args, **kwargs), calls, rounds, warm),
                "signature_us": per_call_us(lambda: replay._signature(args, kwargs), calls,
                                            rounds, warm),
                "replay_us": per_call_us(lambda: entry(tensors, addresses), calls, rounds,
                                         warm),
                "training_step_us": per_call_us(_training_step(op, args, kwargs, name),
                                                max(1, calls // 10), rounds, warm)})
        return out
    finally:            # no replay or plan of a stand-in launch is kept
        replay.on_gpu, launch_mod._checked_launch, cuda.TensorMap = saved
        launch_mod._plans.clear()
        launch_mod._plans.update(plans)
        for now, before in zip(replay.RECORDS, recorded):
            now.clear()
            now.update(before)


def main(argv=None) -> int:
    import json
    import os
    argv = sys.argv[1:] if argv is None else argv
    calls = int(argv[argv.index("--calls") + 1]) if "--calls" in argv else CALLS
    from pykittens.bench import text_table
    results = measure(calls)
    env = {"python": sys.version.split()[0], "torch": torch.__version__,
           "cpu": _cpu_name(), "calls": calls, "rounds": ROUNDS}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "host_path.json"), "w") as f:
            json.dump({"env": env, "results": results}, f, indent=1)
    print(env)
    print(text_table([[r["op"], f"{r['whole_us']:.2f}", f"{r['signature_us']:.2f}",
                       f"{r['replay_us']:.2f}", f"{r['training_step_us']:.1f}"]
                      for r in results],
                     ["op", "replayed call µs", "its signature", "its replay (allocate, launch)",
                      "a training step (forward, backward) µs"]))
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
