"""``check_allocator`` passes a correct class and reports planted bugs as short, runnable call sequences.

The correct class is the course's own learner answer once exercise 06 is done (``AllocatorAfter06``, the
starter a learner stuck on 06 continues from); each planted bug is that class with one method wrong,
written in the starters' names (``tables``, ``lengths``, ``free``, ``take_blocks``).
"""

from __future__ import annotations

import re
import time
from collections import deque
from typing import List

import pytest

from paged_kv_course.conformance import check_allocator
from paged_kv_course.conformance.differential import OPERATIONS, PARTS
from paged_kv_course.seed import seed_growth_rule

from paged_kv_course.starters.after_05 import AllocatorAfter05
from paged_kv_course.starters.after_06 import AllocatorAfter06



def report(cls, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        check_allocator(cls, **kwargs)
    return str(info.value)


def code_lines(message: str) -> List[str]:
    """The call sequence in a report: its indented lines."""
    return [line.strip() for line in message.splitlines() if line.startswith("    ")]


def runs_to_the_difference(message: str, cls) -> None:
    """The reported code runs as printed (the class under the name ``MyAllocator``) up to its last call."""
    namespace = {"MyAllocator": cls}
    lines = code_lines(message)
    for line in lines[:-1]:
        exec(line, namespace)


def test_a_correct_class_passes_quickly():
    start = time.perf_counter()
    check_allocator(AllocatorAfter06)
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_correct_class_passes_every_part(part):
    check_allocator(AllocatorAfter06, ops=PARTS[part], max_examples=50)


def test_ops_are_validated():
    with pytest.raises(ValueError, match="unknown operation"):
        check_allocator(AllocatorAfter06, ops=["allocate_for_sequence", "get_block_mapping", "swap"])
    with pytest.raises(ValueError, match="must include"):
        check_allocator(AllocatorAfter06, ops=["allocate_for_sequence"])
    with pytest.raises(TypeError):
        check_allocator(AllocatorAfter06, ops="fork")
    assert set(PARTS["06"]) == set(OPERATIONS)


class SeedGrowth(AllocatorAfter06):
    """The seed's growth rule: a new block when (length + 1) % block_size == 0, one token early."""

    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        placed = []
        for _ in range(num_tokens):
            if seed_growth_rule(self.lengths[seq_id], self.block_size):
                if not self.free:
                    raise RuntimeError("out of blocks")
                placed += self.take_blocks(1)
                self.tables[seq_id] += placed[-1:]
            self.lengths[seq_id] += 1
        return placed


def test_the_seeds_growth_rule_fails_with_a_short_sequence():
    message = report(SeedGrowth, name="MyAllocator")
    assert "append_tokens" in code_lines(message)[-1]
    assert len(code_lines(message)) <= 4, message
    assert "expected:" in message and "got:" in message
    runs_to_the_difference(message, SeedGrowth)


class NoCopyOnWrite(AllocatorAfter05):
    """Exercise 05's answer: grows correctly but writes into a shared last block instead of copying it."""


def test_an_allocator_without_copy_on_write_fails_and_is_named():
    message = report(NoCopyOnWrite, name="MyAllocator")
    lines = code_lines(message)
    assert any(line.startswith("a.fork(") for line in lines) and "append_tokens" in lines[-1]
    assert len(lines) <= 5, message
    assert "copy-on-write" in message
    runs_to_the_difference(message, NoCopyOnWrite)


def test_without_copy_on_write_in_ops_the_same_class_passes():
    check_allocator(NoCopyOnWrite, ops=PARTS["05"], max_examples=100)


class NotAtomic(AllocatorAfter06):
    """Pops blocks one by one and raises when the queue runs dry: the blocks taken so far leak."""

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError("duplicate")
        taken = []
        for _ in range(-(-num_prompt_tokens // self.block_size)):
            if not self.free:
                raise RuntimeError("out of blocks")
            taken += self.take_blocks(1)
        self.tables[seq_id] = taken
        self.lengths[seq_id] = num_prompt_tokens


def test_a_non_atomic_failure_is_reported_as_a_change():
    message = report(NotAtomic)
    assert "must change nothing" in message
    assert len(code_lines(message)) <= 3, message
    assert code_lines(message)[0] == "a = NotAtomic(num_blocks=1, block_size=1)"


class RoundsUp(AllocatorAfter06):
    """n // block_size + 1 blocks for a prompt."""

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError("duplicate")
        needed = num_prompt_tokens // self.block_size + 1
        if needed > len(self.free):
            raise RuntimeError("out of blocks")
        self.tables[seq_id] = self.take_blocks(needed)
        self.lengths[seq_id] = num_prompt_tokens


class SharedMapping(AllocatorAfter06):
    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError("unknown")
        return self.tables[seq_id]


class KeyErrorOnUnknown(AllocatorAfter06):
    def get_block_mapping(self, seq_id):
        return list(self.tables[seq_id])


class ForkWithoutRefCounts(AllocatorAfter06):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("bad fork")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class FreeMethod(AllocatorAfter06):
    def num_free_blocks(self):  # a method, not a property
        return len(self.free)


class KeepsStateOnTheClass(AllocatorAfter06):
    shared_free = deque()


@pytest.mark.parametrize(
    "cls, words",
    [
        (RoundsUp, ["a.num_free_blocks after a.allocate_for_sequence(0, 0)", "expected: 1", "got:      0"]),
        (SharedMapping, ["must return a copy"]),
        (KeyErrorOnUnknown, ["a ValueError", "KeyError"]),
        (ForkWithoutRefCounts, ["a.fork(", "a.free_sequence("]),
        (FreeMethod, ["attribute or a property"]),
    ],
)
def test_planted_bugs_are_named(cls, words):
    message = report(cls)
    for word in words:
        assert word in message, message
    assert "Traceback" not in message


def test_a_foreign_exception_is_reported_as_data_not_a_traceback():
    class Crashes(AllocatorAfter06):
        def fork(self, parent_seq_id, child_seq_id):
            raise IndexError("boom")

    message = report(Crashes)
    assert "IndexError: boom" in message
    assert re.search(r"a\.fork\(\d, \d\)$", code_lines(message)[-1])


def test_not_implemented_propagates():
    class Unwritten(AllocatorAfter06):
        def free_sequence(self, seq_id):
            raise NotImplementedError("Task 03.1: replace this line with your code")

    with pytest.raises(NotImplementedError):
        check_allocator(Unwritten, ops=PARTS["03"])
    check_allocator(Unwritten, ops=PARTS["02"], max_examples=30)


def test_a_method_not_written_stops_the_check_at_once_unshrunk():
    calls = []

    class Unwritten(AllocatorAfter06):
        def free_sequence(self, seq_id):
            calls.append(seq_id)
            raise NotImplementedError("Task 03.1: replace this line with your code")

    with pytest.raises(NotImplementedError, match="Task 03.1"):
        check_allocator(Unwritten, ops=PARTS["03"])
    assert len(calls) == 1, f"the check went on after the first NotImplementedError: {len(calls)} calls"
