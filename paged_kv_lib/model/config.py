"""The sizes of a :class:`~paged_kv_lib.model.transformer.TinyTransformer`, checked once."""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import as_count
from ..errors import InvalidArgumentError
from .tokens import VOCAB_SIZE


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a :class:`TinyTransformer`. The defaults are the test-sized model."""

    vocab_size: int = VOCAB_SIZE
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    hidden_dim: int = 172
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "hidden_dim"):
            as_count(getattr(self, name), name, minimum=1)
        if self.vocab_size < VOCAB_SIZE:
            raise InvalidArgumentError(f"vocab_size must be >= {VOCAB_SIZE} (bytes + BOS), got {self.vocab_size}")
        if self.dim % self.num_heads:
            raise InvalidArgumentError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise InvalidArgumentError(f"head_dim ({self.head_dim}) must be even for rotary positions")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise InvalidArgumentError(
                f"rope_theta and norm_eps must be > 0, got {self.rope_theta!r} and {self.norm_eps!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads
