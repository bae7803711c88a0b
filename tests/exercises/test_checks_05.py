"""Exercise 05's checks bite: correct solutions pass with the one success line, untouched tasks say so in
one line, and every planted wrong solution fails with a message that names its mistake."""

from __future__ import annotations

import pytest

from paged_kv_course.starters.after_05 import AllocatorAfter05
# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_05 import (check_can_append, check_chunked_generate, check_growing_allocator, check_serves_tiny_model)
from paged_kv_course.grading.checks_05 import GROWTH_MISTAKES
from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden
from paged_kv_course.grading.notebook_tasks import cell_meta, read_notebook

from check_helpers import fails, not_implemented, passes
from planted_harness import ROOT, is_delegation, planted_files, run_planted

NOTEBOOK = "05_growing_on_demand.ipynb"


class Untouched(AllocatorAfter05):
    def append_tokens(self, seq_id, num_tokens=1):
        raise NotImplementedError("Task 05.1: replace this line with your code")

    def can_append(self, seq_ids, num_tokens=1, *, watermark=0.0):
        raise NotImplementedError("Task 05.2: replace this line with your code")


def test_an_untouched_task_says_so_in_one_line():
    assert fails(check_growing_allocator, Untouched) == "task 05.1 is not written yet"
    assert fails(check_serves_tiny_model, Untouched) == "task 05.1 is not written yet"
    assert fails(check_can_append, Untouched) == "task 05.2 is not written yet"
    assert fails(check_chunked_generate, not_implemented).startswith("this task is not written yet")


def test_the_course_class_after_05_passes(capsys):
    """The course's class behaves (every check of behaviour passes) but was written anew, not repaired from
    SeedStyleGrowth, so 05.1's repair rule, which runs last, refuses it."""
    assert "a rewrite, not a repair" in fails(check_growing_allocator, AllocatorAfter05)
    passes(check_can_append, AllocatorAfter05, "05.2", capsys)


def test_serves_tiny_model_correct(capsys):
    assert "a rewrite, not a repair" in fails(check_serves_tiny_model, AllocatorAfter05)


@pytest.mark.parametrize("make, message", GROWTH_MISTAKES, ids=[m.__name__ for m, _ in GROWTH_MISTAKES])
def test_each_known_growth_mistake_is_named(make, message):
    assert message in fails(check_growing_allocator, make)


def test_every_planted_file_says_what_it_expects():
    files = planted_files("05")
    assert {f.name.split("_")[1] for f in files} == {"1", "2", "3"}, "every task has planted mistakes"
    assert any(is_delegation(f) for f in files)


@pytest.mark.parametrize("path", [p for p in planted_files("05") if not is_delegation(p)], ids=lambda p: p.stem)
def test_planted_wrong_solution_fails_naming_its_mistake(path):
    pytest.importorskip("paged_kv_course.starters.after_03")  # the notebook's starter (exercise 03's)
    expected, message = run_planted(path, NOTEBOOK)
    assert message is not None, f"{path.name} passed every check of its task"
    assert expected in message


def test_forbidden_covers_growth_and_later_starters_but_not_earlier_ones():
    forbidden = forbidden_modules("05")
    for module in ("paged_kv_course.conformance.starter", "paged_kv_lib.allocator", "paged_kv_lib.block_manager",
                   "paged_kv_course.seed", "paged_kv_course.starters.after_05", "paged_kv_course.starters.after_06",
                   "paged_kv_course.grading.checks_05", "paged_kv_course.conformance.engine"):
        assert is_forbidden(module, forbidden), module
    assert not is_forbidden("paged_kv_course.starters.after_03", forbidden)
    assert not is_forbidden("paged_kv_lib.model", forbidden)


def test_no_cell_but_a_check_imports_a_forbidden_module():
    forbidden = forbidden_modules("05")
    nb = read_notebook(ROOT / "exercises" / "solutions" / NOTEBOOK)
    for cell in nb.cells:
        if cell.cell_type != "code" or (cell_meta(cell) or {}).get("role") == "check":
            continue
        for line in cell.source.splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert not is_forbidden(words[1], forbidden), line
