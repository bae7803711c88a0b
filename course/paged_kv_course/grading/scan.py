"""A static scan of solution cells: what library code a solution reaches for, read without running it.

Official grading gives 0 to a task whose solution cell imports a module its exercise
forbids (``FORBIDDEN`` in ``checks_NN.py``, see :mod:`.delegation`), or a name defined in
one, or reaches into modules by a computed name (``__import__``, ``importlib``,
``sys.modules``, ``getattr``/``vars`` on a module, ``globals()``, ``exec``/``eval``/
``compile``), which a scan could not follow. The source is parsed with :mod:`ast` and
never run; where a library name comes from is asked of the library itself (trusted code,
imported here only when a solution names it), so a re-export such as
``from paged_kv_lib import PagedKVCacheAllocator`` is traced to ``paged_kv_lib.allocator``.

The lines are those of :func:`.delegation.forbidden_line` and :func:`.delegation.dynamic_line`,
the same the in-notebook probe (:mod:`.probe`) prints in a check cell.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import types
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .delegation import dynamic_line, forbidden_line, forbidden_modules, is_forbidden

LIBRARY = "paged_kv_lib"
PACKAGES = (LIBRARY, "paged_kv_course")  # the library and the course package: what a scan traces
_MAGIC = re.compile(r"^\s*[%!]")
_CODE_FROM_TEXT = {"exec", "eval", "compile"}
_WHY_TEXT = "code built from a string cannot be checked"


def origin(module: str, attr: str) -> Tuple[str, bool]:
    """Where ``module.attr`` is defined: ``(dotted module, whether it is itself a module)``.

    For library modules the library is asked (``attr``'s ``__module__``); other modules
    (torch, the standard library) are taken at their word: ``(module, False)``.
    """
    dotted = f"{module}.{attr}"
    if module.split(".")[0] not in PACKAGES:
        return module, False
    try:
        if importlib.util.find_spec(dotted) is not None:
            return dotted, True
    except (ImportError, ValueError, AttributeError):
        pass
    try:
        value = getattr(importlib.import_module(module), attr)
    except Exception:  # noqa: BLE001 - a name the library lacks: the kernel fails on it by itself
        return module, False
    if isinstance(value, types.ModuleType):
        return value.__name__, True
    defined = getattr(value, "__module__", None) if isinstance(value, (type, types.FunctionType)) else None
    return (defined if isinstance(defined, str) else module), False


def defining_module(module: str, attr: str) -> str:
    """Where ``module.attr`` is defined, read from the library's source without importing ``module``.

    Follows ``from .x import attr`` re-exports (a few levels); a submodule is its own answer.
    Used for modules a solution may not import, which the grader's process need not load either.
    """
    for _ in range(4):
        try:
            spec = importlib.util.find_spec(module)  # imports the packages above ``module``, not ``module``
        except (ImportError, ValueError, AttributeError):
            return module
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return module
        for folder in spec.submodule_search_locations or ():
            if os.path.isfile(os.path.join(folder, f"{attr}.py")) or os.path.isfile(
                    os.path.join(folder, attr, "__init__.py")):
                return f"{module}.{attr}"
        try:
            with open(spec.origin, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
        except (OSError, SyntaxError, UnicodeDecodeError):
            return module
        package = module if spec.submodule_search_locations is not None else module.rpartition(".")[0]
        source = _imported_from(tree, attr, package)
        if source is None:
            return module
        module, attr = source
    return module


def _imported_from(tree: ast.Module, attr: str, package: str) -> Optional[Tuple[str, str]]:
    """``(module, name)`` a module's top level imports ``attr`` from, or None when it defines it itself."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == attr:
                    base = package.split(".")
                    if node.level > 1:
                        base = base[: len(base) - node.level + 1]
                    prefix = ".".join(base) if node.level else ""
                    target = ".".join(p for p in (prefix, node.module or "") if p)
                    return target, alias.name
    return None


class _Scanner(ast.NodeVisitor):
    """Walks one cell; ``lines`` collects one line per finding, in source order, without repeats."""

    def __init__(self, forbidden: Tuple[str, ...], exercise: str) -> None:
        self.forbidden, self.exercise = forbidden, exercise
        self.modules: Dict[str, str] = {}  # local name -> the module it is bound to
        self.lines: List[str] = []
        self.imports_done = False  # the second pass skips imports (the first pass read them)
        self.names_used: set = set()

    def report(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def forbid(self, module: str) -> bool:
        """Report using code defined in ``module`` when the exercise forbids it; whether it did."""
        if is_forbidden(module, self.forbidden):
            self.report(forbidden_line(module, self.exercise))
            return True
        return False

    # --- imports ---------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        if self.imports_done:
            return
        for alias in node.names:
            parts = alias.name.split(".")
            for depth in range(1, len(parts) + 1):
                if self.forbid(".".join(parts[:depth])):
                    break
            self.modules[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if self.imports_done or node.level or not node.module:
            return
        module = node.module
        if is_forbidden(module, self.forbidden):
            for alias in node.names:
                defined = module if alias.name == "*" else defining_module(module, alias.name)
                self.forbid(defined if is_forbidden(defined, self.forbidden) else module)
            return
        for alias in node.names:
            if alias.name == "*":
                self.star(module)
                continue
            defined, is_module = origin(module, alias.name)
            if self.forbid(defined):
                continue
            if is_module:
                self.modules[alias.asname or alias.name] = defined
            elif module in ("importlib", "sys") or (module, alias.name) == ("builtins", "__import__"):
                self.modules[alias.asname or alias.name] = f"{module}.{alias.name}"

    def star(self, module: str) -> None:
        """``from M import *`` of a library module: the names the cell uses that M would bring in."""
        if module.split(".")[0] not in PACKAGES:
            return
        try:
            loaded = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a module that does not import: the kernel fails on it by itself
            return
        offered = getattr(loaded, "__all__", None) or [n for n in vars(loaded) if not n.startswith("_")]
        for name in sorted(set(offered) & self.names_used):
            defined, _ = origin(module, name)
            self.forbid(defined)

    # --- names reached through modules -------------------------------------------------

    def module_of(self, node: ast.AST) -> Optional[str]:
        """The dotted module an expression names (``pk.course`` with ``import paged_kv_lib as pk``), else None."""
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.module_of(node.value)
            if base is None or base in ("importlib", "sys"):
                return None
            defined, is_module = origin(base, node.attr)
            return defined if is_module else None
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = self.module_of(node.value)
        if base is not None and self.attribute(base, node.attr):
            return  # one line for one use: the chain's inner names are not reported again
        self.generic_visit(node)

    def attribute(self, base: str, attr: str) -> bool:
        """Report ``base.attr`` (``base`` a module) when it reaches too far; whether it was reported."""
        before = len(self.lines)
        self._attribute(base, attr)
        return len(self.lines) > before

    def _attribute(self, base: str, attr: str) -> None:
        if self.forbid(base):
            return
        if base == "importlib" or base.startswith("importlib."):
            if attr != "import_module":
                self.report(dynamic_line(f"{base}.{attr}"))
            return
        if base == "sys" and attr == "modules":
            self.report(dynamic_line("sys.modules"))
            return
        if attr == "__dict__":
            self.report(dynamic_line(f"{base}.__dict__"))
            return
        defined, is_module = origin(base, attr)
        self.forbid(defined)

    def visit_Name(self, node: ast.Name) -> None:
        bound = self.modules.get(node.id)
        if bound == "sys.modules":
            self.report(dynamic_line("sys.modules"))
        elif node.id == "__builtins__":
            self.report(dynamic_line("__builtins__"))
        elif bound is not None and bound.startswith("importlib.") and bound != "importlib.import_module":
            self.report(dynamic_line(bound))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        bound = self.modules.get(name) if name else None
        target = f"{self.module_of(func.value)}.{func.attr}" if isinstance(func, ast.Attribute) else bound
        first = node.args[0] if node.args else None
        text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        if name == "__import__" or bound == "builtins.__import__" or target == "importlib.import_module":
            how = "__import__" if target != "importlib.import_module" else "importlib.import_module"
            if text is None:
                self.report(dynamic_line(f"{how} with a computed name"))
            else:
                parts = text.split(".")
                for depth in range(1, len(parts) + 1):
                    if self.forbid(".".join(parts[:depth])):
                        break
        elif name in _CODE_FROM_TEXT and bound is None:
            self.report(dynamic_line(f"{name}()", _WHY_TEXT))
        elif name == "globals" and not node.args:
            self.report(dynamic_line("globals()"))
        elif name == "vars" and not node.args:
            self.report(dynamic_line("vars()"))
        elif name == "vars" and first is not None and self.module_of(first) is not None:
            self.report(dynamic_line(f"vars({self.module_of(first)})"))
        elif name in ("getattr", "hasattr") and first is not None and len(node.args) > 1:
            base = self.module_of(first)
            key = node.args[1]
            if base is not None:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    self.attribute(base, key.value)
                else:
                    self.report(dynamic_line(f"{name}({base}, ...) with a computed name"))
        self.generic_visit(node)


def scan_source(source: str, forbidden: Sequence[str], exercise: str) -> List[str]:
    """One line per forbidden import, forbidden name or dynamic reach in ``source`` (a cell); [] when clean.

    IPython lines (``%magic``, ``!shell``) are blanked first; a cell that still does not
    parse gives [] (running it fails on its own, with Python's message).
    """
    text = "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    scanner = _Scanner(tuple(forbidden), exercise)
    scanner.names_used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in ast.walk(tree):  # bind every import first: a use may come before its import in the text
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            scanner.visit(node)
    scanner.imports_done = True
    scanner.visit(tree)
    return scanner.lines


def delegation_lines(exercise: str, task_sources: Mapping[str, str]) -> Dict[str, List[str]]:
    """``task -> lines`` for every task of ``exercise`` ("06_sharing") whose solution source reaches too far.

    Tasks with nothing to report are left out, so an empty dict means a clean submission.
    """
    forbidden = forbidden_modules(exercise)
    out: Dict[str, List[str]] = {}
    for task, source in task_sources.items():
        lines = scan_source(source, forbidden, exercise)
        if lines:
            out[task] = lines
    return out


def zero_reported(results: Sequence[Any], lines: Mapping[str, List[str]]) -> List[Any]:
    """Grader results with every reported task failed on its first line (all lines in its detail)."""
    for result in results:
        found = lines.get(result.task)
        if found:
            result.passed, result.failure, result.detail = False, found[0], "\n".join(found)
            for check in getattr(result, "checks", []):
                check.passed = False  # no partial credit either
    return list(results)
