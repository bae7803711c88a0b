"""Splicing: the learner's solution cells into a pristine exercise, and notes on code the grader skips.

Only the learner's *solution cells* count. They are spliced into a pristine learner
version of the exercise (so deleted or edited check cells come back as they were).
Splicing matches cells by their ``paged_kv`` task metadata. When a learner lost that
metadata (say, by pasting their code into a new cell), a code cell without task metadata
is taken instead if it defines the same top-level functions or classes as the task's
scaffold (ties broken by source similarity, then by position). Code the grader does not
run (outside solution cells) is named in the report's notes.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from typing import Dict, List, Optional, Set, Tuple

from nbformat import NotebookNode

from .notebook_tasks import ROLE_CHECK, ROLE_SOLUTION, Task, cell_task, find_tasks


def _defined_names(source: str) -> Set[str]:
    """Top-level function and class names a cell defines (regex fallback for IPython syntax)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"^(?:async\s+def|def|class)\s+(\w+)", source, flags=re.M))
    return {
        node.name for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def splice(pristine: NotebookNode, submission: NotebookNode) -> Tuple[NotebookNode, List[str]]:
    """The pristine notebook with each task's solution cell source taken from the submission.

    Returns the spliced notebook and notes about how cells were matched (or not).
    """
    result, notes, _ = splice_cells(pristine, submission)
    return result, notes


def splice_cells(pristine: NotebookNode, submission: NotebookNode) -> Tuple[NotebookNode, List[str], Dict[str, int]]:
    """:func:`splice`, also returning which submission cell each task's solution came from."""
    result = copy.deepcopy(pristine)
    tasks = find_tasks(pristine)
    notes: List[str] = []
    by_task: Dict[str, int] = {}
    for index, cell in enumerate(submission.cells):
        found = cell_task(cell)
        if found and found[1] == ROLE_SOLUTION:
            if found[0] in by_task:
                notes.append(f"task {found[0]}: several solution cells; the first one counts")
            else:
                by_task[found[0]] = index
    used = set(by_task.values())
    pristine_sources = {cell.get("source", "") for cell in pristine.cells}
    for task in tasks.values():
        if task.task in by_task:
            continue
        matched = _match_by_content(task, pristine, submission, used, pristine_sources)
        if matched is None:
            notes.append(f"task {task.task}: no solution cell found in the submission (its task metadata is gone)")
            continue
        used.add(matched)
        by_task[task.task] = matched
        notes.append(f"task {task.task}: solution cell had no task metadata; matched cell {matched} by its definitions")
    for task in tasks.values():
        if task.task in by_task:
            result.cells[task.solution_cell].source = submission.cells[by_task[task.task]].get("source", "")
    extra = sorted(set(t for t in by_task) - set(tasks))
    if extra:
        notes.append(f"ignored solution cells for tasks not in this exercise: {', '.join(extra)}")
    return result, notes, by_task


def _match_by_content(
    task: Task, pristine: NotebookNode, submission: NotebookNode, used: Set[int], pristine_sources: Set[str]
) -> Optional[int]:
    scaffold = pristine.cells[task.solution_cell].get("source", "")
    wanted = _defined_names(scaffold)
    relative = task.solution_cell / max(1, len(pristine.cells))
    best: Optional[Tuple[float, float, int]] = None
    for index, cell in enumerate(submission.cells):
        source = cell.get("source", "")
        if index in used or cell.get("cell_type") != "code" or cell_task(cell) is not None:
            continue
        if source in pristine_sources and source != scaffold:
            continue  # an unchanged setup or demo cell
        names = _defined_names(source)
        if wanted and not wanted & names:
            continue
        similarity = difflib.SequenceMatcher(None, scaffold, source).ratio()
        if not wanted and similarity < 0.5:
            continue
        closeness = -abs(index / max(1, len(submission.cells)) - relative)
        key = (len(wanted & names), similarity, closeness)
        if best is None or key > best[:3]:
            best = (*key, index)  # type: ignore[assignment]
    return None if best is None else int(best[-1])


def ungraded_code(pristine: NotebookNode, submission: NotebookNode, used: Dict[str, int]) -> List[str]:
    """Notes on the submission's code that the grader does not run: code in cells that are not solution
    cells (and edits of check cells), each naming the cell and the task whose solution cell it belongs in."""
    tasks = find_tasks(pristine)
    if not tasks:
        return []
    pristine_sources = {cell.get("source", "").strip() for cell in pristine.cells}
    scaffold_names = {
        t.task: _defined_names(pristine.cells[t.solution_cell].get("source", "")) for t in tasks.values()
    }
    taken = set(used.values())
    notes: List[str] = []
    current = next(iter(tasks))
    for index, cell in enumerate(submission.cells):
        found = cell_task(cell)
        if found is not None and found[0] in tasks:
            current = found[0]
        if cell.get("cell_type") != "code" or index in taken:
            continue
        source = cell.get("source", "").strip()
        if found is not None and found[1] == ROLE_SOLUTION:
            continue
        if not source or source in pristine_sources:
            continue
        if found is not None and found[1] == ROLE_CHECK:
            notes.append(f"cell {index}: your edit of a check cell of task {found[0]} is not graded "
                         "(the grader runs the checks as they were written)")
            continue
        names = _defined_names(source)
        owner = next((t for t, wanted in scaffold_names.items() if wanted & names), current)
        notes.append(f"cell {index}: this code is not in a solution cell, so it was not graded; "
                     f"it belongs in the solution cell of task {owner}")
    return notes


def built_on(task: str, learner: str, pristine: str) -> Optional[str]:
    """Which class ``task``'s solution cell builds on, when the pristine cell starts from a course starter.

    A learner may replace the starter's import line with their own class of the exercise before; the
    grader runs the whole cell, so the grade is on that class, and this line says so in the report."""
    try:
        ours, theirs = ast.parse(pristine), ast.parse(learner)
    except SyntaxError:
        return None
    starters = [(node.module, alias.name, alias.asname or alias.name) for node in ast.walk(ours)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paged_kv_course.starters.")
                for alias in node.names]
    if not starters:
        return None
    module, name, bound = starters[0]
    kept = any(isinstance(node, ast.ImportFrom) and node.module == module
               and any(alias.name == name for alias in node.names) for node in ast.walk(theirs))
    if kept:
        return f"{task} builds on the course's {name} ({module})"
    own = any(isinstance(node, ast.ClassDef) and node.name == bound for node in ast.walk(theirs))
    where = "defined in its solution cell" if own else "not the starter's import"
    return f"{task} builds on your own {bound} ({where}), not the course's {name}"
