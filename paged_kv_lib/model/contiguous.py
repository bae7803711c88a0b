"""The contiguous K/V cache: one worst-case slab per sequence, what engines did before paging."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._validate import as_count, as_iterable
from ..errors import InvalidArgumentError
from .dense import dense_attention
from .decoder import Decoder
from .tokens import TokenBatch


class ContiguousKVCache:
    """Per-sequence K/V slabs reserved at full length up front (worst-case reservation).

    ``k[layer]``/``v[layer]`` are ``[batch, max_len, num_kv_heads, head_dim]``; row ``b``
    holds ``lengths[b]`` tokens. Every row costs ``max_len`` slots whether used or not:
    the waste paging removes.
    """

    def __init__(self, model: Decoder, batch_size: int, max_len: int) -> None:
        cfg = model.config
        self.batch_size = as_count(batch_size, "batch_size", minimum=1)
        self.max_len = as_count(max_len, "max_len", minimum=1)
        shape = (cfg.num_layers, batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.int64)

    @property
    def reserved_slots(self) -> int:
        """Token slots reserved per layer: ``batch_size * max_len``."""
        return self.batch_size * self.max_len

    def reset_row(self, row: int) -> None:
        """Forget row ``row`` so a new sequence can use its slab."""
        row = as_count(row, "row")
        if row >= self.batch_size:
            raise InvalidArgumentError(f"row {row} is outside the cache's {self.batch_size} rows")
        self.lengths[row] = 0


def forward_contiguous(
    model: Decoder, token_ids: TokenBatch, cache: ContiguousKVCache, rows: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` of new tokens ``[batch, seq]`` appended to cache rows ``rows``."""
    tokens = model.tokens(token_ids)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.shape[1] == 0:
        raise InvalidArgumentError(f"token_ids must be [seq] or [batch, seq] with seq >= 1, got {tuple(tokens.shape)}")
    batch, seq = tokens.shape
    if rows is None:
        rows_list = list(range(batch))
    else:
        rows_list = [as_count(r, "row") for r in as_iterable(rows, "rows")]
    if len(rows_list) != batch:
        raise InvalidArgumentError(f"rows has {len(rows_list)} entries for a batch of {batch}")
    if rows_list and max(rows_list) >= cache.batch_size:
        raise InvalidArgumentError(f"row {max(rows_list)} is outside the cache's {cache.batch_size} rows")
    rows_t = torch.tensor(rows_list, dtype=torch.int64)
    starts = cache.lengths[rows_t]
    end = int(starts.max()) + seq
    if end > cache.max_len:
        raise InvalidArgumentError(f"cache rows hold at most max_len={cache.max_len} tokens, this needs {end}")
    device = model.device
    positions = (starts[:, None] + torch.arange(seq)[None, :]).to(device)
    key_pos = torch.arange(end, device=device)
    mask = key_pos[None, None, :] <= positions[:, :, None]  # [batch, seq, end]
    dst_rows = rows_t.to(device)[:, None].expand(batch, seq)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_slab, v_slab = cache.k[layer], cache.v[layer]
        k_slab[dst_rows, positions] = k.view(batch, seq, *k.shape[1:])
        v_slab[dst_rows, positions] = v.view(batch, seq, *v.shape[1:])
        k_all, v_all = k_slab[rows_t, :end], v_slab[rows_t, :end]
        out = dense_attention(q.view(batch, seq, *q.shape[1:]), k_all, v_all, mask)
        return out.reshape(batch * seq, *q.shape[1:])

    hidden = model.run(tokens.reshape(-1), positions.reshape(-1), attend)
    cache.lengths[rows_t] += seq
    return model.lm_head(hidden).view(batch, seq, -1)
