"""``paged-kv grade``: grade one exercise notebook, or a whole class's folder into a CSV.

    paged-kv grade exercises/03_allocator.ipynb
    paged-kv grade --batch submissions/ --csv gradebook.csv --jobs 4

Exit status: 0 when every task passed (batch: when the gradebook was written), 1 when
a task failed, 2 when the notebook could not be graded at all (not a notebook, no
matching exercise, bad arguments).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

from .judge_process import DEFAULT_TIMEOUT_S
from .wire import escape

if TYPE_CHECKING:
    from .grader import GradeReport

# The grader and the batch runner import nbformat and jsonschema (seconds of start-up), so
# they load when a grade runs, not whenever the `paged-kv` command builds its parser.

DETAIL_LINES = 12


def register(subparsers: Any) -> None:
    """Add the ``grade`` subcommand to the ``paged-kv`` command."""
    parser = subparsers.add_parser(
        "grade",
        help="grade an exercise notebook (or a folder of submissions with --batch)",
        description=(
            "Splice the solution cells of a notebook into a pristine copy of its exercise, run its cells "
            "in a sandboxed kernel under one time limit for the whole submission, run each check outside that kernel against "
            "the learner's objects, and print a score table. With --batch, grade every "
            "submission in FOLDER/<learner>/NN_topic.ipynb or FOLDER/<learner>__NN_topic.ipynb "
            "and write a gradebook CSV."
        ),
    )
    parser.add_argument("notebook", nargs="?", type=Path, help="the notebook to grade")
    parser.add_argument("--batch", type=Path, metavar="FOLDER", help="grade every submission under FOLDER")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="gradebook to write (with --batch)")
    parser.add_argument(
        "--jobs", type=int, default=None, metavar="N",
        help="submissions graded at once (with --batch; default: the number of cores)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=f"time limit of one whole submission, kernel start included (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--pristine", type=Path, metavar="PATH",
        help=(
            "the exercise to grade against: a learner version or solution notebook, or a folder of "
            "them (default: the course's exercises/ folder, learner versions generated from solutions/)"
        ),
    )
    parser.add_argument(
        "--course", type=Path, metavar="DIR",
        help="the course folder whose exercises/ to grade against (default: found above the notebook, "
             "then above the current folder)",
    )
    parser.add_argument(
        "--sandbox", choices=("auto", "bwrap", "none"), default="auto",
        help="auto and bwrap: run the learner's code in a bubblewrap sandbox, and refuse to grade where "
             "there is none; none: grade unsandboxed (every report says so)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (with --batch)")
    parser.add_argument(
        "--format", choices=None, default="long", metavar="long|wide|canvas",
        help="gradebook shape (with --batch): long (a row per task), wide (a row per learner), "
             "canvas (Canvas's import columns; needs --roster)",
    )
    parser.add_argument("--roster", type=Path, metavar="FILE",
                        help="with --format canvas: CSV with columns learner,name,id,sis_login[,section]")
    parser.add_argument("--reports", type=Path, metavar="DIR",
                        help="with --batch: write one full report per learner into DIR")
    parser.add_argument("--hidden-cases", type=Path, metavar="DIR",
                        help="the folder of hidden cases NN.py (default: the course's exercises/hidden/)")
    parser.set_defaults(func=run)


def _input_error(args: argparse.Namespace) -> str:
    """The first problem with the options, as one line ('' when there is none)."""
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        return f"--timeout must be a finite number of seconds above 0, not {args.timeout:g}"
    if args.course is not None and not (args.course / "exercises").is_dir():
        return f"--course {args.course}: no exercises/ folder in it"
    hidden_dir = getattr(args, "hidden_cases", None)
    if hidden_dir is not None and not hidden_dir.is_dir():
        return f"--hidden-cases {hidden_dir}: no such folder"
    if args.pristine is not None and not args.pristine.exists():
        return f"--pristine {args.pristine}: no such file or folder"
    if args.sandbox != "none":
        from .sandbox import REFUSED, bwrap_problem

        problem = bwrap_problem()
        if problem:
            return REFUSED.format(problem=problem)
    return ""


def run(args: argparse.Namespace) -> int:
    """Entry point of ``paged-kv grade``."""
    problem = _input_error(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.batch is not None:
        return _run_batch(args)
    if args.notebook is None:
        print("error: give a notebook to grade, or --batch FOLDER --csv FILE", file=sys.stderr)
        return 2
    if not args.notebook.is_file():
        print(f"error: no such notebook: {args.notebook}", file=sys.stderr)
        return 2
    from .grader import grade_notebook

    report = grade_notebook(args.notebook, pristine=args.pristine, cell_timeout=args.timeout,
                            course=args.course, sandbox_mode=args.sandbox, cases=getattr(args, "hidden_cases", None))
    print(format_report(report))
    if report.error:
        return 2
    return 0 if report.ok else 1


def csv_problem(path: Path) -> str:
    """Why the gradebook cannot be written at ``path`` ('' when it can), checked before any grading."""
    if path.is_dir():
        return f"--csv {path}: is a folder"
    folder = path.parent if str(path.parent) else Path(".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"--csv {path}: {existing} is not a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return f"--csv {path}: the file is not writable"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--csv {path}: cannot write in {existing}"
    return ""


def _run_batch(args: argparse.Namespace) -> int:
    if args.notebook is not None:
        print("error: give either a notebook or --batch FOLDER, not both", file=sys.stderr)
        return 2
    if args.csv is None:
        print("error: --batch needs --csv FILE for the gradebook", file=sys.stderr)
        return 2
    if not args.batch.is_dir():
        print(f"error: no such folder: {args.batch}", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2
    from .gradebook import output_problem

    problem = csv_problem(args.csv) or output_problem(args.format, args.roster, args.reports)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from . import gradebook
    from .batch import find_submissions, grade_batch, summary_table

    submissions, warnings = find_submissions(args.batch)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not submissions:
        print(f"error: no submissions under {args.batch}", file=sys.stderr)
        return 2
    results = grade_batch(
        submissions, pristine=args.pristine, cell_timeout=args.timeout, jobs=args.jobs,
        progress=not args.no_progress, course=args.course, sandbox_mode=args.sandbox,
        hidden=[args.batch, args.csv.parent], cases=getattr(args, "hidden_cases", None),
    )
    roster = gradebook.read_roster(args.roster) if args.roster is not None else None
    rows = gradebook.write(results, args.csv, args.format, roster)
    if args.reports is not None:
        written = gradebook.write_reports(results, args.reports)
        print(f"{len(written)} learner report(s) written to {args.reports}")
    print(summary_table(results))
    isolation = next((n for r in results for n in r.report.notes if n.startswith("grading was not isolated")), "")
    if isolation:
        print(f"\nnote: {isolation}")
    tampered = next((n for r in results for n in r.report.notes if n.startswith("the library or the exercises")), "")
    if tampered:
        print(f"warning: {tampered}", file=sys.stderr)
    learners = len({s.learner for s in submissions})
    print(f"\n{len(submissions)} notebook(s) of {learners} learner(s); {rows} row(s) written to {args.csv} ({args.format})")
    return 0


def format_report(report: GradeReport, detail_lines: Optional[int] = DETAIL_LINES) -> str:
    """The score table of one submission, then the failure details (cut at ``detail_lines``; None: whole) and notes."""
    from .batch import fmt_points

    lines: List[str] = [f"Grading {report.submission} (exercise {report.exercise})"]
    if report.error:
        lines.append(f"error: {report.error}")
    if report.tasks:
        rows = [("task", "points", "result", "first failure line")]
        for task in report.tasks:
            rows.append((
                task.task, f"{fmt_points(task.earned)}/{fmt_points(task.points)}",
                "pass" if task.passed else "FAIL", task.failure,
            ))
        rows.append(("total", f"{fmt_points(report.earned)}/{fmt_points(report.points)}", "", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines.append("")
        for row in rows:
            lines.append("  ".join([row[i].ljust(widths[i]) for i in range(3)] + [row[3]]).rstrip())
    split = [t for t in report.tasks if not t.passed and len(t.checks) > 1]
    if split:
        lines.append("\nper check (a task with several checks earns the points of those that passed):")
        for task in split:
            for check in task.checks:
                got = check.points if check.passed else 0
                verdict = "pass" if check.passed else f"FAIL  {check.failure}".rstrip()
                lines.append(f"  {task.task}  {check.name}  {fmt_points(got)}/{fmt_points(check.points)}  {verdict}")
    details = [t for t in report.tasks if not t.passed and t.detail and t.detail.strip() != t.failure]
    for task in details:
        body = task.detail.strip().splitlines()
        if detail_lines is not None and len(body) > detail_lines:
            body = body[:detail_lines] + ["..."]
        lines.append(f"\n{task.task}:")
        lines.extend(f"  {line}" for line in body)
    if report.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in report.notes)
    return escape("\n".join(lines), limit=10 ** 7)  # learner text: no control characters or escape sequences
