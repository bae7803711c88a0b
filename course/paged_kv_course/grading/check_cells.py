"""Check cells as the judge reads them: imports plus one call ``check_x(name, ...)`` with plain arguments.

The judge never runs a check cell's source; it parses the call (:func:`parse_check_cell`),
imports the check function itself and passes proxies for the names the call gives.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple


class CheckCellError(ValueError):
    """A pristine check cell that is not imports plus one call with plain arguments."""



@dataclass(frozen=True)
class CheckCall:
    """A parsed check cell: the check function's module and name, and its arguments."""

    module: str
    function: str
    args: Tuple[Tuple[str, Any], ...]  # ("name", global) or ("value", literal)
    kwargs: Tuple[Tuple[str, Tuple[str, Any]], ...]


def imported_names(sources: List[str]) -> Dict[str, Tuple[str, str]]:
    """``name -> (module, attribute)`` for every ``from M import a [as b]`` in trusted cells."""
    names: Dict[str, Tuple[str, str]] = {}
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def parse_check_cell(source: str, known: Dict[str, Tuple[str, str]]) -> CheckCall:
    """The one call of a check cell; imports allowed before it. Raises :class:`CheckCellError`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CheckCellError(f"the check cell is not valid Python: {exc}") from None
    known = dict(known)
    known.update(imported_names([source]))
    calls = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    if len(calls) != 1 or not isinstance(calls[0], ast.Expr) or not isinstance(calls[0].value, ast.Call):
        raise CheckCellError("a check cell must be imports plus one call check_x(...)")
    call = calls[0].value
    if not isinstance(call.func, ast.Name) or call.func.id not in known:
        raise CheckCellError("the check cell calls a function that no 'from ... import' names")
    module, function = known[call.func.id]

    def argument(node: ast.AST) -> Tuple[str, Any]:
        if isinstance(node, ast.Name):
            return ("name", node.id)
        try:
            return ("value", ast.literal_eval(node))
        except ValueError:
            raise CheckCellError(f"check argument {ast.unparse(node)!r} is neither a name nor a literal") from None

    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise CheckCellError("check calls take plain arguments")
    return CheckCall(module, function, tuple(argument(a) for a in call.args),
                     tuple((str(k.arg), argument(k.value)) for k in call.keywords))
