"""Exercise 03's checks bite: correct solutions pass with the one success line, planted wrong ones fail
with a message that names the mistake."""

from __future__ import annotations

from collections import Counter

import pytest

from paged_kv_lib import PagedKVCacheAllocator
from paged_kv_lib.conformance.starter import StarterAllocator
from paged_kv_lib.grading import check_allocator_03, check_my_fork, check_my_free, check_pool_invariants
from paged_kv_lib.grading._common import TaskNotWrittenError
from paged_kv_lib.grading.checks_03 import MiniPool

from check_helpers import fails, not_implemented, passes


def test_an_untouched_invariant_checker_is_not_written_yet():
    with pytest.raises(NotImplementedError):
        check_pool_invariants(not_implemented)


def test_mini_pool_mirrors_a_library_allocator():
    alloc = PagedKVCacheAllocator(6, 2, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 3)
    alloc.fork(0, 1)
    pool = MiniPool.from_allocator(alloc)
    assert pool.tables == {0: [0, 1], 1: [0, 1]} and pool.ref_counts == [2, 2, 0, 0, 0, 0]
    assert list(pool.free) == [2, 3, 4, 5] and pool.num_blocks == 6 and pool.block_size == 2
    assert repr(MiniPool(2, 4)) == "MiniPool(block_size=4, free=[0, 1], ref_counts=[0, 0], tables={})"


# --------------------------------------------------------------------------- 03.1 and 03.2
class WithFork(StarterAllocator):
    """Exercise 03.1 done right, on the starter's part 1."""

    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables:
            raise ValueError(f"sequence {parent_seq_id} is not allocated")
        if child_seq_id in self.tables:
            raise ValueError(f"sequence {child_seq_id} is already allocated")
        for block_id in self.tables[parent_seq_id]:
            self.ref_counts[block_id] += 1
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class Done(WithFork):
    """Exercise 03.2 done right."""

    def free_sequence(self, seq_id):
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.lengths[seq_id]
        for block_id in reversed(table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)


def test_fork_and_free_correct(capsys):
    passes(check_my_fork, WithFork, "03.1", capsys)
    passes(check_my_free, Done, "03.2", capsys)
    passes(check_allocator_03, Done, "03.2", capsys)


def test_untouched_tasks_are_not_written_yet():
    class Untouched(StarterAllocator):
        def fork(self, parent_seq_id, child_seq_id):
            raise NotImplementedError("Task 03.1: replace this line with your code")

        def free_sequence(self, seq_id):
            raise NotImplementedError("Task 03.2: replace this line with your code")

    with pytest.raises(TaskNotWrittenError, match="task 03.1 is not written yet"):
        check_my_fork(Untouched)
    for check in (check_my_free, check_allocator_03):
        with pytest.raises(TaskNotWrittenError, match="task 03.(1|2) is not written yet"):
            check(Untouched)


class CopiesBlocks(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("bad fork")
        self.tables[child_seq_id] = self.take_blocks(len(self.tables[parent_seq_id]))
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class NoRefCounts(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("bad fork")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class SameList(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        super().fork(parent_seq_id, child_seq_id)
        self.tables[child_seq_id] = self.tables[parent_seq_id]


class CountsBeforeChecking(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables:
            raise ValueError("unknown parent")
        for block_id in self.tables[parent_seq_id]:
            self.ref_counts[block_id] += 1
        if child_seq_id in self.tables:
            raise ValueError("child exists")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class OverwritesChild(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables:
            raise ValueError("unknown parent")
        for block_id in self.tables[parent_seq_id]:
            self.ref_counts[block_id] += 1
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class ForgetsLength(WithFork):
    def fork(self, parent_seq_id, child_seq_id):
        super().fork(parent_seq_id, child_seq_id)
        self.lengths[child_seq_id] = 0


@pytest.mark.parametrize(
    "wrong, words",
    [
        (CopiesBlocks, "fork copied blocks"),
        (NoRefCounts, "reference count"),
        (SameList, "own list object"),
        (CountsBeforeChecking, "must change nothing"),
        (OverwritesChild, "ValueError"),
        (ForgetsLength, "as many tokens"),
    ],
)
def test_fork_wrong(wrong, words):
    message = fails(check_my_fork, wrong)
    assert words in message, message


class HeadFirst(WithFork):
    def free_sequence(self, seq_id):
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.lengths[seq_id]
        for block_id in table:
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)


class IgnoresRefCounts(WithFork):
    def free_sequence(self, seq_id):
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.lengths[seq_id]
        for block_id in reversed(table):
            self.ref_counts[block_id] = 0
            if block_id not in self.free:
                self.free.append(block_id)


class RaisesOnUnknown(Done):
    def free_sequence(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        super().free_sequence(seq_id)


class KeepsTheTable(WithFork):
    def free_sequence(self, seq_id):
        if seq_id not in self.tables or not self.tables[seq_id]:
            return
        for block_id in reversed(self.tables[seq_id]):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)
        self.tables[seq_id] = []


class ToTheHead(WithFork):
    def free_sequence(self, seq_id):
        table = self.tables.pop(seq_id, None)
        if table is None:
            return
        del self.lengths[seq_id]
        for block_id in table:
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.appendleft(block_id)


class KeepsTheLength(Done):
    def free_sequence(self, seq_id):
        length = self.lengths.get(seq_id)
        super().free_sequence(seq_id)
        if length is not None:
            self.lengths[seq_id] = length


@pytest.mark.parametrize(
    "wrong, words",
    [
        (HeadFirst, "head-first free"),
        (IgnoresRefCounts, "reference count reaches 0"),
        (RaisesOnUnknown, "unknown"),
        (KeepsTheTable, "drop its table"),
        (ToTheHead, "tail of the free queue"),
        (KeepsTheLength, "length must go"),
    ],
)
def test_free_wrong(wrong, words):
    message = fails(check_my_free, wrong)
    assert words in message, message


@pytest.mark.parametrize("wrong", [HeadFirst, IgnoresRefCounts, RaisesOnUnknown, KeepsTheTable])
def test_free_wrong_with_a_correct_fork_fails_the_differential_check_unless_only_order_differs(wrong):
    class Full(wrong, WithFork):
        pass

    if wrong is HeadFirst:  # the order of the free queue is not part of the contract
        check_allocator_03(Full)
        return
    message = fails(check_allocator_03, Full)
    assert "a = MyAllocator(" in message


# --------------------------------------------------------------------------- 03.3
def check_pool(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free)
    assert all(0 <= b < n for b in queued), "a free-queue entry is outside the pool"
    assert len(set(queued)) == len(queued), "a block is in the free queue twice"
    holders = Counter()
    for seq_id, table in pool.tables.items():
        assert all(0 <= b < n for b in table), f"sequence {seq_id} lists a block outside the pool"
        assert len(set(table)) == len(table), f"sequence {seq_id} lists a block twice"
        holders.update(table)
    for block_id, count in enumerate(pool.ref_counts):
        assert count >= 0, f"block {block_id} has a negative ref count"
        assert count == holders[block_id], f"block {block_id}: ref count {count}, held by {holders[block_id]}"
        assert (count == 0) == (block_id in queued), f"block {block_id}: free iff ref count is 0"


def test_check_pool_correct(capsys):
    passes(check_pool_invariants, check_pool, "03.3", capsys)


def counts_only(pool):
    used = sum(1 for c in pool.ref_counts if c > 0)
    assert len(pool.free) + used == len(pool.ref_counts)


def no_holder_count(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free)
    assert all(0 <= b < n for b in queued) and len(set(queued)) == len(queued)
    for table in pool.tables.values():
        assert all(0 <= b < n for b in table)
    for block_id, count in enumerate(pool.ref_counts):
        assert (count == 0) == (block_id in queued)


def membership_holders(pool):
    """Counts a table as one holder however often it lists a block, and never looks for repeats."""
    n = len(pool.ref_counts)
    queued = list(pool.free)
    assert all(0 <= b < n for b in queued) and len(set(queued)) == len(queued)
    for table in pool.tables.values():
        assert all(0 <= b < n for b in table)
    for block_id, count in enumerate(pool.ref_counts):
        holders = sum(1 for table in pool.tables.values() if block_id in table)
        assert count == holders and (count == 0) == (block_id in queued)


def no_duplicates_in_tables(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free)
    assert all(0 <= b < n for b in queued) and len(set(queued)) == len(queued)
    holders = Counter()
    for table in pool.tables.values():
        assert all(0 <= b < n for b in table)
        holders.update(table)
    for block_id, count in enumerate(pool.ref_counts):
        assert count == holders[block_id] and (count == 0) == (block_id in queued)


def index_errors(pool):
    holders = Counter(b for table in pool.tables.values() for b in table)
    queued = list(pool.free)
    assert len(set(queued)) == len(queued)
    for table in pool.tables.values():
        assert len(set(table)) == len(table)
        for b in table:
            pool.ref_counts[b]  # IndexError for ids outside the pool
    for b in queued:
        pool.ref_counts[b]
    for block_id, count in enumerate(pool.ref_counts):
        assert count == holders[block_id] and (count == 0) == (block_id in queued)


def value_errors(pool):
    try:
        check_pool(pool)
    except AssertionError as exc:
        raise ValueError(str(exc)) from None


def no_sharing_allowed(pool):
    check_pool(pool)
    assert all(count <= 1 for count in pool.ref_counts), "a block is shared"


def empties_the_queue(pool):
    check_pool(pool)
    pool.free.clear()


@pytest.mark.parametrize(
    "wrong, words",
    [
        (counts_only, "your checker missed it"),
        (no_holder_count, "your checker missed it"),
        (no_duplicates_in_tables, "twice"),
        (membership_holders, "twice"),
        (index_errors, "IndexError"),
        (value_errors, "ValueError"),
        (no_sharing_allowed, "shared blocks"),
        (empties_the_queue, "inputs modified"),
    ],
)
def test_check_pool_wrong(wrong, words):
    message = fails(check_pool_invariants, wrong)
    assert words in message, message


def test_lesson_03s_claim_tail_first_seed_agrees_with_the_library_step_for_step():
    """Lesson 03, section 6: with tail-first frees the seed's design matches the library on its trace."""
    from paged_kv_lib.seed import SeedAllocator

    class TailFirstSeed(SeedAllocator):
        def free_sequence(self, seq_id):
            table = self.sequence_block_tables.pop(seq_id, None)
            for block_id in reversed(table.block_ids if table else []):
                self.blocks[block_id].ref_count -= 1
                if self.blocks[block_id].ref_count == 0:
                    self.free_blocks.append(block_id)

    trace = [("allocate", 0, 10), ("allocate", 1, 3), ("allocate", 2, 9), ("fork", 1, 3), ("free", 0),
             ("allocate", 4, 12), ("free", 1), ("allocate", 5, 20), ("free", 3), ("free", 99), ("allocate", 6, 4)]
    seed, lib = TailFirstSeed(8, 4), PagedKVCacheAllocator(8, 4, 1, 1)

    def run(alloc, op):
        kind, *args = op
        method = {"allocate": alloc.allocate_for_sequence, "fork": alloc.fork, "free": alloc.free_sequence}[kind]
        try:
            method(*args)
        except (RuntimeError, ValueError) as exc:
            return RuntimeError if isinstance(exc, RuntimeError) else ValueError
        return None

    def state(alloc):
        return ({s: list(t.block_ids) for s, t in alloc.sequence_block_tables.items()},
                [b.ref_count for b in alloc.blocks], list(alloc.free_blocks))

    for op in trace:
        assert run(seed, op) == run(lib, op), op
        assert state(seed) == state(lib), op
