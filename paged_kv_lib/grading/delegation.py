"""What a learner's solution for exercise NN may not lean on: the library code that implements what NN grades.

Each ``checks_NN.py`` names those modules in a module-level tuple ``FORBIDDEN`` (dotted
names; a package covers its submodules). Official grading hides them from the learner's
kernel and a scan of the solution cells reports reaching for them; the check cells in a
notebook say the same thing, so a grade never contradicts what the learner saw.

The names are read from the check module's source, without importing it, so the grader
can ask before any check (or torch) is loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Tuple

_HERE = Path(__file__).resolve().parent


def forbidden_modules(exercise: str) -> Tuple[str, ...]:
    """The modules exercise ``exercise`` ("03", or "03_the_allocator") forbids; () when it names none."""
    number = exercise[:2]
    if not number.isdigit():
        raise ValueError(f"exercise {exercise!r} does not start with its two-digit number")
    path = _HERE / f"checks_{number}.py"
    if not path.is_file():
        return ()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "FORBIDDEN" for t in targets) and node.value is not None:
            value = ast.literal_eval(node.value)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{path.name}: FORBIDDEN must be a tuple of module names, not {value!r}")
            return tuple(value)
    return ()


def is_forbidden(module: str, forbidden: Tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``forbidden`` or inside one of those packages."""
    return any(module == name or module.startswith(name + ".") for name in forbidden)
