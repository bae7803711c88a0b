"""A learner's fork of the course: telling a learner's work in ``exercises/NN_*.ipynb`` from a stale copy.

In the course repository the learner versions must equal what :mod:`.generate` writes
(the sync gate). A learner who forks the course edits those same files, so in a fork the
gate accepts a learner version that is the fresh one *plus a learner's work*: the same
tasks with the same check cells, every other cell of the fresh version still there in
order (learners may add cells of their own), any solution code and any outputs. A copy
whose tasks, checks or text differ from the solutions is still stale and still fails.

The fork is told by the environment: ``PAGED_KV_LEARNER_FORK=true`` (the course workflow
sets it from GitHub's ``github.event.repository.fork``). The course's own CI leaves it
unset, so there every difference from a fresh generation fails the gate.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from nbformat import NotebookNode

from .notebook_tasks import ROLE_CHECK, cell_task

FORK_ENV = "PAGED_KV_LEARNER_FORK"


def in_learner_fork() -> bool:
    """Whether this checkout is a learner's fork (``PAGED_KV_LEARNER_FORK`` is ``1``, ``true`` or ``yes``)."""
    return os.environ.get(FORK_ENV, "").strip().lower() in ("1", "true", "yes")


def _task_cells(nb: NotebookNode) -> List[Tuple[str, str, Optional[str]]]:
    """``(task, role, source of a check cell)`` for every task cell, in order."""
    out = []
    for cell in nb.cells:
        found = cell_task(cell)
        if found is not None:
            out.append((found[0], found[1], cell.get("source", "") if found[1] == ROLE_CHECK else None))
    return out


def learner_work_problems(current: NotebookNode, fresh: NotebookNode) -> List[str]:
    """Why ``current`` is not ``fresh`` plus a learner's work ([] when it is): tasks or check cells that
    differ, or a cell of the fresh version (not a solution cell) that is missing or changed."""
    problems: List[str] = []
    mine, wanted = _task_cells(current), _task_cells(fresh)
    if mine != wanted:
        problems.append("its tasks or check cells differ from the solutions' (stale: run `make exercises`)")
    sources = [c.get("source", "") for c in current.cells]
    cursor = 0
    for index, cell in enumerate(fresh.cells):
        if cell_task(cell) is not None:
            continue
        source = cell.get("source", "")
        try:
            cursor = sources.index(source, cursor) + 1
        except ValueError:
            first = source.strip().splitlines()[0][:60] if source.strip() else "(empty)"
            problems.append(f"cell {index} of the fresh version ({first!r}) is missing or changed "
                            "(stale: run `make exercises`)")
            break
    return problems


def worked_exercises(solutions: Path, exercises: Path) -> List[str]:
    """The numbers ``NN`` of the learner versions in ``exercises`` that hold a learner's work (they differ
    from a fresh generation and pass :func:`learner_work_problems`)."""
    from .generate import learner_text, solution_paths
    from .notebook_tasks import NotebookFormatError, notebook_from_text

    found = []
    for solution in solution_paths(solutions):
        target = exercises / solution.name
        if not target.is_file():
            continue
        current, fresh = target.read_text(encoding="utf-8"), learner_text(solution)
        try:
            if current != fresh and not learner_work_problems(notebook_from_text(current), notebook_from_text(fresh)):
                found.append(solution.name[:2])
        except NotebookFormatError:
            continue
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m paged_kv_course.grading.learner_work [COURSE]``: print the exercises holding a learner's work
    (``02 05``), for ``make check EXERCISES=...`` in a learner's fork."""
    course = Path(argv[0]) if argv else Path.cwd()
    print(" ".join(worked_exercises(course / "exercises" / "solutions", course / "exercises")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
