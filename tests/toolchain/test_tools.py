"""Installs without some tools: a Python with no rocm-llvm-python wheel (3.13), and the
one-vendor installs (./install.sh --amd-only / --nvidia-only). Each is simulated here by hiding
the tool (the `rocm` module blocked from import, the linker and CUDA finders returning
nothing), so the degraded paths are tested on a machine that has everything: the steps that
need the tool say so, `pykittens demo` names what is missing, and the tests that need it
skip with that reason instead of failing."""
from __future__ import annotations

import os
import subprocess
import sys
import types
import xml.etree.ElementTree as ET

import pytest

from pykittens.toolchain import ToolchainError, ToolMissing, amdgpu, tools

from conftest import ROOT

NAMES = ["llvmlite", "rocm-llvm-python", "ld.lld", "ptxas", "cuobjdump", "nvdisasm"]

# Python run before pytest in the child: make the named vendor's tools vanish.
HIDE = {
    "rocm": "import sys; sys.modules['rocm'] = None; sys.modules['rocm.llvm'] = None\n",
    "amd": ("import sys; sys.modules['rocm'] = None; sys.modules['rocm.llvm'] = None\n"
            "from pykittens.toolchain import amdgpu, tools\n"
            "def _no_lld():\n"
            "    raise tools.ToolMissing('ld.lld', 'linking AMD code objects', 'hidden')\n"
            "amdgpu.find_lld = _no_lld\n"),
    # nowhere to look for ptxas, cuobjdump, nvdisasm but an explicit $PYKITTENS_<TOOL>
    "nvidia": ("import os, sys\n"
               "from pykittens.toolchain import nvptx\n"
               "def _candidates(name):\n"
               "    env = os.environ.get('PYKITTENS_' + name.upper())\n"
               "    if env:\n"
               "        yield env\n"
               "nvptx._candidates = _candidates\n"),
}


def test_status_names_every_tool():
    st = tools.status()
    assert [t.name for t in st] == NAMES
    for t in st:
        assert t.vendor in ("amd", "nvidia", "both") and t.purpose
        assert (t.found is None) == bool(t.hint), t


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI installs every toolchain")
def test_ci_has_every_tool():
    """CI runs the full install: nothing may be missing there, or tests that need it
    would skip unnoticed."""
    assert not tools.missing(), tools.missing()


def test_rocm_hint_on_a_python_without_the_wheel(monkeypatch):
    monkeypatch.setattr(tools, "sys", types.SimpleNamespace(version_info=(3, 13, 1)))
    monkeypatch.setattr(tools.platform, "system", lambda: "Linux")
    monkeypatch.setattr(tools.platform, "machine", lambda: "x86_64")
    assert not tools.rocm_wheel_exists()
    hint = tools.rocm_hint()
    assert "wheels for CPython 3.11/3.12 on Linux x86-64 only" in hint
    assert "this is CPython 3.13 on Linux x86_64" in hint and "PYTHON=python3.12" in hint
    monkeypatch.setattr(tools, "sys", types.SimpleNamespace(version_info=(3, 12, 4)))
    assert tools.rocm_wheel_exists() and "pip install rocm-llvm-python" in tools.rocm_hint()


def _block_rocm(monkeypatch):
    monkeypatch.setitem(sys.modules, "rocm", None)
    monkeypatch.setitem(sys.modules, "rocm.llvm", None)


def test_without_rocm_the_steps_that_need_it_say_so(monkeypatch):
    from test_amdgpu import mfma_loop_ir, pinned_ir
    before = {t.name for t in tools.missing()}
    _block_rocm(monkeypatch)
    assert not tools.have_rocm()
    assert {t.name for t in tools.missing()} == before | {"rocm-llvm-python"}
    with pytest.raises(ToolMissing) as e:
        amdgpu.compile_ir(pinned_ir("gfx942"), "gfx942")
    assert e.value.tool == "rocm-llvm-python" and isinstance(e.value, ToolchainError)
    assert "inline asm" in str(e.value) and "AMD's LLVM (rocm-llvm-python)" in str(e.value)
    obj = amdgpu.compile_ir(mfma_loop_ir("gfx942"), "gfx942")     # llvmlite builds it
    with pytest.raises(ToolMissing, match="disassembling gfx942 code needs AMD's LLVM"):
        amdgpu.disassemble(obj, "gfx942")


def test_demo_names_what_is_missing(monkeypatch):
    from pykittens import demo
    _block_rocm(monkeypatch)
    lines = demo.toolchain_lines()
    assert lines[0].startswith("  toolchains here: llvmlite") and "rocm" not in lines[0]
    assert any(line.startswith("  missing rocm-llvm-python (AMD code objects with inline asm")
               and tools.rocm_hint() in line for line in lines)


def _pytest_child(hide: str, tests: list[str], tmp_path) -> list[tuple[str, str, str]]:
    """Run `tests` in a child pytest with `hide`'s tools hidden: (test, outcome, message)."""
    xml = tmp_path / "report.xml"
    code = HIDE[hide] + ("import pytest\n"
                         f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
                         f"'--junitxml={xml}', *{tests!r}]))\n")
    if "import sys" not in code.split("\n")[0]:
        code = "import sys\n" + code
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYKITTENS_CACHE": str(tmp_path / "cache")})
    assert xml.exists(), p.stdout + p.stderr
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        kids = [k for k in case if k.tag in ("failure", "error", "skipped")]
        if kids:
            out.append((name, kids[0].tag, kids[0].get("message", "")))
        else:
            out.append((name, "passed", ""))
    return out


def _only_skips(results, *reasons: str):
    """No test failed; some were skipped, each for one of `reasons`."""
    bad = [r for r in results if r[1] in ("failure", "error")]
    assert not bad, bad
    skipped = [r for r in results if r[1] == "skipped"]
    assert skipped, results
    assert all(any(why in msg for why in reasons) for _, _, msg in skipped), skipped
    return skipped


AMD_TESTS = [
    "tests/toolchain/test_amdgpu.py::test_inline_asm_on_pinned_agprs",
    "tests/toolchain/test_amdgpu.py::test_toolchain_version_names_both_tools",
    "tests/test_cli.py::test_compile_stages",
    "tests/test_cli.py::test_compile_report_json",
    "tests/test_cdna_static.py::test_vgpr_pins_bound_the_allocator",
    "tests/isa/test_isa_kernels.py::test_isa_entry_points_and_errors",
]


def test_amd_tests_skip_without_rocm_llvm_python(tmp_path):
    """As on Python 3.13: the AMD inline-asm tests skip, naming the missing wheel; what
    needs no AMD LLVM (the other stages, llvmlite code objects) still runs."""
    res = _pytest_child("rocm", AMD_TESTS, tmp_path)
    skipped = _only_skips(res, "rocm-llvm-python")
    assert len(skipped) >= 8, res
    assert any(r[1] == "passed" for r in res), res       # e.g. the tile/lane/llvm stages


def test_amd_tests_skip_in_an_nvidia_only_install(tmp_path):
    res = _pytest_child("amd", AMD_TESTS + ["tests/toolchain/test_amdgpu.py::"
                                            "test_mfma_loop_builds_a_v5_code_object"], tmp_path)
    _only_skips(res, "rocm-llvm-python is not installed", "ld.lld is not installed")
    assert any("ld.lld is not installed" in r[2] for r in res), res   # llvmlite built it


HOPPER_TESTS = [
    "tests/test_hopper_static.py::test_library_kernel_cubin",
    "tests/test_hopper_sync.py::test_hopper_ptx_and_cubin",
    "tests/test_cli.py::test_compile_report_json_hopper",
    "tests/toolchain/test_nvptx.py",
    "tests/analysis/test_cubin.py::test_report_with_sass",
]


def test_hopper_tests_skip_in_an_amd_only_install(tmp_path):
    """Without ptxas a Hopper build stops at PTX (that still runs through the driver's JIT);
    the tests of cubins and SASS skip, naming the tool."""
    res = _pytest_child("nvidia", HOPPER_TESTS, tmp_path)
    skipped = _only_skips(res, "is not installed", "not found")
    assert all(any(t in r[2] for t in ("ptxas", "cuobjdump", "nvdisasm")) for r in skipped)
    assert any(r[1] == "passed" for r in res), res       # the PTX side
