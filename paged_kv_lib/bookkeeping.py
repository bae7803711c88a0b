"""The interfaces between the engine, its bookkeeping and the paged forward, as ``typing.Protocol``s.

:class:`PagedKVView` is what a paged forward reads: the sequence lengths, the block tables
as one tensor and the per-layer cache tensors. ``PagedKVCacheAllocator`` satisfies it, and so
does the adapter that serves a learner's allocator. :class:`EngineBookkeeping` names every
question the engine asks its bookkeeping and every act it performs on it; :class:`EngineAllocator`
is both, the one type the engine is written against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

if TYPE_CHECKING:  # annotations only: the bookkeeping side of these protocols needs no torch
    import torch

__all__ = ["EngineAllocator", "EngineBookkeeping", "PagedKVView", "TokenIds"]


@runtime_checkable
class PagedKVView(Protocol):
    """What a paged forward needs: lengths, block tables and the cache tensors of every layer."""

    @property
    def block_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def k_caches(self) -> Sequence[torch.Tensor]: ...

    @property
    def v_caches(self) -> Sequence[torch.Tensor]: ...

    def get_num_tokens(self, seq_id: int) -> int:
        """How many tokens the sequence holds (the new ones of this step included)."""
        ...

    def block_table_tensor(self, seq_ids: Iterable[int], *, max_blocks: Optional[int] = None) -> torch.Tensor:
        """The sequences' block tables as one int tensor, one row each, padded with -1."""
        ...


TokenIds = Optional[Sequence[int]]


@runtime_checkable
class EngineBookkeeping(Protocol):
    """Every question the engine's scheduler asks its bookkeeping, and every act it performs on it.

    The engine reads nothing else and decides nothing by itself that is a rule of blocks:
    whether a request can ever fit, whether sequences can be admitted, grow, swap out or back
    in, all are asked here. :class:`~paged_kv_lib.block_manager.BlockManager` implements it (and
    ``PagedKVCacheAllocator`` by delegation); the adapter of a learner's allocator implements it
    by checking the learner's answers. The arithmetic behind the answers lives in
    :mod:`paged_kv_lib.block_rules`.
    """

    # ---------------------------------------------------------------- the pool
    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def enable_prefix_caching(self) -> bool:
        """Whether blocks are found again by content (then the engine passes the tokens it appends)."""
        ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    @property
    def num_free_cpu_blocks(self) -> int: ...

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        ...

    # ------------------------------------------------------------- the questions
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        ...

    def watermark_blocks(self, watermark: float) -> int:
        """Blocks an admission must leave free (the one validator of a watermark: typed errors)."""
        ...

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens may hold, the watermark added."""
        ...

    def can_ever_fit(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> bool:
        """Whether ``num_seqs`` sequences of up to ``num_tokens`` tokens fit an empty pool, leaving the watermark."""
        ...

    def can_allocate(self, num_tokens: int, *, token_ids: TokenIds = None, watermark: float = 0.0) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits now, cache hits counted, leaving the watermark."""
        ...

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0) -> bool:
        """Whether several new sequences fit now together (one length each), leaving the watermark."""
        ...

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in the same step, leaving the watermark."""
        ...

    def appendable_tokens(self, seq_id: int, up_to: int, *, watermark: float = 0.0) -> int:
        """The most tokens, at most ``up_to``, the sequence can grow by now (a prompt chunk's growth)."""
        ...

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of a prompt are found cached now (whole blocks); changes nothing."""
        ...

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        """Whether a swapped-out sequence fits back on the device now, leaving the watermark."""
        ...

    def can_swap_out(self, seq_ids: Iterable[int]) -> bool:
        """Whether the CPU pool has room for all these resident sequences at once."""
        ...

    # ------------------------------------------------------------------ the acts
    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int, *, token_ids: TokenIds = None) -> int:
        """Give a new sequence its prompt's blocks; returns how many prompt tokens were found cached."""
        ...

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make the child share every block of the parent."""
        ...

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks, resident or swapped out (an unknown id is a no-op)."""
        ...

    def append_tokens(self, seq_id: int, num_tokens: int = 1, *, token_ids: TokenIds = None) -> Tuple[int, ...]:
        """Grow one sequence; returns the block ids newly placed in its table."""
        ...

    def append_tokens_batch(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                            token_ids: Optional[Sequence[TokenIds]] = None) -> Dict[int, Tuple[int, ...]]:
        """Grow every listed sequence at once (atomic); returns the block ids placed, by sequence."""
        ...

    def get_block_mapping(self, seq_id: int) -> List[int]:
        """A copy of the sequence's block ids, in logical order."""
        ...

    def swap_out(self, seq_id: int) -> object:
        """Move a resident sequence to the CPU pool."""
        ...

    def swap_in(self, seq_id: int) -> object:
        """Bring a swapped-out sequence back onto the device."""
        ...

    def reset_prefix_cache(self) -> int:
        """Forget every content key (refused while blocks are in use); returns how many were dropped."""
        ...


@runtime_checkable
class EngineAllocator(EngineBookkeeping, PagedKVView, Protocol):
    """What the engine drives: its bookkeeping (:class:`EngineBookkeeping`) and the paged forward's view
    (:class:`PagedKVView`) in one object."""
