"""What every check shares: the success line and the shape of a failure message."""

from __future__ import annotations

from typing import Any

PASS_PREFIX = "PASSED"


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
