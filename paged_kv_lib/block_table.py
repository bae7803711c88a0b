"""A sequence's block table: the page table mapping logical blocks to physical ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class BlockTable:
    """The physical block ids of one sequence, in logical order, and its token count.

    Logical block ``i`` (token positions ``i*block_size`` to ``(i+1)*block_size - 1``)
    lives in physical block ``block_ids[i]``. ``num_tokens`` is how many token slots
    are in use; the seed kept it outside the table, we keep it beside the ids so the
    allocator can tell when the last block is full.
    """

    block_ids: List[int] = field(default_factory=list)
    num_tokens: int = 0

    def append_block(self, block_id: int) -> None:
        """Map the next logical block to physical block ``block_id``."""
        self.block_ids.append(block_id)

    def __len__(self) -> int:
        return len(self.block_ids)

    def copy(self) -> "BlockTable":
        """An independent copy (callers get copies, never the allocator's own table)."""
        return BlockTable(list(self.block_ids), self.num_tokens)
