"""Tile IR: values, ops with regions, and the kernel that owns them.

Register and shared tiles are *storage*: an op writes its `dst` in place (as in
ThunderKittens), so a tile updated inside a `pk.range` body is naturally loop-carried.
Scalars are single-assignment values.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count()


@dataclass(frozen=True)
class Loc:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def first_frame_outside(dirs: tuple[str, ...]) -> Loc | None:
    """The innermost calling frame whose file is under none of `dirs` (nor frozen
    importlib): where a user's call entered the library."""
    import sys
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(dirs) and not fn.startswith("<frozen"):
            return Loc(fn, f.f_lineno)
        f = f.f_back
    return None


@dataclass(eq=False)
class Value:
    type: Any
    name: str = ""
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"%{self.name or 'v'}{self.id}"


@dataclass(eq=False)
class Op:
    kind: str
    dst: Value | None = None
    srcs: tuple = ()
    attrs: dict = field(default_factory=dict)
    regions: list["Block"] = field(default_factory=list)
    loc: Loc | None = None


@dataclass(eq=False)
class Block:
    ops: list[Op] = field(default_factory=list)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str          # 'gl', 'scalar'; 'peers' in a kernel's signature only (one tensor
    type: Any          # per rank: traced as `world` gl parameters and a rank scalar)
    world: Any = None  # 'peers': the number of ranks (an int, or the pk.const naming it)


@dataclass(eq=False)
class KernelIR:
    name: str
    params: list[Param]
    param_values: dict[str, Value]
    consts: dict[str, Any]
    num_waves: int
    body: Block
    loc: Loc | None = None
    target: str | None = None     # the target a pk.target constant named when traced
    programs_per_cu: int = 0      # workgroups built to fit one CU / SM (0: the compiler's)
    cluster: int = 1              # workgroups per cluster (pk.cluster; Hopper)


def walk(block: Block):
    """Every op in a block, depth-first, regions included."""
    for op in block.ops:
        yield op
        for r in op.regions:
            yield from walk(r)
