"""docs/targets/hopper.md runs: every ```python block, in order, in one namespace, from the
repository root; where a plain block follows one, it is what the block prints. The PTX
listing and the excerpt of bench/device_check.py are checked against the real thing.

Outputs that come from ptxas or cuobjdump (register counts, SASS) are compared only when the
ptxas in use is the version the guide names; the blocks' own asserts run either way."""
import os
import re
import subprocess
import sys

import pytest

from pykittens.toolchain import nvptx
from conftest import ROOT, run_doc_blocks

GUIDE = os.path.join(ROOT, "docs", "targets", "hopper.md")
# blocks whose printed output depends on the ptxas (and cuobjdump) version
_PTXAS_OUTPUT = re.compile(r"cubin\.|ptxas_log|--report")

pytestmark = [
    pytest.mark.skipif(nvptx.find_ptxas() is None, reason=nvptx.install_hint("ptxas")),
    pytest.mark.skipif(nvptx.find_cuda_tool("cuobjdump") is None
                       or nvptx.find_cuda_tool("nvdisasm") is None,
                       reason=nvptx.install_hint("cuobjdump")),
]


def _guide() -> str:
    with open(GUIDE) as f:
        return f.read()


def _ptxas_matches(text: str) -> bool:
    named = re.search(r"produced with ptxas (\d+\.\d+\.\d+)", text)
    assert named, "the guide names the ptxas version its outputs come from"
    return f"ptxas {named.group(1)} " in nvptx.toolchain_version()


def test_hopper_guide_snippets_run(monkeypatch, capsys):
    pytest.importorskip("torch", reason="the guide launches on torch tensors")
    monkeypatch.chdir(ROOT)
    exact_ptxas = _ptxas_matches(_guide())
    blocks = run_doc_blocks(GUIDE, "hopper_md", capsys,
                            compare_output=lambda src: exact_ptxas
                            or not _PTXAS_OUTPUT.search(src))
    assert len(blocks) >= 15


_NAME = re.compile(r"(%(?:rd|rs|r|p|f)\d+|\$L__BB\d+_\d+)")


def _matcher(shown: str):
    """A regex for one listed PTX line: whitespace runs alike, any register number, and
    each label captured (label names must map one to one onto the real ones)."""
    parts = _NAME.split(" ".join(shown.split()))
    rx = ""
    for i, part in enumerate(parts):
        if i % 2 == 0:
            rx += re.escape(part)
        elif part.startswith("$"):
            rx += r"(\$L__BB\d+_\d+)"
        else:
            rx += re.escape(re.match(r"%[a-z]+", part).group()) + r"\d+"
    return re.compile(rx), [p for p in parts[1::2] if p.startswith("$")]


def test_ptx_listing_is_the_real_ptx(monkeypatch):
    """The lines of the PTX listing (notes after '  ;' dropped) appear in the command's real
    output in the order shown, registers renumbered freely and labels renamed one to one."""
    monkeypatch.chdir(ROOT)
    text = _guide()
    m = re.search(r"^```\n\$ (pykittens compile \S+ --target sm_90a --emit asm[^\n]*)\n(.*?)^```",
                  text, re.S | re.M)
    assert m, "the PTX listing"
    cmd = m.group(1).split()
    real = subprocess.run([sys.executable, "-m", "pykittens.cli"] + cmd[1:], check=True,
                          capture_output=True, text=True).stdout
    real_lines = [" ".join(x.split()) for x in real.splitlines()]
    shown = [re.sub(r"\s{2,}; .*$", "", x).strip() for x in m.group(2).splitlines()]
    wanted = [x for x in shown if x not in ("", "...")]
    hits = []                                  # per listed line: (real line, labels) matches
    for x in wanted:
        rx, names = _matcher(x)
        hits.append([(j, list(zip(names, h.groups()))) for j, line in enumerate(real_lines)
                     if (h := rx.fullmatch(line))])

    def place(n, i=0, pos=0, labels=None):
        """Can wanted[i:n] be matched in order at or after real line `pos`?"""
        labels = labels or {}
        if i == n:
            return True
        for j, pairs in hits[i]:
            if j >= pos:
                new = dict(labels)
                if all(new.setdefault(a, b) == b for a, b in pairs) and \
                        len(set(new.values())) == len(new) and place(n, i + 1, j + 1, new):
                    return True
        return False

    if not place(len(wanted)):
        bad = next(n for n in range(1, len(wanted) + 1) if not place(n))
        raise AssertionError(f"{wanted[bad - 1]!r} is not in the PTX where the listing puts it")


def test_launch_excerpt_is_what_the_device_check_runs():
    text = _guide()
    m = re.search(r"like this \(excerpt;.*?\n\n```\n(.*?)^```", text, re.S | re.M)
    assert m, "the bench/device_check.py excerpt"
    with open(os.path.join(ROOT, "bench", "device_check.py")) as f:
        source = " ".join(f.read().split())
    for line in m.group(1).splitlines():
        if line.strip() != "...":
            assert " ".join(line.split()) in source, line
