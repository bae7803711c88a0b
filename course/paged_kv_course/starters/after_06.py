"""The learner's ``MyAllocator`` once exercise 06 is done: exercise 05's class plus sharing.

Exercise 06 adds copy-on-write (a sequence about to write into a last block that other
sequences hold, and that is not full, first gets a private copy) and prefix caching inside
the allocator: ``allocate_for_sequence(seq_id, n, token_ids=...)`` reuses the blocks of the
longest run of leading full blocks whose content is cached and returns how many prompt
tokens it found. A freed block keeps its content key and stays findable until the free queue
hands it out again (then its key is forgotten). Only prompt blocks are cached.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence

from paged_kv_lib._validate import as_token_ids
from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import OutOfBlocksError
from .after_05 import AllocatorAfter05

__all__ = ["AllocatorAfter06", "content_key"]

_ROOT = bytes(32)


def content_key(parent: Optional[bytes], token_ids: Sequence[int], extra_key: Optional[bytes] = None) -> bytes:
    """The 32-byte content key of a full block: SHA-256 over its parent's key, a length-framed salt (framed even
    when empty, so no salt never reads as a salt), its tokens."""
    h = hashlib.sha256(_ROOT if parent is None else parent)
    salt = bytes(extra_key or b"")
    h.update(len(salt).to_bytes(8, "little") + salt)
    for token in token_ids:
        h.update(int(token).to_bytes(8, "little", signed=True))
    return h.digest()


class AllocatorAfter06(AllocatorAfter05):
    """Exercise 05's allocator plus copy-on-write of a shared, partly filled last block, and a prefix cache."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.cached: Dict[bytes, int] = {}  # content key -> block holding that content
        self.key_of: Dict[int, bytes] = {}  # block -> its content key (only cached blocks)

    def take_blocks(self, count: int) -> List[int]:
        """Pop blocks off the head of the free queue, each now held once; their old content is forgotten."""
        taken = super().take_blocks(count)
        for block_id in taken:
            key = self.key_of.pop(block_id, None)
            if key is not None:
                del self.cached[key]
        return taken

    def _key(self, parent: Optional[bytes], token_ids: Sequence[int]) -> bytes:
        return content_key(parent, token_ids)

    def _lookup(self, keys: List[bytes]) -> List[int]:
        """Blocks of the longest run of leading keys that are cached (a block after a miss followed another prefix)."""
        hits: List[int] = []
        for key in keys:
            if key not in self.cached:
                break
            hits.append(self.cached[key])
        return hits

    def allocate_for_sequence(  # type: ignore[override]  # exercise 06's contract: returns the tokens found cached
        self, seq_id: int, num_prompt_tokens: int, token_ids: Optional[Sequence[int]] = None
    ) -> int:
        """Allocate a prompt, reusing cached leading full blocks when ``token_ids`` are given; returns cached tokens."""
        if token_ids is None:
            super().allocate_for_sequence(seq_id, num_prompt_tokens)
            return 0
        tokens = as_token_ids(token_ids, num_prompt_tokens)
        if seq_id in self.tables:
            super().allocate_for_sequence(seq_id, num_prompt_tokens)  # raises: a duplicate id
        bs = self.block_size
        keys: List[bytes] = []
        for start in range(0, len(tokens) - bs + 1, bs):
            keys.append(self._key(keys[-1] if keys else None, tokens[start:start + bs]))
        hits = self._lookup(keys)
        new = cdiv(len(tokens), bs) - len(hits)
        idle_hits = [b for b in hits if self.ref_counts[b] == 0]
        if new + len(idle_hits) > len(self.free):
            raise OutOfBlocksError(new, len(self.free) - len(idle_hits), f"allocate sequence {seq_id}")
        for block_id in idle_hits:
            self.free.remove(block_id)
        for block_id in hits:
            self.ref_counts[block_id] += 1
        table = hits + self.take_blocks(new)
        for key, block_id in zip(keys[len(hits):], table[len(hits):]):
            if key not in self.cached and block_id not in self.key_of:
                self.cached[key] = block_id
                self.key_of[block_id] = key
        self.tables[seq_id] = table
        self.lengths[seq_id] = len(tokens)
        return len(hits) * bs

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        """Grow ``seq_id``; a shared, not full last block is first replaced by a private copy (returned first)."""
        missing = self._new_blocks_for(seq_id, num_tokens)
        table = self.tables[seq_id]
        copy = num_tokens > 0 and self.lengths[seq_id] % self.block_size != 0 and self.ref_counts[table[-1]] > 1
        if missing + copy > len(self.free):
            raise OutOfBlocksError(missing + copy, len(self.free), f"grow sequence {seq_id} by {num_tokens} tokens")
        fresh: List[int] = []
        if copy:
            fresh = self.take_blocks(1)
            self.ref_counts[table[-1]] -= 1
            table[-1] = fresh[0]
        return fresh + super().append_tokens(seq_id, num_tokens)

    def _step_cost(self, seq_ids: List[int], num_tokens: int) -> int:
        """Exercise 05's count plus the copies: a tail held by r tables and grown by k of them is copied min(k, r - 1) times."""
        growers: Dict[int, int] = {}
        for seq_id in seq_ids:
            table = self.tables.get(seq_id)
            if table and num_tokens > 0 and self.lengths[seq_id] % self.block_size and self.ref_counts[table[-1]] > 1:
                growers[table[-1]] = growers.get(table[-1], 0) + 1
        copies = sum(min(k, self.ref_counts[tail] - 1) for tail, k in growers.items())
        return super()._step_cost(seq_ids, num_tokens) + copies
