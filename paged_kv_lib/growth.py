"""Growth: how a sequence gets the blocks its new tokens need, alone or with a whole decode step.

:func:`add_blocks` is the common case past the fast path of :meth:`BlockManager.append_tokens` (the last
block is full and the sequence's own: whole new blocks), :func:`grow_checked` the general one
(copy-on-write of a shared last block, content keys for blocks that fill up). Both run after the
manager checked the arguments.

:func:`append_tokens_batch` (the manager's method) grows a decode step's sequences in one call. Its
memo, :class:`DecodeBatch`, keeps the ids it checked last time, so the same list again (or that list
less the sequences that finished, found at C speed by :func:`removed_positions`) needs no checking;
and since a decode step adds one token to each of them, a clock tells in advance which sequences reach
a block boundary at which step. A step then adds one to every count in one tight loop and touches only
those few. Anything else (content to track, a shared last block, more than one token) takes the general
path, which counts every sequence first, so a refusal leaves every table as it was.
"""

from __future__ import annotations

from itertools import compress, count, islice
from operator import ne
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

from ._validate import as_count, as_iterable, as_token_ids
from .block import cdiv
from .block_table import BlockTable
from .errors import EmptyFreeQueueError, InvalidArgumentError, OutOfBlocksError
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
    manager._edits += 1
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


def append_tokens_batch(self: "BlockManager", seq_ids: Iterable[int], num_tokens: int = 1, *,
                        token_ids: Optional[Sequence["TokenIds"]] = None) -> Dict[int, Tuple[int, ...]]:
    """Grow every listed sequence by ``num_tokens`` in one call (a decode step); the block ids placed.

    Validated once and atomic: unknown, swapped-out or repeated ids, ``token_ids`` of the wrong
    shape, or too few free blocks for all of them together (shared tails counted as in
    :meth:`can_append`) raise before any table changes. ``token_ids[i]`` are sequence ``i``'s new
    tokens, so blocks that fill up become cacheable. Returns ``{seq_id: block ids placed}`` for the
    sequences that got a new or copied block (on most decode steps, few or none), exactly as one
    ``append_tokens`` call per sequence, in the listed order, would.

    (:class:`BlockManager` takes this function as its method, so a decode step costs one Python call.)
    """
    if type(num_tokens) is not int or num_tokens < 0:
        num_tokens = as_count(num_tokens, "num_tokens")
    ids: Sequence[Any] = seq_ids if type(seq_ids) in (list, tuple) else tuple(as_iterable(seq_ids, "seq_ids"))  # type: ignore[assignment]
    batch = self._batch
    if not (ids == batch.ids and type(ids) is type(batch.ids) and batch.epoch == self._edits
            and not (batch.small and _bool_at(ids, batch.small))):
        batch._remember(self, ids)
    if num_tokens != 1 or token_ids is not None or not batch.plain:
        if not num_tokens and token_ids is None and batch.plain:  # plain rows: nothing to do or forget
            return {}
        return batch._grow_general(self, ids, num_tokens, token_ids)
    clock, due = batch.clock + 1, batch.due
    grown = due.pop(clock, None)  # the sequences that pass their limit at this tick, in listed order
    if grown:
        try:
            new_ids = self._pool.take(len(grown))
        except EmptyFreeQueueError:
            due[clock] = grown
            raise OutOfBlocksError(len(grown), self.num_free_blocks, f"grow {len(ids)} sequences by 1") from None
    for table in batch.rows.values():
        table.num_tokens += 1
    batch.clock = clock
    if not grown:
        return {}
    tables, limits, block_size = self._tables, self._limits, self.block_size
    placed: Dict[int, Tuple[int, ...]] = {}
    for seq_id, block_id in zip(grown, new_ids):
        tables[seq_id].block_ids.append(block_id)
        limits[seq_id] += block_size  # the limit was the capacity: one block more
        placed[seq_id] = (block_id,)
    later = due.get(clock + block_size)  # growing evenly, they pass their new limits block_size ticks later
    if later is None:
        due[clock + block_size] = grown
    else:  # beside a sequence that started with an empty block: keep the listed order
        later += grown
        later.sort(key=batch.ids.index)
    return placed


class DecodeBatch:
    """What ``append_tokens_batch`` remembers of the batch it last checked, so the next decode step does little.

    A decode step usually lists the sequences the step before listed, or those less some that finished, in
    the same order. Such a list needs no checking again. And since every listed sequence gains one token
    per step, a clock (steps since the memo was made) tells in advance when each one passes its fast-path
    limit: ``due[t]`` lists, in listed order, the sequences that need a new block when the clock reaches
    ``t``. A step adds one to every count in one tight loop and gives blocks only to the sequences its
    clock value names (at a block size of 16, one in 16 per step).

    The clock holds while the manager's edit count is what it was when the memo was made (every change to a
    resident table outside this class bumps it) and every remembered sequence is ``plain``: it owns its last
    block and tracks no content. Otherwise a call takes the general path, one ``append_tokens`` per sequence
    in effect, and the memo is rebuilt at the next call that needs it.
    """

    __slots__ = ("ids", "rows", "epoch", "small", "plain", "clock", "due")

    def __init__(self) -> None:
        self.ids: Sequence[Any] = ()  # a copy of the list last passed
        self.rows: Dict[int, BlockTable] = {}  # their live tables, in listed order
        self.epoch = -1  # the manager's edit count when the memo was made
        self.small: List[int] = []  # where ids holds 0 or 1 (True and False would compare equal there)
        self.plain = False
        self.clock = 0
        self.due: Dict[int, List[int]] = {}

    def _remember(self, manager: "BlockManager", ids: Sequence[Any]) -> None:
        """Make the memo describe ``ids``: cheaply when they are the listed ones less a few, in order (the
        checks and the clock still hold for them; a sequence once dropped has missed clock ticks, so it
        never comes back this way), else by checking them and starting a new clock."""
        if self.epoch == manager._edits and self.plain and type(ids) is type(self.ids):
            gone = removed_positions(self.ids, ids, most=8)
            small = _small(ids) if gone is not None and self.small else []  # none before: none now
            if gone is not None and not _bool_at(ids, small):
                self._drop(manager, [self.ids[i] for i in gone])
                self.ids, self.small = (list(ids) if type(ids) is list else tuple(ids)), small
                return
        rows = _checked_tables(manager, ids)
        self.ids, self.rows, self.epoch = list(ids) if type(ids) is list else tuple(ids), dict(zip(ids, rows)), manager._edits
        self.small = _small(ids)
        self.clock, self.due = 0, {}
        limits, block_size, due = manager._limits, manager.block_size, self.due
        for seq_id, table in zip(ids, rows):
            limit = limits[seq_id]
            if table.token_ids is not None or limit != len(table.block_ids) * block_size:
                self.plain = False
                return
            due.setdefault(limit - table.num_tokens + 1, []).append(seq_id)
        self.plain = True

    def _drop(self, manager: "BlockManager", dropped: Iterable[int]) -> None:
        """Forget sequences no longer listed, and take them out of the clock's buckets (each sits in the one
        its count and limit name)."""
        rows, limits, due = self.rows, manager._limits, self.due
        for seq_id in dropped:
            key = limits[seq_id] - rows.pop(seq_id).num_tokens + self.clock + 1
            bucket = due[key]
            bucket.remove(seq_id)
            if not bucket:
                del due[key]

    def _grow_general(self, manager: "BlockManager", ids: Sequence[Any], num_tokens: int,
                      token_ids: Optional[Sequence["TokenIds"]]) -> Dict[int, Tuple[int, ...]]:
        """Any batch (shared tails, content, several blocks per sequence): each sequence within its fast-path
        limit just counts, the rest grow as ``append_tokens`` would, after all of them have been counted."""
        rows = list(self.rows.values())
        tokens = None
        if token_ids is not None:
            if len(token_ids) != len(ids):
                raise InvalidArgumentError(f"token_ids has {len(token_ids)} entries for {len(ids)} sequences")
            tokens = [None if t is None else as_token_ids(t, num_tokens) for t in token_ids]
        if self.plain:  # the counts move without the clock: a new one starts at the next call
            self.plain, self.epoch = False, -1
        if tokens is not None:
            placed = _grow_slow(manager, ids, rows, list(zip(ids, rows)), num_tokens, tokens)
        else:
            limits = manager._limits
            slow = []  # past their fast-path limit: a block boundary, a shared last block, or content tracked
            for seq_id, table in zip(ids, rows):
                new_len = table.num_tokens + num_tokens
                if new_len <= limits[seq_id]:
                    table.num_tokens = new_len
                else:
                    slow.append((seq_id, table))
            placed = _grow_slow(manager, ids, rows, slow, num_tokens, None) if slow else {}
        if placed:
            self.epoch = -1  # blocks moved (a copy may have made a tail plain): check afresh next time
        return placed


def removed_positions(old: Sequence[Any], new: Sequence[Any], most: int) -> Optional[List[int]]:
    """The positions in ``old`` of the elements it lost to become ``new``, when ``new`` is ``old`` less at most
    ``most`` elements, order kept (``None`` otherwise). The lists are compared at C speed, so a decode step whose
    batch lost a finished sequence costs a few passes over the ids, not a check of each."""
    lost = len(old) - len(new)
    if not 0 < lost <= most:
        return None
    gone: List[int] = []
    start = 0  # new[:start] is old[:start + len(gone)] less gone
    while len(gone) < lost:
        off = len(gone)
        # The first position from start on where new and old (shifted by what went) differ, at C speed.
        at = next(compress(count(start), map(ne, islice(new, start, None), islice(old, start + off, None))), len(new))
        if at == len(new):  # all of new matched: the rest of old is gone
            gone.extend(range(at + off, len(old)))
            return gone
        gone.append(at + off)  # old[at + off] is not new[at]: it went
        start = at
    return gone if new[start:] == old[start + lost:] else None


def _small(ids: Sequence[Any]) -> List[int]:
    """The positions of 0 and 1 in ``ids`` (False and True too): there ``==`` cannot tell an int from a bool."""
    return [ids.index(v) for v in (0, 1) if v in ids]


def _bool_at(ids: Sequence[Any], positions: Sequence[int]) -> bool:
    """Whether ``ids`` holds a bool at one of these positions (where a memo of ints holds 0 or 1)."""
    return bool in map(type, map(ids.__getitem__, positions))


def _checked_tables(manager: "BlockManager", ids: Sequence[Any]) -> List[BlockTable]:
    """The live tables of ``ids``, checked: ints, distinct, resident (typed errors otherwise)."""
    rows = None
    try:
        if len(set(ids)) == len(ids) and not set(map(type, ids)) - {int}:
            rows = list(map(manager._tables.__getitem__, ids))
    except (KeyError, TypeError):  # not resident, or not hashable
        pass
    if rows is None:
        _refuse(manager, ids)
    return rows


def _refuse_growth(rows: List[BlockTable], slow: List[Tuple[int, BlockTable]], num_tokens: int,
                   needed: int, free: int) -> NoReturn:
    """Take back the fast path's growth of the rows not in ``slow`` (so nothing changed), then raise."""
    held = {id(table) for _, table in slow}
    for table in rows:
        if id(table) not in held:
            table.num_tokens -= num_tokens
    raise OutOfBlocksError(needed, free, f"grow {len(rows)} sequences by {num_tokens}")


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
            _refuse_growth(rows, slow, num_tokens, needed, free)
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


def _refuse(manager: "BlockManager", ids: Sequence[Any]) -> NoReturn:
    """Raise the typed error for the first bad id of a batch: not an int, unknown, swapped out, or repeated."""
    seen = set()
    for seq_id in ids:
        manager.table(seq_id)  # not an int, unknown or swapped out
        if seq_id in seen:
            raise InvalidArgumentError(f"sequence {seq_id} is listed twice in append_tokens_batch")
        seen.add(seq_id)
    raise InvalidArgumentError(f"append_tokens_batch refused seq_ids {ids!r}")  # not reached: one of them is bad
