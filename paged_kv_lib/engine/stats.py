"""Per-step and lifetime counters of the engine: queues, blocks, tokens and speed."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepStats:
    """What one step did and the state it left: queues, blocks, tokens and speed."""

    step: int
    running: int
    waiting: int
    swapped: int
    prefill_tokens: int  # prompt tokens computed (the cached prefix is not)
    cached_tokens: int  # prompt tokens found in the prefix cache
    decode_tokens: int
    generated_tokens: int
    preempted: int
    blocks_used: int
    blocks_cached: int  # free blocks that still hold a cached prefix
    elapsed_s: float
    prefill_sequences: int = 0  # sequences that carried a prompt chunk this step
    decode_sequences: int = 0  # sequences that decoded one token this step (decode_tokens of them)
    prefill_completed: int = 0  # prompts whose last chunk ran this step (each sampled its first token)

    @property
    def batched_tokens(self) -> int:
        """Tokens the step's forward carried: prompt chunks plus decodes (what the token budget bounds)."""
        return self.prefill_tokens + self.decode_tokens

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second in this step."""
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


@dataclass
class EngineTotals:
    """Counters over the engine's life, for benchmarks and the CLI."""

    steps: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decode_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    peak_blocks_used: int = 0
    elapsed_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
