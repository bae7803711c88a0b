"""``Decoder``: what the contiguous and the paged forwards call on the transformer, as a ``Protocol``.

``TinyTransformer`` (``transformer.py``) calls those forwards, so they cannot import it back; they are
written against this instead, and the transformer satisfies it.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from .config import ModelConfig
from .tokens import TokenBatch

# Given (layer index, q, k, v) for the packed tokens, return the attention output.
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Decoder(Protocol):
    """A decoder-only transformer as a forward uses it: its sizes, the shared body and the output head."""

    config: ModelConfig

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def tokens(self, token_ids: TokenBatch) -> torch.Tensor:
        """``token_ids`` as an int64 tensor on the model's device, every id inside the vocabulary."""
        ...

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Hidden states ``[n, dim]`` of packed ``tokens`` at ``positions``, attention supplied by ``attend``."""
        ...

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states."""
        ...
