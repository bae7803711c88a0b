"""Hidden cases: checks that official grading adds to a task and that the release does not ship.

An instructor keeps them in the course checkout as ``exercises/hidden/NN.py`` (``paged-kv
release`` leaves the folder out). Each case is a function in the style of a check
(it fails with :func:`._common.fail` or an assertion, and prints its task's ``PASSED``
line), marked with :func:`case`; its parameters name the learner's globals it is given::

    @case("02.3", points=1, hint="try a block size other than 16")
    def small_blocks(BlockTable):
        ...

The grader reads the marks without importing the file (:func:`read_cases`); the judge
runs each case after the visible check cells of its task, outside the learner's kernel,
like any check. A case adds its ``points`` to its task's total; a failed case shows as
"hidden case N of task NN.k failed" and its hint, never its code or its message. A
learner's own check cells run only the visible checks.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

from .notebook_tasks import TASK_ID

HIDDEN_DIR = "hidden"
MODULE_PREFIX = "paged_kv_hidden_"


class HiddenCaseError(ValueError):
    """A hidden-case file the grader cannot use (not Python, a malformed mark): one line."""


def case(task: str, points: float = 1, hint: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function as a hidden case of ``task`` worth ``points``; ``hint`` is what a learner reads
    when it fails (say what to try, not the case itself). The function is returned unchanged."""
    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        function.__hidden_case__ = (task, points, hint)  # type: ignore[attr-defined]
        return function

    return mark


@dataclass(frozen=True)
class HiddenCase:
    """One marked function of a hidden-case file: its task, points, hint and the learner globals it takes."""

    task: str
    function: str
    params: Tuple[str, ...]
    points: float
    hint: str
    path: Path

    @property
    def module(self) -> str:
        """The name the judge loads the case's file under."""
        return MODULE_PREFIX + self.path.stem

    def source(self) -> str:
        """The check cell the judge runs for this case (imports plus one call, like a visible check)."""
        return f"from {self.module} import {self.function}\n{self.function}({', '.join(self.params)})"


def failure_line(task: str, number: int, hint: str) -> str:
    """What a report says of a failed hidden case: its number and hint only."""
    return f"hidden case {number} of task {task} failed" + (f": {hint}" if hint else "")


def read_cases(path: Path) -> List[HiddenCase]:
    """The cases marked in one hidden-case file, in file order, read from its syntax tree (the file is
    not imported here; the judge loads it)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise HiddenCaseError(f"{path}: cannot read the hidden cases ({exc})") from None
    found: List[HiddenCase] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "case":
                found.append(_one_case(path, node, decorator))
    return found


def _one_case(path: Path, node: ast.FunctionDef, mark: ast.Call) -> HiddenCase:
    where = f"{path}:{node.lineno} ({node.name})"
    try:
        args = [ast.literal_eval(a) for a in mark.args]
        kwargs = {str(k.arg): ast.literal_eval(k.value) for k in mark.keywords}
    except ValueError:
        raise HiddenCaseError(f"{where}: @case takes literal arguments") from None
    task = args[0] if args else kwargs.get("task")
    points = args[1] if len(args) > 1 else kwargs.get("points", 1)
    hint = args[2] if len(args) > 2 else kwargs.get("hint", "")
    if not isinstance(task, str) or not TASK_ID.match(task) or task[:2] != path.stem[:2]:
        raise HiddenCaseError(f"{where}: task {task!r} is not a task NN.k of exercise {path.stem[:2]}")
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
        raise HiddenCaseError(f"{where}: points {points!r}; use a number >= 0")
    if not isinstance(hint, str):
        raise HiddenCaseError(f"{where}: hint {hint!r} is not a string")
    params = node.args
    if params.vararg or params.kwarg or params.kwonlyargs or params.posonlyargs or params.defaults:
        raise HiddenCaseError(f"{where}: a hidden case takes plain parameters, each a learner's global")
    return HiddenCase(task, node.name, tuple(a.arg for a in params.args), float(points), hint, path.resolve())


def case_file(folder: Path, exercise: str) -> Path:
    """Where the hidden cases of ``exercise`` (``NN_topic``) live in a folder of hidden cases."""
    return folder / f"{exercise[:2]}.py"


def cases_for(exercise: str, folder: Optional[Union[str, Path]] = None, submission: Optional[Path] = None,
              course: Optional[Union[str, Path]] = None) -> List[HiddenCase]:
    """The hidden cases of ``exercise``: from ``folder`` when given, else from the course's
    ``exercises/hidden/`` (none when the course has no such folder, as in a release)."""
    if folder is None:
        from .pristine import InputError, PristineNotFoundError, find_course

        try:
            folder = find_course(submission, Path(course) if course is not None else None) / "exercises" / HIDDEN_DIR
        except (PristineNotFoundError, InputError):
            return []
    path = case_file(Path(folder), exercise)
    return read_cases(path) if path.is_file() else []


def load_module(name: str, path: str) -> None:
    """In the judge: load a hidden-case file as module ``name`` so its check cells can import it."""
    import importlib.util
    import sys

    if not name.startswith(MODULE_PREFIX) or name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the hidden cases {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
