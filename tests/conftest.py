"""Shared fixtures and helpers for the core tests (language, IR, lowering, emulator)."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pykittens.kernels.spec import rel_err as library_rel_err  # noqa: E402  (after the path)
from pykittens.toolchain import tools  # noqa: E402

TARGETS = ("gfx942", "gfx950", "sm_90a")
# The fp8 flavours each target supports: FNUZ on CDNA3, OCP on CDNA4 and Hopper.
FP8 = {"gfx942": ("e4m3fnuz", "e5m2fnuz"), "gfx950": ("e4m3", "e5m2"),
       "sm_90a": ("e4m3", "e5m2")}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 1e-2}


# ---- tools this machine may lack ------------------------------------------------------------
# An install may leave one vendor's toolchain out (./install.sh --amd-only / --nvidia-only),
# and rocm-llvm-python has no wheel for some Pythons (3.13). A test that meets a tool missing
# here (ToolMissing raised, or another error raised while handling one: the CLI's exit
# status, a pytest.raises that expected the tool's own message) is skipped with the tool's
# remedy. Only tools missing when the session started count, so a test that hides a tool
# on purpose (monkeypatch) still fails where it should.

MISSING_TOOLS = {t.name: t.hint for t in tools.status() if t.found is None}



def _needs(tool: str):
    return pytest.mark.skipif(tool in MISSING_TOOLS,
                              reason=f"{tool} is not installed: {MISSING_TOOLS.get(tool)}")


needs_amd_llvm = _needs(tools.ROCM)
# Without ptxas a Hopper build is PTX only (the result's cubin is None, the report's register
# counts too); without cuobjdump and nvdisasm the report has no SASS (loop instruction mix).
needs_ptxas = _needs("ptxas")
needs_sass = lambda f: _needs("nvdisasm")(_needs("cuobjdump")(_needs("ptxas")(f)))  # noqa: E731


def _missing_tool(exc: BaseException | None) -> tools.ToolMissing | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, tools.ToolMissing) and exc.tool in MISSING_TOOLS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _skip_if_tool_missing(exc: BaseException):
    e = _missing_tool(exc)
    if e is None:
        raise exc
    pytest.skip(f"{e.tool} is not installed: {e.hint}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except Exception as exc:  # noqa: BLE001 - re-raised unless a missing tool explains it
        _skip_if_tool_missing(exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as exc:  # noqa: BLE001 - re-raised unless a missing tool explains it
        _skip_if_tool_missing(exc)


class FakeGPUTensor:
    """What the launch argument checks read from a torch GPU tensor, and nothing else."""

    def __init__(self, shape, strides=None, dtype="torch.float32", device=("cuda", 0),
                 ptr=0x7F0000000000):
        from types import SimpleNamespace
        self.shape = tuple(shape)
        if strides is None:
            strides, acc = [], 1
            for d in reversed(self.shape):
                strides.insert(0, acc)
                acc *= d
        self._strides, self.dtype, self._ptr = tuple(strides), dtype, ptr
        self.device = SimpleNamespace(type=device[0], index=device[1])

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return self._ptr


@pytest.fixture
def rng():
    """A seeded generator: every test sees the same random (never zero) inputs."""
    return np.random.default_rng(20240611)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """A private PYKITTENS_CACHE shared by one test module, so code objects a module builds
    once (module-scoped fixtures) never touch the user's cache. Use with
    `pytestmark = pytest.mark.usefixtures("module_cache")`."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYKITTENS_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


def rel_err(out, ref) -> float:
    """The library's relative Frobenius error (NaN never passes), on matching shapes."""
    assert np.shape(out) == np.shape(ref), (np.shape(out), np.shape(ref))
    return library_rel_err(out, ref)


def poison(shape, dtype=np.float32):
    """An output buffer of NaNs, so elements the kernel fails to write make the test fail."""
    return np.full(shape, np.nan, dtype)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bench_script(name: str):
    """bench/<name>.py as a module (in sys.modules under its name), imported with bench/
    on the path as the scripts run, so their imports of each other resolve."""
    import importlib.util
    bench = os.path.join(ROOT, "bench")
    spec = importlib.util.spec_from_file_location(name, os.path.join(bench, f"{name}.py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    sys.path.insert(0, bench)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(bench)
    return module


def line_of(path: str, marker: str) -> int:
    """1-based line of the only line in `path` ending with the comment `marker`."""
    with open(path) as f:
        hits = [i + 1 for i, line in enumerate(f) if line.rstrip().endswith(marker)]
    assert len(hits) == 1, f"marker {marker!r} found on lines {hits} of {path}"
    return hits[0]


def assert_names_line(err, path: str, marker: str):
    """The error message names `path` and the line carrying `marker` (the user's source)."""
    want = f"{path}:{line_of(path, marker)}"
    assert want in str(err), f"expected {want!r} in error message: {err}"


# a ```python block, and the plain block right after it (what the python block prints)
DOC_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```\n(?:\n```\n(.*?)^```\n)?", re.S | re.M)


def doc_python_blocks(path: str) -> list[tuple[int, str, str | None]]:
    """(first line, source, the plain block shown right after it or None) of every ```python
    block of a Markdown file."""
    with open(path) as f:
        text = f.read()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1), m.group(2))
            for m in DOC_BLOCK.finditer(text)]


def run_doc_blocks(path: str, namespace: str, capsys=None, compare_output=None) -> list:
    """Run every python block of a Markdown file, in order, in one namespace; tracebacks and
    kernel errors carry the file's own line numbers. With `capsys`, a plain block right after
    a python block must be exactly what it prints (for the blocks where
    compare_output(source) holds, when given). Returns the blocks."""
    blocks = doc_python_blocks(path)
    ns = {"__name__": namespace}
    for line, src, shown in blocks:
        if capsys is not None:
            capsys.readouterr()
        exec(compile("\n" * (line - 1) + src, path, "exec"), ns)
        if capsys is None or shown is None:
            continue
        out = capsys.readouterr().out
        if compare_output is None or compare_output(src):
            assert out == shown, f"the output shown after {path}:{line} is not what it prints"
    return blocks
