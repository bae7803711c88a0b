"""Check a learner's allocator against the library, then let it run the real thing.

The contract a learner's class meets (pinned in the exercises' text too)::

    class MyAllocator:
        def __init__(self, num_blocks: int, block_size: int): ...
        num_free_blocks: int
        def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None
        def append_tokens(self, seq_id: int, num_tokens: int = 1) -> list[int]
        def free_sequence(self, seq_id: int) -> None
        def get_block_mapping(self, seq_id: int) -> list[int]
        def fork(self, parent_seq_id: int, child_seq_id: int) -> None

- :func:`check_allocator` compares such a class with :class:`PagedKVCacheAllocator`
  under random call sequences (hypothesis) and reports the shortest difference as code;
- :func:`engine_for` (``serve.py``) builds an :class:`~paged_kv_lib.engine.Engine` whose block
  bookkeeping is the learner's object, behind :class:`LearnerBackedAllocator` (``adapter.py``,
  its answers checked by ``contract.py``);
- :func:`simulate_with_classes` runs the simulated workload with a learner's class as one of the
  allocators.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AllocatorContractError", "LearnerBackedAllocator", "check_allocator", "engine_for", "simulate_with_classes"]

_WHERE = {
    "AllocatorContractError": ".contract",
    "LearnerBackedAllocator": ".adapter",
    "check_allocator": ".differential",
    "engine_for": ".serve",
    "simulate_with_classes": ".simulation",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: the differential test needs hypothesis, the engine needs torch.
    if name in _WHERE:
        from importlib import import_module

        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
