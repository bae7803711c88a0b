"""``PagedKVCacheAllocator``: the seed's allocator, a block manager that also holds the K/V tensors.

The seed lesson's class, with its names and meaning: ``allocate_for_sequence``, ``free_sequence``,
``get_block_mapping``, ``append_block_to_sequence``, ``k_cache``, ``v_cache``, ``free_blocks``,
``blocks``, ``sequence_block_tables``. It *is* a :class:`~paged_kv_lib.block_manager.BlockManager`
(every bookkeeping act and question is the manager's own method, not restated here) that owns a
:class:`~paged_kv_lib.kv_cache.KVCache`; this module writes out only what touches the tensors:
copy-on-write's copy, swapping, address translation and K/V reads and writes.

Every public method checks its arguments and preconditions before it changes anything, so a call
that raises leaves the allocator (tensors included) exactly as it was.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple, Union

import torch

from .block_manager import AllocatorStats, BlockManager, ExtraKey, TokenIds
from .errors import PositionError
from .kv_cache import KVCache, Positions, padded_block_tables

__all__ = ["AllocatorStats", "ExtraKey", "PagedKVCacheAllocator", "Positions", "TokenIds"]


class PagedKVCacheAllocator(BlockManager):
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

    ``cache`` (the :class:`KVCache`) holds the tensors.
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
        self.cache = KVCache(num_blocks, block_size, num_heads, head_dim, dtype, device, num_layers=num_layers,
                             num_cpu_blocks=num_cpu_blocks, allocate_cache=allocate_cache)
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                         num_cpu_blocks=num_cpu_blocks, on_copy=self.cache.copy_block)
        self.num_layers, self.num_heads, self.head_dim = self.cache.num_layers, self.cache.num_heads, self.cache.head_dim
        self.dtype, self.device = self.cache.dtype, self.cache.device
        self.k_caches, self.v_caches = self.cache.k_caches, self.cache.v_caches

    @property
    def k_cache(self) -> Optional[torch.Tensor]:
        """Layer 0's K cache, ``(num_blocks, num_heads, block_size, head_dim)``."""
        return self.k_caches[0] if self.k_caches else None

    @property
    def v_cache(self) -> Optional[torch.Tensor]:
        """Layer 0's V cache, ``(num_blocks, num_heads, block_size, head_dim)``."""
        return self.v_caches[0] if self.v_caches else None

    def __repr__(self) -> str:
        return (f"PagedKVCacheAllocator(free_blocks={self.num_free_blocks}/{self.num_blocks}, "
                f"block_size={self.block_size}, sequences={len(self.seq_ids)})")

    # ------------------------------------------------- address translation, K/V
    def slot_mapping(self, seq_id: int, positions: Positions) -> torch.Tensor:
        """Slots (``block_id * block_size + offset``) of logical positions, int64 on the cache device."""
        table = self.table(seq_id)
        return self.cache.slots(table.block_ids, self.cache.positions(seq_id, table.num_tokens, positions))

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The block tables of ``seq_ids`` as an int32 ``[len(seq_ids), max_blocks]`` tensor padded with -1.

        ``max_blocks`` defaults to the longest table; a larger fixed width suits kernels
        captured once for many steps.
        """
        return padded_block_tables([self.table(s).block_ids for s in list(seq_ids)], self.device,
                                   max_blocks=max_blocks)

    def write_kv(self, seq_id: int, positions: Positions, k: torch.Tensor, v: torch.Tensor, *,
                 layer: int = 0) -> Tuple[Tuple[int, int], ...]:
        """Store ``k``/``v`` (``[n, num_heads, head_dim]``) at the sequence's logical positions.

        Writing into a block other sequences also hold copies it first (all layers), so
        they keep seeing their data. Returns the ``(src, dst)`` block copies this made.
        """
        table = self.table(seq_id)
        layer = self.cache.layer(layer)
        pos = self.cache.positions(seq_id, table.num_tokens, positions)
        if pos.numel() != pos.unique().numel():
            raise PositionError(f"positions for sequence {seq_id} repeat: {pos.tolist()}")
        self.cache.check_kv(k, v, pos.numel())
        copies = self.make_writable(seq_id, (pos // self.block_size).tolist())
        self.cache.write(table.block_ids, pos, k, v, layer)
        return copies

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as contiguous ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self.table(seq_id)
        return self.cache.gather(table.block_ids, table.num_tokens, self.cache.layer(layer))

    # ------------------------------------------------------------------ swapping moves bytes
    def swap_out(self, *seq_ids: int) -> Optional[Tuple[List[int], List[int]]]:
        """Move these sequences' K/V to the CPU pool and free their device blocks, all or none; returns
        ``(device_ids, cpu_ids)``, or ``None`` (nothing changed) when the CPU pool cannot hold them all. Blocks
        a sequence shares with others stay on the device for them; each gets a private CPU copy of every block."""
        moved = super().swap_out(*seq_ids)
        if moved is not None:
            self.cache.swap_out(*moved)  # at once: nothing has reused the released blocks yet
        return moved

    def swap_in(self, *seq_ids: int, watermark: float = 0.0) -> Optional[Tuple[List[int], List[int]]]:
        """Bring swapped-out sequences back to (possibly different) device blocks, bit-exact, all or none, leaving
        the watermark free; returns ``(cpu_ids, device_ids)``, or ``None`` (nothing changed) when they do not fit."""
        moved = super().swap_in(*seq_ids, watermark=watermark)
        if moved is not None:
            self.cache.swap_in(*moved)
        return moved
