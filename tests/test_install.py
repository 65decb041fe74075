"""The install: the README's two commands, CI running the same test command, install.sh's
options and the package's extras (one vendor's tools each)."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import ROOT


def _quickstart() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = text.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_commands():
    demo, test = _quickstart()
    assert demo == "./install.sh && pykittens demo"
    assert test == "./install.sh --test && .venv/bin/python -m pytest -q"


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    assert lines[-1].startswith(_quickstart()[1] + " "), lines[-1]


def _install(*args, **env):
    return subprocess.run(["bash", os.path.join(ROOT, "install.sh"), *args],
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=60)


def test_install_script_parses_and_explains_itself():
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, "install.sh")]).returncode == 0
    p = _install("--help")
    assert p.returncode == 0
    for option in ("--amd-only", "--nvidia-only", "--test", "PYTHON", "PYKITTENS_APT_TIMEOUT"):
        assert option in p.stdout


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unknown option '--bogus'"),
    (["--amd-only", "--nvidia-only"], "exclude each other"),
])
def test_install_rejects_bad_options(args, message):
    p = _install(*args)
    assert p.returncode == 2 and message in p.stderr


def test_install_names_the_step_that_failed(tmp_path):
    p = _install(PYTHON=str(tmp_path / "no-python"), PYKITTENS_VENV=str(tmp_path / "venv"))
    assert p.returncode == 1
    assert 'FAILED at step "checking Python' in p.stderr and "no-python" in p.stderr
    assert not (tmp_path / "venv").exists()


def test_extras_split_the_vendors():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    name = lambda req: re.match(r"[A-Za-z0-9_.-]+", req).group(0)     # noqa: E731
    core = {name(r) for r in project["dependencies"]}
    extras = {k: {name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert extras["amd"] == {"rocm-llvm-python"}
    assert extras["nvidia"] == {"nvidia-cuda-nvcc-cu12", "nvidia-cuda-cuobjdump",
                                "nvidia-cuda-nvdisasm"}
    assert not core & (extras["amd"] | extras["nvidia"]), core
    assert project["optional-dependencies"]["all"] == ["pykittens[amd,nvidia]"]
