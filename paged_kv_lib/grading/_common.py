"""What every check shares: the success line and the shape of a failure message."""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple, Type, Union

PASS_PREFIX = "PASSED"
# Per-cell time limit of the grader, in seconds.
DEFAULT_CELL_TIMEOUT_S = 60.0


def passed(task: str) -> None:
    """Print the one fixed success line of a task (the grader and nbval look for it)."""
    print(f"{PASS_PREFIX} {task}")


def fail(call: str, expected: Any, got: Any, hint: str = "") -> AssertionError:
    """An AssertionError naming the call, what was expected, what came back, and a hint."""
    message = f"{call}\n  expected: {expected!r}\n  got:      {got!r}"
    if hint:
        message += f"\n  hint: {hint}"
    return AssertionError(message)


def expect_equal(call: str, expected: Any, got: Any, hint: str = "") -> None:
    """Raise :func:`fail` unless ``got == expected``."""
    if got != expected:
        raise fail(call, expected, got, hint)


Errors = Union[Type[BaseException], Tuple[Type[BaseException], ...]]


def call_learner(fn: Callable[..., Any], args: Sequence[Any], call: str, expected: Any, **kwargs: Any) -> Any:
    """Run the learner's function; an exception other than NotImplementedError becomes a failure."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's bug, reported as a failed check
        raise fail(call, expected, f"{type(exc).__name__}: {exc}",
                   "your function raised instead of returning; read the error above") from exc


def expect_raises(fn: Callable[..., Any], args: Sequence[Any], call: str, errors: Errors, hint: str) -> BaseException:
    """The learner's function must raise one of ``errors`` for these arguments; returns the error."""
    names = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
    try:
        got = fn(*args)
    except NotImplementedError:
        raise
    except errors as exc:
        return exc
    except Exception as exc:
        raise fail(call, f"a {names}", f"{type(exc).__name__}: {exc}", hint) from exc
    raise fail(call, f"a {names}", f"it returned {got!r}", hint)


def is_int(value: Any) -> bool:
    """A real int (bools are ints to Python, but not to a block count)."""
    return isinstance(value, int) and not isinstance(value, bool)
