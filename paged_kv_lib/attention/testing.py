"""Build paged batches with known contents, and the SDPA answers they should give.

Tests, benchmarks and lessons share these: each sequence's K/V is drawn contiguously,
then scattered into randomly chosen cache blocks, so the paged result can be checked
against ``torch.nn.functional.scaled_dot_product_attention`` on the original tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..block import cdiv
from ..kv_cache import slots_from_positions, write_slots


@dataclass
class PagedAttentionCase:
    """A decode or extend batch over a paged cache, plus the contiguous K/V it came from."""

    q: torch.Tensor  # decode: [num_seqs, q_heads, d]; extend: [total_q, q_heads, d]
    k_cache: torch.Tensor  # [num_blocks, kv_heads, block_size, d]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], -1 padded
    seq_lens: torch.Tensor  # int32 [num_seqs]
    keys: List[torch.Tensor]  # per sequence, [kv_heads, seq_len, d]
    values: List[torch.Tensor]
    query_start_loc: Optional[torch.Tensor] = None  # extend only: int32 [num_seqs + 1]


def make_paged_batch(
    seq_lens: Sequence[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    query_lens: Optional[Sequence[int]] = None,
    spare_blocks: int = 0,
    pad_columns: int = 0,
    poison: bool = True,
    seed: int = 0,
) -> PagedAttentionCase:
    """A batch whose sequences sit in shuffled cache blocks.

    ``query_lens`` makes an extend batch: sequence ``i``'s last ``query_lens[i]`` tokens
    get query rows in a packed ``q``. Otherwise ``q`` has one row per sequence (decode).
    ``spare_blocks`` adds unused blocks to the pool and ``pad_columns`` extra -1 columns to
    the block table. With ``poison`` every cache slot no sequence owns holds NaN, so a
    kernel that reads one gives NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    lens = [int(n) for n in seq_lens]
    blocks_per_seq = [cdiv(n, block_size) for n in lens]
    num_blocks = max(1, sum(blocks_per_seq) + spare_blocks)
    order = torch.randperm(num_blocks, generator=gen).tolist()

    cache_shape = (num_blocks, num_kv_heads, block_size, head_dim)
    fill = float("nan") if poison else 0.0
    k_cache = torch.full(cache_shape, fill, dtype=dtype)
    v_cache = torch.full(cache_shape, fill, dtype=dtype)
    width = max(blocks_per_seq, default=0) + pad_columns
    block_tables = torch.full((len(lens), width), -1, dtype=torch.int32)

    keys, values = [], []
    for i, n in enumerate(lens):
        k = torch.randn(num_kv_heads, n, head_dim, generator=gen).to(dtype)
        v = torch.randn(num_kv_heads, n, head_dim, generator=gen).to(dtype)
        ids = torch.tensor([order.pop() for _ in range(blocks_per_seq[i])], dtype=torch.int32)
        block_tables[i, : len(ids)] = ids
        # Token j goes where the library's slot mapping puts it.
        slots = slots_from_positions(ids, torch.arange(n), block_size)
        write_slots(k_cache, v_cache, slots, k.transpose(0, 1), v.transpose(0, 1))
        keys.append(k)
        values.append(v)

    query_start_loc = None
    if query_lens is None:
        q = torch.randn(len(lens), num_q_heads, head_dim, generator=gen).to(dtype)
    else:
        counts = [int(n) for n in query_lens]
        q = torch.randn(sum(counts), num_q_heads, head_dim, generator=gen).to(dtype)
        query_start_loc = torch.tensor([0] + counts, dtype=torch.int32).cumsum(0).to(torch.int32)

    def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.to(device)

    return PagedAttentionCase(
        q=move(q),
        k_cache=move(k_cache),
        v_cache=move(v_cache),
        block_tables=move(block_tables),
        seq_lens=move(torch.tensor(lens, dtype=torch.int32)),
        keys=[move(k) for k in keys],
        values=[move(v) for v in values],
        query_start_loc=move(query_start_loc),
    )


def sdpa_decode(batch: PagedAttentionCase, scale: Optional[float] = None) -> torch.Tensor:
    """SDPA in float32 on each sequence's contiguous K/V: what decode attention should give."""
    out = torch.zeros(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    for i, (k, v) in enumerate(zip(batch.keys, batch.values)):
        if k.shape[1] == 0:
            continue
        q = batch.q[i].float()[None, :, None, :]  # [1, q_heads, 1, d]
        o = F.scaled_dot_product_attention(
            q, k.float()[None], v.float()[None], scale=scale, enable_gqa=True
        )
        out[i] = o[0, :, 0]
    return out


def sdpa_extend(batch: PagedAttentionCase, scale: Optional[float] = None) -> torch.Tensor:
    """SDPA in float32 with a causal mask shifted by each sequence's cached prefix."""
    out = torch.zeros(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    starts = batch.query_start_loc.tolist()
    for i, (k, v) in enumerate(zip(batch.keys, batch.values)):
        first, last = starts[i], starts[i + 1]
        n_new, n_all = last - first, k.shape[1]
        if n_new == 0:
            continue
        q = batch.q[first:last].float().transpose(0, 1)[None]  # [1, q_heads, n_new, d]
        q_pos = torch.arange(n_all - n_new, n_all, device=q.device)
        visible = torch.arange(n_all, device=q.device)[None, :] <= q_pos[:, None]
        o = F.scaled_dot_product_attention(
            q, k.float()[None], v.float()[None], attn_mask=visible, scale=scale, enable_gqa=True
        )
        out[first:last] = o[0].transpose(0, 1)
    return out


TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=2.5e-2, rtol=2.5e-2),
}
"""``torch.testing.assert_close`` tolerances for an output of each dtype against float32 SDPA."""
