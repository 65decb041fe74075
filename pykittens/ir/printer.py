"""Text form of tile IR (`--emit tile`) and of lane IR (`--emit lane`): one op a line."""
from __future__ import annotations

from .nodes import Block, KernelIR


def _fmt_attrs(attrs: dict) -> str:
    return ("{" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + "}") if attrs else ""


def format_block(block: Block, indent: int = 1, typed=lambda v: f"{v}: {v.type}") -> list[str]:
    out = []
    pad = "  " * indent
    for op in block.ops:
        lhs = f"{typed(op.dst)} = " if op.dst is not None else ""
        srcs = ", ".join(repr(s) for s in op.srcs)
        loc = f"   # line {op.loc.line}" if op.loc else ""
        out.append(f"{pad}{lhs}{op.kind}({srcs}) {_fmt_attrs(op.attrs)}".rstrip() + loc)
        for i, r in enumerate(op.regions):
            out.append(f"{pad}{'{' if i == 0 else '} else {'}")
            out.extend(format_block(r, indent + 1, typed))
        if op.regions:
            out.append(pad + "}")
    return out


def format_kernel(k: KernelIR) -> str:
    params = ", ".join(f"{p.name}: {p.type}" for p in k.params)
    consts = ", ".join(f"{n}={v}" for n, v in k.consts.items())
    head = f"kernel {k.name}({params}) num_waves={k.num_waves}" + (f" [{consts}]" if consts else "")
    return "\n".join([head + " {"] + format_block(k.body) + ["}"])
