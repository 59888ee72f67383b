"""The docs name tests that exist: every ``tests/<file>.py`` in docs/*.md and the README
is a file of the suite, and every ``::test_<name>`` after it (``path::name``, or a bare
``::name`` that goes on with the last file named before it) a test function in that file.
A doc that says "proved by tests/hub/test_x.py::test_y" is then checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # read from the files: no process started

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
REFERENCE = re.compile(r"(?P<path>tests/[\w/]+\.py)?::(?P<name>test_\w+)|(?P<file>tests/[\w/]+\.py)")


def references(doc: Path) -> list[tuple[str, str]]:
    """(file, test name or "") for each reference in ``doc``, in order."""
    found, last = [], ""
    for m in REFERENCE.finditer(doc.read_text()):
        last = m["path"] or m["file"] or last
        found.append((last, m["name"] or ""))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_test_a_doc_names_exists(doc):
    missing = []
    for path, name in references(doc):
        source = ROOT / path
        if not source.is_file():
            missing.append(path)
        elif name and not re.search(rf"^\s*(async\s+)?def {name}\(", source.read_text(), re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert missing == [], f"{doc.name} names tests that are not there"
