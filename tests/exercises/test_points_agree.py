"""One source of points (issue 34, item 4): for every exercise, the notebook's introduction, its table of
tasks (where it has one), each task's header, the cells' ``paged_kv.points``, docs/exercises.md and the
grader give the same points, hidden cases included; and a task with a hidden case says in its text what
range that case uses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Tuple

import pytest

from paged_kv_course.grading.grader import grade_notebook
from paged_kv_course.grading.hidden import read_cases
from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook
from paged_kv_course.grading.points import header_text

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("[0-9][0-9]_*.ipynb"))
WORDS = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5, "Six": 6}
HEADER = re.compile(r"^## Task (\d\d\.\d)\b.*\((build|debug|design), (\d+) points?"
                    r"(?:, (\d+) of them for (?:a hidden case|hidden cases))?\)\s*$", re.M)
INTRO = re.compile(r"(One|Two|Three|Four|Five|Six) graded tasks \((\d+) points?"
                   r"(?:, (\d+) of them for (?:a hidden case|hidden cases))?\)")
ROW = re.compile(r"^\| (?:\*\*)?(\d\d\.\d)(?:\*\*)? \| (\w+) \| (\d+)(?: \((\d+) hidden\))? \|", re.M)
#: What each hidden case's task text must say about the range the case uses.
RANGES = {"02.3": "2**53", "04.1": "2**31"}


def hidden_points(number: str) -> Dict[str, float]:
    path = ROOT / "exercises" / "hidden" / f"{number}.py"
    points: Dict[str, float] = {}
    for case in read_cases(path) if path.exists() else []:
        points[case.task] = points.get(case.task, 0.0) + case.points
    return points


def graded(path: Path) -> Tuple[Dict[str, Tuple[str, float]], Dict[str, float]]:
    """``task -> (kind, visible points from the cells)`` and ``task -> hidden points``."""
    tasks = find_tasks(read_notebook(path))
    return {t.task: (t.kind, float(t.points)) for t in tasks.values()}, hidden_points(path.name[:2])


def test_every_exercise_is_here():
    assert [p.name[:2] for p in SOLUTIONS] == ["02", "03", "04", "05", "06", "07", "08", "09", "10"]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_headers_state_the_points_the_grader_gives(path):
    nb = read_notebook(path)
    tasks, hidden = graded(path)
    assert set(hidden) <= set(tasks), f"hidden cases of tasks the notebook lacks: {set(hidden) - set(tasks)}"
    for task in find_tasks(nb).values():
        found = HEADER.findall(header_text(nb, task))
        assert len(found) == 1, f"{task.task}: no header '## Task {task.task}: ... (kind, N points)'"
        number, kind, total, in_hidden = found[0]
        assert number == task.task
        assert kind == task.kind, f"{task.task}: the header says {kind}, the cell metadata {task.kind}"
        want = task.points + hidden.get(task.task, 0)
        assert float(total) == want, f"{task.task}: the header says {total} points, the grader gives {want:g}"
        assert float(in_hidden or 0) == hidden.get(task.task, 0), \
            f"{task.task}: the header says {in_hidden or 0} hidden points, the hidden cases hold {hidden.get(task.task, 0):g}"
    intro = nb.cells[0].source
    found = INTRO.findall(intro)
    assert len(found) == 1, f"{path.name}: the introduction names no 'N graded tasks (P points)'"
    count, total, in_hidden = found[0]
    assert WORDS[count] == len(tasks)
    assert float(total) == sum(p for _, p in tasks.values()) + sum(hidden.values())
    assert float(in_hidden or 0) == sum(hidden.values())
    rows = ROW.findall(intro)
    if "| task | kind | points |" in intro:  # a table of tasks lists every task
        assert [r[0] for r in rows] == sorted(tasks), f"{path.name}: the table lists {[r[0] for r in rows]}"
    for number, kind, total, in_hidden in rows:
        assert kind == tasks[number][0], f"{number}: the table says {kind}"
        assert float(total) == tasks[number][1] + hidden.get(number, 0), f"{number}: the table says {total}"
        assert float(in_hidden or 0) == hidden.get(number, 0), f"{number}: the table's hidden share"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_the_learner_version_states_the_same_points(path):
    learner = ROOT / "exercises" / path.name
    nb, mine = read_notebook(path), read_notebook(learner)
    assert INTRO.findall(nb.cells[0].source) == INTRO.findall(mine.cells[0].source)
    assert ROW.findall(nb.cells[0].source) == ROW.findall(mine.cells[0].source)
    assert HEADER.findall("\n".join(c.source for c in nb.cells if c.cell_type == "markdown")) == \
        HEADER.findall("\n".join(c.source for c in mine.cells if c.cell_type == "markdown"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_docs_table_agrees(path):
    tasks, hidden = graded(path)
    rows = [line for line in (ROOT / "docs" / "exercises.md").read_text(encoding="utf-8").splitlines()
            if re.match(rf"\| {path.name[:2]} [a-z]", line)]
    assert len(rows) == 1, f"docs/exercises.md has no row for exercise {path.name[:2]}"
    stated = {m.group(1): m for m in re.finditer(r"(\d\d\.\d) [^|]*?\((build|debug|design), (\d+)(?::([^)]*))?\)",
                                                  rows[0])}
    assert sorted(stated) == sorted(tasks)
    for number, (kind, points) in tasks.items():
        m = stated[number]
        assert m.group(2) == kind, f"{number}: docs/exercises.md says {m.group(2)}"
        assert float(m.group(3)) == points + hidden.get(number, 0), f"{number}: docs/exercises.md says {m.group(3)}"
        if hidden.get(number):
            assert "hidden" in (m.group(4) or ""), f"{number}: docs/exercises.md does not say a case is hidden"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_the_grader_totals_equal_the_header(path, tmp_path):
    """What ``paged-kv grade`` reports as each task's points (a submission that cannot be read: nothing runs)."""
    submission = tmp_path / path.name
    submission.write_text("not a notebook", encoding="utf-8")
    report = grade_notebook(submission, pristine=ROOT / "exercises" / path.name, cases=ROOT / "exercises" / "hidden")
    total = int(INTRO.findall(read_notebook(path).cells[0].source)[0][1])
    assert sum(t.points for t in report.tasks) == total


@pytest.mark.parametrize("task, words", sorted(RANGES.items()))
def test_a_hidden_case_range_is_in_its_task_text(task, words):
    path = next(p for p in SOLUTIONS if p.name.startswith(task[:2]))
    nb = read_notebook(path)
    assert words in header_text(nb, find_tasks(nb)[task]), f"{task}'s text does not say its range ({words})"


def test_every_hidden_case_has_its_range_named():
    with_hidden = {task for path in SOLUTIONS for task in hidden_points(path.name[:2])}
    assert with_hidden <= set(RANGES), f"hidden cases whose range no test names: {with_hidden - set(RANGES)}"
