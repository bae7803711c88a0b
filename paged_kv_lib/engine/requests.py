"""What the engine tracks per request: its samples (one allocator sequence each), state and output."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, NamedTuple, Optional, Tuple

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


class UnknownRequestError(PagedKVError, KeyError):
    """The request id was never issued by this engine."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


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
    # Chunked prefill: the tokens this sample must have in the cache before it samples again (its
    # prompt, or prompt + output after a recompute), and how many of them are in already. ``None``
    # once they are all in: the sample decodes.
    prefill: Optional[List[int]] = None
    computed: int = 0

    def reset_prefill(self) -> None:
        """Forget the prefill progress (the sample's blocks were released)."""
        self.prefill = None
        self.computed = 0


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
    aborted: bool = False

    @property
    def started(self) -> bool:
        """Whether the prompt was prefilled once (then every sample exists in its own right)."""
        return bool(self.samples[0].output)

    def live_samples(self) -> List[Sample]:
        return [s for s in self.samples if not s.finished]

    def resident_samples(self) -> List[Sample]:
        """The samples that are sequences now: a new request's first one (the others fork from it), else the live ones."""
        return self.live_samples() if self.started else self.samples[:1]


class TokenEvent(NamedTuple):
    """One token as :meth:`Engine.stream` yields it, the moment it is sampled."""

    request_id: int
    sample_index: int
    token_id: int


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
