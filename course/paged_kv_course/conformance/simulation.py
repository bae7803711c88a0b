"""``simulate_with_classes()``: the simulation with a learner's allocator class among the allocators.

The simulator's paged memory model (:class:`~paged_kv_lib.simulate.paged.PagedMemory`)
asks its allocator a few more questions than the learner's contract answers (how many
tokens a sequence holds, whether a prompt would fit). :class:`_LearnerBookkeeping` answers
them from the contract's five calls and its own token counts, so the simulation runs
the learner's block decisions unchanged: every block taken, grown into or given back is
the learner's. A correct class therefore gives exactly the ``paged`` row, only labelled
with the class's name; a class that takes one block too many, or never gives blocks
back, gives a row that says what that costs.

The adapter also watches the contract as it goes: a call that returns the wrong kind
of value, or a refusal (``RuntimeError``) that changed the free-block count, stops the
run with an ``AssertionError`` naming the call; with ``check=True`` every step also
checks that each sequence holds exactly ceil(tokens / block_size) distinct blocks, after
every call and at every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from paged_kv_lib._validate import as_count
from paged_kv_lib.block import cdiv
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, OutOfBlocksError
from paged_kv_lib.simulate.metrics import SimResult
from paged_kv_lib.simulate.paged import PagedMemory
from paged_kv_lib.simulate.runner import (
    ALLOCATORS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    allocator_entries,
    block_sizes,
    check_workload,
)
from paged_kv_lib.simulate.runner import simulate as simulate_named
from paged_kv_lib.simulate.reservation import check_fit
from paged_kv_lib.simulate.scheduler import run_schedule
from paged_kv_lib.simulate.workloads import Workload

__all__ = ["simulate_with_classes"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _LearnerBookkeeping:
    """The learner's object, seen through the calls ``PagedMemory`` makes on the library's allocator."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int, label: str, strict: bool = False) -> None:
        self.label = label
        self.strict = strict  # check each sequence's block count after every call
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.inner = cls(num_blocks, block_size)
        self.tokens: dict[int, int] = {}
        free = self.num_free_blocks
        if free != num_blocks:
            raise AssertionError(f"{label}({num_blocks}, {block_size}).num_free_blocks is {free}, "
                                 f"expected {num_blocks}: a new allocator has every block free")

    # ---------------------------------------------------------------- questions
    @property
    def num_free_blocks(self) -> int:
        free = self.inner.num_free_blocks
        if not _is_int(free) or not 0 <= free <= self.num_blocks:
            raise AssertionError(f"{self.label}.num_free_blocks is {free!r}: expected an int from 0 to "
                                 f"{self.num_blocks}")
        return free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def seq_ids(self) -> list[int]:
        return list(self.tokens)

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def get_num_tokens(self, seq_id: int) -> int:
        return self.tokens[seq_id]

    def get_block_mapping(self, seq_id: int) -> list[int]:
        mapping = self.inner.get_block_mapping(seq_id)
        if not isinstance(mapping, list) or not all(_is_int(b) for b in mapping):
            raise AssertionError(f"{self.label}.get_block_mapping({seq_id}) returned {mapping!r}: expected a "
                                 "list of int block ids")
        return mapping

    # ---------------------------------------------------------------- actions
    def allocate_for_sequence(self, seq_id: int, num_tokens: int) -> None:
        self.inner.allocate_for_sequence(seq_id, num_tokens)
        self.tokens[seq_id] = num_tokens
        if self.strict:
            self._check_sequence(seq_id, num_tokens, f"after {self.label}.allocate_for_sequence({seq_id}, "
                                                     f"{num_tokens})")

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> list[int]:
        call = f"{self.label}.append_tokens({seq_id}, {num_tokens})"
        free_before = self.num_free_blocks
        try:
            new_blocks = self.inner.append_tokens(seq_id, num_tokens)
        except RuntimeError as exc:
            free_after = self.num_free_blocks
            if free_after != free_before:
                raise AssertionError(f"{call} raised {type(exc).__name__} but the free-block count went from "
                                     f"{free_before} to {free_after}: a failed call must change nothing") from exc
            raise OutOfBlocksError(self.blocks_needed(self.tokens[seq_id] + num_tokens)
                                   - self.blocks_needed(self.tokens[seq_id]), free_before,
                                   f"grow sequence {seq_id}") from exc
        if not isinstance(new_blocks, list) or not all(_is_int(b) for b in new_blocks):
            raise AssertionError(f"{call} returned {new_blocks!r}: expected the list of block ids it took "
                                 "(an empty list when no block was needed)")
        self.tokens[seq_id] += num_tokens
        if self.strict:
            self._check_sequence(seq_id, self.tokens[seq_id], f"after {call}")
        return new_blocks

    def free_sequence(self, seq_id: int) -> None:
        self.inner.free_sequence(seq_id)
        self.tokens.pop(seq_id, None)

    def _check_sequence(self, seq_id: int, tokens: int, when: str) -> None:
        held, needed = len(self.get_block_mapping(seq_id)), self.blocks_needed(tokens)
        if held != needed:
            more = "more" if held > needed else "fewer"
            raise AssertionError(f"{when}: sequence {seq_id} holds {tokens} tokens in {held} blocks of "
                                 f"{self.block_size}, expected {needed} ({more} blocks than its tokens need)")

    def check_invariants(self) -> None:
        """Every sequence holds ceil(tokens / block_size) distinct blocks, and used + free == total."""
        seen: dict[int, int] = {}
        held = 0
        for seq_id, tokens in self.tokens.items():
            mapping = self.get_block_mapping(seq_id)
            if len(mapping) != self.blocks_needed(tokens):
                more = "more" if len(mapping) > self.blocks_needed(tokens) else "fewer"
                raise AssertionError(f"{self.label}: sequence {seq_id} holds {tokens} tokens in {len(mapping)} "
                                     f"blocks of {self.block_size}, expected {self.blocks_needed(tokens)} "
                                     f"({more} blocks than its tokens need)")
            for block in mapping:
                if not 0 <= block < self.num_blocks or block in seen:
                    raise AssertionError(f"{self.label}: block {block} of sequence {seq_id} is out of range "
                                         f"or also held by sequence {seen.get(block)}")
                seen[block] = seq_id
            held += len(mapping)
        if held + self.num_free_blocks != self.num_blocks:
            raise AssertionError(f"{self.label}: {held} blocks held + {self.num_free_blocks} free != "
                                 f"{self.num_blocks} blocks")


class _LearnerPagedMemory(PagedMemory):
    """The simulator's paged memory model with the learner's bookkeeping in place of the library's."""

    def __init__(self, cls: Any, capacity_tokens: int, block_size: int, label: str, strict: bool = False) -> None:
        super().__init__(capacity_tokens, block_size)  # validates the sizes, sets up the counters
        self.name = label
        self.allocator = _LearnerBookkeeping(cls, capacity_tokens // block_size, block_size, label, strict)


def _label(cls: Any) -> str:
    name = getattr(cls, "__name__", None)
    return name if isinstance(name, str) and name else "allocator"


def simulate_with_classes(
    workload: Workload,
    capacity_tokens: int = DEFAULT_CAPACITY,
    allocators: Iterable[str | Any] = ALLOCATORS,
    block_size: int | Sequence[int] = DEFAULT_BLOCK_SIZE,
    *,
    fit: str = "buddy",
    progress: object | None = None,
    check: bool = False,
) -> list[SimResult]:
    """Like :func:`paged_kv_lib.simulate.simulate`, but ``allocators`` may also hold classes.

    A class (the learner's contract: ``cls(num_blocks, block_size)``, ``num_free_blocks``,
    ``allocate_for_sequence``, ``append_tokens``, ``free_sequence``, ``get_block_mapping``)
    runs the paged memory model with its own bookkeeping, once per block size; its
    :class:`SimResult` is labelled with the class's name. Names run as in the library.
    """
    check_workload(workload)
    entries = allocator_entries(allocators)
    for entry in entries:
        if isinstance(entry, str):
            if entry not in ALLOCATORS:
                raise InvalidArgumentError(f"unknown allocator {entry!r}: choose from {ALLOCATORS} or pass a class")
        elif not callable(entry):
            raise InvalidTypeError(f"allocators holds {entry!r}: expected one of {ALLOCATORS} or an allocator class")
    capacity_tokens = as_count(capacity_tokens, "capacity_tokens", minimum=1)
    sizes = block_sizes(block_size)
    check_fit(fit)
    if any(not isinstance(e, str) or e == "paged" for e in entries) and capacity_tokens < min(sizes):
        raise InvalidArgumentError(f"block_size {min(sizes)} is larger than the capacity of "
                                   f"{capacity_tokens} token slots")
    results: list[SimResult] = []
    for entry in entries:
        if isinstance(entry, str):
            results.extend(simulate_named(workload, capacity_tokens, [entry], sizes, fit=fit,
                                          progress=progress, check=check))
            continue
        for size in sizes:
            memory = _LearnerPagedMemory(entry, capacity_tokens, size, _label(entry), strict=check)
            results.append(run_schedule(workload, memory, progress=progress, check=check))
    return results
