"""``AllocatorAfter02``: the learner's ``MyAllocator`` as it stands once exercise 02 is done.

A learner stuck on exercise 02 starts exercise 03 from here. It keeps the books of a paged
pool (no tensors) in the attributes every later exercise builds on:

* ``block_size``, ``num_blocks``;
* ``free``: a ``collections.deque`` of free block ids, the head handed out next;
* ``ref_counts``: a list, one entry per block: how many tables hold it;
* ``tables``: sequence id -> list of block ids, in logical order;
* ``lengths``: sequence id -> tokens the sequence holds.

Exercise 02 has no sharing, so ``free_sequence`` returns every block of the sequence at once;
exercise 03 makes it count references. Methods of later exercises raise ``NotImplementedError``.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any, Deque, Dict, List, Sequence, Set, Tuple

from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import (
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidTypeError,
    OutOfBlocksError,
    PositionError,
    SequenceStateError,
    UnknownSequenceError,
)

__all__ = ["AllocatorAfter02"]


def _plain_int(value: Any, name: str) -> int:
    """``value`` as an int; a bool (which would count as 0 or 1) or a float is refused with a TypeError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return operator.index(value)


def _whole_number(value: Any, name: str, least: int) -> int:
    """``value`` as an int of at least ``least`` (ValueError below it, TypeError for other types)."""
    number = _plain_int(value, name)
    if number < least:
        raise InvalidArgumentError(f"{name} must be at least {least}, got {number}")
    return number


class AllocatorAfter02:
    """Bookkeeping of a paged KV pool: allocate, look up, grow by a block, give back (no sharing yet)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = _whole_number(num_blocks, "num_blocks", 1)
        self.block_size = _whole_number(block_size, "block_size", 1)
        self.free: Deque[int] = deque(range(self.num_blocks))
        self.ref_counts: List[int] = [0] * self.num_blocks
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def take_blocks(self, count: int) -> List[int]:
        """Pop ``count`` ids off the head of the free queue, each now held by one table: the one way out of it."""
        count = _whole_number(count, "count", 0)
        if count > len(self.free):
            raise OutOfBlocksError(count, len(self.free), f"take {count} blocks")
        taken = [self.free.popleft() for _ in range(count)]
        for block_id in taken:
            self.ref_counts[block_id] = 1
        return taken

    def _table(self, seq_id: int) -> List[int]:
        if seq_id not in self.tables:
            raise UnknownSequenceError(f"sequence {seq_id!r} holds no blocks")
        return self.tables[seq_id]

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        """Give a new sequence the blocks for its prompt, from the head of the free queue; refusals change nothing."""
        count = _whole_number(num_prompt_tokens, "num_prompt_tokens", 0)
        if seq_id in self.tables:
            raise DuplicateSequenceError(f"sequence {seq_id!r} already holds blocks")
        wanted = cdiv(count, self.block_size)
        if wanted > len(self.free):
            raise OutOfBlocksError(wanted, len(self.free), f"allocate sequence {seq_id}")
        self.tables[seq_id] = self.take_blocks(wanted)
        self.lengths[seq_id] = count

    def allocate_batch(self, requests: Sequence[Tuple[int, int]]) -> None:
        """Admit every ``(seq_id, num_prompt_tokens)`` request in order, or none: the first refusal is raised."""
        claimed: Set[int] = set()
        wanted = 0
        for seq_id, tokens in requests:
            count = _whole_number(tokens, "num_prompt_tokens", 0)
            if seq_id in self.tables or seq_id in claimed:
                raise DuplicateSequenceError(f"sequence {seq_id!r} is live already or earlier in the batch")
            claimed.add(seq_id)
            wanted += cdiv(count, self.block_size)
            if wanted > len(self.free):
                raise OutOfBlocksError(wanted, len(self.free), f"admit the batch up to sequence {seq_id}")
        for seq_id, tokens in requests:
            self.allocate_for_sequence(seq_id, tokens)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A new list of the sequence's block ids, in logical order."""
        return self._table(seq_id)[:]

    def append_block_to_sequence(self, seq_id: int) -> int:
        """Reserve one more (empty) block for a sequence whose blocks are all full; returns its id."""
        table = self._table(seq_id)
        if self.lengths[seq_id] < len(table) * self.block_size:
            raise SequenceStateError(f"sequence {seq_id!r} still has an empty slot in its last block")
        if not self.free:
            raise OutOfBlocksError(1, 0, f"append a block to sequence {seq_id}")
        (block_id,) = self.take_blocks(1)
        table.append(block_id)
        return block_id

    def block_of(self, seq_id: int, position: int) -> int:
        """The physical block that holds token ``position`` of the sequence (an exercise 02 task of an earlier round)."""
        table = self._table(seq_id)
        where = _plain_int(position, "position")
        if not 0 <= where < self.lengths[seq_id]:
            raise PositionError(f"position {position} holds no token: sequence {seq_id!r} holds {self.lengths[seq_id]}")
        return table[where // self.block_size]

    def free_sequence(self, seq_id: int) -> None:
        """Give back every block of the sequence, last block first, to the tail of the free queue (no sharing yet)."""
        if seq_id not in self.tables:
            return
        released = self.tables.pop(seq_id)
        del self.lengths[seq_id]
        for block_id in reversed(released):
            self.ref_counts[block_id] = 0
            self.free.append(block_id)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        raise NotImplementedError("Task 03.1: fork is what exercise 03 adds; write it in your subclass")

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        raise NotImplementedError("Task 05.2: append_tokens is what exercise 05 adds; write it in your subclass")
