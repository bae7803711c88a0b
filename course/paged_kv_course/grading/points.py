"""Per-check points: the rules a solution notebook follows when a task is judged by several check cells.

Each check cell may declare ``metadata.paged_kv.points``; the shares
(:func:`.notebook_tasks.split_points`) sum to the task's ``points``, and the task's header
(the markdown between the previous task's cells and its solution cell) states the split on
one line that starts with ``**Points:**``, naming each check function with its points::

    **Points:** 2 for fork and free (check_sharing_03), 2 for the differential check (check_allocator_03).

:func:`points_problems` lists what breaks these rules; the exercise gate runs it on every
solution notebook.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from nbformat import NotebookNode

from .notebook_tasks import META_KEY, Task, cell_task, declared_check_points, find_tasks

POINTS_LINE = "**Points:**"
_CALLED = re.compile(r"^\s*(check_\w+)\s*\(", re.M)
_STATED = re.compile(r"(\d+(?:\.\d+)?)\s+(?:points?\s+)?for\b[^()]*\((check_\w+)\)")


def check_function(source: str) -> Optional[str]:
    """The check function a check cell calls (its last ``check_*(...)`` call), or None."""
    found = _CALLED.findall(source)
    return found[-1] if found else None


def header_text(nb: NotebookNode, task: Task) -> str:
    """The markdown of a task's header: the markdown cells after the previous task cell, up to its solution cell."""
    start = 0
    for index in range(task.solution_cell - 1, -1, -1):
        if cell_task(nb.cells[index]) is not None:
            start = index + 1
            break
    return "\n".join(c.get("source", "") for c in nb.cells[start:task.solution_cell] if c.get("cell_type") == "markdown")


def points_line(nb: NotebookNode, task: Task) -> Optional[str]:
    """The task header's ``**Points:**`` line, or None."""
    for line in header_text(nb, task).splitlines():
        if line.strip().startswith(POINTS_LINE):
            return line.strip()
    return None


def stated_points(line: str) -> Dict[str, float]:
    """``check function -> points`` as a ``**Points:**`` line states them (``N for ... (check_x)``)."""
    stated: Dict[str, float] = {}
    for number, name in _STATED.findall(line):
        stated[name] = stated.get(name, 0.0) + float(number)
    return stated


def declares_points(nb: NotebookNode) -> bool:
    """Whether any check cell of the notebook declares its own points."""
    return any(cell_task(c) is not None and cell_task(c)[1] == "check" and  # type: ignore[index]
               (c.get("metadata", {}).get(META_KEY) or {}).get("points") is not None for c in nb.cells)


def points_problems(nb: NotebookNode, name: str, require_line: Optional[bool] = None) -> List[str]:
    """What breaks the per-check points rules in a solution notebook ('' problems: none).

    Per task with several check cells: declared points are numbers >= 0 whose sum is at most the
    task's (all declared: exactly the task's); the header has a ``**Points:**`` line
    (``require_line``; default: when the notebook declares per-check points anywhere), and a line
    that is there names every check function with its share."""
    if require_line is None:
        require_line = declares_points(nb)
    problems: List[str] = []
    for task in find_tasks(nb).values():
        where = f"{name}: task {task.task}"
        raw = [(nb.cells[i].get("metadata", {}).get(META_KEY) or {}).get("points") for i in task.check_cells]
        declared = [declared_check_points(nb.cells[i]) for i in task.check_cells]
        for index, (value, number) in zip(task.check_cells, zip(raw, declared)):
            if value is not None and (number is None or number < 0):
                problems.append(f"{where}: check cell {index} has points {value!r}; use a number >= 0")
        if len(task.check_cells) <= 1:
            if any(v is not None for v in raw) and declared[0] is not None and declared[0] != task.points:
                problems.append(f"{where}: its one check cell declares {declared[0]:g} points, the task has "
                                f"{task.points:g}; drop the check cell's points")
            continue
        given = sum(p for p in declared if p is not None and p >= 0)
        if given > task.points or (None not in declared and given != task.points):
            problems.append(f"{where}: its check cells declare {given:g} points in all; the task has {task.points:g}")
        line = points_line(nb, task)
        if line is None:
            if require_line:
                problems.append(f"{where}: {len(task.check_cells)} check cells but no line starting with "
                                f"{POINTS_LINE} in its header (state each check's points)")
            continue
        stated = stated_points(line)
        shares: Dict[str, float] = {}
        for index, share in zip(task.check_cells, task.check_points):
            function = check_function(nb.cells[index].get("source", "")) or f"cell {index}"
            shares[function] = shares.get(function, 0.0) + share
        for function, share in shares.items():
            if function not in stated:
                problems.append(f"{where}: the {POINTS_LINE} line does not name {function} "
                                f"(worth {share:g}): write '{share:g} for ... ({function})'")
            elif stated[function] != share:
                problems.append(f"{where}: the {POINTS_LINE} line gives {function} {stated[function]:g} points; "
                                f"its check cell is worth {share:g}")
        for function in sorted(set(stated) - set(shares)):
            problems.append(f"{where}: the {POINTS_LINE} line names {function}, which no check cell of the task calls")
    return problems
