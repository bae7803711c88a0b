"""Paged memory for the simulator: the library's real block manager, grown one token at a time.

A request gets blocks for its prompt when admitted and one more block whenever a new
token starts one (``BlockManager.append_tokens``). When no block is left,
the newest running request is preempted by recompute: its blocks are freed and it
goes back to the front of the waiting queue, to be re-admitted later with its prompt
plus the tokens it had generated as the new prompt (as vLLM does by default).
"""

from __future__ import annotations

from typing import Deque, List, Optional, Protocol, Sequence, Tuple

from ..block import cdiv
from ..block_manager import BlockManager
from ..errors import InvalidArgumentError, OutOfBlocksError
from .job import Job


class PagedBooks(Protocol):
    """What the paged memory model asks of its bookkeeping: the library's :class:`BlockManager`, or a
    learner's class behind ``paged_kv_course.conformance.simulation``'s adapter."""

    @property
    def num_used_blocks(self) -> int: ...

    @property
    def seq_ids(self) -> Sequence[int]: ...

    def blocks_needed(self, num_tokens: int, /) -> int: ...

    def can_allocate(self, num_tokens: int, /) -> bool: ...

    def allocate_for_sequence(self, seq_id: int, num_tokens: int, /) -> object: ...

    def append_tokens(self, seq_id: int, num_tokens: int = 1, /) -> Sequence[int]: ...

    def get_num_tokens(self, seq_id: int, /) -> int: ...

    def get_block_mapping(self, seq_id: int, /) -> List[int]: ...

    def free_sequence(self, seq_id: int, /) -> None: ...

    def check_invariants(self) -> None: ...


class PagedMemory:
    """A memory model for the scheduler backed by the library's :class:`BlockManager` (bookkeeping, no tensors)."""

    name = "paged"

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        num_blocks = capacity_tokens // block_size
        if num_blocks < 1:
            raise InvalidArgumentError(
                f"block_size {block_size} is larger than the capacity of {capacity_tokens} token slots"
            )
        self.block_size = block_size
        self.capacity = capacity_tokens
        self.allocator: PagedBooks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        # Slots past the last whole block can never hold a token: counted as internal.
        self.lost = capacity_tokens - num_blocks * block_size
        self.tokens = 0
        self.internal = 0
        self.preemptions = 0

    def peak(self, job: Job) -> int:
        """The most slots ``job`` ever holds: the blocks of its final length."""
        return self.allocator.blocks_needed(job.final_len) * self.block_size

    def allocated(self) -> int:
        return self.allocator.num_used_blocks * self.block_size

    def admit(self, job: Job, step: int) -> bool:
        # Room for its prefill and for the token it generates in this same step.
        if not self.allocator.can_allocate(job.prefill + 1):
            return False
        self.allocator.allocate_for_sequence(job.rid, job.prefill)
        job.admit_step = step
        job.blocks = cdiv(job.prefill, self.block_size)
        job.internal = max(0, job.blocks * self.block_size - job.final_len)
        self.internal += job.internal
        self.tokens += job.prefill
        return True

    def generate(self, running: List[Job], waiting: Deque[Job], step: int) -> None:
        """Append one token to every running job, preempting the newest when blocks run out."""
        append = self.allocator.append_tokens
        for job in running:
            try:
                new_blocks = append(job.rid, 1)
            except OutOfBlocksError:
                new_blocks = self._make_room(job, running, waiting)
                if new_blocks is None:
                    break  # ``job`` itself was the newest, and is now waiting
            if new_blocks:
                self._grew(job, len(new_blocks))
        # Every job still running gained exactly one token; preempted ones were subtracted.
        self.tokens += len(running)

    def release(self, job: Job) -> None:
        self.tokens -= self.allocator.get_num_tokens(job.rid)
        self.internal -= job.internal
        self.allocator.free_sequence(job.rid)

    def fragmented(self, job: Job) -> bool:
        return False  # any free block serves any request

    def recount(self, running: List[Job], step: int) -> Tuple[int, int, int]:
        """(tokens, reserved for later, never used) recomputed from the allocator's tables."""
        size = self.block_size
        tokens = reserved = internal = blocks = 0
        for job in running:
            held = self.allocator.get_num_tokens(job.rid)
            assert held == job.tokens_at(step), f"{job} holds {held} tokens, expected {job.tokens_at(step)}"
            slots = len(self.allocator.get_block_mapping(job.rid)) * size
            blocks += slots // size
            later = min(slots - held, job.final_len - held)
            tokens += held
            reserved += later
            internal += slots - held - later
        assert blocks == self.allocator.num_used_blocks, "blocks held by jobs != blocks in use"
        assert set(self.allocator.seq_ids) == {job.rid for job in running}, "allocator holds other sequences"
        return tokens, reserved, internal

    def check(self) -> None:
        self.allocator.check_invariants()

    # ------------------------------------------------------------ internals
    def _grew(self, job: Job, new_blocks: int) -> None:
        job.blocks += new_blocks
        internal = max(0, job.blocks * self.block_size - job.final_len)
        self.internal += internal - job.internal
        job.internal = internal

    def _make_room(self, job: Job, running: List[Job], waiting: Deque[Job]) -> Optional[tuple]:
        """Preempt newest jobs until ``job`` can grow; None if ``job`` itself had to go."""
        while True:
            victim = running.pop()
            self._preempt(victim, waiting)
            if victim is job:
                return None
            try:
                return self.allocator.append_tokens(job.rid, 1)
            except OutOfBlocksError:
                continue

    def _preempt(self, job: Job, waiting: Deque[Job]) -> None:
        held = self.allocator.get_num_tokens(job.rid)
        self.release(job)
        job.prefill = held
        job.epoch += 1
        waiting.appendleft(job)
        self.preemptions += 1
