"""Growth: how a sequence gets the blocks its new tokens need, alone or with a whole decode step.

:func:`add_blocks` is the common case past the fast path of :meth:`BlockManager.append_tokens` (the last
block is full and the sequence's own: whole new blocks), :func:`grow_checked` the general one
(copy-on-write of a shared last block, content keys for blocks that fill up). Both run after the
manager checked the arguments. :meth:`BlockManager.append_tokens_batch` hands its work to :class:`DecodeBatch`, which keeps the
ids it checked last time with their tables: a decode step grows the same sequences as the step
before until one is dropped (freed or swapped out), so those ids need no checking or looking up
again. Each call then does, per sequence, one add, one compare against the manager's fast-path
limit and one store; the few sequences at a block boundary (or with a shared last block, or
content to track) get their blocks after every one of them has been counted, so a refusal leaves
every table as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._validate import as_count, as_iterable, as_token_ids
from .block import cdiv
from .block_table import BlockTable
from .errors import InvalidArgumentError, OutOfBlocksError
from .prefix_cache import extend_chain

if TYPE_CHECKING:
    from .block_manager import BlockManager, TokenIds


def grow_checked(manager: "BlockManager", seq_id: int, table: BlockTable, num_tokens: int,
                 token_ids: "TokenIds") -> Tuple[int, ...]:
    """The checked path of ``manager.append_tokens`` (arguments checked): copy-on-write, new blocks, new content keys."""
    tokens = None if token_ids is None else manager._tokens(token_ids, num_tokens)
    if table.token_ids is None:
        tokens = None
    new_len = table.num_tokens + num_tokens
    needed, copy = manager._append_cost(table, num_tokens)
    if copy + needed > len(manager._free):
        raise OutOfBlocksError(copy + needed, len(manager._free), f"grow sequence {seq_id} to {new_len} tokens")
    placed = [manager._pool.copy_on_write(table, len(table.block_ids) - 1, manager.on_copy)[1]] if copy else []
    if needed:
        new_ids = manager._pool.take(needed)
        table.block_ids += new_ids
        placed += new_ids
    table.num_tokens = new_len
    if tokens is None or table.token_ids is None:
        table.token_ids = None  # the content is unknown from here on: no more keys
    else:
        table.token_ids.extend(tokens)
        first_new_key = len(table.block_keys)
        extend_chain(table.block_keys, table.token_ids, manager.block_size, table.extra_key)
        manager._pool.register(table, first_new_key)
    manager._refresh_limit(seq_id, table)
    return tuple(placed)


def add_blocks(manager: "BlockManager", seq_id: int, table: BlockTable, new_len: int, capacity: int) -> Tuple[int, ...]:
    """Grow a table that tracks no content and needs no copy (its fast-path limit is its capacity) to
    ``new_len`` tokens: new blocks only."""
    over, block_size = new_len - capacity, manager.block_size
    needed = 1 if over <= block_size else cdiv(over, block_size)
    if needed > len(manager._free):
        raise OutOfBlocksError(needed, len(manager._free), f"grow sequence {seq_id} to {new_len} tokens")
    new_ids = manager._pool.take(needed)
    table.block_ids += new_ids
    table.num_tokens = new_len
    manager._limits[seq_id] = len(table.block_ids) * block_size
    return tuple(new_ids)


def copy_shared(manager: "BlockManager", seq_id: int, table: BlockTable,
                logical_blocks: Iterable[int]) -> Tuple[Tuple[int, int], ...]:
    """Copy-on-write before a write: give the table its own copy of each listed logical block another table
    holds (all or none: refused when too few blocks are free); returns the copies ``(src, dst)``."""
    blocks = manager._blocks
    shared = [i for i in sorted(set(logical_blocks)) if blocks[table.block_ids[i]].ref_count > 1]
    if len(shared) > len(manager._free):
        raise OutOfBlocksError(len(shared), len(manager._free), f"copy shared blocks of sequence {seq_id}")
    try:
        return tuple(manager._pool.copy_on_write(table, i, manager.on_copy) for i in shared)
    finally:
        manager._refresh_limit(seq_id, table)


class DecodeBatch:
    """The memo of the last batch checked: its ids, their live tables, and the manager's removal count then."""

    __slots__ = ("ids", "rows", "epoch", "small")

    def __init__(self) -> None:
        self.ids: Sequence[Any] = ()
        self.rows: List[BlockTable] = []
        self.epoch = -1
        self.small: List[int] = []  # where ids holds 0 or 1 (a bool would compare equal there)

    def grow(self, manager: "BlockManager", seq_ids: Any, num_tokens: Any,
             token_ids: Optional[Sequence["TokenIds"]]) -> Dict[int, Tuple[int, ...]]:
        """``manager.append_tokens_batch(seq_ids, num_tokens, token_ids=token_ids)`` (see there)."""
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        ids = seq_ids if type(seq_ids) in (list, tuple) else tuple(as_iterable(seq_ids, "seq_ids"))
        # The memo is a copy of the last ids checked, of the same type (a list never equals a tuple). ``==``
        # would take False for 0 and True for 1, so the positions where the memo holds 0 or 1 are rechecked.
        if (ids == self.ids and type(ids) is type(self.ids) and self.epoch == manager._removals
                and (not self.small or bool not in map(type, map(ids.__getitem__, self.small)))):
            rows = self.rows
        else:
            rows = self._check(manager, ids)
        if token_ids is not None:
            if len(token_ids) != len(ids):
                raise InvalidArgumentError(f"token_ids has {len(token_ids)} entries for {len(ids)} sequences")
            tokens = [None if t is None else as_token_ids(t, num_tokens) for t in token_ids]
            return self._grow_slow(manager, ids, rows, list(zip(ids, rows)), num_tokens, tokens)
        limits = manager._limits
        slow = []  # past their fast-path limit: a block boundary, a shared last block, or content tracked
        for seq_id, table in zip(ids, rows):
            new_len = table.num_tokens + num_tokens
            if new_len <= limits[seq_id]:
                table.num_tokens = new_len
            else:
                slow.append((seq_id, table))
        if not slow:
            return {}
        # Most steps: a few sequences that own their last block, track no content, and need whole new
        # blocks: one pop for all, dealt out in the listed order (the ids one call per sequence gives).
        block_size = manager.block_size
        for seq_id, table in slow:
            if table.token_ids is not None or limits[seq_id] != len(table.block_ids) * block_size:
                return self._grow_slow(manager, ids, rows, slow, num_tokens, None)
        if num_tokens > block_size:  # a row may need several blocks
            return self._grow_slow(manager, ids, rows, slow, num_tokens, None)
        # Each of them is past its capacity by at most block_size tokens: one new block apiece.
        if len(slow) > len(manager._free):
            self._refuse_growth(rows, slow, num_tokens, len(slow), manager.num_free_blocks)
        placed: Dict[int, Tuple[int, ...]] = {}
        for (seq_id, table), block_id in zip(slow, manager._pool.take(len(slow))):
            table.block_ids.append(block_id)
            table.num_tokens += num_tokens
            limits[seq_id] += block_size  # the limit was the capacity: it grows by the new block
            placed[seq_id] = (block_id,)
        return placed

    @staticmethod
    def _refuse_growth(rows: List[BlockTable], slow: List[Tuple[int, BlockTable]], num_tokens: int,
                       needed: int, free: int) -> None:
        """Take back the fast path's growth of the rows not in ``slow`` (so nothing changed), then raise."""
        held = {id(table) for _, table in slow}
        for table in rows:
            if id(table) not in held:
                table.num_tokens -= num_tokens
        raise OutOfBlocksError(needed, free, f"grow {len(rows)} sequences by {num_tokens}")

    def _check(self, manager: "BlockManager", ids: Sequence[Any]) -> List[BlockTable]:
        """The live tables of ``ids``, checked (ints, distinct, resident), remembered for the next call."""
        tables = manager._tables
        if len(set(ids)) != len(ids) or set(map(type, ids)) - {int}:
            _refuse(manager, ids)
        try:
            rows = list(map(tables.__getitem__, ids))
        except KeyError:
            _refuse(manager, ids)
            raise  # not reached
        self.ids, self.rows, self.epoch = list(ids) if type(ids) is list else tuple(ids), rows, manager._removals
        self.small = [i for i, seq_id in enumerate(ids) if seq_id in (0, 1)]
        return rows

    @staticmethod
    def _grow_slow(manager: "BlockManager", ids: Sequence[Any], rows: List[BlockTable],
                   slow: List[Tuple[int, BlockTable]], num_tokens: int,
                   tokens: Optional[List[Optional[List[int]]]]) -> Dict[int, Tuple[int, ...]]:
        """The general case: count the blocks the sequences past their fast-path limit need, shared tails
        counted as in ``can_append`` (refusing, with the fast growth taken back, when too few are free),
        then grow them in the listed order, copy-on-write and content keys through :func:`grow_checked`."""
        block_size, limits, blocks = manager.block_size, manager._limits, manager._blocks
        needed = 0
        growers: Dict[int, int] = {}  # shared, non-full tail block -> how many listed sequences grow it
        # (seq id, table, new blocks) for a table that owns its last block (or has none) and tracks no
        # content: whole new blocks only. (seq id, table, 0): copy-on-write or keys, grow_checked.
        grow: List[Tuple[int, BlockTable, int]] = []
        for seq_id, table in slow:
            capacity = len(table.block_ids) * block_size
            if table.token_ids is None and limits[seq_id] == capacity:
                new_blocks = max(0, cdiv(table.num_tokens + num_tokens - capacity, block_size))
                needed += new_blocks
                grow.append((seq_id, table, new_blocks))
                continue
            new_blocks, copy = manager._append_cost(table, num_tokens)
            needed += new_blocks
            if copy:
                tail = table.block_ids[-1]
                growers[tail] = growers.get(tail, 0) + 1
            grow.append((seq_id, table, 0))
        needed += sum(min(k, blocks[tail].ref_count - 1) for tail, k in growers.items())
        free = manager.num_free_blocks
        if needed > free:
            if tokens is None:
                DecodeBatch._refuse_growth(rows, slow, num_tokens, needed, free)
            raise OutOfBlocksError(needed, free, f"grow {len(ids)} sequences by {num_tokens}")
        pool = manager._pool
        placed: Dict[int, Tuple[int, ...]] = {}
        index = {seq_id: i for i, seq_id in enumerate(ids)}
        for seq_id, table, n in grow:
            if n:
                new_ids = pool.take(n)
                table.block_ids += new_ids
                table.num_tokens += num_tokens
                limits[seq_id] = len(table.block_ids) * block_size
                got = tuple(new_ids)
            else:
                got = grow_checked(manager, seq_id, table, num_tokens, None if tokens is None else tokens[index[seq_id]])
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
