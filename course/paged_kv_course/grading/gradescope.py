"""A Gradescope autograder for the exercises: ``paged-kv gradescope --out ZIP [--exercise NAME]``.

The zip holds what Gradescope runs: ``setup.sh`` (once, when the image is built: a venv
with the course installed, and bubblewrap for the sandbox), ``run_autograder`` (for each
submission) and ``course/``, the instructor's course with its solutions (the zip stays
with the instructor and Gradescope; learners never see it). ``run_autograder`` grades the
submitted notebook with the same grader as ``paged-kv grade`` and writes
``results/results.json`` in Gradescope's format: one test per task (name, score,
max_score, the full feedback as output). It honours ``GRADESCOPE_ROOT`` (default
``/autograder``), so it can be tried in any folder, and ``PAGED_KV_PYTHON`` for the
interpreter to use (default: the venv ``setup.sh`` made).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

COURSE_PARTS = ("paged_kv_lib", "course", "exercises", "pyproject.toml", "README.md", "LICENSE")
CONFIG_NAME = "paged_kv_autograder.json"
_SKIP = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip bubblewrap >/dev/null
ROOT="${{GRADESCOPE_ROOT:-/autograder}}"
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --quiet --upgrade pip
# The CPU build of torch keeps the image small; set TORCH_SPEC to choose another.
"$ROOT/venv/bin/python" -m pip install --quiet "${{TORCH_SPEC:-{torch_spec}}}"
# The library with Triton (its interpreter runs the kernels on the CPU) and the course package, which
# brings what grading needs (nbformat, nbclient, ipykernel, hypothesis).
"$ROOT/venv/bin/python" -m pip install --quiet "./course[triton]" ./course/course
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; results/results.json is what it reads back.
set -euo pipefail
ROOT="${GRADESCOPE_ROOT:-/autograder}"
PYTHON="${PAGED_KV_PYTHON:-$ROOT/venv/bin/python}"
exec "$PYTHON" -m paged_kv_course.grading.gradescope run --root "$ROOT"
"""


class GradescopeError(ValueError):
    """The autograder cannot be built or a submission cannot be graded; the message is one line."""


# ---------------------------------------------------------------------------------------
# Building the zip


def _add_tree(archive: zipfile.ZipFile, source: Path, name: str) -> None:
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in _SKIP or part.endswith(".egg-info") for part in rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            archive.write(path, f"{name}/{rel.as_posix()}")


def _add_text(archive: zipfile.ZipFile, name: str, text: str, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name)
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, text)


def build_autograder(course: Path, out: Path, exercise: Optional[str] = None, torch_spec: str = "torch") -> Path:
    """Write the autograder zip for ``course`` (an instructor's checkout) to ``out``; return it."""
    from .generate import solution_paths

    course = course.resolve()
    solutions = course / "exercises" / "solutions"
    if not solutions.is_dir():
        raise GradescopeError(f"{course}: no exercises/solutions/ (build the autograder from the instructor's checkout)")
    names = [p.stem for p in solution_paths(solutions)]
    if exercise is not None:
        matches = [n for n in names if n == exercise or n[:2] == exercise[:2] and exercise[:2].isdigit()]
        if len(matches) != 1:
            raise GradescopeError(f"--exercise {exercise!r}: not one of the course's exercises ({', '.join(names)})")
        exercise = matches[0]
    if out.suffix != ".zip":
        raise GradescopeError(f"--out {out}: the autograder is a .zip file")
    if out.exists() and out.is_dir():
        raise GradescopeError(f"--out {out}: is a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp", delete=False)
    handle.close()
    try:
        with zipfile.ZipFile(handle.name, "w", zipfile.ZIP_DEFLATED) as archive:
            _add_text(archive, "setup.sh", SETUP_SH.format(torch_spec=torch_spec), executable=True)
            _add_text(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
            _add_text(archive, CONFIG_NAME, json.dumps({"exercise": exercise}, indent=1) + "\n")
            for part in COURSE_PARTS:
                source = course / part
                if source.is_dir():
                    _add_tree(archive, source, f"course/{part}")
                elif source.is_file():
                    archive.write(source, f"course/{part}")
        os.replace(handle.name, out)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return out


# ---------------------------------------------------------------------------------------
# Grading one submission


def results_json(report: Any) -> Dict[str, Any]:
    """Gradescope's results for one graded notebook: a test per task with its full feedback; a task with
    several checks scores the points of those that passed (partial credit), each check on a line."""
    from .cli import format_report

    tests: List[Dict[str, Any]] = []
    for task in report.tasks:
        if task.passed:
            output = f"PASSED {task.task}"
        else:
            output = (task.detail or task.failure or "failed").strip()
            if len(task.checks) > 1:
                output += "\n\n" + "\n".join(
                    f"{c.name}: {c.points if c.passed else 0:g}/{c.points:g} " + ("pass" if c.passed else f"FAIL {c.failure}")
                    for c in task.checks)
        tests.append({"name": f"task {task.task}", "score": task.earned, "max_score": task.points,
                      "output": output, "visibility": "visible"})
    return {"score": report.earned, "tests": tests, "output": format_report(report, detail_lines=None),
            "visibility": "visible", "stdout_visibility": "hidden"}


def _refusal(line: str) -> Dict[str, Any]:
    return {"score": 0, "tests": [], "output": line, "visibility": "visible"}


def _write_results(root: Path, results: Dict[str, Any]) -> Path:
    folder = root / "results"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "results.json"
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix=".results.", suffix=".tmp",
                                         delete=False)
    try:
        with handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")
        os.replace(handle.name, target)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return target


def _find_submission(folder: Path, exercise: Optional[str]) -> Path:
    notebooks = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if exercise is not None:
        named = [p for p in notebooks if p.stem == exercise or p.stem[:2] == exercise[:2]]
        if len(named) == 1:
            return named[0]
        if not named and len(notebooks) == 1:
            return notebooks[0]  # a renamed file: the grader reads the exercise from its metadata
        if not named:
            raise GradescopeError(f"the submission holds no notebook for exercise {exercise} "
                                  f"(found: {', '.join(p.name for p in notebooks) or 'no notebook at all'})")
        raise GradescopeError(f"the submission holds {len(named)} notebooks for exercise {exercise}: "
                              f"{', '.join(p.name for p in named)}; submit one")
    if len(notebooks) != 1:
        found = ", ".join(p.name for p in notebooks) or "no notebook at all"
        raise GradescopeError(f"the submission must hold exactly one exercise notebook (found: {found})")
    return notebooks[0]


def run_submission(root: Path) -> Path:
    """Grade ``root/submission``'s notebook against ``root/source/course``; write ``root/results/results.json``."""
    from .grader import grade_notebook

    source = root / "source"
    try:
        config = json.loads((source / CONFIG_NAME).read_text(encoding="utf-8"))
        exercise = config.get("exercise")
    except (OSError, ValueError):
        return _write_results(root, _refusal(f"the autograder is incomplete: no {CONFIG_NAME} in {source}"))
    try:
        notebook = _find_submission(root / "submission", exercise)
    except GradescopeError as exc:
        return _write_results(root, _refusal(str(exc)))
    work = Path(tempfile.mkdtemp(prefix="paged-kv-gradescope-"))
    try:
        report = grade_notebook(notebook, course=source / "course", exercise=exercise, workdir=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if report.error and not report.tasks:
        return _write_results(root, _refusal(f"{notebook.name}: {report.error.strip().splitlines()[0]}"))
    return _write_results(root, results_json(report))


# ---------------------------------------------------------------------------------------
# Command line


def register(subparsers: Any) -> None:
    """Add the ``gradescope`` subcommand to the ``paged-kv`` command."""
    parser = subparsers.add_parser(
        "gradescope",
        help="build a Gradescope autograder zip for the exercises",
        description="Write a Gradescope autograder (setup.sh, run_autograder and the course with its solutions) "
                    "that grades a submitted exercise notebook and reports one test per task.",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="ZIP", help="the autograder zip to write")
    parser.add_argument("--exercise", metavar="NAME", help="the exercise this assignment grades (NN or NN_topic); "
                        "default: whichever exercise the submitted notebook is")
    parser.add_argument("--course", type=Path, metavar="DIR", help="the course checkout (default: found above here)")
    parser.add_argument("--torch-spec", default="torch", metavar="SPEC",
                        help="what setup.sh installs for torch (default: torch)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``paged-kv gradescope``."""
    from .grader import InputError, PristineNotFoundError, find_course

    try:
        course = find_course(None, args.course)
        out = build_autograder(course, args.out, args.exercise, args.torch_spec)
    except (GradescopeError, InputError, PristineNotFoundError, OSError) as exc:
        print(f"error: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
              file=sys.stderr)
        return 2
    print(f"wrote {out}: upload it as the assignment's autograder (setup.sh, run_autograder, course/)")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m paged_kv_course.grading.gradescope run --root DIR``: what ``run_autograder`` calls."""
    parser = argparse.ArgumentParser(prog="paged_kv_course.grading.gradescope")
    sub = parser.add_subparsers(dest="command", required=True)
    grade = sub.add_parser("run", help="grade ROOT/submission into ROOT/results/results.json")
    grade.add_argument("--root", type=Path, default=Path(os.environ.get("GRADESCOPE_ROOT", "/autograder")))
    args = parser.parse_args(argv)
    path = run_submission(args.root.resolve())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
