"""Paged attention for a whole batch at once in torch: one gather, then one batched attention.

``reference.py`` loops over sequences so a lesson can read it; this module does the same
arithmetic for every sequence together, which is what the torch backend runs:

1. :func:`plan_batch` turns the padded block-table tensor and the lengths into one gather
   index: for every sequence, K/V head and table entry, the row of that (block, head) in
   the cache seen as ``[num_blocks * kv_heads, block_size, head_dim]`` (a padding entry,
   -1, reads block 0). It also lists the gathered rows no query may see (past a
   sequence's length: padding and the stale tail of a last block) and builds the mask.
2. :func:`attend` gathers ``[num_seqs, kv_heads, blocks * block_size, head_dim]`` K and V
   with one ``index_select`` each and zeroes the unseen rows (so whatever they held, even
   NaN, cannot reach the output: 0 * NaN would be NaN). Decode is then one batched
   matmul, softmax and matmul in float32, every query head of a group under its K/V head
   (grouped-query attention); extend (several new tokens per sequence) pads the queries
   per sequence and runs torch's fused ``scaled_dot_product_attention`` in float32.

A plan depends only on the block tables and lengths, so a model builds it once per step
and reuses it in every layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class BatchPlan:
    """Where a batch's tokens sit in the cache, and what each query may see.

    ``rows``: int64 ``[num_seqs * kv_heads * num_blocks]``, gather index into the cache
    seen as ``[num_blocks * kv_heads, block_size, head_dim]``; the gathered keys number
    ``width = num_blocks * block_size``. Rows past a sequence's length are zeroed after the
    gather: ``unseen_blocks`` lists the gathered blocks wholly past it (padding entries),
    ``unseen_slots`` the token rows past it inside its last block. ``mask``: decode, a
    float32 ``[S, 1, 1, 1, width]`` bias (0 where the query sees a key, -inf elsewhere);
    extend, a bool ``[S, 1, n_q, width]`` (True: seen), or ``None`` when every sequence is
    all new (plain causal attention). ``pack``: extend only, (sequence, query index) of
    each packed query row.
    """

    num_seqs: int
    kv_heads: int
    width: int
    num_queries: int  # query rows per sequence after padding (1 for decode)
    rows: torch.Tensor
    unseen_blocks: torch.Tensor
    unseen_slots: torch.Tensor
    mask: Optional[torch.Tensor]
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
    # Whole blocks past the length are cleared as blocks, the last block's tail slot by slot.
    block_start = torch.arange(num_blocks, device=device) * block_size
    past = (block_start[None, :] >= lens[:, None])[:, None, :].expand(num_seqs, kv_heads, num_blocks)
    unseen_blocks = past.reshape(-1).nonzero().flatten()
    tail = ~valid & (key_pos[None, :] >= (lens[:, None] // block_size) * block_size)  # [S, width]
    unseen_slots = tail[:, None, :].expand(num_seqs, kv_heads, width).reshape(-1).nonzero().flatten()
    empty = lens == 0

    if query_start_loc is None:
        bias = torch.zeros(num_seqs, width, device=device).masked_fill_(~valid, float("-inf"))
        return BatchPlan(
            num_seqs, kv_heads, width, 1, rows, unseen_blocks, unseen_slots, bias[:, None, None, None, :], empty
        )

    starts = query_start_loc.to(device).long()
    q_lens = starts[1:] - starts[:-1]
    total_q = int(starts[-1]) if num_seqs else 0
    num_queries = int(q_lens.max()) if num_seqs else 0
    seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=total_q)
    index_in_seq = torch.arange(total_q, device=device) - starts[seq_of]
    if bool((q_lens == lens).all()):
        seen = None  # every sequence is new: query j sits at position j, plain causal attention
    else:
        # New token j of n sits at position len - n + j and sees keys up to its own position.
        q_pos = (lens - q_lens)[:, None] + torch.arange(num_queries, device=device)[None, :]
        seen = (key_pos[None, None, :] <= q_pos[:, :, None])[:, None]  # [S, 1, n_q, width]
    return BatchPlan(
        num_seqs, kv_heads, width, num_queries, rows, unseen_blocks, unseen_slots, seen, empty,
        (seq_of, index_in_seq),
    )


def gather(cache: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """Every sequence's K or V as ``[num_seqs, kv_heads, width, head_dim]``, unseen rows zeroed."""
    block_size, head_dim = cache.shape[2], cache.shape[3]
    out = cache.reshape(-1, block_size, head_dim).index_select(0, plan.rows)
    if plan.unseen_blocks.numel():
        out.index_fill_(0, plan.unseen_blocks, 0.0)
    if plan.unseen_slots.numel():
        out.view(-1, head_dim).index_fill_(0, plan.unseen_slots, 0.0)
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
    num_seqs, kv_heads = plan.num_seqs, plan.kv_heads
    k = gather(k_cache, plan).float()
    v = gather(v_cache, plan).float()
    if plan.pack is not None:
        # Extend: pad the packed queries to [S, n_q, ...], attend (fused, float32), pack back;
        # padded query rows may come out as NaN and are dropped by the packing.
        padded = q.new_zeros((num_seqs, plan.num_queries, q_heads, head_dim))
        padded[plan.pack] = q
        out = F.scaled_dot_product_attention(
            padded.float().transpose(1, 2), k, v, attn_mask=plan.mask, is_causal=plan.mask is None,
            scale=scale, enable_gqa=True,
        )
        return out.transpose(1, 2)[plan.pack].to(q.dtype)
    # Decode: each K/V head serves its group's query heads, [S, hkv, group, d].
    group = q_heads // kv_heads
    qg = q.float().view(num_seqs, kv_heads, group, head_dim)
    scores = torch.matmul(qg, k.transpose(2, 3)).mul_(scale)
    scores = scores.view(num_seqs, kv_heads, group, 1, plan.width).add_(plan.mask)
    weights = torch.softmax(scores.view(num_seqs, kv_heads, group, plan.width), dim=-1)
    out = torch.matmul(weights, v).view(num_seqs, q_heads, head_dim)
    # A sequence with no token saw only -inf (a NaN softmax): its answer is zeros.
    return torch.where(plan.empty[:, None, None], 0.0, out).to(q.dtype)


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
