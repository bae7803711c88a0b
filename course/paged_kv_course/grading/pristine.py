"""Which exercise a submission is, and the pristine learner version it is graded against.

The course is found from the notebook's own path (the nearest folder above it with
``exercises/``), or given with ``--course``; exercise names must be ``NN_topic``. In the
course repository learners edit ``exercises/NN_topic.ipynb`` in place, so the pristine
version is generated from ``exercises/solutions/``; a released course keeps untouched
copies in ``exercises/pristine/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Sequence, Union

from nbformat import NotebookNode

from .generate import make_learner_version
from .notebook_tasks import BEGIN_MARKER, META_KEY, cell_task, read_notebook

EXERCISE_NAME = re.compile(r"^\d{2}_[A-Za-z0-9][A-Za-z0-9_]*$")


class PristineNotFoundError(FileNotFoundError):
    """No pristine exercise notebook matches a submission."""


class InputError(ValueError):
    """A bad input to the grader (an exercise name, an option): one line, exit status 2."""




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


def submission_exercise(submission: Path, sub_nb: Optional[NotebookNode], exercise: Optional[str] = None) -> str:
    """The exercise a submission is graded as; refuses names that are not ``NN_topic`` and a notebook
    of another exercise saved under this one's name (:class:`InputError`)."""
    name = exercise or submission.stem.split("__", 1)[-1]
    if not EXERCISE_NAME.match(name) and sub_nb is not None and exercise is None:
        name = exercise_name(submission, sub_nb)
    check_exercise_name(name)
    wrong = other_exercise(sub_nb, name) if sub_nb is not None else ""
    if wrong:
        raise InputError(f"{submission.name}: {wrong}")
    return name


def other_exercise(nb: NotebookNode, name: str) -> str:
    """A line saying so when ``nb`` is a notebook of another exercise than ``name`` (by its metadata, or by
    the tasks it holds), '' when it is this one's or cannot tell. Task ids are the learner's text: shown
    with ``repr`` unless they are digits."""
    meta = nb.metadata.get(META_KEY)
    claimed = meta.get("exercise") if isinstance(meta, dict) else None
    numbers = sorted({task.split(".")[0] for task in find_tasks_lenient(nb)})
    submit = f"submit your exercises/{name}.ipynb"
    if isinstance(claimed, str) and EXERCISE_NAME.match(claimed) and claimed != name:
        return f"this is a notebook of exercise {claimed}, not of exercise {name}; {submit}"
    if numbers and numbers != [name[:2]]:
        listed = ", ".join(n if n.isdigit() else repr(n) for n in numbers)
        return f"this notebook holds tasks of exercise {listed}, not of exercise {name}; {submit}"
    return ""


def find_tasks_lenient(nb: NotebookNode) -> List[str]:
    """Task ids named by a notebook's metadata, without validating the notebook."""
    out = []
    for cell in nb.cells:
        found = cell_task(cell)
        if found is not None:
            out.append(found[0])
    return out


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
