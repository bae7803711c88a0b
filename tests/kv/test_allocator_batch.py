"""``append_tokens_batch``, ``allocate_prompt`` of a resident sequence (its next chunk), ``cached_prefix_tokens``.

A batch grows exactly as one ``append_tokens`` per sequence would; a refused batch changes
nothing; each question's answer is what the act then does.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib import (
    InvalidArgumentError,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    PagedKVError,
    SequenceStateError,
    UnknownSequenceError,
    cdiv,
)

from helpers import assert_same_state, snapshot


def make(num_blocks=16, block_size=4, **kw):
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 2, torch.float32, **kw)


def tables(alloc):
    return {s: (alloc.get_block_mapping(s), alloc.get_num_tokens(s)) for s in alloc.seq_ids}


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    forks=st.lists(st.integers(0, 4), max_size=3),
    steps=st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=8),
    block_size=st.sampled_from([1, 2, 4]),
    with_ids=st.booleans(),
)
def test_a_batch_grows_as_one_call_per_sequence(lengths, forks, steps, block_size, with_ids):
    """Same tables, counts, free queue, copies and cache keys as the single calls, or the same refusal."""
    batch, single = make(80, block_size), make(80, block_size)  # room for every prompt; steps may run out
    for alloc in (batch, single):
        for seq_id, n in enumerate(lengths):
            alloc.allocate_for_sequence(seq_id, n, token_ids=list(range(n)) if with_ids else None)
        for k, parent in enumerate(forks):
            if parent < len(lengths):
                alloc.fork(parent, 100 + k)
    for num_tokens, every_other in steps:
        ids = list(batch.seq_ids)[:: 2 if every_other else 1]
        tokens = [[7] * num_tokens for _ in ids] if with_ids else None
        before = snapshot(batch)
        if not single.can_append(ids, num_tokens):
            with pytest.raises(OutOfBlocksError):
                batch.append_tokens_batch(ids, num_tokens, token_ids=tokens)
            assert_same_state(before, snapshot(batch))
            continue
        placed = batch.append_tokens_batch(ids, num_tokens, token_ids=tokens)
        expected = {}
        for i, seq_id in enumerate(ids):
            got = single.append_tokens(seq_id, num_tokens, token_ids=None if tokens is None else tokens[i])
            if got:
                expected[seq_id] = got
        assert placed == expected
        assert tables(batch) == tables(single)
        assert batch.free_blocks == single.free_blocks
        assert [(b.ref_count, b.block_hash) for b in batch.blocks] == [(b.ref_count, b.block_hash) for b in single.blocks]
        batch.check_invariants()


def test_a_refused_batch_changes_nothing():
    alloc = make(6, 4, num_cpu_blocks=4)
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(1, 4)
    alloc.allocate_for_sequence(2, 2)
    alloc.append_tokens_batch([0, 1, 2])  # remember these ids: the next refusals must still be found
    alloc.swap_out(2)
    before = snapshot(alloc)
    cases = [
        ([0, 1, 0], 1, InvalidArgumentError, "twice"),
        ([0, 9], 1, UnknownSequenceError, "9"),
        ([0, 2], 1, SequenceStateError, "swapped out"),
        ([0, True], 1, PagedKVError, "int"),
        ([0, 1.0], 1, PagedKVError, "int"),
        ([0, 1], 40, OutOfBlocksError, "need"),
        ([0, 1], -1, PagedKVError, "num_tokens"),
        (5, 1, PagedKVError, "seq_ids"),
    ]
    for ids, n, error, match in cases:
        with pytest.raises(error, match=match):
            alloc.append_tokens_batch(ids, n)
        assert_same_state(before, snapshot(alloc))
    with pytest.raises(InvalidArgumentError, match="token_ids"):
        alloc.append_tokens_batch([0, 1], 1, token_ids=[[1]])
    with pytest.raises(InvalidArgumentError, match="token_ids"):
        alloc.append_tokens_batch([0, 1], 1, token_ids=[[1], [1, 2]])
    assert_same_state(before, snapshot(alloc))


def test_the_batch_notices_a_sequence_freed_since_its_last_call():
    alloc = make()
    for seq_id in range(3):
        alloc.allocate_for_sequence(seq_id, 2)
    ids = [0, 1, 2]
    alloc.append_tokens_batch(ids)
    alloc.free_sequence(1)
    with pytest.raises(UnknownSequenceError):
        alloc.append_tokens_batch(ids)
    alloc.allocate_for_sequence(1, 1)  # a new sequence 1: a new table, which the batch must grow
    alloc.append_tokens_batch(ids)
    assert [alloc.get_num_tokens(s) for s in ids] == [4, 2, 4]
    alloc.check_invariants()


def test_a_batch_copies_a_shared_tail_once_per_writer_but_the_last():
    alloc = make(8, 4)
    alloc.allocate_for_sequence(0, 3)
    alloc.fork(0, 1)
    alloc.fork(0, 2)
    k = alloc.k_cache
    assert k is not None
    k[alloc.get_block_mapping(0)[0]] = 5.0
    placed = alloc.append_tokens_batch([0, 1, 2])
    assert len(placed) == 2 and alloc.num_copies == 2
    for seq_id in (0, 1, 2):
        assert torch.all(k[alloc.get_block_mapping(seq_id)[0], :, :3] == 5.0)  # the bytes were copied
    alloc.check_invariants()


@settings(max_examples=80, deadline=None)
@given(
    length=st.integers(0, 20),
    free_extra=st.integers(0, 6),
    up_to=st.integers(0, 40),
    shared=st.booleans(),
    watermark=st.sampled_from([0.0, 0.2]),
)
def test_a_prompt_chunk_grows_by_the_most_can_append_allows(length, free_extra, up_to, shared, watermark):
    alloc = make(cdiv(length, 4) * (2 if shared else 1) + free_extra + 1, 4)
    prompt = list(range(length + up_to))
    alloc.allocate_for_sequence(0, length, token_ids=prompt[:length])
    if shared:
        alloc.fork(0, 1)
    fits = [n for n in range(up_to + 1) if alloc.can_append([0], n, watermark=watermark)]
    before = snapshot(alloc)
    held = alloc.allocate_prompt(0, prompt, max_new_tokens=up_to, watermark=watermark)
    n = alloc.get_num_tokens(0) - length
    assert held == (length if n else None) and n == max(fits, default=0)  # the most that fits, or None
    if held is None:
        assert_same_state(before, snapshot(alloc))
    alloc.check_invariants()


def test_cached_prefix_tokens_is_what_allocation_then_finds():
    alloc = make(16, 4)
    prompt = list(range(30, 41))  # 11 tokens: two full blocks
    assert alloc.cached_prefix_tokens(prompt) == 0
    alloc.allocate_for_sequence(0, len(prompt), token_ids=prompt)
    alloc.free_sequence(0)
    before = snapshot(alloc)
    for query, hit in ((prompt, 8), (prompt[:8], 8), (prompt[:7], 4), (prompt[:3], 0), ([9] + prompt[1:], 0)):
        assert alloc.cached_prefix_tokens(query) == hit
    assert_same_state(before, snapshot(alloc))  # a question changes nothing, not even the hit counters
    assert alloc.allocate_for_sequence(1, 9, token_ids=prompt[:9]) == alloc.cached_prefix_tokens(prompt[:9]) == 8
    with pytest.raises(PagedKVError):
        alloc.cached_prefix_tokens(5)  # type: ignore[arg-type]
    with pytest.raises(PagedKVError):
        alloc.cached_prefix_tokens([1, True])
