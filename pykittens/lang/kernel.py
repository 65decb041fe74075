"""`@pk.kernel`: a typed signature, compile-time constants, and tracing into tile IR."""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

from ..ir import types as T
from ..ir.errors import KernelError
from ..ir.nodes import KernelIR, Loc, Param, first_frame_outside
from ..targets import get as get_target
from . import trace
from .values import GL, PeerTensors, Scalar


@dataclass(frozen=True)
class GlobalSpec:
    """Annotation `pk.gl[dtype, rank]` or `pk.gl[dtype, (None, 1024)]` (None = runtime).
    The dtype may be the name of a pk.const (`pk.gl["DT", 2]`): it is then inferred from the
    tensor passed at launch, so one kernel serves several element types. So may a dim
    (`pk.gl["DT", (None, "D")]`): a static dim whose size the const gives, inferred from the
    tensor when the const is not passed."""
    dtype: T.DType | str
    shape: tuple
    world: int | str | None = None       # pk.peers: how many ranks hold one each

    def type(self) -> T.GlobalType:
        return T.GlobalType(self.dtype, self.shape)


class _GL:
    def __getitem__(self, item) -> GlobalSpec:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("write pk.gl[dtype, rank] or pk.gl[dtype, (d0, d1, ...)]")
        dtype, shape = item
        if isinstance(shape, int):
            if not 1 <= shape <= 4:
                raise TypeError(f"global tensor rank must be 1..4, not {shape}")
            shape = (None,) * shape
        shape = tuple(None if d is None else d if isinstance(d, str) else int(d)
                      for d in shape)
        return GlobalSpec(dtype if isinstance(dtype, str) and dtype not in T.DTYPES
                          else T.dtype_of(dtype), shape)


gl = _GL()


class _PeersAnn:
    """Annotation `pk.peers[dtype, shape, world]`: a symmetric tensor, one per rank of a
    group of `world` GPUs (an int or the name of a pk.const, inferred from the pk.Peers
    passed at launch), all of one dtype and shape. In the kernel, `x.peer(r)` is rank r's
    tensor (a pk.gl view), `x.local` this rank's and `x.rank` this rank's index."""

    def __getitem__(self, item) -> GlobalSpec:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("write pk.peers[dtype, rank or shape, world], world an int or "
                            "the name of a pk.const")
        dtype, shape, world = item
        spec = gl[dtype, shape]
        if not isinstance(world, str) and (isinstance(world, bool) or not isinstance(world, int)
                                           or world < 1):
            raise TypeError(f"pk.peers world must be a positive int or a pk.const name, not "
                            f"{world!r}")
        return GlobalSpec(spec.dtype, spec.shape, world)


peers = _PeersAnn()


class Peers:
    """The launch argument of a pk.peers parameter: one tensor per rank of the group, in
    rank order, and the calling rank. On GPUs they come from symmetric memory (every
    rank's buffer mapped into this process, e.g. torch.distributed's symmetric memory);
    in the emulator they are arrays that every rank's launch shares (pk.emulate_world)."""

    def __init__(self, tensors, rank: int):
        self.tensors = tuple(tensors)
        if not self.tensors:
            raise TypeError("pk.Peers needs one tensor per rank, got none")
        if isinstance(rank, bool) or not isinstance(rank, int) or \
                not 0 <= rank < len(self.tensors):
            raise TypeError(f"pk.Peers rank must be an int in 0..{len(self.tensors) - 1} (the "
                            f"calling rank's index in the group), got {rank!r}")
        self.rank = rank

    @property
    def world(self) -> int:
        return len(self.tensors)

    def __repr__(self):
        return f"pk.Peers(world={self.world}, rank={self.rank})"


class _Const:
    """Annotation for compile-time constants: `BLOCK: pk.const = 64`."""

    def __repr__(self):
        return "pk.const"


const = _Const()


class _TargetConst:
    """Annotation for the compile-time constant that names the target being compiled for:
    `TARGET: pk.target = None`. Compiling, emulating or launching for a target sets it; a value
    passed explicitly must name the same target, so a kernel's target-dependent choices
    (a schedule, a grid mapping) cannot disagree with the code it becomes."""

    def __repr__(self):
        return "pk.target"


target = _TargetConst()


class Kernel:
    """A traced-on-demand kernel. `specialize(**consts)` gives its tile IR for those
    constants (cached); `num_waves` is the workgroup size in waves."""

    def __init__(self, fn, num_waves: int = 1):
        self.fn, self.name = fn, fn.__name__
        self.num_waves = num_waves
        self.__doc__ = fn.__doc__
        src = inspect.getsourcefile(fn) or "<unknown>"
        self.loc = Loc(src, fn.__code__.co_firstlineno)
        self.params: list[Param] = []
        self.const_defaults: dict = {}
        self.target_const: str | None = None      # the parameter annotated pk.target
        self._cache: dict = {}
        self._lock = threading.RLock()      # one trace per constants, whichever thread asks
        try:        # resolve string annotations (`from __future__ import annotations`)
            sig = inspect.signature(fn, eval_str=True)
        except Exception:
            sig = inspect.signature(fn)
        for p in sig.parameters.values():
            ann = p.annotation
            if isinstance(ann, GlobalSpec):
                if ann.world is None:
                    self.params.append(Param(p.name, "gl", ann.type()))
                else:
                    self.params.append(Param(p.name, "peers", ann.type(), ann.world))
                    w = ann.world
                    if isinstance(w, str) and (w not in sig.parameters or
                                               sig.parameters[w].annotation is not const):
                        raise KernelError(f"parameter {p.name!r} takes its world size from "
                                          f"{w!r}, which is not a pk.const parameter",
                                          self.loc, self.name)
                if isinstance(ann.dtype, str) and ann.dtype not in sig.parameters:
                    raise KernelError(f"parameter {p.name!r} takes its dtype from "
                                      f"{ann.dtype!r}, which is not a pk.const parameter",
                                      self.loc, self.name)
                for d in ann.shape:
                    if isinstance(d, str) and (d not in sig.parameters or
                                               sig.parameters[d].annotation is not const):
                        raise KernelError(f"parameter {p.name!r} takes a dim from {d!r}, "
                                          "which is not a pk.const parameter",
                                          self.loc, self.name)
            elif isinstance(ann, T.DType):
                self.params.append(Param(p.name, "scalar", T.ScalarType(ann)))
            elif ann is target:
                if self.target_const is not None:
                    raise KernelError(f"parameters {self.target_const!r} and {p.name!r} are "
                                      "both pk.target; a kernel has one target", self.loc,
                                      self.name)
                if p.default not in (inspect.Parameter.empty, None):
                    raise KernelError(f"parameter {p.name!r}: pk.target takes no default "
                                      "other than None (it is the target being compiled "
                                      "for)", self.loc, self.name)
                self.target_const = p.name
                self.const_defaults[p.name] = None
            elif ann is const:
                if p.default is not inspect.Parameter.empty:
                    self.const_defaults[p.name] = p.default
                else:
                    self.const_defaults[p.name] = None
            else:
                raise KernelError(f"parameter {p.name!r} needs an annotation: pk.gl[dtype, "
                                  f"rank], a scalar type such as pk.f32, pk.const or "
                                  f"pk.target",
                                  self.loc, self.name)
        self.param_names = tuple(p.name for p in self.params)

    @property
    def const_names(self):
        return list(self.const_defaults)

    def consts_for(self, consts: dict) -> dict:
        unknown = set(consts) - set(self.const_defaults) - {"num_waves"}
        if unknown:
            raise KernelError(f"unknown compile-time constant(s) {sorted(unknown)}; this "
                              f"kernel takes {self.const_names}", self.loc, self.name)
        merged = {**self.const_defaults, **consts}
        missing = [k for k, v in merged.items() if v is None]
        if missing:
            raise KernelError(f"compile-time constant(s) {missing} have no default: pass "
                              "them when compiling or launching", self.loc, self.name)
        return merged

    def specialize_for(self, target, **consts) -> KernelIR:
        """Tile IR for compiling to `target` (a name or a Target): the pk.target constant, if
        the kernel has one, is set to the target's name; one passed explicitly must agree."""
        name = get_target(target).name
        tc = self.target_const
        if tc is not None:
            given = consts.get(tc)
            if given is not None and given != name:
                raise KernelError(f"{tc}={given!r} disagrees with the target this kernel is "
                                  f"compiled for, {name!r}: leave {tc} out (it is set from "
                                  "the target) or pass the same name", self.loc, self.name)
            consts = {**consts, tc: name}
        return self.specialize(**consts)

    def specialize(self, **consts) -> KernelIR:
        merged = self.consts_for(consts)
        bad = [k for k, v in merged.items() if not _hashable(v)]
        if bad:
            raise KernelError(f"compile-time constant(s) {bad} must be hashable values "
                              "(e.g. a tuple, not a list)", self.loc, self.name)
        key = const_key(merged)
        ir = self._cache.get(key)
        if ir is None:
            with self._lock:
                ir = self._cache.get(key)
                if ir is None:
                    ir = self._cache[key] = self._trace(merged)
        return ir

    def _trace(self, consts: dict) -> KernelIR:
        nw = int(consts.pop("num_waves", self.num_waves))
        if nw < 1:
            raise KernelError("num_waves must be >= 1", self.loc, self.name)
        tr = trace.Tracer(self.name, nw)
        values, args, params = {}, {}, []
        for p in (self.resolve(p, consts) for p in self.params):
            members = peer_params(p) if p.kind == "peers" else [p]
            for m in members:
                values[m.name] = trace.new_value(m.type, m.name)
            params += members
            if p.kind == "peers":
                args[p.name] = PeerTensors(p.name, [values[m.name] for m in members[:-1]],
                                           values[members[-1].name])
            else:
                args[p.name] = GL(values[p.name], p.name) if p.kind == "gl" \
                    else Scalar(values[p.name])
        trace.push(tr)
        try:
            self.fn(**args, **consts)
        finally:
            trace.pop()
        return KernelIR(self.name, params, values, dict(consts), nw, tr.root, self.loc,
                        consts.get(self.target_const) if self.target_const else None,
                        tr.programs_per_cu, tr.cluster)

    def resolve(self, p: Param, consts: dict) -> Param:
        """The parameter with a dtype, dims or world size named by consts replaced by
        their values."""
        if p.kind not in ("gl", "peers"):
            return p
        dtype, shape = p.type.dtype, p.type.shape
        if isinstance(dtype, str):
            value = consts[dtype]
            try:
                dtype = T.dtype_of(value)
            except TypeError:
                raise KernelError(f"compile-time constant {p.type.dtype}={value!r} (the element "
                                  f"type of {p.name!r}) is not an element type pykittens "
                                  f"takes: use one of {', '.join(T.DTYPES)}", self.loc,
                                  self.name) from None
        if any(isinstance(d, str) for d in shape):
            shape = tuple(_static_dim(self, p.name, d, consts[d]) if isinstance(d, str) else d
                          for d in shape)
        world = p.world
        if isinstance(world, str):
            world = consts[world]
            if isinstance(world, bool) or not isinstance(world, int) or world < 1:
                raise KernelError(f"compile-time constant {p.world}={world!r} (the world size "
                                  f"of {p.name!r}) must be a positive int", self.loc,
                                  self.name)
        return Param(p.name, p.kind, T.GlobalType(dtype, shape), world)

    def __call__(self, *a, **k):
        raise KernelError("a pykittens kernel is not called directly: use "
                          "pk.emulate(kernel, ...) or a runtime launch", self.loc, self.name)

    def __repr__(self):
        return f"<pykittens kernel {self.name}>"


def peer_params(p: Param) -> list[Param]:
    """What a resolved pk.peers parameter becomes in the kernel's ABI: one gl parameter per
    rank (`x.p0` ...; sizes and strides repeat, the launch checks they agree) and the
    calling rank's index, `x.rank`."""
    return [Param(f"{p.name}.p{i}", "gl", p.type) for i in range(p.world)] + \
        [Param(f"{p.name}.rank", "scalar", T.ScalarType(T.i32))]


def peer_members(name: str, names) -> list[str]:
    """The per-rank ABI names of pk.peers parameter `name` (`name.p0`, ...) that `names`
    (bound arguments, an emulation's results) holds, in rank order."""
    out = []
    while f"{name}.p{len(out)}" in names:
        out.append(f"{name}.p{len(out)}")
    return out


def _static_dim(k: Kernel, param: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KernelError(f"const {name}={value!r} gives a dim of {param!r}: it must be a "
                          "positive int", k.loc, k.name)
    return value


class NotAKernel(KernelError, TypeError):
    """A plain function (or anything else) where a @pk.kernel is needed."""


def require_kernel(obj, what: str) -> "Kernel":
    """`obj` itself if it is a @pk.kernel; otherwise an error that names the function's own
    file and line and says to decorate it."""
    if isinstance(obj, Kernel):
        return obj
    code = getattr(obj, "__code__", None)
    name = getattr(obj, "__name__", type(obj).__name__)
    if code is not None:
        raise NotAKernel(f"{what} takes a @pk.kernel, but {name!r} is a plain "
                         f"{type(obj).__name__}: put @pk.kernel (or @pk.kernel(num_waves=...)) "
                         f"above `def {name}`", Loc(code.co_filename, code.co_firstlineno))
    raise NotAKernel(f"{what} takes a @pk.kernel function, not {type(obj).__name__}",
                     _outside_pykittens())


def _outside_pykittens() -> Loc | None:
    """The innermost frame outside the pykittens package: the user's call."""
    import os
    return first_frame_outside(
        (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,))


def const_key(consts: dict) -> tuple:
    """A key that tells constants apart by value and type: 1, 1.0 and True are equal in
    Python but trace differently, and two objects that print alike (e.g. grid mappings
    over different grids) are different constants."""
    return tuple(sorted((k, _typed(v)) for k, v in consts.items()))


def _typed(v):
    if isinstance(v, (tuple, list)):
        return (type(v).__qualname__, tuple(_typed(x) for x in v))
    if isinstance(v, frozenset):
        return ("frozenset", frozenset(_typed(x) for x in v))
    return (type(v).__module__, type(v).__qualname__, v)


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def kernel(fn=None, *, num_waves: int = 1):
    """Decorator: `@pk.kernel` or `@pk.kernel(num_waves=4)`."""
    if fn is None:
        return lambda f: Kernel(f, num_waves)
    return Kernel(fn, num_waves)
