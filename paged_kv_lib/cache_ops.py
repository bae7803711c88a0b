"""Tensor operations on a paged KV cache laid out ``(num_blocks, num_heads, block_size, head_dim)``.

These functions know the layout but nothing about which sequence owns which block:
the allocator decides *where*, these move the bytes. A slot number names one token
position in the pool: ``slot = block_id * block_size + offset``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._validate import as_count
from .errors import InvalidArgumentError


def slots_from_positions(
    block_ids: torch.Tensor, positions: torch.Tensor, block_size: int, rows: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The slot of each logical position, read through block ids: the one home of the slot mapping.

    ``block_ids`` is one sequence's block ids ``[num_blocks]``, or with ``rows`` a padded
    block-table tensor ``[num_seqs, max_blocks]`` whose row ``rows[i]`` owns ``positions[i]``
    (a batch's new tokens in one call). Returns int64 ``block * block_size + offset``.
    """
    column = positions // block_size
    ids = block_ids[column] if rows is None else block_ids[rows, column]
    return ids.long() * block_size + positions % block_size


def cache_rows(slots: torch.Tensor, num_heads: int, block_size: int) -> torch.Tensor:
    """The row of every (slot, head) in a cache seen as ``[num_blocks * num_heads * block_size, head_dim]``.

    int64 ``[len(slots) * num_heads]``, slot-major: what :func:`write_rows` takes, so a caller
    writing many layers through the same slots computes it once.
    """
    heads = torch.arange(num_heads, device=slots.device)
    first = ((slots // block_size) * num_heads * block_size + slots % block_size)[:, None]
    return (first + heads[None, :] * block_size).reshape(-1)


def write_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[n, num_heads, head_dim]`` at the cache rows :func:`cache_rows` gave (one copy each)."""
    head_dim = k_cache.shape[-1]
    k_cache.view(-1, head_dim).index_copy_(0, rows, k.reshape(-1, head_dim))
    v_cache.view(-1, head_dim).index_copy_(0, rows, v.reshape(-1, head_dim))


def write_slots(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store ``k``/``v`` of shape ``[n, num_heads, head_dim]`` into the given slots."""
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        write_rows(k_cache, v_cache, cache_rows(slots, k_cache.shape[1], k_cache.shape[2]), k, v)
        return
    block_size = k_cache.shape[2]
    blocks = slots // block_size
    offsets = slots % block_size
    # Advanced indices on dims 0 and 2 around a slice put the token dim first: [n, H, D].
    k_cache[blocks, :, offsets, :] = k
    v_cache[blocks, :, offsets, :] = v


def gather_tokens(cache: torch.Tensor, block_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Read ``num_tokens`` tokens stored in ``block_ids`` back as ``[num_tokens, H, D]``."""
    num_heads, head_dim = cache.shape[1], cache.shape[3]
    blocks = cache.index_select(0, block_ids)  # [nb, H, bs, D]
    tokens = blocks.permute(0, 2, 1, 3).reshape(-1, num_heads, head_dim)
    return tokens[:num_tokens].contiguous()


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks ``src[i] -> dst[i]`` in every layer, K and V, of a stacked cache.

    ``kv`` is ``[2, num_layers, num_blocks, H, bs, D]``: one indexed copy moves everything
    (this is copy-on-write's copy).
    """
    kv[:, :, dst] = kv[:, :, src]


def transfer_blocks(src_kv: torch.Tensor, src: torch.Tensor, dst_kv: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy blocks between two stacked caches, possibly on different devices (swapping)."""
    moved = src_kv[:, :, src.to(src_kv.device)]
    dst_kv[:, :, dst.to(dst_kv.device)] = moved.to(dst_kv.device)


def padded_block_tables(tables: Sequence[Sequence[int]], device: torch.device, *,
                        max_blocks: Optional[int] = None) -> torch.Tensor:
    """Block tables as the int32 ``[len(tables), width]`` tensor :meth:`~paged_kv_lib.bookkeeping.PagedKVView.block_table_tensor` returns.

    Rows are padded with -1; ``width`` is the longest table, or ``max_blocks`` (a fixed width
    suits kernels captured once for many steps), which may not be shorter.
    """
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else as_count(max_blocks, "max_blocks")
    if width < longest:
        raise InvalidArgumentError(f"max_blocks={width} is less than the longest table ({longest} blocks)")
    rows = [list(t) + [-1] * (width - len(t)) for t in tables]
    out = torch.tensor(rows, dtype=torch.int32) if rows else torch.empty((0, width), dtype=torch.int32)
    return out.reshape(len(tables), width).to(device)
