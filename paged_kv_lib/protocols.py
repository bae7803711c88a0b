"""What the engine and a paged forward ask of an allocator, as ``typing.Protocol``s.

:class:`PagedKVView` is what a paged forward reads: lengths, block tables as one tensor, and the
per-layer cache tensors. :class:`EngineBookkeeping` is what the engine's scheduler asks and tells
the bookkeeping: one call per step that checks and acts (``allocate_slots``: the blocks placed, or
``None`` when the step does not fit), one per admission (``allocate_prompt``), and the few questions
whose answer decides between two acts (swap or recompute). :class:`EngineAllocator` is both, the one
type the engine is written against. ``PagedKVCacheAllocator`` implements it, and so does the adapter
that serves a learner's allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, Optional, Protocol, Sequence, Tuple, runtime_checkable

if TYPE_CHECKING:  # annotations only: the bookkeeping side needs no torch
    import torch

__all__ = ["EngineAllocator", "EngineBookkeeping", "PagedKVView", "TokenIds"]

TokenIds = Optional[Sequence[int]]


@runtime_checkable
class PagedKVView(Protocol):
    """What a paged forward needs: the block size, each layer's K and V cache, lengths and block tables.
    (Heads, head size, dtype, device and layers are read off ``k_caches``.)"""

    @property
    def block_size(self) -> int: ...

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


@runtime_checkable
class EngineBookkeeping(Protocol):
    """What the engine's scheduler asks its bookkeeping and tells it; it keeps no rule of blocks itself."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold findable content (they count as free)."""
        ...

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens may hold, the watermark added:
        a request can ever be served when this is at most ``num_blocks``."""
        ...

    def allocate_prompt(self, seq_id: int, prompt: Sequence[int], *, max_new_tokens: Optional[int] = None,
                        watermark: float = 0.0) -> Optional[int]:
        """Admit a prompt: its cached prefix and up to ``max_new_tokens`` more tokens, leaving the watermark;
        returns the tokens found cached, or ``None`` (nothing changed) when that does not fit."""
        ...

    def allocate_slots(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                       token_ids: Optional[Sequence[TokenIds]] = None,
                       watermark: float = 0.0) -> Optional[Dict[int, Tuple[int, ...]]]:
        """Grow every listed sequence (a decode step, or a prompt's next chunk): the blocks placed, by
        sequence, or ``None`` (nothing changed) when they do not all fit."""
        ...

    def appendable_tokens(self, seq_id: int, up_to: int, *, watermark: float = 0.0) -> int:
        """The most tokens, at most ``up_to``, the sequence can grow by now (how much of a prompt chunk fits)."""
        ...

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0) -> bool:
        """Whether several new sequences fit now together, leaving the watermark (a resumed request's samples)."""
        ...

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Make the child share every block of the parent."""
        ...

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks, resident or swapped out (an unknown id is a no-op)."""
        ...

    def can_swap_out(self, seq_ids: Iterable[int]) -> bool:
        """Whether the CPU pool has room for all these resident sequences at once."""
        ...

    def swap_out(self, seq_id: int) -> object:
        """Move a resident sequence to the CPU pool."""
        ...

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        """Whether a swapped-out sequence fits back on the device now, leaving the watermark."""
        ...

    def swap_in(self, seq_id: int) -> object:
        """Bring a swapped-out sequence back onto the device."""
        ...

    def reset_prefix_cache(self) -> int:
        """Forget every content key (refused while blocks are in use); returns how many were dropped."""
        ...


@runtime_checkable
class EngineAllocator(EngineBookkeeping, PagedKVView, Protocol):
    """What the engine drives: its bookkeeping and the paged forward's view in one object."""
