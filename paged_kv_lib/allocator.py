"""``PagedKVCacheAllocator``: the seed's allocator, a block manager and a KV store in one object.

The seed lesson's class, with its names and meaning: ``allocate_for_sequence``,
``free_sequence``, ``get_block_mapping``, ``append_block_to_sequence``, ``k_cache``,
``v_cache``, ``free_blocks``, ``blocks``, ``sequence_block_tables``. It composes three
parts that each read in one sitting:

* :class:`~paged_kv_lib.block_manager.BlockManager` decides which block holds what
  (tables, ref counts, the free queue, prefix caching, copy-on-write, swap bookkeeping)
  and answers the scheduler's questions;
* :class:`~paged_kv_lib.kv_store.KVStore` holds the cache tensors and moves their bytes;
* :func:`~paged_kv_lib.invariants.check_invariants` checks the bookkeeping from scratch.

Every public method checks its arguments and preconditions before it changes anything,
so a call that raises leaves the allocator exactly as it was.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .block import Block
from .block_manager import BlockManager, ExtraKey, TokenIds
from .block_table import BlockTable
from .cache_ops import padded_block_tables
from .errors import PositionError
from .kv_store import KVStore, Positions
from .pool_stats import AllocatorStats

__all__ = ["AllocatorStats", "PagedKVCacheAllocator", "Positions", "TokenIds"]


class PagedKVCacheAllocator:
    """Hands out fixed-size blocks of a preallocated KV cache to growing sequences.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        num_heads: K/V heads stored per token.
        head_dim: size of each head.
        dtype: element type of the cache tensors.
        device: where the cache tensors live.
        num_layers: one K and one V cache per transformer layer, all indexed by the same
            block ids. With the default 1, ``k_cache``/``v_cache`` are the seed's tensors.
        allocate_cache: ``False`` skips the tensors (bookkeeping only, for simulations).
        enable_prefix_caching: find full blocks again by content (needs ``token_ids``).
        num_cpu_blocks: size of the CPU swap space, in blocks.

    ``manager`` (the :class:`BlockManager`) and ``store`` (the :class:`KVStore`) are its parts.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
        *,
        num_layers: int = 1,
        allocate_cache: bool = True,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.store = KVStore(num_blocks, block_size, num_heads, head_dim, dtype, device, num_layers=num_layers,
                             num_cpu_blocks=num_cpu_blocks, allocate_cache=allocate_cache)
        self.manager = BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                                    num_cpu_blocks=num_cpu_blocks, on_copy=self.store.copy_block)
        store = self.store
        self.num_blocks, self.block_size, self.num_layers = store.num_blocks, store.block_size, store.num_layers
        self.num_heads, self.head_dim, self.num_cpu_blocks = store.num_heads, store.head_dim, store.num_cpu_blocks
        self.dtype, self.device = store.dtype, store.device
        self.enable_prefix_caching = self.manager.enable_prefix_caching
        self.k_caches, self.v_caches = store.k_caches, store.v_caches
        self._grow = self.manager.append_tokens  # bound once: append_tokens is on every decode step's path

    # ------------------------------------------------------------------ views
    @property
    def k_cache(self) -> Optional[torch.Tensor]:
        """Layer 0's K cache, ``(num_blocks, num_heads, block_size, head_dim)``."""
        return self.k_caches[0] if self.k_caches else None

    @property
    def v_cache(self) -> Optional[torch.Tensor]:
        """Layer 0's V cache, ``(num_blocks, num_heads, block_size, head_dim)``."""
        return self.v_caches[0] if self.v_caches else None

    @property
    def blocks(self) -> Tuple[Block, ...]:
        """Snapshots of every physical block (copies: editing them changes nothing)."""
        return self.manager.blocks

    @property
    def free_blocks(self) -> Tuple[int, ...]:
        """Free block ids from head (handed out next) to tail."""
        return self.manager.free_blocks

    @property
    def sequence_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every device-resident sequence's block table, by sequence id."""
        return self.manager.sequence_block_tables

    @property
    def copy_log(self) -> Tuple[Tuple[int, int], ...]:
        """The copy-on-write copies made, ``(src, dst)`` block ids, oldest first (the last 4,096)."""
        return self.manager.copy_log

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.manager.num_used_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        """Free blocks in the CPU swap space."""
        return self.manager.num_free_cpu_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        return self.manager.num_cached_free_blocks

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the device-resident sequences, oldest first."""
        return self.manager.seq_ids

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        """Ids of the sequences swapped out to the CPU pool."""
        return self.manager.swapped_seq_ids

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.manager

    def is_swapped(self, seq_id: int) -> bool:
        """Whether the sequence is swapped out (unknown ids raise)."""
        return self.manager.is_swapped(seq_id)

    def __repr__(self) -> str:
        return (
            f"PagedKVCacheAllocator(free_blocks={self.num_free_blocks}/{self.num_blocks}, "
            f"block_size={self.block_size}, sequences={len(self.manager.seq_ids)})"
        )

    # ------------------------------------------------------- the scheduler's questions
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return self.manager.blocks_needed(num_tokens)

    def watermark_blocks(self, watermark: float) -> int:
        """Blocks an admission must leave free: ``ceil(watermark * num_blocks)`` (the one watermark rule)."""
        return self.manager.watermark_blocks(watermark)

    def can_allocate(
        self, num_tokens: int, *, token_ids: TokenIds = None, watermark: float = 0.0, extra_key: ExtraKey = None
    ) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits now, cache hits counted.

        With a ``watermark`` it must also leave ``watermark_blocks(watermark)`` blocks
        free, headroom for the running sequences to grow.
        """
        return self.manager.can_allocate(num_tokens, token_ids=token_ids, watermark=watermark, extra_key=extra_key)

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``append_tokens(seq_id, num_tokens)`` would take now.

        The new blocks the longer sequence needs, plus one when its last block is shared
        and not full (copy-on-write). For this sequence alone; :meth:`can_append` counts
        a tail several growing sequences share once per copy actually made.
        """
        return self.manager.blocks_to_append(seq_id, num_tokens)

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in the same step, leaving the watermark.

        A tail held by ``r`` tables and grown by ``k`` of them is copied ``min(k, r - 1)``
        times (the last holder writes in place). Unknown, swapped-out or repeated ids raise.
        """
        return self.manager.can_append(seq_ids, num_tokens, watermark=watermark)

    def appendable_tokens(self, seq_id: int, up_to: int, *, watermark: float = 0.0) -> int:
        """The most tokens, at most ``up_to``, the sequence can grow by now (how much of a prompt chunk fits)."""
        return self.manager.appendable_tokens(seq_id, up_to, watermark=watermark)

    def cached_prefix_tokens(self, token_ids: Sequence[int], *, extra_key: ExtraKey = None) -> int:
        """How many leading tokens of a prompt the prefix cache holds now (whole blocks); changes nothing."""
        return self.manager.cached_prefix_tokens(token_ids, extra_key=extra_key)

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        """Whether a swapped-out sequence fits back on the device now, leaving the watermark free."""
        return self.manager.can_swap_in(seq_id, watermark=watermark)

    def can_swap_out(self, seq_ids: Iterable[int]) -> bool:
        """Whether the CPU pool has room for all these resident sequences at once (a private copy of every block)."""
        return self.manager.can_swap_out(seq_ids)

    def can_allocate_many(
        self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None, watermark: float = 0.0,
        extra_key: ExtraKey = None,
    ) -> bool:
        """Whether several new sequences (``num_tokens[i]`` tokens each) fit now together, leaving the watermark."""
        return self.manager.can_allocate_many(num_tokens, token_ids=token_ids, watermark=watermark, extra_key=extra_key)

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens may hold, the watermark added."""
        return self.manager.blocks_to_hold(num_tokens, num_seqs=num_seqs, watermark=watermark)

    def can_ever_fit(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> bool:
        """Whether ``num_seqs`` sequences of up to ``num_tokens`` tokens fit the empty pool, leaving the watermark."""
        return self.manager.can_ever_fit(num_tokens, num_seqs=num_seqs, watermark=watermark)

    # ------------------------------------------------------------------ blocks
    def allocate_for_sequence(
        self, seq_id: int, num_prompt_tokens: int, *, token_ids: TokenIds = None, extra_key: ExtraKey = None
    ) -> int:
        """Give a new sequence the blocks for its prompt; returns how many prompt tokens were found cached.

        With ``token_ids`` (the prompt's tokens) and prefix caching on, the longest run of
        leading full blocks whose content is cached is reused instead of allocated: their
        K/V is already in the cache, so only the remaining tokens need computing.
        ``extra_key`` salts every key (sequences with different salts never share).
        """
        return self.manager.allocate_for_sequence(seq_id, num_prompt_tokens, token_ids=token_ids, extra_key=extra_key)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make ``child_seq_id`` share every block of ``parent_seq_id`` (nothing is copied).

        Both see the same K/V until one writes into a shared block; that write copies the
        block first (copy-on-write). Parallel sampling and beam search start this way.
        """
        self.manager.fork(parent_seq_id, child_seq_id)

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks; an unknown id is a no-op (as in the seed).

        A block returns to the free queue only when no other sequence holds it. A full
        block keeps its content key there, so a later prompt can still hit it until the
        block is handed out again.
        """
        self.manager.free_sequence(seq_id)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's physical block ids, in logical order."""
        return self.manager.get_block_mapping(seq_id)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (swapped out or not)."""
        return self.manager.get_num_tokens(seq_id)

    def append_block_to_sequence(self, seq_id: int) -> int:
        """Reserve one more (empty) block for a sequence whose blocks are all full; returns its id.

        The seed's low-level step; :meth:`append_tokens` does this by itself when needed.
        Refused while the sequence still has a free slot (the block would sit empty).
        """
        return self.manager.append_block_to_sequence(seq_id)

    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow a sequence by ``num_tokens``, adding exactly the blocks it now needs.

        A new block is needed when the first new token's position is a multiple of
        ``block_size`` (the seed checked ``(length + 1) % block_size == 0``, one token
        too early, and so never made room after a prompt that filled its last block).
        If the last block is shared, it is copied first (copy-on-write). Returns the ids
        of blocks newly placed in the table (an empty tuple on most decode steps).
        ``token_ids`` are the new tokens, so blocks that fill up become cacheable.
        """
        return self._grow(seq_id, num_tokens, token_ids=token_ids)

    def append_tokens_batch(
        self, seq_ids: Iterable[int], num_tokens: int = 1, *, token_ids: Optional[Sequence[TokenIds]] = None
    ) -> Dict[int, Tuple[int, ...]]:
        """Grow every listed sequence by ``num_tokens`` in one call; returns ``{seq_id: block ids placed}``.

        The decode step's growth: validated once, atomic (repeated, unknown or swapped-out ids, or
        too few blocks for all of them, raise before anything changes). Only sequences that got
        a new or copied block appear in the result; copy-on-write copies the bytes of a shared
        last block as :meth:`append_tokens` does.
        """
        return self.manager.append_tokens_batch(seq_ids, num_tokens, token_ids=token_ids)

    # ------------------------------------------------- address translation, K/V
    def slot_mapping(self, seq_id: int, positions: Positions) -> torch.Tensor:
        """Slots (``block_id * block_size + offset``) of logical positions, int64 on the cache device."""
        table = self.manager.table(seq_id)
        return self.store.slots(table.block_ids, self.store.positions(seq_id, table.num_tokens, positions))

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The block tables of ``seq_ids`` as an int32 ``[len(seq_ids), max_blocks]`` tensor padded with -1.

        ``max_blocks`` defaults to the longest table; a larger fixed width suits kernels
        captured once for many steps.
        """
        tables = [self.manager.table(s).block_ids for s in list(seq_ids)]
        return padded_block_tables(tables, self.device, max_blocks=max_blocks)

    def write_kv(
        self, seq_id: int, positions: Positions, k: torch.Tensor, v: torch.Tensor, *, layer: int = 0
    ) -> Tuple[Tuple[int, int], ...]:
        """Store ``k``/``v`` (``[n, num_heads, head_dim]``) at the sequence's logical positions.

        Writing into a block other sequences also hold copies it first (all layers), so
        they keep seeing their data. Returns the ``(src, dst)`` block copies this made.
        """
        table = self.manager.table(seq_id)
        layer = self.store.layer(layer)
        pos = self.store.positions(seq_id, table.num_tokens, positions)
        if pos.numel() != pos.unique().numel():
            raise PositionError(f"positions for sequence {seq_id} repeat: {pos.tolist()}")
        self.store.check_kv(k, v, pos.numel())
        copies = self.manager.make_writable(seq_id, (pos // self.block_size).tolist())
        self.store.write(table.block_ids, pos, k, v, layer)
        return copies

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as contiguous ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self.manager.table(seq_id)
        return self.store.gather(table.block_ids, table.num_tokens, self.store.layer(layer))

    # ------------------------------------------------------------------ swapping
    def swap_out(self, seq_id: int) -> None:
        """Move a sequence's K/V to the CPU pool and free its device blocks.

        Blocks it shares with others stay on the device for them (only this sequence's
        reference is dropped); the sequence gets a private CPU copy of every block.
        """
        device_ids, cpu_ids = self.manager.swap_out(seq_id)
        self.store.swap_out(device_ids, cpu_ids)  # at once: nothing has reused the released blocks yet

    def swap_in(self, seq_id: int) -> List[int]:
        """Bring a swapped-out sequence back to (possibly different) device blocks, bit-exact; returns them."""
        cpu_ids, device_ids = self.manager.swap_in(seq_id)
        self.store.swap_in(cpu_ids, device_ids)
        return device_ids

    def reset_prefix_cache(self) -> int:
        """Forget every cached block's content key; refused while any block is in use.

        Returns how many keys were dropped. (Used after changing model weights: old K/V
        no longer matches the tokens.)
        """
        return self.manager.reset_prefix_cache()

    # ------------------------------------------------------------------ inspection
    def stats(self) -> AllocatorStats:
        """Block counts, tokens stored (distinct filled slots), utilization and sharing counters."""
        return self.manager.stats()

    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` if the bookkeeping is inconsistent (it never should be)."""
        self.manager.check_invariants()
