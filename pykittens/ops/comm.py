"""Tensor-parallel linear layers whose collective overlaps the GEMM tile by tile
(pykittens.kernels.comm):

    out = all_gather_linear(x, weight, group)       # gather(x) @ weight.T
    out = linear_reduce_scatter(x, weight, group)   # this rank's rows of sum(x @ weight.T)

`x` is this rank's shard (all_gather_linear: its rows of the sequence; linear_reduce_scatter:
all rows, its slice of the inner dim), `weight` this rank's (N, K) weight, `group` a
torch.distributed process group (None: the default group).

Fused (CUDA tensors on Hopper, a group whose ranks can map each other's memory through
torch's symmetric memory): the kernels move tiles between GPUs while the tensor cores
work. Otherwise — CPU tensors, other backends, shapes the fused kernels do not take
(rows per rank not a multiple of 128) — the same results come from torch.distributed's
collective followed by the product (`fused=False` asks for that path). Gradients flow
through both: the backward of one is the other with the weight transposed.
"""
from __future__ import annotations

import threading
import warnings

import torch
import torch.distributed as dist

from .. import Peers
from ..kernels import comm as K
from .run import HALVES, check_same, check_tensor

_lock = threading.Lock()
_DTYPES = HALVES + (torch.float32, torch.float64)    # fused: the halves; else any of these
_states: dict = {}


def _group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("pykittens comm ops need torch.distributed initialised "
                           "(dist.init_process_group) and a group of the ranks that share "
                           "the layer")
    return group if group is not None else dist.group.WORLD


def _check(op, x, weight, group):
    check_tensor(op, "x", x, _DTYPES, 2)
    check_tensor(op, "weight", weight, _DTYPES, 2)
    check_same(op, x=x, weight=weight)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x is {tuple(x.shape)} and weight {tuple(weight.shape)}; "
                         "weight is (out_features, in_features) with in_features = "
                         "x.shape[1], as torch.nn.functional.linear takes it")
    return _group(group)


def _symmetric():
    """torch's symmetric memory module, or None where this torch has none."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return None
    return symm_mem


def fused_reason(x: torch.Tensor, group, rows: int) -> str | None:
    """Why the fused kernels cannot run here (None: they can)."""
    if x.device.type != "cuda":
        return "the tensors are not on a CUDA GPU"
    from ..runtime.launch import gpu_target
    if gpu_target(x.device.index or 0) != "sm_90a":
        return "the fused kernels are built for Hopper (sm_90a) so far"
    if x.dtype not in HALVES:
        return f"the fused kernels take bf16 or f16, not {x.dtype}"
    if dist.get_backend(group) != "nccl":
        return f"the group's backend is {dist.get_backend(group)}, not nccl"
    if rows % 128:
        return f"{rows} rows per rank is not a multiple of 128 (the kernels' block)"
    if x.shape[1] * x.element_size() % 16:
        return "K x element size is not a multiple of 16 bytes (TMA copies)"
    if _symmetric() is None:
        return "this torch has no symmetric memory (torch.distributed._symmetric_memory)"
    return None


class _Symmetric:
    """Buffers every rank of a group allocates alike and maps into each other's address
    space (torch's symmetric memory): two of each data buffer, used on alternate calls,
    and one set of flags counting in calls (the epoch). No barrier is needed between
    calls: a rank writes into a peer's buffer of call e only after its call e - 1 waited
    on that peer's call e - 1 (the flags), which the peer ran after finishing call e - 2,
    the last one that read the buffer."""

    def __init__(self, group, shapes: dict, device):
        symm = _symmetric()
        name = group.group_name
        if hasattr(symm, "enable_symm_mem_for_group"):   # needed by older torch;
            with warnings.catch_warnings():                # later ones: a no-op that warns
                warnings.simplefilter("ignore", FutureWarning)
                symm.enable_symm_mem_for_group(name)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.peers, self.handles = {}, []
        for key, (shape, dtype) in shapes.items():
            copies = 1 if dtype == torch.int32 else 2
            self.peers[key] = []
            for _ in range(copies):
                t = symm.empty(shape, dtype=dtype, device=device)
                if dtype == torch.int32:
                    t.zero_()
                h = symm.rendezvous(t, name)
                self.handles.append(h)
                self.peers[key].append(Peers(
                    [t if r == self.rank else h.get_buffer(r, shape, dtype)
                     for r in range(self.world)], self.rank))
        self.epoch = 0
        self.handles[0].barrier(channel=0)      # every rank's flags are zero before use

    def next_call(self) -> int:
        self.epoch += 1
        return self.epoch

    def buf(self, key) -> Peers:
        """This call's copy of buffer `key` (every rank's)."""
        copies = self.peers[key]
        return copies[self.epoch % len(copies)]

    def local(self, key):
        return self.buf(key).tensors[self.rank]


def _state(kind, group, shapes, device) -> _Symmetric:
    key = (kind, group.group_name, device, tuple(sorted((k, tuple(s), d) for k, (s, d)
                                                       in shapes.items())))
    with _lock:
        st = _states.get(key)
        if st is None:
            st = _states[key] = _Symmetric(group, shapes, device)
    return st


def _fused_all_gather_linear(x, weight, group, **variant):
    """The fused path (`variant`: kernel constants to try instead of the defaults)."""
    from ..runtime.launch import launch
    ms, k = x.shape
    n = weight.shape[0]
    world = dist.get_world_size(group)
    consts = K.ws_plan(ms, k, n, x.element_size())
    st = _state("ag", group, {"gathered": ((world * ms, k), x.dtype),
                              "ready": ((world, ms // 128), torch.int32)}, x.device)
    epoch = st.next_call()
    out = x.new_empty((world * ms, n))
    launch(K.ag_gemm_ws, x, st.local("gathered"), st.buf("gathered"), st.buf("ready"),
           weight, out, epoch, grid=K.ws_grid(consts, world), WORLD=world,
           **{**consts, **variant})
    return out


def _fused_linear_reduce_scatter(x, weight, group, **variant):
    """The fused path (`variant`: gemm_rs_ws constants to try instead of the defaults)."""
    from ..runtime.launch import launch
    m, k = x.shape
    n = weight.shape[0]
    world = dist.get_world_size(group)
    ms = m // world
    consts = K.ws_plan(ms, k, n, x.element_size(), staged_c=False)
    tiles = consts["TMS"] * consts["TN"]
    st = _state("rs", group, {"partials": ((world, ms, n), x.dtype),
                              "done": ((world, tiles), torch.int32)}, x.device)
    epoch = st.next_call()
    out = x.new_empty((ms, n))
    launch(K.gemm_rs_ws, x, weight, st.buf("partials"), st.buf("done"), epoch,
           grid=K.ws_grid(consts, world), **{**consts, **variant})
    launch(K.rs_reduce, st.buf("partials"), st.buf("done"), out, epoch, grid=(tiles,),
           BM=128, BN=consts["BN"], SIGNALS=K.WS_SIGNALS)
    return out


def _gather(x, group):
    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def _scatter_sum(y, group):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    ms = y.shape[0] // world
    if dist.get_backend(group) == "nccl":
        out = y.new_empty((ms,) + tuple(y.shape[1:]))
        dist.reduce_scatter_tensor(out, y.contiguous(), group=group)
        return out
    y = y.clone()                                   # gloo: no reduce-scatter of tensors
    dist.all_reduce(y, group=group)
    return y[rank * ms:(rank + 1) * ms].contiguous()


def _ag_forward(x, weight, group, fused):
    if _use_fused("all_gather_linear", x, weight, group, x.shape[0], fused):
        return _fused_all_gather_linear(x.contiguous(), weight.contiguous(), group)
    return torch.nn.functional.linear(_gather(x, group), weight)


def _rs_forward(x, weight, group, fused):
    world = dist.get_world_size(group)
    if x.shape[0] % world:
        raise ValueError(f"linear_reduce_scatter: x has {x.shape[0]} rows, not a multiple of "
                         f"the group's {world} ranks (each rank keeps an equal share)")
    if _use_fused("linear_reduce_scatter", x, weight, group, x.shape[0] // world, fused):
        return _fused_linear_reduce_scatter(x.contiguous(), weight.contiguous(), group)
    return _scatter_sum(torch.nn.functional.linear(x, weight), group)


def _use_fused(op, x, weight, group, rows, fused) -> bool:
    if fused is False:
        return False
    why = fused_reason(x, group, rows)
    if why is None and weight.shape[0] % 128:
        why = f"N = {weight.shape[0]} is not a multiple of 128 (the kernels' block)"
    if why is not None and fused:
        raise ValueError(f"{op}(fused=True): {why}; pass fused=None to fall back to "
                         "torch.distributed's collective and a separate product")
    return why is None


class _TPLinear(torch.autograd.Function):
    """all_gather_linear (gather=True) or linear_reduce_scatter: the backward of each is the
    other with the weight transposed — d(gather x) = g @ W, each rank its rows summed over
    ranks; dx of the reduce-scatter, every rank's rows of g times W — and the weight's
    gradient takes every rank's rows of x or of g."""

    @staticmethod
    def forward(ctx, x, weight, group, fused, gather):
        ctx.group, ctx.gather = group, gather
        ctx.fused = None if fused else fused           # the backward: fused where it can
        ctx.save_for_backward(x, weight)
        return (_ag_forward if gather else _rs_forward)(x, weight, group, fused)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            other = _rs_forward if ctx.gather else _ag_forward
            dx = other(g.contiguous(), weight.t().contiguous(), ctx.group, ctx.fused)
        if ctx.needs_input_grad[1]:
            dw = g.t() @ _gather(x, ctx.group) if ctx.gather else _gather(g, ctx.group).t() @ x
        return dx, dw, None, None, None


def all_gather_linear(x: torch.Tensor, weight: torch.Tensor, group=None, *,
                      fused: bool | None = None) -> torch.Tensor:
    """gather(x) @ weight.T: x (Ms, K) this rank's rows, weight (N, K); returns
    (world * Ms, N), rows in rank order. fused: None (fused where possible), True (fused
    or an error saying why not), False (torch.distributed all-gather, then the product)."""
    group = _check("all_gather_linear", x, weight, group)
    return _TPLinear.apply(x, weight, group, fused, True)


def linear_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, group=None, *,
                          fused: bool | None = None) -> torch.Tensor:
    """This rank's rows of the sum over ranks of x @ weight.T: x (M, K) every row and this
    rank's slice of the inner dim, weight (N, K) the matching slice; returns
    (M / world, N), the rank's M / world rows in rank order. fused as all_gather_linear."""
    group = _check("linear_reduce_scatter", x, weight, group)
    return _TPLinear.apply(x, weight, group, fused, False)
