"""The data of paging: a physical block (the seed's ``Block``), a sequence's block table (the seed's
``BlockTable``), and the one block arithmetic, ``cdiv``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ._validate import as_count
from .errors import InvalidArgumentError, InvalidTypeError


def cdiv(a: int, b: int) -> int:
    """Ceiling division for ints, ``b > 0``: ``cdiv(a, b) == ceil(a / b)``, exact at any size (no floats)."""
    return -(-a // b)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)`` (0 tokens need 0 blocks)."""
    return cdiv(as_count(num_tokens, "num_tokens"), as_count(block_size, "block_size", minimum=1))


def tokens_in_blocks(num_tokens: int, num_blocks: int, block_size: int) -> List[int]:
    """How many of a sequence's ``num_tokens`` tokens sit in each of its ``num_blocks`` blocks, in
    logical order: full blocks, then the partly filled tail, then 0 for blocks reserved ahead."""
    return [max(0, min(num_tokens - i * block_size, block_size)) for i in range(num_blocks)]


@dataclass(eq=False, slots=True)
class Block:
    """A handle to one physical block: ``block_size`` token slots in every layer's K/V cache.

    ``ref_count`` is the number of block tables that hold this block; only the block
    manager changes it. ``block_hash`` is the prefix-cache key of a full block whose
    contents are known (``None`` otherwise); a free block may keep its hash so it can be
    found again.
    """

    block_id: int
    ref_count: int = 0
    block_hash: Optional[bytes] = None

    @property
    def is_free(self) -> bool:
        """True when no sequence holds the block."""
        return self.ref_count == 0


@dataclass(slots=True)
class BlockTable:
    """The physical block ids of one sequence, in logical order, and its token count.

    Logical block ``i`` (token positions ``i*block_size`` to ``(i+1)*block_size - 1``)
    lives in physical block ``block_ids[i]``. ``num_tokens`` is how many token slots
    are in use; the seed kept it outside the table, we keep it beside the ids so the
    allocator can tell when the last block is full.

    For prefix caching the table also remembers the sequence's token ids (``None`` when
    they are unknown), the chained keys of its full blocks (each computed once, when its
    block fills), and its extra key (salt).
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
