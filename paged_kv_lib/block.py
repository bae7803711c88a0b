"""A physical block of the KV cache (the seed's ``Block``), and the block arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ._validate import as_count


def cdiv(a: int, b: int) -> int:
    """Ceiling division for ints, ``b > 0``: ``cdiv(a, b) == ceil(a / b)``, exact at any size (no floats)."""
    return -(-a // b)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)`` (0 tokens need 0 blocks)."""
    num_tokens = as_count(num_tokens, "num_tokens")
    block_size = as_count(block_size, "block_size", minimum=1)
    return cdiv(num_tokens, block_size)



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
