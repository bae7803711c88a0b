"""``BlockPool``: the physical blocks, their free queue and the prefix cache, kept in step.

The block manager's acts come down to a few moves on the pool, and this module holds them:
take fresh blocks off the free queue (evicting the cached content they held), take cached
blocks a prompt hits, drop references (blocks nobody holds rejoin the free queue), make full
blocks findable by content, and copy-on-write (give a table its own copy of a shared block).
Nothing here checks arguments: the block manager checks before it calls, so a move that
starts always finishes (except ``on_copy`` raising, which copy-on-write undoes).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, Optional, Tuple

from .block import Block, cdiv
from .block_table import BlockTable
from .free_queue import FreeBlockQueue
from .prefix_cache import PrefixCache, PromptPlan, chain_keys

CopyHook = Optional[Callable[[int, int], None]]


class BlockPool:
    """Every physical block's :class:`Block`, the :class:`FreeBlockQueue` and the :class:`PrefixCache`.

    A block is free exactly when its ref count is 0 and then sits in ``free`` (head: handed out
    next); it carries a hash exactly when ``prefix`` maps that hash to it, free or not.
    ``copy_log`` keeps the last 4,096 copy-on-write copies ``(src, dst)``.
    """

    __slots__ = ("blocks", "free", "prefix", "copy_log", "num_copies")

    def __init__(self, num_blocks: int) -> None:
        self.blocks: List[Block] = [Block(i) for i in range(num_blocks)]
        self.free = FreeBlockQueue(num_blocks, range(num_blocks))
        self.prefix = PrefixCache()
        self.copy_log: Deque[Tuple[int, int]] = deque(maxlen=4096)
        self.num_copies = 0

    def take(self, n: int) -> List[int]:
        """Pop ``n`` blocks off the free queue, each now held once; their cached content is evicted."""
        ids = [self.free.popleft()] if n == 1 else self.free.pop_many(n)  # one block: most growth steps
        blocks = self.blocks
        for block_id in ids:
            block = blocks[block_id]
            block.ref_count = 1
            if block.block_hash is not None:
                self.prefix.remove(block.block_hash)
                block.block_hash = None
        return ids

    def take_hits(self, block_ids: List[int]) -> None:
        """Hold each cached block a prompt found once more (a free one leaves the free queue, content kept)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free.remove(block_id)
            block.ref_count += 1

    def share(self, block_ids: List[int]) -> None:
        """Hold every one of these (held) blocks once more: a fork's child shares them."""
        blocks = self.blocks
        for block_id in block_ids:
            blocks[block_id].ref_count += 1

    def release(self, block_ids: List[int]) -> None:
        """Drop one reference to each block; blocks nobody holds join the free queue, tail block first.

        (Tail blocks are then reused before head blocks, which a later prompt is likelier to share.)
        """
        blocks = self.blocks
        released = []
        for block_id in reversed(block_ids):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                released.append(block_id)
        self.free.extend_unchecked(released)  # each was held until now, so none is queued

    def register(self, table: BlockTable, start: int) -> None:
        """Make the table's full blocks from logical index ``start`` on findable by content."""
        if table.token_ids is None:
            return
        prefix, blocks = self.prefix, self.blocks
        for i in range(start, len(table.block_keys)):
            key = table.block_keys[i]
            block = blocks[table.block_ids[i]]
            if block.block_hash is None and key not in prefix:
                block.block_hash = key
                prefix.insert(key, block.block_id)

    def copy_on_write(self, table: BlockTable, index: int, on_copy: CopyHook) -> Tuple[int, int]:
        """Give the table a private copy of its shared block at logical ``index``; returns ``(src, dst)``.

        ``on_copy(src, dst)`` moves the bytes; if it raises, the fresh block goes back to the head of
        the free queue and the table keeps the shared one.
        """
        src = table.block_ids[index]
        (dst,) = self.take(1)
        try:
            if on_copy is not None:
                on_copy(src, dst)
        except BaseException:  # the bytes did not move: hand the block back (its cached content is forgotten)
            self.blocks[dst].ref_count = 0
            self.free.appendleft(dst)
            raise
        self.blocks[src].ref_count -= 1
        table.block_ids[index] = dst
        self.copy_log.append((src, dst))
        self.num_copies += 1
        return (src, dst)

    def plan_prompt(self, tokens: Optional[List[int]], salt: Optional[bytes], num_tokens: int,
                    block_size: int) -> PromptPlan:
        """What allocating a prompt of ``num_tokens`` (content ``tokens``, if known) takes: its keys, the
        cached blocks it hits, and how many blocks leave the free queue; changes nothing."""
        keys = chain_keys(tokens, block_size, salt) if tokens is not None else []
        hits = self.prefix.longest_prefix(keys)
        hit_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return PromptPlan(tokens, salt, keys, hits, hit_free, cdiv(num_tokens, block_size) - len(hits))

    def num_cached_free(self) -> int:
        """Free blocks that still hold findable content."""
        return sum(1 for _, block_id in self.prefix.items() if self.blocks[block_id].ref_count == 0)

    def forget_content(self) -> int:
        """Drop every content key (blocks and prefix cache); returns how many there were."""
        dropped = len(self.prefix)
        for _, block_id in list(self.prefix.items()):
            self.blocks[block_id].block_hash = None
        self.prefix.clear()
        return dropped
