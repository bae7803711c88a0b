"""How memory is spent, step by step and averaged: the five parts of the capacity.

At the end of every step (after generation, before finished requests leave) each of
the ``capacity_tokens`` slots is in exactly one part, following the PagedAttention
paper's breakdown of memory waste (its Fig. 2):

* ``token_states``: slots holding a token's K/V;
* ``reserved``: slots held by a request that it will fill later (before it finishes);
* ``internal``: slots held by a request that it will never fill (a region sized past
  its real length; the tail of a paged request's last block past its final length),
  plus slots past the pool's last whole block, which no request can ever use;
* ``external``: free slots, when the first waiting request needs no more slots than
  are free in total but no single hole holds it (it is blocked only because free
  memory is not contiguous); then every free slot counts here;
* ``free``: every other free slot (nobody waits, or even all free slots together
  are too few for the first waiting request).

The paper's "external fragmentation & others" corresponds to ``external + free``.
Averages weigh every step equally. They cover the loaded steps: those that end
with a request still waiting, when memory, not demand, limits the batch. Without
any loaded step the average covers every step with a running request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

PARTS = ("token_states", "reserved", "internal", "external", "free")


@dataclass(frozen=True)
class StepSnapshot:
    """The five parts (in slots) and the queue lengths at the end of one step."""

    step: int
    token_states: int
    reserved: int
    internal: int
    external: int
    free: int
    running: int
    waiting: int

    @property
    def loaded(self) -> bool:
        return self.waiting > 0

    def total(self) -> int:
        return self.token_states + self.reserved + self.internal + self.external + self.free


@dataclass(frozen=True)
class SimResult:
    """One allocator's run: time-averaged fractions of the capacity and scheduling figures.

    ``token_states + reserved + internal + external + free == 1`` (up to rounding).
    ``block_size`` is None for contiguous allocators. ``window`` says which steps the
    averages cover ("loaded" or "busy", see the module docstring).
    """

    allocator: str
    block_size: Optional[int]
    capacity_tokens: int
    token_states: float
    reserved: float
    internal: float
    external: float
    free: float
    mean_batch: float
    preemptions: int
    finished: int
    steps: int
    window: str
    window_steps: int

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        """A short row name: the allocator, plus the block size for paged rows."""
        if self.block_size is None:
            return self.allocator
        return f"{self.allocator} B={self.block_size}"

    @property
    def waste(self) -> float:
        """Everything but token states."""
        return 1.0 - self.token_states


class Averager:
    """Sums the parts over loaded steps and over busy steps, then averages one window."""

    __slots__ = ("loaded", "busy")

    def __init__(self) -> None:
        # token_states, reserved, internal, external, free, running, steps
        self.loaded = [0] * 7
        self.busy = [0] * 7

    def add(self, tokens: int, reserved: int, internal: int, external: int, free: int,
            running: int, loaded: bool) -> None:
        for sums in (self.loaded, self.busy) if loaded else (self.busy,):
            sums[0] += tokens
            sums[1] += reserved
            sums[2] += internal
            sums[3] += external
            sums[4] += free
            sums[5] += running
            sums[6] += 1

    def result(self, name: str, block_size: Optional[int], capacity: int,
               preemptions: int, finished: int, steps: int) -> SimResult:
        window, sums = ("loaded", self.loaded) if self.loaded[6] else ("busy", self.busy)
        count = max(sums[6], 1)
        parts = [s / (count * capacity) for s in sums[:5]]
        return SimResult(name, block_size, capacity, *parts, sums[5] / count,
                         preemptions, finished, steps, window, sums[6])
