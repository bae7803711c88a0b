"""Paged attention in plain torch: gather a sequence's K/V through its block table, then attend.

This is the version a lesson reads line by line. It is slow on purpose (one Python loop
iteration per sequence) and exact: every score and the softmax are computed in float32.
It is the oracle: the batched torch path the ``"torch"`` backend runs (``batched.py``)
and the Triton kernels in ``triton_kernel.py`` must give the same answers.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..block import cdiv


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """Copy one sequence's first ``seq_len`` tokens out of a paged cache.

    ``cache`` is ``[num_blocks, num_kv_heads, block_size, head_dim]`` and
    ``block_table_row`` lists the sequence's physical block ids in logical order.
    Returns a contiguous ``[num_kv_heads, seq_len, head_dim]`` tensor.
    """
    block_size = cache.shape[2]
    num_used_blocks = cdiv(seq_len, block_size)
    block_ids = block_table_row[:num_used_blocks].long()
    blocks = cache[block_ids]  # [used_blocks, kv_heads, block_size, head_dim]
    # Put the blocks side by side along the token axis, then drop the unused tail slots.
    tokens = blocks.permute(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])
    return tokens[:, :seq_len]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: Optional[int]
) -> torch.Tensor:
    """Softmax attention of ``q`` ``[q_heads, n_q, d]`` over ``k``/``v`` ``[kv_heads, n_k, d]``.

    Each group of ``q_heads // kv_heads`` consecutive query heads shares one K/V head
    (grouped-query attention). With ``causal_offset`` set, query ``i`` sits at position
    ``causal_offset + i`` and sees only keys at positions up to its own.
    """
    q_heads, n_q, head_dim = q.shape
    kv_heads, n_k, _ = k.shape
    group = q_heads // kv_heads
    # Stack each group's queries as rows under its K/V head: one matmul serves the group.
    q = q.float().reshape(kv_heads, group * n_q, head_dim)
    scores = torch.matmul(q, k.float().transpose(1, 2)) * scale  # [kv_heads, group*n_q, n_k]
    if causal_offset is not None:
        q_pos = causal_offset + torch.arange(n_q, device=q.device)
        k_pos = torch.arange(n_k, device=q.device)
        hidden = (k_pos[None, :] > q_pos[:, None]).repeat(group, 1)  # [group*n_q, n_k]
        scores = scores.masked_fill(hidden, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float())  # [kv_heads, group*n_q, d]
    return out.reshape(q_heads, n_q, head_dim)


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Decode attention: each sequence's single query token attends to all its cached tokens.

    Shapes: ``q`` ``[num_seqs, num_q_heads, head_dim]``, caches
    ``[num_blocks, num_kv_heads, block_size, head_dim]``, ``block_tables``
    ``[num_seqs, max_blocks]``, ``seq_lens`` ``[num_seqs]``. A sequence of length 0 gets
    an all-zero output row. Inputs are not validated here; use ``paged_attention``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len)
        v = gather_kv(v_cache, block_tables[i], seq_len)
        # q[i] is [q_heads, d]; give it a query axis of length 1 and take it off again.
        out[i] = _attend(q[i].unsqueeze(1), k, v, scale, None).squeeze(1).to(q.dtype)
    return out


def paged_attention_extend_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Prefill/extend attention: each sequence's new tokens attend causally to its cache.

    ``q`` packs every sequence's new query tokens, ``[total_q, num_q_heads, head_dim]``;
    sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]``. ``seq_lens[i]``
    counts all its tokens including the new ones (whose K/V are already in the cache),
    so new token ``j`` of ``n`` sits at position ``seq_lens[i] - n + j``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        first, last = starts[i], starts[i + 1]
        if last == first:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len)
        v = gather_kv(v_cache, block_tables[i], seq_len)
        q_i = q[first:last].transpose(0, 1)  # [q_heads, n_new, d]
        o_i = _attend(q_i, k, v, scale, causal_offset=seq_len - (last - first))
        out[first:last] = o_i.transpose(0, 1).to(q.dtype)
    return out
