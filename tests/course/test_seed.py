"""paged_kv_course.seed: the seed lesson's design, its fixed bugs fixed and its flagged ones visible."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged_kv_lib import (
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidTypeError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from paged_kv_lib.block_manager import BlockManager
from paged_kv_course.seed import SeedAllocator, SeedBlock, SeedBlockTable, needs_new_block, seed_growth_rule


def state(pool: SeedAllocator):
    return ({s: list(t.block_ids) for s, t in pool.sequence_block_tables.items()},
            [b.ref_count for b in pool.blocks], list(pool.free_blocks))


def test_the_seed_walkthrough():
    alloc = SeedAllocator(num_blocks=10, block_size=16, num_heads=2, head_dim=8)
    assert alloc.k_cache.shape == alloc.v_cache.shape == (10, 2, 16, 8)
    assert repr(alloc) == "SeedAllocator(free_blocks=10/10)"
    alloc.allocate_for_sequence(0, 40)
    alloc.allocate_for_sequence(1, 16)
    assert alloc.get_block_mapping(0) == [0, 1, 2] and alloc.get_block_mapping(1) == [3]
    assert alloc.append_block_to_sequence(1) == 4
    assert [b.ref_count for b in alloc.blocks[:6]] == [1, 1, 1, 1, 1, 0]
    alloc.free_sequence(0)
    assert list(alloc.free_blocks) == [5, 6, 7, 8, 9, 0, 1, 2], "head block first, as the seed frees"
    alloc.free_sequence(0)  # unknown: a no-op
    assert alloc.num_free_blocks == 8
    assert isinstance(alloc.free_blocks, deque)
    assert SeedBlock(3) == SeedBlock(3, 0) and SeedBlockTable().block_ids == []


def test_bookkeeping_only_pool_has_no_tensors():
    pool = SeedAllocator(4, 2)
    assert pool.k_cache is None and pool.v_cache is None
    with pytest.raises(InvalidTypeError, match="head_dim"):
        SeedAllocator(4, 2, num_heads=1)


def test_get_block_mapping_returns_a_copy():
    pool = SeedAllocator(8, 4)
    pool.allocate_for_sequence(0, 6)
    mapping = pool.get_block_mapping(0)
    mapping.append(7)
    assert pool.get_block_mapping(0) == [0, 1], "the seed handed out its own list; this is a copy"


def test_fork_shares_and_frees_only_unheld_blocks():
    pool = SeedAllocator(6, 4)
    pool.allocate_for_sequence(1, 5)
    pool.fork(1, 2)
    assert [b.ref_count for b in pool.blocks[:2]] == [2, 2]
    pool.free_sequence(1)
    assert pool.num_free_blocks == 4 and pool.get_block_mapping(2) == [0, 1]
    pool.free_sequence(2)
    assert list(pool.free_blocks) == [2, 3, 4, 5, 0, 1]


BAD = [
    (lambda p: p.allocate_for_sequence(0, 1), DuplicateSequenceError, "already allocated"),
    (lambda p: p.allocate_for_sequence(5, 13), OutOfBlocksError, "need 4, only 3 free"),
    (lambda p: p.allocate_for_sequence(5, -1), InvalidArgumentError, "num_prompt_tokens must be >= 0, got -1"),
    (lambda p: p.allocate_for_sequence(5, 2.0), InvalidTypeError, "must be an int"),
    (lambda p: p.allocate_for_sequence(True, 1), InvalidTypeError, "bool"),
    (lambda p: p.free_sequence(True), InvalidTypeError, "bool"),
    (lambda p: p.get_block_mapping(9), UnknownSequenceError, "9"),
    (lambda p: p.get_block_mapping(True), InvalidTypeError, "bool"),
    (lambda p: p.append_block_to_sequence(9), UnknownSequenceError, "9"),
    (lambda p: p.fork(9, 5), UnknownSequenceError, "9"),
    (lambda p: p.fork(0, 0), DuplicateSequenceError, "already allocated"),
    (lambda p: p.fork(0, False), InvalidTypeError, "bool"),
]


@pytest.mark.parametrize("call, exc, msg", BAD)
def test_bad_calls_raise_typed_errors_and_change_nothing(call, exc, msg):
    pool = SeedAllocator(8, 4)
    pool.allocate_for_sequence(0, 20)  # 5 blocks, 3 free
    pool.allocate_for_sequence(1, 1)  # 2 free
    pool.free_sequence(1)
    before = state(pool)
    with pytest.raises(exc, match=msg):
        call(pool)
    assert state(pool) == before


def test_append_when_out_of_blocks_changes_nothing():
    pool = SeedAllocator(2, 4)
    pool.allocate_for_sequence(0, 8)
    before = state(pool)
    with pytest.raises(OutOfBlocksError, match="need 1, only 0 free"):
        pool.append_block_to_sequence(0)
    assert state(pool) == before


def test_from_allocator_copies_the_library_state():
    lib = BlockManager(8, 4)
    lib.allocate_for_sequence(0, 9)
    lib.allocate_for_sequence(1, 4)
    lib.fork(1, 2)
    lib.free_sequence(0)
    pool = SeedAllocator.from_allocator(lib)
    assert state(pool) == ({1: [3], 2: [3]}, [b.ref_count for b in lib.blocks], list(lib.free_blocks))
    assert pool.k_cache is None


# ------------------------------------------------------------------ the growth rule
def decode(prompt_len: int, num_new: int, block_size: int, rule) -> list:
    """Drive a seed pool through decoding with ``rule``; return the tokens that found no slot."""
    pool = SeedAllocator(64, block_size)
    pool.allocate_for_sequence(0, prompt_len)
    homeless = []
    for length in range(prompt_len, prompt_len + num_new):
        if rule(length, block_size):
            pool.append_block_to_sequence(0)
        if length >= len(pool.get_block_mapping(0)) * block_size:
            homeless.append(length)
    return homeless


def test_the_seed_growth_rule_leaves_a_token_without_a_slot_after_a_full_prompt():
    assert decode(prompt_len=8, num_new=4, block_size=4, rule=seed_growth_rule) == [8, 9, 10]
    assert decode(prompt_len=8, num_new=4, block_size=4, rule=needs_new_block) == []


def test_the_seed_growth_rule_reserves_one_token_early():
    pool_blocks = []
    for rule in (seed_growth_rule, needs_new_block):
        pool = SeedAllocator(8, 4)
        pool.allocate_for_sequence(0, 6)
        if rule(7, 4):  # 7 tokens held: the 8th still fits in block 1
            pool.append_block_to_sequence(0)
        pool_blocks.append(len(pool.get_block_mapping(0)))
    assert pool_blocks == [3, 2], "the seed reserves a third block while the second has a free slot"


@given(st.integers(0, 40), st.integers(1, 8))
def test_needs_new_block_is_the_library_rule(length, block_size):
    lib = BlockManager(64, block_size)
    lib.allocate_for_sequence(0, length)
    assert needs_new_block(length, block_size) == bool(lib.append_tokens(0))


@given(st.lists(st.tuples(st.sampled_from(["allocate", "free", "fork"]), st.integers(0, 4),
                          st.integers(0, 12)), max_size=30))
def test_seed_and_library_agree_on_counts(ops):
    """Same successes and failures, free counts, table lengths and ref counts (ids differ: free order)."""
    seed, lib = SeedAllocator(10, 4), BlockManager(10, 4)
    for kind, seq_id, n in ops:
        outcomes = []
        for pool in (seed, lib):
            try:
                if kind == "allocate":
                    pool.allocate_for_sequence(seq_id, n)
                elif kind == "free":
                    pool.free_sequence(seq_id)
                else:
                    pool.fork(seq_id, (seq_id + 1 + n) % 5)
                outcomes.append("ok")
            except (ValueError, RuntimeError) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[0] == outcomes[1], (kind, seq_id, n)
        assert seed.num_free_blocks == lib.num_free_blocks
        assert {s: len(seed.get_block_mapping(s)) for s in seed.sequence_block_tables} == \
            {s: len(lib.get_block_mapping(s)) for s in lib.seq_ids}
        assert sorted(b.ref_count for b in seed.blocks) == sorted(b.ref_count for b in lib.blocks)
