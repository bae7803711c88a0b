"""What the engine tracks per request: its samples (one allocator sequence each), state and output."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Tuple

import torch

from ..errors import PagedKVError
from ..model import decode


class RequestTooLargeError(PagedKVError, ValueError):
    """A request could not finish even with the whole pool to itself; ``needed``/``total`` in blocks."""

    def __init__(self, message: str, needed: int, total: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.total = total


class UnsupportedModelError(PagedKVError, ValueError):
    """The engine cannot run this model (paged attention refuses its head sizes or dtype)."""


class Status(Enum):
    WAITING = "waiting"  # never run, or preempted by recompute
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap: its K/V waits in the CPU pool
    FINISHED = "finished"


@dataclass(eq=False)
class Sample:
    """One generated continuation of a request: a sequence in the allocator."""

    index: int
    seq_id: int
    generator: torch.Generator
    output: List[int] = field(default_factory=list)
    finished: bool = False


@dataclass(eq=False)
class Request:
    """A prompt and how to continue it, plus its samples' progress."""

    request_id: int
    prompt: List[int]
    max_new_tokens: int
    n: int
    temperature: float
    seed: int
    samples: List[Sample]
    status: Status = Status.WAITING
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    num_preemptions: int = 0

    @property
    def started(self) -> bool:
        """Whether the prompt was prefilled once (then every sample exists in its own right)."""
        return bool(self.samples[0].output)

    def live_samples(self) -> List[Sample]:
        return [s for s in self.samples if not s.finished]


@dataclass(frozen=True)
class RequestOutput:
    """What a finished request produced: one list of new token ids per sample."""

    request_id: int
    prompt_ids: Tuple[int, ...]
    outputs: Tuple[Tuple[int, ...], ...]
    num_cached_tokens: int
    num_preemptions: int

    @property
    def token_ids(self) -> Tuple[int, ...]:
        """The first sample's new tokens."""
        return self.outputs[0]

    @property
    def texts(self) -> List[str]:
        return [decode(o) for o in self.outputs]

    @property
    def text(self) -> str:
        """The first sample as text."""
        return decode(self.outputs[0])
