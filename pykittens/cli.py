"""The `pykittens` command: demo, compile, emulate, chiplet, bench."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

from . import compiler
from .ir.errors import KernelError, NotSupportedYet
from .isa.state import ISAError
from .targets import NAMES as TARGETS
from .toolchain.isolate import ToolchainError


def resolve_kernel(ref: str):
    """A library kernel name, or `path/to/file.py:name` naming a pk.kernel or a KernelSpec.
    Returns (kernel, spec or None)."""
    from .kernels import KERNELS
    from .kernels.spec import KernelSpec
    from .lang.kernel import Kernel
    if ref in KERNELS:
        return KERNELS[ref].kernel, KERNELS[ref]
    if ":" not in ref:
        raise SystemExit(f"unknown kernel {ref!r}: use one of {', '.join(KERNELS)} or "
                         "path/to/file.py:function")
    path, name = ref.rsplit(":", 1)
    if not os.path.exists(path):
        raise SystemExit(f"no such file: {path}")
    spec_ = importlib.util.spec_from_file_location(f"_pk_user_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    obj = getattr(mod, name, None)
    if isinstance(obj, KernelSpec):
        return obj.kernel, obj
    if isinstance(obj, Kernel):
        return obj, None
    raise SystemExit(f"{path} has no pk.kernel or KernelSpec named {name!r}")


def _consts(pairs, spec) -> dict:
    out = dict(spec.compile_consts) if spec else {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"-D takes NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def cmd_compile(a) -> int:
    kernel, spec = resolve_kernel(a.kernel)
    consts = _consts(a.define, spec)
    if a.report:
        rep = compiler.report(kernel, a.target, **consts)
        if a.json:
            print(json.dumps(rep, indent=2, sort_keys=True, default=str))
        else:
            for k, v in rep.items():
                print(f"{k:28s} {v}")
        return 0
    print(compiler.emit(kernel, a.target, a.emit, **consts))
    return 0


def cmd_emulate(a) -> int:
    from .kernels.spec import check
    kernel, spec = resolve_kernel(a.kernel)
    if spec is None:
        raise SystemExit(f"{a.kernel} is a bare kernel: emulate needs a KernelSpec (inputs, "
                         "reference, grid); see docs/language.md")
    shape = tuple(a.shape) if a.shape else spec.shapes[1]
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    res = (_check_isa if a.isa else check)(spec, shape, a.dtype, a.target, rng)
    ok = True
    how = " (code object, ISA emulator)" if a.isa else ""
    for name, r in res.items():
        passed = r["rel_err"] <= spec.tolerance(a.dtype)
        ok &= passed
        print(f"{spec.name} {a.target}{how} {a.dtype} shape={shape} {name}: max_abs_err="
              f"{r['max_abs_err']:.3g} rel_err={r['rel_err']:.3g} "
              f"({'ok' if passed else 'FAIL'}, tol {spec.tolerance(a.dtype):g}, "
              f"{time.time() - t0:.2f}s)")
    return 0 if ok else 1


def _check_isa(spec, shape, dtype, target, rng) -> dict:
    """kernels.check, with the kernel's code object run on the ISA emulator."""
    from . import isa
    from .ir.types import dtype_of
    if target not in spec.targets or not target.startswith("gfx"):
        raise SystemExit(f"--isa runs AMD code objects: {spec.name} on gfx942/gfx950, not "
                         f"{target}")
    inputs = spec.poison(spec.make_inputs(shape, dtype_of(dtype), rng))
    grid, consts = spec.launch(inputs, target)
    got = isa.emulate(spec.kernel, grid=grid, target=target, **inputs, **consts)
    return spec.errors(got, spec.reference(inputs))


def cmd_demo(a) -> int:
    from .demo import run_demo
    return run_demo(quick=a.quick)


def cmd_bench(a) -> int:
    from .bench import ops
    if a.list:
        print("\n".join(ops.FAMILY_NAMES))
        return 0
    return ops.main(a.families, a.out, quick=a.quick, dtypes=a.dtype, reps=a.reps)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pykittens", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="trace, lower and emulate the library kernels for every "
                       "target; compile reports and a chiplet study where available")
    d.add_argument("--quick", action="store_true", help="one shape per kernel")
    d.set_defaults(fn=cmd_demo)
    c = sub.add_parser("compile", help="print a compile stage or the resource report")
    c.add_argument("kernel", help="library kernel name or path/to/file.py:function")
    c.add_argument("--target", required=True, choices=TARGETS)
    c.add_argument("--emit", default="tile", choices=compiler.STAGES)
    c.add_argument("--report", action="store_true", help="resource report of the code object")
    c.add_argument("--json", action="store_true")
    c.add_argument("-D", "--define", action="append", metavar="NAME=VALUE",
                   help="compile-time constant")
    c.set_defaults(fn=cmd_compile)
    e = sub.add_parser("emulate", help="run a kernel in the emulator against its reference")
    e.add_argument("kernel")
    e.add_argument("--target", required=True, choices=TARGETS)
    e.add_argument("--shape", type=int, nargs="+")
    e.add_argument("--dtype", default="f32")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--isa", action="store_true", help="compile for the target and run the "
                   "code object on the instruction-level emulator (gfx942, gfx950)")
    e.set_defaults(fn=cmd_emulate)
    from .bench.ops import FAMILY_NAMES
    b = sub.add_parser("bench", help="time pykittens.ops against torch (eager, compile, "
                       "cuBLAS/cuDNN) and QuACK on this GPU: JSON, Markdown and a PNG chart "
                       "per family",
                       description="Time the torch ops of pykittens.ops against their peers "
                       "on the GPU present, after checking each result against torch; write "
                       "FAMILY.json, FAMILY.md and FAMILY.png per family to --out. Needs a "
                       "GPU (without one it says so and exits 1).")
    b.add_argument("families", nargs="*", metavar="FAMILY",
                   help=f"{', '.join(FAMILY_NAMES)} (default: all)")
    b.add_argument("--out", default="bench-results", help="output directory "
                   "(default: %(default)s)")
    b.add_argument("--quick", action="store_true", help="one or two shapes per family")
    b.add_argument("--dtype", action="append", choices=("bf16", "f32"),
                   help="element types of the row ops (default: bf16 and f32)")
    b.add_argument("--reps", type=int, default=20, help="calls per timed CUDA graph "
                   "(default: %(default)s)")
    b.add_argument("--list", action="store_true", help="print the families and exit")
    b.set_defaults(fn=cmd_bench)
    try:
        from .chiplet import cli as chiplet_cli
    except ImportError:
        chiplet_cli = None
    if chiplet_cli is not None:
        sp = chiplet_cli.add_parser(sub) or sub.choices["chiplet"]
        sp.set_defaults(fn=chiplet_cli.run)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except NotSupportedYet as e:
        print(f"pykittens: not supported yet: {e}", file=sys.stderr)
        return 2
    except KernelError as e:
        print(f"pykittens: error: {e}", file=sys.stderr)
        return 1
    except ToolchainError as e:
        print(f"pykittens: toolchain error: {e}", file=sys.stderr)
        return 1
    except ISAError as e:
        print(f"pykittens: ISA emulator: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
