"""Paged attention for a whole batch at once in torch: one gather, one masked matmul, one softmax.

``reference.py`` loops over sequences so a lesson can read it; this module does the same
arithmetic for every sequence together, which is what the torch backend runs. Every
sequence's blocks are gathered through the padded block-table tensor into one
``[num_seqs, num_kv_heads, max_blocks * block_size, head_dim]`` tensor, keys past a
sequence's length are masked, and one batched matmul and softmax (float32) serve all
sequences and all query heads of a group (grouped-query attention).

Padding entries (-1) and the unused tail of a last block are read as block 0 or as stale
slots; their scores are masked to -inf and their values zeroed before the weighted sum,
so whatever they hold (even NaN) never reaches the output.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch


def gather_batch(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first ``num_blocks`` table entries of every row as ``[num_seqs, kv_heads, num_blocks * bs, d]``.

    Padding ids (negative) read block 0; the caller masks those positions.
    """
    num_seqs = block_tables.shape[0]
    _, kv_heads, block_size, head_dim = cache.shape
    ids = block_tables[:, :num_blocks].long().clamp(min=0)
    blocks = cache[ids]  # [num_seqs, num_blocks, kv_heads, block_size, head_dim]
    return blocks.transpose(1, 2).reshape(num_seqs, kv_heads, num_blocks * block_size, head_dim)


def _attend_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    visible: torch.Tensor,
    num_blocks: int,
    scale: float,
) -> torch.Tensor:
    """Attention of padded queries ``q`` ``[S, n_q, hq, d]`` over each row's gathered keys.

    ``visible`` ``[S, n_q, L]`` (``L = num_blocks * block_size``) says which keys each query
    sees. Rows that see no key come out as zeros. Returns float32 ``[S, n_q, hq, d]``.
    """
    num_seqs, n_q, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    k = gather_batch(k_cache, block_tables, num_blocks).float()  # [S, hkv, L, d]
    v = gather_batch(v_cache, block_tables, num_blocks).float()
    # Query head h uses K/V head h // group: put each group's queries under their head.
    qg = q.float().reshape(num_seqs, n_q, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(num_seqs, kv_heads, group * n_q, head_dim)
    scores = torch.matmul(qg, k.transpose(2, 3)) * scale  # [S, hkv, group * n_q, L]
    seen = visible[:, None].expand(num_seqs, group, n_q, visible.shape[-1]).reshape(num_seqs, 1, group * n_q, -1)
    scores = scores.masked_fill(~seen, float("-inf"))
    # A key nobody may see can hold anything (padding reads block 0, stale slots): zero
    # its value too, since 0 * NaN is NaN.
    key_used = visible.any(dim=1)  # [S, L]
    v = v.masked_fill(~key_used[:, None, :, None], 0.0)
    weights = torch.softmax(scores, dim=-1)
    weights = weights.masked_fill(~seen.any(dim=-1, keepdim=True), 0.0)  # no key at all: zeros, not NaN
    out = torch.matmul(weights, v)  # [S, hkv, group * n_q, d]
    out = out.reshape(num_seqs, kv_heads, group, n_q, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_seqs, n_q, q_heads, head_dim)


def _num_blocks(seq_lens: torch.Tensor, block_size: int, width: int) -> Tuple[int, int]:
    """(longest length, blocks it spans) for the batch; one read of ``seq_lens``."""
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    return longest, min(width, -(-longest // block_size))


def paged_attention_batched(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Decode attention for every sequence at once; same contract as ``paged_attention_reference``.

    ``q`` ``[num_seqs, num_q_heads, head_dim]``; a sequence of length 0 gets zeros.
    Inputs are not validated here; use ``paged_attention``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    num_seqs = q.shape[0]
    longest, num_blocks = _num_blocks(seq_lens, k_cache.shape[2], block_tables.shape[1])
    if num_seqs == 0 or longest == 0:
        return torch.zeros_like(q)
    key_pos = torch.arange(num_blocks * k_cache.shape[2], device=q.device)
    visible = (key_pos[None, :] < seq_lens.to(q.device).long()[:, None])[:, None, :]  # [S, 1, L]
    out = _attend_padded(q[:, None], k_cache, v_cache, block_tables, visible, num_blocks, scale)
    return out[:, 0].to(q.dtype)


def paged_attention_extend_batched(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Prefill/extend attention for every sequence at once; same contract as the extend reference.

    The packed queries are laid out as a padded ``[num_seqs, longest_query, ...]`` batch,
    attend causally (new token ``j`` of ``n`` sits at position ``seq_lens[i] - n + j``),
    and are packed back. Inputs are not validated here; use ``paged_attention_extend``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    num_seqs, total_q = seq_lens.shape[0], q.shape[0]
    longest, num_blocks = _num_blocks(seq_lens, k_cache.shape[2], block_tables.shape[1])
    if num_seqs == 0 or total_q == 0 or longest == 0:
        return torch.zeros_like(q)
    starts = query_start_loc.to(q.device).long()
    q_lens = starts[1:] - starts[:-1]
    n_q = int(q_lens.max())
    # Row of each packed query, and its index among its sequence's new tokens.
    row = torch.repeat_interleave(torch.arange(num_seqs, device=q.device), q_lens, output_size=total_q)
    col = torch.arange(total_q, device=q.device) - starts[row]
    padded = q.new_zeros((num_seqs, n_q, *q.shape[1:]))
    padded[row, col] = q
    lens = seq_lens.to(q.device).long()
    q_pos = (lens - q_lens)[:, None] + torch.arange(n_q, device=q.device)[None, :]  # [S, n_q]
    real_query = torch.arange(n_q, device=q.device)[None, :] < q_lens[:, None]
    key_pos = torch.arange(num_blocks * k_cache.shape[2], device=q.device)
    visible = (key_pos[None, None, :] <= q_pos[:, :, None]) & real_query[:, :, None]  # [S, n_q, L]
    out = _attend_padded(padded, k_cache, v_cache, block_tables, visible, num_blocks, scale)
    return out[row, col].to(q.dtype)
