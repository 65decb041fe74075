"""Which of the toolchains' tools this machine has, and how to get the others.

Each vendor's code objects need their own tools: AMD's LLVM (rocm-llvm-python: inline asm,
disassembly) and an ld.lld for CDNA; ptxas, cuobjdump and nvdisasm for Hopper; llvmlite for
both. An install may leave one vendor's out (`./install.sh --nvidia-only`), and a Python
without a rocm-llvm-python wheel has no AMD inline asm. A step that needs a missing tool
raises ToolMissing naming the tool, the step and the remedy; `pykittens demo` prints
`status()`, and the tests skip with the same words.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import dataclass

from .isolate import ToolchainError

ROCM = "rocm-llvm-python"
# The Pythons and machines rocm-llvm-python publishes wheels for.
ROCM_PYTHONS = ((3, 11), (3, 12))
ROCM_PLATFORM = ("Linux", "x86_64")


_SPOKEN = {ROCM: f"AMD's LLVM ({ROCM})", "ld.lld": "an ld.lld (LLVM's linker)"}


class ToolMissing(ToolchainError):
    """A step needs a tool this machine does not have (not a failure of the tool). `tool` is
    the name status() lists it under."""

    def __init__(self, tool: str, step: str, hint: str):
        self.tool, self.step, self.hint = tool, step, hint
        super().__init__(f"{step} needs {_SPOKEN.get(tool, tool)}, which is not installed "
                         f"here: {hint}")


@dataclass(frozen=True)
class Tool:
    name: str
    vendor: str               # 'amd', 'nvidia' or 'both'
    purpose: str              # what it is needed for
    found: str | None         # version or path where installed; None where missing
    hint: str                 # how to get it (empty where installed)


def rocm_wheel_exists() -> bool:
    """Whether rocm-llvm-python publishes a wheel for this Python on this machine."""
    return (platform.system(), platform.machine()) == ROCM_PLATFORM and \
        sys.version_info[:2] in ROCM_PYTHONS


def rocm_hint() -> str:
    pys = "/".join(f"{a}.{b}" for a, b in ROCM_PYTHONS)
    if rocm_wheel_exists():
        return f"pip install {ROCM} (or run ./install.sh): it bundles AMD's LLVM with the " \
               "AMDGPU assembler"
    here = f"CPython {sys.version_info[0]}.{sys.version_info[1]} on " \
           f"{platform.system()} {platform.machine()}"
    return (f"{ROCM} has wheels for CPython {pys} on Linux x86-64 only and this is {here}; "
            f"use such a Python for AMD inline-asm code objects and disassembly "
            f"(e.g. PYTHON=python3.12 ./install.sh)")


def have_rocm() -> bool:
    try:
        return importlib.util.find_spec("rocm.llvm") is not None
    except ImportError:         # no `rocm` package at all
        return False


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def status() -> list[Tool]:
    """Every tool, installed or not, in the order the pipeline uses them."""
    from . import amdgpu, nvptx
    out = []
    found = (_version("llvmlite") or "installed") \
        if importlib.util.find_spec("llvmlite") else None
    out.append(Tool("llvmlite", "both", "LLVM IR -> PTX; AMD code objects without inline asm",
                    found, "" if found else "pip install llvmlite"))
    found = (_version(ROCM) or "installed") if have_rocm() else None
    out.append(Tool(ROCM, "amd", "AMD code objects with inline asm (pinned registers), "
                    "disassembly, reports, the ISA emulator", found,
                    "" if found else rocm_hint()))
    try:
        found = amdgpu.find_lld()
        hint = ""
    except ToolMissing as e:
        found, hint = None, e.hint
    out.append(Tool("ld.lld", "amd", "linking AMD code objects", found, hint))
    for name, purpose in (("ptxas", "cubins and their resource reports"),
                          ("cuobjdump", "SASS listings (with nvdisasm)"),
                          ("nvdisasm", "SASS listings")):
        found = nvptx.find_cuda_tool(name)
        out.append(Tool(name, "nvidia", purpose, found,
                        "" if found else nvptx.install_hint(name).split(": ", 1)[-1]))
    return out


def missing(vendor: str | None = None) -> list[Tool]:
    """The tools not installed here (of one vendor, 'amd' or 'nvidia', where given)."""
    return [t for t in status() if t.found is None and
            (vendor is None or t.vendor in (vendor, "both"))]
