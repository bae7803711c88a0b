"""What every exercise tells its learner up front (issue 34, item 7): the modules its solutions may not use
(exactly the FORBIDDEN tuple of its checks), and, where the allocator is carried forward, a setup cell that
imports the typed errors code copied from exercise 02 raises."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_kv_course.grading.delegation import forbidden_modules
from paged_kv_course.grading.notebook_tasks import read_notebook

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted([*ROOT.glob("exercises/[0-9][0-9]_*.ipynb"), *ROOT.glob("exercises/solutions/[0-9][0-9]_*.ipynb")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_introduction_names_every_forbidden_module(path):
    intro = read_notebook(path).cells[0].source
    line = next(x for x in intro.split("\n\n") if x.startswith("**What a solution may not use.**"))
    named = {part.strip(" .`") for part in line.split(":", 1)[1].split(",")}
    assert named == set(forbidden_modules(path.name[:2]))


@pytest.mark.parametrize("number", ["02", "03", "05", "06", "08"])
def test_a_setup_cell_imports_the_typed_errors(number):
    path = next(ROOT.glob(f"exercises/{number}_*.ipynb"))
    setup = read_notebook(path).cells[1].source
    assert "from paged_kv_lib import errors" in setup
