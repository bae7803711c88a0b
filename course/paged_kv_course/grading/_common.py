"""What every check shares: calling the learner's code, strict comparisons, the failure message, the success line.

A check (``checks_NN.py``) calls learner code only through :func:`call_learner` and
:func:`expect_raises`. Two things can come out of a check besides its ``PASSED NN.k`` line:

- :class:`TaskNotWrittenError`: the learner's code still raises ``NotImplementedError``;
  in a notebook it shows as the single line ``task NN.k is not written yet``;
- :class:`CheckFailure`: a wrong answer; in a notebook it shows as its message only (the
  call, what was expected, what came back, a hint), not as a traceback through this package.

Both are ``AssertionError`` subclasses, so anything that treats a failed assertion as a
failed check (pytest, the grader) keeps working. This module imports neither torch nor
IPython: tensors are recognised by their type's name and handled with the torch the
caller already imported.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, Union

PASS_PREFIX = "PASSED"
# Per-cell time limit of the grader, in seconds.
DEFAULT_CELL_TIMEOUT_S = 60.0
# How many characters of one value a failure message shows before it cuts.
SHOW_LIMIT = 600

_TASK_IN_MESSAGE = re.compile(r"\b[Tt]ask (\d{2}\.\d+)\b")

Errors = Union[Type[BaseException], Tuple[Type[BaseException], ...]]


class CheckFailure(AssertionError):
    """A check found a wrong answer; the message is the call, expected, got and a hint.

    IPython shows an exception through ``_render_traceback_`` when it has one, so a
    learner sees the message itself rather than a traceback into the grading code.
    """

    def _render_traceback_(self) -> List[str]:
        return str(self).splitlines() or [type(self).__name__]


class TaskNotWrittenError(CheckFailure, NotImplementedError):
    """The learner's code for a task still raises ``NotImplementedError`` (and so is one, too)."""

    def __init__(self, task: Optional[str] = None, detail: str = "") -> None:
        self.task = task
        self.detail = detail
        if task:
            message = f"task {task} is not written yet"
        else:
            message = "this task is not written yet" + (f" ({detail})" if detail else "")
        super().__init__(message)


def not_written(exc: BaseException) -> TaskNotWrittenError:
    """The one-line error for a ``NotImplementedError`` raised by learner code; names the task when its message does."""
    text = str(exc)
    found = _TASK_IN_MESSAGE.search(text)
    return TaskNotWrittenError(found.group(1) if found else None, "" if found else f"NotImplementedError: {text}".rstrip(": "))


def passed(task: str) -> None:
    """Print the one fixed success line of a task."""
    print(f"{PASS_PREFIX} {task}")


# ---------------------------------------------------------------------------------------
# Showing values


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is exactly a ``torch.Tensor`` (no subclass), without importing torch."""
    kind = type(value)
    return kind.__name__ == "Tensor" and kind.__module__ == "torch"


def show(value: Any) -> str:
    """A value as a failure message prints it: tensors with their values, dtype and shape; long text cut."""
    if is_tensor(value):
        torch = sys.modules["torch"]
        with _print_options(torch):
            body = repr(value.detach().cpu())
        text = f"{body} (dtype={value.dtype}, shape={tuple(value.shape)})"
        if "dtype=" in body:
            text = f"{body} (shape={tuple(value.shape)})"
    elif isinstance(value, str) and value.startswith(("a ", "an ", "it ", "nothing")) and "\n" not in value:
        text = value  # a description ("a ValueError"), not a value
    else:
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a learner's broken __repr__ must not hide the failure
            text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    if len(text) > SHOW_LIMIT:
        text = text[:SHOW_LIMIT] + f" ... ({len(text) - SHOW_LIMIT} more characters)"
    return text


class Shown(str):
    """Text that already shows values (several tensors laid out by a check): printed as it is, not quoted."""

    def __repr__(self) -> str:
        return str(self)


class _print_options:
    """Short, exact tensor printing inside failure messages (restores the caller's options)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.saved: Optional[dict] = None

    def __enter__(self) -> None:
        options = self.torch._tensor_str.PRINT_OPTS
        self.saved = dict(precision=options.precision, threshold=options.threshold,
                          edgeitems=options.edgeitems, linewidth=options.linewidth, sci_mode=options.sci_mode)
        self.torch.set_printoptions(precision=6, threshold=64, edgeitems=4, linewidth=100)

    def __exit__(self, *exc: Any) -> None:
        assert self.saved is not None
        self.torch.set_printoptions(**self.saved)


def fail(call: str, expected: Any, got: Any, hint: str = "") -> CheckFailure:
    """The failure to raise: the call, what was expected, what came back (tensors printed), and a hint."""
    message = f"{call}\n  expected: {_indent(show(expected))}\n  got:      {_indent(show(got))}"
    if hint:
        message += f"\n  hint: {hint}"
    return CheckFailure(message)


def _indent(text: str) -> str:
    return text.replace("\n", "\n            ")


# ---------------------------------------------------------------------------------------
# Strict comparison


def is_int(value: Any) -> bool:
    """A real int: not a bool, not an int subclass (one that claims to equal everything)."""
    return type(value) is int


def same(expected: Any, got: Any) -> bool:
    """Strict equality: the same types all the way down (an int is not a bool, a list not a tuple),
    tensors with the same dtype, shape and values; a float may come back as an equal int."""
    if is_tensor(expected):
        if not is_tensor(got) or got.dtype != expected.dtype or got.shape != expected.shape:
            return False
        torch = sys.modules["torch"]
        return bool(torch.equal(got.cpu(), expected.cpu()))
    kind = type(expected)
    if kind is float and type(got) in (float, int):
        return got == expected
    if type(got) is not kind:
        return False
    if kind in (list, tuple):
        return len(got) == len(expected) and all(same(e, g) for e, g in zip(expected, got))
    if kind is dict:
        return got.keys() == expected.keys() and all(same(expected[k], got[k]) for k in expected)
    if kind.__name__ == "deque" and kind.__module__ == "collections":
        return len(got) == len(expected) and all(same(e, g) for e, g in zip(expected, got))
    return bool(got == expected)


def expect_equal(call: str, expected: Any, got: Any, hint: str = "") -> None:
    """Raise :func:`fail` unless ``got`` is strictly the same as ``expected`` (see :func:`same`)."""
    if not same(expected, got):
        if not is_tensor(expected) and type(got) is not type(expected) and not (
            type(expected) is float and type(got) is int
        ):
            hint = hint or f"return a {type(expected).__name__}, not a {type(got).__name__}"
        raise fail(call, expected, got, hint)


def expect_type(call: str, got: Any, kind: type, hint: str = "") -> None:
    """The learner's value must be exactly of type ``kind`` (no subclass)."""
    if type(got) is not kind:
        raise fail(call, f"a {kind.__name__}", got, hint or f"return a {kind.__name__}, not a {type(got).__name__}")


def expect_tensor(call: str, got: Any, dtype: Any = None, shape: Optional[Sequence[int]] = None, hint: str = "") -> None:
    """The learner's value must be a ``torch.Tensor`` with this dtype and shape (when given)."""
    if not is_tensor(got):
        raise fail(call, "a torch.Tensor", got, hint or f"return a tensor, not a {type(got).__name__}")
    if dtype is not None and got.dtype != dtype:
        raise fail(call, f"a tensor of dtype {dtype}", got, hint or f"the result has dtype {got.dtype}, not {dtype}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        raise fail(call, f"a tensor of shape {tuple(shape)}", got, hint or f"the result has shape {tuple(got.shape)}")


# ---------------------------------------------------------------------------------------
# Calling learner code


def call_learner(fn: Callable[..., Any], args: Sequence[Any], call: str, expected: Any, **kwargs: Any) -> Any:
    """Run the learner's function on ``args``.

    ``NotImplementedError`` becomes :class:`TaskNotWrittenError` (one line); any other
    exception becomes a failure showing the call, what was expected and the error.
    """
    try:
        return fn(*args, **kwargs)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except Exception as exc:  # the learner's bug, reported as a failed check
        raise fail(call, expected, f"it raised {type(exc).__name__}: {exc}",
                   "your code raised instead of returning; read the error") from None


def expect_raises(fn: Callable[..., Any], args: Sequence[Any], call: str, errors: Errors, hint: str) -> BaseException:
    """The learner's function must raise one of ``errors`` for these arguments; returns the error."""
    names = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
    try:
        got = fn(*args)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except errors as exc:
        return exc
    except Exception as exc:
        raise fail(call, f"a {names}", f"it raised {type(exc).__name__}: {exc}", hint) from None
    raise fail(call, f"a {names}", f"it returned {show(got)}", hint)


# Set by the judge while a check runs: sends a probe into the learner's kernel (None: call it here).
PROBE_RUNNER: Optional[Callable[..., Any]] = None


def run_probe(probe: Callable[..., Any], *args: Any) -> Any:
    """Ask a question about identity or aliasing (a function of :mod:`.probes`) where the objects live.

    In a notebook this is a plain call. Under official grading the judge sends the probe
    into the learner's kernel (when an argument is one of the learner's objects there) and
    returns its plain answer, so a check that needs identity gives the grader the same
    verdict as the notebook.
    """
    if PROBE_RUNNER is not None:
        return PROBE_RUNNER(probe, *args)
    return probe(*args)


def under_judge(value: Any) -> bool:
    """Whether ``value`` is the judge's stand-in for a learner object (official grading), not the object itself.

    Figures a check prints only for the learner to read (nobody reads them under the grader) are
    skipped then, when they would cost many calls into the learner's kernel.
    """
    from ..stand_in import is_stand_in

    return is_stand_in(value)
