"""``PagedKVCacheAllocator``: the memory manager of a paged KV cache.

It owns the cache tensors, the physical blocks, the free queue and every sequence's
block table, and it is the only code that changes a block's reference count. Every
public method checks its arguments and its preconditions *before* it changes anything,
so a call that raises leaves the allocator exactly as it was.

Beyond the seed lesson it shares memory: ``fork`` lets sequences share blocks (ref
counts), writing into a shared block copies it first (copy-on-write), full blocks are
found again by content (prefix caching), and sequences can be swapped to a CPU pool.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import asdict, dataclass
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ._validate import as_count, as_fraction, as_seq_id
from .block import Block
from .block_table import BlockTable
from .cache_ops import copy_blocks, gather_tokens, slots_from_positions, transfer_blocks, write_slots
from .errors import (
    BlocksInUseError,
    CacheNotAllocatedError,
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidTypeError,
    InvariantError,
    OutOfBlocksError,
    PositionError,
    SequenceStateError,
    UnknownSequenceError,
)
from .free_queue import FreeBlockQueue
from .prefix_cache import PrefixCache, block_key, chain_keys

Positions = Union[int, Sequence[int], range, torch.Tensor]
TokenIds = Optional[Sequence[int]]

_NO_NEW_BLOCKS: Tuple[int, ...] = ()


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the pool: block counts, tokens stored, sharing and caching counters."""

    total_blocks: int
    free_blocks: int
    used_blocks: int
    num_sequences: int
    tokens_stored: int
    logical_tokens: int
    utilization: float
    cached_free_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    cow_copies: int = 0
    swapped_sequences: int = 0
    cpu_free_blocks: int = 0
    cpu_total_blocks: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        """Fraction of full prompt blocks looked up that were found cached."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out


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
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.num_heads = as_count(num_heads, "num_heads", minimum=1)
        self.head_dim = as_count(head_dim, "head_dim", minimum=1)
        self.num_layers = as_count(num_layers, "num_layers", minimum=1)
        self.num_cpu_blocks = as_count(num_cpu_blocks, "num_cpu_blocks")
        if not isinstance(dtype, torch.dtype):
            raise InvalidTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.enable_prefix_caching = bool(enable_prefix_caching)

        self.k_caches: Tuple[torch.Tensor, ...] = ()
        self.v_caches: Tuple[torch.Tensor, ...] = ()
        self._kv: Optional[torch.Tensor] = None
        self._cpu_kv: Optional[torch.Tensor] = None
        per_block = (self.num_heads, self.block_size, self.head_dim)
        if allocate_cache:
            # One tensor [K|V, layer, block, head, slot, dim]: a block copy moves all layers at once.
            self._kv = torch.zeros((2, self.num_layers, self.num_blocks, *per_block), dtype=dtype, device=self.device)
            self.k_caches = tuple(self._kv[0].unbind(0))
            self.v_caches = tuple(self._kv[1].unbind(0))
            if self.num_cpu_blocks:
                pin = torch.cuda.is_available()
                self._cpu_kv = torch.zeros(
                    (2, self.num_layers, self.num_cpu_blocks, *per_block), dtype=dtype, pin_memory=pin
                )

        self._blocks: List[Block] = [Block(i) for i in range(self.num_blocks)]
        self._free = FreeBlockQueue(self.num_blocks, range(self.num_blocks))
        self._tables: Dict[int, BlockTable] = {}
        self._prefix = PrefixCache()
        self._cpu_free: Deque[int] = deque(range(self.num_cpu_blocks))
        self._swapped: Dict[int, BlockTable] = {}  # block ids here are CPU block ids
        self._copy_log: Deque[Tuple[int, int]] = deque(maxlen=4096)
        self._num_copies = 0

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
        """Copies of every device-resident sequence's block table, by sequence id."""
        return {seq_id: table.copy() for seq_id, table in self._tables.items()}

    @property
    def copy_log(self) -> Tuple[Tuple[int, int], ...]:
        """The copy-on-write copies made, ``(src, dst)`` block ids, oldest first (the last 4,096)."""
        return tuple(self._copy_log)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_free_cpu_blocks(self) -> int:
        """Free blocks in the CPU swap space."""
        return len(self._cpu_free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        return sum(1 for _, block_id in self._prefix.items() if self._blocks[block_id].ref_count == 0)

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        """Ids of the device-resident sequences, oldest first."""
        return tuple(self._tables)

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        """Ids of the sequences swapped out to the CPU pool."""
        return tuple(self._swapped)

    def __contains__(self, seq_id: object) -> bool:
        if isinstance(seq_id, bool):
            return False  # True is not sequence 1
        return seq_id in self._tables or seq_id in self._swapped

    def is_swapped(self, seq_id: int) -> bool:
        """Whether the sequence is swapped out (unknown ids raise)."""
        seq_id = as_seq_id(seq_id)
        if seq_id in self._swapped:
            return True
        self._table(seq_id)
        return False

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

    def watermark_blocks(self, watermark: float) -> int:
        """Blocks an admission must leave free: ``ceil(watermark * num_blocks)``.

        The one place the watermark rule lives; ``can_allocate``, ``can_append`` and
        ``can_swap_in`` all use it, and a scheduler should ask it rather than restate it.
        """
        watermark = as_fraction(watermark, "watermark")
        return math.ceil(watermark * self.num_blocks)

    def can_allocate(
        self,
        num_tokens: int,
        *,
        token_ids: TokenIds = None,
        watermark: float = 0.0,
        extra_key: Optional[Union[bytes, str]] = None,
    ) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits now, cache hits counted.

        With a ``watermark`` it must also leave at least ``watermark_blocks(watermark)``
        blocks free, headroom for the running sequences to grow.
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        reserve = self.watermark_blocks(watermark)
        plan = self._plan_prompt(num_tokens, token_ids, extra_key)
        return len(self._free) - plan.taken_from_free >= reserve

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``append_tokens(seq_id, num_tokens)`` would take now.

        That is the new blocks the longer sequence needs, plus one when its last block is
        shared and not full (the write copies it first: copy-on-write). Asked about this
        sequence alone; :meth:`can_append` counts a tail shared by several growing
        sequences once per copy actually made.
        """
        table = self._table(as_seq_id(seq_id))
        num_tokens = as_count(num_tokens, "num_tokens")
        new_blocks, copy = self._append_cost(table, num_tokens)
        return new_blocks + copy

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in the same step.

        The blocks they take together (new blocks, plus the copies of shared tails: a tail
        held by ``r`` tables and grown by ``k`` of them is copied ``min(k, r - 1)`` times,
        since the last holder writes in place) must leave ``watermark_blocks(watermark)``
        free. Unknown or swapped-out ids raise; so does an id listed twice.
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        reserve = self.watermark_blocks(watermark)
        if not isinstance(seq_ids, Iterable):
            raise InvalidTypeError(f"seq_ids must be an iterable of ints, got {type(seq_ids).__name__} {seq_ids!r}")
        ids = [as_seq_id(s) for s in seq_ids]
        growing: Dict[int, int] = {}  # shared tail block id -> how many listed sequences grow it
        needed = 0
        seen = set()
        for seq_id in ids:
            if seq_id in seen:
                raise InvalidArgumentError(f"sequence {seq_id} is listed twice in can_append")
            seen.add(seq_id)
            table = self._table(seq_id)
            new_blocks, copy = self._append_cost(table, num_tokens)
            needed += new_blocks
            if copy:
                tail = table.block_ids[-1]
                growing[tail] = growing.get(tail, 0) + 1
        for tail, growers in growing.items():
            needed += min(growers, self._blocks[tail].ref_count - 1)
        return len(self._free) - needed >= reserve

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        """Whether a swapped-out sequence fits back on the device now, leaving the watermark free.

        It takes one fresh device block per block it holds in the CPU pool. Unknown ids
        raise :class:`UnknownSequenceError`; resident ones :class:`SequenceStateError`.
        """
        seq_id = as_seq_id(seq_id)
        reserve = self.watermark_blocks(watermark)
        table = self._swapped.get(seq_id)
        if table is None:
            self._table(seq_id)  # raises for unknown ids
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        return len(self._free) - len(table.block_ids) >= reserve

    def allocate_for_sequence(
        self,
        seq_id: int,
        num_prompt_tokens: int,
        *,
        token_ids: TokenIds = None,
        extra_key: Optional[Union[bytes, str]] = None,
    ) -> int:
        """Give a new sequence the blocks for its prompt; returns how many prompt tokens were found cached.

        With ``token_ids`` (the prompt's tokens) and prefix caching on, the longest run of
        leading full blocks whose content is cached is reused instead of allocated: their
        K/V is already in the cache, so only the remaining tokens need computing.
        ``extra_key`` salts every key (sequences with different salts never share).
        """
        seq_id = as_seq_id(seq_id)
        num_prompt_tokens = as_count(num_prompt_tokens, "num_prompt_tokens")
        self._check_new_id(seq_id)
        plan = self._plan_prompt(num_prompt_tokens, token_ids, extra_key)
        if plan.taken_from_free > len(self._free):
            available = len(self._free) - plan.hit_free
            raise OutOfBlocksError(plan.new_blocks, available, f"allocate sequence {seq_id}")

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
        """Make ``child_seq_id`` share every block of ``parent_seq_id`` (nothing is copied).

        Both see the same K/V until one writes into a shared block; that write copies the
        block first (copy-on-write). Parallel sampling and beam search start this way.
        """
        parent = self._table(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        self._check_new_id(child_seq_id)
        for block_id in parent.block_ids:
            self._blocks[block_id].ref_count += 1
        child = parent.copy()
        parent.append_limit = child.append_limit = 0  # their last block is shared now
        self._tables[child_seq_id] = child

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks; an unknown id is a no-op (as in the seed).

        A block returns to the free queue only when no other sequence holds it. A full
        block keeps its content key there, so a later prompt can still hit it until the
        block is handed out again.
        """
        seq_id = as_seq_id(seq_id)
        table = self._tables.pop(seq_id, None)
        if table is None:
            swapped = self._swapped.pop(seq_id, None)
            if swapped is not None:
                self._cpu_free.extend(swapped.block_ids)
            return
        # Tail first: the tail blocks reach the head of the free queue first, so they are
        # reused before the head blocks (which are likelier to be shared later).
        blocks = self._blocks
        released = []
        for block_id in reversed(table.block_ids):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                released.append(block_id)
        self._free.extend(released)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's physical block ids, in logical order."""
        return list(self._table(seq_id).block_ids)

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (swapped out or not)."""
        seq_id = as_seq_id(seq_id)
        table = self._swapped.get(seq_id)
        return table.num_tokens if table is not None else self._table(seq_id).num_tokens

    def append_block_to_sequence(self, seq_id: int) -> int:
        """Reserve one more (empty) block for a sequence whose blocks are all full.

        The seed's low-level step; :meth:`append_tokens` does this by itself when needed.
        Refused while the sequence still has a free slot (the block would sit empty).
        Returns the new block id.
        """
        table = self._table(seq_id)
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

    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow a sequence by ``num_tokens``, adding exactly the blocks it now needs.

        A new block is needed when the first new token's position is a multiple of
        ``block_size`` (the seed checked ``(length + 1) % block_size == 0``, one token
        too early, and so never made room after a prompt that filled its last block).
        If the last block is shared, it is copied first (copy-on-write). Returns the ids
        of blocks newly placed in the table (an empty tuple on most decode steps).
        ``token_ids`` are the new tokens, so blocks that fill up become cacheable.
        """
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        try:
            table = self._tables[seq_id]
        except KeyError:
            raise self._missing(seq_id) from None
        # Fast path, most decode steps: room in an unshared last block, no content tracking.
        if token_ids is None and type(num_tokens) is int:
            new_len = table.num_tokens + num_tokens
            if table.num_tokens <= new_len <= table.append_limit:
                table.num_tokens = new_len
                return _NO_NEW_BLOCKS
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_count(num_tokens, "num_tokens")
        return self._grow(seq_id, table, num_tokens, token_ids)

    # ------------------------------------------------- address translation, K/V
    def slot_mapping(self, seq_id: int, positions: Positions) -> torch.Tensor:
        """Slots (``block_id * block_size + offset``) of logical positions, int64 on the cache device."""
        table = self._table(seq_id)
        pos = self._positions(seq_id, table, positions)
        return slots_from_positions(self._ids_tensor(table), pos, self.block_size)

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The block tables of ``seq_ids`` as an int32 ``[len(seq_ids), max_blocks]`` tensor padded with -1.

        ``max_blocks`` defaults to the longest table; a larger fixed width suits kernels
        captured once for many steps.
        """
        tables = [self._table(s) for s in list(seq_ids)]
        longest = max((len(t.block_ids) for t in tables), default=0)
        width = longest if max_blocks is None else as_count(max_blocks, "max_blocks")
        if width < longest:
            raise InvalidArgumentError(f"max_blocks={width} is less than the longest table ({longest} blocks)")
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
    ) -> Tuple[Tuple[int, int], ...]:
        """Store ``k``/``v`` (``[n, num_heads, head_dim]``) at the sequence's logical positions.

        Writing into a block other sequences also hold copies it first (all layers), so
        they keep seeing their data. Returns the ``(src, dst)`` block copies this made.
        """
        table = self._table(seq_id)
        layer = self._layer(layer)
        pos = self._positions(seq_id, table, positions)
        if pos.numel() != pos.unique().numel():
            raise PositionError(f"positions for sequence {seq_id} repeat: {pos.tolist()}")
        expected = (pos.numel(), self.num_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != expected:
                raise InvalidArgumentError(f"{name} has shape {tuple(t.shape)}, expected {expected} [n, num_heads, head_dim]")
            if t.dtype != self.dtype:
                raise InvalidTypeError(f"{name} has dtype {t.dtype}, the cache holds {self.dtype}")
            if t.device != self.device:
                raise InvalidArgumentError(f"{name} is on {t.device}, the cache is on {self.device}")
        logical = sorted(set((pos // self.block_size).tolist()))
        shared = [i for i in logical if self._blocks[table.block_ids[i]].ref_count > 1]
        if len(shared) > len(self._free):
            raise OutOfBlocksError(len(shared), len(self._free), f"copy shared blocks of sequence {seq_id}")
        copies = tuple(self._copy_on_write(table, i) for i in shared)
        slots = slots_from_positions(self._ids_tensor(table), pos, self.block_size)
        write_slots(self.k_caches[layer], self.v_caches[layer], slots, k, v)
        return copies

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as contiguous ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self._table(seq_id)
        layer = self._layer(layer)
        ids = self._ids_tensor(table)
        k = gather_tokens(self.k_caches[layer], ids, table.num_tokens)
        v = gather_tokens(self.v_caches[layer], ids, table.num_tokens)
        return k, v

    # ------------------------------------------------------------ swapping
    def swap_out(self, seq_id: int) -> None:
        """Move a sequence's K/V to the CPU pool and free its device blocks.

        Blocks it shares with others stay on the device for them (only this sequence's
        reference is dropped); the sequence gets a private CPU copy of every block.
        """
        table = self._table(seq_id)
        n = len(table.block_ids)
        if n > len(self._cpu_free):
            raise OutOfBlocksError(n, len(self._cpu_free), f"swap out sequence {seq_id}", pool="CPU")
        cpu_ids = [self._cpu_free.popleft() for _ in range(n)]
        if self._kv is not None and n:
            transfer_blocks(self._kv, torch.tensor(table.block_ids), self._cpu_kv, torch.tensor(cpu_ids))
        del self._tables[seq_id]
        for block_id in reversed(table.block_ids):
            self._release(block_id)
        table.block_ids = cpu_ids
        table.append_limit = 0
        self._swapped[seq_id] = table

    def swap_in(self, seq_id: int) -> List[int]:
        """Bring a swapped-out sequence back to (possibly different) device blocks, bit-exact.

        Returns its new block ids.
        """
        seq_id = as_seq_id(seq_id)
        table = self._swapped.get(seq_id)
        if table is None:
            self._table(seq_id)  # raises for unknown ids
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        n = len(table.block_ids)
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free), f"swap in sequence {seq_id}")
        device_ids = self._take_blocks(n)
        if self._kv is not None and n:
            transfer_blocks(self._cpu_kv, torch.tensor(table.block_ids), self._kv, torch.tensor(device_ids))
        del self._swapped[seq_id]
        self._cpu_free.extend(table.block_ids)
        table.block_ids = device_ids
        self._register(table, 0)
        self._refresh_limit(table)
        self._tables[seq_id] = table
        return list(device_ids)

    # ------------------------------------------------------------ prefix cache
    def reset_prefix_cache(self) -> int:
        """Forget every cached block's content key; refused while any block is in use.

        Returns how many keys were dropped. (Used after changing model weights: old K/V
        no longer matches the tokens.)
        """
        used = self.num_used_blocks
        if used:
            raise BlocksInUseError(f"cannot reset the prefix cache: {used} blocks are in use")
        dropped = len(self._prefix)
        for _, block_id in list(self._prefix.items()):
            self._blocks[block_id].block_hash = None
        self._prefix.clear()
        return dropped

    # ------------------------------------------------------------ inspection
    def stats(self) -> AllocatorStats:
        """Block counts, tokens stored (distinct filled slots), utilization and sharing counters."""
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
            cached_free_blocks=self.num_cached_free_blocks,
            prefix_queries=self._prefix.queries,
            prefix_hits=self._prefix.hits,
            cow_copies=self._num_copies,
            swapped_sequences=len(self._swapped),
            cpu_free_blocks=len(self._cpu_free),
            cpu_total_blocks=self.num_cpu_blocks,
        )

    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` if the bookkeeping is inconsistent (it never should be)."""
        try:
            self._free.check()
        except AssertionError as exc:
            raise InvariantError(f"free queue: {exc}") from None
        holders = [0] * self.num_blocks
        full_in_all = [True] * self.num_blocks
        for seq_id, table in self._tables.items():
            self._check_table(seq_id, table)
            for i, block_id in enumerate(table.block_ids):
                holders[block_id] += 1
                if (i + 1) * self.block_size > table.num_tokens:
                    full_in_all[block_id] = False
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
            if block.block_hash is not None:
                if self._prefix.get(block.block_hash) != block.block_id:
                    raise InvariantError(f"block {block.block_id} has a hash the prefix cache does not map to it")
                if block.ref_count and not full_in_all[block.block_id]:
                    raise InvariantError(f"block {block.block_id} carries a hash but is not full")
        for key, block_id in self._prefix.items():
            if self._blocks[block_id].block_hash != key:
                raise InvariantError(f"prefix cache maps a key to block {block_id}, which has another hash")
        if len(self._free) + sum(1 for b in self._blocks if b.ref_count) != self.num_blocks:
            raise InvariantError("free + used blocks != total")
        cpu_used = [b for t in self._swapped.values() for b in t.block_ids]
        if len(set(cpu_used)) != len(cpu_used) or set(cpu_used) & set(self._cpu_free):
            raise InvariantError("a CPU block is held twice, or held and free")
        if len(cpu_used) + len(self._cpu_free) != self.num_cpu_blocks:
            raise InvariantError("CPU free + used blocks != total")
        for seq_id, table in self._swapped.items():
            self._check_table(seq_id, table)
        if set(self._tables) & set(self._swapped):
            raise InvariantError("a sequence is both resident and swapped out")

    def _check_table(self, seq_id: int, table: BlockTable) -> None:
        ids = table.block_ids
        unshared = seq_id in self._tables and ids and self._blocks[ids[-1]].ref_count == 1
        limit = len(ids) * self.block_size if unshared and table.token_ids is None else table.num_tokens
        if table.append_limit > limit:
            raise InvariantError(f"sequence {seq_id} may grow to {table.append_limit} tokens unchecked, but only {limit} is safe")
        least = -(-table.num_tokens // self.block_size)
        if not least <= len(table.block_ids) <= least + 1:
            raise InvariantError(f"sequence {seq_id} has {table.num_tokens} tokens in {len(table.block_ids)} blocks")
        if len(table.block_ids) == least + 1 and table.num_tokens % self.block_size:
            raise InvariantError(f"sequence {seq_id} reserved a block while its last one has room")
        if table.token_ids is not None:
            if len(table.token_ids) != table.num_tokens:
                raise InvariantError(f"sequence {seq_id} holds {len(table.token_ids)} token ids for {table.num_tokens} tokens")
            if len(table.block_keys) != table.num_tokens // self.block_size:
                raise InvariantError(f"sequence {seq_id} has {len(table.block_keys)} keys for its full blocks")

    # ------------------------------------------------------------- internals
    def _table(self, seq_id: int) -> BlockTable:
        """The resident table of ``seq_id``; raises a typed error for bad, unknown or swapped ids."""
        if type(seq_id) is not int:
            seq_id = as_seq_id(seq_id)
        table = self._tables.get(seq_id)
        if table is None:
            raise self._missing(seq_id)
        return table

    def _missing(self, seq_id: object) -> Exception:
        if seq_id in self._swapped:
            return SequenceStateError(f"sequence {seq_id} is swapped out; swap_in({seq_id}) first")
        return UnknownSequenceError(f"sequence {seq_id!r} is not allocated")

    def _check_new_id(self, seq_id: int) -> None:
        if seq_id in self._tables or seq_id in self._swapped:
            raise DuplicateSequenceError(f"sequence {seq_id} is already allocated")

    def _layer(self, layer: int) -> int:
        if self._kv is None:
            raise CacheNotAllocatedError("this allocator was built with allocate_cache=False: it holds no K/V")
        layer = as_count(layer, "layer")
        if layer >= self.num_layers:
            raise InvalidArgumentError(f"layer {layer} out of range: the cache has {self.num_layers} layers")
        return layer

    def _ids_tensor(self, table: BlockTable) -> torch.Tensor:
        return torch.tensor(table.block_ids, dtype=torch.int64, device=self.device)

    def _positions(self, seq_id: int, table: BlockTable, positions: Positions) -> torch.Tensor:
        """Validate logical positions and return them as an int64 tensor on the cache device."""
        if isinstance(positions, torch.Tensor):
            if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
                raise InvalidTypeError(f"positions must hold integers, got dtype {positions.dtype}")
            pos = positions.reshape(-1).to(device=self.device, dtype=torch.int64)
        else:
            if isinstance(positions, (int, bool)) or hasattr(positions, "__index__"):
                positions = [positions]
            values = [as_count(p, "position", minimum=-(2**62)) for p in positions]
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

    def _token_list(self, token_ids: TokenIds, expected: int) -> Optional[List[int]]:
        """Validated token ids as a list, or ``None`` when absent or prefix caching is off."""
        if token_ids is None:
            return None
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.tolist()
        try:
            values = list(token_ids)
            tokens = array("q", values).tolist()
        except TypeError:
            raise InvalidTypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}") from None
        except OverflowError:
            raise InvalidArgumentError("token_ids must fit in signed 64 bits") from None
        if any(type(t) is bool for t in values):
            raise InvalidTypeError("token_ids must be ints, not bools")
        if len(tokens) != expected:
            raise InvalidArgumentError(f"got {len(tokens)} token_ids for {expected} tokens")
        return tokens if self.enable_prefix_caching else None

    def _plan_prompt(self, num_tokens: int, token_ids: TokenIds, extra_key: Optional[Union[bytes, str]]) -> "_PromptPlan":
        """What allocating a prompt would take: its keys, cache hits, and blocks from the free queue.

        ``can_allocate`` and ``allocate_for_sequence`` share it, so the prediction is the act.
        """
        tokens = self._token_list(token_ids, num_tokens)
        salt = _as_salt(extra_key)
        keys = chain_keys(tokens, self.block_size, salt) if tokens is not None else []
        hits = self._lookup(keys)
        hit_free = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        new_blocks = -(-num_tokens // self.block_size) - len(hits)
        return _PromptPlan(tokens, salt, keys, hits, hit_free, new_blocks)

    def _lookup(self, keys: List[bytes]) -> List[int]:
        """Block ids of the longest run of leading keys found in the prefix cache."""
        hits = []
        for key in keys:
            block_id = self._prefix.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

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

    def _grow(self, seq_id: int, table: BlockTable, num_tokens: int, token_ids: TokenIds) -> Tuple[int, ...]:
        """The slow path of ``append_tokens``: copy-on-write, new blocks, new content keys."""
        tokens = None if token_ids is None else self._token_list(token_ids, num_tokens)
        if table.token_ids is None:
            tokens = None
        old_len = table.num_tokens
        new_len = old_len + num_tokens
        needed, cow = self._append_cost(table, num_tokens)
        if cow + needed > len(self._free):
            raise OutOfBlocksError(cow + needed, len(self._free), f"grow sequence {seq_id} to {new_len} tokens")
        placed = [self._copy_on_write(table, len(table.block_ids) - 1)[1]] if cow else []
        if needed:
            new_ids = self._take_blocks(needed)
            table.block_ids += new_ids
            placed += new_ids
        table.num_tokens = new_len
        if tokens is None:
            table.token_ids = None  # the content is unknown from here on: no more keys
        else:
            table.token_ids.extend(tokens)
            first_new_key = len(table.block_keys)
            parent = table.block_keys[-1] if table.block_keys else None
            for start in range(first_new_key * self.block_size, new_len - self.block_size + 1, self.block_size):
                parent = block_key(parent, table.token_ids[start : start + self.block_size], table.extra_key)
                table.block_keys.append(parent)
            self._register(table, first_new_key)
        self._refresh_limit(table)
        return tuple(placed)

    def _append_cost(self, table: BlockTable, num_tokens: int) -> Tuple[int, bool]:
        """(new blocks, whether the shared last block is copied) for growing ``table`` by ``num_tokens``.

        ``_grow`` and the scheduler's questions share it, so the prediction is the act.
        """
        old_len = table.num_tokens
        ids = table.block_ids
        copy = num_tokens > 0 and old_len < len(ids) * self.block_size and self._blocks[ids[-1]].ref_count > 1
        return max(0, -(-(old_len + num_tokens) // self.block_size) - len(ids)), copy

    def _refresh_limit(self, table: BlockTable) -> None:
        """Recompute up to what length the fast path of ``append_tokens`` may grow this table."""
        ids = table.block_ids
        if table.token_ids is not None or not ids or self._blocks[ids[-1]].ref_count != 1:
            table.append_limit = table.num_tokens
        else:
            table.append_limit = len(ids) * self.block_size

    def _copy_on_write(self, table: BlockTable, index: int) -> Tuple[int, int]:
        """Give the table a private copy of its shared block at logical ``index``."""
        src = table.block_ids[index]
        (dst,) = self._take_blocks(1)
        if self._kv is not None:
            copy_blocks(self._kv, torch.tensor([src], device=self.device), torch.tensor([dst], device=self.device))
        self._blocks[src].ref_count -= 1
        table.block_ids[index] = dst
        self._refresh_limit(table)
        self._copy_log.append((src, dst))
        self._num_copies += 1
        return (src, dst)

    def _take_blocks(self, n: int) -> List[int]:
        """Pop ``n`` blocks off the free queue (caller checked there are enough); evicts cached content."""
        ids = self._free.pop_many(n)
        blocks = self._blocks
        for block_id in ids:
            block = blocks[block_id]
            block.ref_count = 1
            if block.block_hash is not None:
                self._prefix.remove(block.block_hash)
                block.block_hash = None
        return ids

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free.append(block_id)


@dataclass(frozen=True)
class _PromptPlan:
    """A prompt's allocation, worked out before anything changes."""

    tokens: Optional[List[int]]
    salt: Optional[bytes]
    keys: List[bytes]
    hits: List[int]  # cached blocks reused, in logical order
    hit_free: int  # how many of the hits sit in the free queue (taking them shrinks it)
    new_blocks: int  # fresh blocks to pop off the free queue

    @property
    def taken_from_free(self) -> int:
        return self.new_blocks + self.hit_free


def _as_salt(extra_key: Optional[Union[bytes, str]]) -> Optional[bytes]:
    if extra_key is None:
        return None
    if isinstance(extra_key, str):
        return extra_key.encode()
    if isinstance(extra_key, bytes):
        return extra_key
    raise InvalidTypeError(f"extra_key must be bytes or str, got {type(extra_key).__name__}")
