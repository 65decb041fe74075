"""The language guide's snippets run: every ```python block of docs/language.md, in order, in
one namespace (a block may end with asserts). Line numbers in tracebacks and kernel errors are
those of the Markdown file."""
import os
import re

from conftest import ROOT

GUIDE = os.path.join(ROOT, "docs", "language.md")
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def python_blocks(path):
    """(first line number, source) of each ```python block."""
    with open(path) as f:
        text = f.read()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_guide_has_snippets():
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 10
    assert all(src.strip() for _, src in blocks)


def test_guide_snippets_run():
    ns = {"__name__": "language_md"}
    for line, src in python_blocks(GUIDE):
        # padded so that tracebacks (and kernel errors) point at lines of the Markdown file
        exec(compile("\n" * (line - 1) + src, GUIDE, "exec"), ns)
