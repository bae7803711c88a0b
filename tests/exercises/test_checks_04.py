"""Exercise 04's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib.grading import check_block_table_tensor, check_gather_tokens, check_slot_mapping, check_write_kv

from check_helpers import fails, not_implemented, passes




@pytest.mark.parametrize("check", [check_slot_mapping, check_block_table_tensor, check_write_kv, check_gather_tokens])
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 04.1
def slot_mapping(block_ids, num_tokens, positions, block_size):
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= num_tokens):
        raise ValueError("a position holds no token")
    ids = torch.tensor(block_ids, dtype=torch.int64)
    return ids[positions // block_size] * block_size + positions % block_size


def test_slot_mapping_correct(capsys):
    passes(check_slot_mapping, slot_mapping, "04.1", capsys)


def unchecked(block_ids, num_tokens, positions, block_size):
    ids = torch.tensor(block_ids, dtype=torch.int64)
    return ids[positions // block_size] * block_size + positions % block_size


def against_capacity(block_ids, num_tokens, positions, block_size):
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= len(block_ids) * block_size):
        raise ValueError("outside the blocks")
    return unchecked(block_ids, num_tokens, positions, block_size)


def forgets_block_size(block_ids, num_tokens, positions, block_size):
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= num_tokens):
        raise ValueError("a position holds no token")
    ids = torch.tensor(block_ids, dtype=torch.int64)
    return ids[positions // block_size] + positions % block_size


def no_table_lookup(block_ids, num_tokens, positions, block_size):
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= num_tokens):
        raise ValueError("a position holds no token")
    return positions.clone()


def int32_result(block_ids, num_tokens, positions, block_size):
    return slot_mapping(block_ids, num_tokens, positions, block_size).to(torch.int32)


def float_table(block_ids, num_tokens, positions, block_size):
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= num_tokens):
        raise ValueError("a position holds no token")
    ids = torch.tensor(block_ids)  # float when block_ids is empty
    return ids[positions // block_size] * block_size + positions % block_size


def sorts_positions(block_ids, num_tokens, positions, block_size):
    return slot_mapping(block_ids, num_tokens, positions.sort().values, block_size)


@pytest.mark.parametrize("wrong", [unchecked, against_capacity, forgets_block_size, no_table_lookup, int32_result,
                                   float_table, sorts_positions])
def test_slot_mapping_wrong(wrong):
    fails(check_slot_mapping, wrong)


# --------------------------------------------------------------------------- 04.2
def block_table_tensor(tables, max_blocks=None):
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else max_blocks
    if width < longest:
        raise ValueError(f"max_blocks={width} is less than the longest table ({longest})")
    rows = [list(t) + [-1] * (width - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(tables), width)


def test_block_table_tensor_correct(capsys):
    passes(check_block_table_tensor, block_table_tensor, "04.2", capsys)


def pads_with_zero(tables, max_blocks=None):
    out = block_table_tensor(tables, max_blocks)
    lengths = [len(t) for t in tables]
    for row, n in enumerate(lengths):
        out[row, n:] = 0
    return out


def int64_result(tables, max_blocks=None):
    return block_table_tensor(tables, max_blocks).long()


def pads_in_place(tables, max_blocks=None):
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else max_blocks
    if width < longest:
        raise ValueError("too narrow")
    for t in tables:
        t.extend([-1] * (width - len(t)))
    return torch.tensor(tables, dtype=torch.int32).reshape(len(tables), width)


def ignores_max_blocks(tables, max_blocks=None):
    return block_table_tensor(tables)


def no_empty_batch(tables, max_blocks=None):
    longest = max(len(t) for t in tables)
    width = longest if max_blocks is None else max_blocks
    if width < longest:
        raise ValueError("too narrow")
    return torch.tensor([list(t) + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)


def truncates(tables, max_blocks=None):
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else max_blocks
    rows = [(list(t) + [-1] * width)[:width] for t in tables]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(tables), width)


@pytest.mark.parametrize("wrong", [pads_with_zero, int64_result, pads_in_place, ignores_max_blocks, no_empty_batch,
                                   truncates])
def test_block_table_tensor_wrong(wrong):
    fails(check_block_table_tensor, wrong)


# --------------------------------------------------------------------------- 04.3
def write_kv(k_cache, v_cache, slots, k, v):
    block_size = k_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, :, offsets, :] = k
    v_cache[blocks, :, offsets, :] = v


def test_write_kv_correct(capsys):
    passes(check_write_kv, write_kv, "04.3", capsys)


def flat_rows(k_cache, v_cache, slots, k, v):
    num_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    k_cache.view(-1, num_heads, head_dim)[slots] = k
    v_cache.view(-1, num_heads, head_dim)[slots] = v


def k_into_both(k_cache, v_cache, slots, k, v):
    write_kv(k_cache, v_cache, slots, k, k)


def rebinds(k_cache, v_cache, slots, k, v):
    k_cache = k_cache.clone()
    v_cache = v_cache.clone()
    write_kv(k_cache, v_cache, slots, k, v)


def head_zero_only(k_cache, v_cache, slots, k, v):
    block_size = k_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, 0, offsets, :] = k[:, 0]
    v_cache[blocks, 0, offsets, :] = v[:, 0]


def offset_as_block(k_cache, v_cache, slots, k, v):
    num_blocks = k_cache.shape[0]
    blocks, offsets = slots % num_blocks, slots // num_blocks
    k_cache[blocks, :, offsets, :] = k
    v_cache[blocks, :, offsets, :] = v


@pytest.mark.parametrize("wrong", [flat_rows, k_into_both, rebinds, head_zero_only, offset_as_block])
def test_write_kv_wrong(wrong):
    fails(check_write_kv, wrong)


# --------------------------------------------------------------------------- 04.4
def gather_tokens(cache, block_ids, num_tokens):
    blocks = cache[block_ids]
    tokens = blocks.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])
    return tokens[:num_tokens]


def test_gather_tokens_correct(capsys):
    passes(check_gather_tokens, gather_tokens, "04.4", capsys)


def no_permute(cache, block_ids, num_tokens):
    return cache[block_ids].reshape(-1, cache.shape[1], cache.shape[3])[:num_tokens]


def keeps_the_tail(cache, block_ids, num_tokens):
    blocks = cache[block_ids]
    return blocks.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])


def sorted_blocks(cache, block_ids, num_tokens):
    return gather_tokens(cache, block_ids.sort().values, num_tokens)


def heads_first(cache, block_ids, num_tokens):
    blocks = cache[block_ids]
    return blocks.permute(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])[:, :num_tokens]


def zeroes_the_cache(cache, block_ids, num_tokens):
    out = gather_tokens(cache, block_ids, num_tokens).clone()
    cache[block_ids] = 0
    return out


@pytest.mark.parametrize("wrong", [no_permute, keeps_the_tail, sorted_blocks, heads_first, zeroes_the_cache])
def test_gather_tokens_wrong(wrong):
    fails(check_gather_tokens, wrong)
