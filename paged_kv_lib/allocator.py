"""``PagedKVCacheAllocator``: the memory manager of a paged KV cache.

It owns the cache tensors, the physical blocks, the free queue and every sequence's
block table, and it is the only code that changes a block's reference count. Every
public method checks its arguments and its preconditions *before* it changes anything,
so a call that raises leaves the allocator exactly as it was.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ._validate import as_count, as_seq_id
from .block import Block
from .block_table import BlockTable
from .cache_ops import gather_tokens, slots_from_positions, write_slots
from .errors import (
    DuplicateSequenceError,
    InvariantError,
    OutOfBlocksError,
    PositionError,
    UnknownSequenceError,
)
from .free_queue import FreeBlockQueue

Positions = Union[int, Sequence[int], range, torch.Tensor]

_NO_NEW_BLOCKS: Tuple[int, ...] = ()


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the pool: block counts, tokens stored, and how full used blocks are."""

    total_blocks: int
    free_blocks: int
    used_blocks: int
    num_sequences: int
    tokens_stored: int
    logical_tokens: int
    utilization: float

    def as_dict(self) -> dict:
        return asdict(self)


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
    ) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.num_heads = as_count(num_heads, "num_heads", minimum=1)
        self.head_dim = as_count(head_dim, "head_dim", minimum=1)
        self.num_layers = as_count(num_layers, "num_layers", minimum=1)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)

        self.k_caches: Tuple[torch.Tensor, ...] = ()
        self.v_caches: Tuple[torch.Tensor, ...] = ()
        self._kv: Optional[torch.Tensor] = None
        if allocate_cache:
            shape = (2, self.num_layers, self.num_blocks, self.num_heads, self.block_size, self.head_dim)
            self._kv = torch.zeros(shape, dtype=dtype, device=self.device)
            self.k_caches = tuple(self._kv[0].unbind(0))
            self.v_caches = tuple(self._kv[1].unbind(0))

        self._blocks: List[Block] = [Block(i) for i in range(self.num_blocks)]
        self._free = FreeBlockQueue(self.num_blocks, range(self.num_blocks))
        self._tables: Dict[int, BlockTable] = {}

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
        return tuple(Block(b.block_id, b.ref_count, b.block_hash) for b in self._blocks)

    @property
    def free_blocks(self) -> Tuple[int, ...]:
        """Free block ids from head (handed out next) to tail."""
        return tuple(self._free)

    @property
    def sequence_block_tables(self) -> Dict[int, BlockTable]:
        """Copies of every sequence's block table, by sequence id."""
        return {seq_id: table.copy() for seq_id, table in self._tables.items()}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the allocated sequences, oldest first."""
        return tuple(self._tables)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables

    def __repr__(self) -> str:
        return (
            f"PagedKVCacheAllocator(free_blocks={len(self._free)}/{self.num_blocks}, "
            f"block_size={self.block_size}, sequences={len(self._tables)})"
        )

    # ------------------------------------------------------------ allocation
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        num_tokens = as_count(num_tokens, "num_tokens")
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens would fit right now."""
        return self.blocks_needed(num_tokens) <= len(self._free)

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> int:
        """Give a new sequence the blocks for its prompt; returns the prompt tokens found cached."""
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        if seq_id in self._tables:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")
        needed = -(-num_prompt_tokens // self.block_size)
        if needed > len(self._free):
            raise OutOfBlocksError(needed, len(self._free), f"allocate sequence {seq_id}")
        table = BlockTable(self._take_blocks(needed), num_prompt_tokens)
        self._tables[seq_id] = table
        return 0

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks; an unknown id is a no-op (as in the seed)."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return
        # Tail first: the tail blocks reach the head of the free queue first, so they are
        # reused before the head blocks (which are likelier to be shared later).
        for block_id in reversed(table.block_ids):
            self._release(block_id)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's physical block ids, in logical order."""
        return list(self._table(seq_id).block_ids)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds."""
        return self._table(seq_id).num_tokens

    def append_block_to_sequence(self, seq_id: int) -> int:
        """Reserve one more (empty) block for a sequence whose blocks are all full.

        The seed's low-level step; :meth:`append_tokens` calls the same logic when it is
        needed. Refused while the sequence still has a free slot (the block would sit
        empty). Returns the new block id.
        """
        table = self._table(seq_id)
        if table.num_tokens < len(table.block_ids) * self.block_size:
            raise ValueError(
                f"sequence {seq_id} still has room: {table.num_tokens} tokens in "
                f"{len(table.block_ids)} blocks of {self.block_size}"
            )
        if not self._free:
            raise OutOfBlocksError(1, 0, f"append a block to sequence {seq_id}")
        (block_id,) = self._take_blocks(1)
        table.block_ids.append(block_id)
        return block_id

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> Tuple[int, ...]:
        """Grow a sequence by ``num_tokens``, adding exactly the blocks it now needs.

        A new block is needed when the first new token's position is a multiple of
        ``block_size`` (the seed checked ``(length + 1) % block_size == 0``, one token
        too early, and so never made room after a prompt that filled its last block).
        Returns the ids of the new blocks (an empty tuple on most decode steps).
        """
        table = self._tables.get(seq_id)
        if table is None:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        new_len = table.num_tokens + num_tokens
        capacity = len(table.block_ids) * self.block_size
        if new_len <= capacity:
            table.num_tokens = new_len
            return _NO_NEW_BLOCKS
        needed = -(-(new_len - capacity) // self.block_size)
        if needed > len(self._free):
            raise OutOfBlocksError(
                needed, len(self._free), f"grow sequence {seq_id} to {new_len} tokens"
            )
        new_ids = self._take_blocks(needed)
        table.block_ids.extend(new_ids)
        table.num_tokens = new_len
        return tuple(new_ids)

    # ------------------------------------------------- address translation, K/V
    def slot_mapping(self, seq_id: int, positions: Positions) -> torch.Tensor:
        """Slots (``block_id * block_size + offset``) of logical positions, int64 on the cache device."""
        table = self._table(seq_id)
        pos = self._positions(seq_id, table, positions)
        ids = torch.tensor(table.block_ids, dtype=torch.int64, device=self.device)
        return slots_from_positions(ids, pos, self.block_size)

    def block_table_tensor(
        self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None
    ) -> torch.Tensor:
        """The block tables of ``seq_ids`` as an int32 ``[len(seq_ids), max_blocks]`` tensor padded with -1.

        ``max_blocks`` defaults to the longest table; a larger fixed width suits kernels
        captured once for many steps.
        """
        tables = [self._table(s) for s in list(seq_ids)]
        longest = max((len(t.block_ids) for t in tables), default=0)
        width = longest if max_blocks is None else as_count(max_blocks, "max_blocks")
        if width < longest:
            raise ValueError(f"max_blocks={width} is less than the longest table ({longest} blocks)")
        rows = [t.block_ids + [-1] * (width - len(t.block_ids)) for t in tables]
        out = torch.tensor(rows, dtype=torch.int32) if rows else torch.empty((0, width), dtype=torch.int32)
        return out.reshape(len(tables), width).to(self.device)

    def write_kv(
        self,
        seq_id: int,
        positions: Positions,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        layer: int = 0,
    ) -> None:
        """Store ``k``/``v`` (``[n, num_heads, head_dim]``) at the sequence's logical positions."""
        table = self._table(seq_id)
        layer = self._layer(layer)
        pos = self._positions(seq_id, table, positions)
        if pos.numel() != pos.unique().numel():
            raise PositionError(f"positions for sequence {seq_id} repeat: {pos.tolist()}")
        expected = (pos.numel(), self.num_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {expected} [n, num_heads, head_dim]")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, the cache holds {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the cache is on {self.device}")
        ids = torch.tensor(table.block_ids, dtype=torch.int64, device=self.device)
        slots = slots_from_positions(ids, pos, self.block_size)
        write_slots(self.k_caches[layer], self.v_caches[layer], slots, k, v)

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as contiguous ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self._table(seq_id)
        layer = self._layer(layer)
        ids = torch.tensor(table.block_ids, dtype=torch.int64, device=self.device)
        k = gather_tokens(self.k_caches[layer], ids, table.num_tokens)
        v = gather_tokens(self.v_caches[layer], ids, table.num_tokens)
        return k, v

    # ------------------------------------------------------------ inspection
    def stats(self) -> AllocatorStats:
        """Block counts, tokens stored (distinct filled slots) and utilization of used blocks."""
        fill: Dict[int, int] = {}
        logical = 0
        for table in self._tables.values():
            logical += table.num_tokens
            remaining = table.num_tokens
            for block_id in table.block_ids:
                here = min(remaining, self.block_size)
                if here > fill.get(block_id, 0):
                    fill[block_id] = here
                remaining -= here
        stored = sum(fill.values())
        used = self.num_used_blocks
        return AllocatorStats(
            total_blocks=self.num_blocks,
            free_blocks=len(self._free),
            used_blocks=used,
            num_sequences=len(self._tables),
            tokens_stored=stored,
            logical_tokens=logical,
            utilization=stored / (used * self.block_size) if used else 0.0,
        )

    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` if the bookkeeping is inconsistent (it never should be)."""
        try:
            self._free.check()
        except AssertionError as exc:
            raise InvariantError(f"free queue: {exc}") from None
        holders = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            for block_id in table.block_ids:
                holders[block_id] += 1
            least = -(-table.num_tokens // self.block_size)
            if not least <= len(table.block_ids) <= least + 1:
                raise InvariantError(
                    f"sequence {seq_id} has {table.num_tokens} tokens in {len(table.block_ids)} blocks"
                )
            if len(table.block_ids) == least + 1 and table.num_tokens % self.block_size and least:
                raise InvariantError(f"sequence {seq_id} reserved a block while its last one has room")
        for block in self._blocks:
            if block.ref_count != holders[block.block_id]:
                raise InvariantError(
                    f"block {block.block_id} has ref_count {block.ref_count} "
                    f"but {holders[block.block_id]} tables hold it"
                )
            queued = block.block_id in self._free
            if queued == (block.ref_count > 0):
                state = "queued as free" if queued else "missing from the free queue"
                raise InvariantError(f"block {block.block_id} has ref_count {block.ref_count} but is {state}")
        if len(self._free) + sum(1 for b in self._blocks if b.ref_count) != self.num_blocks:
            raise InvariantError("free + used blocks != total")

    # ------------------------------------------------------------- internals
    def _table(self, seq_id: int) -> BlockTable:
        table = self._tables.get(seq_id)
        if table is None:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        return table

    def _layer(self, layer: int) -> int:
        if self._kv is None:
            raise RuntimeError("this allocator was built with allocate_cache=False: it holds no K/V")
        layer = as_count(layer, "layer")
        if layer >= self.num_layers:
            raise ValueError(f"layer {layer} out of range: the cache has {self.num_layers} layers")
        return layer

    def _positions(self, seq_id: int, table: BlockTable, positions: Positions) -> torch.Tensor:
        """Validate logical positions and return them as an int64 tensor on the cache device."""
        if isinstance(positions, torch.Tensor):
            if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
                raise TypeError(f"positions must hold integers, got dtype {positions.dtype}")
            pos = positions.reshape(-1).to(device=self.device, dtype=torch.int64)
        else:
            if isinstance(positions, (int, bool)) or hasattr(positions, "__index__"):
                positions = [positions]
            values = [as_count(p, "position") for p in positions]
            pos = torch.tensor(values, dtype=torch.int64, device=self.device)
        if pos.numel():
            low, high = int(pos.min()), int(pos.max())
            if low < 0 or high >= table.num_tokens:
                bad = low if low < 0 else high
                raise PositionError(
                    f"position {bad} is outside sequence {seq_id}, which holds "
                    f"{table.num_tokens} tokens (valid: 0..{table.num_tokens - 1})"
                )
        return pos

    def _take_blocks(self, n: int) -> List[int]:
        """Pop ``n`` blocks off the free queue (caller checked there are enough)."""
        ids = []
        for _ in range(n):
            block_id = self._free.popleft()
            block = self._blocks[block_id]
            block.ref_count = 1
            block.block_hash = None
            ids.append(block_id)
        return ids

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free.append(block_id)
