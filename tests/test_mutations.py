"""The mutation check (tools/mutations.py): every planted lowering/codegen bug of the CDNA
path makes its subset of this suite fail. Runs in the normal `python3 -m pytest -q` (marked
`mutations`, so `-m "not mutations"` leaves it out while iterating); each mutation runs in a
temporary copy of the tree with its own empty code-object cache."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import mutations  # noqa: E402

pytestmark = pytest.mark.mutations


def test_the_mutations_apply_to_the_current_code():
    """Each edit matches the working tree exactly once (a refactoring that moves the code
    must move the mutation with it), and the set covers the CDNA path."""
    names = [m.name for m in mutations.MUTATIONS]
    assert len(names) == len(set(names)) and len(names) >= 15
    for m in mutations.MUTATIONS:
        mutations.check_applies(m)
        assert m.tests and m.bug and m.catches, m.name
        assert all(old != new for _, old, new in m.edits), m.name
    files = {p for m in mutations.MUTATIONS for p, _, _ in m.edits}
    assert {"pykittens/targets/cdna.py", "pykittens/codegen/amdgpu.py",
            "pykittens/codegen/llvm.py", "pykittens/lower/lane.py"} <= files


def test_the_guide_lists_every_mutation():
    with open(os.path.join(ROOT, "docs/targets/cdna.md")) as f:
        doc = f.read()
    section = doc[doc.index("## Mutation check"):]
    listed = re.findall(r"^\| `([\w-]+)` \|", section, re.M)
    assert listed == [m.name for m in mutations.MUTATIONS]


def test_every_mutation_is_caught():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "mutations.py"),
                        "--jobs", "2"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-20000:] + r.stderr[-5000:]
