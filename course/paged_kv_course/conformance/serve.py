"""``engine_for``: serve the tiny model with a learner's allocator doing the block bookkeeping.

It builds the learner's object if given the class, puts it behind
:class:`~paged_kv_course.conformance.adapter.LearnerBackedAllocator` (an
:class:`~paged_kv_lib.protocols.EngineAllocator`) and hands that to an ordinary
:class:`~paged_kv_lib.engine.Engine`.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from paged_kv_lib.engine import Engine
from ..stand_in import is_stand_in_class
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError
from paged_kv_lib.model import TinyTransformer
from .adapter import LearnerBackedAllocator

__all__ = ["engine_for"]


def engine_for(model: TinyTransformer, allocator: Any, **engine_options: Any) -> Engine:
    """An :class:`~paged_kv_lib.engine.Engine` whose block bookkeeping is ``allocator``, a learner's object.

    ``allocator`` is a fresh instance of a class meeting the contract in
    :mod:`paged_kv_course.conformance`, or the class itself (then pass ``num_blocks`` and
    ``block_size``, and it is built here). The library keeps the K/V; the learner's object
    decides every block id. Options: ``num_blocks``, ``block_size`` (when the object has no
    such attributes), ``num_cpu_blocks`` (a CPU pool for ``preemption_mode="swap"``), and
    ``enable_prefix_caching=True`` (the object's ``allocate_for_sequence`` takes ``token_ids``
    and returns the prompt tokens it found cached), and every :class:`Engine` option. The
    engine's allocator is ``engine.allocator``.
    """
    num_blocks = engine_options.pop("num_blocks", None)
    block_size = engine_options.pop("block_size", None)
    num_cpu_blocks = engine_options.pop("num_cpu_blocks", 0)
    prefix_caching = bool(engine_options.pop("enable_prefix_caching", False))
    if prefix_caching and not _takes_token_ids(allocator):
        raise InvalidArgumentError(
            "prefix caching (enable_prefix_caching=True) needs an allocator whose allocate_for_sequence "
            "takes token_ids (exercise 06) and returns how many prompt tokens it found cached"
        )
    if _is_class(allocator):
        if num_blocks is None or block_size is None:
            raise InvalidTypeError(f"engine_for({getattr(allocator, '__name__', 'a class')}) builds the allocator: "
                                   "pass num_blocks=... and block_size=...")
        allocator = allocator(num_blocks, block_size)
    backed = LearnerBackedAllocator(
        allocator, model, num_blocks=_attribute(allocator, "num_blocks", num_blocks),
        block_size=_attribute(allocator, "block_size", block_size), num_cpu_blocks=num_cpu_blocks,
        prefix_caching=prefix_caching,
    )
    return Engine(model, backed, **engine_options)


def _attribute(inner: Any, name: str, given: Optional[int]) -> Any:
    """``given`` if passed, else the learner's object's attribute ``name`` (checked as a count by the adapter)."""
    if given is not None:
        return given
    value = getattr(inner, name, None)
    if value is None:
        raise InvalidTypeError(
            f"engine_for cannot tell the allocator's {name}: give the object a `{name}` attribute, "
            f"or pass {name}=... to engine_for"
        )
    return value


def _is_class(allocator: Any) -> bool:
    """Whether the learner handed over their class (to be built here) rather than an instance.

    Under official grading the class is the judge's stand-in for an object that lives in the
    learner's kernel; the stand-in records the kind of that object (``builtins.type`` for a class).
    """
    return isinstance(allocator, type) or is_stand_in_class(allocator)


def _takes_token_ids(allocator: Any) -> bool:
    """Whether the allocator's ``allocate_for_sequence`` accepts a ``token_ids`` keyword."""
    method = getattr(allocator, "allocate_for_sequence", None)
    if method is None:
        return False
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "token_ids" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
