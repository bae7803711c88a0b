"""Debug tasks are passed by repairing the given code: how far a solution strays from it, in lines.

A debug task hands the learner a colleague's code with a stated number of planted bugs. Its
checks compare behaviour; this module adds the other half of the contract: the solution is
the given code with its bugs fixed, not a rewrite. It compares the functions the task gave
with the learner's functions of the same role, after ``ast`` has normalised both (comments,
blank lines, docstrings and formatting do not count), and counts changed lines with
:mod:`difflib`: a replaced run of lines counts as the longer of its two sides, an inserted
or deleted line as one. A task's text states the limit; a solution over it earns 0 with a
line saying why, whatever its behaviour.

The given code is held here (a test holds it equal to the notebooks' provided cells), never
read from the learner's notebook, which the learner could edit.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ._common import CheckFailure, under_judge


@dataclass(frozen=True)
class Given:
    """What one debug task provides: the code, the name of the unit it defines, the unit the
    learner writes, and how many changed lines a repair may take."""

    task: str
    given: str  # the provided cell's code
    given_name: str  # the provided function or class
    learner_name: str  # the solution's function (or the class the check receives)
    limit: int
    methods: Tuple[str, ...] = ()  # for a class: the methods compared


def _body_lines(node: ast.AST) -> List[str]:
    """The statements of a function, docstring dropped, as ``ast.unparse`` writes them, one line each."""
    body = list(getattr(node, "body", []))
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    lines: List[str] = []
    for statement in body:
        lines.extend(line.strip() for line in ast.unparse(statement).splitlines() if line.strip())
    return lines


def functions_in(source: str) -> Dict[str, List[ast.AST]]:
    """Every function (at any depth: methods, nested functions) of ``source``, by name."""
    found: Dict[str, List[ast.AST]] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).append(node)
    return found


def class_bases_in(source: str) -> List[str]:
    """The base names of every class ``source`` defines (``Base`` of ``class X(Base)`` and of ``module.Base``)."""
    names: List[str] = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Name):
                    names.append(base.id)
                elif isinstance(base, ast.Attribute):
                    names.append(base.attr)
    return names


def changed_lines(given: List[str], learner: List[str]) -> int:
    """Lines changed from ``given`` to ``learner``: per difflib opcode, a replace counts its longer side,
    an insert or delete its lines."""
    count = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, given, learner, autojunk=False).get_opcodes():
        if op != "equal":
            count += max(i2 - i1, j2 - j1)
    return count


def repair_distance(spec: Given, learner_source: str) -> Tuple[int, str]:
    """(changed lines, what was compared) between the given code and the learner's source text.

    A function task compares the given function's body with the learner's function of
    ``learner_name`` (the first one found; the name of the ``def`` itself does not count). A
    class task compares each of ``methods``: a method the learner writes is compared with the
    given one; one the learner leaves out counts as unchanged when a class of the source
    inherits from the given class, and as deleted otherwise.
    """
    given = functions_in(spec.given)
    learner = functions_in(learner_source)
    if not spec.methods:
        mine = learner.get(spec.learner_name) or []
        ours = _body_lines(given[spec.given_name][0])
        if not mine:
            return len(ours), f"no function {spec.learner_name} was found"
        return changed_lines(ours, _body_lines(mine[0])), f"{spec.learner_name} against {spec.given_name}"
    inherits = spec.given_name in class_bases_in(learner_source)
    total = 0
    for method in spec.methods:
        ours = _body_lines(given[method][0])
        mine = learner.get(method) or []
        if mine:
            total += changed_lines(ours, _body_lines(mine[-1]))
        elif not inherits:
            total += len(ours)
    return total, f"the methods {', '.join(spec.methods)} against {spec.given_name}'s"


# The judge sets this, before each check cell, to the solution cell text of that cell's own task (official
# grading: the learner's objects are out of reach there); in a notebook the text is read from the objects.
SOURCE_OF: Optional[str] = None


def source_text(value: Any) -> str:
    """The source text of a learner's function, or of the methods a class defines itself (with its bases)."""
    if inspect.isclass(value):
        bases = ", ".join(b.__name__ for b in value.__mro__[1:-1])
        parts = [f"class {value.__name__}({bases}):"]
        for attribute in vars(value).values():
            function = getattr(attribute, "fget", attribute)  # a property's getter
            if inspect.isfunction(function):
                parts.append(textwrap.indent(textwrap.dedent(inspect.getsource(function)), "    "))
        return "\n".join(parts) + ("\n    pass\n" if len(parts) == 1 else "\n")
    return textwrap.dedent(inspect.getsource(value))


def solution_source(task: str, value: Any) -> Optional[str]:
    """The text a check reads for ``task``: the solution cell the judge holds under official grading
    (None where no judge set :data:`SOURCE_OF`), else the source of the learner's object itself."""
    if under_judge(value):
        return SOURCE_OF
    try:
        return source_text(value)
    except (OSError, TypeError) as exc:
        raise CheckFailure(
            f"{task}: the check reads the text of your solution and could not ({exc}); run the solution cell "
            "again, in this notebook") from None


def check_repair(spec: Given, value: Any) -> None:
    """Fail unless ``value`` (the learner's solution object) is the given code repaired within the limit.

    Prints one line with the count before the checks of behaviour run. Under official grading the
    text comes from :data:`SOURCE_OF`; without it there the rule is not applied (the judge owns
    reading the submission).
    """
    text = solution_source(spec.task, value)
    if text is None:
        return
    try:
        count, what = repair_distance(spec, text)
    except SyntaxError as exc:
        raise CheckFailure(f"{spec.task}: your solution's text does not parse: {exc}") from None
    line = (f"{spec.task}: {count} line{'s' if count != 1 else ''} changed from the given code "
            f"({what}; a repair changes at most {spec.limit})")
    if count > spec.limit:
        raise CheckFailure(
            f"{line}\n  hint: a rewrite, not a repair: this debug task is passed by fixing the given code in "
            f"place, and a solution that sets it aside earns 0 whatever it computes (start again from the "
            f"provided cell and change only the lines that hold the bugs)")
    print(line)


__all__ = ["Given", "changed_lines", "check_repair", "repair_distance", "solution_source", "source_text"]
