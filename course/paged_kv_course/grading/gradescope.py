"""A Gradescope autograder for the exercises: ``paged-kv gradescope --out ZIP [--exercise NAME]``.

The zip follows Gradescope's autograder specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/): ``setup.sh`` and
``run_autograder`` at its root, and ``course/``, the instructor's course with its solutions
(the zip stays with the instructor and Gradescope; learners never see it).

- ``setup.sh`` runs once, when Gradescope builds the image: it installs with apt only the
  system packages that are missing (python3 with venv, bubblewrap for the sandbox), then makes
  a venv with the CPU build of torch and what a learner's install carries for grading: the
  library (``course/``, with Triton, whose interpreter runs the kernels on a CPU) and the
  course package (``course/course``: nbformat, nbclient, ipykernel, hypothesis). JupyterLab is
  left out: grading needs a kernel, not the lab. Where pip's default index would give a CUDA
  build of torch, the instructor names the CPU wheel index with ``--torch-index-url`` (or
  ``TORCH_INDEX_URL`` when setup.sh runs); setup.sh refuses to finish with a CUDA build.
- ``run_autograder`` runs for every submission: it grades the one submitted notebook with the
  same grader as ``paged-kv grade`` and writes ``results/results.json``: one test per task (its
  visible checks), one test per hidden case (``after_published``: its hint shows only once the
  instructor publishes the grades), all outputs plain text.

Both take their root from ``GRADESCOPE_ROOT`` (default ``/autograder``), so they run the same in
any folder; ``PAGED_KV_PYTHON`` names another interpreter for ``run_autograder``.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

COURSE_PARTS = ("paged_kv_lib", "course", "exercises", "pyproject.toml", "README.md", "LICENSE")
CONFIG_NAME = "paged_kv_autograder.json"
DEFAULT_TORCH_SPEC = "torch==2.13.0"
_SKIP = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv"}
# Gradescope's visibility for a hidden case's test: shown once the instructor publishes the grades.
HIDDEN_VISIBILITY = "after_published"
# Characters an option may not carry into setup.sh (it is pasted between double quotes).
_UNSAFE_IN_SETUP = frozenset('"\'`$\\\n')

SETUP_SH = """#!/usr/bin/env bash
# Written by `paged-kv gradescope`. Gradescope runs this once, as root, when it builds the image.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="${{GRADESCOPE_ROOT:-/autograder}}"
TORCH_SPEC="${{TORCH_SPEC:-{torch_spec}}}"
# The CPU wheel index of torch, where pip's default index would give a CUDA build (empty: pip's own).
TORCH_INDEX_URL="${{TORCH_INDEX_URL:-{torch_index_url}}}"

# System packages: apt-get runs only for those missing, so an image (or a test) that has them skips it.
missing=""
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing="$missing python3-venv python3-pip"
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null
fi

python3 -m venv --clear "$ROOT/venv"
PY="$ROOT/venv/bin/python"
if [ -n "$TORCH_INDEX_URL" ]; then
  "$PY" -m pip install --quiet --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
else
  "$PY" -m pip install --quiet "$TORCH_SPEC"
fi
# The learner's install, less JupyterLab: the library with Triton, and the course package (the grader and
# what the check cells need: nbformat, nbclient, ipykernel, hypothesis).
"$PY" -m pip install --quiet "./course[triton]" ./course/course
"$PY" -c "import paged_kv_lib, paged_kv_course.grading.gradescope, nbformat, nbclient, ipykernel, hypothesis"
"$PY" -c "import sys, torch; sys.exit(torch.version.cuda and 'setup.sh: torch ' + torch.__version__ +
  ' is a CUDA build: give the CPU wheel index in TORCH_INDEX_URL')"
echo "setup.sh: $("$PY" -c 'import torch; print("torch", torch.__version__)') and the course in $ROOT/venv"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Written by `paged-kv gradescope`. Gradescope runs this for every submission; it reads results/results.json.
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


def build_autograder(course: Path, out: Path, exercise: Optional[str] = None,
                     torch_spec: str = DEFAULT_TORCH_SPEC, torch_index_url: str = "") -> Path:
    """Write the autograder zip for ``course`` (an instructor's checkout) to ``out``; return it.

    ``torch_spec`` and ``torch_index_url`` become setup.sh's defaults for the torch it installs
    (the CPU wheel index where pip's default would give a CUDA build); the zip is written whole or
    not at all."""
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
    for text, option in ((torch_spec, "--torch-spec"), (torch_index_url, "--torch-index-url")):
        if any(c in text for c in _UNSAFE_IN_SETUP):
            raise GradescopeError(f"{option} {text!r}: quotes, backslashes, $ and newlines cannot go into setup.sh")
    missing = [part for part in ("paged_kv_lib", "pyproject.toml", "course/pyproject.toml")
               if not (course / part).exists()]
    if missing:
        raise GradescopeError(f"{course}: no {missing[0]} (setup.sh installs the library and the course package)")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp", delete=False)
    handle.close()
    try:
        with zipfile.ZipFile(handle.name, "w", zipfile.ZIP_DEFLATED) as archive:
            setup = SETUP_SH.format(torch_spec=torch_spec, torch_index_url=torch_index_url)
            _add_text(archive, "setup.sh", setup, executable=True)
            _add_text(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
            _add_text(archive, CONFIG_NAME, json.dumps({"exercise": exercise}, indent=1) + "\n")
            for part in COURSE_PARTS:
                source = course / part
                if source.is_dir():
                    _add_tree(archive, source, f"course/{part}")
                elif source.is_file():
                    archive.write(source, f"course/{part}")
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, out)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return out


# ---------------------------------------------------------------------------------------
# Grading one submission


def _points(value: float) -> float:
    return round(float(value), 6)


def results_json(report: Any, execution_time: Optional[float] = None) -> Dict[str, Any]:
    """Gradescope's results for one graded notebook, in the shape its specification documents.

    Each task is one test holding its visible checks (a task with several checks scores those that
    passed, each check on a line of the output); each hidden case is a test of its own, visible
    ``after_published`` and showing only its hint. The tests' scores add up to the report's score.
    Every output is plain text (``output_format`` ``text``), so nothing a learner writes renders as HTML."""
    tests: List[Dict[str, Any]] = []
    for task in report.tasks:
        hidden = [c for c in task.checks if c.hidden]
        hidden_points = sum(c.points for c in hidden)
        hidden_earned = sum(c.points for c in hidden if c.passed or task.passed)
        if hidden_earned > task.earned:  # no credit reached the task (its solution cell failed): none for its cases
            hidden_earned = 0
        visible = [c for c in task.checks if not c.hidden]
        if task.passed or (visible and all(c.passed for c in visible)):
            output = f"PASSED {task.task}" + (" (its visible checks)" if hidden else "")
        else:
            output = (task.detail or task.failure or "failed").strip()
            if len(visible) > 1:
                output += "\n\n" + "\n".join(
                    f"{c.name}: {c.points if c.passed else 0:g}/{c.points:g} " + ("pass" if c.passed else f"FAIL {c.failure}")
                    for c in visible)
        tests.append({"name": f"task {task.task}", "number": task.task,
                      "score": _points(max(0.0, task.earned - hidden_earned)),
                      "max_score": _points(task.points - hidden_points), "output": output,
                      "output_format": "text", "visibility": "visible"})
        for case in hidden:
            ok = (case.passed or task.passed) and hidden_earned > 0
            tests.append({"name": f"task {task.task} hidden case {case.hidden}",
                          "number": f"{task.task}.h{case.hidden}",
                          "score": _points(case.points if ok else 0), "max_score": _points(case.points),
                          "output": "passed" if ok else case.failure, "output_format": "text",
                          "visibility": HIDDEN_VISIBILITY})
    results: Dict[str, Any] = {
        "score": _points(report.earned), "tests": tests, "output": _summary(report),
        "output_format": "text", "test_output_format": "text", "visibility": "visible",
        "stdout_visibility": "hidden"}
    if execution_time is not None:
        results["execution_time"] = int(round(execution_time))
    return results


def _summary(report: Any) -> str:
    """The submission's own output: its total and the grader's notes; what each task found is in its test,
    and nothing of a hidden case shows here (its test is visible only once the grades are published)."""
    from .batch import fmt_points

    lines = [f"exercise {report.exercise}: {fmt_points(report.earned)}/{fmt_points(report.points)} points; "
             "each task is a test below"]
    if any(c.hidden for task in report.tasks for c in task.checks):
        lines.append("hidden cases are tests of their own; they show once your instructor publishes the grades")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _refusal(line: str) -> Dict[str, Any]:
    return {"score": 0, "tests": [], "output": line, "output_format": "text", "visibility": "visible",
            "stdout_visibility": "hidden"}


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
    """The submitted notebook to grade: the one named after the exercise, or the only one; it must be a
    regular file of the submission itself (a symlink, for example into the autograder's own solutions, is
    refused), and a notebook of another exercise is refused with a line that says which it is."""
    from .batch import exercise_mismatch, own_file_problem, submitted_notebooks

    notebooks, _ = submitted_notebooks(folder)
    if exercise is not None:
        named = [p for p in notebooks if p.stem == exercise or p.stem[:2] == exercise[:2]]
        if len(named) > 1:
            raise GradescopeError(f"the submission holds {len(named)} notebooks for exercise {exercise}: "
                                  f"{', '.join(p.name for p in named)}; submit one")
        if not named and len(notebooks) != 1:
            raise GradescopeError(f"the submission holds no notebook for exercise {exercise} "
                                  f"(found: {', '.join(p.name for p in notebooks) or 'no notebook at all'})")
        chosen = named[0] if named else notebooks[0]  # a renamed file: its metadata says which exercise it is
    else:
        if len(notebooks) != 1:
            found = ", ".join(p.name for p in notebooks) or "no notebook at all"
            raise GradescopeError(f"the submission must hold exactly one exercise notebook (found: {found})")
        chosen = notebooks[0]
    problem = own_file_problem(chosen, folder)
    if problem:
        raise GradescopeError(f"{chosen.name}: {problem}")
    if exercise is not None:
        wrong = exercise_mismatch(chosen, exercise)
        if wrong:
            raise GradescopeError(f"{chosen.name}: {wrong}")
    return chosen


def run_submission(root: Path, timeout: Optional[float] = None) -> Path:
    """Grade ``root/submission``'s notebook against ``root/source/course``; write ``root/results/results.json``.

    ``timeout`` bounds the whole grading run (default :data:`.grader.DEFAULT_TIMEOUT_S`); a task the run
    did not reach in time scores 0 and says so."""
    from .grader import DEFAULT_TIMEOUT_S, grade_notebook

    started = time.monotonic()
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
    try:
        report = grade_notebook(notebook, exercise=exercise, course=source / "course",
                                cell_timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout)
    except Exception as exc:  # noqa: BLE001 - Gradescope shows nothing without a results.json
        return _write_results(root, _refusal(f"{notebook.name}: the grader failed ({type(exc).__name__}); "
                                             "ask your instructor"))
    if report.error and not report.tasks:
        return _write_results(root, _refusal(f"{notebook.name}: {report.error.strip().splitlines()[0]}"))
    return _write_results(root, results_json(report, time.monotonic() - started))


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
    parser.add_argument("--torch-spec", default=DEFAULT_TORCH_SPEC, metavar="SPEC",
                        help=f"what setup.sh installs for torch (default: {DEFAULT_TORCH_SPEC})")
    parser.add_argument("--torch-index-url", default=os.environ.get("TORCH_INDEX_URL", ""), metavar="URL",
                        help="the index of PyTorch's CPU wheels, for setup.sh's pip (default: $TORCH_INDEX_URL, "
                             "else pip's own index)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``paged-kv gradescope``."""
    from .grader import InputError, PristineNotFoundError, find_course

    try:
        course = find_course(None, args.course)
        out = build_autograder(course, args.out, args.exercise, args.torch_spec,
                               getattr(args, "torch_index_url", "") or "")
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
    grade.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="bound on the whole grading run (default: the grader's limit of one submission)")
    args = parser.parse_args(argv)
    path = run_submission(args.root.resolve(), args.timeout)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
