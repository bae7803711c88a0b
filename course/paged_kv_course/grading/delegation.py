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
import functools
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Set, Tuple

from paged_kv_course.stand_in import is_stand_in

_HERE = Path(__file__).resolve().parent


def forbidden_modules(exercise: str) -> Tuple[str, ...]:
    """The modules exercise ``exercise`` ("03", or "03_the_allocator") forbids; () when it names none."""
    return _module_tuple(exercise, "FORBIDDEN")


def _module_tuple(exercise: str, name: str) -> Tuple[str, ...]:
    """The tuple of module names ``name`` in ``checks_NN.py``, read from its source; () when absent."""
    number = exercise[:2]
    if not number.isdigit():
        raise ValueError(f"exercise {exercise!r} does not start with its two-digit number")
    path = _HERE / f"checks_{number}.py"
    if not path.is_file():
        return ()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = ast.literal_eval(node.value)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{path.name}: {name} must be a tuple of module names, not {value!r}")
            return tuple(value)
    return ()


def kernel_stubbed_modules(exercise: str) -> Tuple[str, ...]:
    """The forbidden modules that are stubs in the learner's kernel while ``exercise`` is graded.

    That is :func:`forbidden_modules` less the check module's ``KERNEL_NEEDS``: forbidden modules
    whose code the checks' own objects need inside the kernel (a library allocator a check hands to
    the learner's function, a package whose import uses one). A solution that uses one of those is
    still refused by the scan of its cell and by the check in the notebook.
    """
    needs = _module_tuple(exercise, "KERNEL_NEEDS")
    return tuple(m for m in forbidden_modules(exercise) if not is_forbidden(m, needs))


def is_forbidden(module: str, forbidden: Tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``forbidden`` or inside one of those packages."""
    return any(module == name or module.startswith(name + ".") for name in forbidden)


def exercise_number(name: str) -> str:
    """The two-digit number of an exercise, a check module or a task: "06_sharing", "checks_06", "06.1" -> "06"."""
    stem = name.rsplit(".", 1)[-1] if name.startswith(("paged_kv_lib.", "paged_kv_course.")) else name
    stem = stem[len("checks_"):] if stem.startswith("checks_") else stem
    number = stem[:2]
    if not number.isdigit():
        raise ValueError(f"{name!r} names no exercise (expected NN_topic, checks_NN or NN.k)")
    return number


def forbidden_line(module: str, exercise: str) -> str:
    """The one line a solution gets for using code defined in ``module``, which ``exercise`` forbids.

    The static scan, the in-notebook probe and the grade all print this line, so a learner
    reads the same reason in JupyterLab and in the grade. It names the module that defines
    what was used (where a name was imported from can differ: a package re-exports it).
    """
    number = exercise_number(exercise)
    return (f"uses {module}: library code that implements what exercise {number} grades, so a solution "
            "may not use it (write it yourself; starters of earlier exercises are allowed)")


DYNAMIC_WHY = "a solution reaches library code only through plain imports, so the grader can tell what it uses"


def dynamic_line(what: str, why: str = DYNAMIC_WHY) -> str:
    """The one line a solution gets for reaching into modules by a computed name (``what`` says how)."""
    return f"uses {what}: {why} (import what you need by name)"


# ---------------------------------------------------------------------------------------
# The in-notebook probe: a check cell in JupyterLab says what the grade will say

_LIBRARY = "paged_kv_lib"
_NOT_LEARNER = {"builtins", "torch", "triton", "numpy", "IPython", "ipykernel", "nbformat", "functools", "typing"}
_MAX_DEPTH = 8
_MAX_ITEMS = 64


def _module_of(value: Any) -> Optional[str]:
    """The module that defines a class, function or module (``None`` for other values)."""
    kind = type(value)  # type(), not isinstance: a stand-in's __class__ is never read
    if issubclass(kind, types.ModuleType):
        return value.__name__
    if issubclass(kind, (type, types.FunctionType, types.BuiltinFunctionType)):
        module = getattr(value, "__module__", None)
        return module if isinstance(module, str) else None
    return None


def _is_learner_module(module: Optional[str]) -> bool:
    """Code the learner wrote (a notebook's ``__main__``, their own files): the probe looks inside it."""
    if not module:
        return False
    if module == "__main__" or module.startswith("__main__."):
        return True
    top = module.split(".")[0]
    return not (top == _LIBRARY or top in _NOT_LEARNER or top in sys.stdlib_module_names or top.startswith("_"))


def _code_names(code: types.CodeType) -> Set[str]:
    """Every global or attribute name a code object and the code nested in it mention."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


class _Probe:
    """One walk over a check's learner arguments; ``found`` is the module of the first forbidden thing."""

    def __init__(self, forbidden: Tuple[str, ...]) -> None:
        self.forbidden = forbidden
        self.seen: Set[int] = set()
        self.found: Optional[str] = None

    def hit(self, module: str) -> bool:
        if self.found is None and is_forbidden(module, self.forbidden):
            self.found = module
        return self.found is not None

    def defined(self, value: Any) -> bool:
        """Whether ``value`` itself (a class, function or module) is defined in a forbidden module."""
        module = _module_of(value)
        if module is None:
            return False
        return self.hit(module)

    def visit(self, value: Any, depth: int = 0) -> None:
        if self.found is not None or depth > _MAX_DEPTH or id(value) in self.seen:
            return
        self.seen.add(id(value))
        kind = type(value)
        if is_stand_in(value):
            return  # the judge's stand-ins for learner objects: never touched (their attributes are remote)
        if self.defined(value):
            return
        if issubclass(kind, types.ModuleType):
            return
        if issubclass(kind, type):
            self.visit_class(value, depth)
        elif issubclass(kind, types.FunctionType):
            self.visit_function(value, depth)
        elif issubclass(kind, types.MethodType):
            self.visit(value.__func__, depth + 1)
            self.visit(value.__self__, depth + 1)
        elif issubclass(kind, (staticmethod, classmethod)):
            self.visit(value.__func__, depth + 1)
        elif issubclass(kind, property):
            for part in (value.fget, value.fset, value.fdel):
                self.visit(part, depth + 1)
        elif issubclass(kind, functools.partial):
            self.visit(value.func, depth + 1)
            for item in (*value.args, *value.keywords.values()):
                self.visit(item, depth + 1)
        elif issubclass(kind, (list, tuple, set, frozenset)):
            for item in list(value)[:_MAX_ITEMS]:
                self.visit(item, depth + 1)
        elif issubclass(kind, dict):
            for item in list(value.values())[:_MAX_ITEMS]:
                self.visit(item, depth + 1)
        elif kind.__module__.split(".")[0] == "triton":
            inner = getattr(value, "fn", None)  # a @triton.jit kernel wraps the learner's Python function
            if isinstance(inner, types.FunctionType):
                self.visit(inner, depth + 1)
        elif not issubclass(kind, (int, float, complex, str, bytes, bool, type(None))):
            self.visit_instance(value, depth)

    def visit_class(self, cls: type, depth: int) -> None:
        for base in cls.__mro__[1:]:
            if self.defined(base):
                return
        if not _is_learner_module(cls.__module__):
            return
        for klass in cls.__mro__:
            if _is_learner_module(klass.__module__):
                for item in list(vars(klass).values()):
                    self.visit(item, depth + 1)

    def visit_function(self, fn: types.FunctionType, depth: int) -> None:
        if not _is_learner_module(fn.__module__):
            return
        names = _code_names(fn.__code__)
        for name in sorted(names):
            if "." in name and is_forbidden(name, self.forbidden):  # an import inside the body names its module
                loaded = sys.modules.get(name)
                taken = [vars(loaded)[n] for n in sorted(names) if loaded is not None and n in vars(loaded)]
                defined = [_module_of(v) for v in taken if _module_of(v)]
                self.hit(str(defined[0]) if defined and is_forbidden(str(defined[0]), self.forbidden) else name)
        scope = fn.__globals__
        for name in sorted(names):
            if name in scope:
                value = scope[name]
                self.visit(value, depth + 1)
                if isinstance(value, types.ModuleType):
                    self.visit_module_names(value, names)
        for cell in fn.__closure__ or ():
            try:
                self.visit(cell.cell_contents, depth + 1)
            except ValueError:
                continue  # an empty cell
        for item in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
            self.visit(item, depth + 1)

    def visit_module_names(self, module: types.ModuleType, names: Set[str], level: int = 0) -> None:
        """``pk.prefix_cache.block_key`` in a function: the attributes it names on a module it reads."""
        if level > 3:
            return
        for name in sorted(names):
            value = module.__dict__.get(name)
            if value is None or value is module:
                continue
            if self.defined(value):
                return
            if isinstance(value, types.ModuleType):
                self.visit_module_names(value, names, level + 1)

    def visit_instance(self, value: Any, depth: int) -> None:
        self.visit(type(value), depth + 1)
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except AttributeError:
            return
        if isinstance(attributes, dict):
            for item in list(attributes.values())[:_MAX_ITEMS]:
                self.visit(type(item), depth + 1)
                self.visit(item, depth + 1)


def first_forbidden(values: Iterable[Any], forbidden: Tuple[str, ...]) -> Optional[str]:
    """The module of the first thing among ``values`` (and what they reach) defined in ``forbidden``; else None."""
    probe = _Probe(tuple(forbidden))
    for value in values:
        probe.visit(value)
        if probe.found is not None:
            break
    return probe.found


def guarded(check: Callable[..., Any], exercise: str) -> Callable[..., Any]:
    """``check`` (of exercise ``exercise``), first failing in one line on learner code that uses forbidden modules.

    The wrapper keeps the check's name, signature and docstring; it changes nothing for a
    learner whose code is their own.
    """
    forbidden = forbidden_modules(exercise_number(exercise))
    if not forbidden or not callable(check):
        return check
    from ._common import CheckFailure

    @functools.wraps(check)
    def checked(*args: Any, **kwargs: Any) -> Any:
        found = first_forbidden((*args, *kwargs.values()), forbidden)
        if found is not None:
            raise CheckFailure(forbidden_line(found, exercise))
        return check(*args, **kwargs)

    return checked
