"""The `pykittens` command: demo, compile, emulate, model, chiplet, bench."""
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


class CliError(Exception):
    """A mistake on the command line: main() prints it as one line and exits with 2."""


def resolve_kernel(ref: str):
    """A library kernel name, or `path/to/file.py:name` naming a pk.kernel or a KernelSpec.
    Returns (kernel, spec or None)."""
    from .kernels import KERNELS
    from .kernels.spec import KernelSpec
    from .lang.kernel import Kernel
    if ref in KERNELS:
        return KERNELS[ref].kernel, KERNELS[ref]
    if ":" not in ref:
        raise CliError(f"unknown kernel {ref!r}: use one of {', '.join(KERNELS)} or "
                       "path/to/file.py:function")
    path, name = ref.rsplit(":", 1)
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    spec_ = importlib.util.spec_from_file_location(f"_pk_user_{abs(hash(path))}", path)
    if spec_ is None or spec_.loader is None:
        raise CliError(f"{path} is not a Python file (name it something.py)")
    mod = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(mod)
    except KernelError:
        raise
    except Exception as e:
        tb = e.__traceback__
        line = None
        while tb is not None:                   # the innermost frame in the user's file
            if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        if isinstance(e, SyntaxError):
            line = e.lineno
        where = f"{path}:{line}" if line else path
        raise CliError(f"could not load {where}: {type(e).__name__}: {e}") from None
    obj = getattr(mod, name, None)
    if isinstance(obj, KernelSpec):
        return obj.kernel, obj
    if isinstance(obj, Kernel):
        return obj, None
    if callable(obj):
        raise CliError(f"{path}:{name} is a plain function: decorate it with @pk.kernel")
    raise CliError(f"{path} has no pk.kernel or KernelSpec named {name!r}")


def _consts(pairs, spec) -> dict:
    out = dict(spec.compile_consts) if spec else {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise CliError(f"-D takes NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def _check_target(spec, target: str) -> None:
    """Library kernels name the targets they are written for: say so rather than fail
    somewhere inside the lowering (e.g. a Hopper kernel's shared memory on a CDNA target)."""
    if spec is not None and target not in spec.targets:
        raise CliError(f"{spec.name} runs on {', '.join(spec.targets)} only, not {target}; "
                       f"pick --target {spec.targets[0]}")


def cmd_compile(a) -> int:
    kernel, spec = resolve_kernel(a.kernel)
    _check_target(spec, a.target)
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
        raise CliError(f"{a.kernel} is a bare kernel: emulate needs a KernelSpec (inputs, "
                       "reference, grid); see docs/language.md")
    _check_target(spec, a.target)
    shape = _shape(a.shape, spec)
    dtype = _dtype(a.dtype, spec)
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    res = (_check_isa if a.isa else check)(spec, shape, dtype, a.target, rng)
    ok = True
    how = " (code object, ISA emulator)" if a.isa else ""
    for name, r in res.items():
        passed = r["rel_err"] <= spec.tolerance(dtype)
        ok &= passed
        print(f"{spec.name} {a.target}{how} {dtype} shape={shape} {name}: max_abs_err="
              f"{r['max_abs_err']:.3g} rel_err={r['rel_err']:.3g} "
              f"({'ok' if passed else 'FAIL'}, tol {spec.tolerance(dtype):g}, "
              f"{time.time() - t0:.2f}s)")
    return 0 if ok else 1


def _shape(given, spec) -> tuple:
    """--shape, checked against the kernel's own shapes (how many sizes, each >= 1); by
    default the second of its small shapes (a ragged one), or its only one."""
    if not given:
        if not spec.shapes:
            raise CliError(f"{spec.name} lists no shapes: give --shape")
        return tuple(spec.shapes[1] if len(spec.shapes) > 1 else spec.shapes[0])
    shape = tuple(given)
    if spec.shapes and len(shape) != len(spec.shapes[0]):
        example = " ".join(map(str, spec.shapes[0]))
        raise CliError(f"--shape for {spec.name} takes {len(spec.shapes[0])} sizes (e.g. "
                       f"--shape {example}), got {len(shape)}")
    if any(d < 1 for d in shape):
        raise CliError(f"--shape sizes must be >= 1, got {' '.join(map(str, shape))}")
    return shape


def _dtype(given, spec) -> str:
    """--dtype: one of the kernel's element types (its first by default)."""
    from .ir.types import DTYPES
    if given is None:
        return spec.dtypes[0]
    if given not in DTYPES:
        raise CliError(f"--dtype {given!r} is not an element type: {spec.name} takes "
                       f"{' or '.join(spec.dtypes)}")
    if given not in spec.dtypes:
        raise CliError(f"{spec.name} is checked for --dtype {' or '.join(spec.dtypes)}, not "
                       f"{given}")
    return given


def _check_isa(spec, shape, dtype, target, rng) -> dict:
    """kernels.check, with the kernel's code object run on the ISA emulator."""
    from . import isa
    from .ir.types import dtype_of
    if target not in spec.targets or not target.startswith("gfx"):
        raise CliError(f"--isa runs AMD code objects: {spec.name} on gfx942/gfx950, not "
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


def library_plan(kernel_name, target, *args, **kw):
    """How the library launches a modelled kernel, from the kernels' own launch rules (the
    analysis.model.Launch): GEMMs (kernel, target, m, n, k, dtype, out_dtype),
    attention_fwd and attention_bwd (kernel, target, (B, Hq, Hkv, N, D), dtype, causal=) and
    the row kernels (kernel, target, (rows, cols), dtype)."""
    from .analysis.model import ROWS
    if kernel_name == "attention_fwd":
        return _attention_plan(target, *args, **kw)
    if kernel_name == "attention_bwd":
        return _attention_bwd_plan(target, *args, **kw)
    if kernel_name in ROWS:
        return _rows_plan(kernel_name, target, *args)
    return _gemm_plan(kernel_name, target, *args)


def _attention_inputs(shape, dtype) -> dict:
    """Stand-ins for q, k and v of (B, Hq, Hkv, N, D) as the launch rules read them (shapes
    and element type; np.empty allocates nothing it does not touch)."""
    import numpy as np

    from .ir.types import dtype_of
    b, hq, hkv, n, d = shape
    np_dt = dtype_of(dtype).np
    return {"q": np.empty((b, hq, n, d), np_dt), "k": np.empty((b, hkv, n, d), np_dt),
            "v": np.empty((b, hkv, n, d), np_dt)}


def _attention_plan(target, shape, dtype, causal=False):
    """attention_fwd as pykittens.ops.attention launches it; each workgroup's K/V blocks."""
    from .analysis.model import Launch
    from .kernels.attention import attention_fwd, attention_fwd_launch
    b, hq, hkv, n, d = shape
    grid, consts = attention_fwd_launch(_attention_inputs(shape, dtype), target,
                                        CAUSAL=int(causal))
    bq, bn = 64 * consts["WG"], consts["BN"]
    blocks = -(-n // bq)
    per_block = [-(-(min(n, (q + 1) * bq) if causal else n) // bn) for q in range(blocks)]
    return Launch(attention_fwd, grid, consts, bq, bn, d,
                  iterations=tuple(per_block * (b * hq)))     # query blocks fastest


def _attention_bwd_plan(target, shape, dtype, causal=False):
    """attention_bwd's main pass as pykittens.ops.attention's backward launches it: each
    workgroup (a 128-key block of one KV head) walks the 64-row query blocks of its group's
    query heads that see its keys; and the bytes its passes before and after stream."""
    from .analysis.model import Launch
    from .ir.types import dtype_of
    from .kernels.attention_bwd import attention_bwd, attention_bwd_launch
    b, hq, hkv, n, d = shape
    _, (grid, consts), _ = attention_bwd_launch(_attention_inputs(shape, dtype), target,
                                                CAUSAL=int(causal))
    bm, bn, group = consts["BM"], 128, hq // hkv
    per_block = [group * -(-(n - (j * bn if causal else 0)) // bm) for j in range(-(-n // bn))]
    esz, rows = dtype_of(dtype).bytes, b * hq * n
    # before: o and do read, delta written; dQ's f32 sum zeroed; after: the sum read, dQ written
    around = rows * d * (2 * esz + 4 + 4 + esz) + 4 * rows
    # atomic dQ: each step adds the query block's dQ over the workgroup's keys (f32) into L2,
    # as the other key blocks of its head do to the same rows at about the same time
    reduce = bm * d * 4 if consts.get("DQ_ATOMIC") else 0
    return Launch(attention_bwd, grid, consts, bm, bn, d,
                  iterations=tuple(per_block * (b * hkv)), tensor_bytes=around,
                  reduce_bytes=reduce, reduce_share=-(-n // bn))


def _rows_plan(kernel_name, target, shape, dtype):
    """A row kernel as pykittens.ops launches it, and its tensors' bytes: inputs read,
    outputs written, the backward passes' partial column sums written (and column_sum's
    read), each once."""
    import numpy as np

    from . import kernels as K
    from .analysis.model import Launch
    from .ir.types import dtype_of
    from .kernels import rows as R
    m, n = shape
    dt = dtype_of(dtype)
    x = np.empty((m, n), dt.np)
    row, vec, stat = m * n * dt.bytes, n * dt.bytes, 4 * m
    if kernel_name == "column_sum":               # shape: (partial rows, columns)
        grid, consts = R.column_sum_launch(n, m)
        return Launch(K.column_sum, grid, consts, 0, 0, 0, tensor_bytes=4 * m * n + vec)
    # kernel, its launch rule, the bytes of its tensors, the per-column sums it adds up
    plans = {
        "layernorm": (K.layernorm, lambda: K.stats_launch({"x": x}, target, launch=K.ln_launch),
                      2 * row + 2 * vec + 2 * stat, 0),
        "rmsnorm": (K.rmsnorm, lambda: K.stats_launch({"x": x}, target), 2 * row + vec + stat,
                    0),
        "add_rmsnorm": (K.add_rmsnorm, lambda: K.stats_launch({"x": x}, target),
                        4 * row + vec + stat, 0),
        "softmax": (K.softmax, lambda: K.exact_row_launch({"x": x}, target), 2 * row, 0),
        "softmax_bwd": (K.softmax_bwd, lambda: K.softmax_grad_launch({"y": x}, target),
                        3 * row, 0),
        "rope": (K.rope, lambda: K.rope_launch((1, m, n // 128, 128), 64, False, target),
                 2 * row + 2 * m * 64 * 4, 0),             # x in, out; f32 cos and sin
        "rmsnorm_bwd": (K.rmsnorm_bwd, lambda: K.rms_grad_launch(
            {"x": x, "dy": x, "ds": None}, target, False, True), 3 * row + vec + stat, 1),
        # rmsnorm_bwd as add_rms_norm's backward launches it: the sum's gradient ds added
        "add_rmsnorm_bwd": (K.rmsnorm_bwd, lambda: K.rms_grad_launch(
            {"x": x, "dy": x, "ds": x}, target, True, True), 4 * row + vec + stat, 1),
        "layernorm_bwd": (K.layernorm_bwd, lambda: K.ln_grad_launch({"x": x, "dy": x}, target),
                          3 * row + vec + 2 * stat, 2),
    }
    walk = kernel_name.removesuffix("_fused")
    kernel, launch, nbytes, sums = plans[walk]
    grid, consts = launch()
    partial = (R.ColumnSums.partial_rows(grid[0], consts), sums * n) if sums else ()
    if partial:                                     # the partial column sums it writes
        nbytes += 4 * partial[0] * partial[1]
    if walk == kernel_name:
        return Launch(kernel, grid, consts, 0, 0, 0, tensor_bytes=nbytes, partial_sums=partial)
    # the walk adding up its own partial rows after a grid-wide barrier (rows.FUSED_SUMS):
    # column_sum's bytes (the partial rows read back, the sums written) in the same launch
    if not R.all_resident(grid[0], consts, target):
        raise ValueError(f"{kernel_name} runs only where the walk's whole grid is resident "
                         f"at once; at {m} x {n} the library launches {grid[0]} workgroups "
                         f"of {walk} with PROGRAMS={consts.get('PROGRAMS', 0)}, so the ops "
                         f"take {walk} and column_sum there (model those)")
    from .kernels.layernorm import layernorm_bwd_fused
    from .kernels.rmsnorm import rmsnorm_bwd_fused
    fused = rmsnorm_bwd_fused if walk.endswith("rmsnorm_bwd") else layernorm_bwd_fused
    nbytes += 4 * partial[0] * partial[1] + partial[1] * dt.bytes
    return Launch(fused, grid, consts, 0, 0, 0, tensor_bytes=nbytes)


def _gemm_plan(kernel_name, target, m, n, k, dtype, out_dtype):
    """How the library launches an (m, k) x (n, k) GEMM: the analysis.model.Launch of
    gemm_ws / gemm_pingpong / gemm_basic, from the kernels' own launch rules."""
    from . import kernels as K
    from .analysis.model import Launch
    from .ir.types import dtype_of
    esz, osz = dtype_of(dtype).bytes, dtype_of(out_dtype).bytes
    if kernel_name == "gemm_ws":
        grid, consts = K.gemm_ws_launch({"a": K.Operand((m, k), esz),
                                         "b": K.Operand((n, k), esz),
                                         "c": K.Operand((m, n), osz)}, target)
        return Launch(K.gemm_ws, grid, consts, 128, consts["BN"], 128 // esz, grid[0])
    if kernel_name == "gemm_pingpong":
        grid, consts = K.gemm_pingpong_launch(m, n, k, target, esz)
        return Launch(K.gemm_pingpong, grid, consts, 256, 256, consts["BK"])
    if kernel_name == "gemm_basic":
        grid, consts = K.KERNELS["gemm_basic"].launch({"a": K.Operand((m, k), esz),
                                                       "b": K.Operand((k, n), esz)}, target)
        d = K.gemm_basic.const_defaults
        return Launch(K.gemm_basic, grid, consts, d["BM"], d["BN"], d["BK"])
    raise CliError(f"no launch plan for {kernel_name!r}")


def cmd_model(a) -> int:
    from .analysis import model as perf
    if a.kernel not in perf.MODELED:
        raise CliError(perf.not_modeled(a.kernel))
    try:
        extra = {"causal": True} if a.causal else {}
        res = perf.model(a.kernel, a.target, a.shape, a.dtype, plan=library_plan,
                         chip=a.chip, **extra)
    except (ValueError, KeyError) as e:
        raise CliError(str(e).strip("'\"")) from None
    print(json.dumps(res, indent=2, default=str) if a.json else perf.format_table(res))
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line on stderr (exit status 2), not a usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pykittens", description=__doc__)
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
    e.add_argument("--dtype", default=None, help="element type (default: the kernel's first)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--isa", action="store_true", help="compile for the target and run the "
                   "code object on the instruction-level emulator (gfx942, gfx950)")
    e.set_defaults(fn=cmd_emulate)
    mo = sub.add_parser("model", help="modeled time of a library kernel: GEMMs and "
                        "attention read from their code object's main loop, row kernels "
                        "from their bytes (docs/PERF.md compares it with measurements)")
    mo.add_argument("kernel", help="gemm_ws (sm_90a), gemm_pingpong (gfx942, gfx950), "
                    "gemm_basic (gfx942, gfx950), attention_fwd and attention_bwd (sm_90a) "
                    "or a row kernel (sm_90a: layernorm, rmsnorm, add_rmsnorm, softmax, "
                    "rope, their _bwd kernels, column_sum; add_rmsnorm_bwd is rmsnorm_bwd as "
                    "add_rms_norm's backward launches it; the norms' _bwd_fused kernels add "
                    "up their own column sums)")
    mo.add_argument("--target", required=True, choices=TARGETS)
    mo.add_argument("--shape", type=int, nargs="+", required=True, metavar="DIM",
                    help="GEMMs: M N K; attention: B Hq Hkv N D; row kernels: ROWS COLS")
    mo.add_argument("--causal", action="store_true", help="attention: causal")
    mo.add_argument("--dtype", default="bf16", help="operand type: bf16, f16, e4m3 or e5m2 "
                    "(default: %(default)s)")
    mo.add_argument("--chip", default=None, help="which chip of the target (default: its "
                    "newest: MI325X, MI355X, H200)")
    mo.add_argument("--json", action="store_true")
    mo.set_defaults(fn=cmd_model)
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


def _one_line(msg) -> str:
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    text = " | ".join(lines) or "error"
    return text if len(text) <= 2000 else text[:1997] + "..."


def main(argv=None) -> int:
    """Run the command; every mistake is one line on stderr and a non-zero status (1 for a
    kernel or toolchain error, 2 for bad usage), never a traceback
    ($PYKITTENS_TRACEBACK=1 shows them)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:                  # --help (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else 2
    show = os.environ.get("PYKITTENS_TRACEBACK")
    try:
        code = args.fn(args) or 0
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader went away (`pykittens ... | head`): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("pykittens: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if show:
            raise
        if isinstance(e, NotSupportedYet):
            what, code = "not supported yet", 2
        elif isinstance(e, CliError):
            what, code = "error", 2
        elif isinstance(e, KernelError):
            what, code = "error", 1
        elif isinstance(e, ToolchainError):
            what, code = "toolchain error", 1
        elif isinstance(e, ISAError):
            what, code = "ISA emulator", 1
        elif _user_frame(e) is not None:         # raised by the user's own code
            what, code = "error", 1
            e = f"{_user_frame(e)}: {type(e).__name__}: {e}"
        elif isinstance(e, (ValueError, TypeError, OSError)):
            what, code = "error", 1
        else:
            what, code = f"internal error ({type(e).__name__}; PYKITTENS_TRACEBACK=1 shows "\
                         "where)", 1
        print(f"pykittens: {what}: {_one_line(e)}", file=sys.stderr)
        return code


def _user_frame(e):
    """file:line of the innermost frame of the exception outside pykittens and the Python
    and site-packages libraries: where the user's own code (a KernelSpec, say) raised it."""
    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep
    lib = tuple(p for p in {os.path.dirname(os.__file__), os.path.dirname(np.__file__)} if p)
    tb, found = e.__traceback__, None
    while tb is not None:
        fn = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not fn.startswith(pkg) and not fn.startswith(lib) and "site-packages" not in fn \
                and not fn.startswith("<"):
            found = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


if __name__ == "__main__":
    sys.exit(main())
