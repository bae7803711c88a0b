"""``paged-kv check``: what ``make check`` runs in a class repository, on a laptop or in CI.

First nbval runs every cell of the learner's exercise notebooks (``--nbval-lax``: a check
cell that raises fails its item): quick feedback, the same a learner gets pressing Run All.
Then the official grader grades each notebook (each one's whole run bounded in time) and one
line per task is printed, every task of the exercise named even when its notebook could not be
graded at all. ``make check`` installs the learner's dependencies only (``install-lab``). The exit
status is 0 only when every task of every checked notebook passed: nbval is feedback, the
grader's score is the grade (a notebook whose checks are wrapped in ``try``/``except``
passes nbval and still scores 0).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

NBVAL_TIMEOUT_S = 300


def learner_notebooks(course: Path, only: Sequence[str] = ()) -> List[Path]:
    """The learner's exercise notebooks of ``course`` (``exercises/NN_*.ipynb``), or those named in ``only``."""
    notebooks = sorted((course / "exercises").glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return notebooks
    chosen = []
    for name in only:
        match = [p for p in notebooks if p.stem == name or p.stem[:2] == name[:2] and name[:2].isdigit()]
        if not match:
            known = ", ".join(p.stem for p in notebooks) or "none"
            raise ValueError(f"no exercise {name!r} in {course / 'exercises'} (there: {known})")
        chosen += [p for p in match if p not in chosen]
    return chosen


def run_nbval(notebooks: Sequence[Path], course: Path) -> Tuple[bool, str]:
    """Run nbval (lax) over the notebooks; (passed, its last summary line)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--nbval-lax",
               "--nbval-current-env", f"--nbval-cell-timeout={NBVAL_TIMEOUT_S}", *map(str, notebooks)]
    done = subprocess.run(command, cwd=course, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return done.returncode == 0, (lines[-1] if lines else done.stderr.strip()[-200:])


def task_lines(reports: Sequence[Any]) -> List[str]:
    """One line per task of every report, then the total."""
    from .batch import fmt_points

    lines = []
    earned = points = 0.0
    for report in reports:
        if report.error and not report.tasks:
            lines.append(f"{report.exercise:<8}  ERROR  {report.error.strip().splitlines()[0]}")
        for task in report.tasks:
            verdict = "pass" if task.passed else "FAIL"
            tail = "" if task.passed else f"  {task.failure}"
            lines.append(f"{task.task:<8}  {fmt_points(task.earned)}/{fmt_points(task.points)}  {verdict}{tail}")
        earned += report.earned
        points += report.points
    lines.append(f"total     {fmt_points(earned)}/{fmt_points(points)}")
    return lines


def summary_markdown(reports: Sequence[Any], nbval_ok: bool, nbval_line: str) -> str:
    """The score table as Markdown, for a CI job summary."""
    from .batch import fmt_points

    rows = ["## Exercise check", "", f"nbval (feedback): {'passed' if nbval_ok else 'failed'}: {nbval_line}", "",
            "| task | points | result |", "|---|---|---|"]
    for report in reports:
        for task in report.tasks:
            rows.append(f"| {task.task} | {fmt_points(task.earned)}/{fmt_points(task.points)} | "
                        f"{'pass' if task.passed else 'FAIL'} |")
    return "\n".join(rows) + "\n"


def register(subparsers: Any) -> None:
    """Add the ``check`` subcommand to the ``paged-kv`` command."""
    parser = subparsers.add_parser(
        "check",
        help="run nbval over your exercises, then grade each one (what `make check` runs)",
        description="nbval over the learner's exercise notebooks for quick feedback, then the official grader; "
                    "one line per task; exit 0 only when every task passed.",
    )
    parser.add_argument("exercises", nargs="*", metavar="NN", help="only these exercises (default: all)")
    parser.add_argument("--course", type=Path, metavar="DIR", help="the course folder (default: found above here)")
    parser.add_argument("--summary", type=Path, metavar="FILE", help="append a Markdown score table to FILE "
                        "(CI: $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--no-nbval", action="store_true", help="grade only")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``paged-kv check``."""
    from .batch import name_every_task
    from .grader import InputError, PristineNotFoundError, find_course, grade_notebook

    try:
        course = find_course(None, args.course)
        notebooks = learner_notebooks(course, args.exercises)
    except (InputError, PristineNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not notebooks:
        print(f"error: no exercise notebooks in {course / 'exercises'}", file=sys.stderr)
        return 2
    nbval_ok, nbval_line = True, "not run"
    if not args.no_nbval:
        print(f"nbval over {len(notebooks)} notebook(s) (feedback: every cell runs; the grade comes next) ...",
              flush=True)
        nbval_ok, nbval_line = run_nbval(notebooks, course)
        print(f"nbval: {'passed' if nbval_ok else 'FAILED'}: {nbval_line}", flush=True)
    reports = []
    for notebook in notebooks:
        report = grade_notebook(notebook, course=course)
        reports.append(name_every_task(report, course))
    for line in task_lines(reports):
        print(line)
    if args.summary is not None:
        with open(args.summary, "a", encoding="utf-8") as handle:
            handle.write(summary_markdown(reports, nbval_ok, nbval_line))
    return 0 if all(r.ok for r in reports) else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="paged-kv check")
    sub = parser.add_subparsers()
    register(sub)
    return int(run(parser.parse_args(["check", *(argv if argv is not None else sys.argv[1:])])))
