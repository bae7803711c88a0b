"""Orca-style memory: each request reserves one contiguous region for its whole life.

The PagedAttention paper compares against three variants of Orca that differ only in
how much a request reserves when it is admitted:

* ``orca-max``: the model's maximum length (2048), whatever the request needs;
* ``orca-pow2``: its prompt plus its real output length rounded up to a power of
  two, capped at max (the paper over-reserves "the space for outputs by at most
  2x": 25 output tokens reserve 32);
* ``orca-oracle``: exactly its prompt plus its real output (an impossible oracle).

Regions come from a real allocator: by default the buddy allocator the paper assumes
for Orca (which rounds every region up to a power of two), or a first-fit / best-fit
free list over one address range. External fragmentation is whatever their free
lists make it. Nothing grows later, so nothing is ever preempted.
"""

from __future__ import annotations

from typing import Deque, Dict, List, Tuple

from .._validate import as_count
from ..errors import InvalidArgumentError
from .buddy import BuddyAllocator
from .contiguous import POLICIES, ContiguousAllocator
from .job import Job

RESERVATIONS = ("orca-max", "orca-pow2", "orca-oracle")
FITS = ("buddy",) + POLICIES


def reservation_size(kind: str, prompt_len: int, output_len: int, max_len: int) -> int:
    """Slots a request reserves under ``kind`` (before the allocator rounds it).

    A request has at least one prompt token and generates at least one token: anything less
    is refused, since ``orca-pow2`` would otherwise reserve two slots for nothing.
    """
    for name, value in (("prompt_len", prompt_len), ("output_len", output_len)):
        if type(value) is not int or value < 1:
            as_count(value, name, minimum=1)  # raises the typed error, naming the value and the limit
    if kind == "orca-max":
        return max_len
    if kind == "orca-pow2":
        return min(prompt_len + (1 << (output_len - 1).bit_length()), max_len)
    if kind == "orca-oracle":
        return prompt_len + output_len
    raise InvalidArgumentError(f"unknown reservation {kind!r}: choose one of {RESERVATIONS}")


def check_fit(fit: object) -> str:
    """``fit`` when it names a contiguous hole policy (one of ``FITS``), else a typed error."""
    if not isinstance(fit, str) or fit not in FITS:
        raise InvalidArgumentError(f"fit must be one of {FITS}, got {fit!r}")
    return fit


class ContiguousMemory:
    """A memory model for the scheduler: contiguous reservations sized by ``kind``."""

    block_size = None
    lost = 0

    def __init__(self, kind: str, capacity_tokens: int, max_len: int, fit: str = "buddy") -> None:
        reservation_size(kind, 1, 1, max_len)  # validates kind
        check_fit(fit)
        self.name = kind
        self.max_len = max_len
        self.capacity = capacity_tokens
        self.allocator = BuddyAllocator(capacity_tokens) if fit == "buddy" else ContiguousAllocator(capacity_tokens, fit)
        self.tokens = 0
        self.internal = 0
        self.preemptions = 0

    def peak(self, job: Job) -> int:
        """The most slots ``job`` ever holds."""
        return self.allocator.footprint(self._size(job))

    def allocated(self) -> int:
        return self.allocator.num_used

    def admit(self, job: Job, step: int) -> bool:
        size = self._size(job)
        start = self.allocator.try_allocate(size)
        if start is None:
            return False
        job.start, job.size, job.admit_step = start, self.allocator.footprint(size), step
        job.internal = job.size - job.final_len
        self.internal += job.internal
        self.tokens += job.prefill
        return True

    def generate(self, running: List[Job], waiting: Deque[Job], step: int) -> None:
        self.tokens += len(running)  # room for every token was reserved up front

    def release(self, job: Job) -> None:
        self.allocator.free(job.start)
        self.tokens -= job.final_len
        self.internal -= job.internal

    def fragmented(self, job: Job) -> bool:
        """Enough free slots in total for ``job``, but no hole big enough."""
        size = self.allocator.footprint(self._size(job))
        return self.allocator.largest_hole < size <= self.allocator.num_free

    def recount(self, running: List[Job], step: int) -> Tuple[int, int, int]:
        """(tokens, reserved for later, never used) recomputed from every running job and the allocator."""
        regions: Dict[int, int] = self.allocator.allocations
        expected = {job.start: job.size for job in running}
        assert regions == expected, f"allocator regions {regions} != running jobs' {expected}"
        tokens = reserved = internal = 0
        for job in running:
            held = job.tokens_at(step)
            size = regions[job.start]
            assert 0 < held <= job.final_len <= self._size(job) <= size, f"{job} holds {held} tokens in {size} slots"
            tokens += held
            reserved += job.final_len - held
            internal += size - job.final_len
        return tokens, reserved, internal

    def check(self) -> None:
        self.allocator.check_invariants()

    def _size(self, job: Job) -> int:
        request = job.request
        return reservation_size(self.name, request.prompt_len, request.output_len, self.max_len)
