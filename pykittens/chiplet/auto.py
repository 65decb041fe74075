"""Mapping specs ("row-major", "xcd:W=5,C=25", "head-first", "auto") and choosing one by
simulation, so a kernel can take the simulator's pick as its default grid mapping."""
from __future__ import annotations

import functools
import json

from .. import targets
from ..toolchain import cache as disk
from . import mapping as M
from .ops import Attention, Gemm
from .sim import Machine, SimResult, Timing, simulate

GEMM_SPECS = "row-major, grouped:W=<window>, xcd:W=<window>,C=<chunk>, auto"
ATTENTION_SPECS = ("naive, head-first, head-first:C=<chunk>, naive-block-first (block-first), "
                   "naive-head-first, swizzled-block-first, swizzled-head-first, auto")
MODEL_VERSION = "1"       # bump when the simulator's results change, to retire disk entries
HBM_TOLERANCE = 0.01      # candidates within 1% of the least HBM traffic count as tied


def make_op(op, shape=None, **kwargs):
    """A Gemm/Attention from an op object, or from a name and a shape:
    ("gemm", (M, N, K)) or ("attention", (B, H, N, D)); kwargs go to the op (tile sizes,
    dtype, kv_heads)."""
    if isinstance(op, (Gemm, Attention)):
        if shape is not None or kwargs:
            raise ValueError("pass either an op object or an op name with a shape, not both")
        return op
    shape = tuple(shape or ())
    if op == "gemm":
        if len(shape) != 3:
            raise ValueError(f"gemm shape must be M N K (3 sizes), got {shape}")
        return Gemm(*shape, **kwargs)
    if op == "attention":
        if len(shape) != 4:
            raise ValueError(f"attention shape must be B H N D (4 sizes), got {shape}")
        return Attention(*shape, **kwargs)
    raise ValueError(f"unknown op {op!r}; choose 'gemm' or 'attention'")


def _params(spec: str, text: str, allowed: tuple[str, ...], example: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in allowed or not val.strip().isdigit() or int(val) < 1:
            raise ValueError(f"bad mapping {spec!r}: parameters are "
                             f"{', '.join(k + '=<positive int>' for k in allowed)}, "
                             f"e.g. {example!r}")
        out[key] = int(val)
    return out


def parse_mapping(spec: str, op, target="gfx950", **auto_kwargs) -> M.Mapping:
    """The mapping that `spec` names, built for `op`'s tile grid on `target`."""
    t = targets.get(target)
    name, _, text = spec.strip().partition(":")
    if name == "auto":
        if text:
            raise ValueError(f"bad mapping {spec!r}: 'auto' takes no parameters")
        return auto_mapping(op, target=t, **auto_kwargs)
    if isinstance(op, Gemm):
        rows, cols = op.grid
        if name == "row-major" and not text:
            return M.gemm_row_major(rows, cols)
        if name == "grouped":
            p = _params(spec, text, ("W",), "grouped:W=8")
            if "W" not in p:
                raise ValueError(f"bad mapping {spec!r}: grouped needs W, e.g. 'grouped:W=8'")
            return M.gemm_grouped(rows, cols, p["W"])
        if name == "xcd":
            p = _params(spec, text, ("W", "C"), "xcd:W=5,C=25")
            if "C" not in p:
                raise ValueError(f"bad mapping {spec!r}: xcd needs the chunk C, "
                                 f"e.g. 'xcd:W=5,C=25'")
            return M.gemm_xcd(rows, cols, p.get("W", 1), p["C"], t.num_xcds)
        raise ValueError(f"unknown gemm mapping {spec!r}; choose one of {GEMM_SPECS}")
    if isinstance(op, Attention):
        b, h, qb = op.grid
        if name == "naive" and not text:
            return M.attention_naive(b, h, qb)
        if name == "head-first":
            p = _params(spec, text, ("C",), "head-first:C=16")
            return M.attention_head_first(b, h, qb, op.group, t.num_xcds, p.get("C"))
        if name in M.ATTENTION_ORDERS + tuple(M.ATTENTION_ALIASES) and not text:
            return M.attention_order(name, b, h, qb, op.group, t.num_xcds)
        raise ValueError(f"unknown attention mapping {spec!r}; choose one of {ATTENTION_SPECS}")
    raise TypeError(f"expected a Gemm or Attention op, got {type(op).__name__}")


def candidates(op, target="gfx950", wgs_per_cu: int = 1) -> list[M.Mapping]:
    """Mappings worth simulating for `op`: the launch order the kernel would use anyway,
    then remaps sized to what one XCD holds at once (cus_per_xcd * wgs_per_cu workgroups)."""
    t = targets.get(target)
    per_xcd = t.cus_per_xcd * wgs_per_cu
    if isinstance(op, Gemm):
        rows, cols = op.grid
        out = [M.gemm_row_major(rows, cols)]
        windows = [w for w in (2, 4, 5, 8, 16) if w < rows]
        if t.num_xcds == 1:
            return out + [M.gemm_grouped(rows, cols, w) for w in windows + [32, 64] if w < rows]
        for w in [1] + windows:
            wave = -(-per_xcd // w) * w                      # one XCD's wave, whole columns
            for c in sorted({w * w, wave, 4 * wave} - {1}):
                out.append(M.gemm_xcd(rows, cols, w, c, t.num_xcds))
        return out
    if isinstance(op, Attention):
        b, h, qb = op.grid
        out = [M.attention_naive(b, h, qb)]
        if t.num_xcds > 1:
            run = op.group * qb
            out.append(M.attention_head_first(b, h, qb, op.group, t.num_xcds))
            out += [M.attention_order(o, b, h, qb, op.group, t.num_xcds)     # the study's
                    for o in ("naive-block-first", "swizzled-block-first")]  # other two
            for c in sorted({max(1, run // 2), 2 * run, per_xcd}):
                if c != run:
                    out.append(M.attention_head_first(b, h, qb, op.group, t.num_xcds, c))
        return out
    raise TypeError(f"expected a Gemm or Attention op, got {type(op).__name__}")


def best(results: list[SimResult]) -> int:
    """Index of the result to pick: least HBM traffic (within HBM_TOLERANCE), then the
    highest L2 hit rate, then the earliest (simplest) candidate. HBM first because an order
    that raises L2 hits by starving the LLC is slower (HipKittens' L2-greedy example)."""
    floor = min(r.hbm_bytes for r in results)
    ok = [i for i, r in enumerate(results) if r.hbm_bytes <= floor * (1 + HBM_TOLERANCE)]
    return max(ok, key=lambda i: (results[i].l2_hit_rate, -i))


def sweep(op, mappings, target="gfx950", **sim_kwargs) -> list[SimResult]:
    return [simulate(op, m, target, **sim_kwargs) for m in mappings]


def choice_machine(target, wgs_per_cu: int = 1) -> Machine:
    """The machine auto_mapping (and `pykittens chiplet --mapping auto`) chooses on: the
    single-LRU model on every target. On sm_90a the partitioned model (Machine.of's default
    there) does not yet pick within 2% of the best measured order on every measured size
    (docs/chiplet.md), so the choice stays the one it was."""
    return Machine.of(target, wgs_per_cu=wgs_per_cu, l2_partitions=1)


@functools.lru_cache(maxsize=256)
def _choose(op, target_name: str, wgs_per_cu: int, timing: Timing, use_disk: bool) -> str:
    machine = choice_machine(target_name, wgs_per_cu)
    key = disk.cache_key("chiplet", MODEL_VERSION, repr(op), repr(machine), repr(timing))
    if use_disk:
        hit = disk.lookup("chiplet", key)
        if hit is not None:
            try:
                return json.loads(hit)["mapping"]
            except (ValueError, KeyError):
                pass                                      # unreadable entry: recompute
    cands = candidates(op, target_name, wgs_per_cu)
    results = sweep(op, cands, target_name, machine=machine, timing=timing)
    pick = results[best(results)]
    if use_disk:
        disk.store("chiplet", key, json.dumps(pick.to_dict()).encode())
    return pick.mapping


def auto_mapping(op, shape=None, target="gfx950", *, wgs_per_cu: int = 1,
                 timing: Timing | None = None, use_disk_cache: bool = True,
                 **op_kwargs) -> M.Mapping:
    """The simulator's choice of mapping for `op` on `target`: `op` is a Gemm/Attention, or
    "gemm"/"attention" with `shape` (M, N, K) / (B, H, N, D). Results are memoized in
    memory and, unless use_disk_cache=False, in the pykittens cache directory."""
    op = make_op(op, shape, **op_kwargs)
    t = targets.get(target)
    spec = _choose(op, t.name, wgs_per_cu, timing or Timing(), use_disk_cache)
    return parse_mapping(spec, op, t)
