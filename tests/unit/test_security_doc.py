"""docs/security.md names the tests that show each defence: every test it names exists, and
every defence names one. A test renamed or removed fails here, not silently in the doc."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
# `tests/<dir>/<file>.py` or `tests/<dir>/<file>.py::<name>` (`::Class::method` too).
REFERENCE = re.compile(r"\btests/[\w/]+\.py(?:::\w+)*")


def references(text: str) -> list[str]:
    return sorted(set(REFERENCE.findall(text)))


@cache
def defined_tests(path: Path) -> frozenset[str]:
    """Every test a path defines, as pytest addresses it: `name` or `Class::name`."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(name for name in names if name.split("::")[-1].startswith("test_"))


def missing(reference: str) -> str | None:
    """Why `reference` does not name a test that exists, or None when it does."""
    file, _, name = reference.partition("::")
    path = ROOT / file
    if not path.is_file():
        return f"{reference}: no file {file}"
    if not defined_tests(path):
        return f"{reference}: {file} defines no test"
    if name and name not in defined_tests(path):
        return f"{reference}: {file} has no test {name}"
    return None


def test_every_test_the_security_doc_names_exists() -> None:
    found = references(DOC.read_text())
    assert len(found) >= 20  # the parser still finds them
    assert [problem for problem in map(missing, found) if problem] == []


def test_every_defence_names_a_test() -> None:
    """Each row of the "What keyturn defends" table has tests in its last cell."""
    text = DOC.read_text()
    section = text.split("## What keyturn defends", 1)[1].split("\n## ", 1)[0]
    rows = [
        line
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith(("| defence |", "|---"))
    ]
    assert len(rows) >= 10
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split(" | ")]
        assert len(cells) == 3, row[:60]
        assert references(cells[2]), f"no test for: {cells[0]}"


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("tests/unit/test_secret.py", None),
        ("tests/unit/test_secret.py::test_pickling_is_refused", None),
        (
            "tests/unit/test_nowhere.py",
            "tests/unit/test_nowhere.py: no file tests/unit/test_nowhere.py",
        ),
        (
            "tests/unit/test_secret.py::test_that_never_was",
            "tests/unit/test_secret.py::test_that_never_was: tests/unit/test_secret.py has no "
            "test test_that_never_was",
        ),
    ],
)
def test_a_reference_to_a_test_that_does_not_exist_is_caught(
    reference: str, problem: str | None
) -> None:
    assert references(f"see `{reference}`, and") == [reference]
    assert missing(reference) == problem


def test_security_md_reports_privately_and_links_the_threat_model() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    assert "docs/security.md" in text
    assert "Report a vulnerability" in text
