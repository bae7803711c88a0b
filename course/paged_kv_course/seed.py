"""The seed lesson's allocator, written once: the design lessons 02-03 build, the exercise
checks' bookkeeping pool, and the benchmarks' baseline all use this module.

The design, with the seed's names: a :class:`SeedBlock` per physical block (id and ref
count), a :class:`SeedBlockTable` per sequence (a list of block ids), and
:class:`SeedAllocator`, which owns the cache tensors, a ``collections.deque`` of free block
ids and a dict of tables::

    alloc = SeedAllocator(num_blocks=8, block_size=4, num_heads=1, head_dim=4)  # tensors
    pool = SeedAllocator(num_blocks=8, block_size=4)             # bookkeeping only (k_cache None)
    alloc.allocate_for_sequence(seq_id, num_prompt_tokens)       # ceil(tokens / block_size) blocks
    alloc.append_block_to_sequence(seq_id) -> int                # one more block (the new id)
    alloc.fork(parent_seq_id, child_seq_id)                      # share every block (lesson 03)
    alloc.free_sequence(seq_id)                                  # unknown id: no-op
    alloc.get_block_mapping(seq_id) -> list[int]                 # a copy of the block ids
    alloc.blocks, alloc.free_blocks, alloc.sequence_block_tables, alloc.num_free_blocks
    SeedAllocator.from_allocator(library_allocator)              # same tables, ref counts, free queue
                                                                 # (a PagedKVCacheAllocator or a BlockManager)

The seed's bugs, and what this module does about each:

* **The growth rule is off by one.** The seed grows a sequence when
  ``(current_length + 1) % block_size == 0``: one token early, and never after a prompt
  that filled its last block. :func:`seed_growth_rule` reproduces it so tests and lessons
  can show it failing; :func:`needs_new_block` is the corrected rule.
* **``get_block_mapping`` handed out the live list**, so a caller appending to it changed
  the table. Fixed: it returns a copy.
* **No argument checks**: a negative token count gave an empty table, ``True`` stood for
  sequence 1. Fixed: counts and ids are checked, and errors are the library's typed ones
  (still ``ValueError``/``RuntimeError``, as the seed raised); a failed call changes nothing.
* Kept as the seed has them, and flagged: a table records no token count, so
  ``append_block_to_sequence`` cannot refuse while the last block has room (the library
  can); ``free_sequence`` returns blocks head first (the library: tail first); ``fork``
  shares blocks with no copy-on-write, so this class is bookkeeping for forks, never a
  store for their K/V.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Union

import torch

from paged_kv_lib._validate import as_count, as_seq_id
from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError

if TYPE_CHECKING:
    from paged_kv_lib.allocator import PagedKVCacheAllocator
    from paged_kv_lib.block_manager import BlockManager

__all__ = ["SeedAllocator", "SeedBlock", "SeedBlockTable", "needs_new_block", "seed_growth_rule"]


@dataclass
class SeedBlock:
    """A handle to one physical block; ``ref_count`` = how many tables hold it."""

    block_id: int
    ref_count: int = 0


@dataclass
class SeedBlockTable:
    """A sequence's page table: the physical block ids of its logical blocks, in order."""

    block_ids: List[int] = field(default_factory=list)

    def append_block(self, block_id: int) -> None:
        self.block_ids.append(block_id)


def seed_growth_rule(current_length: int, block_size: int) -> bool:
    """The seed's rule for "reserve a block before the next token": off by one (see the module docstring)."""
    return (current_length + 1) % block_size == 0


def needs_new_block(current_length: int, block_size: int) -> bool:
    """Whether the next token (position ``current_length``) needs a new block: its position starts one."""
    return current_length % block_size == 0


class SeedAllocator:
    """The seed lesson's ``PagedKVCacheAllocator``: a deque free list, ref counts and block tables.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        num_heads, head_dim: the cache tensors' shape; leave both ``None`` for bookkeeping
            only (``k_cache``/``v_cache`` are then ``None``).
        dtype, device: the cache tensors' element type and device.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_heads: Optional[int] = None,
        head_dim: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
    ) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.device = device
        self.k_cache: Optional[torch.Tensor] = None
        self.v_cache: Optional[torch.Tensor] = None
        if num_heads is not None or head_dim is not None:
            shape = (self.num_blocks, as_count(num_heads, "num_heads", minimum=1), self.block_size,
                     as_count(head_dim, "head_dim", minimum=1))
            self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
            self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.blocks: List[SeedBlock] = [SeedBlock(i) for i in range(self.num_blocks)]
        self.free_blocks: Deque[int] = deque(range(self.num_blocks))
        self.sequence_block_tables: Dict[int, SeedBlockTable] = {}

    @classmethod
    def from_allocator(cls, allocator: "Union[PagedKVCacheAllocator, BlockManager]") -> "SeedAllocator":
        """A bookkeeping-only pool holding a library allocator's (or block manager's) free queue, ref counts
        and tables."""
        pool = cls(allocator.num_blocks, allocator.block_size)
        pool.free_blocks = deque(allocator.free_blocks)
        for block in allocator.blocks:
            pool.blocks[block.block_id].ref_count = block.ref_count
        pool.sequence_block_tables = {s: SeedBlockTable(allocator.get_block_mapping(s)) for s in allocator.seq_ids}
        return pool

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def __repr__(self) -> str:
        return f"SeedAllocator(free_blocks={len(self.free_blocks)}/{self.num_blocks})"

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        """Give a new sequence ``ceil(num_prompt_tokens / block_size)`` blocks from the head of the free list."""
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        if seq_id in self.sequence_block_tables:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")
        needed = cdiv(num_prompt_tokens, self.block_size)
        if len(self.free_blocks) < needed:
            raise OutOfBlocksError(needed, len(self.free_blocks), f"allocate sequence {seq_id}")
        table = SeedBlockTable()
        for _ in range(needed):
            block_id = self.free_blocks.popleft()
            self.blocks[block_id].ref_count = 1
            table.append_block(block_id)
        self.sequence_block_tables[seq_id] = table

    def free_sequence(self, seq_id: int) -> None:
        """Drop a sequence's references; blocks nobody holds go back to the free list (head block first)."""
        table = self.sequence_block_tables.pop(as_seq_id(seq_id), None)
        if table is None:
            return  # e.g. a request cancelled before it was scheduled
        for block_id in table.block_ids:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks.append(block_id)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        return list(self._table(seq_id).block_ids)

    def append_block_to_sequence(self, seq_id: int) -> int:
        """Append one block from the head of the free list to the sequence's table; returns its id."""
        table = self._table(seq_id)
        if not self.free_blocks:
            raise OutOfBlocksError(1, 0, f"append a block to sequence {seq_id}")
        block_id = self.free_blocks.popleft()
        self.blocks[block_id].ref_count = 1
        table.append_block(block_id)
        return block_id

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Give ``child_seq_id`` the parent's blocks, shared (ref counts up; no copy-on-write)."""
        parent = self._table(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        if child_seq_id in self.sequence_block_tables:
            raise DuplicateSequenceError(f"sequence {child_seq_id} is already allocated")
        for block_id in parent.block_ids:
            self.blocks[block_id].ref_count += 1
        self.sequence_block_tables[child_seq_id] = SeedBlockTable(list(parent.block_ids))

    def _table(self, seq_id: int) -> SeedBlockTable:
        table = self.sequence_block_tables.get(seq_id) if type(seq_id) is int else None
        if table is None:
            as_seq_id(seq_id)  # a bool or a non-int: a type error rather than "unknown"
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        return table
