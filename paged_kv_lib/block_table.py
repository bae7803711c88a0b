"""A sequence's block table: the page table mapping logical blocks to physical ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass(slots=True)
class BlockTable:
    """The physical block ids of one sequence, in logical order, and its token count.

    Logical block ``i`` (token positions ``i*block_size`` to ``(i+1)*block_size - 1``)
    lives in physical block ``block_ids[i]``. ``num_tokens`` is how many token slots
    are in use; the seed kept it outside the table, we keep it beside the ids so the
    allocator can tell when the last block is full.

    For prefix caching the table also remembers the sequence's token ids (``None`` when
    they are unknown), the chained keys of its full blocks, and its extra key (salt).
    Copies compare equal to the original (``append_limit`` is not compared).
    """

    block_ids: List[int] = field(default_factory=list)
    num_tokens: int = 0
    token_ids: Optional[List[int]] = None
    block_keys: List[bytes] = field(default_factory=list)
    extra_key: Optional[bytes] = None
    # The length up to which the allocator may append on its unchecked fast path: the
    # capacity when the last block is unshared, else the current length (derived state,
    # kept by the allocator; a copy starts at 0 so its first append takes the checked path).
    append_limit: int = field(default=0, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.block_ids)

    def copy(self) -> "BlockTable":
        """An independent copy (callers get copies, never the allocator's own table)."""
        tokens = None if self.token_ids is None else list(self.token_ids)
        return BlockTable(list(self.block_ids), self.num_tokens, tokens, list(self.block_keys), self.extra_key)
