"""Replaying cached op calls: the host-time fast path of `pykittens.ops`.

An eager op call on GPU tensors checks its arguments, picks a kernel's launch constants,
allocates its outputs and launches — 50 to 200 µs of Python per call, more than the kernel
itself at small shapes. Everything but the allocations and the launch depends only on the
call's *signature*: each tensor's dtype, shape, strides, device and address modulo 16, and
every other argument's value. So a `replayable` op records, on the second call with a
signature, what it did: each launch's pk.launch plan (runtime.launch._Plan) and, for each
of the kernel's tensor arguments, where it came from — an input (at a byte offset), an
output the op returned, a buffer the kernel writes whole (`kernel_output`), a buffer of
zeros kernels add into (`zeroed_buffer`: zeroed again on every call), a placeholder the
kernel never touches (kept), or a stream's workspace (`run.workspace`: kept, and the call
replayed on that stream only). Later calls with the signature
allocate the outputs and buffers and launch the plans with the new addresses; nothing
else runs.

A call is recorded only when the op's work is all of that: a kernel argument made by any
other torch operation (a `.contiguous()` copy, `y + bias`), an output or buffer that torch
writes into in place (its version counter moved), inputs sharing memory, an
output that is a view of another tensor, or a launch through anything but pk.launch's CUDA
path make the signature one that always takes the full path. So do tensors that need a
gradient (the custom ops under such a call replay on their own: ops.run.CustomOp),
tracing (torch.compile, dispatch modes), CPU tensors (the emulator) and tensor
subclasses. The first call with a signature is never recorded: it may compile or
autotune. PYKITTENS_REPLAY=0 turns replay off."""
from __future__ import annotations

import functools
import os
import threading

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode

from ..runtime.args import memory_span

ENABLED = os.environ.get("PYKITTENS_REPLAY", "1") != "0"
MAX_CALLS = 4096          # signatures kept per op (shapes that keep changing must not grow it)
_SEEN, _FULL = "seen", "full"         # first call done; the full path every time
RECORDS: list[dict] = []              # every replayable's signatures (replay_calls)


class _ThreadState(threading.local):
    """Each thread's recorder (None outside a recorded call): a class default, so reading
    it on every call is a plain attribute lookup (a threading.local's getattr default
    costs a caught AttributeError)."""
    recorder = None


_state = _ThreadState()


def on_gpu(t: torch.Tensor) -> bool:
    """Whether op kernels on t launch on a GPU (rather than run in the emulator)."""
    return not t.is_cpu


def current_stream(device) -> int:
    """The handle of the stream the device's work goes to now (0 off CUDA)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def replayable(fn):
    """An op whose eager calls on GPU tensors replay their launches (see the module)."""
    calls: dict = {}

    @functools.wraps(fn)
    def op(*args, **kwargs):
        if not ENABLED or _state.recorder is not None or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        key, tensors, addresses = _signature(args, kwargs)
        if key is None:
            return fn(*args, **kwargs)
        try:
            entry = calls.get(key)
        except TypeError:                         # an unhashable argument
            return fn(*args, **kwargs)
        if type(entry) is _Replay:
            out = entry(tensors, addresses)
            if out is not None:
                return out
            return fn(*args, **kwargs)            # overlapping inputs: the full path decides
        if entry is _FULL:
            return fn(*args, **kwargs)
        if entry is None:
            out = fn(*args, **kwargs)
            _remember(calls, key, _SEEN)
            return out
        recorder = _state.recorder = _Recorder(tensors)
        try:
            out = fn(*args, **kwargs)
        finally:
            _state.recorder = None
        _remember(calls, key, recorder.replay(out) or _FULL)
        return out

    op.replay_calls = calls                       # for tests: what each signature holds
    RECORDS.append(calls)
    return op


def _remember(calls: dict, key, entry) -> None:
    if len(calls) >= MAX_CALLS:
        calls.clear()
    calls[key] = entry


_SCALARS = (int, float, bool, str, type(None))
_SEQUENCES = (tuple, list, torch.Size)
_NO_SIGNATURE = None, None, None


def _signature(args, kwargs):
    """(key, the tensors in argument order, their addresses), or (None, None, None) for a
    call that takes the full path: a tensor that is not a plain GPU tensor or needs a
    gradient, an argument that is not a tensor, number, string, None or tuple of those, a
    dispatch mode active. (Every replayed call runs this: it is written for speed.)"""
    if _dispatch_mode() is not None:
        return _NO_SIGNATURE
    grad = torch.is_grad_enabled()
    key, tensors, addresses = [], [], []
    for v in (*args, *kwargs.values()) if kwargs else args:
        t = type(v)
        if t is torch.Tensor:
            device = v.get_device()              # -1 on the CPU: ask on_gpu only there
            if (grad and v.requires_grad) or device < 0 and not on_gpu(v):
                return _NO_SIGNATURE
            ptr = v.data_ptr()
            key.append((v.dtype, v.shape, v.stride(), device, ptr & 15))
            tensors.append(v)
            addresses.append(ptr)
        elif t in _SCALARS:
            key.append((t, v))
        elif t in _SEQUENCES:
            for x in v:                      # numbers only (a loop: cheaper than all())
                if type(x) is not int and type(x) is not float:
                    return _NO_SIGNATURE
            key.append((t, tuple(v)))
        else:
            return _NO_SIGNATURE
    if kwargs:
        key.append(tuple(kwargs))
    return tuple(key), tensors, addresses


def recorder():
    """The recorder of the op call running on this thread, or None."""
    return _state.recorder


def kernel_output(like: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """A new tensor that a kernel of this op writes whole before anything reads it (an
    output, or statistics the op keeps to itself). A replayed call allocates it afresh, or,
    where it is not returned and only one launch touches it (so nothing ever reads what
    that launch wrote), passes the recorded one again: concurrent calls then write the
    same unread bytes. A kernel that reads such a buffer back must not get one."""
    t = like.new_empty(shape, dtype=dtype)
    rec = recorder()
    if rec is not None:
        rec.buffers.append(t)
    return t


def zeroed_buffer(like: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """A new tensor of zeros that the op's kernels add into (and pass on to each other): a
    replayed call makes it again the same way, zeroed, on every call."""
    t = like.new_zeros(shape, dtype=dtype)
    rec = recorder()
    if rec is not None:
        rec.buffers.append(t)
        rec.zeroed.add(_storage(t))
    return t


class _Recorder:
    """What one op call did: its inputs, buffers, placeholders and launches."""

    def __init__(self, tensors):
        self.inputs = tensors
        self.buffers, self.placeholders, self.launches = [], [], []
        self.workspaces, self.zeroed = [], set()

    def launched(self, plan, args: dict) -> None:
        """A kernel launched (plan: pk.launch's, or None where nothing was launched)."""
        self.launches.append((plan, args))

    def replay(self, out):
        """The _Replay of this call, or None where it is not one (module docstring)."""
        outs = list(out) if type(out) in (tuple, list) else [out]
        if not self.launches or not all(type(o) is torch.Tensor for o in outs):
            return None
        ins = self.inputs
        storages = [_storage(t) for t in ins + outs]
        if len(set(storages)) != len(storages):     # inputs shared, or an output an input
            return None
        if not all(map(_whole, outs)):               # each output a whole new tensor
            return None
        if any(_storage(o) in self.zeroed for o in outs):
            return None                              # (replays allocate outputs unzeroed)
        # every output and buffer is made fresh (version 0); one that torch then wrote
        # into in place (`delta -= dlse`) holds work a replay, which only allocates and
        # launches, would not repeat
        if any(t._version for t in outs + self.buffers):
            return None
        # buffers that are not outputs: one that a single launch touches is written and
        # never read (its values are never seen), so the recorded one is kept and passed
        # again; one that launches pass on to each other is allocated on every call
        bufs = [b for b in self.buffers if _storage(b) not in storages]
        uses = {_storage(b): 0 for b in bufs}
        for _, args in self.launches:
            for s in {_storage(v) for v in args.values() if type(v) is torch.Tensor}:
                if s in uses:
                    uses[s] += 1
        zeroed = self.zeroed                # made afresh, zeroed, on every call
        keep = self.placeholders + self.workspaces + \
            [b for b in bufs if uses[_storage(b)] <= 1 and _storage(b) not in zeroed]
        bufs = [b for b in bufs if uses[_storage(b)] > 1 or _storage(b) in zeroed]
        if not all(map(_whole, bufs)):
            return None
        bases = ins + outs + bufs
        where = {s: i for i, s in enumerate(_storage(t) for t in bases)}
        kept = {_storage(p) for p in keep}
        launches = []
        for plan, args in self.launches:
            if plan is None or plan.hip_entry is not None or plan.peers:
                return None
            vals = plan.values((), args)
            template, addressed = list(vals), []
            for i, v in enumerate(vals):
                if type(v) is not torch.Tensor:
                    continue                               # a scalar: the same every call
                s = _storage(v)
                if s in kept:
                    template[i] = v.data_ptr()
                    continue
                if s not in where:
                    return None                            # made by another torch op
                base = bases[where[s]]
                # an address (the plan re-encodes a tensor map of the same geometry there)
                addressed.append((i, where[s], v.data_ptr() - base.data_ptr()))
            launches.append((plan, template, addressed))
        stream = current_stream((ins + outs)[0].device) if self.workspaces else None
        return _Replay([_span_bytes(t) for t in ins], [_geometry(o) for o in outs],
                       [(*_geometry(b), _storage(b) in zeroed) for b in bufs], launches,
                       type(out), keep, stream)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _whole(t: torch.Tensor) -> bool:
    """Whether t is all of its storage (so a tensor of its geometry can stand in for it)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == _span_bytes(t)


def _span_bytes(t: torch.Tensor) -> int:
    span = memory_span(t)
    return 0 if span is None else span[1] - span[0]


def _geometry(t: torch.Tensor):
    return tuple(t.shape), tuple(t.stride()), t.dtype


class _Replay:
    """A recorded op call, made again on new tensors of the same signature."""

    def __init__(self, spans, outs, bufs, launches, kind, keep, stream=None):
        self.spans, self.outs, self.bufs = spans, outs, bufs
        self.launches, self.kind = launches, kind           # kind: the op's result type
        self.keep = keep                      # the tensors whose addresses it passes as is
        self.stream = stream                  # the stream whose workspaces it passes

    def __call__(self, tensors, addresses):
        """The op's result on `tensors` (its inputs in argument order, at `addresses`), or
        None where inputs overlap in memory (the full path's checks decide whether that is
        allowed) or the recorded call's workspaces belong to another stream. Launches
        are checked for nothing else: their scalars are the recorded call's, and the
        outputs and buffers are new (pk.launch's plan checks the rest for the signature).
        (Every replayed call runs this: it is written for speed.)"""
        if _overlapping(addresses, self.spans):
            return None
        device = tensors[0].device
        if self.stream is not None and current_stream(device) != self.stream:
            return None                           # another stream's workspaces
        empty = torch.empty_strided
        outs = [empty(s, st, dtype=dt, device=device) for s, st, dt in self.outs]
        ptrs = addresses + [t.data_ptr() for t in outs]
        if self.bufs:                     # (held here until their launches are enqueued)
            bufs = [empty(s, st, dtype=dt, device=device) for s, st, dt, _ in self.bufs]
            for b, (*_, zeroed) in zip(bufs, self.bufs):
                if zeroed:
                    b.zero_()
            ptrs += [t.data_ptr() for t in bufs]
        for plan, template, addressed in self.launches:
            vals = list(template)
            for i, b, nbytes in addressed:
                vals[i] = ptrs[b] + nbytes
            plan.launch(vals, None, True)
        return outs[0] if self.kind is torch.Tensor else self.kind(outs)


def _overlapping(addresses, spans) -> bool:
    """Whether any two tensors (at `addresses`, each `spans` bytes long) share memory. Pair
    by pair: ops pass a few tensors, for which that is cheaper than sorting."""
    n = len(addresses)
    for i in range(n - 1):
        a, s = addresses[i], spans[i]
        if s:
            for j in range(i + 1, n):
                b, m = addresses[j], spans[j]
                if m and a < b + m and b < a + s:
                    return True
    return False
