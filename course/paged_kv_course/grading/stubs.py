"""The learner kernel's view of the library while exercise NN is graded: forbidden modules become stubs.

A stub module can be imported and names can be imported from it (so ``import
paged_kv_lib`` and every allowed module still load), but each name it hands out refuses
any use (a call, an attribute, subclassing, an instance check, iteration...) with one
line: ``paged_kv_lib.X is not available while exercise NN is graded: it implements what
the exercise grades``. The error is ``ModuleUnavailableError``, a subclass of
``ImportError`` (a stub cannot import the library's errors: they may be stubbed too).

With bubblewrap, :func:`stage_library` writes a copy of the library whose forbidden files
*are* stubs (and whose forbidden packages hold no data files): the kernel sees only that
copy. With ``--sandbox none`` the runner calls :func:`install_hook` instead, an import hook
that hands out stubs; that is a convenience, not a security boundary (the learner's code
runs with the grader's permissions and can read the real files).

This file is loaded by path in the kernel (:mod:`.runner`); it imports nothing of the library.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import shutil
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

ERROR_NAME = "ModuleUnavailableError"

STUB_SOURCE = '''"""A stub: {module} is not available while exercise {exercise} is graded."""

_MESSAGE = {message!r}


class ModuleUnavailableError(ImportError):
    """A use of a library module that the exercise being graded forbids."""


def _refuse(*args, **kwargs):
    raise ModuleUnavailableError(_MESSAGE)


class _Unavailable:
    __slots__ = ("_stub_name",)

    def __init__(self, name):
        object.__setattr__(self, "_stub_name", name)

    def __getattribute__(self, name):
        if name in ("__class__", "__repr__", "__str__", "_stub_name"):
            return object.__getattribute__(self, name)
        _refuse()

    def __repr__(self):
        return "<not available: " + {module!r} + "." + object.__getattribute__(self, "_stub_name") + ">"

    __str__ = __repr__
    __call__ = __setattr__ = __delattr__ = __getitem__ = __setitem__ = __iter__ = __len__ = _refuse
    __bool__ = __contains__ = __instancecheck__ = __subclasscheck__ = __enter__ = __await__ = _refuse
    __add__ = __eq__ = __lt__ = __hash__ = __index__ = __int__ = __float__ = _refuse

    def __mro_entries__(self, bases):
        _refuse()


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)
'''


def message(module: str, exercise: str) -> str:
    """The one line a use of a stubbed module raises."""
    return (f"{module} is not available while exercise {exercise} is graded: "
            "it implements what the exercise grades")


def stub_source(module: str, exercise: str) -> str:
    """The source of the stub that stands for ``module`` while ``exercise`` (``NN``) is graded."""
    return STUB_SOURCE.format(module=module, exercise=exercise, message=message(module, exercise))


def _covered(module: str, forbidden: Sequence[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in forbidden)


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at ``path`` in the package folder ``root`` (its parent is on the path)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_library(package: Path, dest: Path, forbidden: Sequence[str], exercise: str) -> Tuple[str, ...]:
    """Copy the package folder ``package`` into ``dest`` (``dest/<name>/``), forbidden modules as stubs.

    Caches, compiled files and every non-Python file of a forbidden package are left out.
    Returns the modules that were stubbed. Files are world-readable (the kernel may run as
    another user)."""
    target = dest / package.name
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*"))
    stubbed = []
    for path in sorted(target.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
            continue
        name = module_name(target, path) if path.suffix == ".py" else module_name(target, path.parent / "__init__.py")
        if not _covered(name, forbidden):
            path.chmod(0o644)
            continue
        if path.suffix != ".py":
            path.unlink()
            continue
        path.write_text(stub_source(name, exercise), encoding="utf-8")
        path.chmod(0o644)
        stubbed.append(name)
    target.chmod(0o755)
    return tuple(stubbed)


class _StubLoader(importlib.abc.Loader):
    def __init__(self, exercise: str) -> None:
        self.exercise = exercise

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[Any]:
        return None

    def exec_module(self, module: Any) -> None:
        code = compile(stub_source(module.__name__, self.exercise), f"<stub of {module.__name__}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - the stub's own fixed source


class StubFinder(importlib.abc.MetaPathFinder):
    """An import hook (first on ``sys.meta_path``) that hands out stubs for the forbidden modules."""

    def __init__(self, forbidden: Sequence[str], exercise: str) -> None:
        self.forbidden = tuple(forbidden)
        self.loader = _StubLoader(exercise)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not _covered(fullname, self.forbidden):
            return None
        return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=True)


def install_hook(forbidden: Sequence[str], exercise: str) -> None:
    """Make every later import of a forbidden module give its stub (modules already imported are dropped)."""
    if not forbidden:
        return
    for name in list(sys.modules):
        if _covered(name, forbidden):
            del sys.modules[name]
    sys.meta_path.insert(0, StubFinder(forbidden, exercise))
