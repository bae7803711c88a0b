"""A sequence's block table: the page table mapping logical blocks to physical ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .errors import InvalidArgumentError, InvalidTypeError


@dataclass(slots=True)
class BlockTable:
    """The physical block ids of one sequence, in logical order, and its token count.

    Logical block ``i`` (token positions ``i*block_size`` to ``(i+1)*block_size - 1``)
    lives in physical block ``block_ids[i]``. ``num_tokens`` is how many token slots
    are in use; the seed kept it outside the table, we keep it beside the ids so the
    allocator can tell when the last block is full.

    For prefix caching the table also remembers the sequence's token ids (``None`` when
    they are unknown), the chained keys of its full blocks, and its extra key (salt).
    """

    block_ids: List[int] = field(default_factory=list)
    num_tokens: int = 0
    token_ids: Optional[List[int]] = None
    block_keys: List[bytes] = field(default_factory=list)
    extra_key: Optional[bytes] = None

    def __len__(self) -> int:
        return len(self.block_ids)

    def append_block(self, block_id: int) -> None:
        """Map the next logical block to physical block ``block_id`` (the seed's method).

        The id must be a plain int >= 0 that the table does not hold yet; a bad id raises
        (:class:`InvalidTypeError` or :class:`InvalidArgumentError`) and the table is unchanged.
        """
        if type(block_id) is not int:
            raise InvalidTypeError(f"block_id must be an int, got {type(block_id).__name__} {block_id!r}")
        if block_id < 0:
            raise InvalidArgumentError(f"block_id must be >= 0, got {block_id}")
        if block_id in self.block_ids:
            raise InvalidArgumentError(
                f"block {block_id} is already logical block {self.block_ids.index(block_id)} of this table"
            )
        self.block_ids.append(block_id)

    def copy(self) -> "BlockTable":
        """An independent copy (callers get copies, never the allocator's own table)."""
        tokens = None if self.token_ids is None else list(self.token_ids)
        return BlockTable(list(self.block_ids), self.num_tokens, tokens, list(self.block_keys), self.extra_key)
