"""Grade a whole class: every submitted notebook of a folder, in parallel, into one gradebook CSV.

Two layouts are understood, and may be mixed in one folder:

- one sub-folder per learner: ``FOLDER/<learner>/NN_topic.ipynb`` (nested folders too);
- learner and exercise in the file name: ``FOLDER/<learner>__NN_topic.ipynb``.

Every learner folder is listed, one with no notebook at 0 with that reason. A batch reads nothing
but each learner's own regular files: a notebook that is a symbolic link (for example to another
learner's), a hard link, or lies in a linked folder is refused with a reason, not graded; a
notebook of another exercise saved under this one's name is refused with a line saying which it is.

Each submission is graded by :func:`.grader.grade_notebook` with its own judge process, kernel and
sandbox, under the one time limit of its whole run that the judge's process keeps: an invalid
file, an endless loop or a crashed kernel costs only that learner's rows. Every exercise's pristine
copy is loaded before any learner code runs, and the gradebook is written atomically, with learner
text escaped for spreadsheets.
"""

from __future__ import annotations

import csv
import os
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .grader import DEFAULT_TIMEOUT_S, GradeReport, TaskResult, grade_notebook, read_submission

GRADEBOOK_COLUMNS = ("learner", "notebook", "task", "points", "passed", "earned", "failure", "path", "flag")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SEPARATOR = "__"
NO_NOTEBOOK = "no notebook in this learner's folder: nothing to grade"


@dataclass(frozen=True)
class Submission:
    """One learner's notebook for one exercise."""

    learner: str
    exercise: str
    path: Path
    problem: str = ""  # why it is refused without grading ('' when it is graded)


@dataclass
class BatchResult:
    """A submission and its grade."""

    submission: Submission
    report: GradeReport


def _skip(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(part.startswith(".") or part == "__pycache__" for part in parts)


def submitted_notebooks(folder: Path) -> Tuple[List[Path], List[Path]]:
    """``(notebooks, linked folders)`` under ``folder``: every ``*.ipynb`` entry, symbolic links included
    (they are refused by :func:`own_file_problem`, by name), and the symbolically linked folders, which are
    not followed (what lies behind them is not the learner's)."""
    found: List[Path] = []
    linked: List[Path] = []
    for here, dirs, files in os.walk(folder, followlinks=False):
        base = Path(here)
        for name in list(dirs):
            if (base / name).is_symlink():
                (found if name.endswith(".ipynb") else linked).append(base / name)
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints" and not (base / d).is_symlink())
        found += [base / name for name in files if name.endswith(".ipynb")]
    return sorted(found), sorted(linked)


def own_file_problem(path: Path, root: Path) -> str:
    """Why ``path`` is not a learner's own regular file under ``root`` ('' when it is): a symbolic link
    (to another learner's notebook, or to the course's solutions), a hard link, something other than a
    file, or a file inside a linked folder. The message names no target."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc}): not graded"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link, not the learner's own file: refused, not graded"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file: refused, not graded"
    if info.st_nlink > 1:
        return "is a hard link (one more name of a file kept elsewhere), not the learner's own file: refused, not graded"
    try:
        parts = path.relative_to(root).parts[:-1]
    except ValueError:
        return "lies outside the submissions folder: refused, not graded"
    here = root
    for part in parts:
        here = here / part
        if here.is_symlink():
            return f"lies in {part}/, a symbolic link to another folder: refused, not graded"
    return ""


def exercise_mismatch(path: Path, exercise: str) -> str:
    """:func:`.pristine.other_exercise` of the notebook at ``path``; '' when it cannot be read (the grader
    reports that itself)."""
    from .notebook_tasks import NotebookFormatError
    from .pristine import other_exercise

    try:
        return other_exercise(read_submission(path), exercise)
    except NotebookFormatError:
        return ""


def _parse_file_name(entry: Path) -> Optional[Tuple[str, str]]:
    if SEPARATOR not in entry.stem:
        return None
    learner, exercise = entry.stem.split(SEPARATOR, 1)
    return learner, exercise


def find_submissions(folder: Union[str, Path]) -> Tuple[List[Submission], List[str]]:
    """Submissions under ``folder`` in both layouts, sorted; plus warnings about files skipped.

    Every learner folder gives at least one submission: one without a notebook gives a refused
    submission (:data:`NO_NOTEBOOK`), so the learner shows in every output at 0. Links are listed
    with the reason they are refused (:func:`own_file_problem`)."""
    folder = Path(folder)
    found: List[Submission] = []
    warnings: List[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            parsed = _parse_file_name(entry) if entry.suffix == ".ipynb" else None
            learner, exercise = parsed if parsed else (entry.name, "")
            kind = "a symbolic link to a folder" if entry.is_dir() else "a symbolic link"
            found.append(Submission(learner, exercise, entry, f"is {kind}, not the learner's own: refused, not graded"))
        elif entry.is_dir():
            notebooks, linked = submitted_notebooks(entry)
            notebooks = [p for p in notebooks if not _skip(p, folder)]
            warnings += [f"skipped {p.relative_to(folder)}: a symbolic link to a folder (not followed)" for p in linked]
            if not notebooks:
                found.append(Submission(entry.name, "", entry, NO_NOTEBOOK))
            for path in notebooks:
                found.append(Submission(entry.name, path.stem, path, own_file_problem(path, folder)))
        elif entry.suffix == ".ipynb":
            parsed = _parse_file_name(entry)
            if parsed:
                found.append(Submission(parsed[0], parsed[1], entry, own_file_problem(entry, folder)))
            else:
                warnings.append(
                    f"skipped {entry.name}: name it <learner>{SEPARATOR}NN_topic.ipynb "
                    "or put it in a folder named after the learner"
                )
    found.sort(key=lambda s: (s.learner, s.exercise, str(s.path)))
    return found, warnings


def _zero_report(path: Path, exercise: str, line: str, pristine_nb: Any = None) -> GradeReport:
    """A report at 0 that says ``line``: one failed task per task of the pristine notebook when there is one
    (so the points still show), else no tasks and ``line`` as the error."""
    from .notebook_tasks import find_tasks

    report = GradeReport(submission=path, exercise=exercise, error=line)
    if pristine_nb is not None:
        report.tasks = [TaskResult(t.task, t.points, False, line) for t in find_tasks(pristine_nb).values()]
    return report


def _pristine_of(exercise: str, course: Optional[Union[str, Path]]) -> Any:
    """The pristine learner version of ``exercise`` in ``course``'s exercises/, or None."""
    from .notebook_tasks import read_notebook

    if course is None or not exercise:
        return None
    for path in (Path(course) / "exercises" / "pristine" / f"{exercise}.ipynb",
                 Path(course) / "exercises" / f"{exercise}.ipynb"):
        if path.is_file():
            try:
                return read_notebook(path)
            except Exception:  # noqa: BLE001 - only used to list the tasks of a report at 0
                return None
    return None


def name_every_task(report: GradeReport, course: Optional[Union[str, Path]]) -> GradeReport:
    """``report``, with every task of its exercise listed at 0 (the error as each one's failure) when the
    grader could not grade the notebook at all, so that no task goes unnamed."""
    if report.tasks or not report.error:
        return report
    filled = _zero_report(report.submission, report.exercise, report.error,
                          _pristine_of(report.exercise, course))
    for task in filled.tasks:
        task.failure = f"not graded: {first_line(report.error)}"
    report.tasks = filled.tasks
    return report


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
    """Grade one submission within ``cell_timeout`` seconds in all; a refused one (a link, an empty folder, a
    notebook of another exercise) gets a report at 0 saying why. Whatever goes wrong becomes that
    submission's report, never an exception."""
    from .grader import EXERCISE_NAME

    loaded = (pristines or {}).get(submission.exercise)
    if loaded is None and (submission.problem or EXERCISE_NAME.match(submission.exercise)):
        loaded = _pristine_of(submission.exercise, course)  # only to list the tasks of a report at 0
    if submission.problem:
        line = submission.problem if submission.problem == NO_NOTEBOOK else f"{submission.path.name}: {submission.problem}"
        return _zero_report(submission.path, submission.exercise, line, loaded)
    if EXERCISE_NAME.match(submission.exercise):
        wrong = exercise_mismatch(submission.path, submission.exercise)
        if wrong:
            return _zero_report(submission.path, submission.exercise, f"{submission.path.name}: {wrong}", loaded)
    try:
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
        if sub.exercise in loaded or not sub.exercise:
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
    cell_timeout: float = DEFAULT_TIMEOUT_S,
    jobs: Optional[int] = None,
    progress: bool = True,
    course: Optional[Path] = None,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    cases: Optional[Path] = None,
) -> List[BatchResult]:
    """Grade submissions, ``jobs`` at a time (default: the number of cores), with a progress bar; ``cases`` is
    the folder of hidden cases (default: the course's ``exercises/hidden/``); ``cell_timeout`` bounds each
    submission's whole run."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    if course is None and pristine is None and submissions:
        try:
            from .grader import find_course

            course = find_course(None)
        except FileNotFoundError:
            course = None
    pristines = load_pristines(submissions, pristine, course)
    hide = list(hidden) + [s.path.resolve().parent for s in submissions if not s.problem]
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


def write_csv(path: Union[str, Path], columns: Sequence[str], rows: Sequence[Dict[str, Any]]) -> None:
    """Write a CSV whole or not at all: into a temporary file beside ``path``, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", newline="", encoding="utf-8", dir=path.parent,
                                         prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def write_gradebook(results: Iterable[BatchResult], path: Union[str, Path]) -> List[dict]:
    """Write the gradebook CSV (columns: :data:`GRADEBOOK_COLUMNS`) atomically; return its rows."""
    rows = gradebook_rows(results)
    write_csv(path, GRADEBOOK_COLUMNS, rows)
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

