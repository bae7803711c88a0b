"""Grade a whole class: every submitted notebook of a folder, in parallel, into one gradebook CSV.

Two layouts are understood, and may be mixed in one folder:

- one sub-folder per learner: ``FOLDER/<learner>/NN_topic.ipynb`` (nested folders too);
- learner and exercise in the file name: ``FOLDER/<learner>__NN_topic.ipynb``.

Each submission is graded by :func:`.grader.grade_notebook` with its own judge process,
kernel and sandbox, so an invalid file, an endless loop or a crashed kernel costs only
that learner's rows. Every exercise's pristine copy is loaded before any learner code
runs, and the gradebook is written atomically, with learner text escaped for spreadsheets.
"""

from __future__ import annotations

import csv
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .grader import DEFAULT_CELL_TIMEOUT_S, GradeReport, grade_notebook

GRADEBOOK_COLUMNS = ("learner", "notebook", "task", "points", "passed", "earned", "failure", "path", "flag")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SEPARATOR = "__"


@dataclass(frozen=True)
class Submission:
    """One learner's notebook for one exercise."""

    learner: str
    exercise: str
    path: Path


@dataclass
class BatchResult:
    """A submission and its grade."""

    submission: Submission
    report: GradeReport


def _skip(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(part.startswith(".") or part == "__pycache__" for part in parts)


def find_submissions(folder: Union[str, Path]) -> Tuple[List[Submission], List[str]]:
    """Submissions under ``folder`` in both layouts, sorted; plus warnings about files skipped."""
    folder = Path(folder)
    found: List[Submission] = []
    warnings: List[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            for path in sorted(entry.rglob("*.ipynb")):
                if not _skip(path, folder) and path.is_file():
                    found.append(Submission(entry.name, path.stem, path))
        elif entry.suffix == ".ipynb":
            if SEPARATOR in entry.stem:
                learner, exercise = entry.stem.split(SEPARATOR, 1)
                found.append(Submission(learner, exercise, entry))
            else:
                warnings.append(
                    f"skipped {entry.name}: name it <learner>{SEPARATOR}NN_topic.ipynb "
                    "or put it in a folder named after the learner"
                )
    found.sort(key=lambda s: (s.learner, s.exercise, str(s.path)))
    return found, warnings


def grade_submission(
    submission: Submission,
    pristine: Optional[Union[str, Path]],
    cell_timeout: float,
    course: Optional[Path] = None,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    pristines: Optional[Dict[str, Any]] = None,
    cases: Optional[Path] = None,
) -> GradeReport:
    """Grade one submission; whatever goes wrong becomes that submission's report, never an exception."""
    try:
        loaded = (pristines or {}).get(submission.exercise)
        return grade_notebook(submission.path, pristine=pristine, cell_timeout=cell_timeout,
                              exercise=submission.exercise, course=course, sandbox_mode=sandbox_mode,
                              hidden=hidden, pristine_nb=loaded, cases=cases)
    except Exception as exc:  # noqa: BLE001 - one broken submission must never stop the class's run
        return GradeReport(submission=submission.path, exercise=submission.exercise, error=f"grader failed: {exc}")


def load_pristines(
    submissions: Sequence[Submission], pristine: Optional[Union[str, Path]], course: Optional[Path]
) -> Dict[str, Any]:
    """Every exercise's pristine learner version, loaded once before any learner code runs, so that no
    submission can change what the later ones are graded against."""
    from .grader import InputError, PristineNotFoundError, _pristine_source, check_exercise_name, load_pristine
    from .notebook_tasks import ExerciseSpecError, NotebookFormatError

    loaded: Dict[str, Any] = {}
    for sub in submissions:
        if sub.exercise in loaded:
            continue
        try:
            check_exercise_name(sub.exercise)
            loaded[sub.exercise] = load_pristine(_pristine_source(sub.path, sub.exercise, pristine, course))
        except (InputError, PristineNotFoundError, NotebookFormatError, ExerciseSpecError):
            loaded[sub.exercise] = None  # graded one by one: the report says what is wrong
    return loaded


def grade_batch(
    submissions: Sequence[Submission],
    pristine: Optional[Union[str, Path]] = None,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
    jobs: Optional[int] = None,
    progress: bool = True,
    course: Optional[Path] = None,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    cases: Optional[Path] = None,
) -> List[BatchResult]:
    """Grade submissions, ``jobs`` at a time (default: the number of cores), with a progress bar; ``cases`` is
    the folder of hidden cases (default: the course's ``exercises/hidden/``)."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    if course is None and pristine is None and submissions:
        try:
            from .grader import find_course

            course = find_course(None)
        except FileNotFoundError:
            course = None
    pristines = load_pristines(submissions, pristine, course)
    hide = list(hidden) + [s.path.resolve().parent for s in submissions]
    watch = _watched(course, pristine)  # with the sandbox on too: a grade is flagged whatever changed the files
    baseline = fingerprint(watch)
    changed_after = ""
    results: List[BatchResult] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(submissions), desc="grading", unit="notebook")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(grade_submission, s, pristine, cell_timeout, course, sandbox_mode, hide, pristines, cases): s
            for s in submissions
        }
        for future in as_completed(futures):
            report = future.result()
            if watch and not changed_after and fingerprint(watch) != baseline:
                changed_after = str(futures[future].path)
            if changed_after:  # something rewrote the course during the batch: later grades are suspect
                report.notes.append(f"{TAMPERED} (noticed after grading {changed_after})")
            results.append(BatchResult(futures[future], report))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    results.sort(key=lambda r: (r.submission.learner, r.submission.exercise, str(r.submission.path)))
    return results


TAMPERED = "the library or the exercises changed on disk during this batch; grades from then on cannot be trusted"


def _watched(course: Optional[Path], pristine: Optional[Union[str, Path]]) -> List[Path]:
    """What a submission could rewrite to fool the grades of the ones after it (the sandbox shows the kernel
    none of it writable; the batch checks anyway, so a hole in the sandbox shows in the gradebook)."""
    from .sandbox import package_folders

    folders = package_folders()
    if course is not None:
        folders.append(Path(course) / "exercises")
    if pristine is not None:
        folders.append(Path(pristine))
    return folders


def fingerprint(paths: Sequence[Path]) -> str:
    """A digest of the files under ``paths`` (names, sizes, modification times and contents of .py
    and .ipynb files)."""
    import hashlib

    digest = hashlib.sha256()
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in (".py", ".ipynb"))
        for path in files:
            try:
                digest.update(str(path).encode() + path.read_bytes())
            except OSError:
                digest.update(str(path).encode() + b"?")
    return digest.hexdigest()


def escape_cell(value: Any) -> Any:
    """A gradebook cell safe to open in a spreadsheet: text starting with = + - @ gets a leading quote."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def duplicates(results: Iterable[BatchResult]) -> Dict[Tuple[str, str], int]:
    """(learner, exercise) pairs with more than one submission, and how many."""
    counts: Dict[Tuple[str, str], int] = {}
    for result in results:
        key = (result.submission.learner, result.report.exercise or result.submission.exercise)
        counts[key] = counts.get(key, 0) + 1
    return {k: n for k, n in counts.items() if n > 1}


def gradebook_rows(results: Iterable[BatchResult]) -> List[dict]:
    """One row per learner, notebook and task; a submission with no tasks to show gets one row.
    Learner-controlled text is escaped against spreadsheet formulas (:func:`escape_cell`)."""
    results = list(results)
    doubled = duplicates(results)
    rows = []
    for result in results:
        sub, report = result.submission, result.report
        exercise = report.exercise or sub.exercise
        count = doubled.get((sub.learner, exercise))
        flags = [f"{count} submissions of {exercise} by this learner"] if count else []
        flags += [n for n in report.notes if n.startswith(TAMPERED)]
        flag = "; ".join(flags)
        if not report.tasks:
            rows.append(dict(learner=sub.learner, notebook=exercise, task="", points=0,
                             passed=0, earned=0, failure=first_line(report.error) or "no tasks",
                             path=str(sub.path), flag=flag))
        for task in report.tasks:
            failure = "" if task.passed else (task.failure or first_line(report.error))
            rows.append(dict(
                learner=sub.learner, notebook=exercise, task=task.task,
                points=fmt_points(task.points), passed=int(task.passed),
                earned=fmt_points(task.earned), failure=failure, path=str(sub.path), flag=flag,
            ))
    return [{k: escape_cell(v) for k, v in row.items()} for row in rows]


def write_gradebook(results: Iterable[BatchResult], path: Union[str, Path]) -> List[dict]:
    """Write the gradebook CSV (columns: :data:`GRADEBOOK_COLUMNS`) atomically; return its rows."""
    rows = gradebook_rows(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", newline="", encoding="utf-8", dir=path.parent,
                                         prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            writer = csv.DictWriter(handle, fieldnames=GRADEBOOK_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return rows


def summary_table(results: Sequence[BatchResult]) -> str:
    """A plain-text table: learner, notebook, score, and the failed tasks (or the error)."""
    header = ("learner", "notebook", "score", "failed")
    lines = [header]
    for result in results:
        report = result.report
        failed = ", ".join(t.task for t in report.tasks if not t.passed)
        if report.error:
            error = first_line(report.error)
            error = error[len(f"{report.submission}: "):] if error.startswith(f"{report.submission}: ") else error
            failed = (failed + "; " if failed else "") + error
        lines.append((
            result.submission.learner, report.exercise or result.submission.exercise,
            f"{fmt_points(report.earned)}/{fmt_points(report.points)}", failed or "-",
        ))
    widths = [max(len(str(row[i])) for row in lines) for i in range(3)]
    out = []
    for row in lines:
        cells = [str(row[i]).ljust(widths[i]) for i in range(3)] + [str(row[3])]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def fmt_points(value: float) -> Union[int, float]:
    """Points as an int when whole (2, not 2.0)."""
    return int(value) if float(value).is_integer() else round(float(value), 3)


def first_line(text: str) -> str:
    """The first non-blank line of a message."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
