"""docs/course.md maps the course package: a row for every module, and no row for a module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "course" / "paged_kv_course"


def rows(text: str) -> set:
    return set(re.findall(r"^\| `([^`]+\.py)` \|", text, re.M))


def modules() -> set:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_row_and_every_row_a_module():
    documented = rows((ROOT / "docs" / "course.md").read_text(encoding="utf-8"))
    assert not modules() - documented, f"docs/course.md lacks rows for {sorted(modules() - documented)}"
    assert not documented - modules(), f"docs/course.md names modules that are gone: {sorted(documented - modules())}"


def test_the_row_reader_sees_a_missing_row():
    assert rows("| `capstone.py` | the capstone |\n") == {"capstone.py"}
    assert "capstone.py" not in rows("| capstone.py | not a module cell |\n")
