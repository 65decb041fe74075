"""The tracing context: where ops go while a kernel function runs, and whose line they carry."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

from ..ir.errors import KernelError
from ..ir.nodes import Block, Loc, Op, Value

# Frames in these packages are pykittens' own machinery (the language, and library helpers
# such as grid mappings that kernels call): errors point past them at the user's line.
_PKG_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(__file__)), d) + os.sep
                  for d in ("lang", "ir", "chiplet"))
_CONTEXTLIB = contextlib.__file__     # `with pk.if_(...)` enters through contextlib's frames


def user_loc() -> Loc | None:
    """The innermost stack frame that is not pykittens' own language machinery."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIRS) and not fn.startswith("<frozen") and fn != _CONTEXTLIB:
            return Loc(fn, f.f_lineno)
        f = f.f_back
    return None


class Tracer:
    def __init__(self, kernel_name: str, num_waves: int):
        self.kernel_name = kernel_name
        self.num_waves = num_waves
        self.programs_per_cu = 0          # pk.programs_per_cu: 0 = the compiler's choice
        self.cluster = 1                  # pk.cluster: workgroups per cluster
        self.blocks: list[Block] = [Block()]
        self.root = self.blocks[0]

    def emit(self, kind, dst=None, srcs=(), regions=None, **attrs) -> Op:
        op = Op(kind, dst, tuple(srcs), attrs, regions or [], user_loc())
        self.blocks[-1].ops.append(op)
        return op

    def error(self, msg: str) -> KernelError:
        return KernelError(msg, user_loc(), self.kernel_name)


class _Stack(threading.local):
    """The tracers active on this thread (a kernel may trace another's helper): one stack
    per thread, so kernels traced concurrently never see each other's ops."""

    def __init__(self):
        self.tracers: list[Tracer] = []


_local = _Stack()


def push(t: Tracer) -> None:
    _local.tracers.append(t)


def pop() -> None:
    _local.tracers.pop()


def active() -> Tracer | None:
    """The innermost tracer on this thread, or None outside tracing."""
    st = _local.tracers
    return st[-1] if st else None


def current() -> Tracer:
    t = active()
    if t is None:
        raise KernelError("pykittens ops can only be called while a @pk.kernel function is "
                          "being traced (compile, emulate or launch the kernel)", user_loc())
    return t


def error(msg: str) -> KernelError:
    t = active()
    return KernelError(msg, user_loc(), t.kernel_name if t else None)


def new_value(type_, name="") -> Value:
    return Value(type_, name)
