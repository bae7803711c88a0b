"""What the engine and a paged forward ask of an allocator, as ``typing.Protocol``s.

:class:`PagedKVView` is what a paged forward reads: lengths, block tables as one tensor, and the
per-layer cache tensors. :class:`EngineBookkeeping` is what the engine's scheduler asks and tells
the bookkeeping. Each act checks and acts in one call, changing nothing when it refuses: ``allocate_slots``
grows a decode step (the blocks placed, or ``None``), ``allocate_prompt`` admits a prompt or places its
next chunk, ``swap_out`` and ``swap_in`` move a request's sequences all or none. The questions left are the
pool's size and use, whether a request could ever fit, and whether several prompts fit together.
:class:`EngineAllocator` is both, the one type the engine is written against. ``PagedKVCacheAllocator``
implements it, and so does the adapter that serves a learner's allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

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
        """Place a prompt's next tokens, leaving the watermark: a new sequence gets its cached prefix and up to
        ``max_new_tokens`` more (all or nothing), a resident one as many of the next ``max_new_tokens`` as fit.
        Returns the tokens in place before (found cached, or held), or ``None`` (nothing changed) when none fit."""
        ...

    def allocate_slots(self, seq_ids: Iterable[int], num_tokens: int = 1, *,
                       token_ids: Optional[Sequence[Union[int, TokenIds]]] = None,
                       watermark: float = 0.0) -> Optional[Dict[int, Tuple[int, ...]]]:
        """Grow every listed sequence (a decode step, or a prompt's next chunk): the blocks placed, by
        sequence, or ``None`` (nothing changed) when they do not all fit."""
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

    def swap_out(self, *seq_ids: int) -> Optional[object]:
        """Move resident sequences to the CPU pool, all or none; ``None`` (nothing changed) when they do not fit."""
        ...

    def swap_in(self, *seq_ids: int, watermark: float = 0.0) -> Optional[object]:
        """Bring swapped-out sequences back onto the device, all or none, leaving the watermark; ``None`` (nothing
        changed) when they do not fit."""
        ...

    def reset_prefix_cache(self) -> int:
        """Forget every content key (refused while blocks are in use); returns how many were dropped."""
        ...


@runtime_checkable
class EngineAllocator(EngineBookkeeping, PagedKVView, Protocol):
    """What the engine drives: its bookkeeping and the paged forward's view in one object."""
