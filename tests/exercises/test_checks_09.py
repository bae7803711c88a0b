"""Exercise 09's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

import math

import pytest
import torch

from paged_kv_lib.grading import (
    check_gather_k_at,
    check_merge_softmax_states,
    check_paged_decode_attention,
    check_partial_softmax_state,)

from check_helpers import fails, not_implemented, passes


pytestmark = pytest.mark.usefixtures("one_thread")





@pytest.mark.parametrize(
    "check", [check_gather_k_at, check_paged_decode_attention, check_partial_softmax_state, check_merge_softmax_states]
)
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 09.1
def gather_k_at(k_cache, block_table_row, positions, *, variant=None):
    block_size = k_cache.shape[2]
    rows = []
    for p in positions:
        if variant == "swapped":
            block, offset = int(block_table_row[p % block_size]), p // block_size
        elif variant == "consecutive-blocks":
            block, offset = int(block_table_row[0]) + p // block_size, p % block_size
        elif variant == "offset-zero":
            block, offset = int(block_table_row[p // block_size]), 0
        else:
            block, offset = int(block_table_row[p // block_size]), p % block_size
        rows.append(k_cache[block, :, offset])
    out = torch.stack(rows, dim=1) if rows else k_cache.new_zeros(k_cache.shape[1], 0, k_cache.shape[3])
    if variant == "tokens-first":
        out = out.transpose(0, 1)
    if variant == "float64":
        out = out.double()
    return out


def test_gather_k_at_correct(capsys):
    passes(check_gather_k_at, gather_k_at, "09.1", capsys)


def test_gather_k_at_vectorised_correct(capsys):
    def vectorised(k_cache, block_table_row, positions):
        pos = torch.tensor(positions, dtype=torch.long)
        blocks = block_table_row.long()[pos // k_cache.shape[2]]
        return k_cache[blocks, :, pos % k_cache.shape[2]].transpose(0, 1)

    passes(check_gather_k_at, vectorised, "09.1", capsys)


@pytest.mark.parametrize("variant", ["swapped", "consecutive-blocks", "offset-zero", "tokens-first", "float64"])
def test_gather_k_at_wrong(variant):
    fails(check_gather_k_at, lambda c, r, p: gather_k_at(c, r, p, variant=variant))


def test_gather_k_at_hints_name_the_translation():
    assert "block_table_row[p // block_size]" in fails(
        check_gather_k_at, lambda c, r, p: gather_k_at(c, r, p, variant="offset-zero"))
    assert "[kv_heads, len(positions), head_dim]" in fails(
        check_gather_k_at, lambda c, r, p: gather_k_at(c, r, p, variant="tokens-first"))


# --------------------------------------------------------------------------- 09.2
def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, *, variant=None):
    num_seqs, q_heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if scale is None or variant == "ignores-scale":
        scale = 1.0 / math.sqrt(head_dim)
    if variant == "no-scale":
        scale = 1.0
    out = torch.zeros_like(q)
    if variant == "masked-padding":  # every table column, positions past seq_len masked with -inf
        ids = block_tables.long().clamp(min=0)
        k = k_cache[ids].permute(0, 2, 1, 3, 4).reshape(num_seqs, kv_heads, -1, head_dim)
        v = v_cache[ids].permute(0, 2, 1, 3, 4).reshape(num_seqs, kv_heads, -1, head_dim)
        visible = torch.arange(k.shape[2])[None, :] < seq_lens.long()[:, None]
        for i in range(num_seqs):
            ki, vi = torch.nan_to_num(k[i]), torch.nan_to_num(v[i])
            for h in range(q_heads):
                scores = ((ki[h // group] @ q[i, h]) * scale).masked_fill(~visible[i], float("-inf"))
                out[i, h] = torch.softmax(scores, dim=0) @ vi[h // group]
        return out
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        blocks = (n + block_size - 1) // block_size
        ids = block_tables[i, :blocks].long()
        k = k_cache[ids].permute(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
        v = v_cache[ids].permute(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
        if variant != "whole-last-block":
            k, v = k[:, :n], v[:, :n]
        for h in range(q_heads):
            kv = h % kv_heads if variant == "gqa-modulo" else h // group
            out[i, h] = torch.softmax((k[kv] @ q[i, h]) * scale, dim=0) @ v[kv]
    return out


def test_paged_decode_attention_correct(capsys):
    passes(check_paged_decode_attention, paged_decode_attention, "09.2", capsys)


WRONG_DECODE = {
    "no-scale": "multiply the scores by the scale",
    "ignores-scale": "use the scale argument",
    "gqa-modulo": "h // (num_q_heads // num_kv_heads)",
    "whole-last-block": "NaN or inf",
    "masked-padding": "length 0",
}


@pytest.mark.parametrize("variant", sorted(WRONG_DECODE))
def test_paged_decode_attention_wrong(variant):
    message = fails(check_paged_decode_attention,
                    lambda *args, **kw: paged_decode_attention(*args, **kw, variant=variant))
    assert WRONG_DECODE[variant] in message


# --------------------------------------------------------------------------- 09.3
def partial_softmax_state(q, k, v, scale, *, variant=None):
    if k.shape[0] == 0:
        m0 = 0.0 if variant == "empty-m-zero" else float("-inf")
        return torch.tensor(m0), torch.tensor(0.0), torch.zeros(v.shape[-1])
    s = (k @ q) * (1.0 if variant == "no-scale" else scale)
    m = s.max()
    p = torch.exp(s) if variant == "no-max" else torch.exp(s - m)
    acc = p @ v
    if variant == "normalised":
        acc = acc / p.sum()
    return m, p.sum(), acc


def test_partial_softmax_state_correct(capsys):
    passes(check_partial_softmax_state, partial_softmax_state, "09.3", capsys)


@pytest.mark.parametrize("variant", ["empty-m-zero", "no-scale", "no-max", "normalised"])
def test_partial_softmax_state_wrong(variant):
    fails(check_partial_softmax_state, lambda q, k, v, s: partial_softmax_state(q, k, v, s, variant=variant))


# --------------------------------------------------------------------------- 09.4
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
    return m, w_a * l_a + w_b * l_b, w_a[..., None] * acc_a + w_b[..., None] * acc_b


def test_merge_softmax_states_correct(capsys):
    passes(check_merge_softmax_states, merge_softmax_states, "09.4", capsys)


WRONG_MERGE = {
    "no-rescale": "rescale both",
    "exp-of-max": "overflow",
    "naive-empty": "NaN",
    "rescale-acc-only": "rescale both",
    "min": "larger of the two maxima",
}


@pytest.mark.parametrize("variant", sorted(WRONG_MERGE))
def test_merge_softmax_states_wrong(variant):
    message = fails(check_merge_softmax_states, lambda a, b: merge_softmax_states(a, b, variant=variant))
    assert WRONG_MERGE[variant] in message
