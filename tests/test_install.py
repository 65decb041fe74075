"""The install: the README's two commands, CI running the same test command, install.sh's
options and the package's extras (one vendor's tools each)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

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


def _install_function(name: str) -> str:
    with open(os.path.join(ROOT, "install.sh")) as f:
        text = f.read()
    return re.search(rf"^{name}\(\) {{.*?^}}\n", text, re.S | re.M).group(0)


def test_install_waits_for_the_apt_lock_then_names_it(tmp_path):
    """Another apt/dpkg holding its lock (an unattended upgrade): install.sh says it waits,
    and after PYKITTENS_APT_TIMEOUT seconds fails naming the lock."""
    lock = tmp_path / "lock-frontend"
    lock.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'r+'); "
         "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
         str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        script = ("STEP=waiting; fail() { echo \"FAILED: $1\" >&2; exit 1; }\n"
                  + _install_function("apt_wait") + "apt_wait\necho released\n")
        env = {**os.environ, "PYTHON": sys.executable, "APT_LOCKS": str(lock)}
        p = subprocess.run(["bash", "-c", "SUDO= APT_TIMEOUT=5; " + script], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"waiting for another apt/dpkg to release {lock}" in p.stdout
        assert f"still holds {lock} after 5s" in p.stderr
    finally:
        holder.kill()
        holder.wait()
    p = subprocess.run(["bash", "-c", "SUDO= APT_TIMEOUT=5; " + script], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "released", p.stdout + p.stderr
