"""The language guide's and the README's snippets run: every ```python block, in order, in
one namespace (a block may end with asserts). Line numbers in tracebacks and kernel errors are
those of the Markdown file."""
import os

from conftest import ROOT, doc_python_blocks, run_doc_blocks

GUIDE = os.path.join(ROOT, "docs", "language.md")


def test_guide_has_snippets():
    blocks = doc_python_blocks(GUIDE)
    assert len(blocks) >= 10
    assert all(src.strip() for _, src, _ in blocks)


def test_guide_snippets_run():
    run_doc_blocks(GUIDE, "language_md")


def test_readme_snippets_run():
    """The README's examples (a kernel in the emulator; the torch op forward and backward)."""
    import pytest
    pytest.importorskip("torch")
    readme = os.path.join(ROOT, "README.md")
    assert len(doc_python_blocks(readme)) == 2
    run_doc_blocks(readme, "readme_md")


def test_ops_guide_snippets_run():
    """docs/ops.md: every op on CPU tensors against torch, its errors, torch.compile."""
    import pytest
    pytest.importorskip("torch")
    path = os.path.join(ROOT, "docs", "ops.md")
    assert len(doc_python_blocks(path)) >= 9
    run_doc_blocks(path, "ops_md")
