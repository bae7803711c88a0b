"""A correct bookkeeping-only allocator with the contract of ``paged_kv_lib.conformance``.

It lives in the tests, not in the library, so learners cannot import the answer. Tests
of ``check_allocator``, ``engine_for`` and ``simulate`` use it as "a correct learner
class", and derive planted wrong classes from it.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List

from paged_kv_lib.block import cdiv


class ReferenceAllocator:
    """Blocks from the head of a deque, ref counts, tail-first frees, fork, copy-on-write growth."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_queue: Deque[int] = deque(range(num_blocks))
        self.ref_counts: List[int] = [0] * num_blocks
        self.tables: Dict[int, List[int]] = {}
        self.num_tokens: Dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def _take(self, n: int) -> List[int]:
        ids = [self.free_queue.popleft() for _ in range(n)]
        for block_id in ids:
            self.ref_counts[block_id] = 1
        return ids

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        needed = cdiv(num_prompt_tokens, self.block_size)
        if needed > len(self.free_queue):
            raise RuntimeError(f"need {needed} blocks, only {len(self.free_queue)} free")
        self.tables[seq_id] = self._take(needed)
        self.num_tokens[seq_id] = num_prompt_tokens

    def blocks_to_grow(self, seq_id: int, num_tokens: int) -> int:
        """Blocks ``append_tokens(seq_id, num_tokens)`` takes from the free queue (a copy included)."""
        table, old = self.tables[seq_id], self.num_tokens[seq_id]
        needed = max(0, cdiv(old + num_tokens, self.block_size) - len(table))
        copy = num_tokens > 0 and old < len(table) * self.block_size and self.ref_counts[table[-1]] > 1
        return needed + copy

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        total = self.blocks_to_grow(seq_id, num_tokens)
        if total > len(self.free_queue):
            raise RuntimeError(f"need {total} blocks, only {len(self.free_queue)} free")
        table = self.tables[seq_id]
        placed = []
        old = self.num_tokens[seq_id]
        if num_tokens > 0 and old < len(table) * self.block_size and self.ref_counts[table[-1]] > 1:
            (fresh,) = self._take(1)
            self.ref_counts[table[-1]] -= 1
            table[-1] = fresh
            placed.append(fresh)
            total -= 1
        new_ids = self._take(total)
        table.extend(new_ids)
        self.num_tokens[seq_id] = old + num_tokens
        return placed + new_ids

    def free_sequence(self, seq_id: int) -> None:
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.num_tokens[seq_id]
        for block_id in reversed(table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_queue.append(block_id)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        return list(self.tables[seq_id])

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        if parent_seq_id not in self.tables:
            raise ValueError(f"sequence {parent_seq_id} is not allocated")
        if child_seq_id in self.tables:
            raise ValueError(f"sequence {child_seq_id} is already allocated")
        parent = self.tables[parent_seq_id]
        for block_id in parent:
            self.ref_counts[block_id] += 1
        self.tables[child_seq_id] = list(parent)
        self.num_tokens[child_seq_id] = self.num_tokens[parent_seq_id]
