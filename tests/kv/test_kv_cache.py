"""KVCache, directly: the cache tensors' layout and every move of their bytes, with no bookkeeping."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib import CacheNotAllocatedError, InvalidArgumentError, InvalidTypeError, PositionError
from paged_kv_lib.kv_cache import KVCache

H, D, BS = 2, 3, 4


def store(**kw) -> KVCache:
    return KVCache(6, BS, H, D, torch.float32, num_layers=2, **kw)


def test_layout_views_share_one_tensor():
    s = store(num_cpu_blocks=2)
    assert s.kv.shape == (2, 2, 6, H, BS, D) and s.cpu_kv.shape == (2, 2, 2, H, BS, D)
    assert len(s.k_caches) == len(s.v_caches) == 2 and s.k_caches[1].shape == (6, H, BS, D)
    s.k_caches[1][3, 0, 2, 1] = 5.0
    assert s.kv[0, 1, 3, 0, 2, 1] == 5.0, "the seed-layout caches are views of the stacked tensor"


def test_write_then_gather_through_scattered_blocks():
    s = store()
    blocks = [4, 1]  # logical block 0 lives in block 4, logical block 1 in block 1
    k = torch.arange(6 * H * D, dtype=torch.float32).reshape(6, H, D)
    pos = s.positions(0, 6, range(6))
    s.write(blocks, pos, k, -k, layer=1)
    got_k, got_v = s.gather(blocks, 6, 1)
    assert torch.equal(got_k, k) and torch.equal(got_v, -k)
    assert torch.equal(s.k_caches[1][1, :, 1], k[5]), "token 5 sits in block 1, slot 1"
    assert s.slots(blocks, pos).tolist() == [16, 17, 18, 19, 4, 5]
    assert not s.k_caches[0].any(), "another layer is untouched"


def test_copy_block_moves_every_layer():
    s = store()
    s.kv[:, :, 2] = 7.0
    s.copy_block(2, 5)
    assert torch.equal(s.kv[:, :, 5], s.kv[:, :, 2]) and not s.kv[:, :, 0].any()


def test_swap_round_trip_is_bit_exact():
    s = store(num_cpu_blocks=3)
    s.kv[:, :, 1] = torch.randn(2, 2, H, BS, D)
    saved = s.kv[:, :, 1].clone()
    s.swap_out([1], [2])
    s.kv[:, :, 1] = 0
    s.swap_in([2], [4])
    assert torch.equal(s.kv[:, :, 4], saved)


@pytest.mark.parametrize("positions, exc, msg", [
    ([0, 6], PositionError, "position 6 is outside sequence 0, which holds 6 tokens"),
    ([-1], PositionError, "position -1"),
    (torch.tensor([0.5]), InvalidTypeError, "integers"),
    ([True], InvalidTypeError, "must be an int"),
])
def test_positions_are_checked(positions, exc, msg):
    with pytest.raises(exc, match=msg):
        store().positions(0, 6, positions)


@pytest.mark.parametrize("k, exc, msg", [
    (torch.zeros(2, H, D + 1), InvalidArgumentError, r"shape \(2, 2, 4\), expected \(2, 2, 3\)"),
    (torch.zeros(2, H, D, dtype=torch.float64), InvalidTypeError, "dtype torch.float64"),
    ([[0.0]], InvalidTypeError, "must be a torch.Tensor"),
])
def test_kv_is_checked(k, exc, msg):
    with pytest.raises(exc, match=msg):
        store().check_kv(k, torch.zeros(2, H, D), 2)


def test_layer_and_constructor_checks():
    s = store()
    assert s.layer(1) == 1
    with pytest.raises(InvalidArgumentError, match="layer 2 out of range: the cache has 2 layers"):
        s.layer(2)
    with pytest.raises(InvalidTypeError, match="dtype must be a torch.dtype"):
        KVCache(2, 2, 1, 1, "float32")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="num_heads must be >= 1"):
        KVCache(2, 2, 0, 1)


def test_without_tensors_only_addresses_work():
    s = store(allocate_cache=False)
    assert s.kv is None and s.k_caches == () and s.slots([3], s.positions(0, 2, [1])).tolist() == [13]
    with pytest.raises(CacheNotAllocatedError, match="allocate_cache=False"):
        s.layer(0)
    s.copy_block(0, 1)  # no tensors: nothing to move
    s.swap_out([0], [0])
