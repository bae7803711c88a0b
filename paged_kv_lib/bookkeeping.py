"""The interfaces between the engine, its bookkeeping and the paged forward, as ``typing.Protocol``s.

:class:`PagedKVView` is what a paged forward reads: the sequence lengths, the block tables
as one tensor and the per-layer cache tensors. ``PagedKVCacheAllocator`` satisfies it, and so
does the adapter that serves a learner's allocator. The engine's questions to and acts on its
bookkeeping are named beside it (``EngineBookkeeping``, filled in with the engine's interface).
"""

from __future__ import annotations

from typing import Iterable, Optional, Protocol, Sequence, runtime_checkable

import torch

__all__ = ["PagedKVView"]


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
