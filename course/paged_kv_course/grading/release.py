"""``paged-kv release --out DIR``: the learner's course, without the solutions.

The release holds the lessons, the learner versions of the exercises (generated afresh
from the solutions, so they cannot be stale), a pristine copy of each learner version in
``exercises/pristine/`` (what ``paged-kv grade`` compares against in a released course),
the library and the course package (``course/``), the docs and the files that install them,
a README written for learners (no ``make test``: a release has no ``tests/``; links only to
pages the release holds), the course's ``.dockerignore`` (an image built from the release leaves
out ``.venv``, ``.git`` and caches; a course without one gets :data:`DOCKERIGNORE`), and one
workflow, ``.github/workflows/check.yml``, that runs ``make check`` on every push as feedback. GitHub Classroom's autograding is not written: the
application is sunset, and a score computed in the learner's own repository is the learner's to
change (they own the workflow, the Makefile and the library it runs), so credit comes from
Gradescope or the instructor's batch.

It leaves out ``exercises/solutions/``, ``tests/`` (whose planted-solution tests hold working
answers), ``exercises/hidden/`` (the hidden cases of official grading) and the instructors'
pages, ships the starter classes only of exercises before ``--assignment NN`` (a starter holds
the answer of its exercise), and refuses to finish if any released notebook still holds a
solution region. The instructor keeps the solutions in their own checkout and grades with
``paged-kv grade --course CHECKOUT``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

from .hidden import HIDDEN_DIR
from .notebook_tasks import BEGIN_MARKER, END_MARKER

# What a learner's course is made of, relative to the course folder.
RELEASED = ("lessons", "exercises", "paged_kv_lib", "course", "docs", "benchmarks", "scripts", "binder", "docker",
            "LICENSE", "pyproject.toml", "environment.yml", "Makefile", ".gitignore", ".dockerignore")
PRISTINE_DIR = "pristine"
# Instructor-only files inside released folders, relative to the course folder.
WITHHELD = ("docs/instructors.md", "docs/class.md")
STARTERS = Path("course") / "paged_kv_course" / "starters"
_SKIP_NAMES = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
PYTHON_VERSION = "3.11"
# The pages a learner's README links, when the release holds them.
LEARNER_DOCS = (("docs/exercises.md", "how the exercises work and are graded"),
                ("docs/platforms.md", "Colab, Binder, JupyterHub and VS Code; memory and GPUs"),
                ("docs/library.md", "the library you are building, piece by piece"),
                ("docs/course.md", "how the course is put together"))

CHECK_WORKFLOW = """# Written by `paged-kv release`: check the exercises on every push (feedback, not the grade).
# nbval runs every cell of your exercises; then the grader scores each task. Your grade comes from your
# instructor (Gradescope or their own grading run), not from this workflow, which you can change.
name: check
on: [push, pull_request, workflow_dispatch]
jobs:
  check:
    runs-on: ubuntu-latest
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
      - name: bubblewrap, the grader's sandbox
        run: sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap
      - name: make check
        run: make check CHECK_SUMMARY="$GITHUB_STEP_SUMMARY"
"""

# The repository's .dockerignore, for a course folder that has none (a test keeps the two the same).
DOCKERIGNORE = """# What stays out of an image built from this folder with docker/Dockerfile (a release, or a checkout
# with ALLOW_SOLUTIONS=1): environments, caches and run outputs, gigabytes a build would otherwise
# send and copy. `paged-kv release` copies this file into every release.
.git
.github
.venv
**/__pycache__
**/*.py[cod]
**/*.egg-info
**/.ipynb_checkpoints
.pytest_cache
.hypothesis
.mypy_cache
.ruff_cache
build
dist
bench-out
gpu-check-out
test-artifacts
"""

README = """# paged-kv: the course

A hands-on course on how LLM inference engines manage KV-cache memory with **paging**: lessons in
`lessons/`, graded exercises in `exercises/`, and the library they build in `paged_kv_lib/`.

## Start

```bash
make lab     # creates .venv, installs the course (JupyterLab, Triton), opens the lessons
make check   # runs every cell of your exercises (nbval), then the grader: one line per task
```

Both need Python 3.10 or newer and `make`. They install `TORCH_SPEC` (default `torch==2.13.0`);
the default Linux wheel of torch is the CUDA build, several GB: give pip PyTorch's CPU wheel index
with `TORCH_PIP_ARGS="--index-url URL"` (the URL from the install selector on PyTorch's site) for
the CPU build, or on a CUDA machine run `make install-lab TORCH_SPEC=torch`.

## Exercises

Work in `exercises/NN_topic.ipynb`, in the cells marked as yours; each check cell tells you what
passed. `make check EXERCISES="03"` checks one exercise;
`.venv/bin/paged-kv grade exercises/03_the_allocator.ipynb` prints one notebook's score table.
Every push runs `make check` in GitHub Actions (`.github/workflows/check.yml`) and puts the table
in the run's summary. That is feedback for you: the grade comes from your instructor, whose
grading may add hidden cases.
{docs}"""


class ReleaseError(RuntimeError):
    """The release cannot be built (one line for the command to print)."""


def starter_released(name: str, assignment: Optional[int]) -> bool:
    """Whether the starter module ``after_NN.py`` ships with a release handing out exercise ``assignment``."""
    if not (name.startswith("after_") and name.endswith(".py") and name[6:8].isdigit()):
        return True  # not a starter of one exercise (the package's __init__)
    return assignment is not None and int(name[6:8]) < assignment


def withheld_line(number: str) -> str:
    """The one line a learner reads where the course's class after exercise ``number`` is not released."""
    return (f"the course's class after {number} is not in this release: start from your own "
            f"(your class from exercise {number}, pasted or imported in its place)")


def placeholder_starter(source: Path) -> str:
    """A stand-in for a withheld starter module: importing it prints :func:`withheld_line` once, and each of
    its names (a class) raises that line as a :class:`RuntimeError` when used; it holds no answer."""
    import ast

    number = source.stem[len("after_"):]
    names: List[str] = []
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            names = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    line = withheld_line(number)
    body = "\n".join(f"{name} = _withheld({name!r})" for name in names)
    return f'''"""Not in this release: the course's class after exercise {number} is withheld while a later exercise is
handed out. Start from your own class of exercise {number}."""

LINE = {line!r}
print(LINE)


class StarterWithheld(RuntimeError):
    """Raised when a withheld starter is used."""


def _withheld(name):
    def refuse(*args, **kwargs):
        raise StarterWithheld(LINE)

    return type(name, (), {{"__init__": refuse, "__init_subclass__": classmethod(lambda cls, **kw: None),
                           "__getattr__": lambda self, attr: refuse()}})


__all__ = {names!r}
{body}
'''


def _write_placeholders(course: Path, staging: Path, assignment: Optional[int]) -> None:
    """A placeholder for every starter the release withholds, so that its import names it in one line."""
    for source in sorted((course / STARTERS).glob("after_*.py")):
        if not starter_released(source.name, assignment):
            (staging / STARTERS / source.name).write_text(placeholder_starter(source), encoding="utf-8")


def _ignorer(course: Path, assignment: Optional[int]) -> Callable[[str, List[str]], List[str]]:
    withheld = {(course / w).resolve() for w in WITHHELD}
    starters = (course / STARTERS).resolve()

    def ignore(folder: str, names: List[str]) -> List[str]:
        here = Path(folder).resolve()
        skip = [n for n in names if n in _SKIP_NAMES or n.endswith((".pyc", ".egg-info"))]
        skip += [n for n in names if (here / n) in withheld]
        if here.name == "exercises":
            skip += [n for n in names if n in ("solutions", PRISTINE_DIR, HIDDEN_DIR)]
        if here == starters:
            skip += [n for n in names if not starter_released(n, assignment)]
        return skip

    return ignore


def build_release(course: Path, out: Path, assignment: Optional[int] = None,
                  repo_url: Optional[str] = None) -> List[Path]:
    """Write the learner's course from ``course`` into ``out`` (which must not exist or be empty);
    return the files written. Starters ship only for exercises before ``assignment`` (none without it);
    ``repo_url`` (the class repository) goes into every notebook's Colab setup block and into the
    release's ``pyproject.toml`` (``[project.urls] Repository``), so the release names it everywhere."""
    from .generate import generate, solution_paths

    course = course.resolve()
    out = out.resolve()
    solutions = course / "exercises" / "solutions"
    if not solutions.is_dir():
        raise ReleaseError(f"{course}: no exercises/solutions/ folder (release from the instructor's checkout)")
    if out == course or course in out.parents:
        raise ReleaseError(f"--out {out}: must lie outside the course folder {course}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"--out {out}: exists and is not an empty folder")
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    ignore = _ignorer(course, assignment)
    try:
        for name in RELEASED:
            source = course / name
            if source.is_dir():
                shutil.copytree(source, staging / name, ignore=ignore)
            elif source.is_file():
                shutil.copy2(source, staging / name)
        _write_placeholders(course, staging, assignment)
        exercises = staging / "exercises"
        exercises.mkdir(exist_ok=True)
        generate(solutions, exercises)  # learner versions, fresh from the solutions
        if repo_url is not None:
            from paged_kv_course.setup_cell import apply

            _write_repository_url(staging / "pyproject.toml", repo_url)
            for notebook in sorted((staging / "lessons").glob("*.ipynb")) + sorted(exercises.glob("*.ipynb")):
                if '"cell_type": "code"' in notebook.read_text(encoding="utf-8"):  # nothing to set up otherwise
                    apply(notebook, repo_url)
        pristine = exercises / PRISTINE_DIR
        pristine.mkdir()
        for path in solution_paths(solutions):
            shutil.copy2(exercises / path.name, pristine / path.name)
        leaks = [p for p in staging.rglob("*.ipynb") if BEGIN_MARKER in p.read_text(encoding="utf-8")
                 or END_MARKER in p.read_text(encoding="utf-8")]
        if leaks:
            raise ReleaseError(f"{leaks[0].relative_to(staging)} still holds a solution region; not released")
        for withheld in ("solutions", HIDDEN_DIR):
            if (staging / "exercises" / withheld).exists():
                raise ReleaseError(f"exercises/{withheld}/ would be released")
        write_class_files(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p for p in out.rglob("*") if p.is_file())


def release_readme(release: Path) -> str:
    """The README of a release: how a learner starts and checks their work, linking only pages it holds."""
    docs = [f"- [{name}]({name}): {what}" for name, what in LEARNER_DOCS if (release / name).is_file()]
    return README.format(docs="\n## More\n\n" + "\n".join(docs) + "\n" if docs else "")


def readme_problems(release: Path) -> List[str]:
    """What a release's README gets wrong: a command the release cannot run, a link to a page it left out."""
    text = (release / "README.md").read_text(encoding="utf-8")
    problems = ["it tells learners to run `make test` (a release has no tests/)"] if "make test" in text else []
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" not in target and not (release / target).exists():
            problems.append(f"it links {target}, which the release leaves out")
    return problems


def _write_repository_url(pyproject: Path, repo_url: str) -> None:
    """Put ``repo_url`` in ``pyproject``'s ``Repository = "..."`` line (the placeholder's comment goes too)."""
    from paged_kv_course.setup_cell import check_url

    if not pyproject.is_file():
        return
    text = pyproject.read_text(encoding="utf-8")
    text = re.sub(r"(\[project\.urls\]\n)(?:#.*\n)*Repository = \"[^\"]*\"",
                  lambda m: f'{m.group(1)}# The class repository (written by `paged-kv release --repo-url`).\n'
                            f'Repository = "{check_url(repo_url)}"', text)
    pyproject.write_text(text, encoding="utf-8")


def placeholder_kept(release: Path) -> bool:
    """Whether a release's notebooks still clone the course's placeholder URL (no --repo-url given)."""
    from paged_kv_course.setup_cell import PLACEHOLDER_URL

    return any(PLACEHOLDER_URL in p.read_text(encoding="utf-8") for p in (release / "lessons").glob("*.ipynb"))


def write_class_files(release: Path) -> List[Path]:
    """Write a release's README and its check workflow, and a .dockerignore if the course copied none;
    refuse a README with a problem."""
    readme = release / "README.md"
    readme.write_text(release_readme(release), encoding="utf-8")
    problems = readme_problems(release)
    if problems:
        raise ReleaseError(f"README.md: {problems[0]}")
    folder = release / ".github" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    check = folder / "check.yml"
    check.write_text(CHECK_WORKFLOW.format(python=PYTHON_VERSION), encoding="utf-8")
    dockerignore = release / ".dockerignore"
    if not dockerignore.is_file():
        dockerignore.write_text(DOCKERIGNORE, encoding="utf-8")
    return [readme, check, dockerignore]


def register(subparsers: Any) -> None:
    """Add the ``release`` subcommand to the ``paged-kv`` command."""
    parser = subparsers.add_parser(
        "release",
        help="write the learner's course (lessons, exercises, library) without the solutions",
        description=(
            "Copy the course into DIR for learners: lessons, freshly generated learner versions of the "
            "exercises (and a pristine copy of each for `paged-kv grade`), the library, docs and install "
            "files; no exercises/solutions/, no tests/."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write the release")
    parser.add_argument("--course", type=Path, default=None, metavar="DIR",
                        help="the course checkout to release (default: found above the current folder)")
    parser.add_argument("--assignment", type=_exercise_number, default=None, metavar="NN",
                        help="the exercise being handed out: starter classes of the exercises before it ship "
                             "(default: none ship, since a starter holds its exercise's answer)")
    parser.add_argument("--repo-url", default=None, metavar="URL",
                        help="the class repository learners open on Colab: written into every notebook's setup "
                             "block (default: the course's own, from its package metadata)")
    parser.set_defaults(func=run)


def _exercise_number(text: str) -> int:
    if len(text) < 2 or not text[:2].isdigit() or (len(text) > 2 and text[2] != "_"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an exercise number such as 03 or 03_the_allocator")
    return int(text[:2])


def run(args: argparse.Namespace) -> int:
    """Entry point of ``paged-kv release``."""
    from .grader import InputError, PristineNotFoundError, find_course
    from paged_kv_course.setup_cell import SetupCellError
    from .notebook_tasks import ExerciseSpecError

    try:
        course = find_course(None, args.course)
        files = build_release(course, args.out, getattr(args, "assignment", None), getattr(args, "repo_url", None))
    except (ReleaseError, InputError, PristineNotFoundError, ExerciseSpecError, SetupCellError, OSError) as exc:
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {line}", file=sys.stderr)
        return 2
    notebooks = sum(1 for f in files if f.suffix == ".ipynb")
    assignment = getattr(args, "assignment", None)
    starters = (f"starters of exercises before {assignment:02d}" if assignment is not None
                else "no starters (pass --assignment NN to ship those of the exercises before NN)")
    print(f"released {course} to {args.out}: {len(files)} files, {notebooks} notebooks, no solutions, {starters}")
    if placeholder_kept(args.out):
        print("note: the notebooks' Colab block clones the course's placeholder repository URL: pass "
              "--repo-url URL (your class repository) to write yours into the release", file=sys.stderr)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m paged_kv_course.grading.release --out DIR``: the same as ``paged-kv release``."""
    parser = argparse.ArgumentParser(prog="paged-kv release")
    sub = parser.add_subparsers()
    register(sub)
    return run(parser.parse_args(["release", *(argv or sys.argv[1:])]))
