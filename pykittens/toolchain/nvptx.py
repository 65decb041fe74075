"""LLVM IR -> PTX (llvmlite's NVPTX backend, in a child process) -> cubin (ptxas), cached.

Two artifacts come out because both are useful: the PTX can be loaded through the driver's
JIT (no CUDA toolkit needed on the GPU machine), and the cubin is what the resource report
reads (`ptxas -v`) and what a launch loads without JIT latency. A missing ptxas is not an
error: the result then has `cubin=None` and the caller falls back to PTX.

Where the tools come from, in order: $PYKITTENS_PTXAS (or $PYKITTENS_CUOBJDUMP, ...), PATH,
$CUDA_HOME/bin, /usr/local/cuda/bin, the PyPI wheels that ship NVIDIA's binaries
(nvidia-cuda-nvcc / nvidia-cuda-nvcc-cu12 for ptxas, nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm for SASS), and last Triton's bundled copy (torch on a GPU machine brings
one). A candidate that exists but does not run (a dangling wrapper) is skipped.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile

from .. import targets as _targets
from . import cache
from .isolate import ToolchainError, run_isolated

# PTX ISA 8.0 (CUDA 12.0) is the first that accepts `.target sm_90a` (and wgmma); 8.4
# (CUDA 12.4) adds mma.sync on fp8 (e4m3/e5m2) operands, which the fp8 matrix tiles use.
# LLVM 22 refuses sm_90a without an explicit ptx feature; CUDA 12.4+ drivers JIT 8.4.
PTX_FEATURES = "+ptx84"

# ptxas flags besides the output (-o) and the input; part of the cubin cache key.
PTXAS_FLAGS = ("-v",)

# Functions the CUDA toolchain itself resolves; any other `.extern .func` is a bug in the IR.
_BUILTIN_EXTERNS = frozenset({"vprintf", "__assertfail", "malloc", "free"})

_PYPI_BIN_DIRS = ("cu13/bin", "cu12/bin", "cuda_nvcc/bin", "cuda_cuobjdump/bin",
                  "cuda_nvdisasm/bin")

_PYPI_PACKAGE = {"ptxas": "nvidia-cuda-nvcc-cu12 (or nvidia-cuda-nvcc)",
                 "cuobjdump": "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm",   # -sass runs nvdisasm
                 "nvdisasm": "nvidia-cuda-nvdisasm"}


class UnresolvedFunctionError(ToolchainError):
    """The PTX calls a function nothing defines — almost always a misspelled intrinsic."""


# ---- finding the CUDA binaries --------------------------------------------------------------

_RUNS: dict[tuple[str, float], str | None] = {}


def _version_of(path: str) -> str | None:
    """`tool --version`'s release (e.g. '13.0.88'), or None when the binary does not run."""
    try:
        key = (path, os.stat(path).st_mtime)
    except OSError:
        return None
    if key not in _RUNS:
        try:
            p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            out = p.stdout + p.stderr
            m = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
            _RUNS[key] = (m.group(1) if m else out.strip().splitlines()[-1]) \
                if p.returncode == 0 and out.strip() else None
        except (OSError, subprocess.SubprocessError):
            _RUNS[key] = None
    return _RUNS[key]


def _candidates(name: str):
    env = os.environ.get(f"PYKITTENS_{name.upper()}")
    if env:
        yield env
        return
    hit = shutil.which(name)
    if hit:
        yield hit
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            yield os.path.join(os.environ[var], "bin", name)
    yield os.path.join("/usr/local/cuda/bin", name)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in _PYPI_BIN_DIRS:
            yield os.path.join(root, sub, name)
    if name == "ptxas":
        spec = importlib.util.find_spec("triton")
        if spec and spec.origin:
            yield os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", name)


def find_cuda_tool(name: str) -> str | None:
    """Path of a CUDA binary (ptxas, cuobjdump, nvdisasm) that really runs, or None.

    $PYKITTENS_<NAME> pins the choice; if it names something that does not run, that is an
    error rather than a silent fallback, since the user asked for that exact binary."""
    env = os.environ.get(f"PYKITTENS_{name.upper()}")
    for path in _candidates(name):
        if os.path.isfile(path) and os.access(path, os.X_OK) and _version_of(path):
            return path
    if env:
        raise ToolchainError(f"PYKITTENS_{name.upper()}={env} is not a runnable {name}; "
                             f"point it at a working binary or unset it")
    return None


def install_hint(name: str) -> str:
    return (f"{name} not found: install the CUDA toolkit, or `pip install "
            f"{_PYPI_PACKAGE.get(name, name)}`, or set PYKITTENS_{name.upper()}")


def find_ptxas() -> str | None:
    return find_cuda_tool("ptxas")


def toolchain_version() -> str:
    """One line naming every tool whose version changes the output (logged with results)."""
    import llvmlite
    import llvmlite.binding as llvm
    llvm_v = ".".join(map(str, llvm.llvm_version_info))
    ptxas = find_ptxas()
    tail = f"ptxas {_version_of(ptxas)} ({ptxas})" if ptxas else "ptxas not found"
    return f"llvmlite {llvmlite.__version__} (LLVM {llvm_v}), {tail}"


# ---- LLVM IR -> PTX (runs in the child process) ----------------------------------------------

def _emit_ptx(payload: dict) -> str:
    """Child-process side: parse, verify, optimize, emit. One-line errors, since the parent
    reports only the first line of the child's exception."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        mod = llvm.parse_assembly(payload["ir"])
        mod.verify()
    except RuntimeError as e:
        raise ValueError("invalid LLVM IR: " + " | ".join(
            line.strip() for line in str(e).splitlines() if line.strip())) from None
    tm = llvm.Target.from_triple(payload["triple"]).create_target_machine(
        cpu=payload["cpu"], features=payload["features"], opt=payload["opt"])
    if payload["opt"] > 0:
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(payload["opt"]))
        pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


_EXTERN = re.compile(r"^\s*\.extern\s+\.func\b([^;]*);", re.M)
_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)", re.M)


def extern_functions(ptx: str) -> list[str]:
    """Names of the functions the PTX declares but does not define (`.extern .func`)."""
    names = []
    for m in _EXTERN.finditer(ptx):
        decl = re.sub(r"^\s*\([^)]*\)", "", m.group(1))      # drop the return-value spec
        name = re.match(r"\s*([\w$.%]+)", decl)
        if name and name.group(1) not in _BUILTIN_EXTERNS:
            names.append(name.group(1))
    return names


def entry_names(ptx: str) -> list[str]:
    return _ENTRY.findall(ptx)


def _save(text: str, suffix: str) -> str:
    fd, path = tempfile.mkstemp(prefix="pykittens-failed-", suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _check_externs(ptx: str, ir_text: str) -> None:
    bad = extern_functions(ptx)
    if bad:
        path = _save(ir_text, ".ll")
        raise UnresolvedFunctionError(
            f"the PTX calls undefined function(s) {', '.join(bad)}: LLVM turns a call to an "
            "unknown intrinsic into a call to an external function, so this is almost always "
            "a misspelled `llvm.nvvm.*` intrinsic name (or a device function the module "
            f"forgot to define); fix the name in the LLVM IR. The IR was saved to {path}")


def _nv_target(target: str):
    t = _targets.get(target)
    if not t.triple.startswith("nvptx"):
        nv = [n for n, x in _targets.TARGETS.items() if x.triple.startswith("nvptx")]
        raise ValueError(f"target {t.name!r} is not an NVIDIA target; the NVPTX toolchain "
                         f"compiles for {', '.join(nv)}")
    return t


def compile_ptx(ir_text: str, target: str = "sm_90a", *, opt: int = 3,
                use_cache: bool = True) -> str:
    """LLVM IR text -> PTX text, in a child process, cached on disk."""
    import llvmlite
    import llvmlite.binding as llvm
    t = _nv_target(target)
    key = cache.cache_key("nvptx-ptx-1", ir_text, t.name, llvmlite.__version__,
                          repr(llvm.llvm_version_info), PTX_FEATURES, str(opt))
    hit = cache.lookup("ptx", key) if use_cache else None
    if hit is not None:
        return hit.decode()
    ptx = run_isolated(f"{__name__}:_emit_ptx",
                       {"ir": ir_text, "triple": t.triple, "cpu": t.name,
                        "features": PTX_FEATURES, "opt": opt},
                       what=f"LLVM NVPTX code generation for {t.name}", save_text=ir_text)
    _check_externs(ptx, ir_text)
    if use_cache:
        cache.store("ptx", key, ptx.encode())
    return ptx


# ---- PTX -> cubin (ptxas) -------------------------------------------------------------------

def _run_ptxas(ptxas: str, ptx: str, arch: str) -> tuple[bytes, str]:
    with tempfile.TemporaryDirectory(prefix="pykittens-ptxas-") as d:
        src, out = os.path.join(d, "kernel.ptx"), os.path.join(d, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run([ptxas, f"-arch={arch}", *PTXAS_FLAGS, "-o", out, src],
                           capture_output=True, text=True, timeout=600)
        log = (p.stdout + p.stderr).replace(src, "kernel.ptx")
        if p.returncode != 0 or not os.path.exists(out):
            path = _save(ptx, ".ptx")
            raise ToolchainError(f"ptxas ({ptxas}) failed for {arch} with exit status "
                                 f"{p.returncode}; the PTX was saved to {path}\n"
                                 f"{log.strip()[-3000:]}")
        with open(out, "rb") as f:
            return f.read(), log


def assemble(ptx: str, target: str = "sm_90a", *, use_cache: bool = True) -> tuple[bytes | None, str]:
    """PTX -> (cubin, ptxas -v log), or (None, reason) when no ptxas is installed."""
    t = _nv_target(target)
    ptxas = find_ptxas()
    if ptxas is None:
        return None, install_hint("ptxas")
    key = cache.cache_key("nvptx-cubin-1", ptx, t.name, " ".join(PTXAS_FLAGS),
                          f"ptxas {_version_of(ptxas) or ''}")
    if use_cache:
        cubin, log = cache.lookup("cubin", key), cache.lookup("ptxas-log", key)
        if cubin is not None and log is not None:
            return cubin, log.decode()
    cubin, log = _run_ptxas(ptxas, ptx, t.name)
    if use_cache:
        cache.store("ptxas-log", key, log.encode())     # log first: a cubin implies its log
        cache.store("cubin", key, cubin)
    return cubin, log


def compile_ir(ir_text: str, target: str = "sm_90a", *, opt: int = 3,
               use_cache: bool = True) -> dict:
    """LLVM IR text -> {'ptx', 'cubin' (None without ptxas), 'ptxas_log', 'target', 'kernels'}.

    `kernels` lists the PTX `.entry` names, so callers need not parse the PTX themselves."""
    ptx = compile_ptx(ir_text, target, opt=opt, use_cache=use_cache)
    cubin, log = assemble(ptx, target, use_cache=use_cache)
    return {"ptx": ptx, "cubin": cubin, "ptxas_log": log, "target": _nv_target(target).name,
            "kernels": entry_names(ptx)}
