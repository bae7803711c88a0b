"""Grade one submitted exercise notebook: splice, run under nbval, score per task.

Only the learner's *solution cells* count. They are spliced into a pristine learner
version of the exercise (so deleted or edited check cells come back as they were), the
result runs in a fresh kernel under ``pytest --nbval`` with a per-cell timeout in a
temporary folder, and a small pytest plugin (:mod:`.nbval_report`) reports each cell.
A task passes when its solution cell and every one of its check cells pass.

Splicing matches cells by their ``paged_kv`` task metadata. When a learner lost that
metadata (say, by pasting their code into a new cell), a code cell without task metadata
is taken instead if it defines the same top-level functions or classes as the task's
scaffold (ties broken by source similarity, then by position).
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from nbformat import NotebookNode

from ._common import DEFAULT_CELL_TIMEOUT_S
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
    notebook_to_text,
    read_notebook,
)

KERNEL_STARTUP_TIMEOUT_S = 120.0
COURSE_ROOT = Path(__file__).resolve().parents[2]
_PLUGIN_SOURCE = Path(__file__).with_name("nbval_report.py")
_NN_PREFIX = re.compile(r"^(\d{2})_")
_NBVAL_IGNORE_OUTPUT = "nbval-ignore-output"


class GradingError(RuntimeError):
    """The grader itself could not run a notebook (not the learner's failure)."""


class PristineNotFoundError(FileNotFoundError):
    """No pristine exercise notebook matches a submission."""


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
    """The exercise a notebook is: its ``NN_topic`` name, from the file name or the notebook's metadata."""
    meta = (nb.metadata.get(META_KEY) if nb is not None else None) or {}
    if isinstance(meta, dict) and isinstance(meta.get("exercise"), str):
        return meta["exercise"]
    return path.stem


def find_pristine(name: str, search: Sequence[Path], submission: Optional[Path] = None) -> Path:
    """The file to take the pristine exercise ``name`` (``NN_topic``) from.

    Each folder in ``search`` is tried for ``solutions/NAME.ipynb``, then ``NAME.ipynb``,
    then any ``NN_*.ipynb`` with the same number; the submission itself never counts
    (in the course repository learners edit ``exercises/NN_topic.ipynb`` in place, so the
    default search generates the pristine version from ``exercises/solutions/``).
    """
    match = _NN_PREFIX.match(name)
    patterns = [f"{name}.ipynb"] + ([f"{match.group(1)}_*.ipynb"] if match else [])
    for pattern in patterns:
        for folder in search:
            for sub in (folder / "solutions", folder):
                for candidate in sorted(sub.glob(pattern)):
                    if candidate.is_file() and not _same_file(candidate, submission):
                        return candidate
    places = ", ".join(str(p) for p in search) or "(nowhere)"
    raise PristineNotFoundError(
        f"no exercise named {name!r} in {places}; pass --pristine with the exercise's notebook "
        "(a learner version or its solution) or the folder that holds it"
    )


def default_search() -> List[Path]:
    """Where the installed course keeps its exercises (next to the package, in a source checkout)."""
    folder = COURSE_ROOT / "exercises"
    return [folder] if folder.is_dir() else []


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
        index = _match_by_content(task, pristine, submission, used, pristine_sources)
        if index is None:
            notes.append(f"task {task.task}: no solution cell found in the submission (its task metadata is gone)")
            continue
        used.add(index)
        by_task[task.task] = index
        notes.append(f"task {task.task}: solution cell had no task metadata; matched cell {index} by its definitions")
    for task in tasks.values():
        if task.task in by_task:
            result.cells[task.solution_cell].source = submission.cells[by_task[task.task]].get("source", "")
    extra = sorted(set(t for t in by_task) - set(tasks))
    if extra:
        notes.append(f"ignored solution cells for tasks not in this exercise: {', '.join(extra)}")
    return result, notes


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


def prepare_for_run(nb: NotebookNode) -> Tuple[NotebookNode, Dict[int, Tuple[str, str]]]:
    """A copy for grading and a map: nbval cell number -> (task, role).

    Outputs are not compared (``nbval-ignore-output`` on every code cell): a check passes
    on its ``PASSED`` line (see :mod:`.nbval_report`), so a learner's debugging prints do
    not fail it. The pristine cells' own tags (``raises-exception``, ``nbval-skip``) stay.
    """
    nb = copy.deepcopy(nb)
    roles: Dict[int, Tuple[str, str]] = {}
    code_index = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        tags = list(cell.metadata.get("tags", []))
        if _NBVAL_IGNORE_OUTPUT not in tags:
            tags.append(_NBVAL_IGNORE_OUTPUT)
        cell.metadata["tags"] = tags
        found = cell_task(cell)
        if found is not None:
            roles[code_index] = found
        code_index += 1
    return nb, roles


def run_nbval(
    nb: NotebookNode, workdir: Path, cell_timeout: float = DEFAULT_CELL_TIMEOUT_S, name: str = "submission.ipynb"
) -> Dict[int, dict]:
    """Run a notebook under ``pytest --nbval`` in ``workdir``; return per-cell results by nbval cell number."""
    workdir.mkdir(parents=True, exist_ok=True)
    notebook = workdir / name
    notebook.write_text(notebook_to_text(nb), encoding="utf-8")
    (workdir / "conftest.py").write_text(_PLUGIN_SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
    (workdir / "pytest.ini").write_text("[pytest]\naddopts =\n", encoding="utf-8")
    report = workdir / "report.json"
    command = [
        sys.executable, "-m", "pytest", str(notebook), "-q", "-rN", "--color=no",
        "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
        "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:timeout",
        "--nbval", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout:g}",
        f"--nbval-kernel-startup-timeout={KERNEL_STARTUP_TIMEOUT_S:g}",
        f"--paged-kv-report={report}",
    ]
    n_code = sum(1 for c in nb.cells if c.get("cell_type") == "code")
    budget = KERNEL_STARTUP_TIMEOUT_S + 30 + n_code * (cell_timeout + 10)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if env.get("PYTHONPATH"):  # the kernel runs in workdir: relative entries would point elsewhere
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep) if entry
        )
    process = subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=budget)
        killed = False
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        killed = True
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if data is None or (not data.get("cells") and process.returncode not in (0, 1)):
        tail = "\n".join((output or "").strip().splitlines()[-15:])
        raise GradingError(f"pytest --nbval did not run the notebook (exit {process.returncode}):\n{tail}")
    if data.get("collect_errors") and not data.get("cells"):
        raise GradingError("nbval could not collect the notebook:\n" + "\n".join(data["collect_errors"]))
    results = {int(entry["cell"]): entry for entry in data["cells"]}
    if killed:
        for number in range(n_code):
            results.setdefault(number, {
                "cell": number, "outcome": "failed", "kind": "killed",
                "line": f"not run: grading stopped after {budget:g} s", "detail": "",
            })
    return results


def _kill_group(process: subprocess.Popen) -> None:
    """Kill pytest and whatever it started in its session (POSIX); just pytest elsewhere."""
    killpg = getattr(os, "killpg", None)
    try:
        if killpg is None:
            raise ProcessLookupError
        killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


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
    for task in tasks.values():
        if task.task in failures:
            line, detail = failures[task.task]
            out.append(TaskResult(task.task, task.points, False, line, detail))
        elif not seen.get(task.task):
            out.append(TaskResult(task.task, task.points, False, "not run", ""))
        else:
            out.append(TaskResult(task.task, task.points, True))
    return out


def grade_notebook(
    submission: Union[str, Path],
    pristine: Optional[Union[str, Path]] = None,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
    workdir: Optional[Union[str, Path]] = None,
    exercise: Optional[str] = None,
) -> GradeReport:
    """Grade one submission; never raises for the learner's mistakes (they end up in the report).

    ``pristine`` is a notebook (learner version or solution) or a folder to search; by
    default the course's ``exercises/`` folder next to the installed package is used.
    ``exercise`` names the exercise (``NN_topic``) when the file name does not.
    """
    submission = Path(submission)
    report = GradeReport(submission=submission, exercise=exercise or submission.stem)
    try:
        sub_nb: Optional[NotebookNode] = read_notebook(submission)
        load_error = ""
    except NotebookFormatError as exc:
        sub_nb, load_error = None, str(exc)
    try:
        source = _pristine_source(submission, sub_nb, pristine, exercise)
        pristine_nb = load_pristine(source)
    except (PristineNotFoundError, NotebookFormatError, ExerciseSpecError) as exc:
        report.error = load_error or f"cannot grade: {exc}"
        return report
    report.exercise = exercise_name(source, pristine_nb)
    tasks = find_tasks(pristine_nb)
    if sub_nb is None:
        report.error = load_error
        reason = load_error.split(": ", 1)[1] if load_error.startswith(f"{submission}: ") else load_error
        report.tasks = [TaskResult(t.task, t.points, False, reason) for t in tasks.values()]
        return report
    spliced, report.notes = splice(pristine_nb, sub_nb)
    prepared, roles = prepare_for_run(spliced)
    try:
        if workdir is not None:
            results = run_nbval(prepared, Path(workdir), cell_timeout, name=f"{report.exercise}.ipynb")
        else:
            with tempfile.TemporaryDirectory(prefix="paged-kv-grade-") as tmp:
                results = run_nbval(prepared, Path(tmp), cell_timeout, name=f"{report.exercise}.ipynb")
    except GradingError as exc:
        report.error = str(exc)
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else "the grader failed"
        report.tasks = [TaskResult(t.task, t.points, False, f"not graded: {line}") for t in tasks.values()]
        return report
    report.tasks = score(roles, tasks, results)
    other = [
        f"cell {n} (not a task) failed: {entry.get('line', '')}"
        for n, entry in sorted(results.items()) if n not in roles and entry.get("outcome") == "failed"
    ]
    report.notes.extend(other)
    return report


def _pristine_source(
    submission: Path,
    sub_nb: Optional[NotebookNode],
    pristine: Optional[Union[str, Path]],
    exercise: Optional[str] = None,
) -> Path:
    if pristine is not None and Path(pristine).is_file():
        return Path(pristine)
    search = [Path(pristine)] if pristine is not None else default_search()
    if pristine is not None and not Path(pristine).exists():
        raise PristineNotFoundError(f"--pristine {pristine}: no such file or folder")
    names = [submission.stem]
    meta_name = exercise_name(submission, sub_nb) if sub_nb is not None else submission.stem
    if meta_name not in names:
        names.insert(0, meta_name)
    if "__" in submission.stem:
        names.append(submission.stem.split("__", 1)[1])
    if exercise:
        names.insert(0, exercise)
    if sub_nb is not None:
        numbers = sorted({task.split(".")[0] for task in find_tasks(sub_nb)})
        names.extend(f"{number}_" for number in numbers if re.fullmatch(r"\d{2}", number))
    error: Optional[PristineNotFoundError] = None
    for name in names:
        try:
            return find_pristine(name, search, submission)
        except PristineNotFoundError as exc:
            error = error or exc
    assert error is not None
    raise error
