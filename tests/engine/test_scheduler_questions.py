"""What a scheduler asks the allocator (blocks_to_append, can_append, watermark_blocks) and its swap calls, which check
and act in one (swap_in, swap_out: all or none, ``None`` changing nothing when they do not fit).

Each answer must be what the act then does: the blocks predicted are the blocks taken.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib import (
    InvalidArgumentError,
    InvalidTypeError,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    PagedKVError,
    SequenceStateError,
    UnknownSequenceError,
)

from helpers import assert_same_state, snapshot


def make(num_blocks=10, block_size=4, **kw):
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 2, torch.float32, **kw)


def taken_by_append(alloc, seq_id, num_tokens=1):
    free = alloc.num_free_blocks
    alloc.append_tokens(seq_id, num_tokens)
    return free - alloc.num_free_blocks


# ------------------------------------------------------------------ watermark_blocks
@pytest.mark.parametrize("watermark", [0.0, 0.01, 0.1, 0.25, 0.3, 0.999, 1.0, 1])
def test_watermark_blocks_is_the_ceiling(watermark):
    alloc = make(num_blocks=37)
    assert alloc.watermark_blocks(watermark) == math.ceil(watermark * 37)


def test_can_allocate_uses_the_watermark_rule():
    alloc = make(num_blocks=10)
    alloc.allocate_for_sequence(0, 4 * 5)  # 5 free
    # 0.21 * 10 = 2.1 -> 3 blocks kept back: a 2-block prompt fits (5 - 2 = 3), a 3-block one does not.
    assert alloc.watermark_blocks(0.21) == 3
    assert alloc.can_allocate(8, watermark=0.21)
    assert not alloc.can_allocate(9, watermark=0.21)


@pytest.mark.parametrize(
    "bad, exc",
    [(-0.1, InvalidArgumentError), (1.5, InvalidArgumentError), (True, InvalidTypeError), ("0.1", InvalidTypeError),
     (None, InvalidTypeError)],
)
def test_watermark_refusals_are_typed(bad, exc):
    alloc = make()
    alloc.allocate_for_sequence(0, 3)
    for call in (
        lambda: alloc.watermark_blocks(bad),
        lambda: alloc.can_allocate(1, watermark=bad),
        lambda: alloc.can_append([0], watermark=bad),
    ):
        with pytest.raises(exc, match="watermark"):
            call()
    assert issubclass(exc, PagedKVError)


# ------------------------------------------------------------------ blocks_to_append
def test_blocks_to_append_counts_new_blocks_exactly():
    alloc = make(block_size=4)
    alloc.allocate_for_sequence(0, 3)
    assert alloc.blocks_to_append(0) == 0  # slot 3 is free
    assert alloc.blocks_to_append(0, 2) == 1
    assert alloc.blocks_to_append(0, 5) == 1  # up to 8 tokens: two blocks
    assert alloc.blocks_to_append(0, 6) == 2
    assert alloc.blocks_to_append(0, 0) == 0
    assert taken_by_append(alloc, 0) == 0
    assert alloc.blocks_to_append(0) == 1  # the prompt's last block is full now
    assert taken_by_append(alloc, 0) == 1


def test_blocks_to_append_after_a_reserved_empty_block():
    alloc = make(block_size=4)
    alloc.allocate_for_sequence(0, 4)
    alloc.append_block_to_sequence(0)
    assert alloc.blocks_to_append(0, 4) == 0
    assert alloc.blocks_to_append(0, 5) == 1


def test_shared_partial_tail_needs_a_copy_shared_full_tail_does_not():
    alloc = make(block_size=4)
    alloc.allocate_for_sequence(0, 6)  # tail holds 2 of 4
    alloc.fork(0, 1)
    assert alloc.blocks_to_append(0) == alloc.blocks_to_append(1) == 1, "copy-on-write of the shared tail"
    assert alloc.blocks_to_append(0, 3) == 2, "the copy and one new block"
    assert taken_by_append(alloc, 1) == 1
    assert alloc.blocks_to_append(0) == 0, "the other holder now owns the tail alone"
    assert taken_by_append(alloc, 0) == 0

    alloc.allocate_for_sequence(2, 8)  # full tail
    alloc.fork(2, 3)
    assert alloc.blocks_to_append(2) == 1, "a full shared tail is not copied; the next token needs a new block"
    assert taken_by_append(alloc, 2) == 1


def test_prefix_cached_blocks_are_shared_but_full():
    alloc = make(num_blocks=6, block_size=4)
    prompt = list(range(8))
    alloc.allocate_for_sequence(0, 8, token_ids=prompt)
    alloc.allocate_for_sequence(1, 9, token_ids=prompt + [9])  # hits both full blocks
    assert alloc.blocks_to_append(1) == 0
    assert alloc.blocks_to_append(0) == 1
    alloc.free_sequence(0)
    alloc.free_sequence(1)  # 6 free, 2 of them still cached
    assert alloc.num_cached_free_blocks == 2
    alloc.allocate_for_sequence(2, 4 * 4)  # the four uncached free blocks; the cached two stay free
    assert alloc.can_append([2], 8), "cached free blocks count as free"
    assert not alloc.can_append([2], 9)
    free = alloc.num_free_blocks
    alloc.append_tokens(2, 8)
    assert alloc.num_free_blocks == free - 2 == 0


# ------------------------------------------------------------------ can_append
def test_can_append_counts_a_shared_tail_once_per_copy():
    alloc = make(num_blocks=4, block_size=4)
    alloc.allocate_for_sequence(0, 2)
    alloc.fork(0, 1)
    alloc.fork(0, 2)  # one block held by three tables; 3 free
    assert alloc.blocks_to_append(0) == 1
    # All three grow: the first two copy, the last writes in place.
    assert alloc.can_append([0, 1, 2], watermark=0.25)  # 3 - 2 = 1 >= ceil(0.25 * 4) = 1
    assert not alloc.can_append([0, 1, 2], watermark=0.5)
    assert alloc.can_append([1, 2], watermark=0.25)  # both copy: 2 taken
    before = alloc.num_free_blocks
    for seq_id in (2, 0, 1):
        alloc.append_tokens(seq_id)
    assert before - alloc.num_free_blocks == 2
    alloc.check_invariants()


def test_can_append_sums_many_sequences_and_matches_the_act():
    alloc = make(num_blocks=8, block_size=4)
    for seq_id, n in enumerate([4, 8, 3]):
        alloc.allocate_for_sequence(seq_id, n)  # 4 used, 4 free
    assert [alloc.blocks_to_append(s) for s in (0, 1, 2)] == [1, 1, 0]
    assert [alloc.blocks_to_append(s, 5) for s in (0, 1, 2)] == [2, 2, 1]
    assert alloc.can_append([0, 1, 2], 1)
    assert alloc.can_append([0, 1, 2], 1, watermark=0.25)  # 4 - 2 = 2 >= 2
    assert not alloc.can_append([0, 1, 2], 1, watermark=0.26)
    assert not alloc.can_append([0, 1, 2], 5)  # 5 > 4
    assert alloc.can_append([0, 2], 5) and alloc.can_append((s for s in [1, 2]), 5)
    alloc.append_tokens(0, 5)
    alloc.append_tokens(2, 5)
    assert alloc.num_free_blocks == 1


def test_can_append_on_an_empty_list_checks_only_the_watermark():
    alloc = make(num_blocks=4)
    alloc.allocate_for_sequence(0, 8)  # 2 free
    assert alloc.can_append([], watermark=0.5)
    assert not alloc.can_append([], watermark=0.51)


def test_can_append_refusals_are_typed_and_change_nothing():
    alloc = make(num_cpu_blocks=4)
    alloc.allocate_for_sequence(0, 5)
    alloc.allocate_for_sequence(1, 5)
    alloc.swap_out(1)
    before = snapshot(alloc)
    with pytest.raises(UnknownSequenceError, match="7"):
        alloc.can_append([0, 7])
    with pytest.raises(SequenceStateError, match="swapped out"):
        alloc.can_append([0, 1])
    with pytest.raises(SequenceStateError, match="swapped out"):
        alloc.blocks_to_append(1)
    with pytest.raises(InvalidArgumentError, match="listed twice"):
        alloc.can_append([0, 0])
    with pytest.raises(InvalidTypeError, match="seq_id"):
        alloc.can_append([True])
    with pytest.raises(InvalidTypeError, match="seq_id"):
        alloc.blocks_to_append(False)
    with pytest.raises(InvalidTypeError, match="num_tokens"):
        alloc.blocks_to_append(0, 1.0)
    with pytest.raises(InvalidArgumentError, match="num_tokens must be >= 0, got -1"):
        alloc.can_append([0], -1)
    with pytest.raises(InvalidTypeError, match="seq_ids"):
        alloc.can_append(0)
    with pytest.raises(UnknownSequenceError):
        alloc.blocks_to_append(9)
    assert_same_state(before, snapshot(alloc))


# ------------------------------------------------------------------ swap_in checks and acts
def declined(alloc, call):
    """The call answers ``None`` and changes nothing."""
    before = snapshot(alloc)
    assert call() is None
    assert_same_state(before, snapshot(alloc))


def test_swap_in_counts_every_held_block_and_the_watermark():
    alloc = make(num_blocks=6, block_size=4, num_cpu_blocks=6)
    alloc.allocate_for_sequence(0, 4)
    alloc.append_block_to_sequence(0)  # 2 blocks for 4 tokens: both move
    alloc.swap_out(0)
    alloc.allocate_for_sequence(1, 12)  # 3 free
    declined(alloc, lambda: alloc.swap_in(0, watermark=0.2))  # needs 2 kept back
    alloc.append_tokens(1, 4)  # 2 free
    declined(alloc, lambda: alloc.swap_in(0, watermark=0.01))
    alloc.append_tokens(1, 1)  # 1 free
    declined(alloc, lambda: alloc.swap_in(0))
    alloc.free_sequence(1)
    assert alloc.swap_in(0, watermark=4 / 6) is not None  # 6 - 2 = 4 >= 4
    assert alloc.num_free_blocks == 4


def test_swap_in_of_several_is_all_or_none():
    alloc = make(num_blocks=6, block_size=4, num_cpu_blocks=6)
    for seq_id in (0, 1):
        alloc.allocate_for_sequence(seq_id, 8)
    alloc.swap_out(0, 1)
    alloc.allocate_for_sequence(2, 12)  # 3 free: either fits alone, not both
    declined(alloc, lambda: alloc.swap_in(0, 1))
    alloc.free_sequence(2)
    cpu_ids, device_ids = alloc.swap_in(1, 0)
    assert len(cpu_ids) == len(device_ids) == 4 and alloc.seq_ids == (1, 0) and alloc.swapped_seq_ids == ()
    alloc.check_invariants()


def test_swap_in_refusals():
    alloc = make(num_cpu_blocks=2)
    alloc.allocate_for_sequence(0, 1)
    alloc.allocate_for_sequence(1, 1)
    alloc.swap_out(1)
    before = snapshot(alloc)
    with pytest.raises(SequenceStateError, match="not swapped out"):
        alloc.swap_in(0)
    with pytest.raises(SequenceStateError, match="not swapped out"):
        alloc.swap_in(1, 0)
    with pytest.raises(UnknownSequenceError):
        alloc.swap_in(3)
    with pytest.raises(InvalidTypeError):
        alloc.swap_in(True)
    with pytest.raises(InvalidArgumentError, match="twice"):
        alloc.swap_in(1, 1)
    with pytest.raises(InvalidArgumentError, match="watermark"):
        alloc.swap_in(1, watermark=2)
    assert_same_state(before, snapshot(alloc))


# ------------------------------------------------------------------ prediction == act
@settings(max_examples=150)
@given(
    ops=st.lists(st.tuples(st.sampled_from("afpxs"), st.integers(0, 5), st.integers(0, 9)), max_size=25),
    grow=st.lists(st.integers(0, 5), max_size=6, unique=True),
    num_tokens=st.integers(0, 9),
    watermark=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_can_append_is_exactly_what_appending_takes(ops, grow, num_tokens, watermark):
    alloc = make(num_blocks=12, block_size=4, num_cpu_blocks=12)
    for op, seq_id, n in ops:  # build a state with shared tails, cached blocks and swapped sequences
        try:
            if op == "a":
                alloc.allocate_for_sequence(seq_id, n, token_ids=[t % 3 for t in range(n)])
            elif op == "f":
                alloc.fork(seq_id, (seq_id + n) % 6)
            elif op == "p":
                alloc.append_tokens(seq_id, n % 4)
            elif op == "x":
                alloc.free_sequence(seq_id)
            elif alloc.is_swapped(seq_id):
                alloc.swap_in(seq_id)
            else:
                alloc.swap_out(seq_id)
        except PagedKVError:
            pass
    grow = [s for s in grow if s in alloc.seq_ids]
    singles = {s: alloc.blocks_to_append(s, num_tokens) for s in grow}
    answer = alloc.can_append(grow, num_tokens, watermark=watermark)
    free = alloc.num_free_blocks
    try:
        for seq_id in grow:
            before = alloc.num_free_blocks
            alloc.append_tokens(seq_id, num_tokens)
            assert before - alloc.num_free_blocks <= singles[seq_id]
        fits = alloc.num_free_blocks >= alloc.watermark_blocks(watermark)
    except OutOfBlocksError:
        fits = False
    assert answer is fits, (grow, num_tokens, watermark, free)
    alloc.check_invariants()
    if alloc.swapped_seq_ids:
        seq_id = alloc.swapped_seq_ids[0]
        fits = len(alloc.swapped_block_tables[seq_id]) <= alloc.num_free_blocks
        before = snapshot(alloc)
        assert (alloc.swap_in(seq_id) is not None) is fits
        if not fits:
            assert_same_state(before, snapshot(alloc))


@settings(max_examples=200)
@given(
    holders=st.integers(1, 4),
    growers=st.integers(0, 4),
    spare=st.integers(0, 5),
    tail_fill=st.integers(1, 4),
    num_tokens=st.integers(1, 6),
)
def test_can_append_around_one_shared_tail(holders, growers, spare, tail_fill, num_tokens):
    """A tail shared by ``holders`` tables, grown by some of them, with a few blocks spare: the answer is the act."""
    growers = min(growers, holders)
    alloc = make(num_blocks=16, block_size=4)
    alloc.allocate_for_sequence(0, 4 + tail_fill)  # the second block holds tail_fill of 4
    for child in range(1, holders):
        alloc.fork(0, child)
    alloc.allocate_for_sequence(99, 4 * (alloc.num_free_blocks - spare))  # leave `spare` free
    grow = list(range(growers))
    answer = alloc.can_append(grow, num_tokens)
    try:
        for seq_id in grow:
            alloc.append_tokens(seq_id, num_tokens)
        fits = True
    except OutOfBlocksError:
        fits = False
    assert answer is fits
    alloc.check_invariants()


# ------------------------------------------------------------------ swap_out checks and acts
@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4), forks=st.integers(0, 2),
       cpu_blocks=st.integers(0, 10))
def test_swap_out_of_a_group_is_all_or_none(lengths, forks, cpu_blocks):
    """Shared blocks get a private CPU copy each: the group goes when the CPU pool holds every block of every
    member, else nothing changes (``None``)."""
    alloc = make(num_blocks=24, block_size=3, num_cpu_blocks=cpu_blocks)
    for seq_id, n in enumerate(lengths):
        alloc.allocate_for_sequence(seq_id, n)
    group = list(range(len(lengths)))
    for child in range(100, 100 + forks):
        alloc.fork(0, child)
        group.append(child)
    fits = sum(len(alloc.get_block_mapping(s)) for s in group) <= cpu_blocks
    before = snapshot(alloc)
    moved = alloc.swap_out(*group)
    if fits:
        assert alloc.swapped_seq_ids == tuple(group) and alloc.seq_ids == ()
        assert len(moved[0]) == len(moved[1]) == cpu_blocks - alloc.num_free_cpu_blocks
    else:
        assert moved is None
        assert_same_state(before, snapshot(alloc))
    alloc.check_invariants()


def test_swap_out_refusals_are_typed_and_change_nothing():
    alloc = make(num_cpu_blocks=4)
    alloc.allocate_for_sequence(0, 5)
    alloc.allocate_for_sequence(1, 2)
    alloc.swap_out(1)
    before = snapshot(alloc)
    with pytest.raises(UnknownSequenceError, match="7"):
        alloc.swap_out(0, 7)
    with pytest.raises(SequenceStateError, match="swapped out"):
        alloc.swap_out(1)
    with pytest.raises(InvalidArgumentError, match="twice"):
        alloc.swap_out(0, 0)
    with pytest.raises(InvalidTypeError):
        alloc.swap_out([0])
    with pytest.raises(InvalidTypeError):
        alloc.swap_out(True)
    assert_same_state(before, snapshot(alloc))
    assert alloc.swap_out() == ([], [])


# ------------------------------------------------------------------ can_allocate_many
@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 14), max_size=4), used=st.integers(0, 9),
       watermark=st.sampled_from([0.0, 0.1, 0.3]))
def test_can_allocate_many_is_exactly_whether_they_all_fit_leaving_the_watermark(lengths, used, watermark):
    """Without content to share, allocating one by one either fits all, leaving the watermark, or not."""
    alloc = make(num_blocks=10, block_size=4, enable_prefix_caching=False)
    alloc.allocate_for_sequence(99, 4 * used)
    answer = alloc.can_allocate_many(lengths, watermark=watermark)
    fits = True
    for seq_id, n in enumerate(lengths):
        if not alloc.can_allocate(n):
            fits = False
            break
        alloc.allocate_for_sequence(seq_id, n)
    fits = fits and alloc.num_free_blocks >= alloc.watermark_blocks(watermark)
    assert answer is fits


def test_can_allocate_many_counts_a_cached_block_once_and_never_says_yes_wrongly():
    alloc = make(num_blocks=6, block_size=4)
    prompt = list(range(8))
    alloc.allocate_for_sequence(0, 8, token_ids=prompt)
    alloc.free_sequence(0)  # its two full blocks are free and still cached
    # Two sequences of the prompt + 4 tokens: the two cached blocks once, one new block each.
    tokens = [prompt + [1, 2, 3, 4], prompt + [5, 6, 7, 8]]
    assert alloc.can_allocate_many([12, 12], token_ids=tokens)
    assert alloc.can_allocate_many([12, 12], token_ids=tokens, watermark=0.3)  # 6 - 4 = 2 = ceil(1.8)
    assert not alloc.can_allocate_many([12, 12], token_ids=tokens, watermark=0.34)
    assert alloc.can_allocate_many([12, 12, 8], token_ids=tokens + [prompt])  # the cached pair: once for three
    assert alloc.can_allocate_many([12, 12]) and not alloc.can_allocate_many([12, 12, 1])  # no content: 3 + 3 of 6
    for seq_id, ids in enumerate(tokens):
        alloc.allocate_for_sequence(seq_id, 12, token_ids=ids)
    assert alloc.num_free_blocks == 2


def test_can_allocate_many_refusals_are_typed_and_change_nothing():
    alloc = make()
    alloc.allocate_for_sequence(0, 5, token_ids=[1] * 5)
    before = snapshot(alloc)
    with pytest.raises(InvalidArgumentError, match="2 token_ids for 1 sequences"):
        alloc.can_allocate_many([4], token_ids=[[1] * 4, [2] * 4])
    with pytest.raises(InvalidArgumentError, match="got -1"):
        alloc.can_allocate_many([4, -1])
    with pytest.raises(InvalidTypeError):
        alloc.can_allocate_many(4)
    with pytest.raises(InvalidArgumentError, match="watermark"):
        alloc.can_allocate_many([4], watermark=2.0)
    with pytest.raises(PagedKVError):
        alloc.can_allocate_many([4], token_ids=[[1, 2]])  # 2 ids for 4 tokens
    assert_same_state(before, snapshot(alloc))


# ------------------------------------------------------------------ blocks_to_hold
def test_blocks_to_hold_asks_of_the_whole_pool_not_of_what_is_free():
    alloc = make(num_blocks=10, block_size=4)
    alloc.allocate_for_sequence(0, 36)  # 9 of 10 blocks held: irrelevant to "ever"
    assert alloc.blocks_to_hold(40) == 10 and alloc.blocks_to_hold(41) == 11
    assert alloc.blocks_to_hold(20, num_seqs=2) == 10 and alloc.blocks_to_hold(21, num_seqs=2) == 12
    assert alloc.blocks_to_hold(21, num_seqs=2, watermark=0.1) == 2 * 6 + 1
    assert alloc.blocks_to_hold(40, watermark=0.01) == 11
    with pytest.raises(InvalidArgumentError, match="num_seqs"):
        alloc.blocks_to_hold(4, num_seqs=0)
