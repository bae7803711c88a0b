"""``BlockManager``: which sequence holds which block. Bookkeeping only, no tensors.

Its whole state: ``_blocks`` (one :class:`Block` per physical block: ref count, content key),
``_free`` (the :class:`FreeBlockQueue`, next handed out first), ``_tables`` (each resident
sequence's :class:`BlockTable`), ``_prefix`` (the :class:`PrefixCache`: content key -> block),
``_swapped`` and ``_cpu_free`` (swapped-out sequences' tables, in CPU block ids, and the CPU pool).

It alone changes ref counts, and it answers the scheduler's questions (can these sequences
grow, can this one swap in) with the arithmetic the acts use. Every public method checks
before it changes anything: a call that raises changes nothing. It moves no bytes: copy-on-write
calls ``on_copy(src, dst)``; ``swap_out``/``swap_in`` return the block ids whose bytes to move.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._validate import as_count, as_iterable, as_seq_id, as_token_ids
from .block import Block, cdiv
from .block_questions import BlockQuestions
from .block_table import BlockTable
from .errors import BlocksInUseError, DuplicateSequenceError, InvalidArgumentError
from .errors import OutOfBlocksError, SequenceStateError, UnknownSequenceError
from .free_queue import FreeBlockQueue
from .prefix_cache import PrefixCache, PromptPlan, as_extra_key, chain_keys, extend_chain

TokenIds = Optional[Sequence[int]]
ExtraKey = Optional[Union[bytes, str]]


class BlockManager(BlockQuestions):
    """Hands out a pool of fixed-size blocks to growing, forking, swapping sequences.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        enable_prefix_caching: find full blocks again by content (needs ``token_ids``).
        num_cpu_blocks: size of the CPU swap space, in blocks.
        on_copy: called as ``on_copy(src, dst)`` whenever copy-on-write gives a sequence
            block ``dst`` in place of the shared block ``src`` (the owner copies the bytes).
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, on_copy: Optional[Callable[[int, int], None]] = None) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.num_cpu_blocks = as_count(num_cpu_blocks, "num_cpu_blocks")
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.on_copy = on_copy
        self._blocks: List[Block] = [Block(i) for i in range(self.num_blocks)]
        self._free = FreeBlockQueue(self.num_blocks, range(self.num_blocks))
        self._tables: Dict[int, BlockTable] = {}
        self._prefix = PrefixCache()
        self._swapped: Dict[int, BlockTable] = {}  # block ids here are CPU block ids
        self._cpu_free: Deque[int] = deque(range(self.num_cpu_blocks))
        self._copy_log: Deque[Tuple[int, int]] = deque(maxlen=4096)
        self.num_copies = 0
        # append_tokens_batch's memo: the ids it last checked, their tables, and _removals then.
        self._removals = 0  # tables dropped so far (freed or swapped out)
        self._batch_ids: Tuple[object, ...] = ()
        self._batch_rows: List[BlockTable] = []
        self._batch_epoch = -1

    # ------------------------------------------------------------------ counts
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        return sum(1 for _, block_id in self._prefix.items() if self._blocks[block_id].ref_count == 0)

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the resident sequences, oldest first."""
        return tuple(self._tables)

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        return tuple(self._swapped)

    def __contains__(self, seq_id: object) -> bool:
        return type(seq_id) is not bool and (seq_id in self._tables or seq_id in self._swapped)

    def is_swapped(self, seq_id: int) -> bool:
        """Whether the sequence is swapped out (unknown ids raise)."""
        if as_seq_id(seq_id) in self._swapped:
            return True
        self.table(seq_id)  # raises for unknown ids
        return False

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        return list(self.table(seq_id).block_ids)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (swapped out or not)."""
        table = self._swapped.get(as_seq_id(seq_id))
        return self.table(seq_id).num_tokens if table is None else table.num_tokens

    # ------------------------------------------------------------------ allocate
    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int, *, token_ids: TokenIds = None,
                              extra_key: ExtraKey = None) -> int:
        """Give a new sequence the blocks for its prompt; returns how many prompt tokens were found cached.

        With ``token_ids`` (and prefix caching on) the longest run of leading full blocks whose content
        is cached is reused, not allocated. ``extra_key`` salts every key: different salts never share.
        """
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        self._check_new_id(seq_id)
        plan = self._plan_prompt(num_prompt_tokens, token_ids, extra_key)
        if plan.taken_from_free > len(self._free):
            raise OutOfBlocksError(plan.new_blocks, len(self._free) - plan.hit_free, f"allocate sequence {seq_id}")
        self._prefix.queries += len(plan.keys)
        self._prefix.hits += len(plan.hits)
        for block_id in plan.hits:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                self._free.remove(block_id)
            block.ref_count += 1
        block_ids = plan.hits + self._take_blocks(plan.new_blocks)
        table = BlockTable(block_ids, num_prompt_tokens, plan.tokens, plan.keys, plan.salt)
        self._register(table, len(plan.hits))
        self._refresh_limit(table)
        self._tables[seq_id] = table
        return len(plan.hits) * self.block_size

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make ``child_seq_id`` share every block of ``parent_seq_id`` (ref counts go up; nothing is copied)."""
        parent = self.table(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        self._check_new_id(child_seq_id)
        for block_id in parent.block_ids:
            self._blocks[block_id].ref_count += 1
        child = parent.copy()
        parent.append_limit = child.append_limit = 0  # their last block is shared now
        self._tables[child_seq_id] = child

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks (resident or swapped out); an unknown id is a no-op, as in the seed.

        A block nobody else holds goes back to the free queue keeping its content key (still findable).
        """
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        table = self._tables.pop(seq_id, None)
        if table is not None:
            self._removals += 1
            self._release(table.block_ids)
            return
        swapped = self._swapped.pop(seq_id, None)
        if swapped is not None:
            self._cpu_free.extend(swapped.block_ids)

    # ------------------------------------------------------------------ grow
    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow a sequence by ``num_tokens``, adding exactly the blocks it now needs; returns the block ids placed.

        A new block is needed when the first new token's position is a multiple of ``block_size`` (the
        seed's ``(length + 1) % block_size == 0`` asked one token early). A shared, non-full last block is
        copied first (copy-on-write). ``token_ids`` (the new tokens) make blocks that fill up cacheable.
        """
        # Fast path, most decode steps: plain ints, room in an unshared last block, no content tracking.
        if token_ids is None and type(num_tokens) is int and type(seq_id) is int:
            try:
                table = self._tables[seq_id]
            except KeyError:
                raise self._missing(seq_id) from None
            new_len = table.num_tokens + num_tokens
            if table.num_tokens <= new_len <= table.append_limit:
                table.num_tokens = new_len
                return ()
            if num_tokens >= 0:  # a block boundary (or a shared tail): the checked path, args already checked
                return self._grow(seq_id, table, num_tokens, None)
        return self._grow(seq_id, self.table(seq_id), as_count(num_tokens, "num_tokens"), token_ids)

    def append_tokens_batch(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                            token_ids: Optional[Sequence[TokenIds]] = None) -> Dict[int, Tuple[int, ...]]:
        """Grow every listed sequence by ``num_tokens`` in one call (a decode step); the block ids placed.

        Validated once and atomic: unknown, swapped-out or repeated ids, ``token_ids`` of the wrong
        shape, or too few free blocks for all of them together (shared tails counted as in
        :meth:`can_append`) raise before any table changes. ``token_ids[i]`` are sequence ``i``'s new
        tokens, so blocks that fill up become cacheable. Returns ``{seq_id: block ids placed}`` for the
        sequences that got a new or copied block (on most decode steps, few or none).
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        ids = seq_ids if type(seq_ids) is tuple else tuple(as_iterable(seq_ids, "seq_ids"))
        # A decode step grows the same sequences as the step before: when no table was dropped since,
        # the ids checked then (ints, distinct, resident) need no checking again, nor looking up.
        if ids == self._batch_ids and self._batch_epoch == self._removals:
            rows = self._batch_rows
        else:
            tables = self._tables
            if len(set(ids)) != len(ids) or set(map(type, ids)) - {int}:
                self._refuse_batch(ids)
            try:
                rows = list(map(tables.__getitem__, ids))
            except KeyError:
                self._refuse_batch(ids)
                raise  # not reached
            self._batch_ids, self._batch_rows, self._batch_epoch = ids, rows, self._removals
        tokens: Optional[List[Optional[List[int]]]] = None
        if token_ids is not None:
            if len(token_ids) != len(ids):
                raise InvalidArgumentError(f"token_ids has {len(token_ids)} entries for {len(ids)} sequences")
            tokens = [None if t is None else as_token_ids(t, num_tokens) for t in token_ids]
        # A block boundary, a shared tail or content to track: those take the checked path below.
        if tokens is None:
            slow = []
            for seq_id, table in zip(ids, rows):
                new_len = table.num_tokens + num_tokens
                if new_len <= table.append_limit:
                    table.num_tokens = new_len
                else:
                    slow.append((seq_id, table))
        else:
            slow = list(zip(ids, rows))
        if not slow:
            return {}
        needed = 0
        growers: Dict[int, int] = {}
        # (seq id, table, new blocks) where the table's last block is its own (or it has none) and it
        # tracks no content: only whole new blocks. Else (seq id, table, 0): copy-on-write or content
        # keys, through the checked path of append_tokens.
        grow: List[Tuple[int, BlockTable, int]] = []
        block_size = self.block_size
        all_plain = True
        for seq_id, table in slow:
            capacity = len(table.block_ids) * block_size
            if table.token_ids is None and table.append_limit == capacity:  # the fast path's own test failed
                new_blocks = -(-(table.num_tokens + num_tokens - capacity) // block_size)
                needed += new_blocks
                grow.append((seq_id, table, new_blocks))
                continue
            all_plain = False
            new_blocks, copy = self._append_cost(table, num_tokens)
            needed += new_blocks
            if copy:
                tail = table.block_ids[-1]
                growers[tail] = growers.get(tail, 0) + 1
            grow.append((seq_id, table, 0))
        needed += sum(min(k, self._blocks[tail].ref_count - 1) for tail, k in growers.items())
        if needed > len(self._free):
            if tokens is None:  # refused: take back the fast path's growth, so nothing changed
                held = {id(table) for _, table in slow}
                for table in rows:
                    if id(table) not in held:
                        table.num_tokens -= num_tokens
            raise OutOfBlocksError(needed, len(self._free), f"grow {len(ids)} sequences by {num_tokens}")
        placed: Dict[int, Tuple[int, ...]] = {}
        if all_plain:  # one pop for all, dealt out in the listed order (the ids one call per sequence gives)
            fresh = self._take_blocks(needed)
            at = 0
            for seq_id, table, n in grow:
                dealt = fresh[at : at + n]
                at += n
                table.block_ids += dealt
                table.num_tokens += num_tokens
                table.append_limit = len(table.block_ids) * block_size
                placed[seq_id] = tuple(dealt)
            return placed
        index = {seq_id: i for i, seq_id in enumerate(ids)} if tokens is not None else None
        for seq_id, table, n in grow:  # in the listed order, so block ids go out as one call per sequence
            if n:
                new_ids = self._take_blocks(n)
                table.block_ids += new_ids
                table.num_tokens += num_tokens
                table.append_limit = len(table.block_ids) * block_size
                got = tuple(new_ids)
            else:
                got = self._grow(seq_id, table, num_tokens, None if tokens is None or index is None else tokens[index[seq_id]])
            if got:
                placed[seq_id] = got
        return placed

    def _refuse_batch(self, ids: Sequence[Any]) -> None:
        """Raise the typed error for the first bad id of a batch: not an int, unknown, swapped out, or repeated."""
        seen = set()
        for seq_id in ids:
            self.table(seq_id)  # not an int, unknown or swapped out
            if seq_id in seen:
                raise InvalidArgumentError(f"sequence {seq_id} is listed twice in append_tokens_batch")
            seen.add(seq_id)
        raise InvalidArgumentError(f"append_tokens_batch refused seq_ids {ids!r}")  # not reached

    def append_block_to_sequence(self, seq_id: int) -> int:
        """The seed's low-level step: reserve one more (empty) block for a sequence whose blocks are full.

        Refused while the last block has room (it would sit empty). Returns the new block id.
        """
        table = self.table(seq_id)
        if table.num_tokens < len(table.block_ids) * self.block_size:
            raise SequenceStateError(
                f"sequence {seq_id} still has room: {table.num_tokens} tokens in "
                f"{len(table.block_ids)} blocks of {self.block_size}"
            )
        if not self._free:
            raise OutOfBlocksError(1, 0, f"append a block to sequence {seq_id}")
        (block_id,) = self._take_blocks(1)
        table.block_ids.append(block_id)
        self._refresh_limit(table)
        return block_id

    def make_writable(self, seq_id: int, logical_blocks: Iterable[int]) -> Tuple[Tuple[int, int], ...]:
        """Before a write into these logical blocks, copy each one other tables hold; returns the copies."""
        table = self.table(seq_id)
        blocks = self._blocks
        shared = [i for i in sorted(set(logical_blocks)) if blocks[table.block_ids[i]].ref_count > 1]
        if len(shared) > len(self._free):
            raise OutOfBlocksError(len(shared), len(self._free), f"copy shared blocks of sequence {seq_id}")
        return tuple(self._copy_on_write(table, i) for i in shared)

    # ------------------------------------------------------------------ swap
    def swap_out(self, seq_id: int) -> Tuple[List[int], List[int]]:
        """Give a sequence a private CPU block per block it holds, and drop its device blocks (shared ones stay).

        Returns ``(device_ids, cpu_ids)``: the owner copies ``device_ids[i]`` to ``cpu_ids[i]`` at once.
        """
        table = self.table(seq_id)
        n = len(table.block_ids)
        if n > len(self._cpu_free):
            raise OutOfBlocksError(n, len(self._cpu_free), f"swap out sequence {seq_id}", pool="CPU")
        cpu_ids = [self._cpu_free.popleft() for _ in range(n)]
        device_ids = table.block_ids
        del self._tables[seq_id]
        self._removals += 1
        self._release(device_ids)
        table.block_ids = cpu_ids
        table.append_limit = 0
        self._swapped[seq_id] = table
        return list(device_ids), list(cpu_ids)

    def swap_in(self, seq_id: int) -> Tuple[List[int], List[int]]:
        """Bring a swapped-out sequence back onto fresh device blocks; returns ``(cpu_ids, device_ids)`` to copy."""
        table = self._swapped_table(seq_id)
        n = len(table.block_ids)
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free), f"swap in sequence {seq_id}")
        device_ids = self._take_blocks(n)
        cpu_ids = table.block_ids
        del self._swapped[seq_id]
        self._cpu_free.extend(cpu_ids)
        table.block_ids = device_ids
        self._register(table, 0)
        self._refresh_limit(table)
        self._tables[seq_id] = table
        return list(cpu_ids), list(device_ids)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block's content key (after new weights); refused while any block is in use."""
        used = self.num_used_blocks
        if used:
            raise BlocksInUseError(f"cannot reset the prefix cache: {used} blocks are in use")
        dropped = len(self._prefix)
        for _, block_id in list(self._prefix.items()):
            self._blocks[block_id].block_hash = None
        self._prefix.clear()
        return dropped

    # ------------------------------------------------------------------ lookups
    def table(self, seq_id: int) -> BlockTable:
        """The live table of a resident sequence (read it, never change it); typed errors for bad ids."""
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        table = self._tables.get(seq_id)
        if table is None:
            raise self._missing(seq_id)
        return table

    def _swapped_table(self, seq_id: int) -> BlockTable:
        seq_id = as_seq_id(seq_id)
        table = self._swapped.get(seq_id)
        if table is None:
            self.table(seq_id)  # raises for unknown ids
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        return table

    def _missing(self, seq_id: object) -> Exception:
        if seq_id in self._swapped:
            return SequenceStateError(f"sequence {seq_id} is swapped out; swap_in({seq_id}) first")
        return UnknownSequenceError(f"sequence {seq_id!r} is not allocated")

    def _check_new_id(self, seq_id: int) -> None:
        if seq_id in self._tables or seq_id in self._swapped:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")

    # ------------------------------------------------------------------ internals
    def _plan_prompt(self, num_tokens: int, token_ids: TokenIds, extra_key: ExtraKey) -> PromptPlan:
        """What allocating a prompt would take (keys, cache hits, blocks from the free queue); changes nothing."""
        tokens = self._tokens(token_ids, num_tokens)
        salt = as_extra_key(extra_key)
        keys = chain_keys(tokens, self.block_size, salt) if tokens is not None else []
        hits = self._prefix.longest_prefix(keys)
        hit_free = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        return PromptPlan(tokens, salt, keys, hits, hit_free, cdiv(num_tokens, self.block_size) - len(hits))

    def _tokens(self, token_ids: TokenIds, expected: int) -> Optional[List[int]]:
        """Validated token ids, or ``None`` when absent or prefix caching is off."""
        if token_ids is None:
            return None
        tokens = as_token_ids(token_ids, expected)
        return tokens if self.enable_prefix_caching else None

    def _grow(self, seq_id: int, table: BlockTable, num_tokens: int, token_ids: TokenIds) -> Tuple[int, ...]:
        """The checked path of ``append_tokens``: copy-on-write, new blocks, new content keys."""
        tokens = None if token_ids is None else self._tokens(token_ids, num_tokens)
        if table.token_ids is None:
            tokens = None
        new_len = table.num_tokens + num_tokens
        needed, copy = self._append_cost(table, num_tokens)
        if copy + needed > len(self._free):
            raise OutOfBlocksError(copy + needed, len(self._free), f"grow sequence {seq_id} to {new_len} tokens")
        placed = [self._copy_on_write(table, len(table.block_ids) - 1)[1]] if copy else []
        if needed:
            new_ids = self._take_blocks(needed)
            table.block_ids += new_ids
            placed += new_ids
        table.num_tokens = new_len
        if tokens is None or table.token_ids is None:
            table.token_ids = None  # the content is unknown from here on: no more keys
        else:
            table.token_ids.extend(tokens)
            first_new_key = len(table.block_keys)
            extend_chain(table.block_keys, table.token_ids, self.block_size, table.extra_key)
            self._register(table, first_new_key)
        self._refresh_limit(table)
        return tuple(placed)

    def _copy_on_write(self, table: BlockTable, index: int) -> Tuple[int, int]:
        """Give the table a private copy of its shared block at logical ``index``."""
        src = table.block_ids[index]
        (dst,) = self._take_blocks(1)
        try:
            if self.on_copy is not None:
                self.on_copy(src, dst)
        except BaseException:  # the bytes did not move: hand the block back (its cached content is forgotten)
            self._blocks[dst].ref_count = 0
            self._free.appendleft(dst)
            raise
        self._blocks[src].ref_count -= 1
        table.block_ids[index] = dst
        self._refresh_limit(table)
        self._copy_log.append((src, dst))
        self.num_copies += 1
        return (src, dst)

    def _refresh_limit(self, table: BlockTable) -> None:
        """Recompute up to what length the fast path of ``append_tokens`` may grow this table."""
        ids = table.block_ids
        if table.token_ids is not None or not ids or self._blocks[ids[-1]].ref_count != 1:
            table.append_limit = table.num_tokens
        else:
            table.append_limit = len(ids) * self.block_size

    def _register(self, table: BlockTable, start: int) -> None:
        """Make the table's full blocks from logical index ``start`` on findable by content."""
        if table.token_ids is None:
            return
        for i in range(start, len(table.block_keys)):
            key = table.block_keys[i]
            block = self._blocks[table.block_ids[i]]
            if block.block_hash is None and key not in self._prefix:
                block.block_hash = key
                self._prefix.insert(key, block.block_id)

    def _take_blocks(self, n: int) -> List[int]:
        """Pop ``n`` blocks off the free queue (the caller checked there are enough); evicts cached content."""
        ids = self._free.pop_many(n)
        blocks = self._blocks
        for block_id in ids:
            block = blocks[block_id]
            block.ref_count = 1
            if block.block_hash is not None:
                self._prefix.remove(block.block_hash)
                block.block_hash = None
        return ids

    def _release(self, block_ids: List[int]) -> None:
        """Drop one reference to each block; blocks nobody holds join the free queue, tail block first.

        (Tail blocks are then reused before head blocks, which a later prompt is likelier to share.)
        """
        blocks = self._blocks
        released = []
        for block_id in reversed(block_ids):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                released.append(block_id)
        self._free.extend_unchecked(released)  # each was held until now, so none is queued
