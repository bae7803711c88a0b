"""Paged attention for a whole batch at once in torch: one gather, one masked matmul, one softmax.

``reference.py`` loops over sequences so a lesson can read it; this module does the same
arithmetic for every sequence together, which is what the torch backend runs:

1. :func:`plan_batch` turns the padded block-table tensor and the lengths into one gather
   index: for every sequence, K/V head and table entry, the row of that (block, head) in
   the cache seen as ``[num_blocks * kv_heads, block_size, head_dim]`` (a padding entry,
   -1, reads block 0). It also lists the gathered token rows no query may see (past a
   sequence's length: padding and the stale tail of a last block) and builds the
   additive mask (0 or -inf).
2. :func:`attend` gathers ``[num_seqs, kv_heads, blocks * block_size, head_dim]`` K and V
   with one ``index_select`` each, zeroes the unseen rows (so whatever they held, even
   NaN, cannot reach the output: 0 * NaN would be NaN), then one batched matmul, softmax
   (float32) and matmul serve every sequence and every query head of a group
   (grouped-query attention).

A plan depends only on the block tables and lengths, so a model builds it once per step
and reuses it in every layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class BatchPlan:
    """Where a batch's tokens sit in the cache, and what each query may see.

    ``rows``: int64 ``[num_seqs * kv_heads * num_blocks]``, gather index into the cache
    seen as ``[num_blocks * kv_heads, block_size, head_dim]``; the gathered keys number
    ``width = num_blocks * block_size``. ``unseen``: flat indices of gathered token rows
    past their sequence's length (zeroed after the gather). ``bias``: float32, 0 where a
    query sees a key and -inf elsewhere; ``[S, 1, 1, 1, width]`` for decode,
    ``[S, 1, 1, n_q, width]`` for extend. ``pack``: extend only, (sequence, query index)
    of each packed query row.
    """

    num_seqs: int
    kv_heads: int
    width: int
    num_queries: int  # query rows per sequence after padding (1 for decode)
    rows: torch.Tensor
    unseen: torch.Tensor
    bias: torch.Tensor
    empty: torch.Tensor  # bool [num_seqs]: sequences with no token (their output is zeros)
    pack: Optional[Tuple[torch.Tensor, torch.Tensor]] = None


def plan_batch(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_heads: int,
    block_size: int,
    query_start_loc: Optional[torch.Tensor] = None,
) -> BatchPlan:
    """Build the gather index and mask for a decode batch (or an extend batch with ``query_start_loc``)."""
    device = block_tables.device
    num_seqs = block_tables.shape[0]
    lens = seq_lens.to(device).long()
    longest = int(lens.max()) if num_seqs else 0
    num_blocks = min(block_tables.shape[1], -(-longest // block_size))
    width = num_blocks * block_size
    ids = block_tables[:, :num_blocks].long().clamp(min=0)
    rows = (ids[:, None, :] * kv_heads + torch.arange(kv_heads, device=device)[None, :, None]).reshape(-1)
    key_pos = torch.arange(width, device=device)
    valid = key_pos[None, :] < lens[:, None]  # [S, width]
    unseen = (~valid)[:, None, :].expand(num_seqs, kv_heads, width).reshape(-1).nonzero().flatten()
    empty = lens == 0

    if query_start_loc is None:
        bias = torch.zeros(num_seqs, width, device=device).masked_fill_(~valid, float("-inf"))
        return BatchPlan(num_seqs, kv_heads, width, 1, rows, unseen, bias[:, None, None, None, :], empty)

    starts = query_start_loc.to(device).long()
    q_lens = starts[1:] - starts[:-1]
    total_q = int(starts[-1]) if num_seqs else 0
    num_queries = int(q_lens.max()) if num_seqs else 0
    seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=total_q)
    index_in_seq = torch.arange(total_q, device=device) - starts[seq_of]
    # New token j of n sits at position len - n + j and sees keys up to its own position.
    q_pos = (lens - q_lens)[:, None] + torch.arange(num_queries, device=device)[None, :]
    seen = key_pos[None, None, :] <= q_pos[:, :, None]  # [S, n_q, width]
    bias = torch.zeros(seen.shape, device=device).masked_fill_(~seen, float("-inf"))
    return BatchPlan(
        num_seqs, kv_heads, width, num_queries, rows, unseen, bias[:, None, None], empty, (seq_of, index_in_seq)
    )


def gather(cache: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """Every sequence's K or V as ``[num_seqs, kv_heads, width, head_dim]``, unseen rows zeroed."""
    block_size, head_dim = cache.shape[2], cache.shape[3]
    out = cache.reshape(-1, block_size, head_dim).index_select(0, plan.rows)
    flat = out.view(-1, head_dim)
    if plan.unseen.numel():
        flat.index_fill_(0, plan.unseen, 0.0)
    return out.view(plan.num_seqs, plan.kv_heads, plan.width, head_dim)


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: BatchPlan,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Attention of ``q`` over the K/V the plan gathers; returns q's shape and dtype.

    ``q`` is ``[num_seqs, q_heads, d]`` for a decode plan, or the packed ``[total_q,
    q_heads, d]`` of an extend plan.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q_heads, head_dim = q.shape[1], q.shape[2]
    if plan.num_seqs == 0 or plan.width == 0 or q.shape[0] == 0:
        return torch.zeros_like(q)
    num_seqs, kv_heads, n_q = plan.num_seqs, plan.kv_heads, plan.num_queries
    group = q_heads // kv_heads
    if plan.pack is None:
        padded = q
    else:
        padded = q.new_zeros((num_seqs, n_q, q_heads, head_dim))
        padded[plan.pack] = q
    # [S, n_q, hq, d] -> [S, hkv, group * n_q, d]: each K/V head serves its group's queries.
    qg = padded.float().reshape(num_seqs, n_q, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(num_seqs, kv_heads, group * n_q, head_dim)
    k = gather(k_cache, plan).float()
    v = gather(v_cache, plan).float()
    scores = torch.matmul(qg, k.transpose(2, 3)).mul_(scale)
    scores = scores.view(num_seqs, kv_heads, group, n_q, plan.width).add_(plan.bias)
    weights = torch.softmax(scores.view(num_seqs, kv_heads, group * n_q, plan.width), dim=-1)
    out = torch.matmul(weights, v).view(num_seqs, kv_heads, group, n_q, head_dim)
    out = out.permute(0, 3, 1, 2, 4).reshape(num_seqs, n_q, q_heads, head_dim)
    if plan.pack is None:
        # A sequence with no token saw only -inf (a NaN softmax): its answer is zeros.
        return torch.where(plan.empty[:, None, None], 0.0, out[:, 0]).to(q.dtype)
    return out[plan.pack].to(q.dtype)  # padded query rows are dropped here


def paged_attention_batched(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Decode attention for every sequence at once; same contract as ``paged_attention_reference``.

    Inputs are not validated here; use ``paged_attention``.
    """
    plan = plan_batch(block_tables, seq_lens, k_cache.shape[1], k_cache.shape[2])
    return attend(q, k_cache, v_cache, plan, scale)


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
    attend causally and are packed back. Inputs are not validated here; use
    ``paged_attention_extend``.
    """
    plan = plan_batch(block_tables, seq_lens, k_cache.shape[1], k_cache.shape[2], query_start_loc)
    return attend(q, k_cache, v_cache, plan, scale)
