"""``LearnerBackedAllocator``: a learner's block bookkeeping behind the engine's :class:`EngineAllocator`.

A learner's class (the contract in :mod:`paged_kv_course.conformance`) knows only block ids:
which blocks a sequence holds, which are free, which are shared. This adapter lets the engine
and ``forward_paged`` drive it. The learner's object decides every block id; the adapter keeps
what the learner's does not:

* the K/V tensors and every move of their bytes, in a :class:`~paged_kv_lib.kv_store.KVStore`
  (copy-on-write's copy when an ``append_tokens`` call replaced a block of the mapping, the
  CPU swap pool);
* a record of each sequence's mapping and token count, and of how many tables hold each
  block, read back from the learner after every call that changes it and checked
  (:mod:`~paged_kv_course.conformance.contract`), so the scheduler's questions are answered from
  checked state by the library's own rules (:mod:`~paged_kv_lib.block_rules`), restated nowhere;
* the swap pool's bookkeeping: swapping out frees the sequence in the learner's object and
  keeps its K/V here; swapping in allocates it again there and copies the K/V back.

Prefix caching is off unless asked for (``prefix_caching=True``, for a learner's class whose
``allocate_for_sequence`` takes ``token_ids`` and returns how many prompt tokens it found cached,
exercise 06); the library never finds anything by content itself.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from paged_kv_lib import block_rules as rules
from paged_kv_lib._validate import as_count, as_iterable, as_seq_id
from paged_kv_lib.block import blocks_needed
from paged_kv_lib.bookkeeping import TokenIds
from paged_kv_lib.cache_ops import padded_block_tables
from paged_kv_lib.errors import DuplicateSequenceError, InvalidArgumentError, OutOfBlocksError, SequenceStateError
from paged_kv_lib.errors import UnknownSequenceError
from paged_kv_lib.kv_store import KVStore, Positions
from paged_kv_lib.model import TinyTransformer
from . import contract
from .contract import AllocatorContractError

__all__ = ["AllocatorContractError", "LearnerBackedAllocator"]


class LearnerBackedAllocator:
    """The engine's allocator (:class:`~paged_kv_lib.bookkeeping.EngineAllocator`), a learner's object deciding every block id.

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
        self.store = KVStore(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device,
                             num_layers=cfg.num_layers, num_cpu_blocks=num_cpu_blocks)
        self.inner = inner
        self.prefix_caching = bool(prefix_caching)
        free = contract.free_count(inner, "building the engine")
        if free != self.store.num_blocks:
            raise AllocatorContractError(
                f"engine_for needs a fresh allocator: num_free_blocks is {free}, but the pool has "
                f"{self.store.num_blocks} blocks (build a new object, or pass the right num_blocks)"
            )
        self._cpu_free: List[int] = list(range(self.store.num_cpu_blocks))
        self._tables: Dict[int, List[int]] = {}  # the learner's mappings, as last read and checked
        self._lengths: Dict[int, int] = {}
        self._holders: Dict[int, int] = {}  # block id -> how many resident tables hold it
        self._swapped: Dict[int, Tuple[List[int], int]] = {}  # seq id -> (CPU block ids, tokens)
        self.num_copies = 0

    # ------------------------------------------------------------------ the pool and the view
    @property
    def num_blocks(self) -> int:
        return self.store.num_blocks

    @property
    def block_size(self) -> int:
        return self.store.block_size

    @property
    def num_cpu_blocks(self) -> int:
        return self.store.num_cpu_blocks

    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix_caching

    @property
    def num_layers(self) -> int:
        return self.store.num_layers

    @property
    def num_heads(self) -> int:
        return self.store.num_heads

    @property
    def head_dim(self) -> int:
        return self.store.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.store.dtype

    @property
    def device(self) -> torch.device:
        return self.store.device

    @property
    def k_caches(self) -> Tuple[torch.Tensor, ...]:
        return self.store.k_caches

    @property
    def v_caches(self) -> Tuple[torch.Tensor, ...]:
        return self.store.v_caches

    @property
    def k_cache(self) -> torch.Tensor:
        return self.store.k_caches[0]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.store.v_caches[0]

    @property
    def num_free_blocks(self) -> int:
        # The learner's count was checked equal to this after every call that changes it.
        return self.num_blocks - len(self._holders)

    @property
    def num_used_blocks(self) -> int:
        return len(self._holders)

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

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables or seq_id in self._swapped

    def __repr__(self) -> str:
        return (
            f"LearnerBackedAllocator({type(self.inner).__name__}, blocks={self.num_blocks}, "
            f"block_size={self.block_size}, sequences={len(self._tables)})"
        )

    def is_swapped(self, seq_id: int) -> bool:
        if seq_id in self._swapped:
            return True
        self._resident(seq_id)
        return False

    def get_num_tokens(self, seq_id: int) -> int:
        if seq_id in self._swapped:
            return self._swapped[seq_id][1]
        self._resident(seq_id)
        return self._lengths[seq_id]

    def get_block_mapping(self, seq_id: int) -> List[int]:
        return list(self._resident(seq_id))

    # ------------------------------------------------------- the scheduler's questions (block_rules)
    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_needed(num_tokens, self.block_size)

    def watermark_blocks(self, watermark: float) -> int:
        return rules.watermark_blocks(watermark, self.num_blocks)

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        return rules.blocks_to_hold(num_tokens, num_seqs, self.block_size, self.num_blocks, watermark)

    def can_ever_fit(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> bool:
        return rules.fits(self.num_blocks, self.blocks_to_hold(num_tokens, num_seqs=num_seqs, watermark=watermark))

    def can_allocate(self, num_tokens: int, *, token_ids: TokenIds = None, watermark: float = 0.0) -> bool:
        """Whether a new sequence of ``num_tokens`` fits now and leaves the watermark free (no hits counted)."""
        return self.can_allocate_many([num_tokens], watermark=watermark)

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0) -> bool:
        """Whether new sequences of these lengths fit now together, leaving the watermark (no hits counted)."""
        needed = sum(self.blocks_needed(n) for n in as_iterable(num_tokens, "num_tokens"))
        return rules.fits(self.num_free_blocks, needed, self.watermark_blocks(watermark))

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``append_tokens(seq_id, num_tokens)`` takes now, a copy-on-write copy included."""
        new_blocks, copy = self._append_cost(seq_id, as_count(num_tokens, "num_tokens"))
        return new_blocks + copy

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in one step (shared tails: ``shared_tail_copies``)."""
        num_tokens = as_count(num_tokens, "num_tokens")
        ids = self._distinct(seq_ids, "can_append")
        needed = 0
        growers: Dict[int, int] = {}
        for seq_id in ids:
            new_blocks, copy = self._append_cost(seq_id, num_tokens)
            needed += new_blocks
            if copy:
                tail = self._tables[seq_id][-1]
                growers[tail] = growers.get(tail, 0) + 1
        needed += rules.shared_tail_copies((k, self._holders[tail]) for tail, k in growers.items())
        return rules.fits(self.num_free_blocks, needed, self.watermark_blocks(watermark))

    def appendable_tokens(self, seq_id: int, up_to: int, *, watermark: float = 0.0) -> int:
        """The most tokens, at most ``up_to``, ``append_tokens`` could add now (a prompt chunk's growth)."""
        up_to = as_count(up_to, "up_to")
        _, copy = self._append_cost(seq_id, up_to)
        spare = self.num_free_blocks - self.watermark_blocks(watermark)
        table = self._tables[seq_id]
        return rules.appendable_tokens(self._lengths[seq_id], len(table), self.block_size, spare, copy, up_to)

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """Always 0: the adapter cannot ask a learner's object what it holds without allocating."""
        return 0

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        cpu_ids, _ = self._swapped_out(seq_id)
        return rules.fits(self.num_free_blocks, len(cpu_ids), self.watermark_blocks(watermark))

    def can_swap_out(self, seq_ids: Iterable[int]) -> bool:
        tables = [self._resident(s) for s in self._distinct(seq_ids, "can_swap_out")]
        return rules.fits(len(self._cpu_free), rules.swap_out_blocks(len(t) for t in tables))

    def reset_prefix_cache(self) -> int:
        """Nothing to forget: the library caches no content for a learner's object."""
        return 0

    def _append_cost(self, seq_id: int, num_tokens: int) -> Tuple[int, bool]:
        table = self._resident(seq_id)
        tail_holders = self._holders[table[-1]] if table else 0
        return rules.append_cost(self._lengths[seq_id], len(table), self.block_size, tail_holders, num_tokens)

    # ------------------------------------------------------- the acts, by the learner, checked
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
        contract.check_fresh(table[cached // self.block_size:], self._holders, self._tables, call)
        self._install(seq_id, table, n)
        self._check_free_count(call)
        return cached

    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow through the learner's object; copy the K/V of the block its mapping replaced (copy-on-write)."""
        before = self._resident(seq_id)
        num_tokens = as_count(num_tokens, "num_tokens")
        length = self._lengths[seq_id] + num_tokens
        call = f"append_tokens({seq_id}, {num_tokens})"
        _, must_copy = self._append_cost(seq_id, num_tokens)
        tail_holders = self._holders[before[-1]] if before else 0
        try:
            returned = self.inner.append_tokens(seq_id, num_tokens)
        except (ValueError, RuntimeError):
            self._check_unchanged(call)
            raise
        after = self._read(seq_id, length, call)
        replaced = contract.check_growth(before, after, must_copy, tail_holders, call)
        placed = [new for _, new in replaced] + after[len(before):]
        self._uninstall(seq_id)
        contract.check_fresh(placed, self._holders, self._tables, call)
        for old, new in replaced:
            self.store.copy_block(old, new)
            self.num_copies += 1
        self._install(seq_id, after, length)
        self._check_free_count(call)
        contract.check_returned(returned, placed, before, after, call)
        return tuple(placed)

    def append_tokens_batch(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                            token_ids: Optional[Sequence[TokenIds]] = None) -> Dict[int, Tuple[int, ...]]:
        """Grow each sequence through the learner's ``append_tokens``, after asking ``can_append`` for all of them."""
        ids = self._distinct(seq_ids, "append_tokens_batch")
        num_tokens = as_count(num_tokens, "num_tokens")
        if not self.can_append(ids, num_tokens):
            raise OutOfBlocksError(sum(self.blocks_to_append(s, num_tokens) for s in ids), self.num_free_blocks,
                                   f"grow {len(ids)} sequences by {num_tokens}")
        placed = {}
        for seq_id in ids:
            new = self.append_tokens(seq_id, num_tokens)
            if new:
                placed[seq_id] = new
        return placed

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        parent = self._resident(parent_seq_id)
        child_seq_id = as_seq_id(child_seq_id)
        if child_seq_id in self:  # the learner's object no longer knows a swapped-out id: the adapter does
            raise DuplicateSequenceError(f"sequence {child_seq_id} is already allocated")
        call = f"fork({parent_seq_id}, {child_seq_id})"
        self.inner.fork(parent_seq_id, child_seq_id)
        child = self._read(child_seq_id, self._lengths[parent_seq_id], call)
        if child != parent:
            raise AllocatorContractError(f"after {call} the child's mapping is {child}, the parent's {parent}: they must be equal")
        self._install(child_seq_id, child, self._lengths[parent_seq_id])
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
        del self._tables[seq_id], self._lengths[seq_id]
        self._check_free_count(f"free_sequence({seq_id})")

    def swap_out(self, seq_id: int) -> None:
        """Copy the sequence's K/V to the CPU pool, then free it in the learner's object."""
        table = self._resident(seq_id)
        if not self.can_swap_out([seq_id]):
            raise OutOfBlocksError(len(table), len(self._cpu_free), f"swap out sequence {seq_id}", pool="CPU")
        cpu_ids = self._cpu_free[: len(table)]
        del self._cpu_free[: len(table)]
        self.store.swap_out(table, cpu_ids)
        length = self._lengths[seq_id]
        self.free_sequence(seq_id)
        self._swapped[seq_id] = (cpu_ids, length)

    def swap_in(self, seq_id: int) -> List[int]:
        """Allocate the sequence again through the learner's object and copy its K/V back."""
        cpu_ids, length = self._swapped_out(seq_id)
        if not self.can_swap_in(seq_id):
            raise OutOfBlocksError(len(cpu_ids), self.num_free_blocks, f"swap in sequence {seq_id}")
        del self._swapped[seq_id]
        self.allocate_for_sequence(seq_id, length)
        table = self._tables[seq_id]
        self.store.swap_in(cpu_ids, table)
        self._cpu_free.extend(cpu_ids)
        return list(table)

    # ------------------------------------------------- address translation, K/V (the KVStore)
    def slot_mapping(self, seq_id: int, positions: Positions) -> torch.Tensor:
        """Slots of logical positions through the learner's mapping, int64 on the cache device."""
        table = self._resident(seq_id)
        return self.store.slots(table, self.store.positions(seq_id, self._lengths[seq_id], positions))

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The learner's mappings as an int32 ``[len(seq_ids), width]`` tensor padded with -1."""
        return padded_block_tables([self._resident(s) for s in list(seq_ids)], self.device, max_blocks=max_blocks)

    def read_kv(self, seq_id: int, *, layer: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V as ``[num_tokens, num_heads, head_dim]`` tensors."""
        table = self._resident(seq_id)
        return self.store.gather(table, self._lengths[seq_id], self.store.layer(layer))

    def check_invariants(self) -> None:
        """Re-read every mapping and the free count from the learner's object and compare."""
        for seq_id, table in self._tables.items():
            got = self._read(seq_id, self._lengths[seq_id], "check_invariants()")
            if got != table:
                raise AllocatorContractError(
                    f"sequence {seq_id}'s mapping changed from {table} to {got} without a call that changes it"
                )
        self._check_free_count("check_invariants()")

    # ------------------------------------------------------------- internals
    def _resident(self, seq_id: int) -> List[int]:
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

    def _install(self, seq_id: int, table: List[int], num_tokens: int) -> None:
        self._tables[seq_id] = table
        self._lengths[seq_id] = num_tokens
        for block_id in table:
            self._holders[block_id] = self._holders.get(block_id, 0) + 1

    def _uninstall(self, seq_id: int) -> None:
        for block_id in self._tables[seq_id]:
            left = self._holders[block_id] - 1
            if left:
                self._holders[block_id] = left
            else:
                del self._holders[block_id]

    def _check_unchanged(self, call: str) -> None:
        contract.check_unchanged(self.inner, self._tables, len(self._holders), self.num_blocks, call)

    def _check_free_count(self, call: str) -> None:
        contract.check_free_count(self.inner, len(self._holders), self.num_blocks, call)
