"""The scheduler's arithmetic over blocks, as small functions of plain numbers.

Every bookkeeping that answers the engine's questions (:class:`~paged_kv_lib.block_manager.BlockManager`,
and the adapter that serves a learner's allocator) asks these functions, so each rule has one
home: what growing a sequence costs (new blocks, and a copy-on-write copy of a shared, non-full
last block), how many copies a shared tail costs when several of its holders grow, the watermark
in blocks, whether a demand fits leaving that watermark free, what swapping out takes from the CPU
pool, and what a request needs to fit at all. They know nothing about tables or ids: the caller
reads its own state and passes the numbers.
"""

from __future__ import annotations

import math
from typing import Iterable, Tuple

from ._validate import as_count, as_fraction
from .block import cdiv

__all__ = [
    "append_cost",
    "appendable_tokens",
    "blocks_to_hold",
    "fits",
    "shared_tail_copies",
    "swap_out_blocks",
    "watermark_blocks",
]


def watermark_blocks(watermark: float, num_blocks: int) -> int:
    """Blocks an admission must leave free: ``ceil(watermark * num_blocks)`` (``watermark`` checked, in [0, 1])."""
    return math.ceil(as_fraction(watermark, "watermark") * num_blocks)


def fits(free: int, needed: int, reserve: int = 0) -> bool:
    """Whether taking ``needed`` of ``free`` blocks still leaves ``reserve`` free."""
    return free - needed >= reserve


def append_cost(held_tokens: int, held_blocks: int, block_size: int, tail_holders: int, grow: int) -> Tuple[int, bool]:
    """What growing a sequence by ``grow`` tokens takes: ``(new blocks, whether its last block is copied)``.

    The sequence holds ``held_tokens`` tokens in ``held_blocks`` blocks; its last block is held by
    ``tail_holders`` tables. A last block with room that others also hold is copied before the write
    (copy-on-write); a full one is never written again, so it stays shared.
    """
    copy = grow > 0 and held_tokens < held_blocks * block_size and tail_holders > 1
    return max(0, cdiv(held_tokens + grow, block_size) - held_blocks), copy


def shared_tail_copies(tails: Iterable[Tuple[int, int]]) -> int:
    """Copies made when shared tails grow in one step: ``min(k, r - 1)`` for each tail held by ``r``
    tables and grown by ``k`` of them (``tails`` gives the ``(k, r)`` pairs): the last holder writes in place."""
    return sum(min(k, r - 1) for k, r in tails)


def appendable_tokens(held_tokens: int, held_blocks: int, block_size: int, spare_blocks: int, copy: bool,
                      up_to: int) -> int:
    """The most tokens, at most ``up_to``, a sequence can grow by with ``spare_blocks`` blocks to take
    (room left in its last block and whole new blocks; a copy-on-write copy, ``copy``, takes one first)."""
    spare = spare_blocks - copy
    if spare < 0:
        return 0
    capacity = (held_blocks + spare) * block_size - held_tokens
    return max(0, min(up_to, capacity))


def swap_out_blocks(table_lengths: Iterable[int]) -> int:
    """CPU blocks swapping out these sequences takes: one private copy per block each table holds, shared ones too."""
    return sum(table_lengths)


def blocks_to_hold(num_tokens: int, num_seqs: int, block_size: int, num_blocks: int, watermark: float) -> int:
    """The blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens each may hold at most, plus the watermark.

    The worst case of a request: every sequence with private blocks (sharing only lowers it). A
    pool of ``num_blocks`` can ever serve the request when this is at most ``num_blocks``.
    """
    num_tokens = as_count(num_tokens, "num_tokens")
    num_seqs = as_count(num_seqs, "num_seqs", minimum=1)
    return num_seqs * cdiv(num_tokens, block_size) + watermark_blocks(watermark, num_blocks)
