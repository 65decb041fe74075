"""Control-flow facts shared by the code-object reports (AMDGPU disassembly and SASS):
basic blocks, dominators and natural loops over successor lists (block 0 = entry)."""
from __future__ import annotations

from typing import Callable, Iterable


def basic_blocks(n: int, leaders: Iterable[int],
                 edges: Callable[[int], tuple[int | None, bool]]
                 ) -> tuple[list[range], list[list[int]]]:
    """(blocks, successors) of instructions 0..n-1: blocks are index ranges starting at
    `leaders` (and 0); `edges(i)` of a block's last instruction gives its jump target (an
    instruction index, or None) and whether it falls through to the next block. A target
    that starts no block adds no edge."""
    if n == 0:
        return [], []
    starts = sorted({0} | {i for i in leaders if 0 <= i < n})
    blocks = [range(s, e) for s, e in zip(starts, starts[1:] + [n])]
    block_at = {s: b for b, s in enumerate(starts)}
    succs = []
    for b, blk in enumerate(blocks):
        target, falls = edges(blk[-1])
        out = [block_at[target]] if target in block_at else []
        if falls and b + 1 < len(blocks):
            out.append(b + 1)
        succs.append(sorted(set(out)))
    return blocks, succs


def dominators(succs: list[list[int]]) -> dict[int, set[int]]:
    """{block: the blocks that dominate it} for every block reachable from block 0."""
    order, seen = [], {0}
    stack = [(0, iter(succs[0]))] if succs else []
    while stack:                                  # iterative DFS for a reverse postorder
        b, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(b)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(succs[nxt])))
    rpo = order[::-1]
    preds = {b: [p for p in rpo if b in succs[p]] for b in rpo}
    dom = {b: set(rpo) for b in rpo}
    if rpo:
        dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            new = {b} | set.intersection(*(dom[p] for p in preds[b]))
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def natural_loops(succs: list[list[int]]) -> dict[int, set[int]]:
    """{header block: the blocks of its natural loop}: for each back edge u -> h (h
    dominates u), h plus every block that reaches u without passing through h."""
    dom = dominators(succs)
    preds: dict[int, list[int]] = {b: [] for b in dom}
    for b in dom:
        for s in succs[b]:
            if s in preds:
                preds[s].append(b)
    loops: dict[int, set[int]] = {}
    for u in dom:
        for h in succs[u]:
            if h in dom[u]:                       # back edge u -> h
                body, work = loops.setdefault(h, {h}), [u]
                while work:
                    x = work.pop()
                    if x not in body:
                        body.add(x)
                        work.extend(preds[x])
    return loops
