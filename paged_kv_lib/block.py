"""A physical block of the KV cache (the seed's ``Block``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(eq=False, slots=True)
class Block:
    """A handle to one physical block: ``block_size`` token slots in every layer's K/V cache.

    ``ref_count`` is the number of block tables that hold this block; only the allocator
    changes it. ``block_hash`` is the prefix-cache key of a full block whose contents are
    known (``None`` otherwise); a free block may keep its hash so it can be found again.
    """

    block_id: int
    ref_count: int = 0
    block_hash: Optional[bytes] = None

    @property
    def is_free(self) -> bool:
        """True when no sequence holds the block."""
        return self.ref_count == 0
