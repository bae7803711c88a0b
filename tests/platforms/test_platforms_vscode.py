"""VS Code ignores JupyterLab's ``editable``/``deletable`` cell metadata, so a learner there can
edit or delete a check cell. The official grade must not move: the grader runs the pristine
checks, whatever the submission's check cells say (shown here on the course's exercise 03)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from paged_kv_course.grading import grader
from paged_kv_course.grading.notebook_tasks import cell_task

ROOT = Path(__file__).resolve().parents[2]
SOLVED = ROOT / "exercises" / "solutions" / "03_the_allocator.ipynb"
UNSOLVED = ROOT / "exercises" / "03_the_allocator.ipynb"


def _as_vscode_leaves_it(source: Path, check_source: str, drop_every_other: bool) -> nbformat.NotebookNode:
    """Every check cell edited (or, one in two, deleted), and the lock metadata gone."""
    nb = nbformat.read(source, as_version=4)
    kept, checks = [], 0
    for cell in nb.cells:
        found = cell_task(cell)
        cell.metadata.pop("editable", None)
        cell.metadata.pop("deletable", None)
        if found and found[1] == "check":
            checks += 1
            if drop_every_other and checks % 2 == 0:
                continue
            cell.source = check_source.format(task=found[0])
        kept.append(cell)
    nb.cells = kept
    assert checks >= 3
    return nb


def _grade(nb: nbformat.NotebookNode, tmp_path: Path) -> grader.GradeReport:
    path = tmp_path / "03_the_allocator.ipynb"
    nbformat.write(nb, path)
    return grader.grade_notebook(path, course=ROOT, cell_timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_edited_checks_cannot_pass_an_unsolved_notebook(tmp_path):
    report = _grade(_as_vscode_leaves_it(UNSOLVED, "print('PASSED {task}')", drop_every_other=False), tmp_path)
    assert report.tasks and not report.error
    assert all(not t.passed for t in report.tasks), [(t.task, t.failure) for t in report.tasks]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_edited_or_deleted_checks_cannot_fail_a_solved_notebook(tmp_path):
    nb = _as_vscode_leaves_it(SOLVED, "raise AssertionError('edited check {task}')", drop_every_other=True)
    report = _grade(nb, tmp_path)
    assert report.tasks and not report.error
    assert all(t.passed for t in report.tasks), [(t.task, t.failure) for t in report.tasks]
