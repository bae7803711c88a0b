"""The starters of exercises 02 and 03 (``paged_kv_course.starters``): the learner's ``MyAllocator`` as it
stands after each exercise, for a learner stuck on the next one. They must keep the pinned state, behave as
the library's allocator on their part of the contract, and leave later parts unwritten."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib import PagedKVCacheAllocator
from paged_kv_course.conformance import check_allocator
from paged_kv_course.starters.after_02 import AllocatorAfter02
from paged_kv_course.starters.after_03 import AllocatorAfter03
from paged_kv_lib.errors import (
    DuplicateSequenceError,
    InvalidTypeError,
    OutOfBlocksError,
    PositionError,
    SequenceStateError,
    UnknownSequenceError,
)


def books(alloc):
    return list(alloc.free), list(alloc.ref_counts), {s: list(t) for s, t in alloc.tables.items()}, dict(alloc.lengths)


def test_the_pinned_state_after_an_allocation():
    a = AllocatorAfter02(6, 4)
    a.allocate_for_sequence(0, 10)
    assert type(a.free) is deque and books(a) == ([3, 4, 5], [1, 1, 1, 0, 0, 0], {0: [0, 1, 2]}, {0: 10})
    assert (a.num_blocks, a.block_size, a.num_free_blocks) == (6, 4, 3)
    assert a.take_blocks(2) == [3, 4] and a.ref_counts[3:5] == [1, 1]


@pytest.mark.parametrize("cls, ops", [
    (AllocatorAfter02, ("allocate_for_sequence", "get_block_mapping", "free_sequence")),
    (AllocatorAfter03, ("allocate_for_sequence", "get_block_mapping", "free_sequence", "fork")),
])
def test_each_starter_behaves_as_the_library_on_its_part(cls, ops):
    check_allocator(cls, ops=ops, max_examples=60)


def test_exercise_02s_free_is_not_ready_for_sharing_but_exercise_03s_is():
    for cls, free_after in ((AllocatorAfter02, [2, 3, 1, 0]), (AllocatorAfter03, [2, 3])):
        a = type("Forking", (cls,), {"fork": AllocatorAfter03.fork})(4, 2)
        a.allocate_for_sequence(0, 3)
        a.fork(0, 1)
        a.free_sequence(0)
        assert list(a.free) == free_after, cls  # 02's gives back blocks sequence 1 still holds


def test_refusals_are_typed_and_change_nothing():
    a = AllocatorAfter03(4, 2)
    a.allocate_for_sequence(0, 4)
    before = books(a)
    for call, error in ((lambda: a.allocate_for_sequence(0, 1), DuplicateSequenceError),
                        (lambda: a.allocate_for_sequence(1, 5), OutOfBlocksError),
                        (lambda: a.allocate_for_sequence(1, True), InvalidTypeError),
                        (lambda: a.allocate_for_sequence(1, -1), ValueError),
                        (lambda: a.get_block_mapping(7), UnknownSequenceError),
                        (lambda: a.fork(0, 0), DuplicateSequenceError),
                        (lambda: a.fork(5, 6), UnknownSequenceError),
                        (lambda: a.block_of(0, 4), PositionError),
                        (lambda: a.block_of(0, -1), PositionError)):
        with pytest.raises(error):
            call()
        assert books(a) == before
    assert a.append_block_to_sequence(0) == 2
    with pytest.raises(SequenceStateError):
        a.append_block_to_sequence(0)
    a.allocate_for_sequence(1, 2)
    with pytest.raises(OutOfBlocksError):
        a.append_block_to_sequence(1)


def test_block_of_agrees_with_the_librarys_slot_mapping():
    mine, lib = AllocatorAfter02(10, 4), PagedKVCacheAllocator(10, 4, 1, 1, allocate_cache=False)
    for alloc in (mine, lib):
        alloc.allocate_for_sequence(0, 10)
        alloc.allocate_for_sequence(1, 5)
        alloc.free_sequence(0)
        alloc.allocate_for_sequence(2, 14)
    assert mine.tables[2] == lib.get_block_mapping(2)
    assert [mine.block_of(2, p) for p in range(14)] == (lib.slot_mapping(2, range(14)) // 4).tolist()


def test_later_parts_are_not_written_and_say_which_task():
    with pytest.raises(NotImplementedError, match="Task 03.1"):
        AllocatorAfter02(2, 2).fork(0, 1)
    with pytest.raises(NotImplementedError, match="Task 05"):
        AllocatorAfter03(2, 2).append_tokens(0, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allocate", "fork", "free", "reserve"]), st.integers(0, 3),
                          st.integers(0, 3), st.integers(0, 9)), max_size=30))
def test_exercise_03s_checker_holds_after_any_calls_and_fires_on_a_leak(calls):
    a = AllocatorAfter03(8, 3)
    for kind, s, t, n in calls:
        try:
            {"allocate": lambda: a.allocate_for_sequence(s, n), "fork": lambda: a.fork(s, t),
             "free": lambda: a.free_sequence(s), "reserve": lambda: a.append_block_to_sequence(s)}[kind]()
        except (ValueError, RuntimeError):
            pass
        a.check_invariants()
    if a.free:
        a.free.popleft()  # a block that is neither free nor held: leaked
        with pytest.raises(AssertionError):
            a.check_invariants()
