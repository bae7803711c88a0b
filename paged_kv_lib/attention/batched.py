"""Paged attention for a whole batch at once in torch: one gather, then one batched attention.

``reference.py`` loops over sequences so a lesson can read it; this module does the same
arithmetic for every sequence together, which is what the torch backend runs:

1. :func:`plan_batch` turns the padded block-table tensor and the lengths into one gather
   index: for every sequence, K/V head and table entry, the row of that (block, head) in
   the cache seen as ``[num_blocks * kv_heads, block_size, head_dim]`` (a padding entry,
   -1, reads block 0). It also lists the gathered rows no query may see (past a
   sequence's length: padding and the stale tail of a last block) and builds the mask.
2. :func:`attend` gathers ``[num_seqs, kv_heads, blocks * block_size, head_dim]`` K and V
   with one ``index_select`` each; the masks hide the unseen rows. A plan for a cache of
   unknown content also zeroes them (so whatever they held, even NaN, cannot reach the
   output: 0 * NaN would be NaN); an engine's cache holds only finite K/V, so its plans skip that. Decode is then one batched
   matmul, softmax and matmul in float32, every query head of a group under its K/V head
   (grouped-query attention); extend (several new tokens per sequence) pads the queries
   per sequence and runs torch's fused ``scaled_dot_product_attention`` in float32.

A plan depends only on the block tables and lengths, so a model builds it once per step
and reuses it in every layer; the index ranges that depend on a shape alone (key positions,
K/V head offsets, query offsets) are built once per shape and kept.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from ..block import cdiv
from torch.nn import functional as F


# A bucket's padded work is about count * query rows * width; one more bucket costs about
# as much as this many (query, key) pairs in fixed per-call overhead (some twenty tensor ops
# per layer; measured on the engine's mixed batch of 32 on one CPU thread: 512 cut too many
# buckets, 2048-8192 were about 7% faster than 512 and alike).
BUCKET_OVERHEAD = 4096
MAX_BUCKETS = 4


@dataclass(frozen=True)
class Bucket:
    """Sequences attended together: where their tokens sit in the cache, what each query may see.

    ``seqs``/``q_rows``: which sequences (decode) or packed query rows (extend) of the
    whole batch this bucket serves (``None``: all of them, in order). ``rows``: int64
    ``[num_seqs * kv_heads * num_blocks]``, gather index into the cache seen as
    ``[num_blocks * kv_heads, block_size, head_dim]``; the gathered keys number ``width =
    num_blocks * block_size``. Rows past a sequence's length are zeroed after the gather when
    the plan clears them (else both lists are empty): ``unseen_blocks`` lists the gathered blocks wholly past it (padding entries),
    ``unseen_slots`` the token rows past it inside its last block. ``mask``: decode, a
    float32 ``[S, 1, 1, 1, width]`` bias (0 where the query sees a key, -inf elsewhere);
    extend, a bool ``[S, 1, n_q, width]`` (True: seen), or ``None`` when every sequence is
    all new (plain causal attention). ``pack``: extend only, (sequence, query index) of
    each packed query row within the bucket.
    """

    seqs: Optional[torch.Tensor]
    q_rows: Optional[torch.Tensor]
    num_seqs: int
    kv_heads: int
    width: int
    num_queries: int  # query rows per sequence after padding (1 for decode)
    rows: torch.Tensor
    unseen_blocks: torch.Tensor
    unseen_slots: torch.Tensor
    mask: Optional[torch.Tensor]
    empty: Optional[torch.Tensor]  # bool [num_seqs]: sequences with no token (zeros out); None: there are none
    pack: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    # Decode: the bias broadcast to [S * kv_heads, group, width] once per group size, for every layer.
    biases: Dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def decode_bias(self, group: int) -> torch.Tensor:
        """The decode bias laid out as ``baddbmm`` adds it, built on first use and kept for the other layers."""
        bias = self.biases.get(group)
        if bias is None:
            assert self.mask is not None
            bias = self.mask.expand(self.num_seqs, self.kv_heads, group, 1, self.width).reshape(
                self.num_seqs * self.kv_heads, group, self.width)
            self.biases[group] = bias
        return bias


@dataclass(frozen=True)
class BatchPlan:
    """A batch cut into buckets of similar lengths, so short sequences are not padded to the longest."""

    decode: bool
    buckets: Tuple[Bucket, ...]


def plan_batch(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_heads: int,
    block_size: int,
    query_start_loc: Optional[torch.Tensor] = None,
    *,
    clear_unseen: bool = False,
) -> BatchPlan:
    """Build the gather indices and masks for a decode batch (or an extend batch with ``query_start_loc``).

    The masks alone keep a query from the keys it may not see, which is exact as long as
    those rows hold finite numbers: an engine's cache starts zeroed and only ever holds K/V
    the model wrote, so its plans skip clearing them (the clearing cost more than the
    gather). ``clear_unseen=True`` zeroes them after each gather, for caches of unknown
    content (the public ``paged_attention*`` functions: any slot may hold NaN there).

    In an extend batch the sequences with one new token (decodes riding along with prompt
    chunks) get buckets of their own, attended as decodes, so no decode pads its query up
    to a prompt chunk's length.
    """
    lens = [int(n) for n in seq_lens.tolist()]
    starts = None if query_start_loc is None else [int(x) for x in query_start_loc.tolist()]
    q_lens = None if starts is None else [b - a for a, b in zip(starts, starts[1:])]
    buckets = []
    if q_lens is not None and 1 in q_lens and max(q_lens) > 1:
        # A mixed step: the decode rows and the chunk rows are bucketed apart.
        singles = [i for i, n in enumerate(q_lens) if n == 1]
        chunks = [i for i, n in enumerate(q_lens) if n != 1]
        assert starts is not None
        for part, part_q in ((singles, None), (chunks, q_lens)):
            sub_lens = [lens[i] for i in part]
            sub_q = None if part_q is None else [part_q[i] for i in part]
            for group in _group(sub_lens, sub_q, block_size):
                members = part if group is None else [part[j] for j in group]
                buckets.append(_member_bucket(block_tables, lens, q_lens if part_q is not None else None,
                                              starts, members, kv_heads, block_size, clear_unseen))
        return BatchPlan(False, tuple(buckets))
    for group in _group(lens, q_lens, block_size):
        if group is None:
            buckets.append(_plan_bucket(block_tables, lens, q_lens, kv_heads, block_size, None, None, clear_unseen))
            continue
        buckets.append(_member_bucket(block_tables, lens, q_lens, starts, group, kv_heads, block_size, clear_unseen))
    return BatchPlan(query_start_loc is None, tuple(buckets))


def _member_bucket(
    block_tables: torch.Tensor,
    lens: List[int],
    q_lens: Optional[List[int]],
    starts: Optional[List[int]],
    members: List[int],
    kv_heads: int,
    block_size: int,
    clear_unseen: bool,
) -> Bucket:
    """The bucket of some sequences of the batch (``q_lens`` None: attended as decodes, one query each)."""
    device = block_tables.device
    seqs = torch.tensor(members, dtype=torch.int64, device=device)
    sub_q = None if q_lens is None else [q_lens[i] for i in members]
    q_rows = None
    if starts is not None:
        q_rows = torch.tensor([r for i in members for r in range(starts[i], starts[i + 1])], dtype=torch.int64,
                              device=device)
    return _plan_bucket(block_tables[seqs], [lens[i] for i in members], sub_q, kv_heads, block_size, seqs, q_rows,
                        clear_unseen)


def _group(lens: List[int], q_lens: Optional[List[int]], block_size: int) -> List[Optional[List[int]]]:
    """Sequences sorted by length and cut into 1-4 equal-count buckets, whichever pads least.

    ``[None]`` means one bucket holding the whole batch in its own order.
    """
    n = len(lens)
    if n < 2:
        return [None]
    order = sorted(range(n), key=lens.__getitem__)

    def cost(group: List[int]) -> int:
        width = cdiv(max(lens[i] for i in group), block_size) * block_size
        rows = 1 if q_lens is None else max(q_lens[i] for i in group)
        return len(group) * rows * width

    best: List[Optional[List[int]]] = [None]
    best_cost = cost(order)
    for count in range(2, min(MAX_BUCKETS, n) + 1):
        cuts = [round(k * n / count) for k in range(count + 1)]
        groups = [order[a:b] for a, b in zip(cuts, cuts[1:])]
        total = sum(cost(g) for g in groups) + BUCKET_OVERHEAD * (count - 1)
        if total < best_cost:
            best, best_cost = list(groups), total
    return best


def _plan_bucket(
    block_tables: torch.Tensor,
    lens_list: List[int],
    q_lens_list: Optional[List[int]],
    kv_heads: int,
    block_size: int,
    seqs: Optional[torch.Tensor],
    q_rows: Optional[torch.Tensor],
    clear_unseen: bool,
) -> Bucket:
    device = block_tables.device
    num_seqs = len(lens_list)
    lens = torch.tensor(lens_list, dtype=torch.int64, device=device)
    longest = max(lens_list, default=0)
    num_blocks = min(block_tables.shape[1], cdiv(longest, block_size))
    width = num_blocks * block_size
    ids = block_tables[:, :num_blocks].long().clamp(min=0)
    rows = (ids[:, None, :] * kv_heads + _arange(kv_heads, device)[None, :, None]).reshape(-1)
    key_pos = _arange(width, device)
    valid = key_pos[None, :] < lens[:, None]  # [S, width]
    # Whole blocks past the length are cleared as blocks, the last block's tail slot by slot
    # (the lengths, known here, say whether there are any).
    nothing = torch.empty(0, dtype=torch.int64, device=device)
    unseen_blocks = unseen_slots = nothing
    if clear_unseen and any(cdiv(n, block_size) < num_blocks for n in lens_list):
        block_start = torch.arange(num_blocks, device=device) * block_size
        past = (block_start[None, :] >= lens[:, None])[:, None, :].expand(num_seqs, kv_heads, num_blocks)
        unseen_blocks = past.reshape(-1).nonzero().flatten()
    if clear_unseen and any(n % block_size for n in lens_list):
        tail = ~valid & (key_pos[None, :] >= (lens[:, None] // block_size) * block_size)  # [S, width]
        unseen_slots = tail[:, None, :].expand(num_seqs, kv_heads, width).reshape(-1).nonzero().flatten()
    empty = (lens == 0) if 0 in lens_list else None

    if q_lens_list is None:
        bias = torch.zeros(num_seqs, width, device=device).masked_fill_(~valid, float("-inf"))
        return Bucket(  # in an extend batch too (decodes beside prompt chunks): q_rows says where they are
            seqs, q_rows, num_seqs, kv_heads, width, 1, rows, unseen_blocks, unseen_slots,
            bias[:, None, None, None, :], empty,
        )

    q_lens = torch.tensor(q_lens_list, dtype=torch.int64, device=device)
    total_q = sum(q_lens_list)
    num_queries = max(q_lens_list, default=0)
    seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=total_q)
    starts = torch.zeros(num_seqs + 1, dtype=torch.int64, device=device)
    torch.cumsum(q_lens, 0, out=starts[1:])
    index_in_seq = torch.arange(total_q, device=device) - starts[seq_of]
    if q_lens_list == lens_list:
        seen = None  # every sequence is new: query j sits at position j, plain causal attention
    else:
        # New token j of n sits at position len - n + j and sees keys up to its own position.
        q_pos = (lens - q_lens)[:, None] + _arange(num_queries, device)[None, :]
        seen = (key_pos[None, None, :] <= q_pos[:, :, None])[:, None]  # [S, 1, n_q, width]
    return Bucket(
        seqs, q_rows, num_seqs, kv_heads, width, num_queries, rows, unseen_blocks, unseen_slots, seen, empty,
        (seq_of, index_in_seq),
    )


@functools.lru_cache(maxsize=256)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(n)`` built once per length and device: a plan's shape-only tensors (never written to)."""
    return torch.arange(n, device=device)


def gather(cache: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    """Every sequence's K or V as ``[num_seqs, kv_heads, width, head_dim]``, unseen rows zeroed."""
    block_size, head_dim = cache.shape[2], cache.shape[3]
    out = cache.reshape(-1, block_size, head_dim).index_select(0, bucket.rows)
    if bucket.unseen_blocks.numel():
        out.index_fill_(0, bucket.unseen_blocks, 0.0)
    if bucket.unseen_slots.numel():
        out.view(-1, head_dim).index_fill_(0, bucket.unseen_slots, 0.0)
    return out.view(bucket.num_seqs, bucket.kv_heads, bucket.width, head_dim)


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: BatchPlan,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Attention of ``q`` over the K/V the plan gathers, bucket by bucket; returns q's shape and dtype.

    ``q`` is ``[num_seqs, q_heads, d]`` for a decode plan, or the packed ``[total_q,
    q_heads, d]`` of an extend plan.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if len(plan.buckets) == 1 and plan.buckets[0].seqs is None:
        return _attend_bucket(q, k_cache, v_cache, plan.buckets[0], scale)
    out = torch.empty_like(q)
    for bucket in plan.buckets:
        where = bucket.seqs if plan.decode else bucket.q_rows
        out[where] = _attend_bucket(q[where], k_cache, v_cache, bucket, scale)
    return out


def _attend_bucket(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Bucket, scale: float
) -> torch.Tensor:
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
    assert plan.mask is not None  # a decode plan always carries its bias
    group = q_heads // kv_heads
    rows = num_seqs * kv_heads
    qg = q.float().reshape(rows, group, head_dim)
    # One fused call: bias + scale * q k^T, for every (sequence, K/V head) at once.
    scores = torch.baddbmm(plan.decode_bias(group), qg, k.view(rows, plan.width, head_dim).transpose(1, 2),
                           alpha=scale)
    weights = torch.softmax(scores, dim=-1)
    out = torch.bmm(weights, v.view(rows, plan.width, head_dim)).view(num_seqs, q_heads, head_dim)
    if plan.empty is not None:  # a sequence with no token saw only -inf (a NaN softmax): its answer is zeros
        out = torch.where(plan.empty[:, None, None], 0.0, out)
    return out.to(q.dtype)


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
    plan = plan_batch(block_tables, seq_lens, k_cache.shape[1], k_cache.shape[2], clear_unseen=True)
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
    plan = plan_batch(block_tables, seq_lens, k_cache.shape[1], k_cache.shape[2], query_start_loc, clear_unseen=True)
    return attend(q, k_cache, v_cache, plan, scale)
