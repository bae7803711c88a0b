"""Grade one submitted exercise notebook: splice, run the learner's cells, judge each check outside.

Only the learner's *solution cells* count. They are spliced into a pristine learner
version of the exercise (so deleted or edited check cells come back as they were). The
judge (:mod:`.judge`, a process of its own) runs the spliced cells in the learner's
kernel (:mod:`.runner`, inside a bubblewrap sandbox where the system has one) and runs
each check cell's check function itself, with proxies for the learner's objects: the
verdict never depends on what the learner's kernel prints or writes. A task passes when
its solution cell ran and every one of its checks passed.

Splicing matches cells by their ``paged_kv`` task metadata. When a learner lost that
metadata (say, by pasting their code into a new cell), a code cell without task metadata
is taken instead if it defines the same top-level functions or classes as the task's
scaffold (ties broken by source similarity, then by position). Code the grader does not
run (outside solution cells) is named in the report's notes.

The course is found from the notebook's own path (the nearest folder above it with
``exercises/``), or given with ``--course``; exercise names must be ``NN_topic``.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from nbformat import NotebookNode

from . import sandbox, scan
from ._common import DEFAULT_CELL_TIMEOUT_S
from .delegation import kernel_stubbed_modules
from .generate import make_learner_version
from .notebook_tasks import (
    BEGIN_MARKER,
    META_KEY,
    ROLE_CHECK,
    ROLE_SOLUTION,
    ExerciseSpecError,
    NotebookFormatError,
    Task,
    cell_task,
    find_tasks,
    read_notebook,
)

KERNEL_STARTUP_TIMEOUT_S = 120.0
EXERCISE_NAME = re.compile(r"^\d{2}_[A-Za-z0-9][A-Za-z0-9_]*$")
_NN_PREFIX = re.compile(r"^(\d{2})_")


class GradingError(RuntimeError):
    """The grader itself could not run a notebook (not the learner's failure)."""


class PristineNotFoundError(FileNotFoundError):
    """No pristine exercise notebook matches a submission."""


class InputError(ValueError):
    """A bad input to the grader (an exercise name, an option): one line, exit status 2."""


@dataclass
class TaskResult:
    """The outcome of one task: its points, whether it passed, and why not."""

    task: str
    points: float
    passed: bool
    failure: str = ""
    detail: str = ""

    @property
    def earned(self) -> float:
        return self.points if self.passed else 0


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
# Finding the pristine learner version


def is_solution_notebook(nb: NotebookNode) -> bool:
    """Whether a notebook still holds solution regions (then it is a source, not a learner version)."""
    return any(
        cell_task(cell) is not None and BEGIN_MARKER in cell.get("source", "") for cell in nb.cells
    )


def load_pristine(path: Union[str, Path]) -> NotebookNode:
    """A pristine learner version from a learner-version file or a solution notebook (generated in memory)."""
    path = Path(path)
    nb = read_notebook(path)
    return make_learner_version(nb, path.name) if is_solution_notebook(nb) else nb


def exercise_name(path: Path, nb: Optional[NotebookNode] = None) -> str:
    """The exercise a notebook is: its ``NN_topic`` name, from the notebook's metadata or the file name."""
    meta = (nb.metadata.get(META_KEY) if nb is not None else None) or {}
    if isinstance(meta, dict) and isinstance(meta.get("exercise"), str) and EXERCISE_NAME.match(meta["exercise"]):
        return meta["exercise"]
    return path.stem


def check_exercise_name(name: str) -> str:
    """``name`` when it is an exercise name ``NN_topic`` (letters, digits, underscores); else :class:`InputError`."""
    if not isinstance(name, str) or not EXERCISE_NAME.match(name):
        raise InputError(f"{name!r} is not an exercise name: expected NN_topic (two digits, an underscore, "
                         "then letters, digits or underscores)")
    return name


def find_course(notebook: Optional[Path] = None, course: Optional[Path] = None) -> Path:
    """The course folder: ``course`` when given, else the nearest folder above the notebook (then above
    the current folder) that holds ``exercises/solutions/`` (or, in a released course, ``exercises/``)."""
    if course is not None:
        if not (course / "exercises").is_dir():
            raise InputError(f"--course {course}: no exercises/ folder in it")
        return course.resolve()
    starts = ([notebook.resolve().parent] if notebook is not None else []) + [Path.cwd().resolve()]
    for want in ("exercises/solutions", "exercises"):
        for start in starts:
            for folder in [start, *start.parents]:
                if (folder / want).is_dir():
                    return folder
    where = f" above {notebook}" if notebook is not None else ""
    raise PristineNotFoundError(
        f"cannot find the course: no exercises/ folder{where} or above the current folder; "
        "pass --course DIR (the course folder) or --pristine PATH"
    )


def find_pristine(name: str, search: Sequence[Path], submission: Optional[Path] = None) -> Path:
    """The file to take the pristine exercise ``name`` (``NN_topic``) from.

    Each folder in ``search`` is tried for ``solutions/NAME.ipynb``, then ``pristine/NAME.ipynb``
    (a released course's untouched copies), then ``NAME.ipynb``,
    then any ``NN_*.ipynb`` with the same number; a candidate must lie inside the folder
    searched, and the submission itself never counts (in the course repository learners
    edit ``exercises/NN_topic.ipynb`` in place, so the pristine version is generated from
    ``exercises/solutions/``).
    """
    check_exercise_name(name)
    patterns = [f"{name}.ipynb", f"{name[:2]}_*.ipynb"]
    for pattern in patterns:
        for folder in search:
            root = folder.resolve()
            for sub in (folder / "solutions", folder / "pristine", folder):
                for candidate in sorted(sub.glob(pattern)):
                    inside = _inside(candidate, root)
                    if inside and candidate.is_file() and not _same_file(candidate, submission):
                        return candidate
    places = ", ".join(str(p) for p in search) or "(nowhere)"
    only_itself = submission is not None and any(
        _same_file(c, submission) for folder in search for c in folder.glob(f"{name}.ipynb"))
    if only_itself:
        raise PristineNotFoundError(
            f"no untouched copy of {name!r} to grade against: {places} holds only the notebook being graded, and "
            "neither solutions/ nor pristine/ (a course made by `paged-kv release` has exercises/pristine/); pass "
            f"--pristine with an untouched copy, e.g. from git: git show HEAD:exercises/{name}.ipynb > /tmp/{name}.ipynb"
        )
    raise PristineNotFoundError(
        f"no exercise named {name!r} in {places}; pass --pristine with the exercise's notebook "
        "(a learner version or its solution) or the folder that holds it"
    )


def default_search(notebook: Optional[Path] = None, course: Optional[Path] = None) -> List[Path]:
    """Where the course keeps its exercises: found from the notebook's own path (or ``--course``)."""
    return [find_course(notebook, course) / "exercises"]


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except (ValueError, OSError):
        return False


def _same_file(a: Path, b: Optional[Path]) -> bool:
    try:
        return b is not None and a.resolve() == b.resolve()
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# Splicing


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


# ---------------------------------------------------------------------------------------
# Running


def prepare_for_run(nb: NotebookNode) -> Tuple[List[dict], Dict[int, Tuple[str, str]]]:
    """The code cells to run, as the judge takes them, and a map: code-cell number -> (task, role)."""
    cells: List[dict] = []
    roles: Dict[int, Tuple[str, str]] = {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        found = cell_task(cell)
        if found is not None:
            roles[len(cells)] = found
        cells.append({
            "source": cell.get("source", ""), "tags": list(cell.get("metadata", {}).get("tags", [])),
            "task": found[0] if found else None, "role": found[1] if found else None,
        })
    return cells, roles


def run_judge(
    cells: List[dict],
    workdir: Path,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    exercise: str = "",
    forbidden: Sequence[str] = (),
) -> Tuple[Dict[int, dict], str]:
    """Run the judge (:mod:`.judge`) in its own bounded process; per-cell results by code-cell number, and
    the note on isolation and limits.

    The judge tells this process when each cell starts; a cell that outlives its limit (a check stuck
    in a C call, say) gets the judge killed: that cell fails with one line, the later ones are not run.
    A judge that crashes or is killed is one line too, never a traceback."""
    resolved = sandbox.resolve_mode(sandbox_mode)
    note = "" if resolved == "bwrap" else sandbox.NOT_ISOLATED.format(
        reason="--sandbox none" if sandbox_mode == "none" else sandbox.bwrap_problem())
    workdir.mkdir(parents=True, exist_ok=True)
    job = {
        "cells": cells, "timeout": cell_timeout, "workdir": str(workdir), "resolved_mode": resolved,
        "hidden": [str(h) for h in hidden], "exercise": exercise, "forbidden": list(forbidden),
        "cpu_seconds": int(KERNEL_STARTUP_TIMEOUT_S + len(cells) * (cell_timeout + 5)),
    }
    budget = KERNEL_STARTUP_TIMEOUT_S + 30 + len(cells) * (cell_timeout + 15)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if env.get("PYTHONPATH"):  # the kernel runs in workdir: relative entries would point elsewhere
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep) if entry
        )
    with tempfile.TemporaryFile() as job_file:
        job_file.write(json.dumps(job).encode())
        job_file.seek(0)
        process = subprocess.Popen(
            [sys.executable, "-m", "paged_kv_lib.grading.judge"], stdin=job_file, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=str(workdir.parent),
            preexec_fn=_judge_limits(int(budget)),
        )
    try:
        events = _watch(process, time.monotonic() + budget)
    finally:
        _kill_group(process)
        process.wait()
    results: Dict[int, dict] = {}
    done: Optional[dict] = None
    stopped = ""
    for event in events:
        if "result" in event:
            results[int(event["result"]["index"])] = event["result"]
        elif "done" in event:
            done = event["done"]
        elif "stopped" in event:
            stopped = str(event["stopped"])
    if done is None:
        why = stopped or _exit_reason(process.returncode)
        if not results and not any(e.get("cell", -1) >= 0 for e in events if "cell" in e):
            raise GradingError(f"the judge stopped before the first cell: {why}")
        started = [int(e["cell"]) for e in events if "cell" in e]
        current = started[-1] if started else -1
        for index in range(len(cells)):
            if index not in results:
                line = why if index == current else f"not run: the judge was stopped at an earlier cell ({why})"
                results[index] = {"index": index, "outcome": "failed", "line": line, "detail": ""}
        return results, note
    if done.get("error"):
        raise GradingError(str(done["error"]).strip().splitlines()[0])
    applied = str(done.get("limits", ""))
    if applied:
        note = f"{note}; {applied}" if note else f"the learner's kernel: {applied}"
    return {int(entry["index"]): entry for entry in done.get("results", [])}, note


JUDGE_MEMORY_BYTES = 6 * 1024 ** 3


def _judge_limits(cpu_seconds: int) -> Callable[[], None]:
    """The judge's own bounds: address space and CPU time (its replies are bounded before decoding)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_BYTES, JUDGE_MEMORY_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _watch(process: "subprocess.Popen[bytes]", overall: float) -> List[dict]:
    """The judge's events, read as they come; kills it when the cell it runs (or the whole job) is late."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    events: List[dict] = []
    buffer = b""
    deadline = overall
    while True:
        remaining = min(deadline, overall) - time.monotonic()
        if remaining <= 0:
            events.append({"stopped": f"timed out: the grader stopped the judge after this ran past its limit "
                                      f"({'the whole notebook' if deadline >= overall else 'a check or a reply that would not end'})"})
            return events
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return events
        buffer += chunk
        if len(buffer) > 64 * 1024 * 1024:
            events.append({"stopped": "the judge wrote more than the grader reads"})
            return events
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if type(event) is not dict:
                continue
            events.append(event)
            if "cell" in event:
                deadline = time.monotonic() + float(event.get("limit", 60))
            elif "result" in event:
                deadline = overall
            elif "done" in event:
                return events


def _exit_reason(code: Optional[int]) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        hint = " (out of memory or CPU time?)" if -code in (signal.SIGKILL, signal.SIGXCPU, signal.SIGSEGV) else ""
        return f"the judge was killed by {name}{hint}"
    return f"the judge stopped with exit status {code} before it finished"


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the judge and whatever it started in its session (the sandbox dies with it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def score(roles: Dict[int, Tuple[str, str]], tasks: Dict[str, Task], results: Dict[int, dict]) -> List[TaskResult]:
    """Per-task results: a task passes when its solution cell and all its check cells passed."""
    failures: Dict[str, Tuple[str, str]] = {}
    seen: Dict[str, bool] = {}
    for number in sorted(roles):
        task, role = roles[number]
        entry = results.get(number)
        if entry is None:
            entry = {"outcome": "failed", "line": "not run (no result for this cell)", "detail": ""}
        seen[task] = True
        if entry["outcome"] != "passed" and task not in failures:
            where = "solution cell" if role == ROLE_SOLUTION else "check"
            line = entry.get("line") or entry["outcome"]
            failures[task] = (f"{line}" if role == ROLE_CHECK else f"{where}: {line}", entry.get("detail", ""))
    out = []
    for spec in tasks.values():
        if spec.task in failures:
            line, detail = failures[spec.task]
            out.append(TaskResult(spec.task, spec.points, False, line, detail))
        elif not seen.get(spec.task):
            out.append(TaskResult(spec.task, spec.points, False, "not run", ""))
        else:
            out.append(TaskResult(spec.task, spec.points, True))
    return out


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


def submission_exercise(submission: Path, sub_nb: Optional[NotebookNode], exercise: Optional[str] = None) -> str:
    """The exercise a submission is graded as; refuses names that are not ``NN_topic`` and a notebook
    of another exercise saved under this one's name (:class:`InputError`)."""
    name = exercise or submission.stem.split("__", 1)[-1]
    if not EXERCISE_NAME.match(name) and sub_nb is not None and exercise is None:
        name = exercise_name(submission, sub_nb)
    check_exercise_name(name)
    if sub_nb is not None:
        meta = sub_nb.metadata.get(META_KEY)
        claimed = meta.get("exercise") if isinstance(meta, dict) else None
        numbers = sorted({task.split(".")[0] for task in find_tasks_lenient(sub_nb)})
        if isinstance(claimed, str) and EXERCISE_NAME.match(claimed) and claimed != name:
            raise InputError(f"{submission} is a notebook of exercise {claimed}, saved under the name {name}; "
                             f"grade it as {claimed}")
        if numbers and numbers != [name[:2]]:
            raise InputError(f"{submission} holds tasks of exercise {', '.join(numbers)}, saved under the name "
                             f"{name}; grade it under its own exercise's name")
    return name


def find_tasks_lenient(nb: NotebookNode) -> List[str]:
    """Task ids named by a notebook's metadata, without validating the notebook."""
    out = []
    for cell in nb.cells:
        found = cell_task(cell)
        if found is not None:
            out.append(found[0])
    return out


def grade_notebook(
    submission: Union[str, Path],
    pristine: Optional[Union[str, Path]] = None,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
    workdir: Optional[Union[str, Path]] = None,
    exercise: Optional[str] = None,
    course: Optional[Union[str, Path]] = None,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    pristine_nb: Optional[NotebookNode] = None,
) -> GradeReport:
    """Grade one submission; never raises for the learner's mistakes (they end up in the report).

    ``pristine`` is a notebook (learner version or solution) or a folder to search; by
    default the ``exercises/`` folder of the course the notebook sits in (or ``course``).
    ``exercise`` names the exercise (``NN_topic``) when the file name does not.
    ``pristine_nb``, when given, is the already loaded pristine learner version (batch
    grading loads each exercise once, before any learner code runs).
    """
    submission = Path(submission)
    report = GradeReport(submission=submission, exercise=exercise or submission.stem)
    try:
        sub_nb: Optional[NotebookNode] = read_notebook(submission)
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
    except (PristineNotFoundError, NotebookFormatError, ExerciseSpecError, InputError) as exc:
        report.error = load_error or f"cannot grade: {exc}"
        return report
    tasks = find_tasks(pristine_nb)
    if sub_nb is None:
        report.error = load_error
        reason = load_error.split(": ", 1)[1] if load_error.startswith(f"{submission}: ") else load_error
        report.tasks = [TaskResult(t.task, t.points, False, reason) for t in tasks.values()]
        return report
    spliced, report.notes, used = splice_cells(pristine_nb, sub_nb)
    report.notes.extend(ungraded_code(pristine_nb, sub_nb, used))
    cells, roles = prepare_for_run(spliced)
    hide = [*hidden, *search_hidden, submission.resolve().parent, Path(tempfile.gettempdir())]
    try:
        if course is not None or pristine is None:
            hide.append(find_course(submission, Path(course) if course else None) / "exercises")
    except (PristineNotFoundError, InputError):
        pass
    forbidden = kernel_stubbed_modules(name)  # stubs in the kernel; the scan still refuses all of FORBIDDEN
    try:
        if workdir is not None:
            results, isolation = run_judge(cells, Path(workdir), cell_timeout, sandbox_mode, hide, name[:2], forbidden)
        else:
            with tempfile.TemporaryDirectory(prefix="paged-kv-grade-") as tmp:
                results, isolation = run_judge(cells, Path(tmp) / "work", cell_timeout, sandbox_mode, hide,
                                               name[:2], forbidden)
    except (GradingError, sandbox.SandboxUnavailableError) as exc:
        report.error = str(exc)
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else "the grader failed"
        report.tasks = [TaskResult(t.task, t.points, False, f"not graded: {line}") for t in tasks.values()]
        return report
    if isolation:
        report.notes.insert(0, isolation)
    report.tasks = score(roles, tasks, results)
    report.tasks = scan.zero_reported(report.tasks, scan.delegation_lines(name, {t.task: spliced.cells[t.solution_cell].get("source", "") for t in tasks.values()}))  # noqa: E501 - solutions reaching for forbidden library code earn 0
    other = [
        f"cell {n} (not a task) failed: {entry.get('line', '')}"
        for n, entry in sorted(results.items()) if n not in roles and entry.get("outcome") == "failed"
    ]
    report.notes.extend(other)
    return report


def _pristine_source(
    submission: Path, name: str, pristine: Optional[Union[str, Path]], course: Optional[Union[str, Path]] = None
) -> Path:
    if pristine is not None and Path(pristine).is_file():
        return Path(pristine)
    if pristine is not None and not Path(pristine).exists():
        raise PristineNotFoundError(f"--pristine {pristine}: no such file or folder")
    search = [Path(pristine)] if pristine is not None else default_search(
        submission, Path(course) if course is not None else None)
    return find_pristine(name, search, submission)
