"""Gradebooks in the shapes instructors load, and one full report per learner.

``paged-kv grade --batch`` grades a class; this module turns its results into:

- ``long``: one row per learner, notebook and task (:func:`.batch.write_gradebook`);
- ``wide``: one row per learner, a column per task and per notebook, and the totals;
- ``canvas``: Canvas's grade-import CSV: Student, ID, SIS User ID (only when the roster has
  that column: never filled with the Canvas id), SIS Login ID, Section, then one column per
  notebook, named ``Name (ASSIGNMENT_ID)`` when the instructor gives the Canvas assignment's id
  (else a new column, which Canvas imports as a new assignment), and a "Points Possible" row
  first. Names and ids come from a roster CSV (``learner,name,id,sis_login[,section]
  [,sis_user_id]``; ``learner`` is the submission folder's name); assignment ids from
  ``canvas_assignments.csv`` beside the roster (``exercise,assignment_id``), when there is one.

``--reports DIR`` writes ``DIR/<learner>.md``: every notebook of that learner with its
score table and every failure in full (call, expected, got, hint), as the single-notebook
report shows it. Every file is written whole or not at all, and every cell a learner can
influence is escaped against spreadsheet formulas.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .batch import BatchResult, duplicates, escape_cell, first_line, fmt_points, write_csv, write_gradebook

FORMATS = ("long", "wide", "canvas")
ROSTER_REQUIRED = ("learner", "name", "id", "sis_login")
ROSTER_OPTIONAL = ("section", "sis_user_id")
CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "Points Possible"
ASSIGNMENTS_FILE = "canvas_assignments.csv"
NOT_IN_ROSTER = "not in the roster"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class GradebookError(ValueError):
    """A roster, a format or an output path that cannot be used; the message is one line."""


@dataclass(frozen=True)
class RosterEntry:
    """One learner of the class as the LMS knows them."""

    learner: str
    name: str
    id: str
    sis_login: str
    section: str = ""
    sis_user_id: str = ""


class Roster(Dict[str, RosterEntry]):
    """The roster: ``learner -> entry``, plus whether it has SIS user ids at all and the Canvas assignment
    id of each exercise (from :data:`ASSIGNMENTS_FILE` beside it)."""

    has_sis_user_id: bool = False
    assignments: Dict[str, str] = {}


# ---------------------------------------------------------------------------------------
# Roster


def read_assignments(path: Path) -> Dict[str, str]:
    """``exercise -> Canvas assignment id`` from a CSV with columns ``exercise,assignment_id`` (an id is the
    number in the assignment's Canvas address); a bad column, id or repeated exercise is refused."""
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    except (OSError, UnicodeDecodeError) as exc:
        raise GradebookError(f"{path}: cannot read it ({exc})") from None
    found: Dict[str, str] = {}
    for line, row in enumerate(rows, start=2):
        exercise, ident = (row.get("exercise") or "").strip(), (row.get("assignment_id") or "").strip()
        if not exercise or not ident.isdigit():
            raise GradebookError(f"{path}: line {line} needs an exercise and a numeric assignment_id "
                                 "(columns exercise,assignment_id)")
        if exercise in found:
            raise GradebookError(f"{path}: line {line} repeats exercise {exercise!r}")
        found[exercise] = ident
    return found


def read_roster(path: Union[str, Path]) -> Roster:
    """The roster CSV as ``learner -> entry``; a missing or unknown column, a blank or repeated learner is refused.
    The Canvas assignment ids come from :data:`ASSIGNMENTS_FILE` beside it, when there is one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise GradebookError(f"--roster {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise GradebookError(f"--roster {path}: not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in ROSTER_REQUIRED if c not in columns]
    if missing:
        raise GradebookError(f"--roster {path}: no column {missing[0]!r} (columns must be "
                             f"{','.join(ROSTER_REQUIRED)}[,section][,sis_user_id])")
    unknown = [c for c in columns if c not in ROSTER_REQUIRED + ROSTER_OPTIONAL]
    if unknown:
        raise GradebookError(f"--roster {path}: unknown column {unknown[0]!r} (columns must be "
                             f"{','.join(ROSTER_REQUIRED)}[,section][,sis_user_id])")
    roster = Roster()
    roster.has_sis_user_id = "sis_user_id" in columns
    sibling = path.parent / ASSIGNMENTS_FILE
    roster.assignments = read_assignments(sibling) if sibling.is_file() else {}
    for line, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        learner = row.get("learner", "")
        if not learner:
            raise GradebookError(f"--roster {path}: line {line} has no learner")
        if learner in roster:
            raise GradebookError(f"--roster {path}: line {line} repeats learner {learner!r}")
        roster[learner] = RosterEntry(learner, row["name"], row["id"], row["sis_login"], row.get("section", ""),
                                      row.get("sis_user_id", ""))
    return roster


# ---------------------------------------------------------------------------------------
# Tables


def _task_key(task: str) -> Tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in task.split("."))


def _layout(results: Sequence[BatchResult]) -> Tuple[List[str], Dict[str, List[str]], List[str]]:
    """The notebooks, each notebook's tasks (sorted) and the learners, in a stable order."""
    tasks: Dict[str, set] = {}
    learners: List[str] = []
    for result in results:
        notebook = result.report.exercise or result.submission.exercise
        if notebook:  # a learner folder with no notebook adds a learner, not a notebook
            tasks.setdefault(notebook, set()).update(t.task for t in result.report.tasks)
        if result.submission.learner not in learners:
            learners.append(result.submission.learner)
    notebooks = sorted(tasks)
    return notebooks, {n: sorted(tasks[n], key=_task_key) for n in notebooks}, sorted(learners)


def _by_learner(results: Sequence[BatchResult]) -> Dict[Tuple[str, str], BatchResult]:
    """(learner, notebook) -> its result; with several submissions, the last one graded counts (and is flagged)."""
    found: Dict[Tuple[str, str], BatchResult] = {}
    for result in results:
        found[(result.submission.learner, result.report.exercise or result.submission.exercise)] = result
    return found


def _flags(results: Sequence[BatchResult], learner: str) -> List[str]:
    from .batch import TAMPERED

    flags = [f"{n} submissions of {notebook}" for (who, notebook), n in duplicates(results).items() if who == learner]
    for result in results:
        if result.submission.learner == learner:
            flags += [n for n in result.report.notes if n.startswith(TAMPERED)]
            if result.report.error:
                notebook = result.report.exercise or result.submission.exercise
                flags.append(f"{notebook}: {first_line(result.report.error)}" if notebook
                             else first_line(result.report.error))
    return flags


def wide_rows(results: Iterable[BatchResult]) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Columns and rows of the wide gradebook: learner, each task, each notebook, total, max, flag."""
    results = list(results)
    notebooks, tasks, learners = _layout(results)
    graded = _by_learner(results)
    columns = ["learner"]
    for notebook in notebooks:
        columns += tasks[notebook] + [notebook]
    columns += ["total", "max", "flag"]
    rows = []
    for learner in learners:
        row: Dict[str, Any] = {c: "" for c in columns}
        row["learner"] = learner
        total = maximum = 0.0
        for notebook in notebooks:
            result = graded.get((learner, notebook))
            best = sum(_points_of(notebook, task, results) for task in tasks[notebook])
            maximum += best
            if result is None:
                if _submitted_nothing(results, learner):
                    row[notebook] = 0  # a learner folder with no notebook: 0, and the flag says why
                continue  # no submission: blank cells, not zeros, so an LMS import changes nothing
            for task in result.report.tasks:
                row[task.task] = fmt_points(task.earned)
            row[notebook] = fmt_points(result.report.earned)
            total += result.report.earned
        row["total"], row["max"] = fmt_points(total), fmt_points(maximum)
        row["flag"] = "; ".join(_flags(results, learner))
        rows.append({k: escape_cell(v) for k, v in row.items()})
    return columns, rows


def _submitted_nothing(results: Sequence[BatchResult], learner: str) -> bool:
    """Whether ``learner``'s folder held no notebook at all (listed at 0, not left blank)."""
    from .batch import NO_NOTEBOOK

    return any(r.submission.learner == learner and r.submission.problem == NO_NOTEBOOK for r in results)


def canvas_column(notebook: str, assignments: Dict[str, str]) -> str:
    """A notebook's Canvas column: ``Name (ID)`` for an existing Canvas assignment, else the bare name (which
    Canvas's import offers to create as a new assignment)."""
    ident = assignments.get(notebook) or assignments.get(notebook[:2])
    return f"{notebook} ({ident})" if ident else notebook


def _points_of(notebook: str, task: str, results: Sequence[BatchResult]) -> float:
    for result in results:
        if (result.report.exercise or result.submission.exercise) == notebook:
            for t in result.report.tasks:
                if t.task == task:
                    return t.points
    return 0.0


def canvas_rows(results: Iterable[BatchResult], roster: Dict[str, RosterEntry]) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Columns and rows of a Canvas grade import: the "Points Possible" row, every roster learner, then graded
    learners the roster lacks. "SIS User ID" is a column only when the roster has one; an assignment column
    carries its Canvas id when :data:`ASSIGNMENTS_FILE` gives it."""
    results = list(results)
    notebooks, tasks, learners = _layout(results)
    graded = _by_learner(results)
    assignments = getattr(roster, "assignments", {}) or {}
    with_sis = bool(getattr(roster, "has_sis_user_id", False))
    fixed = [c for c in CANVAS_FIXED if with_sis or c != "SIS User ID"]
    named = {n: canvas_column(n, assignments) for n in notebooks}
    columns = fixed + [named[n] for n in notebooks]
    possible: Dict[str, Any] = {c: "" for c in fixed}
    possible["Student"] = POINTS_POSSIBLE
    for notebook in notebooks:
        possible[named[notebook]] = fmt_points(sum(_points_of(notebook, t, results) for t in tasks[notebook]))
    rows = [possible]
    everyone = list(roster) + [name for name in learners if name not in roster]
    for learner in everyone:
        entry = roster.get(learner)
        if entry is None:
            row: Dict[str, Any] = {c: "" for c in fixed}
            row["Student"] = f"{learner} ({NOT_IN_ROSTER})"
        else:
            row = {"Student": entry.name, "ID": entry.id, "SIS Login ID": entry.sis_login, "Section": entry.section}
            if with_sis:
                row["SIS User ID"] = entry.sis_user_id  # the SIS's own id, never the Canvas id
        nothing = _submitted_nothing(results, learner)
        for notebook in notebooks:
            result = graded.get((learner, notebook))
            row[named[notebook]] = (fmt_points(result.report.earned) if result is not None
                                    else 0 if nothing else "")
        rows.append({k: escape_cell(v) for k, v in row.items()})
    return columns, rows


# ---------------------------------------------------------------------------------------
# Writing


def write(results: Iterable[BatchResult], path: Union[str, Path], fmt: str = "long",
          roster: Optional[Dict[str, RosterEntry]] = None) -> int:
    """Write the gradebook in format ``fmt`` to ``path`` atomically; return the number of rows."""
    results = list(results)
    if fmt not in FORMATS:
        raise GradebookError(f"--format {fmt!r}: not one of {', '.join(FORMATS)}")
    if fmt == "long":
        return len(write_gradebook(results, path))
    if fmt == "canvas":
        if roster is None:
            raise GradebookError("--format canvas needs --roster FILE "
                                 "(columns learner,name,id,sis_login[,section][,sis_user_id])")
        columns, rows = canvas_rows(results, roster)
    else:
        columns, rows = wide_rows(results)
    write_csv(path, columns, rows)
    return len(rows)


def report_file_name(learner: str) -> str:
    """A safe file name for a learner's report (folder names may hold anything)."""
    stem = _SAFE_NAME.sub("_", learner).strip("._") or "learner"
    return f"{stem[:80]}.md"


def learner_report(learner: str, results: Sequence[BatchResult]) -> str:
    """One learner's full report: each notebook's table, every failure whole, and the grader's notes."""
    from .cli import format_report

    mine = [r for r in results if r.submission.learner == learner]
    mine.sort(key=lambda r: r.report.exercise or r.submission.exercise)
    earned = sum(r.report.earned for r in mine)
    points = sum(r.report.points for r in mine)
    parts = [f"# Grades of {learner}", "", f"total: {fmt_points(earned)}/{fmt_points(points)}", ""]
    for result in mine:
        parts += ["```", format_report(result.report, detail_lines=None), "```", ""]
    return "\n".join(parts)


def write_reports(results: Iterable[BatchResult], folder: Union[str, Path]) -> List[Path]:
    """Write one report per learner into ``folder`` (made whole in a staging folder, then moved in)."""
    results = list(results)
    folder = Path(folder)
    learners = sorted({r.submission.learner for r in results})
    names: Dict[str, str] = {}
    for learner in learners:
        name = report_file_name(learner)
        while name in names.values():  # two folder names that clean to the same file name
            name = name[:-3] + "_.md"
        names[learner] = name
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".reports.", dir=folder))
    try:
        for learner, name in names.items():
            (staging / name).write_text(learner_report(learner, results), encoding="utf-8")
        written = []
        for name in names.values():
            os.replace(staging / name, folder / name)
            written.append(folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def output_problem(fmt: str, roster: Optional[Path], reports: Optional[Path]) -> str:
    """Why these gradebook options cannot be used ('' when they can), checked before anything is graded."""
    if fmt not in FORMATS:
        return f"--format {fmt!r}: not one of {', '.join(FORMATS)}"
    if fmt == "canvas" and roster is None:
        return "--format canvas needs --roster FILE (columns learner,name,id,sis_login[,section][,sis_user_id])"
    if roster is not None and fmt != "canvas":
        return f"--roster is read only with --format canvas, not --format {fmt}"
    if roster is not None:
        try:
            read_roster(roster)
        except GradebookError as exc:
            return str(exc)
    if reports is not None:
        if reports.exists() and not reports.is_dir():
            return f"--reports {reports}: exists and is not a folder"
        existing = reports
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK | os.X_OK):
            return f"--reports {reports}: cannot write in {existing}"
    return ""
