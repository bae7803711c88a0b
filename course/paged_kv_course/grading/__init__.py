"""Exercise checks and the notebook grader.

Each exercise notebook ``exercises/NN_topic.ipynb`` has check cells that call a function
from here, ``check_<task>(...)``. A check runs the learner's code on several cases and
raises ``AssertionError`` with a message the learner can act on (the call, what was
expected, what came back, a hint); on success it prints one fixed line.

Check functions live in ``checks_NN.py`` modules (one per exercise); every public
``check_*`` name in them is available here. A check module is imported the first time one
of its names is used, so ``from paged_kv_course.grading import check_x`` loads only the
module that defines ``check_x`` (and the grader's own modules load no check at all).

Whether a solution leans on the library's own answer is the grader's question, asked of the
solution cells' text (:mod:`.delegation`); the checks here judge behaviour only.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any, Dict, List

from ._common import PASS_PREFIX, passed


def _check_index() -> Dict[str, str]:
    """``check_* name -> checks_NN module``, read from the modules' source without importing them."""
    index: Dict[str, str] = {}
    for path in sorted(Path(__file__).parent.glob("checks_*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # importing it would fail the same way; the name simply is not offered
        for node in tree.body:
            names: List[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.ImportFrom):
                names = [a.asname or a.name for a in node.names]
            for name in names:
                if name.startswith("check_"):
                    index.setdefault(name, path.stem)
    return index


_CHECKS = _check_index()

__all__ = ["PASS_PREFIX", "passed", *sorted(_CHECKS)]


def __getattr__(name: str) -> Any:
    module = _CHECKS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_CHECKS))
