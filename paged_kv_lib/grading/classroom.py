"""The CI files a released class repository carries: a check workflow, and GitHub Classroom's autograding.

- ``.github/workflows/check.yml`` runs ``make check`` on every push and puts its score table
  in the job summary: nbval is the learner's quick feedback, the grader's score is the grade.
- ``.github/workflows/classroom.yml`` is the workflow GitHub Classroom's autograding reads:
  one test per task, each running the official grader for that one task
  (``paged-kv grade NB --task NN.k``, exit 0 iff it passed) with the task's points as its
  maximum score, then Classroom's reporter.

Both are generated from the exercises themselves, so the tests and points cannot drift
from the notebooks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Sequence, Tuple

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


def step_id(task: str) -> str:
    """A workflow step id for a task (``03.1`` -> ``task-03-1``)."""
    return "task-" + re.sub(r"[^0-9A-Za-z]+", "-", task).strip("-")


def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def classroom_workflow(tasks: Sequence[Tuple[str, str, float]]) -> str:
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
    for notebook, task, points in tasks:
        ident = step_id(task)
        ids.append(ident)
        points_text = str(int(points)) if float(points).is_integer() else str(points)
        lines += [
            f"      - name: {_quote('task ' + task)}",
            f"        id: {ident}",
            "        uses: classroom-resources/autograding-command-grader@v1",
            "        with:",
            f"          test-name: {_quote('task ' + task)}",
            f"          command: {_quote(f'.venv/bin/paged-kv grade {notebook} --task {task}')}",
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


def graded_tasks(exercises: Path) -> List[Tuple[str, str, float]]:
    """``(notebook path relative to the course, task, points)`` for every learner notebook in ``exercises``."""
    from .notebook_tasks import find_tasks, read_notebook

    found: List[Tuple[str, str, float]] = []
    for path in sorted(exercises.glob("[0-9][0-9]_*.ipynb")):
        for task in find_tasks(read_notebook(path)).values():
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
