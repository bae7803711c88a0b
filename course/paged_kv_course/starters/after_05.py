"""The learner's ``MyAllocator`` once exercise 05 is done: exercise 03's class plus growth on demand.

Exercise 05 adds two capabilities: ``append_tokens`` (a sequence grows by some tokens and takes
exactly the blocks its new positions start) and ``can_append`` (the scheduler's question: can
these sequences all grow by that much in one step). No copy-on-write yet: that is exercise 06.
"""

from __future__ import annotations

import math
from typing import Iterable, List

from paged_kv_lib._validate import as_fraction
from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import InvalidArgumentError, OutOfBlocksError, UnknownSequenceError

from .after_03 import AllocatorAfter03

__all__ = ["AllocatorAfter05"]


class AllocatorAfter05(AllocatorAfter03):
    """Exercise 03's allocator (allocate, free by ref counts, mapping, fork) plus growth on demand."""

    def _new_blocks_for(self, seq_id: int, num_tokens: int) -> int:
        """How many blocks growing ``seq_id`` by ``num_tokens`` adds: its new length's blocks beyond those held."""
        if seq_id not in self.tables:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        if type(num_tokens) is not int or num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        held = len(self.tables[seq_id])
        return max(0, cdiv(self.lengths[seq_id] + num_tokens, self.block_size) - held)

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        """Grow ``seq_id`` by ``num_tokens``; returns the ids of the blocks it took, in order ([] when none)."""
        missing = self._new_blocks_for(seq_id, num_tokens)
        if missing > len(self.free):
            raise OutOfBlocksError(missing, len(self.free), f"grow sequence {seq_id} by {num_tokens} tokens")
        taken = self.take_blocks(missing)
        self.tables[seq_id].extend(taken)
        self.lengths[seq_id] += num_tokens
        return taken

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` at once and leave ``ceil(watermark * num_blocks)`` free."""
        reserve = math.ceil(as_fraction(watermark, "watermark") * self.num_blocks)
        listed = list(seq_ids)
        if len(set(listed)) != len(listed):
            raise InvalidArgumentError(f"a sequence is listed twice in {listed}")
        return len(self.free) - self._step_cost(listed, num_tokens) >= reserve

    def _step_cost(self, seq_ids: List[int], num_tokens: int) -> int:
        """Free blocks growing every listed sequence by ``num_tokens`` takes (later exercises add copies)."""
        return sum(self._new_blocks_for(seq_id, num_tokens) for seq_id in seq_ids)
