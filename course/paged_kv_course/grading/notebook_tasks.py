"""The exercise notebook conventions, in one place: task metadata, solution markers, validation.

A solution notebook ``exercises/solutions/NN_topic.ipynb`` marks its graded cells with
cell metadata ``{"paged_kv": {"task": "NN.k", "role": "solution" | "check", "points": 2}}``;
a solution cell also names its kind of task, ``"kind": "build" | "debug" | "design"``
(from a contract; a provided implementation with planted bugs; an open choice graded
by a measured threshold).
A solution cell holds scaffolding plus solution code between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` lines; a check cell calls a ``check_*`` function and its stored
output is the single line ``PASSED NN.k``. The generator, the grader and the CI gates
all read notebooks through this module so that they agree on what a task is.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import nbformat
from nbformat import NotebookNode

from ._common import PASS_PREFIX

META_KEY = "paged_kv"
ROLE_SOLUTION = "solution"
ROLE_CHECK = "check"
ROLES = (ROLE_SOLUTION, ROLE_CHECK)
BEGIN_MARKER = "### BEGIN SOLUTION"
END_MARKER = "### END SOLUTION"
MIN_TASKS = 3
DEFAULT_POINTS = 1
KINDS = ("build", "debug", "design")

TASK_ID = re.compile(r"^(\d{2})\.(\d+)$")
_MARKER_LINE = re.compile(r"^([ \t]*)(### (?:BEGIN|END) SOLUTION)[ \t]*$")


class NotebookFormatError(ValueError):
    """A file that cannot be read as a Jupyter notebook (not JSON, or not notebook-shaped)."""


class ExerciseSpecError(ValueError):
    """A solution notebook that breaks the exercise conventions (markers, metadata, checks)."""


@dataclass(frozen=True)
class Task:
    """One graded task of a notebook: its id, its points and where its cells are."""

    task: str
    points: float
    solution_cell: int
    check_cells: Tuple[int, ...]
    kind: str = ""
    check_points: Tuple[float, ...] = ()  # one entry per check cell, summing to ``points``

    def points_of_check(self, position: int) -> float:
        """The points the ``position``-th check cell of this task awards on its own."""
        if position < len(self.check_points):
            return self.check_points[position]
        return self.points if len(self.check_cells) <= 1 else 0


def not_implemented_line(task: str) -> str:
    """The statement a learner replaces; the generator puts it where the solution was."""
    return f'raise NotImplementedError("Task {task}: replace this line with your code")'


def read_notebook(path: Union[str, Path]) -> NotebookNode:
    """Read a notebook as nbformat v4, with clear errors and deterministic cell ids.

    Cells of a v4.5+ notebook that lack an ``id`` get one derived from their position
    (nbformat would otherwise invent random ones, and generated files would never be
    byte-identical).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NotebookFormatError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise NotebookFormatError(f"{path}: not a notebook (the file is not UTF-8 text)") from exc
    return notebook_from_text(text, str(path))


def notebook_from_text(text: str, name: str = "<notebook>") -> NotebookNode:
    """Parse notebook JSON text; see :func:`read_notebook`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookFormatError(
            f"{name}: not a valid notebook: the file is not valid JSON "
            f"(line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookFormatError(f"{name}: not a valid notebook: no list of cells")
    if data.get("nbformat") != 4:
        raise NotebookFormatError(f"{name}: not a valid notebook: nbformat {data.get('nbformat')!r}, expected 4")
    if data.get("nbformat_minor", 0) >= 5:
        for index, cell in enumerate(data["cells"]):
            if isinstance(cell, dict) and not cell.get("id"):
                cell["id"] = hashlib.sha1(f"{index}".encode()).hexdigest()[:8]
    for index, cell in enumerate(data["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise NotebookFormatError(f"{name}: not a valid notebook: cell {index} has no valid cell_type")
    try:
        return nbformat.reads(json.dumps(data), as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds; all mean "unreadable"
        raise NotebookFormatError(f"{name}: not a valid notebook ({type(exc).__name__}: {exc})") from exc


def write_notebook(nb: NotebookNode, path: Union[str, Path]) -> None:
    """Write a notebook the way nbformat does (sorted keys, one-space indent, final newline)."""
    Path(path).write_text(notebook_to_text(nb), encoding="utf-8")


def notebook_to_text(nb: NotebookNode) -> str:
    """The exact text :func:`write_notebook` writes."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def cell_meta(cell: NotebookNode) -> Optional[dict]:
    """The cell's ``paged_kv`` metadata dict, or None when it has none."""
    meta = cell.get("metadata", {}).get(META_KEY)
    return meta if isinstance(meta, dict) else None


def cell_task(cell: NotebookNode) -> Optional[Tuple[str, str]]:
    """``(task, role)`` for a task cell, else None (ill-formed metadata counts as none)."""
    meta = cell_meta(cell)
    if cell.get("cell_type") != "code" or meta is None:
        return None
    task, role = meta.get("task"), meta.get("role")
    if isinstance(task, str) and role in ROLES:
        return task, role
    return None


def cell_points(cell: NotebookNode) -> float:
    """Points of a solution cell (``points`` metadata, default 1)."""
    meta = cell_meta(cell) or {}
    points = meta.get("points", DEFAULT_POINTS)
    return points if isinstance(points, (int, float)) and not isinstance(points, bool) else DEFAULT_POINTS


def declared_check_points(cell: NotebookNode) -> Optional[float]:
    """The ``points`` a check cell declares in its metadata, or None when it declares none (or no number)."""
    points = (cell_meta(cell) or {}).get("points")
    return points if isinstance(points, (int, float)) and not isinstance(points, bool) else None


def split_points(total: float, declared: List[Optional[float]]) -> Tuple[float, ...]:
    """Each check cell's share of a task's ``total`` points: what a cell declares, and the rest shared
    evenly among the cells that declare nothing (whole points where the rest is whole, the remainder to
    the first of them), so a notebook without per-check points stays valid. One cell gets the total."""
    if len(declared) <= 1:
        return tuple(float(total) for _ in declared)
    rest = max(0.0, float(total) - sum(p for p in declared if p is not None))
    open_cells = [i for i, p in enumerate(declared) if p is None]
    shares = [float(p) if p is not None else 0.0 for p in declared]
    if open_cells:
        if rest.is_integer():
            each, extra = divmod(int(rest), len(open_cells))
            for i in open_cells:
                shares[i] = float(each)
            shares[open_cells[0]] += extra
        else:
            for i in open_cells:
                shares[i] = rest / len(open_cells)
    return tuple(shares)


def cell_kind(cell: NotebookNode) -> str:
    """The ``kind`` of a solution cell ('' when missing or not a string)."""
    kind = (cell_meta(cell) or {}).get("kind")
    return kind if isinstance(kind, str) else ""


def pass_line(task: str) -> str:
    """The line a check prints on success."""
    return f"{PASS_PREFIX} {task}"


def stored_pass(text: str, task: str) -> bool:
    """Whether a check cell's stored output is its success: the pass line last, after any figures
    the check prints (a design task's figure beside the library's, exercise 08's measurements)."""
    lines = text.strip().splitlines()
    return bool(lines) and lines[-1].strip() == pass_line(task) and pass_line(task) not in lines[:-1]


def stream_text(cell: NotebookNode, name: str = "stdout") -> str:
    """All stored stream output of one stream of a code cell, concatenated."""
    return "".join(
        out.get("text", "") for out in cell.get("outputs", [])
        if out.get("output_type") == "stream" and out.get("name") == name
    )


def find_tasks(nb: NotebookNode) -> Dict[str, Task]:
    """Tasks of a (solution or learner) notebook, in notebook order, without validation.

    A task's solution cell is its first solution cell; its check cells are the check
    cells that name it.
    """
    solutions: Dict[str, Tuple[int, float]] = {}
    checks: Dict[str, List[int]] = {}
    for index, cell in enumerate(nb.cells):
        found = cell_task(cell)
        if found is None:
            continue
        task, role = found
        if role == ROLE_SOLUTION:
            solutions.setdefault(task, (index, cell_points(cell)))
        else:
            checks.setdefault(task, []).append(index)
    return {
        task: Task(task, points, index, tuple(checks.get(task, ())), cell_kind(nb.cells[index]),
                   split_points(points, [declared_check_points(nb.cells[i]) for i in checks.get(task, ())]))
        for task, (index, points) in solutions.items()
    }


def marker_regions(source: str) -> List[Tuple[int, int, str]]:
    """``(begin_line, end_line, indent)`` of every solution region; raise on unbalanced markers."""
    regions: List[Tuple[int, int, str]] = []
    begin: Optional[Tuple[int, str]] = None
    for number, line in enumerate(source.splitlines()):
        match = _MARKER_LINE.match(line)
        if not match:
            if BEGIN_MARKER in line or END_MARKER in line:
                raise ExerciseSpecError(
                    f"line {number + 1}: a solution marker must be alone on its line: {line.strip()!r}"
                )
            continue
        indent, marker = match.groups()
        if marker == BEGIN_MARKER:
            if begin is not None:
                raise ExerciseSpecError(
                    f"line {number + 1}: {BEGIN_MARKER} inside the region opened on line {begin[0] + 1}"
                )
            begin = (number, indent)
        else:
            if begin is None:
                raise ExerciseSpecError(f"line {number + 1}: {END_MARKER} without a {BEGIN_MARKER}")
            regions.append((begin[0], number, begin[1]))
            begin = None
    if begin is not None:
        raise ExerciseSpecError(f"line {begin[0] + 1}: {BEGIN_MARKER} is never closed by {END_MARKER}")
    return regions


def strip_solutions(source: str, task: str) -> str:
    """Replace every marked region (markers included) by the NotImplementedError line."""
    lines = source.splitlines(keepends=True)
    out: List[str] = []
    cursor = 0
    for begin, end, indent in marker_regions(source):
        out.extend(lines[cursor:begin])
        newline = "\n" if end + 1 < len(lines) or lines[end].endswith("\n") else ""
        out.append(f"{indent}{not_implemented_line(task)}{newline}")
        cursor = end + 1
    out.extend(lines[cursor:])
    return "".join(out)


def validate_solution_notebook(nb: NotebookNode, name: str) -> List[Task]:
    """Check a solution notebook against the conventions; return its tasks in order.

    Raises :class:`ExerciseSpecError` listing every problem found: unknown roles or
    malformed task ids, duplicate solution cells, a solution cell whose ``kind`` is not one of
    :data:`KINDS`, a task without a check cell after its solution, unbalanced markers, markers outside solution cells, a check cell without
    its stored ``PASSED NN.k`` line, fewer than three tasks.
    """
    problems: List[str] = []
    prefix_match = re.match(r"^(\d{2})_", Path(name).name)
    prefix = prefix_match.group(1) if prefix_match else None
    solution_at: Dict[str, int] = {}
    check_at: Dict[str, List[int]] = {}
    for index, cell in enumerate(nb.cells):
        where = f"cell {index}"
        meta = cell_meta(cell)
        source = cell.get("source", "")
        has_markers = BEGIN_MARKER in source or END_MARKER in source
        if meta is None:
            if has_markers:
                problems.append(f"{where}: solution markers in a cell without paged_kv task metadata")
            continue
        task, role = meta.get("task"), meta.get("role")
        if cell.get("cell_type") != "code":
            problems.append(f"{where}: paged_kv metadata on a {cell.get('cell_type')} cell")
            continue
        if not isinstance(task, str) or not TASK_ID.match(task):
            problems.append(f"{where}: task id {task!r} is not of the form 'NN.k'")
            continue
        if prefix is not None and not task.startswith(prefix + "."):
            problems.append(f"{where}: task {task} does not belong to notebook {prefix}")
        if role == ROLE_SOLUTION:
            if task in solution_at:
                problems.append(f"{where}: second solution cell for task {task} (first: cell {solution_at[task]})")
                continue
            solution_at[task] = index
            points = meta.get("points", DEFAULT_POINTS)
            if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
                problems.append(f"{where}: task {task} has points {points!r}; use a positive number")
            kind = meta.get("kind")
            if kind not in KINDS:
                problems.append(f"{where}: solution cell of task {task} has kind {kind!r}; set its metadata "
                                f"paged_kv.kind to one of {', '.join(KINDS)}")
            try:
                regions = marker_regions(source)
            except ExerciseSpecError as exc:
                problems.append(f"{where} (task {task}): {exc}")
                continue
            if not regions:
                problems.append(f"{where}: solution cell of task {task} has no {BEGIN_MARKER} ... {END_MARKER} region")
            problems.extend(f"{where} (task {task}): {p}" for p in _top_level_raises(strip_solutions(source, task), task))
        elif role == ROLE_CHECK:
            check_at.setdefault(task, []).append(index)
            if has_markers:
                problems.append(f"{where}: solution markers in a check cell (task {task})")
            if "check_" not in source:
                problems.append(f"{where}: check cell of task {task} calls no check_* function")
            if not stored_pass(stream_text(cell), task) or len(cell.get("outputs", [])) != 1:
                problems.append(
                    f"{where}: check cell of task {task} must have one stored output, the line "
                    f"'{pass_line(task)}' (figures the check prints may come before it) "
                    f"(run: python scripts/run_notebooks.py {name})"
                )
            elif cell.get("execution_count") is None:
                problems.append(f"{where}: check cell of task {task} has outputs but no execution count")
        else:
            problems.append(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    for task, indices in check_at.items():
        if task not in solution_at:
            problems.append(f"cell {indices[0]}: check cell for task {task}, which has no solution cell")
    for task, index in solution_at.items():
        if not any(i > index for i in check_at.get(task, [])):
            problems.append(f"task {task}: no check cell after its solution cell (cell {index})")
    if len(solution_at) < MIN_TASKS:
        problems.append(f"{len(solution_at)} task(s); an exercise notebook has at least {MIN_TASKS}")
    if problems:
        raise ExerciseSpecError(f"{name}:\n  " + "\n  ".join(problems))
    return list(find_tasks(nb).values())


def _top_level_raises(learner_source: str, task: str) -> List[str]:
    """Problems if a NotImplementedError line would run when the cell runs (not inside a def).

    Solution cells only define things; a raise at top level (or in a class body) would
    fail the learner's solution cell itself. Sources with IPython syntax are skipped.
    """
    import ast

    try:
        tree = ast.parse(learner_source)
    except SyntaxError:
        return []
    problems: List[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Raise) and not in_function:
                exc = child.exc
                if isinstance(exc, ast.Call) and getattr(exc.func, "id", None) == "NotImplementedError":
                    problems.append(
                        f"line {child.lineno}: the solution region is not inside a function, so the "
                        "learner's cell would raise when run; put solution code in a function body"
                    )
            visit(child, inside)

    visit(tree, False)
    return problems
