"""Exercise 03's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

from collections import Counter

import pytest

from paged_kv_lib import OutOfBlocksError, PagedKVCacheAllocator
from paged_kv_lib.grading import check_mini_allocate, check_mini_fork, check_mini_free, check_mini_validate
from paged_kv_lib.grading.checks_03 import MiniPool

from check_helpers import fails, not_implemented, passes




@pytest.mark.parametrize("check", [check_mini_allocate, check_mini_free, check_mini_fork, check_mini_validate])
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


def test_mini_pool_mirrors_a_library_allocator():
    alloc = PagedKVCacheAllocator(6, 2, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 3)
    alloc.fork(0, 1)
    pool = MiniPool.from_allocator(alloc)
    assert pool.tables == {0: [0, 1], 1: [0, 1]} and pool.ref_counts == [2, 2, 0, 0, 0, 0]
    assert list(pool.free_queue) == [2, 3, 4, 5] and pool.num_blocks == 6 and pool.block_size == 2
    assert repr(MiniPool(2, 4)) == "MiniPool(block_size=4, free_queue=[0, 1], ref_counts=[0, 0], tables={})"


# --------------------------------------------------------------------------- 03.1
def allocate(pool, seq_id, num_tokens):
    if seq_id in pool.tables:
        raise ValueError(f"sequence {seq_id} is already allocated")
    if num_tokens < 0:
        raise ValueError("num_tokens must be >= 0")
    needed = -(-num_tokens // pool.block_size)
    if needed > len(pool.free_queue):
        raise OutOfBlocksError(needed, len(pool.free_queue))
    ids = [pool.free_queue.popleft() for _ in range(needed)]
    for block_id in ids:
        pool.ref_counts[block_id] = 1
    pool.tables[seq_id] = ids
    return list(ids)


def test_allocate_correct(capsys):
    passes(check_mini_allocate, allocate, "03.1", capsys)


def pops_as_it_goes(pool, seq_id, num_tokens):
    if seq_id in pool.tables or num_tokens < 0:
        raise ValueError("bad call")
    needed = -(-num_tokens // pool.block_size)
    ids = []
    for _ in range(needed):
        if not pool.free_queue:
            raise OutOfBlocksError(needed, len(ids))
        ids.append(pool.free_queue.popleft())
        pool.ref_counts[ids[-1]] = 1
    pool.tables[seq_id] = ids
    return list(ids)


def returns_its_own_list(pool, seq_id, num_tokens):
    allocate(pool, seq_id, num_tokens)
    return pool.tables[seq_id]


def pops_from_the_tail(pool, seq_id, num_tokens):
    if seq_id in pool.tables or num_tokens < 0:
        raise ValueError("bad call")
    needed = -(-num_tokens // pool.block_size)
    if needed > len(pool.free_queue):
        raise OutOfBlocksError(needed, len(pool.free_queue))
    ids = [pool.free_queue.pop() for _ in range(needed)]
    for block_id in ids:
        pool.ref_counts[block_id] = 1
    pool.tables[seq_id] = ids
    return list(ids)


def plain_runtime_error(pool, seq_id, num_tokens):
    needed = -(-num_tokens // pool.block_size)
    if num_tokens >= 0 and seq_id not in pool.tables and needed > len(pool.free_queue):
        raise RuntimeError("out of blocks")
    return allocate(pool, seq_id, num_tokens)


def one_block_too_many(pool, seq_id, num_tokens):
    if seq_id in pool.tables or num_tokens < 0:
        raise ValueError("bad call")
    needed = num_tokens // pool.block_size + 1
    if needed > len(pool.free_queue):
        raise OutOfBlocksError(needed, len(pool.free_queue))
    ids = [pool.free_queue.popleft() for _ in range(needed)]
    for block_id in ids:
        pool.ref_counts[block_id] = 1
    pool.tables[seq_id] = ids
    return list(ids)


def accepts_negative(pool, seq_id, num_tokens):
    if num_tokens < 0:
        pool.tables[seq_id] = []
        return []
    return allocate(pool, seq_id, num_tokens)


def overwrites_duplicates(pool, seq_id, num_tokens):
    pool.tables.pop(seq_id, None)
    return allocate(pool, seq_id, num_tokens)


def skips_empty_sequences(pool, seq_id, num_tokens):
    if num_tokens == 0:
        return []
    return allocate(pool, seq_id, num_tokens)


def wrong_error_counts(pool, seq_id, num_tokens):
    needed = -(-num_tokens // pool.block_size)
    if num_tokens >= 0 and seq_id not in pool.tables and needed > len(pool.free_queue):
        raise OutOfBlocksError(needed + 1, len(pool.free_queue))
    return allocate(pool, seq_id, num_tokens)


@pytest.mark.parametrize("wrong", [pops_as_it_goes, returns_its_own_list, pops_from_the_tail, plain_runtime_error,
                                   one_block_too_many, accepts_negative, overwrites_duplicates,
                                   skips_empty_sequences, wrong_error_counts])
def test_allocate_wrong(wrong):
    fails(check_mini_allocate, wrong)


def test_allocate_leak_is_explained():
    assert "leave the pool exactly as it was" in fails(check_mini_allocate, pops_as_it_goes)


# --------------------------------------------------------------------------- 03.2
def free(pool, seq_id):
    table = pool.tables.pop(seq_id, None)
    if table is None:
        return []
    freed = []
    for block_id in reversed(table):
        pool.ref_counts[block_id] -= 1
        if pool.ref_counts[block_id] == 0:
            pool.free_queue.append(block_id)
            freed.append(block_id)
    return freed


def test_free_correct(capsys):
    passes(check_mini_free, free, "03.2", capsys)


def head_first(pool, seq_id):
    table = pool.tables.pop(seq_id, None)
    if table is None:
        return []
    freed = []
    for block_id in table:
        pool.ref_counts[block_id] -= 1
        if pool.ref_counts[block_id] == 0:
            pool.free_queue.append(block_id)
            freed.append(block_id)
    return freed


def ignores_ref_counts(pool, seq_id):
    table = pool.tables.pop(seq_id, None)
    if table is None:
        return []
    for block_id in reversed(table):
        pool.ref_counts[block_id] = 0
        pool.free_queue.append(block_id)
    return list(reversed(table))


def raises_on_unknown(pool, seq_id):
    if seq_id not in pool.tables:
        raise ValueError(f"unknown sequence {seq_id}")
    return free(pool, seq_id)


def keeps_the_table(pool, seq_id):
    if seq_id not in pool.tables:
        return []
    table = list(pool.tables[seq_id])
    freed = []
    for block_id in reversed(table):
        pool.ref_counts[block_id] -= 1
        if pool.ref_counts[block_id] == 0:
            pool.free_queue.append(block_id)
            freed.append(block_id)
    return freed


def to_the_head(pool, seq_id):
    table = pool.tables.pop(seq_id, None)
    if table is None:
        return []
    freed = []
    for block_id in reversed(table):
        pool.ref_counts[block_id] -= 1
        if pool.ref_counts[block_id] == 0:
            pool.free_queue.appendleft(block_id)
            freed.append(block_id)
    return freed


def returns_nothing(pool, seq_id):
    free(pool, seq_id)


@pytest.mark.parametrize("wrong", [head_first, ignores_ref_counts, raises_on_unknown, keeps_the_table,
                                   to_the_head, returns_nothing])
def test_free_wrong(wrong):
    fails(check_mini_free, wrong)


# --------------------------------------------------------------------------- 03.3
def fork(pool, parent_seq_id, child_seq_id):
    if parent_seq_id not in pool.tables:
        raise ValueError(f"unknown sequence {parent_seq_id}")
    if child_seq_id in pool.tables:
        raise ValueError(f"sequence {child_seq_id} already exists")
    table = pool.tables[parent_seq_id]
    for block_id in table:
        pool.ref_counts[block_id] += 1
    pool.tables[child_seq_id] = list(table)


def test_fork_correct(capsys):
    passes(check_mini_fork, fork, "03.3", capsys)


def aliases_the_list(pool, parent_seq_id, child_seq_id):
    fork(pool, parent_seq_id, child_seq_id)
    pool.tables[child_seq_id] = pool.tables[parent_seq_id]


def no_references(pool, parent_seq_id, child_seq_id):
    if parent_seq_id not in pool.tables or child_seq_id in pool.tables:
        raise ValueError("bad ids")
    pool.tables[child_seq_id] = list(pool.tables[parent_seq_id])


def overwrites_the_child(pool, parent_seq_id, child_seq_id):
    if parent_seq_id not in pool.tables:
        raise ValueError("unknown parent")
    for block_id in pool.tables[parent_seq_id]:
        pool.ref_counts[block_id] += 1
    pool.tables[child_seq_id] = list(pool.tables[parent_seq_id])


def counts_before_checking(pool, parent_seq_id, child_seq_id):
    if parent_seq_id not in pool.tables:
        raise ValueError("unknown parent")
    for block_id in pool.tables[parent_seq_id]:
        pool.ref_counts[block_id] += 1
    if child_seq_id in pool.tables:
        raise ValueError("child exists")
    pool.tables[child_seq_id] = list(pool.tables[parent_seq_id])


def copies_the_blocks(pool, parent_seq_id, child_seq_id):
    if parent_seq_id not in pool.tables or child_seq_id in pool.tables:
        raise ValueError("bad ids")
    fresh = [pool.free_queue.popleft() for _ in pool.tables[parent_seq_id]]
    for block_id in fresh:
        pool.ref_counts[block_id] = 1
    pool.tables[child_seq_id] = fresh


def key_error(pool, parent_seq_id, child_seq_id):
    table = pool.tables[parent_seq_id]
    if child_seq_id in pool.tables:
        raise ValueError("child exists")
    for block_id in table:
        pool.ref_counts[block_id] += 1
    pool.tables[child_seq_id] = list(table)


@pytest.mark.parametrize("wrong", [aliases_the_list, no_references, overwrites_the_child, counts_before_checking,
                                   copies_the_blocks, key_error])
def test_fork_wrong(wrong):
    fails(check_mini_fork, wrong)


# --------------------------------------------------------------------------- 03.4
def check_pool(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free_queue)
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
    passes(check_mini_validate, check_pool, "03.4", capsys)


def counts_only(pool):
    used = sum(1 for c in pool.ref_counts if c > 0)
    assert len(pool.free_queue) + used == len(pool.ref_counts)


def no_holder_count(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free_queue)
    assert all(0 <= b < n for b in queued) and len(set(queued)) == len(queued)
    for table in pool.tables.values():
        assert all(0 <= b < n for b in table)
    for block_id, count in enumerate(pool.ref_counts):
        assert (count == 0) == (block_id in queued)


def no_duplicates_in_tables(pool):
    n = len(pool.ref_counts)
    queued = list(pool.free_queue)
    assert all(0 <= b < n for b in queued) and len(set(queued)) == len(queued)
    holders = Counter()
    for table in pool.tables.values():
        assert all(0 <= b < n for b in table)
        holders.update(table)
    for block_id, count in enumerate(pool.ref_counts):
        assert count == holders[block_id] and (count == 0) == (block_id in queued)


def index_errors(pool):
    holders = Counter(b for table in pool.tables.values() for b in table)
    queued = list(pool.free_queue)
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
    pool.free_queue.clear()


@pytest.mark.parametrize("wrong", [counts_only, no_holder_count, no_duplicates_in_tables, index_errors,
                                   value_errors, no_sharing_allowed, empties_the_queue])
def test_check_pool_wrong(wrong):
    fails(check_mini_validate, wrong)
