"""A learner who carries their own class forward is graded on it (issue 34, item 7).

Exercise 03's first solution cell starts from the course's exercise-02 starter by an import line; a
learner may paste their own exercise-02 class there instead. The grader runs the whole solution cell,
so the grade is on the learner's class (a bug in it costs points the starter would not), and the
report says which class each exercise built on.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from paged_kv_course.grading import grader
from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook, write_notebook
from paged_kv_course.grading.splice import built_on

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "exercises" / "solutions"
STARTER_LINE = "from paged_kv_course.starters.after_02 import AllocatorAfter02 as MyAllocator"


def _code(source: str) -> str:
    """A solution cell's code without the course's answer markers."""
    return "\n".join(line for line in source.splitlines() if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line)


def _own_class_02() -> str:
    """Exercise 02's reference answer, as a learner would paste their own class: every task's cell."""
    nb = read_notebook(SOLUTIONS / "02_blocks_and_block_tables.ipynb")
    return "\n\n\n".join(_code(nb.cells[t.solution_cell].source) for t in find_tasks(nb).values())


def _submission_03(tmp_path: Path, own: str) -> Path:
    nb = read_notebook(SOLUTIONS / "03_the_allocator.ipynb")
    cell = nb.cells[find_tasks(nb)["03.1"].solution_cell]
    assert STARTER_LINE in cell.source, "03.1's solution cell starts from the starter's import line"
    cell.source = cell.source.replace(STARTER_LINE, own)
    path = tmp_path / "03_the_allocator.ipynb"
    write_notebook(nb, path)
    return path


def test_the_report_line_names_the_class_a_cell_builds_on():
    pristine = f"{STARTER_LINE}  # or your own\n\n\nclass MyAllocator(MyAllocator):\n    pass\n"
    assert built_on("03.1", pristine, pristine) == (
        "03.1 builds on the course's AllocatorAfter02 (paged_kv_course.starters.after_02)")
    own = "class MyAllocator:\n    pass\n\n\nclass MyAllocator(MyAllocator):\n    pass\n"
    assert built_on("03.1", own, pristine) == (
        "03.1 builds on your own MyAllocator (defined in its solution cell), not the course's AllocatorAfter02")
    assert built_on("03.2", "class MyAllocator(MyAllocator):\n    pass\n", "class X:\n    pass\n") is None


def test_every_exercise_that_builds_on_a_starter_imports_it_in_a_solution_cell():
    """Where a pristine cell outside the solution cells imported a starter class to build on, the grader
    would always run the course's class: the import stands in the first solution cell instead."""
    for number, task in (("03", "03.1"), ("05", "05.1"), ("06", "06.1")):
        (path,) = SOLUTIONS.glob(f"{number}_*.ipynb")
        nb = read_notebook(path)
        cell = nb.cells[find_tasks(nb)[task].solution_cell]
        assert built_on(task, cell.source, cell.source), f"{task}'s solution cell does not import its starter"


@pytest.mark.slow
def test_a_learners_own_exercise_02_class_is_what_exercise_03_grades(tmp_path):
    own = _own_class_02()
    (tmp_path / "good").mkdir()
    good = _submission_03(tmp_path / "good", own)
    report = grader.grade_notebook(good, pristine=SOLUTIONS / "03_the_allocator.ipynb", workdir=tmp_path / "w1")
    assert not report.error, report.error
    assert report.earned == report.points, [(t.task, t.failure) for t in report.tasks]
    assert any(n.startswith("03.1 builds on your own MyAllocator") for n in report.notes), report.notes

    # The same class with one bug of exercise 02 (blocks from the tail of the free queue): 03.1 loses it,
    # which the course's starter would not have.
    buggy = own.replace("self.free.popleft() for _ in range(count)", "self.free.pop() for _ in range(count)")
    assert buggy != own
    (tmp_path / "bad").mkdir()
    bad = _submission_03(tmp_path / "bad", buggy)
    report = grader.grade_notebook(bad, pristine=SOLUTIONS / "03_the_allocator.ipynb", workdir=tmp_path / "w2")
    task = next(t for t in report.tasks if t.task == "03.1")
    assert not task.passed, "the grade must be on the learner's own class, bug included"


def test_the_learner_versions_keep_the_starter_line():
    """The generated learner notebooks carry the import line a learner replaces (outside the markers)."""
    nb = nbformat.read(ROOT / "exercises" / "03_the_allocator.ipynb", as_version=4)
    cell = nb.cells[find_tasks(nb)["03.1"].solution_cell]
    assert STARTER_LINE in cell.source
