"""``AllocatorAfter03``: the learner's ``MyAllocator`` once exercise 03 is done (sharing and its own checker).

On top of :class:`~paged_kv_course.starters.after_02.AllocatorAfter02`: ``fork`` (a child shares
every block of its parent), a ``free_sequence`` that counts references (a shared block goes back only
when its last holder lets go), and ``check_invariants``, which raises ``AssertionError`` when the
books disagree. A learner stuck on exercise 03 starts exercise 05 from here.
"""

from __future__ import annotations

from collections import Counter
from typing import List

from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import DuplicateSequenceError
from .after_02 import AllocatorAfter02, _plain_int

__all__ = ["AllocatorAfter03"]


class AllocatorAfter03(AllocatorAfter02):
    """:class:`AllocatorAfter02` plus sharing: ``fork``, reference-counted ``free_sequence``, ``check_invariants``."""

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make ``child_seq_id`` a new sequence holding the parent's blocks (shared, nothing copied)."""
        shared = self._table(parent_seq_id)
        _plain_int(child_seq_id, "child_seq_id")
        if child_seq_id in self.tables:
            raise DuplicateSequenceError(f"cannot fork onto sequence {child_seq_id!r}: it already holds blocks")
        for block_id in shared:
            self.ref_counts[block_id] += 1
        self.tables[child_seq_id] = list(shared)
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]

    def free_sequence(self, seq_id: int) -> None:
        """Drop the sequence's hold on each block, last block first; a block nobody holds joins the free tail."""
        released: List[int] = self.tables.pop(seq_id, [])
        self.lengths.pop(seq_id, None)
        for block_id in reversed(released):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first rule the books break; only reads."""
        total = len(self.ref_counts)
        queued = list(self.free)
        for block_id in queued:
            assert type(block_id) is int and 0 <= block_id < total, f"free queue holds {block_id!r}, not a block"
        assert len(set(queued)) == len(queued), f"the free queue lists a block twice: {queued}"
        assert self.tables.keys() == self.lengths.keys(), "tables and lengths name different sequences"
        holders: Counter = Counter()
        for seq_id, table in self.tables.items():
            for block_id in table:
                assert type(block_id) is int and 0 <= block_id < total, f"sequence {seq_id} lists {block_id!r}"
            assert len(set(table)) == len(table), f"sequence {seq_id} lists a block twice: {table}"
            tokens = self.lengths[seq_id]
            lowest = cdiv(tokens, self.block_size)
            assert lowest <= len(table) <= tokens // self.block_size + 1, (
                f"sequence {seq_id}: {tokens} tokens in {len(table)} blocks of {self.block_size}")
            holders.update(table)
        waiting = set(queued)
        for block_id, count in enumerate(self.ref_counts):
            assert count == holders[block_id], f"block {block_id}: count {count}, held by {holders[block_id]} tables"
            assert (count == 0) == (block_id in waiting), f"block {block_id}: count {count}, free: {block_id in waiting}"
