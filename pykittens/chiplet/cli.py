"""`pykittens chiplet`: simulate a grid mapping (or pick one) for a GEMM or attention shape.

    pykittens chiplet --op gemm --shape 9216 9216 9216 --target gfx950 --mapping xcd:W=5,C=25
    pykittens chiplet --op attention --shape 4 32 8192 128 --kv-heads 8 --mapping auto --json

`add_parser(subparsers)` registers the subcommand, `run(args)` executes it, and
`demo_report()` is the short study `pykittens demo` prints.
"""
from __future__ import annotations

import argparse
import json
import sys

from .. import targets
from .auto import best, candidates, choice_machine, make_op, parse_mapping, sweep
from .sim import Machine, Timing, simulate

_DEFAULT_TIMING = Timing()


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "chiplet", help="simulate L2/LLC hit rates of a grid mapping (chiplet scheduling)",
        description="Replay a GEMM or attention launch through per-XCD L2s and the shared "
                    "LLC of a target, for a given grid mapping or the simulator's choice "
                    "(--mapping auto). All numbers are modeled, not measured.")
    p.add_argument("--op", required=True, choices=("gemm", "attention"))
    p.add_argument("--shape", required=True, nargs="+", type=int, metavar="N",
                   help="gemm: M N K; attention: B H N D")
    p.add_argument("--target", default="gfx950", choices=targets.NAMES)
    p.add_argument("--mapping", default="auto",
                   help="gemm: row-major | grouped:W=8 | xcd:W=5,C=25 | auto; "
                        "attention: naive | head-first | head-first:C=16 | auto "
                        "(default: auto)")
    p.add_argument("--kv-heads", type=int, default=None, metavar="H_KV",
                   help="attention: KV heads (grouped-query attention); default H")
    p.add_argument("--tile", nargs="+", type=int, default=None, metavar="N",
                   help="gemm: BM BN BK (default 256 256 64); attention: BQ BKV "
                        "(default 256 64)")
    p.add_argument("--dtype", default="bf16", help="operand element type (default bf16)")
    p.add_argument("--wgs-per-cu", type=int, default=1,
                   help="workgroups resident per CU (default 1)")
    p.add_argument("--launch-skew", type=float, default=_DEFAULT_TIMING.launch_skew,
                   help="model: steps between consecutive workgroup launches "
                        f"(default {_DEFAULT_TIMING.launch_skew})")
    p.add_argument("--phase-jitter", type=float, default=_DEFAULT_TIMING.phase_jitter,
                   help="model: spread of per-CU start delays in steps "
                        f"(default {_DEFAULT_TIMING.phase_jitter})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw which XCD computes each tile, with the hit rates")
    return p


def _op_from_args(args):
    kw = {"dtype": args.dtype}
    if args.tile is not None:
        names = ("bm", "bn", "bk") if args.op == "gemm" else ("bq", "bkv")
        if len(args.tile) != len(names):
            raise ValueError(f"--tile for {args.op} takes {len(names)} sizes "
                             f"({' '.join(n.upper() for n in names)}), got {len(args.tile)}")
        kw.update(zip(names, args.tile))
    if args.kv_heads is not None:
        if args.op != "attention":
            raise ValueError("--kv-heads applies to --op attention only")
        kw["kv_heads"] = args.kv_heads
    return make_op(args.op, args.shape, **kw)


def _row(r) -> str:
    llc = "   -  " if r.llc_hit_rate is None else f"{r.llc_hit_rate:6.1%}"
    return f"{r.mapping:<18} {r.l2_hit_rate:6.1%} {llc} {r.hbm_bytes / 1e9:9.3f}"


def run(args) -> int:
    """Execute `pykittens chiplet`; 0 on success, 2 on bad input (message on stderr)."""
    try:
        op = _op_from_args(args)
        timing = Timing(args.launch_skew, args.phase_jitter)
        machine = Machine.of(args.target, wgs_per_cu=args.wgs_per_cu)
        table = []
        if args.mapping.strip() == "auto":        # as the library chooses (auto_mapping)
            machine = choice_machine(args.target, args.wgs_per_cu)
            cands = candidates(op, args.target, args.wgs_per_cu)
            table = sweep(op, cands, args.target, machine=machine, timing=timing)
            i = best(table)
            mapping, result = cands[i], table[i]
        else:
            mapping = parse_mapping(args.mapping, op, args.target)
            result = simulate(op, mapping, args.target, machine=machine, timing=timing)
    except ValueError as e:
        print(f"pykittens chiplet: error: {e}", file=sys.stderr)
        return 2
    if args.plot:
        from .plot import plot_mapping
        plot_mapping(args.plot, op, mapping, result, machine, timing)
    if args.json:
        d = result.to_dict()
        d.update(grid=list(op.grid), workgroups=mapping.size, resident=machine.resident,
                 model={"launch_skew": timing.launch_skew, "phase_jitter": timing.phase_jitter,
                        "wgs_per_cu": machine.wgs_per_cu, "modeled": True})
        if table:
            d["candidates"] = [{k: getattr(r, k) for k in
                                ("mapping", "l2_hit_rate", "llc_hit_rate", "hbm_bytes")}
                               for r in table]
        if args.plot:
            d["plot"] = args.plot
        print(json.dumps(d, indent=2))
        return 0
    print(f"{op.describe()} on {machine.name}: {mapping.size} workgroups, "
          f"{machine.resident} resident (modeled)")
    print(f"{'mapping':<18} {'L2 hit':>6} {'LLC hit':>6} {'HBM GB':>9}")
    for r in (table or [result]):
        print(_row(r) + ("   <- chosen" if table and r is result else ""))
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def demo_report() -> str:
    """A small chiplet study for `pykittens demo`: the HipKittens 9216^3 GEMM and a GQA
    attention shape on gfx950, each with its plain launch order and a chiplet-aware one."""
    from .ops import Attention, Gemm
    rows = [("shape", "mapping", "L2 hit", "LLC hit", "HBM GB")]
    gemm = Gemm(9216, 9216, 9216)
    attn = Attention(4, 32, 8192, 128, kv_heads=8)
    cases = [(gemm, "row-major"), (gemm, "xcd:W=5,C=25"), (gemm, "auto"),
             (attn, "naive"), (attn, "head-first"), (attn, "auto")]
    for op, spec in cases:
        m = parse_mapping(spec, op, "gfx950")
        r = simulate(op, m, "gfx950")
        shape = "gemm 9216^3 bf16" if op is gemm else "attn B4 H32 Hkv8 N8192 D128"
        name = f"auto -> {m.spec}" if spec == "auto" else m.spec
        rows.append((shape, name, f"{r.l2_hit_rate:.1%}", f"{r.llc_hit_rate:.1%}",
                     f"{r.hbm_bytes / 1e9:.2f}"))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    table = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d:>{w[3]}}  {e:>{w[4]}}"
             for a, b, c, d, e in rows]
    return "\n".join(["Chiplet-aware grid scheduling on gfx950 (MI355X), modeled L2/LLC hit "
                      "rates:"] + ["  " + line for line in table] +
                     ["  (HipKittens measured 55% / 95% for row-major and 75% / 93% for "
                      "xcd:W=5,C=25; see docs/chiplet.md)"])


def main(argv=None) -> int:
    """`python -m pykittens.chiplet.cli ARGS` == `pykittens chiplet ARGS`."""
    parser = argparse.ArgumentParser(prog="pykittens")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["chiplet", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
