"""Argument checks shared by the library's public functions (each raises a typed error)."""

from __future__ import annotations

import operator
from array import array
from typing import Any, Iterable, List

from .errors import InvalidArgumentError, InvalidTypeError


def as_count(value: Any, name: str, *, minimum: int = 0) -> int:
    """Return ``value`` as an int >= ``minimum``, refusing bools, floats and other types."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = operator.index(value)
    if number < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {number}")
    return number


def as_seq_id(value: Any) -> int:
    """Sequence ids are plain ints (bools refused: ``True`` would alias sequence 1)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidTypeError(f"seq_id must be an int, got {type(value).__name__} {value!r}")
    return operator.index(value)


def as_iterable(value: Any, name: str) -> Iterable[Any]:
    """``value`` itself when it can be iterated (a list, a tuple, a generator), else a typed error."""
    if not isinstance(value, Iterable):
        raise InvalidTypeError(f"{name} must be an iterable of ints, got {type(value).__name__} {value!r}")
    return value


def as_fraction(value: Any, name: str) -> float:
    """Return ``value`` as a float in [0, 1] (bools and non-numbers refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number in [0, 1], got {type(value).__name__} {value!r}")
    if not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def as_token_ids(token_ids: Any, expected: int) -> List[int]:
    """Token ids as a list of ints, exactly ``expected`` of them, each fitting in 64 bits (no bools)."""
    if hasattr(token_ids, "tolist"):  # a tensor or an array
        token_ids = token_ids.tolist()
    try:
        values = list(token_ids)
        tokens = array("q", values).tolist()
    except TypeError:
        raise InvalidTypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}") from None
    except OverflowError:
        raise InvalidArgumentError("token_ids must fit in signed 64 bits") from None
    if bool in map(type, values):  # map and `in` run in C: cheap even for long prompts
        raise InvalidTypeError("token_ids must be ints, not bools")
    if len(tokens) != expected:
        raise InvalidArgumentError(f"got {len(tokens)} token_ids for {expected} tokens")
    return tokens
