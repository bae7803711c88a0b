"""Per-check points: the even-share default, the gate on solution notebooks, and partial credit in scoring.

Fixture notebooks are built here in memory; the gate also runs over the course's own
solution notebooks (with the rule the notebooks are under today: a ``**Points:**`` line is
required once a notebook declares per-check points).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from paged_kv_course.grading import generate, grader
from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook, split_points
from paged_kv_course.grading.points import points_problems, stated_points

ROOT = Path(__file__).resolve().parents[2]


def notebook(header: str, check_points=(None, None), task_points=4):
    """A one-task notebook: header markdown, a solution cell, a check cell per entry of ``check_points``."""
    cells = [new_markdown_cell(header),
             new_code_cell("def f():\n    pass", metadata={"paged_kv": {"task": "91.1", "role": "solution",
                                                                         "points": task_points, "kind": "build"}})]
    for number, points in enumerate(check_points):
        meta = {"task": "91.1", "role": "check"}
        if points is not None:
            meta["points"] = points
        cells.append(new_code_cell(f"check_part_{number}(f)", metadata={"paged_kv": meta}))
    return new_notebook(cells=cells)


@given(st.integers(0, 40), st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=2, max_size=6))
def test_shares_sum_to_the_task_whatever_is_declared(total, declared):
    shares = split_points(total, declared)
    assert len(shares) == len(declared)
    for share, value in zip(shares, declared):
        if value is not None:
            assert share == value
    if None in declared and sum(v for v in declared if v is not None) <= total:
        assert sum(shares) == total
        open_shares = [s for s, v in zip(shares, declared) if v is None]
        rest = total - sum(v for v in declared if v is not None)
        assert max(open_shares) - min(open_shares) == (rest % len(open_shares) if len(open_shares) > 1 else 0)
        assert open_shares[0] == max(open_shares), "the remainder goes to the first"


def test_even_share_gives_the_remainder_to_the_first():
    assert split_points(3, [None, None]) == (2.0, 1.0)
    assert split_points(4, [1, None, None]) == (1.0, 2.0, 1.0)
    assert split_points(5, [None]) == (5.0,)


def test_a_stated_split_that_matches_passes():
    nb = notebook("## Task 91.1\n\n**Points:** 3 for the parts (check_part_0), 1 for the edge (check_part_1).", (3, 1))
    assert points_problems(nb, "91_x.ipynb") == []


def test_declared_points_over_the_task_are_named():
    nb = notebook("**Points:** 3 for a (check_part_0), 3 for b (check_part_1).", (3, 3))
    problems = points_problems(nb, "91_x.ipynb")
    assert any("declare 6 points in all; the task has 4" in p for p in problems)


def test_a_missing_line_fails_once_points_are_declared():
    assert any("no line starting with **Points:**" in p for p in points_problems(notebook("## Task", (3, 1)), "n"))
    assert points_problems(notebook("## Task", (None, None)), "n") == [], "the even share needs no line yet"
    assert points_problems(notebook("## Task", (None, None)), "n", require_line=True)


def test_a_line_that_disagrees_with_the_cells_is_named():
    nb = notebook("**Points:** 2 for a (check_part_0), 2 for b (check_part_1).", (3, 1))
    problems = points_problems(nb, "n")
    assert any("gives check_part_0 2 points; its check cell is worth 3" in p for p in problems)
    nb = notebook("**Points:** 3 for a (check_part_0), 1 for b (check_other).", (3, 1))
    problems = points_problems(nb, "n")
    assert any("does not name check_part_1" in p for p in problems)
    assert any("names check_other, which no check cell" in p for p in problems)


def test_bad_point_values_are_named():
    problems = points_problems(notebook("**Points:** x", ("two", None)), "n")
    assert any("has points 'two'" in p for p in problems)


def test_stated_points_reads_the_convention():
    line = "**Points:** 2 for fork and free (check_sharing_03), 2 for the differential check (check_allocator_03)."
    assert stated_points(line) == {"check_sharing_03": 2.0, "check_allocator_03": 2.0}


@pytest.mark.parametrize("path", generate.solution_paths(ROOT / "exercises" / "solutions"), ids=lambda p: p.name)
def test_the_course_notebooks_follow_the_points_rules(path):
    assert points_problems(read_notebook(path), path.name) == []


def test_scoring_awards_each_check_on_its_own():
    nb = notebook("h", (3, 1))
    tasks = find_tasks(nb)
    cells, roles = grader.prepare_for_run(nb)
    solution = next(n for n, (_, role) in roles.items() if role == "solution")
    checks = [n for n, (_, role) in roles.items() if role == "check"]

    def results(*outcomes):
        out = {solution: {"outcome": outcomes[0], "line": "boom", "detail": ""}}
        for number, outcome in zip(checks, outcomes[1:]):
            out[number] = {"outcome": outcome, "line": f"cell {number} failed", "detail": ""}
        return out

    partial = grader.score(roles, tasks, results("passed", "failed", "passed"), cells)[0]
    assert (partial.passed, partial.earned, partial.points) == (False, 1, 4)
    assert [(c.name, c.points, c.passed) for c in partial.checks] == [("check_part_0", 3, False), ("check_part_1", 1, True)]
    assert grader.score(roles, tasks, results("passed", "passed", "failed"), cells)[0].earned == 3
    assert grader.score(roles, tasks, results("passed", "passed", "passed"), cells)[0].earned == 4
    broken = grader.score(roles, tasks, results("failed", "passed", "passed"), cells)[0]
    assert broken.earned == 0, "no check earns points when the solution cell itself failed"
