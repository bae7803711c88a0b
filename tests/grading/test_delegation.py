"""Delegation, one rule from one table: a solution cell that imports, reaches by name or pastes the
library's implementation of what its task grades earns 0 on that task, with one line saying why.

Calibrated on honest work: no reference solution of the course trips it (the paste measure is
read on the cell's own lines, the pristine scaffold left out).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from paged_kv_course.grading import delegation
from paged_kv_course.grading.notebook_tasks import strip_solutions

ROOT = Path(__file__).resolve().parents[2]


def reference_cells():
    for path in sorted((ROOT / "exercises" / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("paged_kv") or {}
            if cell["cell_type"] == "code" and meta.get("role") == "solution":
                source = "".join(cell["source"])
                yield meta["task"], source, strip_solutions(source, meta["task"])


@pytest.mark.parametrize("task, source, scaffold", list(reference_cells()), ids=lambda v: v if len(v) < 8 else "")
def test_no_reference_solution_trips_the_rule(task, source, scaffold):
    assert delegation.delegation_line(task, source, scaffold) == ""


@pytest.mark.parametrize("source, named", [
    ("from paged_kv_lib.allocator import PagedKVCacheAllocator\n", "paged_kv_lib.allocator"),
    ("import paged_kv_lib.allocator as a\nclass MyAllocator(a.PagedKVCacheAllocator):\n    pass\n",
     "paged_kv_lib.allocator"),
    ("import paged_kv_lib\nx = paged_kv_lib.allocator.PagedKVCacheAllocator\n", "paged_kv_lib.allocator"),
    ("from paged_kv_course.starters.after_05 import AllocatorAfter05\n", "paged_kv_course.starters.after_05"),
    ("from paged_kv_course.grading import checks_03\n", "paged_kv_course.grading"),
])
def test_an_import_or_a_name_of_the_graded_piece_earns_0_with_one_line(source, named):
    line = delegation.delegation_line("03.2", source)
    assert line.startswith("delegation: task 03.2 earns 0") and f"uses {named}" in line, line
    assert "\n" not in line


def test_a_re_export_is_traced_to_the_module_that_defines_it():
    from paged_kv_lib import allocator

    exported = [n for n in dir(__import__("paged_kv_lib")) if getattr(__import__("paged_kv_lib"), n, None)
                is getattr(allocator, "PagedKVCacheAllocator", object())]
    if not exported:
        pytest.skip("the package does not re-export the allocator")
    line = delegation.delegation_line("03.1", f"from paged_kv_lib import {exported[0]}\n")
    assert "uses paged_kv_lib.allocator" in line, line


@pytest.mark.parametrize("source", [
    "import importlib\nA = importlib.import_module('paged_kv_' + 'lib.allocator')\n",
    "A = __import__('paged_kv_lib')\n",
    "exec(open('x').read())\n",
    "import sys\nA = sys.modules['paged_kv_lib.allocator']\n",
])
def test_code_looked_up_by_a_name_built_at_run_time_earns_0(source):
    line = delegation.delegation_line("03.2", source)
    assert "name built at run time" in line or "uses paged_kv_lib.allocator" in line, line


def test_what_a_task_does_not_grade_is_free_to_use():
    assert delegation.delegation_line("03.2", "from paged_kv_lib.errors import OutOfBlocksError\nimport torch\n") == ""
    assert delegation.delegation_line("09.1", "from paged_kv_lib.allocator import PagedKVCacheAllocator\n") == ""


def test_a_pasted_implementation_earns_0_and_names_its_share():
    """Issue 32: the installed source is readable, so pasting it passed the import-only rule."""
    from paged_kv_lib.block_manager import FreeBlockQueue

    pasted = inspect.getsource(FreeBlockQueue)
    line = delegation.delegation_line("06.5", pasted)
    assert "pasted from the library's implementation" in line, line
    renamed = pasted.replace("FreeBlockQueue", "MyQueue").replace("self", "me")
    assert delegation.pasted_share(renamed, "06.5") >= delegation.MAX_SHARE


def test_the_table_names_modules_that_exist():
    """A table entry for a module that is gone protects nothing: each exercise keeps at least one real one."""
    for exercise, pieces in delegation.PIECES.items():
        assert any(delegation.importable(m) for m in pieces if m.startswith("paged_kv_lib")), exercise


def test_the_measure_is_the_lesson_gates():
    tokens = delegation.tokens_of('def f(x):\n    """doc."""\n    # note\n    return x + 1\n')
    assert [t for _, t in tokens] == ["def", "f", "(", "x", ")", ":", "return", "x", "+", "1"]
    index = delegation.TokenIndex([tokens])
    assert index.share(tokens) == 1.0 and index.share(delegation.tokens_of("y = 2\n")) == 0.0
