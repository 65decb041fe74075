"""What every op shares: argument checks whose messages name the op, the argument and the
fix; and `run`, which runs a library kernel where its tensors are — launched on their GPU,
or in the emulator for CPU tensors (the same schedule the GPU would get, for
EMULATE_TARGET)."""
from __future__ import annotations

import os

import numpy as np
import torch

from . import replay
from .replay import _dispatch_mode
from .replay import (kernel_output, recorder, replayable,  # noqa: F401 (the ops' API)
                     zeroed_buffer)

# the kernel schedule CPU tensors are emulated with (any pykittens target)
EMULATE_TARGET = os.environ.get("PYKITTENS_EMULATE_TARGET", "sm_90a")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)     # the row kernels' element types
HALVES = (torch.bfloat16, torch.float16)                    # the matrix units' operand types


class CustomOp:
    """A torch operator: `torch.library.custom_op(name)` over `fn` (what torch.compile and
    other tracers see, with the fake that register_fake gives it, and the autograd formula
    of register_autograd), and an eager path around it. A call outside compilation on
    plain tensors, with no dispatch mode active, runs `fn` directly, through an
    autograd.Function with the same formula where an input requires a gradient: the same
    kernels and results without the custom op's dispatch and alias checks (37 µs of host
    time per rms_norm call on the H200's host, docs/PERF.md). `fn` is replayable there
    (`eager`): a training step's calls, whose public ops cannot replay (their inputs need
    gradients), replay their custom ops' launches, forward and backward."""

    def __init__(self, name: str, fn, replay: bool = True):
        self.name, self.fn = name, fn
        self.op = torch.library.custom_op(name, mutates_args=())(fn)
        # eager calls, replayed where they can be (ops.replay): under autograd too, where
        # the public op's own replay cannot run (its inputs need gradients). `replay`
        # False for a body whose results a replay would not make (outputs zeroed by torch)
        self.eager = replayable(fn) if replay else fn
        self.function = None

    def register_fake(self, fake):
        return self.op.register_fake(fake)

    def register_autograd(self, backward, setup_context):
        self.op.register_autograd(backward, setup_context=setup_context)
        eager = self.eager

        def forward(ctx, *args):
            out = eager(*args)
            setup_context(ctx, args, out)
            return out

        self.function = type(self.name.replace("::", "_"), (torch.autograd.Function,), {
            "forward": staticmethod(forward),
            "backward": staticmethod(backward)})

    def __call__(self, *args):
        if not _eager(args):
            return self.op(*args)
        if self.function is not None and torch.is_grad_enabled() and any(
                type(a) is torch.Tensor and a.requires_grad for a in args):
            return self.function.apply(*args)
        return self.eager(*args)


def _eager(args) -> bool:
    """Outside torch.compile / export, no dispatch mode active, plain tensors only."""
    if torch.compiler.is_compiling() or _dispatch_mode() is not None:
        return False
    return all(type(a) is torch.Tensor for a in args if isinstance(a, torch.Tensor))


def custom_op(name: str, replay: bool = True):
    """Decorator: the CustomOp `name` over the function (`replay`: CustomOp's)."""
    return lambda fn: CustomOp(name, fn, replay)


def _names(dtypes) -> str:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def check_tensor(op: str, name: str, t, dtypes=FLOATS, dims=None) -> None:
    """t is a tensor of one of `dtypes`, with `dims` dims (an int or a (min, max) range),
    and unit stride in its last dim (the kernels read rows with vector accesses)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} is {t.dtype}; the kernels take {_names(dtypes)} "
                        f"(convert with .to(torch.{str(dtypes[0]).removeprefix('torch.')}))")
    lo, hi = (dims, dims) if isinstance(dims, int) else (dims or (1, 64))
    if not lo <= t.dim() <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise ValueError(f"{op}: {name} must have {want} dims, got {t.dim()} "
                         f"{tuple(t.shape)}")
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} needs a unit stride in its last dim (it has "
                         f"{t.stride(-1)}); pass {name}.contiguous()")


def check_same(op: str, **tensors) -> None:
    """The tensors given (None skipped) share one device and one dtype."""
    given = {k: v for k, v in tensors.items() if v is not None}
    devices = {str(v.device) for v in given.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {v.device}" for k, v in given.items())
        raise ValueError(f"{op}: {where}; put them on one device")
    dtypes = {v.dtype for v in given.values()}
    if len(dtypes) > 1:
        (first, t0), *rest = given.items()
        other = next(k for k, v in rest if v.dtype != t0.dtype)
        raise TypeError(f"{op}: {first} is {t0.dtype} but {other} is {given[other].dtype}; "
                        f"convert with {other}.to({first}.dtype)")


def target_of(t: torch.Tensor) -> str:
    """The pykittens target that runs kernels on t's device (CPU: the emulated one)."""
    if t.device.type == "cpu":
        return EMULATE_TARGET
    if t.device.type != "cuda":
        raise ValueError(f"tensors on {t.device} are not supported: pykittens runs on CUDA "
                         "(or ROCm) GPUs, and CPU tensors in its emulator")
    from ..runtime.launch import gpu_target
    return gpu_target(t.device.index or 0)


def run(kernel, args: dict, grid, consts: dict, outputs=()) -> None:
    """Run `kernel` on the tensors of `args` (by parameter name): launched on their GPU, or
    emulated for CPU tensors with the results copied into the `outputs` tensors."""
    first = next(v for v in args.values() if isinstance(v, torch.Tensor))
    if replay.on_gpu(first):
        from ..runtime.launch import launch_plan
        plan = launch_plan(kernel, grid=grid, **args, **consts)
        rec = recorder()
        if rec is not None:
            rec.launched(plan, args)
        return
    from .. import emulate
    got = emulate(kernel, grid=grid, target=EMULATE_TARGET, **args, **consts)
    for name in outputs:
        args[name].copy_(from_numpy(got[name], args[name].dtype))


_WORKSPACES: dict = {}


def workspace(like: torch.Tensor, name: str, shape, dtype, zeroed: bool = True
              ) -> torch.Tensor:
    """A scratch tensor of `shape` on like's device that the kernel leaves as it found it:
    zeroed (`zeroed`: flags it raises and lowers again), or whose every element it writes
    before reading it (a partial sum handed between workgroups). Kept per device, stream
    and `name`, grown as needed, so calls reuse it without a memset; launches on one stream
    follow each other, so they never share it at once. A CUDA graph capture, and CPU
    tensors, get a new one (zeroed ones by a memset the capture records)."""
    n = int(np.prod(shape))
    if not replay.on_gpu(like) or \
            like.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype,
                                                         device=like.device)
    key = (like.device, replay.current_stream(like.device), name, dtype)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < n:
        buf = _WORKSPACES[key] = torch.zeros(max(n, 1), dtype=dtype, device=like.device)
    t = buf[:n].view(shape)
    rec = recorder()
    if rec is not None:
        rec.workspaces.append(t)
    return t


def placeholder(like: torch.Tensor, dims: int, dtype=None) -> torch.Tensor:
    """A tensor for a kernel parameter the chosen constants leave unread (an absent weight,
    a partial sum not asked for); 16-element rows keep the aligned build."""
    t = like.new_empty((1,) * (dims - 1) + (16,), dtype=dtype or like.dtype)
    rec = recorder()
    if rec is not None:
        rec.placeholders.append(t)
    return t


def to_numpy(t):
    """A CPU tensor as a numpy array of the same values (bf16 as ml_dtypes.bfloat16)."""
    import ml_dtypes
    t = t.detach().contiguous()
    if t.dtype in (torch.float32, torch.int32):
        return t.numpy()
    np_dt = ml_dtypes.bfloat16 if t.dtype == torch.bfloat16 else np.float16
    return t.view(torch.int16).numpy().view(np_dt)


def from_numpy(a, dtype):
    if a.dtype in (np.float32, np.int32):
        return torch.from_numpy(a.copy()).to(dtype)
    return torch.from_numpy(a.view(np.int16).copy()).view(dtype)
