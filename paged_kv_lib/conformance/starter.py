"""Where a learner who is stuck on an earlier exercise can start the next one.

"Your allocator" is built across exercises 02, 03, 05 and 06. Each later exercise adds
methods to the class of the earlier ones. A learner whose earlier class is unfinished
can inherit from these instead (each leaves the methods of later exercises unwritten):

* :class:`StarterAllocator`: exercise 02's part (allocation, the mapping, the free
  count), the base of exercise 03;
* :class:`SharingStarterAllocator`: plus exercise 03's ``free_sequence`` and ``fork``,
  the base of exercise 05;
* :class:`GrowingStarterAllocator`: plus exercise 05's growth (``append_tokens`` without
  copy-on-write), the base of exercise 06.

Their state is plain and public, so a subclass can use it: ``free`` (a deque of free
block ids, head handed out first), ``ref_counts`` (block id -> number of tables holding
it), ``tables`` (seq id -> list of block ids) and ``lengths`` (seq id -> tokens held).
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List

from .._validate import as_count, as_seq_id
from ..errors import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError

__all__ = ["GrowingStarterAllocator", "SharingStarterAllocator", "StarterAllocator"]


class StarterAllocator:
    """Bookkeeping-only block allocator: exercise 02's part of the contract (allocate, map, count)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.free: Deque[int] = deque(range(self.num_blocks))
        self.ref_counts: List[int] = [0] * self.num_blocks
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def take_blocks(self, count: int) -> List[int]:
        """Pop ``count`` blocks off the head of the free queue, each now held once (the caller checked there are enough)."""
        taken = [self.free.popleft() for _ in range(count)]
        for block_id in taken:
            self.ref_counts[block_id] = 1
        return taken

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        """Give a new sequence ``ceil(num_prompt_tokens / block_size)`` blocks from the head of the free queue."""
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        if seq_id in self.tables:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")
        needed = -(-num_prompt_tokens // self.block_size)
        if needed > len(self.free):
            raise OutOfBlocksError(needed, len(self.free), f"allocate sequence {seq_id}")
        self.tables[seq_id] = self.take_blocks(needed)
        self.lengths[seq_id] = num_prompt_tokens

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        if seq_id not in self.tables:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        return list(self.tables[seq_id])

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        raise NotImplementedError("Task 05.2: append_tokens is what exercise 05 adds; write it in your subclass")

    def free_sequence(self, seq_id: int) -> None:
        raise NotImplementedError("Task 03.2: free_sequence is what exercise 03 adds; write it in your subclass")

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        raise NotImplementedError("Task 03.1: fork is what exercise 03 adds; write it in your subclass")


class SharingStarterAllocator(StarterAllocator):
    """:class:`StarterAllocator` plus exercise 03's part: freeing by ref counts, and ``fork``."""

    def free_sequence(self, seq_id: int) -> None:
        """Drop the sequence's reference to each block, last block first; blocks nobody holds rejoin the tail."""
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.lengths[seq_id]
        for block_id in reversed(table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Give the child the parent's blocks; each gains a holder (nothing is copied)."""
        if parent_seq_id not in self.tables:
            raise UnknownSequenceError(f"sequence {parent_seq_id!r} is not allocated")
        child_seq_id = as_seq_id(child_seq_id)
        if child_seq_id in self.tables:
            raise DuplicateSequenceError(f"sequence {child_seq_id} is already allocated")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]
        for block_id in self.tables[child_seq_id]:
            self.ref_counts[block_id] += 1


class GrowingStarterAllocator(SharingStarterAllocator):
    """:class:`SharingStarterAllocator` plus exercise 05's growth: new blocks on demand, no copy-on-write yet."""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        """Grow by ``num_tokens``; returns the blocks taken. Writes into the last block even if shared (no copy-on-write)."""
        if seq_id not in self.tables:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        num_tokens = as_count(num_tokens, "num_tokens")
        table = self.tables[seq_id]
        new_length = self.lengths[seq_id] + num_tokens
        missing = max(0, -(-new_length // self.block_size) - len(table))
        if missing > len(self.free):
            raise OutOfBlocksError(missing, len(self.free), f"grow sequence {seq_id} to {new_length} tokens")
        taken = self.take_blocks(missing)
        table.extend(taken)
        self.lengths[seq_id] = new_length
        return taken
