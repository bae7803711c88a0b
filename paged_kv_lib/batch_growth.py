"""Batched growth: one decode step grows every running sequence in one call, checked once, atomic.

:meth:`BlockManager.append_tokens_batch` hands its work to :class:`DecodeBatch`, which keeps the
ids it checked last time with their tables: a decode step grows the same sequences as the step
before until one is dropped (freed or swapped out), so those ids need no checking or looking up
again. Each call then does, per sequence, one add, one compare against the manager's fast-path
limit and one store; the few sequences at a block boundary (or with a shared last block, or
content to track) get their blocks after every one of them has been counted, so a refusal leaves
every table as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ._validate import as_count, as_iterable, as_token_ids
from .block import cdiv
from .block_table import BlockTable
from .errors import InvalidArgumentError, OutOfBlocksError

if TYPE_CHECKING:
    from .block_manager import BlockManager, TokenIds


class DecodeBatch:
    """The memo of the last batch checked: its ids, their live tables, and the manager's removal count then."""

    __slots__ = ("ids", "rows", "epoch")

    def __init__(self) -> None:
        self.ids: Tuple[Any, ...] = ()
        self.rows: List[BlockTable] = []
        self.epoch = -1

    def grow(self, manager: "BlockManager", seq_ids: Any, num_tokens: Any,
             token_ids: Optional[Sequence["TokenIds"]]) -> Dict[int, Tuple[int, ...]]:
        """``manager.append_tokens_batch(seq_ids, num_tokens, token_ids=token_ids)`` (see there)."""
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        ids = seq_ids if type(seq_ids) is tuple else tuple(as_iterable(seq_ids, "seq_ids"))
        if ids == self.ids and self.epoch == manager._removals:
            rows = self.rows
        else:
            rows = self._check(manager, ids)
        tokens: Optional[List[Optional[List[int]]]] = None
        if token_ids is not None:
            if len(token_ids) != len(ids):
                raise InvalidArgumentError(f"token_ids has {len(token_ids)} entries for {len(ids)} sequences")
            tokens = [None if t is None else as_token_ids(t, num_tokens) for t in token_ids]
        limits = manager._limits
        if tokens is None:  # grow every sequence with room now; the rest take the checked path below
            slow = []
            for seq_id, table in zip(ids, rows):
                new_len = table.num_tokens + num_tokens
                if new_len <= limits[seq_id]:
                    table.num_tokens = new_len
                else:
                    slow.append((seq_id, table))
            if not slow:
                return {}
        else:
            slow = list(zip(ids, rows))
        return self._grow_slow(manager, ids, rows, slow, num_tokens, tokens)

    def _check(self, manager: "BlockManager", ids: Tuple[Any, ...]) -> List[BlockTable]:
        """The live tables of ``ids``, checked (ints, distinct, resident), remembered for the next call."""
        tables = manager._tables
        if len(set(ids)) != len(ids) or set(map(type, ids)) - {int}:
            _refuse(manager, ids)
        try:
            rows = list(map(tables.__getitem__, ids))
        except KeyError:
            _refuse(manager, ids)
            raise  # not reached
        self.ids, self.rows, self.epoch = ids, rows, manager._removals
        return rows

    @staticmethod
    def _grow_slow(manager: "BlockManager", ids: Tuple[Any, ...], rows: List[BlockTable],
                   slow: List[Tuple[int, BlockTable]], num_tokens: int,
                   tokens: Optional[List[Optional[List[int]]]]) -> Dict[int, Tuple[int, ...]]:
        """Count the blocks the sequences past their fast-path limit need (refusing, with the fast growth
        taken back, when too few are free), then place them, in the listed order."""
        block_size, limits, blocks = manager.block_size, manager._limits, manager._blocks
        needed = 0
        growers: Dict[int, int] = {}  # shared, non-full tail block -> how many listed sequences grow it
        # (seq id, table, new blocks) for a table that owns its last block (or has none) and tracks no
        # content: whole new blocks only. (seq id, table, 0): copy-on-write or keys, manager._grow.
        grow: List[Tuple[int, BlockTable, int]] = []
        all_plain = True
        for seq_id, table in slow:
            capacity = len(table.block_ids) * block_size
            if table.token_ids is None and limits[seq_id] == capacity:
                new_blocks = cdiv(table.num_tokens + num_tokens - capacity, block_size)
                needed += new_blocks
                grow.append((seq_id, table, new_blocks))
                continue
            all_plain = False
            new_blocks, copy = manager._append_cost(table, num_tokens)
            needed += new_blocks
            if copy:
                tail = table.block_ids[-1]
                growers[tail] = growers.get(tail, 0) + 1
            grow.append((seq_id, table, 0))
        needed += sum(min(k, blocks[tail].ref_count - 1) for tail, k in growers.items())
        free = manager.num_free_blocks
        if needed > free:
            if tokens is None:  # take back the fast path's growth, so nothing changed
                held = {id(table) for _, table in slow}
                for table in rows:
                    if id(table) not in held:
                        table.num_tokens -= num_tokens
            raise OutOfBlocksError(needed, free, f"grow {len(ids)} sequences by {num_tokens}")
        pool = manager._pool
        placed: Dict[int, Tuple[int, ...]] = {}
        if all_plain:  # one pop for all, dealt out in the listed order (the ids one call per sequence gives)
            fresh = pool.take(needed)
            at = 0
            for seq_id, table, n in grow:
                dealt = fresh[at : at + n]
                at += n
                table.block_ids += dealt
                table.num_tokens += num_tokens
                limits[seq_id] = len(table.block_ids) * block_size
                placed[seq_id] = tuple(dealt)
            return placed
        index = {seq_id: i for i, seq_id in enumerate(ids)}
        for seq_id, table, n in grow:
            if n:
                new_ids = pool.take(n)
                table.block_ids += new_ids
                table.num_tokens += num_tokens
                limits[seq_id] = len(table.block_ids) * block_size
                got = tuple(new_ids)
            else:
                got = manager._grow(seq_id, table, num_tokens, None if tokens is None else tokens[index[seq_id]])
            if got:
                placed[seq_id] = got
        return placed


def _refuse(manager: "BlockManager", ids: Sequence[Any]) -> None:
    """Raise the typed error for the first bad id of a batch: not an int, unknown, swapped out, or repeated."""
    seen = set()
    for seq_id in ids:
        manager.table(seq_id)  # not an int, unknown or swapped out
        if seq_id in seen:
            raise InvalidArgumentError(f"sequence {seq_id} is listed twice in append_tokens_batch")
        seen.add(seq_id)
    raise InvalidArgumentError(f"append_tokens_batch refused seq_ids {ids!r}")  # not reached
