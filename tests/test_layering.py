"""The package layering: every subpackage imports on its own in a fresh interpreter, the
import graph between the packages has no cycle, and the rules of docs/architecture.md hold
(target facts only through pykittens.targets, the kernel ABI below lowering, codegen and the
runtime, kernels that never reach the compiler's insides).

The graph is read from the source (every import, including those inside functions: a
deferred import is still a dependency, and a cycle hidden behind one breaks as soon as
someone moves it to the top of a file)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PKG = os.path.join(ROOT, "pykittens")


def _units() -> set[str]:
    """The graph's nodes: each subpackage and each top-level module of pykittens."""
    out = set()
    for name in os.listdir(PKG):
        path = os.path.join(PKG, name)
        if os.path.isfile(os.path.join(path, "__init__.py")):
            out.add(name)
        elif name.endswith(".py") and name != "__init__.py":
            out.add(name[:-3])
    return out


UNITS = _units()
ROOT_NODE = "pykittens"          # the package's own __init__ (the `pk.` namespace)


def _node(module: str) -> str:
    """The graph node of a dotted module name under pykittens."""
    parts = module.split(".")
    assert parts[0] == "pykittens", module
    return parts[1] if len(parts) > 1 and parts[1] in UNITS else ROOT_NODE


def _source_files():
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                is_pkg = rel.endswith(".__init__")
                module = rel[:-len(".__init__")] if is_pkg else rel
                yield path, module, is_pkg


def _imported(module: str, is_pkg: bool, node: ast.AST) -> list[str]:
    """Dotted names of the pykittens modules (or package attributes) one import names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "pykittens"]
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != "pykittens":
        return []
    out = []
    for a in node.names:        # `from pykittens import lang` names a subpackage
        sub = f"{mod}.{a.name}"
        path = os.path.join(ROOT, *sub.split("."))
        out.append(sub if os.path.isdir(path) or os.path.isfile(path + ".py") else mod)
    return out


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(from node, to node) -> the places ("file:line") that import across them."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path, module, is_pkg in _source_files():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        src = _node(module)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, is_pkg, n):
                    dst = _node(target)
                    if dst != src:
                        where = f"{os.path.relpath(path, ROOT)}:{n.lineno}"
                        edges.setdefault((src, dst), []).append(where)
    import pykittens                # pk.emulate and pk.launch: imported on first use
    for attr, module in pykittens._DEFERRED.items():
        edges.setdefault((ROOT_NODE, _node("pykittens" + module)), []).append(
            f"pykittens/__init__.py (pk.{attr})")
    return edges


EDGES = import_edges()


def _cycle_through(node: str) -> list[str] | None:
    """One import cycle through `node` as a list of nodes, or None."""
    parent, todo = {node: None}, [node]
    while todo:
        a = todo.pop(0)
        for (x, y) in sorted(EDGES):
            if x != a:
                continue
            if y == node:
                path = [a]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return [node] + path[::-1][1:] + [node] if a != node else [node, node]
            if y not in parent:
                parent[y] = a
                todo.append(y)
    return None


def _layout_table() -> list[str]:
    """The packages and modules the README's Layout table lists (`pykittens/<name>`)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\|([^|]*)\|", section, re.M)       # each row's first cell
    return [name for cell in cells for name in re.findall(r"`pykittens/(\w+)", cell)]


def test_readme_layout_lists_every_package():
    listed = set(_layout_table())
    assert listed, "README's Layout table lists no package"
    assert listed <= UNITS, f"README lists packages that do not exist: {listed - UNITS}"
    assert UNITS <= listed, f"README's Layout table misses {sorted(UNITS - listed)}"


def test_every_package_has_an_init():
    """A folder of modules without __init__.py imports from a checkout (a namespace package)
    but is left out of the wheel (pyproject's package discovery finds regular packages)."""
    missing = []
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if any(f.endswith(".py") for f in filenames) and "__init__.py" not in filenames:
            missing.append(os.path.relpath(dirpath, ROOT))
    assert not missing, missing


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_no_import_cycle(unit):
    cycle = _cycle_through(unit)
    if cycle:
        hops = [f"{a} -> {b} ({EDGES[(a, b)][0]})" for a, b in zip(cycle, cycle[1:])]
        pytest.fail("import cycle: " + "; ".join(hops))


def test_the_root_namespace_stays_at_the_bottom():
    """`import pykittens` loads the kernel language only; pk.emulate and pk.launch load their
    packages on first use. A kernel module (`import pykittens as pk`) so does not drag the
    emulator or the runtime in, and every package can be imported first."""
    direct = {b for (a, b) in EDGES if a == ROOT_NODE}
    assert direct <= {"lang", "ir", "targets", "emulator", "runtime"}, direct
    eager = subprocess.run(
        [sys.executable, "-c", "import sys, pykittens; print(' '.join(sorted(sys.modules)))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    loaded = {m.split(".")[1] for m in eager if m.startswith("pykittens.")}
    assert loaded <= {"lang", "ir", "targets"}, loaded


# Packages that hold no hardware facts of their own and must reach them through the Target
# objects of pykittens.targets (targets.get(name)), never through a family's module.
TARGET_NEUTRAL = ("ir", "lang", "kernels", "chiplet")
FAMILY_MODULES = re.compile(r"pykittens\.targets\.(cdna|gfx\d+|sm\d+a?|base)\b")


def test_neutral_packages_reach_target_facts_through_targets():
    bad = []
    for path, module, is_pkg in _source_files():
        if _node(module) not in TARGET_NEUTRAL:
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, is_pkg, n):
                    if FAMILY_MODULES.match(target):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{n.lineno} imports {target}")
    assert not bad, "import pykittens.targets (Target objects) instead:\n" + "\n".join(bad)


# Who may import whom beyond the pipeline order: the rules docs/architecture.md states.
FORBIDDEN = {
    "targets": "ir lang lower codegen toolchain runtime emulator isa analysis chiplet kernels "
               "ops bench compiler cli demo",
    "ir": "lang lower codegen toolchain runtime emulator isa analysis chiplet kernels ops "
          "bench compiler cli demo",
    "lang": "lower codegen toolchain runtime emulator isa analysis kernels ops bench "
            "compiler cli demo",
    "lower": "lang codegen toolchain runtime emulator isa analysis chiplet kernels ops bench "
             "compiler cli demo",
    "codegen": "lang toolchain runtime emulator isa analysis chiplet kernels ops bench "
               "compiler cli demo",
    "toolchain": "ir lang lower codegen runtime emulator isa analysis chiplet kernels ops "
                 "bench compiler cli demo",
    "chiplet": "lower codegen runtime emulator isa analysis kernels ops bench compiler cli "
               "demo",
    "kernels": "lower codegen toolchain runtime isa analysis ops bench compiler cli demo",
}


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_layer_rules(unit):
    forbidden = set(FORBIDDEN[unit].split())
    bad = [f"{unit} -> {b}: {', '.join(EDGES[(a, b)])}" for (a, b) in sorted(EDGES)
           if a == unit and b in forbidden]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_imports_alone(unit):
    """Each package imported first, in a fresh interpreter, so a module that works only
    because another one happened to be imported before it (an import-order cycle) fails."""
    if unit == "ops":           # torch's custom ops: torch is the `torch`/`test` extra
        pytest.importorskip("torch", reason="pykittens.ops needs torch, which is not installed")
    p = subprocess.run([sys.executable, "-c", f"import pykittens.{unit}"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _modules_with_all() -> list[str]:
    """Every pykittens module whose source declares __all__."""
    out = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and re.search(r"^__all__\s*=", open(path).read(), re.M):
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out.append(rel[:-len(".__init__")] if rel.endswith(".__init__") else rel)
    return sorted(out)


@pytest.mark.parametrize("module", _modules_with_all())
def test_every_exported_name_exists(module):
    """`from module import *` works: each name of __all__ is defined (a name left behind
    when its definition moved breaks the star import)."""
    import importlib
    mod = importlib.import_module(module)
    assert [n for n in mod.__all__ if not hasattr(mod, n)] == []
