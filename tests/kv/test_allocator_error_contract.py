"""The error contract of errors.py: every bad input raises a typed PagedKVError and changes nothing.

Bools are refused wherever an id belongs (``True == 1`` would otherwise act on sequence 1),
and the state snapshot the tests compare is checked to see the state it claims to see.
"""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib import (
    CacheNotAllocatedError,
    InvalidArgumentError,
    InvalidTypeError,
    PagedKVCacheAllocator,
    PagedKVError,
    SequenceStateError,
)

from helpers import assert_same_state, snapshot

H, D = 2, 4


def prepared() -> PagedKVCacheAllocator:
    """Sequence 1 resident and shared with 3 (a fork), sequence 2 swapped out, prompts cached."""
    alloc = PagedKVCacheAllocator(8, 4, H, D, torch.float32, num_cpu_blocks=4)
    alloc.allocate_for_sequence(1, 6, token_ids=list(range(6)))
    alloc.write_kv(1, range(6), torch.ones(6, H, D), -torch.ones(6, H, D))
    alloc.allocate_for_sequence(2, 5, token_ids=[7] * 5)
    alloc.swap_out(2)
    alloc.fork(1, 3)
    return alloc


def kv(n=1):
    return torch.zeros(n, H, D), torch.zeros(n, H, D)


BOOL_IDS = [
    ("append_tokens", lambda a: a.append_tokens(True)),
    ("append_tokens slow path", lambda a: a.append_tokens(True, 1, token_ids=[1])),
    ("free_sequence", lambda a: a.free_sequence(True)),
    ("get_block_mapping", lambda a: a.get_block_mapping(True)),
    ("get_num_tokens", lambda a: a.get_num_tokens(True)),
    ("is_swapped", lambda a: a.is_swapped(True)),
    ("append_block_to_sequence", lambda a: a.append_block_to_sequence(True)),
    ("fork parent", lambda a: a.fork(True, 9)),
    ("fork child", lambda a: a.fork(1, False)),
    ("slot_mapping", lambda a: a.slot_mapping(True, [0])),
    ("block_table_tensor", lambda a: a.block_table_tensor([True])),
    ("write_kv", lambda a: a.write_kv(True, [0], *kv())),
    ("read_kv", lambda a: a.read_kv(True)),
    ("swap_out", lambda a: a.swap_out(True)),
    ("swap_in", lambda a: a.swap_in(True)),
    ("blocks_to_append", lambda a: a.blocks_to_append(True)),
    ("can_append", lambda a: a.can_append([True])),
    ("swap_out of several", lambda a: a.swap_out(1, True)),
    ("swap_in of several", lambda a: a.swap_in(2, True)),
    ("allocate_prompt", lambda a: a.allocate_prompt(True, [1])),
    ("allocate", lambda a: a.allocate_for_sequence(True, 1)),
    ("token id", lambda a: a.append_tokens(1, 2, token_ids=[3, True])),
]


@pytest.mark.parametrize("name, call", BOOL_IDS, ids=[c[0] for c in BOOL_IDS])
def test_bools_are_never_ids(name, call):
    alloc = prepared()
    before = snapshot(alloc)
    with pytest.raises(InvalidTypeError, match="bool"):
        call(alloc)
    assert_same_state(before, snapshot(alloc))
    alloc.check_invariants()


def test_membership_of_a_bool_is_false():
    alloc = prepared()
    assert 1 in alloc and 2 in alloc
    assert True not in alloc


BAD_VALUES = [
    ("dtype", lambda a: PagedKVCacheAllocator(4, 4, 1, 1, "float32"), InvalidTypeError, "dtype"),
    ("num_blocks", lambda a: PagedKVCacheAllocator(0, 4, 1, 1), InvalidArgumentError, "num_blocks must be >= 1"),
    ("reserve with room", lambda a: a.append_block_to_sequence(1), SequenceStateError, "still has room"),
    ("max_blocks", lambda a: a.block_table_tensor([1], max_blocks=1), InvalidArgumentError, "max_blocks=1"),
    ("not a tensor", lambda a: a.write_kv(1, [0], [[0.0]], kv()[1]), InvalidTypeError, "torch.Tensor"),
    ("shape", lambda a: a.write_kv(1, [0], torch.zeros(1, H, 3), kv()[1]), InvalidArgumentError, "shape"),
    ("dtype of k", lambda a: a.write_kv(1, [0], kv()[0].half(), kv()[1]), InvalidTypeError, "float16"),
    ("device", lambda a: a.write_kv(1, [0], *(t.to("meta") for t in kv())), InvalidArgumentError, "meta"),
    ("layer", lambda a: a.read_kv(1, layer=3), InvalidArgumentError, "layer 3 out of range"),
    ("layer type", lambda a: a.read_kv(1, layer=0.0), InvalidTypeError, "layer"),
    ("float positions", lambda a: a.slot_mapping(1, torch.tensor([0.0])), InvalidTypeError, "integers"),
    ("token count", lambda a: a.allocate_for_sequence(5, 3, token_ids=[1, 2]), InvalidArgumentError, "2 token_ids"),
    ("token type", lambda a: a.allocate_for_sequence(5, 1, token_ids=["a"]), InvalidTypeError, "token_ids"),
    ("token iterable", lambda a: a.allocate_for_sequence(5, 1, token_ids=5), InvalidTypeError, "token_ids"),
    ("token overflow", lambda a: a.allocate_for_sequence(5, 1, token_ids=[2**70]), InvalidArgumentError, "64 bits"),
    ("salt", lambda a: a.allocate_for_sequence(5, 1, extra_key=3), InvalidTypeError, "extra_key"),
    ("watermark", lambda a: a.can_allocate(1, watermark=-1), InvalidArgumentError, "watermark"),
    ("swapped resident", lambda a: a.swap_in(1), SequenceStateError, "not swapped out"),
    ("swap in twice", lambda a: a.swap_in(2, 2), InvalidArgumentError, "twice"),
    ("swap out twice", lambda a: a.swap_out(1, 1), InvalidArgumentError, "twice"),
    ("next chunk of another prompt", lambda a: a.allocate_prompt(1, [9] * 8), InvalidArgumentError, "do not begin"),
    ("chunk shorter than held", lambda a: a.allocate_prompt(1, [0, 1]), InvalidArgumentError, "do not begin"),
    ("swapped append", lambda a: a.append_tokens(2), SequenceStateError, "swapped out"),
    ("free type", lambda a: a.free_sequence("1"), InvalidTypeError, "seq_id"),
]


@pytest.mark.parametrize("name, call, exc, msg", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_values_raise_typed_errors_and_change_nothing(name, call, exc, msg):
    alloc = prepared()
    before = snapshot(alloc)
    with pytest.raises(exc, match=msg) as info:
        call(alloc)
    assert isinstance(info.value, PagedKVError)
    assert isinstance(info.value, (ValueError, TypeError, RuntimeError)), "and the built-in class callers expect"
    assert_same_state(before, snapshot(alloc))


def test_bookkeeping_only_allocator_refuses_kv_with_a_typed_error():
    alloc = PagedKVCacheAllocator(4, 4, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 3)
    for call in (lambda: alloc.read_kv(0), lambda: alloc.write_kv(0, [0], torch.zeros(1, 1, 1), torch.zeros(1, 1, 1))):
        with pytest.raises(CacheNotAllocatedError, match="allocate_cache=False") as info:
            call()
        assert isinstance(info.value, RuntimeError)


# ------------------------------------------------------------------ the snapshot sees everything
# Each change touches one kind of state, through public names only: the live table ``table()``
# hands out (read-only by contract, written here on purpose) or one public call.
SILENT_CHANGES = [
    ("resident token ids", lambda a: a.table(1).token_ids.__setitem__(0, 99)),
    ("resident keys", lambda a: a.table(1).block_keys.clear()),
    ("resident token count", lambda a: setattr(a.table(3), "num_tokens", 5)),
    ("swapped sequence back", lambda a: a.swap_in(2)),
    ("prefix counters", lambda a: a.allocate_for_sequence(9, 0, token_ids=[])),
    ("free queue order", lambda a: a.append_tokens(1, 3)),
    ("cpu tensor", lambda a: a.cache.cpu_kv.add_(1)),
    ("device tensor, layer 0", lambda a: a.k_cache.add_(1)),
]


@pytest.mark.parametrize("name, change", SILENT_CHANGES, ids=[c[0] for c in SILENT_CHANGES])
def test_snapshot_notices_every_kind_of_state(name, change):
    alloc = prepared()
    before = snapshot(alloc)
    change(alloc)
    with pytest.raises(AssertionError):
        assert_same_state(before, snapshot(alloc))


def test_a_failed_block_copy_leaves_the_bookkeeping_as_it_was():
    """Copy-on-write takes a block, then asks the store to copy; if that copy raises, the block goes back."""
    alloc = PagedKVCacheAllocator(6, 4, H, D, torch.float32)
    alloc.allocate_for_sequence(1, 6)
    alloc.fork(1, 2)
    before = snapshot(alloc)

    def broken_copy(src, dst):
        raise RuntimeError("device copy failed")

    alloc.on_copy = broken_copy
    with pytest.raises(RuntimeError, match="device copy failed"):
        alloc.append_tokens(2)
    with pytest.raises(RuntimeError, match="device copy failed"):
        alloc.write_kv(1, [0], *kv())
    assert_same_state(before, snapshot(alloc))
    alloc.check_invariants()
    alloc.on_copy = alloc.cache.copy_block
    assert alloc.append_tokens(2) == (2,)
    alloc.check_invariants()
