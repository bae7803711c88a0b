"""``LearnerBackedAllocator``: a learner's block bookkeeping behind the engine's :class:`EngineAllocator`.

A learner's class (the contract in :mod:`paged_kv_course.conformance`) knows only block ids:
which blocks a sequence holds, which are free, which are shared. This adapter lets the engine
and ``forward_paged`` drive it. The learner's object decides every block id; the adapter keeps
what the learner's does not:

* the K/V tensors and every move of their bytes, in a :class:`~paged_kv_lib.kv_cache.KVCache`
  (copy-on-write's copy when an ``append_tokens`` call replaced a block of the mapping, the
  CPU swap pool);
* a record of each sequence's mapping and token count, and of how many tables hold each
  block, read back from the learner after every call that changes it and checked
  (:mod:`~paged_kv_course.conformance.contract`), so the engine's questions are answered from checked
  state by the block manager's own rules (``growth_demand``, ``room_to_grow``, ``blocks_to_hold``,
  ``watermark_blocks`` in :mod:`~paged_kv_lib.block_manager`), restated nowhere;
* the swap pool's bookkeeping: swapping out frees the sequence in the learner's object and
  keeps its K/V here; swapping in allocates it again there and copies the K/V back.

Prefix caching is off unless asked for (``prefix_caching=True``, for a learner's class whose
``allocate_for_sequence`` takes ``token_ids`` and returns how many prompt tokens it found cached,
exercise 06); the library never finds anything by content itself.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from paged_kv_lib._validate import as_count, as_iterable, as_seq_id
from paged_kv_lib.block import Block, BlockTable, blocks_needed
from paged_kv_lib.block_manager import blocks_to_hold, growth_demand, room_to_grow, watermark_blocks
from paged_kv_lib.errors import DuplicateSequenceError, InvalidArgumentError, SequenceStateError
from paged_kv_lib.errors import UnknownSequenceError
from paged_kv_lib.kv_cache import KVCache, padded_block_tables
from paged_kv_lib.model import TinyTransformer
from paged_kv_lib.protocols import TokenIds
from . import contract
from .contract import AllocatorContractError

__all__ = ["AllocatorContractError", "LearnerBackedAllocator"]


class LearnerBackedAllocator:
    """The engine's allocator (:class:`~paged_kv_lib.protocols.EngineAllocator`), a learner's object deciding every block id.

    Args:
        inner: the learner's allocator instance, freshly built (no sequences yet).
        model: the model whose K/V the cache holds (layers, K/V heads, head size, dtype, device).
        num_blocks: blocks in the learner's pool.
        block_size: token slots per block.
        num_cpu_blocks: size of the CPU swap pool, in blocks (0: swap preemption falls back to
            recompute).
        prefix_caching: pass each prompt's ``token_ids`` to the learner's ``allocate_for_sequence``
            and trust the cached-token count it returns (the engine then skips computing those).
    """

    def __init__(self, inner: Any, model: TinyTransformer, *, num_blocks: int, block_size: int,
                 num_cpu_blocks: int = 0, prefix_caching: bool = False) -> None:
        cfg = model.config
        self.cache = KVCache(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device,
                             num_layers=cfg.num_layers, num_cpu_blocks=num_cpu_blocks)
        self.inner = inner
        self.prefix_caching = bool(prefix_caching)
        self.num_blocks, self.block_size = self.cache.num_blocks, self.cache.block_size
        self.k_caches, self.v_caches = self.cache.k_caches, self.cache.v_caches
        free = contract.free_count(inner, "building the engine")
        if free != self.num_blocks:
            raise AllocatorContractError(
                f"engine_for needs a fresh allocator: num_free_blocks is {free}, but the pool has "
                f"{self.num_blocks} blocks (build a new object, or pass the right num_blocks)"
            )
        self._cpu_free: List[int] = list(range(self.cache.num_cpu_blocks))
        self._tables: Dict[int, BlockTable] = {}  # the learner's mappings and lengths, as last read and checked
        self._blocks = [Block(i) for i in range(self.num_blocks)]  # ref_count: resident tables holding it
        self._used = 0
        self._swapped: Dict[int, Tuple[List[int], int]] = {}  # seq id -> (CPU block ids, tokens)
        self.num_copies = 0

    # ------------------------------------------------------------------ what the engine reads
    @property
    def num_free_blocks(self) -> int:
        # The learner's count was checked equal to this after every call that changes it.
        return self.num_blocks - self._used

    @property
    def num_used_blocks(self) -> int:
        return self._used

    @property
    def num_cached_free_blocks(self) -> int:
        return 0  # the learner's object keeps no content the library could count

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def seq_ids(self) -> Tuple[int, ...]:
        return tuple(self._tables)

    @property
    def swapped_seq_ids(self) -> Tuple[int, ...]:
        return tuple(self._swapped)

    def __repr__(self) -> str:
        return (f"LearnerBackedAllocator({type(self.inner).__name__}, blocks={self.num_blocks}, "
                f"block_size={self.block_size}, sequences={len(self._tables)})")

    def is_swapped(self, seq_id: int) -> bool:
        if seq_id in self._swapped:
            return True
        self._resident(seq_id)
        return False

    def get_num_tokens(self, seq_id: int) -> int:
        if seq_id in self._swapped:
            return self._swapped[seq_id][1]
        return self._resident(seq_id).num_tokens

    def get_block_mapping(self, seq_id: int) -> List[int]:
        return list(self._resident(seq_id).block_ids)

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The learner's mappings as an int32 ``[len(seq_ids), width]`` tensor padded with -1."""
        tables = [self._resident(s).block_ids for s in list(seq_ids)]
        return padded_block_tables(tables, self.cache.device, max_blocks=max_blocks)

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self._resident(seq_id)
        return self.cache.gather(table.block_ids, table.num_tokens, self.cache.layer(layer))

    # ------------------------------------------------------- the questions (the block manager's rules)
    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        return blocks_to_hold(num_tokens, num_seqs, self.block_size, self.num_blocks, watermark)

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0) -> bool:
        """Whether new sequences of these lengths fit now together, leaving the watermark (no hits counted)."""
        needed = sum(blocks_needed(n, self.block_size) for n in as_iterable(num_tokens, "num_tokens"))
        return self.num_free_blocks - needed >= watermark_blocks(watermark, self.num_blocks)

    def reset_prefix_cache(self) -> int:
        """Nothing to forget: the library caches no content for a learner's object."""
        return 0

    # ------------------------------------------------------- the acts, by the learner, checked
    def allocate_prompt(self, seq_id: int, prompt: Sequence[int], *, max_new_tokens: Optional[int] = None,
                        watermark: float = 0.0) -> Optional[int]:
        """Admit a prompt's cached prefix and ``max_new_tokens`` more of its tokens (all by default) through the
        learner's object, as the protocol asks, or grow a resident sequence by as many of its prompt's next
        ``max_new_tokens`` tokens as fit (the block manager's ``room_to_grow``); ``None`` (nothing asked of the
        learner) when that may not fit.

        The learner's object tells its hits only once it has allocated, so it is asked for the first
        ``max_new_tokens`` tokens, then grown by the ones its hits leave room for; the room is checked before,
        for the most both calls can take (hits sit inside the first part, so at most ``2 * max_new_tokens``;
        without prefix caching there are no hits, and the room is that of the first part, as the manager's)."""
        n = len(prompt)
        first = n if max_new_tokens is None else min(n, as_count(max_new_tokens, "max_new_tokens"))
        if seq_id in self._tables:  # the next chunk
            held = self._tables[seq_id].num_tokens
            if held > n:
                raise InvalidArgumentError(f"sequence {seq_id} holds tokens that do not begin this prompt")
            spare = self.num_free_blocks - watermark_blocks(watermark, self.num_blocks)
            grow = room_to_grow(self._tables[seq_id], min(first, n - held), spare, self.block_size, self._blocks)
            if grow == 0:
                return None
            self.append_tokens(seq_id, grow)
            return held
        most = n if max_new_tokens is None else min(n, 2 * first if self.prefix_caching else first)
        if not self.can_allocate_many([most], watermark=watermark):
            return None
        cached = self.allocate_for_sequence(seq_id, first, token_ids=list(prompt[:first]))
        held = n if max_new_tokens is None else min(n, cached + first)
        if held > first:
            self.append_tokens(seq_id, held - first)
        return cached

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int, *, token_ids: TokenIds = None) -> int:
        """Allocate through the learner's object; returns the prompt tokens it found cached (0 without prefix caching)."""
        seq_id = as_seq_id(seq_id)
        n = as_count(num_prompt_tokens, "num_prompt_tokens")
        if seq_id in self._swapped:
            raise SequenceStateError(f"sequence {seq_id} is swapped out")
        by_content = self.prefix_caching and token_ids is not None
        found: Any = 0
        call = f"allocate_for_sequence({seq_id}, {n}" + (", token_ids=<the prompt>)" if by_content else ")")
        try:
            if by_content and token_ids is not None:
                found = self.inner.allocate_for_sequence(seq_id, n, token_ids=[int(t) for t in token_ids])
            else:
                self.inner.allocate_for_sequence(seq_id, n)
        except (ValueError, RuntimeError):
            self._check_unchanged(call)
            raise
        table = self._read(seq_id, n, call)
        cached = contract.cached_count(found, n, self.block_size, call) if by_content else 0
        fresh = table[cached // self.block_size:]
        contract.check_fresh(fresh, self._holders(fresh), self._mappings(), call)
        self._install(seq_id, table, n)
        self._check_free_count(call)
        return cached

    def allocate_slots(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                       token_ids: Optional[Sequence[Union[int, TokenIds]]] = None,
                       watermark: float = 0.0) -> Optional[Dict[int, Tuple[int, ...]]]:
        """Grow each sequence through the learner's ``append_tokens`` if the block manager's rule says they all
        fit leaving the watermark; ``None`` (nothing asked of the learner) when they do not."""
        ids = self._distinct(seq_ids, "allocate_slots")
        num_tokens = as_count(num_tokens, "num_tokens")
        needed = growth_demand([self._resident(s) for s in ids], num_tokens, self.block_size, self._blocks)
        if self.num_free_blocks - needed < watermark_blocks(watermark, self.num_blocks):
            return None
        placed = {}
        for seq_id in ids:
            new = self.append_tokens(seq_id, num_tokens)
            if new:
                placed[seq_id] = new
        return placed

    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow through the learner's object; copy the K/V of the block its mapping replaced (copy-on-write)."""
        table = self._resident(seq_id)
        before = list(table.block_ids)
        num_tokens = as_count(num_tokens, "num_tokens")
        length = table.num_tokens + num_tokens
        call = f"append_tokens({seq_id}, {num_tokens})"
        must_copy = bool(num_tokens and table.num_tokens < len(before) * self.block_size
                         and self._blocks[before[-1]].ref_count > 1)
        tail_holders = self._blocks[before[-1]].ref_count if before else 0
        try:
            returned = self.inner.append_tokens(seq_id, num_tokens)
        except (ValueError, RuntimeError):
            self._check_unchanged(call)
            raise
        after = self._read(seq_id, length, call)
        replaced = contract.check_growth(before, after, must_copy, tail_holders, call)
        placed = [new for _, new in replaced] + after[len(before):]
        self._uninstall(seq_id)
        contract.check_fresh(placed, self._holders(placed), self._mappings(), call)
        for old, new in replaced:
            self.cache.copy_block(old, new)
            self.num_copies += 1
        self._install(seq_id, after, length)
        self._check_free_count(call)
        contract.check_returned(returned, placed, before, after, call)
        return tuple(placed)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        parent = self._resident(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        if child_seq_id in self._tables or child_seq_id in self._swapped:  # the learner's object forgot swapped ids
            raise DuplicateSequenceError(f"sequence {child_seq_id} is already allocated")
        call = f"fork({parent_seq_id}, {child_seq_id})"
        self.inner.fork(parent_seq_id, child_seq_id)
        child = self._read(child_seq_id, parent.num_tokens, call)
        if child != parent.block_ids:
            raise AllocatorContractError(
                f"after {call} the child's mapping is {child}, the parent's {parent.block_ids}: they must be equal")
        self._install(child_seq_id, child, parent.num_tokens)
        self._check_free_count(call)

    def free_sequence(self, seq_id: int) -> None:
        """Free through the learner's object (a swapped-out sequence only gives back its CPU blocks)."""
        if seq_id in self._swapped:
            self._cpu_free.extend(self._swapped.pop(seq_id)[0])
            return
        if seq_id not in self._tables:
            return
        self.inner.free_sequence(seq_id)
        self._uninstall(seq_id)
        self._check_free_count(f"free_sequence({seq_id})")

    def swap_out(self, *seq_ids: int) -> Optional[List[int]]:
        """Copy the sequences' K/V to the CPU pool, then free each in the learner's object, all or none; returns
        the CPU blocks taken, or ``None`` (nothing changed) when the CPU pool cannot hold them all."""
        tables = [self._resident(s) for s in self._distinct(seq_ids, "swap_out")]
        if sum(len(t) for t in tables) > len(self._cpu_free):
            return None
        taken: List[int] = []
        for seq_id, table in zip(seq_ids, tables):
            cpu_ids = self._cpu_free[: len(table)]
            del self._cpu_free[: len(table)]
            self.cache.swap_out(table.block_ids, cpu_ids)
            self.free_sequence(seq_id)
            self._swapped[seq_id] = (cpu_ids, table.num_tokens)
            taken += cpu_ids
        return taken

    def swap_in(self, *seq_ids: int, watermark: float = 0.0) -> Optional[List[int]]:
        """Allocate the sequences again through the learner's object and copy their K/V back, all or none, leaving
        the watermark free; returns the device blocks, or ``None`` (nothing changed) when they do not fit."""
        held = [self._swapped_out(s) for s in self._distinct(seq_ids, "swap_in")]
        if self.num_free_blocks - sum(len(cpu_ids) for cpu_ids, _ in held) < watermark_blocks(watermark,
                                                                                             self.num_blocks):
            return None
        placed: List[int] = []
        for seq_id, (cpu_ids, length) in zip(seq_ids, held):
            del self._swapped[seq_id]
            self.allocate_for_sequence(seq_id, length)
            device_ids = self._tables[seq_id].block_ids
            self.cache.swap_in(cpu_ids, device_ids)
            self._cpu_free.extend(cpu_ids)
            placed += device_ids
        return placed

    def check_invariants(self) -> None:
        """Re-read every mapping and the free count from the learner's object and compare."""
        for seq_id, table in self._tables.items():
            got = self._read(seq_id, table.num_tokens, "check_invariants()")
            if got != table.block_ids:
                raise AllocatorContractError(f"sequence {seq_id}'s mapping changed from {table.block_ids} to {got} "
                                             "without a call that changes it")
        self._check_free_count("check_invariants()")

    # ------------------------------------------------------------- internals
    def _resident(self, seq_id: int) -> BlockTable:
        table = self._tables.get(seq_id)
        if table is None:
            if seq_id in self._swapped:
                raise SequenceStateError(f"sequence {seq_id} is swapped out; swap_in({seq_id}) first")
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        return table

    def _swapped_out(self, seq_id: int) -> Tuple[List[int], int]:
        if seq_id not in self._swapped:
            self._resident(seq_id)
            raise SequenceStateError(f"sequence {seq_id} is not swapped out")
        return self._swapped[seq_id]

    def _distinct(self, seq_ids: Iterable[int], call: str) -> List[int]:
        ids = list(as_iterable(seq_ids, "seq_ids"))
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"{call} got a sequence twice: {ids}")
        return ids

    def _read(self, seq_id: int, num_tokens: int, call: str) -> List[int]:
        return contract.read_mapping(self.inner, seq_id, num_tokens, self.block_size, self.num_blocks, call)

    def _mappings(self) -> Dict[int, List[int]]:
        return {seq_id: table.block_ids for seq_id, table in self._tables.items()}

    def _holders(self, block_ids: Iterable[int]) -> Dict[int, int]:
        return {b: self._blocks[b].ref_count for b in block_ids if 0 <= b < self.num_blocks}

    def _install(self, seq_id: int, block_ids: List[int], num_tokens: int) -> None:
        self._tables[seq_id] = BlockTable(block_ids, num_tokens)
        for block_id in block_ids:
            self._used += self._blocks[block_id].ref_count == 0
            self._blocks[block_id].ref_count += 1

    def _uninstall(self, seq_id: int) -> None:
        for block_id in self._tables.pop(seq_id).block_ids:
            self._blocks[block_id].ref_count -= 1
            self._used -= self._blocks[block_id].ref_count == 0

    def _check_unchanged(self, call: str) -> None:
        contract.check_unchanged(self.inner, self._mappings(), self._used, self.num_blocks, call)

    def _check_free_count(self, call: str) -> None:
        contract.check_free_count(self.inner, self._used, self.num_blocks, call)
