"""Argument checks shared by the library's public functions (each raises a typed error)."""

from __future__ import annotations

import operator
from typing import Any


def as_count(value: Any, name: str, *, minimum: int = 0) -> int:
    """Return ``value`` as an int >= ``minimum``, refusing bools, floats and other types."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = operator.index(value)
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def as_seq_id(value: Any) -> int:
    """Sequence ids are plain ints (bools refused: ``True`` would alias sequence 1)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"seq_id must be an int, got {type(value).__name__} {value!r}")
    return operator.index(value)
