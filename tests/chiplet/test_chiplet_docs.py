"""docs/chiplet.md's python snippets run, in order, in one namespace."""
import os
import re

from conftest import ROOT, run_doc_blocks

DOC = os.path.join(ROOT, "docs", "chiplet.md")
IMG = os.path.join(ROOT, "docs", "img")


def test_chiplet_doc_snippets_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path))
    assert len(run_doc_blocks(DOC, "chiplet_md")) >= 3


def test_chiplet_doc_images_exist():
    text = open(DOC).read()
    images = re.findall(r"\]\((img/[^)]+\.png)\)", text)
    assert images
    for rel in images:
        path = os.path.join(ROOT, "docs", rel)
        assert os.path.basename(rel).startswith("chiplet-") and os.path.getsize(path) > 10_000
