"""The lists in tests/conftest.py name tests that exist: a stale name would silently stop marking a test slow
(so `make test-fast` would run it) or ordering it first (so `make test-course` could end on it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# The lists, read from the file (``import conftest`` may find another folder's conftest.py under xdist).
LISTS = {node.targets[0].id: ast.literal_eval(node.value)
         for node in ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8")).body
         if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
         and node.targets[0].id in ("SLOW_FILES", "SLOW_TESTS", "LONGEST")}


def _files(name: str) -> list:
    """Files (or folders, for a name ending in "/") under tests/ that the conftest's rule matches."""
    found = [p for p in TESTS.rglob("*") if p.is_dir() == name.endswith("/")]
    want = name.rstrip("/")
    return [p for p in found if (rel := p.relative_to(TESTS).as_posix()) == want or rel.endswith("/" + want)]


@pytest.mark.parametrize("name", sorted(LISTS["SLOW_FILES"]))
def test_every_slow_file_exists(name):
    assert _files(name), f"SLOW_FILES names {name!r}, which is not under tests/"


@pytest.mark.parametrize("entry", sorted(LISTS["SLOW_TESTS"]) + list(LISTS["LONGEST"]))
def test_every_listed_test_exists(entry):
    file, first = entry.split("::")[:2]
    files = _files(file)
    assert files, f"{entry!r}: no file {file!r} under tests/"
    defined = re.compile(rf"^\s*(def|class)\s+{re.escape(first)}\b|^{re.escape(first)}\s*=", re.M)
    assert any(defined.search(p.read_text(encoding="utf-8")) for p in files), f"{entry!r}: no {first} in {file}"
