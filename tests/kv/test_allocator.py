"""Unit tests of the core allocator: the seed's walk-through, every method, every error."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib import (
    Block,
    BlockTable,
    DuplicateSequenceError,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    PagedKVError,
    PositionError,
    UnknownSequenceError,
)

from helpers import assert_same_state, snapshot


def make(num_blocks=8, block_size=4, num_heads=2, head_dim=8, **kw):
    return PagedKVCacheAllocator(num_blocks, block_size, num_heads, head_dim, torch.float32, **kw)


def test_seed_data_structures():
    assert Block(3).ref_count == 0 and Block(3).is_free and Block(3).block_hash is None
    table = BlockTable()
    table.append_block(7)
    table.append_block(2)
    assert table.block_ids == [7, 2] and len(table) == 2 and table.num_tokens == 0


def test_seed_walkthrough():
    alloc = make(num_blocks=10, block_size=16)
    assert alloc.k_cache.shape == (10, 2, 16, 8)
    assert alloc.v_cache.shape == (10, 2, 16, 8)
    assert alloc.k_cache.dtype == torch.float32 and alloc.k_cache.device.type == "cpu"
    assert repr(alloc).startswith("PagedKVCacheAllocator(free_blocks=10/10")
    alloc.allocate_for_sequence(0, 40)  # 3 blocks
    alloc.allocate_for_sequence(1, 16)  # 1 block
    assert alloc.get_block_mapping(0) == [0, 1, 2]
    assert alloc.get_block_mapping(1) == [3]
    assert len(alloc.free_blocks) == 6
    assert [b.ref_count for b in alloc.blocks[:5]] == [1, 1, 1, 1, 0]
    alloc.free_sequence(0)
    assert len(alloc.free_blocks) == 9
    alloc.free_sequence(0)  # unknown id: a no-op, as in the seed
    alloc.check_invariants()


def test_num_layers_share_block_ids():
    alloc = make(num_layers=3)
    assert len(alloc.k_caches) == 3 and len(alloc.v_caches) == 3
    assert alloc.k_cache is alloc.k_caches[0] or torch.equal(alloc.k_cache, alloc.k_caches[0])
    alloc.allocate_for_sequence(5, 3)
    for layer in range(3):
        k = torch.full((3, 2, 8), float(layer))
        alloc.write_kv(5, range(3), k, -k, layer=layer)
    for layer in range(3):
        k, v = alloc.read_kv(5, layer=layer)
        assert torch.all(k == layer) and torch.all(v == -layer)
    with pytest.raises(ValueError, match="layer 3 out of range"):
        alloc.read_kv(5, layer=3)


def test_cache_on_requested_dtype():
    alloc = PagedKVCacheAllocator(4, 2, 1, 4, torch.bfloat16)
    assert alloc.k_cache.dtype == torch.bfloat16


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
def test_off_by_one_of_the_seed_is_fixed(block_size):
    """A prompt that fills its last block needs a new block for its first generated token."""
    alloc = make(num_blocks=8, block_size=block_size)
    alloc.allocate_for_sequence(0, block_size)
    # The seed's rule: allocate when (length + 1) % block_size == 0.
    seed_rule_says_allocate = (block_size + 1) % block_size == 0
    new = alloc.append_tokens(0)
    assert len(new) == 1, "the first generated token needs a fresh block"
    assert seed_rule_says_allocate == (block_size == 1)
    assert alloc.get_num_tokens(0) == block_size + 1
    assert len(alloc.get_block_mapping(0)) == 2
    alloc.check_invariants()


def test_append_tokens_allocates_exactly_when_needed():
    alloc = make(num_blocks=8, block_size=4)
    alloc.allocate_for_sequence(1, 3)
    grew = []
    for _ in range(10):
        grew.append(len(alloc.append_tokens(1)))
        alloc.check_invariants()
    # positions 3..12: new blocks at positions 4, 8 and 12
    assert grew == [0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert alloc.get_num_tokens(1) == 13
    assert alloc.append_tokens(1, 0) == ()
    new = alloc.append_tokens(1, 9)  # 22 tokens: 6 blocks
    assert len(new) == 2 and alloc.get_num_tokens(1) == 22


def test_append_block_to_sequence_reserves_only_when_full():
    alloc = make(num_blocks=4, block_size=4)
    alloc.allocate_for_sequence(0, 4)
    block_id = alloc.append_block_to_sequence(0)
    assert alloc.get_block_mapping(0)[-1] == block_id
    alloc.check_invariants()
    with pytest.raises(ValueError, match="still has room"):
        alloc.append_block_to_sequence(0)
    # the reserved block is used by the next tokens, not a second one
    assert alloc.append_tokens(0, 4) == ()
    assert alloc.get_num_tokens(0) == 8


def test_can_allocate_and_counts():
    alloc = make(num_blocks=4, block_size=4)
    assert alloc.can_allocate(16) and not alloc.can_allocate(17)
    alloc.allocate_for_sequence(0, 5)
    assert alloc.num_free_blocks == 2 and alloc.num_used_blocks == 2
    assert alloc.can_allocate(8) and not alloc.can_allocate(9)
    assert alloc.blocks_needed(0) == 0 and alloc.blocks_needed(9) == 3


def test_zero_token_sequence():
    alloc = make()
    alloc.allocate_for_sequence(0, 0)
    assert alloc.get_block_mapping(0) == []
    k, v = alloc.read_kv(0)
    assert k.shape == (0, 2, 8)
    assert alloc.append_tokens(0) != ()
    alloc.check_invariants()


def test_slot_mapping_and_block_table_tensor():
    alloc = make(num_blocks=8, block_size=4)
    alloc.allocate_for_sequence(0, 4)
    alloc.allocate_for_sequence(1, 9)
    alloc.free_sequence(0)
    alloc.allocate_for_sequence(2, 6)
    mapping = alloc.get_block_mapping(1)
    slots = alloc.slot_mapping(1, [0, 3, 4, 8])
    assert slots.dtype == torch.int64
    assert slots.tolist() == [mapping[0] * 4, mapping[0] * 4 + 3, mapping[1] * 4, mapping[2] * 4]
    assert alloc.slot_mapping(1, torch.tensor([5])).tolist() == [mapping[1] * 4 + 1]
    assert alloc.slot_mapping(1, 2).tolist() == [mapping[0] * 4 + 2]
    table = alloc.block_table_tensor([2, 1])
    assert table.dtype == torch.int32 and table.shape == (2, 3)
    assert table[0].tolist() == alloc.get_block_mapping(2) + [-1]
    assert table[1].tolist() == mapping
    wide = alloc.block_table_tensor([2], max_blocks=5)
    assert wide.shape == (1, 5) and wide[0, 2:].tolist() == [-1, -1, -1]
    assert alloc.block_table_tensor([]).shape == (0, 0)
    with pytest.raises(ValueError, match="max_blocks=1"):
        alloc.block_table_tensor([1], max_blocks=1)


def test_write_and_read_kv_scattered():
    torch.manual_seed(0)
    alloc = make(num_blocks=6, block_size=2)
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(1, 5)
    k0, v0 = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    k1, v1 = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    alloc.write_kv(0, [2, 0, 1], k0[[2, 0, 1]], v0[[2, 0, 1]])
    alloc.write_kv(1, range(5), k1, v1)
    rk0, rv0 = alloc.read_kv(0)
    rk1, rv1 = alloc.read_kv(1)
    assert torch.equal(rk0, k0) and torch.equal(rv0, v0)
    assert torch.equal(rk1, k1) and torch.equal(rv1, v1)
    assert rk1.is_contiguous()
    # the data really lives where the block table says
    b = alloc.get_block_mapping(1)[2]
    assert torch.equal(alloc.k_cache[b, :, 0, :], k1[4])


def test_get_block_mapping_returns_a_copy():
    alloc = make()
    alloc.allocate_for_sequence(0, 9)
    mapping = alloc.get_block_mapping(0)
    mapping.append(99)
    mapping[0] = 42
    assert alloc.get_block_mapping(0) == [0, 1, 2]
    tables = alloc.sequence_block_tables
    tables[0].block_ids.clear()
    tables.clear()
    blocks = alloc.blocks
    blocks[0].ref_count = 7
    alloc.check_invariants()
    assert alloc.get_block_mapping(0) == [0, 1, 2]


def test_stats_and_utilization():
    alloc = make(num_blocks=10, block_size=4)
    alloc.allocate_for_sequence(0, 5)
    alloc.allocate_for_sequence(1, 4)
    s = alloc.stats()
    assert (s.total_blocks, s.free_blocks, s.used_blocks) == (10, 7, 3)
    assert s.tokens_stored == 9 and s.num_sequences == 2
    assert s.utilization == pytest.approx(9 / 12)
    assert s.as_dict()["utilization"] == s.utilization
    empty = make().stats()
    assert empty.utilization == 0.0 and empty.used_blocks == 0


def test_free_returns_tail_first():
    alloc = make(num_blocks=4, block_size=1)
    alloc.allocate_for_sequence(0, 4)
    alloc.free_sequence(0)
    assert alloc.free_blocks == (3, 2, 1, 0)


# ---------------------------------------------------------------- errors change nothing
def _prepared():
    alloc = make(num_blocks=4, block_size=4)
    alloc.allocate_for_sequence(0, 6)
    alloc.write_kv(0, range(6), torch.ones(6, 2, 8), torch.ones(6, 2, 8))
    return alloc


BAD_CALLS = [
    ("duplicate", lambda a: a.allocate_for_sequence(0, 1), DuplicateSequenceError, "already allocated"),
    ("too big", lambda a: a.allocate_for_sequence(1, 9), OutOfBlocksError, "need 3, only 2 free"),
    ("negative", lambda a: a.allocate_for_sequence(1, -1), ValueError, "must be >= 0, got -1"),
    ("float", lambda a: a.allocate_for_sequence(1, 2.0), TypeError, "must be an int"),
    ("bool", lambda a: a.allocate_for_sequence(1, True), TypeError, "must be an int"),
    ("bool id", lambda a: a.allocate_for_sequence(True, 1), TypeError, "seq_id"),
    ("unknown map", lambda a: a.get_block_mapping(9), UnknownSequenceError, "9"),
    ("unknown append", lambda a: a.append_tokens(9), UnknownSequenceError, "9"),
    ("append too much", lambda a: a.append_tokens(0, 11), OutOfBlocksError, "need 3, only 2 free"),
    ("append negative", lambda a: a.append_tokens(0, -2), ValueError, "got -2"),
    ("append bool", lambda a: a.append_tokens(0, True), TypeError, "must be an int"),
    ("append float", lambda a: a.append_tokens(0, 1.5), TypeError, "must be an int"),
    ("reserve with room", lambda a: a.append_block_to_sequence(0), ValueError, "still has room"),
    ("slot past end", lambda a: a.slot_mapping(0, [6]), PositionError, "position 6 is outside"),
    ("slot negative", lambda a: a.slot_mapping(0, torch.tensor([-1])), PositionError, "position -1"),
    ("slot float", lambda a: a.slot_mapping(0, torch.tensor([1.0])), TypeError, "integers"),
    ("write past end", lambda a: a.write_kv(0, [5, 6], torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)), PositionError, "0..5"),
    ("write shape", lambda a: a.write_kv(0, [0], torch.zeros(1, 2, 4), torch.zeros(1, 2, 8)), ValueError, r"expected \(1, 2, 8\)"),
    ("write count", lambda a: a.write_kv(0, [0, 1], torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)), ValueError, "shape"),
    ("write dtype", lambda a: a.write_kv(0, [0], torch.zeros(1, 2, 8, dtype=torch.float16), torch.zeros(1, 2, 8)), TypeError, "float16"),
    ("write repeat", lambda a: a.write_kv(0, [1, 1], torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)), PositionError, "repeat"),
    ("write not tensor", lambda a: a.write_kv(0, [0], [[0.0]], torch.zeros(1, 2, 8)), TypeError, "torch.Tensor"),
    ("layer", lambda a: a.write_kv(0, [0], torch.zeros(1, 2, 8), torch.zeros(1, 2, 8), layer=1), ValueError, "layer 1"),
    ("table unknown", lambda a: a.block_table_tensor([0, 9]), UnknownSequenceError, "9"),
]


@pytest.mark.parametrize("name,call,exc,msg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_failed_calls_change_nothing(name, call, exc, msg):
    alloc = _prepared()
    before = snapshot(alloc)
    with pytest.raises(exc, match=msg) as info:
        call(alloc)
    assert isinstance(info.value, PagedKVError), "every bad input raises a typed PagedKVError"
    assert_same_state(before, snapshot(alloc))
    alloc.check_invariants()


def test_write_on_wrong_device_is_refused():
    alloc = _prepared()
    alloc_meta = torch.zeros(1, 2, 8, device="meta")
    with pytest.raises(ValueError, match="meta"):
        alloc.write_kv(0, [0], alloc_meta, alloc_meta)


def test_constructor_errors():
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        PagedKVCacheAllocator(4, 0, 1, 1, torch.float32)
    with pytest.raises(TypeError, match="num_blocks must be an int"):
        PagedKVCacheAllocator(4.0, 2, 1, 1, torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        PagedKVCacheAllocator(4, 2, 1, 1, "float32")


def test_out_of_blocks_error_fields():
    alloc = make(num_blocks=2, block_size=4)
    with pytest.raises(OutOfBlocksError) as info:
        alloc.allocate_for_sequence(0, 12)
    assert isinstance(info.value, RuntimeError)
    assert (info.value.needed, info.value.free) == (3, 2)


def test_bookkeeping_only_allocator():
    alloc = PagedKVCacheAllocator(1000, 16, 1, 1, allocate_cache=False)
    assert alloc.k_cache is None
    alloc.allocate_for_sequence(0, 100)
    alloc.append_tokens(0, 50)
    with pytest.raises(RuntimeError, match="allocate_cache=False"):
        alloc.read_kv(0)
    alloc.check_invariants()


def test_decode_step_without_new_block_allocates_nothing():
    import tracemalloc

    alloc = PagedKVCacheAllocator(2, 5000, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 1)
    alloc.append_tokens(0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    for _ in range(2000):
        assert alloc.append_tokens(0) == ()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # A few small objects may be live at a time (an int, tracemalloc's own frames);
    # anything allocated per step would add up to tens of kilobytes over 2,000 steps.
    assert peak - base < 1024 and current - base < 1024


@pytest.mark.parametrize("n, bs, want", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (2**70 + 1, 2**10, 2**60 + 1)])
def test_cdiv_and_blocks_needed(n, bs, want):
    from paged_kv_lib import blocks_needed, cdiv

    assert cdiv(n, bs) == blocks_needed(n, bs) == want
    assert make(block_size=4).blocks_needed(n) == cdiv(n, 4)


def test_blocks_needed_refuses_bad_numbers():
    from paged_kv_lib import InvalidArgumentError, InvalidTypeError, blocks_needed

    with pytest.raises(InvalidArgumentError, match="num_tokens must be >= 0, got -1"):
        blocks_needed(-1, 4)
    with pytest.raises(InvalidArgumentError, match="block_size must be >= 1, got 0"):
        blocks_needed(3, 0)
    with pytest.raises(InvalidTypeError, match="bool"):
        blocks_needed(True, 4)


def test_append_tokens_is_the_documented_method_of_every_instance():
    alloc = make()
    assert "append_tokens" not in vars(alloc), "no instance attribute shadows the class's method"
    assert type(alloc).append_tokens.__doc__ and "Grow a sequence" in type(alloc).append_tokens.__doc__
    alloc.allocate_for_sequence(0, 4)
    assert alloc.append_tokens(0) == (1,) and alloc.append_tokens(0, 3) == ()
    assert alloc.append_tokens(0, 1, token_ids=[5]) == (2,) and alloc.get_num_tokens(0) == 9
