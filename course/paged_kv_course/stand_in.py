"""Whether a value is the judge's stand-in for a learner's object (official grading), in one place.

Under ``paged-kv grade`` a check receives proxies (``paged_kv_course.grading.remote.Remote``)
for the learner's objects, which stay in the learner's kernel. Code that must treat those
differently (skip a costly figure, build a class the learner handed over, leave a proxy's
remote attributes alone) asks here instead of sniffing module names. This module imports
nothing, so any part of the library can use it.
"""

from __future__ import annotations

from typing import Any, Optional

MARK = "__paged_kv_stand_in__"


def is_stand_in(value: Any) -> bool:
    """Whether ``value`` is the judge's stand-in for a learner's object (read on its class, never forwarded)."""
    return type(value).__dict__.get(MARK) is True


def stand_in_kind(value: Any) -> Optional[str]:
    """The kind of object a stand-in stands for (``"builtins.type"`` for a class), or None for other values."""
    if not is_stand_in(value):
        return None
    kind = object.__getattribute__(value, "_kind")
    return kind if isinstance(kind, str) else None


def is_stand_in_class(value: Any) -> bool:
    """Whether ``value`` is a stand-in for a class (the learner handed over a class, to be built by the caller)."""
    return stand_in_kind(value) == "builtins.type"
