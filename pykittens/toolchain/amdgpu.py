"""LLVM IR -> AMD code object (hsaco) for CDNA3/CDNA4, plus its disassembly.

Pipeline: in a child process (toolchain/isolate.py), parse the IR, run LLVM's O3 pipeline and
emit a relocatable ELF object; then link it with `ld.lld -shared` into the code object the HIP
runtime loads. Results are cached on disk (toolchain/cache.py) under a key made of the IR,
the target, the code-object version and the toolchain's versions.

Code generation uses AMD's LLVM through `rocm-llvm-python` (its C API, over ctypes), because it
is the only LLVM on PyPI that carries the AMDGPU assembly parser that inline asm (pinned
registers, hand-placed MFMAs) needs. llvmlite's LLVM has the AMDGPU backend but not that
parser: emitting an object with inline asm aborts the process, so llvmlite is used only as a
fallback for IR without inline asm, when rocm-llvm-python is not installed (or when
$PYKITTENS_AMDGPU_CODEGEN=llvmlite asks for it).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass

from .. import targets
from . import cache
from .isolate import ToolchainError, run_isolated

CODE_OBJECT_VERSIONS = (4, 5, 6)
# What pykittens asks of LLVM and the linker; all of it is part of the cache key, so a
# change here (or in _codegen_* / _link: bump PIPELINE_VERSION) never reuses an old object.
PIPELINE_VERSION = 1
PASSES = "default<O3>"               # the IR pass pipeline, then codegen at -O3, PIC
LINK_FLAGS = ("-shared", "--no-undefined")
_ROCM = "rocm-llvm-python"
_LLVMLITE = "llvmlite"
_INSTALL_ROCM = ("pip install rocm-llvm-python (Linux x86-64, CPython 3.11/3.12; it bundles "
                 "AMD's LLVM with the AMDGPU assembler)")
_INSTALL_LLD = ("install LLVM's linker: `apt-get install lld-19` on Debian/Ubuntu (binary "
                "ld.lld-19), or point $PYKITTENS_LD_LLD at an ld.lld, e.g. ROCm's "
                "/opt/rocm/llvm/bin/ld.lld")


# ----------------------------------------------------------------------------- public API

def compile_ir(ir_text: str, target: str, *, code_object_version: int = 5) -> bytes:
    """Compile AMDGPU LLVM IR to a linked code object (an ELF shared object, "hsaco").

    Code-object v5 is the default because it is what ROCm 6's own compilers emit, so every
    current ROCm runtime loads it; v6 needs a newer runtime. If the IR already carries the
    `amdhsa_code_object_version` module flag it must agree with `code_object_version`. The
    IR goes through LLVM's default<O3> pipeline, then codegen at -O3. LLVM errors (bad IR,
    LDS over the limit, an inline-asm operand the assembler rejects) and LLVM crashes raise
    ToolchainError with the IR saved to a file; LLVM warnings become Python warnings (when
    the code object is built, not on cache hits).
    """
    t = _cdna(target)
    if code_object_version not in CODE_OBJECT_VERSIONS:
        raise ValueError(f"code_object_version must be one of {CODE_OBJECT_VERSIONS}, "
                         f"not {code_object_version!r}")
    ir = _with_code_object_version(ir_text, code_object_version)
    backend = _codegen_backend(ir)
    lld = find_lld()
    key = cache.cache_key("hsaco", ir, t.name, str(code_object_version),
                          f"pipeline {PIPELINE_VERSION}", PASSES, " ".join(LINK_FLAGS),
                          _backend_version(backend), lld_version(lld))
    hit = cache.lookup("hsaco", key)
    if hit is not None:
        return hit
    fn = "_codegen_rocm" if backend == _ROCM else "_codegen_llvmlite"
    out = run_isolated(f"{__name__}:{fn}", {"ir": ir, "cpu": t.name, "triple": t.triple,
                                            "passes": PASSES},
                       what=f"AMDGPU code generation for {t.name} ({backend})", save_text=ir)
    for msg in out["warnings"]:
        if not _PINNED_CLOBBER.match(msg):
            warnings.warn(f"LLVM ({t.name}): {msg}", stacklevel=2)
    hsaco = _link(out["object"], lld, t.name, ir)
    cache.store("hsaco", key, hsaco)
    return hsaco


def disassemble(hsaco: bytes, target: str) -> str:
    """AMDGPU assembly of every function in the code object, one instruction a line.

    Each function starts with `name:`; every branch target gets a label `.L<addr hex>:` and
    branch operands are rewritten to that label, so loops can be found from the text (a
    backward branch is a branch to a label above it). Each instruction line ends with
    `// <addr hex>`. Runs in a child process (the LLVM disassembler is in rocm-llvm-python)
    and is cached like code objects.
    """
    t = _cdna(target)
    if not _have_rocm():
        raise ToolchainError(f"disassembling {t.name} code needs AMD's LLVM: {_INSTALL_ROCM}")
    key = cache.cache_key("asm", hsaco, t.name, f"pipeline {PIPELINE_VERSION}",
                          _backend_version(_ROCM))
    hit = cache.lookup("asm", key)
    if hit is not None:
        return hit.decode()
    text = run_isolated(f"{__name__}:_disassemble", {"hsaco": bytes(hsaco), "cpu": t.name,
                                                     "triple": t.triple},
                        what=f"disassembling a {t.name} code object")
    cache.store("asm", key, text.encode())
    return text


def instructions(hsaco: bytes, target: str) -> dict[str, list[tuple[int, int, str]]]:
    """The code object's instructions, per function: [(address, size in bytes, text)], the
    text as `disassemble` prints it but with branch operands left as the encoded offset.
    What an instruction-level tool needs (the listing's labels and comments are for
    people). Runs in a child process and is cached like `disassemble`."""
    t = _cdna(target)
    if not _have_rocm():
        raise ToolchainError(f"disassembling {t.name} code needs AMD's LLVM: {_INSTALL_ROCM}")
    key = cache.cache_key("insts", hsaco, t.name, f"pipeline {PIPELINE_VERSION}",
                          _backend_version(_ROCM))
    hit = cache.lookup("insts", key)
    if hit is not None:
        return {k: [tuple(i) for i in v] for k, v in json.loads(hit).items()}
    out = run_isolated(f"{__name__}:_decode_functions", {"hsaco": bytes(hsaco), "cpu": t.name,
                                                         "triple": t.triple},
                       what=f"disassembling a {t.name} code object")
    cache.store("insts", key, json.dumps(out).encode())
    return {k: [tuple(i) for i in v] for k, v in out.items()}


def toolchain_version() -> str:
    """Versions of the code generator and linker compile_ir would use for IR with inline asm
    (rocm-llvm-python where installed), e.g. 'rocm-llvm-python 7.2.2...; LLD 19.1.7'."""
    backend = _ROCM if _have_rocm() else _LLVMLITE
    return f"{_backend_version(backend)}; {lld_version(find_lld())}"


def find_lld() -> str:
    """$PYKITTENS_LD_LLD, else ld.lld, ld.lld-NN (newest first), else ROCm's ld.lld."""
    env = os.environ.get("PYKITTENS_LD_LLD")
    if env:
        path = shutil.which(env)
        if path is None:
            raise ToolchainError(f"$PYKITTENS_LD_LLD={env!r} is not an executable; "
                                 f"{_INSTALL_LLD}")
        return path
    for name in ("ld.lld", *(f"ld.lld-{v}" for v in range(30, 16, -1)),
                 "/opt/rocm/llvm/bin/ld.lld"):
        path = shutil.which(name)
        if path:
            return path
    raise ToolchainError(f"no ld.lld found to link AMD code objects; {_INSTALL_LLD}")


def lld_version(path: str) -> str:
    st = os.stat(path)
    return _lld_version(path, st.st_mtime_ns, st.st_size)


# ----------------------------------------------------------------------------- ELF reading
# The code object is a little-endian ELF64 shared object (AMDGPUUsage, "ELF Code Object").
# A stdlib reader keeps the analysis free of extra dependencies.

EM_AMDGPU = 224
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
STT_FUNC = 2


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    type: int
    shndx: int


def elf_sections(data: bytes) -> list[Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file, so not an AMD code object")
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != EM_AMDGPU:
        raise ValueError(f"ELF machine {machine} is not EM_AMDGPU ({EM_AMDGPU})")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = raw[shstrndx][4]

    def name(off):
        s = strtab_off + off
        return data[s:data.index(b"\0", s)].decode()

    return [Section(name(r[0]), r[1], r[3], r[4], r[5], r[6]) for r in raw]


def elf_symbols(data: bytes) -> list[Symbol]:
    """Symbols of .symtab (or .dynsym where the table was stripped)."""
    secs = elf_sections(data)
    tabs = [s for s in secs if s.type == SHT_SYMTAB] or [s for s in secs if s.type == SHT_DYNSYM]
    out = []
    for tab in tabs:
        strs = secs[tab.link].offset
        for off in range(tab.offset + 24, tab.offset + tab.size, 24):   # skip the null entry
            nm, info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
            name = data[strs + nm:data.index(b"\0", strs + nm)].decode()
            out.append(Symbol(name, value, size, info & 0xF, shndx))
    return out


def elf_notes(data: bytes) -> list[tuple[str, int, bytes]]:
    """(owner, type, descriptor) of every note in the SHT_NOTE sections."""
    out = []
    for s in elf_sections(data):
        if s.type != SHT_NOTE:
            continue
        pos, end = s.offset, s.offset + s.size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            pos += 12
            owner = data[pos:pos + namesz].rstrip(b"\0").decode()
            pos += (namesz + 3) & ~3
            out.append((owner, ntype, data[pos:pos + descsz]))
            pos += (descsz + 3) & ~3
    return out


# ----------------------------------------------------------------------------- internals

def _cdna(target):
    t = targets.get(target)
    if t.family != "cdna":
        amd = ", ".join(n for n, x in targets.TARGETS.items() if x.family == "cdna")
        raise ValueError(f"{t.name} is not an AMD target; the AMDGPU toolchain builds code "
                         f"objects for {amd}")
    return t


_COV_FLAG = re.compile(r'!\{\s*i32\s+\d+\s*,\s*!"amdhsa_code_object_version"\s*,'
                       r'\s*i32\s+(\d+)\s*\}')


def _with_code_object_version(ir: str, version: int) -> str:
    """Add the `amdhsa_code_object_version` module flag (value 100 * version) unless the IR
    has it; LLVM's default differs between releases, so it is always made explicit."""
    m = _COV_FLAG.search(ir)
    if m:
        have = int(m.group(1))
        if have != 100 * version:
            raise ValueError(f"the IR sets amdhsa_code_object_version {have} but compile_ir "
                             f"was asked for code object v{version}; pass "
                             f"code_object_version={have // 100} or drop the flag")
        return ir
    n = max((int(x) for x in re.findall(r"!(\d+)\b", ir)), default=-1) + 1
    flag = f'!{n} = !{{i32 1, !"amdhsa_code_object_version", i32 {100 * version}}}'
    if re.search(r"^!llvm\.module\.flags\s*=\s*!\{", ir, re.M):
        ir = re.sub(r"^(!llvm\.module\.flags\s*=\s*!\{)", rf"\g<1>!{n}, ", ir, count=1,
                    flags=re.M)
        return ir.rstrip("\n") + "\n" + flag + "\n"
    return ir.rstrip("\n") + f"\n\n!llvm.module.flags = !{{!{n}}}\n{flag}\n"


_INLINE_ASM = re.compile(r'\basm\s+(?:sideeffect\s+|alignstack\s+|inteldialect\s+|unwind\s+)*"'
                         r'|^\s*module\s+asm\b', re.M)


def _have_rocm() -> bool:
    try:
        return importlib.util.find_spec("rocm.llvm") is not None
    except ImportError:         # no `rocm` package at all
        return False


def _codegen_backend(ir: str) -> str:
    want = os.environ.get("PYKITTENS_AMDGPU_CODEGEN", "").strip()
    if want not in ("", _ROCM, _LLVMLITE):
        raise ValueError(f"$PYKITTENS_AMDGPU_CODEGEN must be {_ROCM!r} or {_LLVMLITE!r}, "
                         f"not {want!r}")
    asm = bool(_INLINE_ASM.search(ir))
    if want == _LLVMLITE and asm:
        raise ToolchainError("$PYKITTENS_AMDGPU_CODEGEN=llvmlite cannot compile this IR: it "
                             "has inline asm and llvmlite's LLVM lacks the AMDGPU assembler; "
                             f"unset it and {_INSTALL_ROCM}")
    if want != _LLVMLITE and _have_rocm():
        return _ROCM
    if want == _ROCM:
        raise ToolchainError(f"$PYKITTENS_AMDGPU_CODEGEN=rocm-llvm-python but it is not "
                             f"installed: {_INSTALL_ROCM}")
    if asm:
        raise ToolchainError("this kernel uses inline asm (pinned registers or hand-placed "
                             "instructions), which needs AMD's LLVM with the AMDGPU assembler: "
                             f"{_INSTALL_ROCM}")
    if importlib.util.find_spec("llvmlite") is None:
        raise ToolchainError(f"no LLVM to generate AMDGPU code: {_INSTALL_ROCM}")
    return _LLVMLITE


def _backend_version(backend: str) -> str:
    if backend == _ROCM:
        return f"{_ROCM} {importlib.metadata.version(_ROCM)}"
    return f"{_LLVMLITE} {importlib.metadata.version(_LLVMLITE)}"


@functools.lru_cache(maxsize=None)
def _lld_version(path: str, _mtime: int, _size: int) -> str:
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    first = (proc.stdout or proc.stderr).strip().splitlines()
    if proc.returncode != 0 or not first:
        raise ToolchainError(f"{path} --version failed (exit status {proc.returncode}); "
                             f"{_INSTALL_LLD}")
    return first[0]


def _link(obj: bytes, lld: str, cpu: str, ir: str) -> bytes:
    """`ld.lld -shared` turns the relocatable object into the loadable code object;
    --no-undefined (as clang passes for AMDGPU) makes a call to a missing device function a
    link error here rather than a load failure on the GPU machine."""
    with tempfile.TemporaryDirectory(prefix="pykittens-lld-") as d:
        src, dst = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        proc = subprocess.run([lld, *LINK_FLAGS, src, "-o", dst],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            fd, path = tempfile.mkstemp(prefix="pykittens-failed-", suffix=".ll")
            with os.fdopen(fd, "w") as f:
                f.write(ir)
            raise ToolchainError(f"{os.path.basename(lld)} failed to link the {cpu} code object "
                                 f"(exit status {proc.returncode}): {proc.stderr.strip()}; "
                                 f"the input was saved to {path}")
        with open(dst, "rb") as f:
            return f.read()


# ----------------------------------------------------------------------------- child side
# These run inside run_isolated's child process: an LLVM abort kills only that process.

class LLVMError(RuntimeError):
    """An error LLVM reported (the parent sees it as ToolchainError)."""


def _one_line(msg: str) -> str:
    """LLVM diagnostics span lines (message, source line, caret); isolate reports one line.
    Location-less diagnostics carry a '<unknown>:0:0: ' prefix that says nothing."""
    parts = [p.strip() for p in msg.splitlines() if p.strip() and set(p.strip()) != {"^"}]
    return " :: ".join(parts).removeprefix("<unknown>:0:0: ")


def _rocm_lib():
    import rocm.llvm
    lib = ctypes.CDLL(os.path.join(os.path.dirname(rocm.llvm.__file__), "librocmllvm.so"))
    for part in ("TargetInfo", "Target", "TargetMC", "AsmPrinter", "AsmParser", "Disassembler"):
        getattr(lib, f"LLVMInitializeAMDGPU{part}")()
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    sig = {
        "LLVMContextCreate": (vp, []),
        "LLVMContextSetDiagnosticHandler": (None, [vp, vp, vp]),
        "LLVMGetDiagInfoSeverity": (ctypes.c_int, [vp]),
        "LLVMGetDiagInfoDescription": (vp, [vp]),
        "LLVMDisposeMessage": (None, [vp]),
        "LLVMCreateMemoryBufferWithMemoryRangeCopy": (vp, [cp, sz, cp]),
        "LLVMParseIRInContext": (ctypes.c_int, [vp, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]),
        "LLVMVerifyModule": (ctypes.c_int, [vp, ctypes.c_int, ctypes.POINTER(vp)]),
        "LLVMGetTarget": (cp, [vp]),
        "LLVMSetTarget": (None, [vp, cp]),
        "LLVMGetDataLayoutStr": (cp, [vp]),
        "LLVMGetTargetFromTriple": (ctypes.c_int, [cp, ctypes.POINTER(vp), ctypes.POINTER(vp)]),
        "LLVMCreateTargetMachine": (vp, [vp, cp, cp, cp, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int]),
        "LLVMCreateTargetDataLayout": (vp, [vp]),
        "LLVMSetModuleDataLayout": (None, [vp, vp]),
        "LLVMCreatePassBuilderOptions": (vp, []),
        "LLVMRunPasses": (vp, [vp, cp, vp, vp]),
        "LLVMGetErrorMessage": (vp, [vp]),
        "LLVMDisposeErrorMessage": (None, [vp]),
        "LLVMTargetMachineEmitToMemoryBuffer": (ctypes.c_int, [vp, vp, ctypes.c_int,
                                                               ctypes.POINTER(vp),
                                                               ctypes.POINTER(vp)]),
        "LLVMGetBufferStart": (vp, [vp]),
        "LLVMGetBufferSize": (sz, [vp]),
        "LLVMCreateDisasmCPU": (vp, [cp, cp, vp, ctypes.c_int, vp, vp]),
        "LLVMDisasmInstruction": (sz, [vp, cp, ctypes.c_uint64, ctypes.c_uint64, cp, sz]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _take_message(lib, ptr) -> str:
    if not ptr:
        return ""
    text = ctypes.string_at(ptr).decode(errors="replace")
    lib.LLVMDisposeMessage(ptr)
    return text


# Pinned registers are where the renderer has the allocator keep out (amdgpu-num-vgpr,
# amdgpu-agpr-alloc), so LLVM notes that the inline asm naming them clobbers registers it
# reserved: that is the design, not news.
_PINNED_CLOBBER = re.compile(r"inline asm clobber list contains reserved registers: "
                             r"[va]\d+(, [va]\d+)*$")
_DIAG_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_LLVM_DS_ERROR, _LLVM_DS_WARNING = 0, 1


def _codegen_rocm(p: dict) -> dict:
    lib = _rocm_lib()
    errors, warns = [], []

    def on_diag(info, _ctx):
        sev = lib.LLVMGetDiagInfoSeverity(info)
        if sev in (_LLVM_DS_ERROR, _LLVM_DS_WARNING):
            msg = _one_line(_take_message(lib, lib.LLVMGetDiagInfoDescription(info)))
            (errors if sev == _LLVM_DS_ERROR else warns).append(msg)
            # Also to stderr at once: if LLVM crashes after an error, the parent's report
            # (the child's stderr tail) still says why.
            sys.stderr.write(f"LLVM {'error' if sev == _LLVM_DS_ERROR else 'warning'}: {msg}\n")
            sys.stderr.flush()

    handler = _DIAG_HANDLER(on_diag)
    ctx = lib.LLVMContextCreate()
    lib.LLVMContextSetDiagnosticHandler(ctx, ctypes.cast(handler, ctypes.c_void_p), None)
    src = p["ir"].encode()
    buf = lib.LLVMCreateMemoryBufferWithMemoryRangeCopy(src, len(src), b"kernel.ll")
    mod, msg = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.LLVMParseIRInContext(ctx, buf, ctypes.byref(mod), ctypes.byref(msg)):
        raise LLVMError(f"could not parse the IR: {_one_line(_take_message(lib, msg))}")
    triple = p["triple"].encode()
    have = lib.LLVMGetTarget(mod) or b""
    if have and have != triple:
        raise ValueError(f"the IR targets {have.decode()!r}, not {p['triple']!r}")
    lib.LLVMSetTarget(mod, triple)
    if lib.LLVMVerifyModule(mod, 2, ctypes.byref(msg)):          # 2 = LLVMReturnStatusAction
        raise LLVMError(f"invalid IR: {_one_line(_take_message(lib, msg))}")
    _take_message(lib, msg)
    tgt = ctypes.c_void_p()
    if lib.LLVMGetTargetFromTriple(triple, ctypes.byref(tgt), ctypes.byref(msg)):
        raise RuntimeError(f"no AMDGPU target in AMD's LLVM: {_take_message(lib, msg)}")
    # opt level 3 (aggressive), reloc 2 (PIC), code model 0 (default): what clang uses for HIP
    tm = lib.LLVMCreateTargetMachine(tgt, triple, p["cpu"].encode(), b"", 3, 2, 0)
    if not lib.LLVMGetDataLayoutStr(mod):
        lib.LLVMSetModuleDataLayout(mod, lib.LLVMCreateTargetDataLayout(tm))
    err = lib.LLVMRunPasses(mod, p.get("passes", PASSES).encode(), tm,
                            lib.LLVMCreatePassBuilderOptions())
    if err:
        m = lib.LLVMGetErrorMessage(err)
        text = ctypes.string_at(m).decode()
        lib.LLVMDisposeErrorMessage(m)
        raise LLVMError(f"LLVM's O3 pipeline failed: {text}")
    out = ctypes.c_void_p()
    failed = lib.LLVMTargetMachineEmitToMemoryBuffer(tm, mod, 1, ctypes.byref(msg),
                                                     ctypes.byref(out))   # 1 = object file
    if failed or errors:
        unique = list(dict.fromkeys(errors))
        detail = "; ".join(e + (f" (x{errors.count(e)})" if errors.count(e) > 1 else "")
                           for e in unique) or _one_line(_take_message(lib, msg))
        raise LLVMError(detail)
    obj = ctypes.string_at(lib.LLVMGetBufferStart(out), lib.LLVMGetBufferSize(out))
    return {"object": obj, "warnings": warns}


def _codegen_llvmlite(p: dict) -> dict:
    """Fallback without inline asm. llvmlite has no diagnostic hook: an LLVM error exits
    the child, and the parent reports the child's stderr."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = llvm.parse_assembly(p["ir"])
    if mod.triple and mod.triple != p["triple"]:
        raise ValueError(f"the IR targets {mod.triple!r}, not {p['triple']!r}")
    mod.triple = p["triple"]
    mod.verify()
    tm = llvm.Target.from_triple(p["triple"]).create_target_machine(
        cpu=p["cpu"], opt=3, reloc="pic", codemodel="default")
    if not mod.data_layout:
        mod.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return {"object": tm.emit_object(mod), "warnings": []}


def _branch_target(text: str, addr: int) -> int | None:
    """SOPP branches encode a signed 16-bit word offset from the next instruction
    (CDNA3 ISA guide, "Program flow control")."""
    op, _, arg = text.partition(" ")
    if not (op == "s_branch" or op.startswith("s_cbranch_")) or op in ("s_cbranch_join",
                                                                         "s_cbranch_g_fork"):
        return None
    try:
        imm = int(arg.strip().split(",")[-1].strip(), 0)
    except ValueError:
        return None
    imm &= 0xFFFF
    if imm >= 0x8000:
        imm -= 0x10000
    return addr + 4 + 4 * imm


def _decode_functions(p: dict) -> dict[str, list[tuple[int, int, str]]]:
    """{function: [(address, size, text)]} of every sized function symbol in .text; bytes
    the disassembler rejects become `.long 0x...` words of 4 bytes."""
    lib = _rocm_lib()
    data = p["hsaco"]
    secs = elf_sections(data)
    text_idx = [i for i, s in enumerate(secs) if s.name == ".text"]
    if not text_idx:
        return {}
    tsec = secs[text_idx[0]]
    funcs = sorted({(s.value, s.size, s.name) for s in elf_symbols(data)
                    if s.type == STT_FUNC and s.shndx == text_idx[0] and s.size})
    dc = lib.LLVMCreateDisasmCPU(p["triple"].encode(), p["cpu"].encode(), None, 0, None, None)
    if not dc:
        raise RuntimeError(f"AMD's LLVM has no disassembler for {p['cpu']}")
    out = ctypes.create_string_buffer(512)
    result = {}
    for start, size, name in funcs:
        insts = []
        pc, end = start, start + size
        while pc < end:
            off = tsec.offset + (pc - tsec.addr)
            # an AMDGPU instruction is at most 12 bytes (64-bit encoding + 32-bit literal)
            chunk = data[off:min(off + 16, tsec.offset + (end - tsec.addr))]
            n = lib.LLVMDisasmInstruction(dc, chunk, len(chunk), pc, out, len(out))
            if n == 0:
                word = struct.unpack_from("<I", data, off)[0] if len(chunk) >= 4 else 0
                insts.append((pc, 4, f".long 0x{word:08x}"))
                pc += 4
                continue
            insts.append((pc, n, " ".join(out.value.decode().split())))
            pc += n
        result[name] = insts
    return result


def _disassemble(p: dict) -> str:
    lines = []
    for name, decoded in _decode_functions(p).items():
        insts = [(pc, text, _branch_target(text, pc)) for pc, _, text in decoded]
        starts = {a for a, _, _ in insts}
        labels = {t for _, _, t in insts if t in starts}
        lines.append(f"{name}:")
        for addr, text, tgt in insts:
            if addr in labels:
                lines.append(f".L{addr:x}:")
            if tgt in labels:
                text = f"{text.split(' ')[0]} .L{tgt:x}"
            lines.append(f"\t{text:<60} // {addr:x}")
        lines.append("")
    return "\n".join(lines)
