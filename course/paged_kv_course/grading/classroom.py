"""The CI files a released class repository carries: a check workflow, and GitHub Classroom's autograding.

- ``.github/workflows/check.yml`` runs ``make check`` on every push and puts its score table
  in the job summary: nbval is the learner's quick feedback, the grader's score is the grade.
- ``.github/workflows/classroom.yml`` is the workflow GitHub Classroom's autograding reads:
  one test per task, each running the official grader for that one task
  (``paged-kv grade NB --task NN.k``, exit 0 iff it passed) with the task's points as its
  maximum score, then Classroom's reporter. A task judged by several check cells gets one
  test per check cell instead (``--task NN.k --check N``, its own points), so Classroom
  gives partial credit the way the grader does.

Both are generated from the exercises themselves, so the tests and points cannot drift
from the notebooks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Sequence, Tuple, Union

# (notebook, task, points) or (notebook, task, points, check number): one autograding test
GradedTest = Union[Tuple[str, str, float], Tuple[str, str, float, int]]

PYTHON_VERSION = "3.11"
TASK_TIMEOUT_MIN = 10

_CHECK_WORKFLOW = """# Written by `paged-kv release`: check the exercises on every push.
# nbval runs every cell of your exercises (quick feedback); the official grader gives the score.
name: check
on: [push, pull_request, workflow_dispatch]
jobs:
  check:
    runs-on: ubuntu-latest
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
      - name: bubblewrap, the grader's sandbox
        run: sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap
      - name: make check
        run: make check CHECK_SUMMARY="$GITHUB_STEP_SUMMARY"
"""


def check_workflow() -> str:
    """The text of ``.github/workflows/check.yml``."""
    return _CHECK_WORKFLOW.format(python=PYTHON_VERSION)


def step_id(task: str, check: int = 0) -> str:
    """A workflow step id for a task (``03.1`` -> ``task-03-1``) or one of its checks (``task-03-1-check-2``)."""
    return "task-" + re.sub(r"[^0-9A-Za-z]+", "-", task).strip("-") + (f"-check-{check}" if check else "")


def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def classroom_workflow(tasks: Sequence[GradedTest]) -> str:
    """The text of ``.github/workflows/classroom.yml`` for ``(notebook path, task, points)`` triples."""
    if not tasks:
        raise ValueError("no graded tasks: GitHub Classroom needs at least one test")
    lines: List[str] = [
        "# Written by `paged-kv release`: GitHub Classroom's autograding, one test per task.",
        "name: Autograding Tests",
        "'on': [push, repository_dispatch]",
        "permissions:",
        "  checks: write",
        "  actions: read",
        "  contents: read",
        "jobs:",
        "  run-autograding-tests:",
        "    runs-on: ubuntu-latest",
        "    if: github.actor != 'github-classroom[bot]'",
        "    steps:",
        "      - uses: actions/checkout@v4",
        "      - uses: actions/setup-python@v5",
        "        with:",
        f"          python-version: {_quote(PYTHON_VERSION)}",
        "      - name: install the course and the grader's sandbox",
        "        run: sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap && make install",
    ]
    ids = []
    for entry in tasks:
        notebook, task, points = entry[0], entry[1], entry[2]
        check = int(entry[3]) if len(entry) > 3 else 0
        ident = step_id(task, check)
        ids.append(ident)
        points_text = str(int(points)) if float(points).is_integer() else str(points)
        name = f"task {task}" + (f" check {check}" if check else "")
        command = f".venv/bin/paged-kv grade {notebook} --task {task}" + (f" --check {check}" if check else "")
        lines += [
            f"      - name: {_quote(name)}",
            f"        id: {ident}",
            "        uses: classroom-resources/autograding-command-grader@v1",
            "        with:",
            f"          test-name: {_quote(name)}",
            f"          command: {_quote(command)}",
            f"          timeout: {TASK_TIMEOUT_MIN}",
            f"          max-score: {points_text}",
        ]
    lines += [
        "      - name: Autograding Reporter",
        "        uses: classroom-resources/autograding-grading-reporter@v1",
        "        env:",
    ]
    for ident in ids:
        env = ident.upper().replace("-", "_") + "_RESULTS"
        lines.append(f"          {env}: \"${{{{steps.{ident}.outputs.result}}}}\"")
    lines += ["        with:", f"          runners: {','.join(ids)}", ""]
    return "\n".join(lines)


def graded_tasks(exercises: Path) -> List[GradedTest]:
    """``(notebook path relative to the course, task, points)`` for every task of every learner notebook
    in ``exercises``; a task with several check cells gives ``(notebook, task, points, N)`` per check cell."""
    from .notebook_tasks import find_tasks, read_notebook

    found: List[GradedTest] = []
    for path in sorted(exercises.glob("[0-9][0-9]_*.ipynb")):
        for task in find_tasks(read_notebook(path)).values():
            if len(task.check_cells) > 1:
                found.extend((f"exercises/{path.name}", task.task, float(share), number)
                             for number, share in enumerate(task.check_points, start=1))
            else:
                found.append((f"exercises/{path.name}", task.task, float(task.points)))
    return found


def write_workflows(release: Path) -> List[Path]:
    """Write both workflows into a release folder (its ``exercises/`` already generated); return them."""
    folder = release / ".github" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    check = folder / "check.yml"
    check.write_text(check_workflow(), encoding="utf-8")
    classroom = folder / "classroom.yml"
    classroom.write_text(classroom_workflow(graded_tasks(release / "exercises")), encoding="utf-8")
    return [check, classroom]
