"""``SwapSpace``: the CPU block pool and the tables of the sequences swapped out to it.

A swapped-out sequence keeps its :class:`BlockTable` (token count, token ids, keys), with its
block ids replaced by CPU block ids, one private CPU block per device block it held. The
block manager decides when a sequence moves; this module only hands out and takes back CPU
blocks (free CPU blocks in a ``deque``, next handed out first) and keeps the tables.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional

from .block_table import BlockTable


class SwapSpace:
    """``num_blocks`` CPU blocks: ``free`` (a deque of ids) and ``tables`` (swapped-out sequence -> table)."""

    __slots__ = ("num_blocks", "free", "tables")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: Deque[int] = deque(range(num_blocks))
        self.tables: Dict[int, BlockTable] = {}  # block ids here are CPU block ids

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.tables

    def get(self, seq_id: int) -> Optional[BlockTable]:
        return self.tables.get(seq_id)

    def store(self, seq_id: int, table: BlockTable) -> List[int]:
        """Keep a sequence's table, giving it a CPU block per block it holds; returns the CPU ids, in order.

        The caller checked that enough CPU blocks are free.
        """
        cpu_ids = [self.free.popleft() for _ in table.block_ids]
        table.block_ids = cpu_ids
        self.tables[seq_id] = table
        return list(cpu_ids)

    def take(self, seq_id: int) -> BlockTable:
        """Hand a swapped-out sequence's table back (its CPU blocks rejoin the free pool; ids kept in it)."""
        table = self.tables.pop(seq_id)
        self.free.extend(table.block_ids)
        return table
