"""The starter classes a stuck learner may inherit from are correct for exactly their exercises' part."""

from __future__ import annotations

import pytest

from paged_kv_lib.conformance import check_allocator
from paged_kv_lib.conformance.differential import PARTS
from paged_kv_lib.conformance.starter import GrowingStarterAllocator, SharingStarterAllocator, StarterAllocator


@pytest.mark.parametrize(
    "cls, part",
    [(StarterAllocator, "02"), (SharingStarterAllocator, "03"), (GrowingStarterAllocator, "05")],
    ids=["02", "03", "05"],
)
def test_each_starter_matches_the_library_on_its_part(cls, part):
    check_allocator(cls, max_examples=40, ops=PARTS[part])


@pytest.mark.parametrize(
    "cls, call, task",
    [
        (StarterAllocator, lambda a: a.fork(0, 1), "Task 03.1"),
        (StarterAllocator, lambda a: a.free_sequence(0), "Task 03.2"),
        (SharingStarterAllocator, lambda a: a.append_tokens(0, 1), "Task 05.2"),
    ],
)
def test_later_parts_are_left_to_the_learner(cls, call, task):
    a = cls(4, 2)
    a.allocate_for_sequence(0, 3)
    with pytest.raises(NotImplementedError, match=task):
        call(a)


def test_growing_starter_has_no_copy_on_write():
    a = GrowingStarterAllocator(6, 4)
    a.allocate_for_sequence(0, 6)
    a.fork(0, 1)
    assert a.append_tokens(1, 1) == []  # writes into the shared block: exercise 06 adds the copy
    assert a.get_block_mapping(1) == a.get_block_mapping(0) == [0, 1]


def test_errors_are_typed_and_change_nothing():
    a = SharingStarterAllocator(3, 4)
    a.allocate_for_sequence(0, 5)
    with pytest.raises(ValueError):
        a.allocate_for_sequence(0, 1)
    with pytest.raises(RuntimeError):
        a.allocate_for_sequence(1, 9)
    with pytest.raises(ValueError):
        a.fork(7, 2)
    with pytest.raises(ValueError):
        a.get_block_mapping(1)
    assert a.num_free_blocks == 1 and a.tables == {0: [0, 1]}
    a.free_sequence(42)  # unknown: a no-op
    a.free_sequence(0)
    assert list(a.free) == [2, 1, 0]  # last block first, behind the never-used block
