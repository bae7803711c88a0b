"""``BlockManager``: which sequence holds which block. Bookkeeping only, no tensors.

Its state: ``_pool`` (the :class:`BlockPool`: one :class:`Block` per physical block, the
:class:`FreeBlockQueue`, the :class:`PrefixCache`; ``_blocks``, ``_free`` and ``_prefix`` name its
parts), ``_tables`` (each resident sequence's :class:`BlockTable`), ``_swap`` (the
:class:`SwapSpace`: the CPU pool and the swapped-out sequences' tables) and ``_limits`` (the length up
to which each resident sequence may grow on the unchecked fast path of :meth:`append_tokens`).

It alone changes ref counts, and it answers the scheduler's questions (can these sequences
grow, can this one swap in) with the arithmetic the acts use. Every public method checks
before it changes anything: a call that raises changes nothing. It moves no bytes: copy-on-write
calls ``on_copy(src, dst)``; ``swap_out``/``swap_in`` return the block ids whose bytes to move.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._validate import as_count, as_seq_id, as_token_ids
from .block import Block
from .block_pool import BlockPool
from .block_questions import BlockQuestions
from .block_table import BlockTable
from .errors import BlocksInUseError, DuplicateSequenceError
from .errors import OutOfBlocksError, SequenceStateError, UnknownSequenceError
from .growth import DecodeBatch, add_blocks, append_tokens_batch, copy_shared, grow_checked
from .invariants import check_invariants
from .pool_stats import AllocatorStats, pool_stats
from .prefix_cache import PromptPlan, as_extra_key
from .swap_space import SwapSpace

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
        self._pool = BlockPool(self.num_blocks)
        self._blocks, self._free, self._prefix = self._pool.blocks, self._pool.free, self._pool.prefix
        self._tables: Dict[int, BlockTable] = {}
        self._limits: Dict[int, int] = {}  # resident sequence -> length it may reach unchecked
        self._swap = SwapSpace(self.num_cpu_blocks)
        self._edits = 0  # changes to resident tables outside append_tokens_batch's memo, which reads it
        self._batch = DecodeBatch()

    # ------------------------------------------------------------------ counts
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._swap.free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        return self._pool.num_cached_free()

    @property
    def num_copies(self) -> int:
        """Copy-on-write copies made so far."""
        return self._pool.num_copies

    @property
    def copy_log(self) -> Tuple[Tuple[int, int], ...]:
        """The copy-on-write copies made, ``(src, dst)`` block ids, oldest first (the last 4,096)."""
        return tuple(self._pool.copy_log)

    @property
    def prefix_counters(self) -> Tuple[int, int]:
        """``(queries, hits)``: full prompt blocks looked up in the prefix cache, and those found."""
        return self._prefix.queries, self._prefix.hits

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the resident sequences, oldest first."""
        return tuple(self._tables)

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        return tuple(self._swap.tables)

    def __contains__(self, seq_id: object) -> bool:
        return type(seq_id) is not bool and (seq_id in self._tables or seq_id in self._swap)

    def is_swapped(self, seq_id: int) -> bool:
        """Whether the sequence is swapped out (unknown ids raise)."""
        if as_seq_id(seq_id) in self._swap:
            return True
        self.table(seq_id)  # raises for unknown ids
        return False

    # The seed's names, as the allocator has them (a bookkeeping-only caller needs nothing else).
    @property
    def blocks(self) -> Tuple[Block, ...]:
        """Snapshots of every physical block, by id (copies: editing them changes nothing)."""
        return tuple(Block(b.block_id, b.ref_count, b.block_hash) for b in self._blocks)

    @property
    def free_blocks(self) -> Tuple[int, ...]:
        """Free block ids from head (handed out next) to tail."""
        return tuple(self._free)

    @property
    def sequence_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every resident sequence's block table, by sequence id, oldest first."""
        return {seq_id: table.copy() for seq_id, table in self._tables.items()}

    @property
    def swapped_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every swapped-out sequence's table (its block ids are CPU block ids)."""
        return {seq_id: table.copy() for seq_id, table in self._swap.tables.items()}

    @property
    def free_cpu_blocks(self) -> Tuple[int, ...]:
        """Free CPU block ids, next handed out first."""
        return tuple(self._swap.free)

    @property
    def cached_blocks(self) -> Dict[bytes, int]:
        """A copy of the prefix cache's map: content key -> block id (free blocks included)."""
        return dict(self._prefix.items())

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        return list(self.table(seq_id).block_ids)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (swapped out or not)."""
        table = self._swap.get(as_seq_id(seq_id))
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
        self._pool.take_hits(plan.hits)
        table = BlockTable(plan.hits + self._pool.take(plan.new_blocks), num_prompt_tokens, plan.tokens,
                           plan.keys, plan.salt)
        self._pool.register(table, len(plan.hits))
        self._tables[seq_id] = table
        self._refresh_limit(seq_id, table)
        return len(plan.hits) * self.block_size

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make ``child_seq_id`` share every block of ``parent_seq_id`` (ref counts go up; nothing is copied)."""
        parent = self.table(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        self._check_new_id(child_seq_id)
        self._pool.share(parent.block_ids)
        self._tables[child_seq_id] = parent.copy()
        self._limits[parent_seq_id] = self._limits[child_seq_id] = 0  # their last block is shared now
        self._edits += 1

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks (resident or swapped out); an unknown id is a no-op, as in the seed.

        A block nobody else holds goes back to the free queue keeping its content key (still findable).
        """
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        table = self._tables.pop(seq_id, None)
        if table is not None:
            del self._limits[seq_id]
            self._edits += 1
            self._pool.release(table.block_ids)
        elif seq_id in self._swap:
            self._swap.take(seq_id)

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
            if table.num_tokens <= new_len <= self._limits[seq_id]:
                table.num_tokens = new_len
                self._edits += 1
                return ()
            if num_tokens >= 0:  # args checked: a block boundary, or a shared tail to copy first
                capacity = len(table.block_ids) * self.block_size
                if self._limits[seq_id] == capacity and table.token_ids is None:  # whole new blocks only
                    return add_blocks(self, seq_id, table, new_len, capacity)
                return grow_checked(self, seq_id, table, num_tokens, None)
        return grow_checked(self, seq_id, self.table(seq_id), as_count(num_tokens, "num_tokens"), token_ids)

    append_tokens_batch = append_tokens_batch  # growth.py: the decode step's one call, with its memo

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
        (block_id,) = self._pool.take(1)
        table.append_block(block_id)
        self._refresh_limit(seq_id, table)
        return block_id

    def make_writable(self, seq_id: int, logical_blocks: Iterable[int]) -> Tuple[Tuple[int, int], ...]:
        """Before a write into these logical blocks, copy each one other tables hold; returns the copies."""
        return copy_shared(self, seq_id, self.table(seq_id), logical_blocks)

    # ------------------------------------------------------------------ swap
    def swap_out(self, seq_id: int) -> Tuple[List[int], List[int]]:
        """Give a sequence a private CPU block per block it holds, and drop its device blocks (shared ones stay).

        Returns ``(device_ids, cpu_ids)``: the owner copies ``device_ids[i]`` to ``cpu_ids[i]`` at once.
        """
        table = self.table(seq_id)
        n = len(table.block_ids)
        if n > len(self._swap.free):
            raise OutOfBlocksError(n, len(self._swap.free), f"swap out sequence {seq_id}", pool="CPU")
        device_ids = table.block_ids
        del self._tables[seq_id], self._limits[seq_id]
        self._edits += 1
        self._pool.release(device_ids)
        return list(device_ids), self._swap.store(seq_id, table)

    def swap_in(self, seq_id: int) -> Tuple[List[int], List[int]]:
        """Bring a swapped-out sequence back onto fresh device blocks; returns ``(cpu_ids, device_ids)`` to copy."""
        table = self._swapped_table(seq_id)
        n = len(table.block_ids)
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free), f"swap in sequence {seq_id}")
        self._swap.take(seq_id)
        cpu_ids = table.block_ids
        table.block_ids = self._pool.take(n)
        self._pool.register(table, 0)
        self._tables[seq_id] = table
        self._refresh_limit(seq_id, table)
        return list(cpu_ids), list(table.block_ids)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block's content key (after new weights); refused while any block is in use."""
        used = self.num_used_blocks
        if used:
            raise BlocksInUseError(f"cannot reset the prefix cache: {used} blocks are in use")
        return self._pool.forget_content()

    # ------------------------------------------------------------------ lookups
    def table(self, seq_id: int) -> BlockTable:
        """The live table of a resident sequence (read it, never change it); typed errors for bad ids."""
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        table = self._tables.get(seq_id)
        if table is None:
            raise self._missing(seq_id)
        return table

    def stats(self) -> AllocatorStats:
        """Block counts, tokens stored (distinct filled slots), utilization and sharing counters."""
        return pool_stats(self)

    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` if the bookkeeping is inconsistent (it never should be)."""
        check_invariants(self)

    def _swapped_table(self, seq_id: int) -> BlockTable:
        seq_id = as_seq_id(seq_id)
        table = self._swap.get(seq_id)
        if table is None:
            self.table(seq_id)  # raises for unknown ids
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        return table

    def _missing(self, seq_id: object) -> Exception:
        if seq_id in self._swap:
            return SequenceStateError(f"sequence {seq_id} is swapped out; swap_in({seq_id}) first")
        return UnknownSequenceError(f"sequence {seq_id!r} is not allocated")

    def _check_new_id(self, seq_id: int) -> None:
        if seq_id in self._tables or seq_id in self._swap:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")

    # ------------------------------------------------------------------ internals
    def _plan_prompt(self, num_tokens: int, token_ids: TokenIds, extra_key: ExtraKey) -> PromptPlan:
        """What allocating a prompt would take (keys, cache hits, blocks from the free queue); changes nothing."""
        return self._pool.plan_prompt(self._tokens(token_ids, num_tokens), as_extra_key(extra_key), num_tokens,
                                      self.block_size)

    def _tokens(self, token_ids: TokenIds, expected: int) -> Optional[List[int]]:
        """Validated token ids, or ``None`` when absent or prefix caching is off."""
        if token_ids is None:
            return None
        tokens = as_token_ids(token_ids, expected)
        return tokens if self.enable_prefix_caching else None


    def _refresh_limit(self, seq_id: int, table: BlockTable) -> None:
        """Recompute up to what length the fast path of ``append_tokens`` may grow this resident table:
        its capacity when its last block is its own and it tracks no content, else its length."""
        self._edits += 1
        ids = table.block_ids
        if table.token_ids is not None or not ids or self._blocks[ids[-1]].ref_count != 1:
            self._limits[seq_id] = table.num_tokens
        else:
            self._limits[seq_id] = len(ids) * self.block_size
