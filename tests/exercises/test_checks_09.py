"""Exercise 09's checks bite: correct solutions pass with the one success line, planted wrong ones fail.

Tasks 09.1 and 09.2 are Triton: the planted solutions are ``@triton.jit`` functions run through
the exercise's kernel skeleton under the interpreter, exactly as the learner's notebook runs them.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from check_helpers import fails, not_implemented, passes

from paged_kv_lib.grading import (
    check_fold_tile,
    check_merge_softmax_states,
    check_split_k_decode,
    check_tile_addresses,
)
from paged_kv_lib.grading.triton_decode import run_decode_skeleton

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "check", [check_tile_addresses, check_fold_tile, check_merge_softmax_states, check_split_k_decode]
)
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 09.1 (Triton)
@triton.jit
def addresses_right(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                    stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = pos // BLOCK_SIZE
    readable = (pos < seq_len) & (logical < table_width)
    block = tl.load(table_row_ptr + logical, mask=readable, other=-1).to(tl.int64)
    rows = block * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, readable & (block >= 0) & (block < num_blocks)


@triton.jit
def addresses_one_block_too_far(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                                stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = pos // BLOCK_SIZE + 1
    readable = pos < seq_len
    block = tl.load(table_row_ptr + logical, mask=readable, other=-1).to(tl.int64)
    rows = block * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, readable & (block >= 0) & (block < num_blocks)


@triton.jit
def addresses_gqa_modulo(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                         stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = pos // BLOCK_SIZE
    readable = pos < seq_len
    block = tl.load(table_row_ptr + logical, mask=readable, other=-1).to(tl.int64)
    rows = block * stride_kb + (head % GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, readable & (block >= 0)


@triton.jit
def addresses_unmasked_tail(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                            stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = pos // BLOCK_SIZE
    block = tl.load(table_row_ptr + logical).to(tl.int64)  # the skeleton's table has spare -1 columns
    rows = block * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, block >= 0


@triton.jit
def addresses_boundary(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                       stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = (pos + 1) // BLOCK_SIZE
    readable = pos < seq_len
    block = tl.load(table_row_ptr + logical, mask=readable, other=-1).to(tl.int64)
    rows = block * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, readable & (block >= 0)


def launcher(addresses=None, fold=None):
    def launch(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
        return run_decode_skeleton(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                   addresses=addresses, fold=fold)
    return launch


def test_tile_addresses_correct(capsys):
    passes(check_tile_addresses, launcher(addresses=addresses_right), "09.1", capsys)


WRONG_ADDRESSES = {
    "one-block-too-far": (addresses_one_block_too_far, "one block too far"),
    "gqa-modulo": (addresses_gqa_modulo, "wrong grouped-query head"),
    "unmasked-tail": (addresses_unmasked_tail, "past seq_len"),
    "boundary": (addresses_boundary, "block boundary"),
}


@pytest.mark.parametrize("name", sorted(WRONG_ADDRESSES))
def test_tile_addresses_wrong(name):
    fn, words = WRONG_ADDRESSES[name]
    message = fails(check_tile_addresses, launcher(addresses=fn))
    assert words in message
    assert "first wrong: sequence" in message and "query head" in message


def test_tile_addresses_points_at_the_token():
    message = fails(check_tile_addresses, launcher(addresses=addresses_one_block_too_far))
    assert "token 0 is the first read wrong" in message


def test_an_untouched_triton_task_is_not_written():
    @triton.jit
    def untouched(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                  stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        raise NotImplementedError("Task 09.1: replace this line with your code")

    with pytest.raises(NotImplementedError, match="09.1"):
        check_tile_addresses(launcher(addresses=untouched))


# --------------------------------------------------------------------------- 09.2 (Triton)
@triton.jit
def fold_right(m_i, l_i, acc, scores, v):
    m_new = tl.maximum(m_i, tl.max(scores, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new)
    return m_new, alpha * l_i + tl.sum(p, 0), alpha * acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def fold_without_rescale(m_i, l_i, acc, scores, v):
    m_new = tl.maximum(m_i, tl.max(scores, 0))
    p = tl.exp(scores - m_new)
    return m_new, l_i + tl.sum(p, 0), acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def fold_rescale_l_only(m_i, l_i, acc, scores, v):
    m_new = tl.maximum(m_i, tl.max(scores, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new)
    return m_new, alpha * l_i + tl.sum(p, 0), acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def fold_without_max(m_i, l_i, acc, scores, v):
    p = tl.exp(scores)
    return tl.maximum(m_i, tl.max(scores, 0)), l_i + tl.sum(p, 0), acc + tl.sum(p[:, None] * v, 0)


def test_fold_tile_correct(capsys):
    passes(check_fold_tile, launcher(fold=fold_right), "09.2", capsys)


WRONG_FOLDS = {
    "no-rescale": (fold_without_rescale, "without rescaling"),
    "rescale-l-only": (fold_rescale_l_only, "only l is rescaled"),
    "no-max": (fold_without_max, "overflow"),
}


@pytest.mark.parametrize("name", sorted(WRONG_FOLDS))
def test_fold_tile_wrong(name):
    fn, words = WRONG_FOLDS[name]
    message = fails(check_fold_tile, launcher(fold=fn))
    assert words in message
    assert "query head" in message


# --------------------------------------------------------------------------- 09.3
def merge_softmax_states(a, b, *, variant=None):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    if variant == "no-rescale":
        return m, l_a + l_b, acc_a + acc_b
    if variant == "exp-of-max":  # weights exp(m_j) taken on their own: overflow
        w_a, w_b = torch.exp(m_a), torch.exp(m_b)
        l = w_a * l_a + w_b * l_b
        return m, l / torch.exp(m), (w_a[..., None] * acc_a + w_b[..., None] * acc_b) / torch.exp(m)[..., None]
    if variant == "naive-empty":
        w_a, w_b = torch.exp(m_a - m), torch.exp(m_b - m)
    else:
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w_a, w_b = torch.exp(m_a - safe), torch.exp(m_b - safe)
    if variant == "rescale-acc-only":
        return m, l_a + l_b, w_a[..., None] * acc_a + w_b[..., None] * acc_b
    if variant == "min":
        m = torch.minimum(m_a, m_b)
    if variant == "in-place":  # right answer, but written into a's tensors
        l_a.mul_(w_a).add_(w_b * l_b)
        acc_a.mul_(w_a[..., None]).add_(w_b[..., None] * acc_b)
        m_a.copy_(m)
        return m_a, l_a, acc_a
    return m, w_a * l_a + w_b * l_b, w_a[..., None] * acc_a + w_b[..., None] * acc_b


def test_merge_softmax_states_correct(capsys):
    passes(check_merge_softmax_states, merge_softmax_states, "09.3", capsys)


WRONG_MERGE = {
    "no-rescale": "without rescaling",
    "exp-of-max": "overflow",
    "naive-empty": "NaN",
    "rescale-acc-only": "without rescaling",
    "min": "merged m",
    "in-place": "inputs were modified",
}


@pytest.mark.parametrize("variant", sorted(WRONG_MERGE))
def test_merge_softmax_states_wrong(variant):
    message = fails(check_merge_softmax_states, lambda a, b: merge_softmax_states(a, b, variant=variant))
    assert WRONG_MERGE[variant] in message


# --------------------------------------------------------------------------- 09.4
def split_k_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale=None, *, variant=None):
    _num_seqs, q_heads, d = q.shape
    kv_heads, bs = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if scale is None or variant == "ignores-scale":
        scale = 1.0 / math.sqrt(d)
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        pos = torch.arange(n)
        blocks = block_tables[i].long()[pos // bs]
        k = k_cache[blocks, :, pos % bs].float()  # [n, kv_heads, d]
        v = v_cache[blocks, :, pos % bs].float()
        if variant == "whole-last-block":
            last = torch.arange(-(-n // bs) * bs)
            k = k_cache[block_tables[i].long()[last // bs], :, last % bs].float()
            v = v_cache[block_tables[i].long()[last // bs], :, last % bs].float()
        chunk = -(-k.shape[0] // num_splits)
        for h in range(q_heads):
            kv = h % kv_heads if variant == "gqa-modulo" else h // group
            state = (torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(d))
            for j in range(num_splits):
                kk, vv = k[j * chunk:(j + 1) * chunk, kv], v[j * chunk:(j + 1) * chunk, kv]
                if kk.shape[0] == 0:
                    continue
                s = (kk @ q[i, h].float()) * scale
                part = (s.max(), torch.exp(s - s.max()).sum(), torch.exp(s - s.max()) @ vv)
                if variant == "no-rescale":
                    state = (torch.maximum(state[0], part[0]), state[1] + part[1], state[2] + part[2])
                else:
                    state = merge_softmax_states(state, part)
            out[i, h] = state[2] / state[1]
    if variant == "in-place":
        q.zero_()
    return out if variant == "float32-out" else out.to(q.dtype)


def test_split_k_decode_correct(capsys):
    passes(check_split_k_decode, split_k_decode, "09.4", capsys)


WRONG_SPLIT = {
    "float32-out": "dtype",
    "gqa-modulo": "wrong grouped-query head",
    "whole-last-block": "NaN",
    "ignores-scale": "scale argument",
    "no-rescale": "each chunk's state",
    "in-place": "inputs were modified",
}


@pytest.mark.parametrize("variant", sorted(WRONG_SPLIT))
def test_split_k_decode_wrong(variant):
    message = fails(check_split_k_decode, lambda *a, **k: split_k_decode(*a, **k, variant=variant))
    assert WRONG_SPLIT[variant] in message
