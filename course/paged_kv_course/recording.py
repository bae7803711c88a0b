"""Recording instruments of exercise 05's checks: a library allocator and model that log what reached them.

Kept apart from :mod:`.instruments` because they import the allocator, which exercise 06's kernel
does not have (there the allocator is a stub); see that module for why instruments live here.
"""

from __future__ import annotations

from typing import Any, List

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_lib.model import TinyTransformer


class RecordingAllocator(PagedKVCacheAllocator):
    """A ``PagedKVCacheAllocator`` with a log, ``events``, that :class:`RecordingModel` writes to.

    Under official grading the judge serves this allocator and the model (they never enter the
    learner's kernel), so the log is written in the judge and ``events`` is not lent.
    """

    __paged_kv_private__ = ("events",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: List[List[int]] = []


class RecordingModel(TinyTransformer):
    """The tiny transformer, logging the chunk lengths of every ``forward_paged`` call in the allocator."""

    def forward_paged(self, allocator, seq_ids, chunks, *, write=None):
        events = getattr(allocator, "events", None)
        if isinstance(events, list):
            events.append([len(c) for c in chunks])
        return super().forward_paged(allocator, seq_ids, chunks, write=write)
