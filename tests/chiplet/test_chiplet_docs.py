"""docs/chiplet.md's python snippets run, in order, in one namespace."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "chiplet.md")
IMG = os.path.join(ROOT, "docs", "img")


def test_chiplet_doc_snippets_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path))
    text = open(DOC).read()
    blocks = [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
              for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]
    assert len(blocks) >= 3
    ns = {"__name__": "chiplet_md"}
    for line, src in blocks:
        exec(compile("\n" * (line - 1) + src, DOC, "exec"), ns)


def test_chiplet_doc_images_exist():
    text = open(DOC).read()
    images = re.findall(r"\]\((img/[^)]+\.png)\)", text)
    assert images
    for rel in images:
        path = os.path.join(ROOT, "docs", rel)
        assert os.path.basename(rel).startswith("chiplet-") and os.path.getsize(path) > 10_000
