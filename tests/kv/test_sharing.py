"""Fork and copy-on-write, prefix caching, eviction order, watermark admission, swapping."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib import (
    BlocksInUseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    SequenceStateError,
    UnknownSequenceError,
    block_key,
    chain_keys,
)

from helpers import assert_same_state, snapshot
from helpers import kv_for as _kv_for

H, D = 2, 4


def make(num_blocks=16, block_size=4, **kw):
    return PagedKVCacheAllocator(num_blocks, block_size, H, D, torch.float32, **kw)


def kv_for(tokens, layer=0):
    return _kv_for(tokens, H, D, layer)


def fill(alloc, seq_id, tokens, start=0, layers=1):
    for layer in range(layers):
        k, v = kv_for(tokens, layer)
        alloc.write_kv(seq_id, range(start, len(tokens)), k[start:], v[start:], layer=layer)


# ------------------------------------------------------------------ fork and copy-on-write
@pytest.mark.parametrize("prompt_len", [6, 8])  # last block partial / last block full
def test_fork_then_append_on_both_sides(prompt_len):
    alloc = make(num_layers=2)
    tokens = list(range(100, 100 + prompt_len))
    alloc.allocate_for_sequence(0, prompt_len)
    fill(alloc, 0, tokens, layers=2)
    free_before = alloc.num_free_blocks
    alloc.fork(0, 1)
    assert alloc.num_free_blocks == free_before, "fork allocates nothing"
    assert alloc.get_block_mapping(1) == alloc.get_block_mapping(0)
    assert all(alloc.blocks[b].ref_count == 2 for b in alloc.get_block_mapping(0))
    log_before = len(alloc.copy_log)

    # parent appends and writes a token
    new0 = alloc.append_tokens(0)
    alloc.write_kv(0, [prompt_len], torch.full((1, H, D), 7.0), torch.full((1, H, D), 7.0))
    copies = list(alloc.copy_log)[log_before:]
    if prompt_len % 4:  # the shared last block had room: it is copied, all layers
        assert len(copies) == 1
        src, dst = copies[0]
        assert new0 == (dst,)
        assert alloc.get_block_mapping(0)[-1] == dst and alloc.get_block_mapping(1)[-1] == src
        for layer in range(2):
            # the copy took the old contents of every layer, then got the new token
            assert torch.equal(alloc.k_caches[layer][dst, :, : prompt_len % 4], alloc.k_caches[layer][src, :, : prompt_len % 4])
    else:  # the last block was full: a fresh block, nothing copied
        assert copies == []
        assert len(new0) == 1
    # child appends its own token
    alloc.append_tokens(1)
    alloc.write_kv(1, [prompt_len], torch.full((1, H, D), 9.0), torch.full((1, H, D), 9.0))
    alloc.check_invariants()

    for seq_id, value in ((0, 7.0), (1, 9.0)):
        for layer in range(2):
            k, v = alloc.read_kv(seq_id, layer=layer)
            ek, ev = kv_for(tokens, layer)
            assert torch.equal(k[:prompt_len], ek) and torch.equal(v[:prompt_len], ev)
        k, _ = alloc.read_kv(seq_id)
        assert torch.all(k[prompt_len] == value)
    # full shared blocks that were only read are never copied
    full = prompt_len // 4
    assert alloc.get_block_mapping(0)[:full] == alloc.get_block_mapping(1)[:full]


def test_write_into_shared_full_block_copies_it():
    alloc = make()
    alloc.allocate_for_sequence(0, 8)
    fill(alloc, 0, list(range(8)))
    alloc.fork(0, 1)
    before_k, _ = alloc.read_kv(0)
    copies = alloc.write_kv(1, [1], torch.zeros(1, H, D), torch.zeros(1, H, D))
    assert len(copies) == 1 and copies[0][0] == alloc.get_block_mapping(0)[0]
    assert torch.equal(alloc.read_kv(0)[0], before_k), "the other holder's data is unchanged, bit for bit"
    k1, _ = alloc.read_kv(1)
    assert torch.all(k1[1] == 0) and torch.equal(k1[2:], before_k[2:])
    assert alloc.get_block_mapping(0)[1] == alloc.get_block_mapping(1)[1]  # untouched block still shared
    alloc.check_invariants()


def test_freeing_parent_keeps_children():
    alloc = make()
    alloc.allocate_for_sequence(0, 7)
    fill(alloc, 0, list(range(7)))
    alloc.fork(0, 1)
    alloc.fork(0, 2)
    free_before = alloc.num_free_blocks
    alloc.free_sequence(0)
    assert alloc.num_free_blocks == free_before, "children still hold every block"
    k1, _ = alloc.read_kv(1)
    assert torch.equal(k1, kv_for(range(7))[0])
    alloc.free_sequence(1)
    assert alloc.num_free_blocks == free_before
    alloc.free_sequence(2)
    assert alloc.num_free_blocks == 16
    alloc.check_invariants()


def test_fork_errors_change_nothing():
    alloc = make()
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(1, 3)
    before = snapshot(alloc)
    with pytest.raises(UnknownSequenceError):
        alloc.fork(5, 6)
    with pytest.raises(DuplicateSequenceError):
        alloc.fork(0, 1)
    with pytest.raises(TypeError):
        alloc.fork(0, "x")
    assert_same_state(before, snapshot(alloc))


def test_copy_on_write_out_of_blocks_changes_nothing():
    alloc = make(num_blocks=2)
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(9, 4)  # the last free block
    alloc.fork(0, 1)
    before = snapshot(alloc)
    with pytest.raises(OutOfBlocksError, match="need 1, only 0 free"):
        alloc.append_tokens(1)
    with pytest.raises(OutOfBlocksError):
        alloc.write_kv(1, [0], torch.zeros(1, H, D), torch.zeros(1, H, D))
    assert_same_state(before, snapshot(alloc))


# ---------------------------------------------------------------- prefix caching
def test_chained_keys_depend_on_the_prefix():
    a = chain_keys([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = chain_keys([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[0] != b[0] and a[1] != b[1], "equal tokens after different prefixes never match"
    assert a[1] == block_key(a[0], [5, 6, 7, 8])
    assert chain_keys([1, 2, 3, 4, 5], 4) == a[:1], "partial blocks get no key"
    assert chain_keys([1, 2, 3, 4], 4, b"lora-1") != a[:1]


def test_two_prompts_sharing_two_and_a_half_blocks_share_exactly_two():
    alloc = make(num_blocks=16, block_size=4)
    common = list(range(10))  # 2.5 blocks
    p1, p2 = common + [50, 51, 52], common + [60, 61, 62]
    assert alloc.allocate_for_sequence(1, len(p1), token_ids=p1) == 0
    fill(alloc, 1, p1)
    cached = alloc.allocate_for_sequence(2, len(p2), token_ids=p2)
    assert cached == 8
    m1, m2 = alloc.get_block_mapping(1), alloc.get_block_mapping(2)
    assert m1[:2] == m2[:2] and m1[2] != m2[2]
    assert [alloc.blocks[b].ref_count for b in m1[:2]] == [2, 2]
    fill(alloc, 2, p2, start=cached)
    assert torch.equal(alloc.read_kv(2)[0], kv_for(p2)[0])
    s = alloc.stats()
    assert (s.prefix_queries, s.prefix_hits) == (6, 2)
    assert s.prefix_hit_rate == pytest.approx(2 / 6)
    alloc.check_invariants()


def test_salt_separates_equal_prompts():
    alloc = make()
    p = list(range(8))
    alloc.allocate_for_sequence(1, 8, token_ids=p, extra_key="tenant-a")
    assert alloc.allocate_for_sequence(2, 8, token_ids=p, extra_key="tenant-b") == 0
    assert alloc.allocate_for_sequence(3, 8, token_ids=p, extra_key=b"tenant-a") == 8


def test_freed_prefix_is_hit_again_until_pressure_evicts_it():
    alloc = make(num_blocks=6, block_size=4)
    p = list(range(100, 112))  # 3 full blocks
    alloc.allocate_for_sequence(1, 12, token_ids=p)
    fill(alloc, 1, p)
    blocks = alloc.get_block_mapping(1)
    alloc.free_sequence(1)
    assert alloc.num_free_blocks == 6 and alloc.stats().cached_free_blocks == 3
    # hit again: same blocks, content intact, taken out of the middle of the free queue
    assert alloc.allocate_for_sequence(2, 12, token_ids=p) == 12
    assert alloc.get_block_mapping(2) == blocks
    assert torch.equal(alloc.read_kv(2)[0], kv_for(p)[0])
    alloc.free_sequence(2)
    # pressure: a 4-block sequence with other tokens takes the 3 uncached blocks, then the tail block of p
    alloc.allocate_for_sequence(3, 16, token_ids=list(range(16)))
    assert alloc.get_block_mapping(3)[3] == blocks[2], "the tail of the cached sequence goes first"
    alloc.free_sequence(3)
    hit = alloc.allocate_for_sequence(4, 12, token_ids=p)
    assert hit == 8, "the head blocks survived"
    alloc.check_invariants()


def test_eviction_takes_least_recently_freed_first():
    alloc = make(num_blocks=4, block_size=2)
    a, b = [1, 2], [3, 4]
    alloc.allocate_for_sequence(1, 2, token_ids=a)
    alloc.allocate_for_sequence(2, 2, token_ids=b)
    alloc.free_sequence(1)  # a is freed first: least recently used
    alloc.free_sequence(2)
    a_block, b_block = 0, 1
    assert alloc.free_blocks == (2, 3, a_block, b_block), "never-used blocks, then a's, then b's"
    alloc.allocate_for_sequence(3, 6)  # takes 3 blocks: both plain ones, then a's
    assert alloc.get_block_mapping(3) == [2, 3, a_block]
    assert alloc.allocate_for_sequence(5, 2, token_ids=b) == 2, "b survived"
    alloc.free_sequence(5)
    assert alloc.allocate_for_sequence(4, 2, token_ids=a) == 0, "a was evicted"
    alloc.check_invariants()


def test_reused_block_loses_its_key():
    alloc = make(num_blocks=1, block_size=2)
    alloc.allocate_for_sequence(1, 2, token_ids=[1, 2])
    alloc.free_sequence(1)
    h = alloc.blocks[0].block_hash
    assert h is not None
    alloc.allocate_for_sequence(2, 2)
    assert alloc.blocks[0].block_hash is None
    alloc.free_sequence(2)
    assert alloc.allocate_for_sequence(3, 2, token_ids=[1, 2]) == 0


def test_blocks_that_fill_during_decoding_become_cacheable():
    alloc = make(block_size=4)
    alloc.allocate_for_sequence(1, 3, token_ids=[5, 6, 7])
    assert alloc.stats().cached_free_blocks == 0 and alloc.blocks[alloc.get_block_mapping(1)[0]].block_hash is None
    alloc.append_tokens(1, 2, token_ids=[8, 9])
    first = alloc.get_block_mapping(1)[0]
    assert alloc.blocks[first].block_hash == block_key(None, [5, 6, 7, 8])
    assert alloc.blocks[alloc.get_block_mapping(1)[1]].block_hash is None, "partial blocks are never cached"
    assert alloc.allocate_for_sequence(2, 6, token_ids=[5, 6, 7, 8, 1, 1]) == 4
    # appending without ids: the content is unknown, so no more keys
    alloc.append_tokens(1, 3)
    assert alloc.blocks[alloc.get_block_mapping(1)[1]].block_hash is None
    alloc.check_invariants()


def test_prefix_cache_off_switch():
    alloc = make(enable_prefix_caching=False)
    alloc.allocate_for_sequence(1, 8, token_ids=list(range(8)))
    alloc.free_sequence(1)
    assert alloc.allocate_for_sequence(2, 8, token_ids=list(range(8))) == 0
    assert all(b.block_hash is None for b in alloc.blocks)


def test_reset_prefix_cache():
    alloc = make()
    alloc.allocate_for_sequence(1, 8, token_ids=list(range(8)))
    with pytest.raises(BlocksInUseError, match="2 blocks are in use"):
        alloc.reset_prefix_cache()
    alloc.free_sequence(1)
    assert alloc.reset_prefix_cache() == 2
    assert alloc.allocate_for_sequence(2, 8, token_ids=list(range(8))) == 0


def test_token_id_errors_change_nothing():
    alloc = make()
    alloc.allocate_for_sequence(1, 2, token_ids=[1, 2])
    before = snapshot(alloc)
    with pytest.raises(ValueError, match="3 token_ids for 2 tokens"):
        alloc.allocate_for_sequence(2, 2, token_ids=[1, 2, 3])
    with pytest.raises(TypeError, match="token_ids"):
        alloc.allocate_for_sequence(2, 2, token_ids=[1.5, 2])
    with pytest.raises(ValueError, match="1 token_ids for 2 tokens"):
        alloc.append_tokens(1, 2, token_ids=[4])
    with pytest.raises(TypeError, match="extra_key"):
        alloc.allocate_for_sequence(2, 2, token_ids=[1, 2], extra_key=5)
    assert_same_state(before, snapshot(alloc))


def test_can_allocate_counts_hits_and_watermark():
    alloc = make(num_blocks=10, block_size=4)
    p = list(range(16))
    alloc.allocate_for_sequence(1, 16, token_ids=p)
    alloc.allocate_for_sequence(2, 20)  # 5 blocks; 1 left free
    assert not alloc.can_allocate(16)
    assert alloc.can_allocate(20, token_ids=p + [1, 2, 3, 4]), "4 cached blocks + 1 new block"
    alloc.free_sequence(2)  # 6 free
    assert alloc.can_allocate(8, watermark=0.3)  # 6 - 2 = 4 >= 3
    assert not alloc.can_allocate(16, watermark=0.3)  # 6 - 4 = 2 < 3
    assert alloc.can_allocate(16, token_ids=p, watermark=0.5)  # all hits: takes nothing
    with pytest.raises(ValueError, match="watermark"):
        alloc.can_allocate(1, watermark=1.5)


# ---------------------------------------------------------------------- swapping
def test_swap_round_trip_is_bit_exact_and_may_move_blocks():
    alloc = make(num_blocks=8, block_size=4, num_cpu_blocks=4, num_layers=2)
    p = list(range(10))
    alloc.allocate_for_sequence(1, 10)
    fill(alloc, 1, p, layers=2)
    k_before = [alloc.read_kv(1, layer=l) for l in range(2)]
    old_blocks = alloc.get_block_mapping(1)
    alloc.swap_out(1)
    assert alloc.is_swapped(1) and alloc.num_free_blocks == 8 and alloc.get_num_tokens(1) == 10
    assert alloc.stats().cpu_free_blocks == 1
    alloc.allocate_for_sequence(2, 8)  # takes two of the old blocks
    with pytest.raises(SequenceStateError, match="swapped out"):
        alloc.append_tokens(1)
    _, new_blocks = alloc.swap_in(1)
    assert new_blocks != old_blocks
    for layer in range(2):
        k, v = alloc.read_kv(1, layer=layer)
        assert torch.equal(k, k_before[layer][0]) and torch.equal(v, k_before[layer][1])
    assert alloc.stats().cpu_free_blocks == 4
    alloc.check_invariants()


def test_swap_under_sharing_keeps_other_holders_correct():
    alloc = make(num_blocks=8, block_size=4, num_cpu_blocks=8)
    p = list(range(6))
    alloc.allocate_for_sequence(1, 6)
    fill(alloc, 1, p)
    alloc.fork(1, 2)
    alloc.swap_out(1)
    assert alloc.num_free_blocks == 6, "the child still holds both blocks"
    alloc.append_tokens(2)
    alloc.write_kv(2, [6], torch.ones(1, H, D), torch.ones(1, H, D))
    alloc.swap_in(1)
    assert torch.equal(alloc.read_kv(1)[0], kv_for(p)[0])
    k2, _ = alloc.read_kv(2)
    assert torch.equal(k2[:6], kv_for(p)[0]) and torch.all(k2[6] == 1)
    alloc.free_sequence(1)
    alloc.free_sequence(2)
    assert alloc.num_free_blocks == 8
    alloc.check_invariants()


def test_swap_refusals_change_nothing():
    alloc = make(num_blocks=4, block_size=4, num_cpu_blocks=1)
    alloc.allocate_for_sequence(1, 8)
    before = snapshot(alloc)
    assert alloc.swap_out(1) is None  # it needs 2 CPU blocks, 1 is free
    with pytest.raises(SequenceStateError, match="not swapped out"):
        alloc.swap_in(1)
    with pytest.raises(UnknownSequenceError):
        alloc.swap_in(7)
    assert_same_state(before, snapshot(alloc))
    alloc.free_sequence(1)
    alloc.allocate_for_sequence(2, 4)
    alloc.swap_out(2)
    alloc.allocate_for_sequence(3, 16)  # the device is full
    before = snapshot(alloc)
    assert alloc.swap_in(2) is None  # it needs 1 block, none is free
    with pytest.raises(DuplicateSequenceError):
        alloc.allocate_for_sequence(2, 1)
    assert_same_state(before, snapshot(alloc))
    alloc.free_sequence(2)  # freeing a swapped sequence returns its CPU blocks
    assert alloc.stats().cpu_free_blocks == alloc.num_free_cpu_blocks == 1
    alloc.check_invariants()
