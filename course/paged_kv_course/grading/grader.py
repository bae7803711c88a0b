"""Grade one submitted exercise notebook: splice, run the learner's cells, judge each check outside.

Only the learner's *solution cells* count: they are spliced (:mod:`.splice`) into the
pristine learner version (:mod:`.pristine`). The judge (:mod:`.judge`, a process of its
own, run by :mod:`.judge_process`) runs the spliced cells in the learner's kernel
(:mod:`.runner`, inside a bubblewrap sandbox where the system has one) and runs each
check cell's check function itself, with proxies for the learner's objects: the verdict
never depends on what the learner's kernel prints or writes.

A task passes when its solution cell ran and every one of its checks passed. Each check
cell awards its own points (``metadata.paged_kv.points``, else an even share of the
task's, see :func:`.notebook_tasks.split_points`), so a task with several checks earns
partial credit; hidden cases (:mod:`.hidden`, official grading only) run after the
visible checks of their task and add their own points.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from nbformat import NotebookNode

from . import hidden as hidden_cases
from . import sandbox
from .delegation import delegation_lines
from .judge_process import DEFAULT_TIMEOUT_S, GradingError, run_judge
from .notebook_tasks import ROLE_SOLUTION, ExerciseSpecError, NotebookFormatError, Task, cell_task, find_tasks
from .points import check_function
from .pristine import (
    EXERCISE_NAME,
    InputError,
    PristineNotFoundError,
    _pristine_source,
    check_exercise_name,
    default_search,
    exercise_name,
    find_course,
    find_pristine,
    find_tasks_lenient,
    is_solution_notebook,
    load_pristine,
    submission_exercise,
)
from .splice import _defined_names, built_on, splice, splice_cells, ungraded_code

__all__ = [
    "CheckResult", "DEFAULT_TIMEOUT_S", "GradeReport", "GradingError", "InputError", "PristineNotFoundError",
    "TaskResult", "EXERCISE_NAME", "check_exercise_name", "default_search", "exercise_name", "find_course",
    "find_pristine", "find_tasks_lenient", "grade_notebook", "is_solution_notebook", "load_pristine",
    "prepare_for_run", "run_judge", "score", "splice", "splice_cells", "submission_exercise", "ungraded_code",
    "_defined_names", "_pristine_source",
]


def read_submission(path: Path) -> NotebookNode:
    """The submission, read only when it is one regular file: never a symlink, a folder or a device (a link
    would let one learner hand in another's notebook, or the course's own solutions)."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise NotebookFormatError(f"{path}: cannot read the submission ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise NotebookFormatError(f"{path}: the submission is {what}; hand in the notebook file itself")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise NotebookFormatError(f"{path}: cannot read the submission ({exc.strerror})") from None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    from .notebook_tasks import notebook_from_text

    return notebook_from_text(text, str(path))


@dataclass
class CheckResult:
    """The outcome of one check cell (or hidden case) of a task: its points on their own."""

    name: str
    points: float
    passed: bool
    failure: str = ""
    hidden: int = 0  # the hidden case's number within its task (0: a visible check cell)


@dataclass
class TaskResult:
    """The outcome of one task: its points, whether it passed, and why not.

    ``checks`` holds one :class:`CheckResult` per check cell (and hidden case); a task that did
    not pass earns the points of the checks that did, when it has several."""

    task: str
    points: float
    passed: bool
    failure: str = ""
    detail: str = ""
    checks: List[CheckResult] = field(default_factory=list)

    @property
    def earned(self) -> float:
        if self.passed:
            return self.points
        if len(self.checks) <= 1:
            return 0
        return min(self.points, sum(c.points for c in self.checks if c.passed))


@dataclass
class GradeReport:
    """Everything the grader found about one submission."""

    submission: Path
    exercise: str = ""
    tasks: List[TaskResult] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    error: str = ""

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tasks)

    @property
    def earned(self) -> float:
        return sum(t.earned for t in self.tasks)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.tasks) and all(t.passed for t in self.tasks)


# ---------------------------------------------------------------------------------------
# Running


def prepare_for_run(nb: NotebookNode, cases: Sequence[hidden_cases.HiddenCase] = ()) -> Tuple[List[dict], Dict[int, Tuple[str, str]]]:
    """The code cells to run, as the judge takes them, and a map: code-cell number -> (task, role).

    Each hidden case becomes a check cell right after the last visible check cell of its task
    (its entry carries ``hidden``: the case's number, ``points`` and ``hint``)."""
    cells: List[dict] = []
    roles: Dict[int, Tuple[str, str]] = {}
    tasks = find_tasks(nb)
    last_check = {t.task: t.check_cells[-1] for t in tasks.values() if t.check_cells}
    by_task: Dict[str, List[hidden_cases.HiddenCase]] = {}
    for case in cases:
        if case.task in last_check:
            by_task.setdefault(case.task, []).append(case)
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        found = cell_task(cell)
        if found is not None:
            roles[len(cells)] = found
        cells.append({
            "source": cell.get("source", ""), "tags": list(cell.get("metadata", {}).get("tags", [])),
            "task": found[0] if found else None, "role": found[1] if found else None,
        })
        if found is not None and last_check.get(found[0]) == index:
            for number, case in enumerate(by_task.get(found[0], []), start=1):
                roles[len(cells)] = (case.task, "check")
                cells.append({"source": case.source(), "tags": [], "task": case.task, "role": "check",
                              "hidden": number, "points": case.points, "hint": case.hint, "module": case.module,
                              "path": str(case.path)})
    return cells, roles


def _check_results(spec: Task, numbers: List[int], cells: List[dict], results: Dict[int, dict]) -> List[CheckResult]:
    """One :class:`CheckResult` per check cell (visible ones first, in order, then hidden cases) of a task."""
    out: List[CheckResult] = []
    visible = 0
    for number in numbers:
        cell = cells[number] if number < len(cells) else {}
        entry = results.get(number) or {"outcome": "failed", "line": "not run (no result for this cell)"}
        ok = entry.get("outcome") == "passed"
        if cell.get("hidden"):
            failure = "" if ok else _hidden_line(spec.task, cell, entry)
            out.append(CheckResult(f"hidden case {cell['hidden']}", float(cell.get("points", 0)), ok, failure,
                                   int(cell["hidden"])))
            continue
        called = check_function(str(cell.get("source", "")))
        out.append(CheckResult(called or f"check {visible + 1}", spec.points_of_check(visible), ok,
                               "" if ok else str(entry.get("line") or entry.get("outcome", "failed"))))
        visible += 1
    return out


_OWN_LINES = ("timed out: the submission", "not run: ")  # the grader's words, never the learner's


def _hidden_line(task: str, cell: dict, entry: dict) -> str:
    """A failed hidden case's line: its hint, or that time ran out (which no hint should hide); never the
    learner's text or the case's values."""
    line = str(entry.get("line", ""))
    if line.startswith(_OWN_LINES):
        return f"hidden case {cell['hidden']} of task {task}: {line}"
    return hidden_cases.failure_line(task, int(cell["hidden"]), str(cell.get("hint", "")))


def score(roles: Dict[int, Tuple[str, str]], tasks: Dict[str, Task], results: Dict[int, dict],
          cells: Optional[List[dict]] = None) -> List[TaskResult]:
    """Per-task results: a task passes when its solution cell and all its check cells passed; each
    check cell's points are awarded on their own (none when the solution cell failed)."""
    cells = cells if cells is not None else [{} for _ in range(max(roles, default=-1) + 1)]
    failures: Dict[str, Tuple[str, str]] = {}
    seen: Dict[str, bool] = {}
    check_numbers: Dict[str, List[int]] = {}
    solution_failed: Dict[str, bool] = {}
    for number in sorted(roles):
        task, role = roles[number]
        entry = results.get(number)
        if entry is None:
            entry = {"outcome": "failed", "line": "not run (no result for this cell)", "detail": ""}
        seen[task] = True
        if role != ROLE_SOLUTION:
            check_numbers.setdefault(task, []).append(number)
        elif entry["outcome"] != "passed":
            solution_failed[task] = True
        if entry["outcome"] != "passed" and task not in failures:
            line = entry.get("line") or entry["outcome"]
            hidden = cells[number].get("hidden") if number < len(cells) else None
            if hidden:
                line = _hidden_line(task, cells[number], entry)
            detail = "" if hidden else entry.get("detail", "")
            failures[task] = (f"{line}" if role != ROLE_SOLUTION else f"solution cell: {line}", detail)
    out = []
    for spec in tasks.values():
        checks = _check_results(spec, check_numbers.get(spec.task, []), cells, results)
        if solution_failed.get(spec.task):
            for check in checks:
                check.passed = False
        total = spec.points + sum(c.points for c in checks if c.hidden)
        if spec.task in failures:
            line, detail = failures[spec.task]
            out.append(TaskResult(spec.task, total, False, line, detail, checks))
        elif not seen.get(spec.task):
            out.append(TaskResult(spec.task, total, False, "not run", "", checks))
        else:
            out.append(TaskResult(spec.task, total, True, "", "", checks))
    return out


def _name_errors(tasks: List[TaskResult]) -> None:
    """A failure line that is only a traceback's location (``File "<ipython-input-1-...>", line 1``) gets the
    error it located, from the last line of its detail (``SyntaxError: expected ':' (line 1)``), so a syntax
    error says so in every gradebook and report."""
    for task in tasks:
        head, _, rest = task.failure.partition('File "<')
        last = task.detail.strip().splitlines()[-1].strip() if task.detail.strip() else ""
        if rest and not head.strip(": ").replace("solution cell", "") and ("Error" in last or "Exception" in last):
            where = rest.rsplit(", ", 1)[-1] if ", line " in rest else ""
            task.failure = f"{head}{last}" + (f" ({where})" if where.startswith("line ") else "")


def grade_notebook(
    submission: Union[str, Path],
    pristine: Optional[Union[str, Path]] = None,
    cell_timeout: float = DEFAULT_TIMEOUT_S,
    workdir: Optional[Union[str, Path]] = None,
    exercise: Optional[str] = None,
    course: Optional[Union[str, Path]] = None,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    pristine_nb: Optional[NotebookNode] = None,
    cases: Optional[Union[str, Path]] = None,
) -> GradeReport:
    """Grade one submission; never raises for the learner's mistakes (they end up in the report).

    ``pristine`` is a notebook (learner version or solution) or a folder to search; by
    default the ``exercises/`` folder of the course the notebook sits in (or ``course``).
    ``exercise`` names the exercise (``NN_topic``) when the file name does not.
    ``pristine_nb``, when given, is the already loaded pristine learner version (batch
    grading loads each exercise once, before any learner code runs).
    ``hidden`` lists folders the learner's kernel must not see. ``cases`` is the folder of
    hidden cases (default: the course's ``exercises/hidden/`` when it has one).
    """
    submission = Path(submission)
    report = GradeReport(submission=submission, exercise=exercise or submission.stem)
    try:
        sub_nb: Optional[NotebookNode] = read_submission(submission)
        load_error = ""
    except NotebookFormatError as exc:
        sub_nb, load_error = None, str(exc)
    search_hidden: List[Path] = []
    try:
        name = submission_exercise(submission, sub_nb, exercise)
        report.exercise = name
        if pristine_nb is None:
            source = _pristine_source(submission, name, pristine, course)
            pristine_nb = load_pristine(source)
            search_hidden = [source.parent, source.parent / "solutions"]
        found_cases = hidden_cases.cases_for(name, cases, submission, course)
    except (PristineNotFoundError, NotebookFormatError, ExerciseSpecError, InputError,
            hidden_cases.HiddenCaseError) as exc:
        report.error = load_error or f"cannot grade: {exc}"
        return report
    tasks = find_tasks(pristine_nb)

    def total(task: Task) -> float:  # a task's points under official grading: visible and hidden
        return task.points + sum(c.points for c in found_cases if c.task == task.task)

    if sub_nb is None:
        report.error = load_error
        reason = load_error.split(": ", 1)[1] if load_error.startswith(f"{submission}: ") else load_error
        report.tasks = [TaskResult(t.task, total(t), False, reason) for t in tasks.values()]
        return report
    spliced, report.notes, used = splice_cells(pristine_nb, sub_nb)
    report.notes.extend(ungraded_code(pristine_nb, sub_nb, used))
    if not found_cases and "hidden case" in "".join(str(c.get("source", "")) for c in pristine_nb.cells[:1]):
        report.notes.append("the points this notebook's header gives to hidden cases are not graded here: only the "
                            "instructor's grading has the hidden cases, so this total counts the visible checks")
    cells, roles = prepare_for_run(spliced, found_cases)
    hide = [*hidden, *search_hidden, *{c.path.parent for c in found_cases}, submission.resolve().parent,
            Path(tempfile.gettempdir())]
    try:
        if course is not None or pristine is None:
            hide.append(find_course(submission, Path(course) if course else None) / "exercises")
    except (PristineNotFoundError, InputError):
        pass
    try:
        if workdir is not None:
            results, isolation = run_judge(cells, Path(workdir), cell_timeout, sandbox_mode, hide)
        else:
            with tempfile.TemporaryDirectory(prefix="paged-kv-grade-") as tmp:
                results, isolation = run_judge(cells, Path(tmp) / "work", cell_timeout, sandbox_mode, hide)
    except (GradingError, sandbox.SandboxUnavailableError) as exc:
        report.error = str(exc)
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else "the grader failed"
        report.tasks = [TaskResult(t.task, total(t), False, f"not graded: {line}") for t in tasks.values()]
        return report
    if isolation:
        report.notes.insert(0, isolation)
    report.tasks = score(roles, tasks, results, cells)
    _name_errors(report.tasks)
    lines = delegation_lines({t.task: (spliced.cells[t.solution_cell].get("source", ""),
                                       pristine_nb.cells[t.solution_cell].get("source", "")) for t in tasks.values()})
    for result in report.tasks:
        if result.task in lines:  # the library's answer, imported or pasted: 0 on this task, one line why
            result.passed, result.failure, result.detail = False, lines[result.task], ""
            for check in result.checks:
                check.passed = False
    for t in tasks.values():
        base = built_on(t.task, spliced.cells[t.solution_cell].get("source", ""),
                        pristine_nb.cells[t.solution_cell].get("source", ""))
        if base:
            report.notes.append(base)
    other = [
        f"cell {n} (not a task) failed: {entry.get('line', '')}"
        for n, entry in sorted(results.items()) if n not in roles and entry.get("outcome") == "failed"
    ]
    report.notes.extend(other)
    return report
