"""The decode kernel skeleton of exercise 09: the learner writes two of its pieces in Triton.

``run_decode_skeleton`` launches ``_decode_skeleton_kernel``, one program per (sequence,
query head), which walks its sequence ``BLOCK_N`` tokens at a time. Two jobs are left to
``@triton.jit`` functions passed in as compile-time arguments:

* ``ADDRESSES(table_row_ptr, pos, seq_len, head, table_width, num_blocks, stride_kb,
  stride_kh, stride_kt, GROUP, BLOCK_SIZE)`` -> ``(rows, valid)``: for each position of the
  tile, the element offset of its key row in the cache (its physical block, its query
  head's K/V head, its slot) and whether it may be read (exercise task 09.1);
* ``FOLD(m_i, l_i, acc, scores, v)`` -> ``(m_i, l_i, acc)``: one tile folded into the
  running online-softmax state (task 09.2).

The library's own versions (``reference_addresses``, ``reference_fold``) stand in for the
piece a check is not testing. The skeleton keeps the interpreter safe from wrong answers:
the block table it passes has spare ``-1`` columns and a spare row, and it never loads a
row whose offset lies outside the cache, whatever ``ADDRESSES`` returns.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch
import triton
import triton.language as tl

# Tokens per tile: small, so that the checks' short sequences span several tiles.
BLOCK_N = 8


@triton.jit
def reference_addresses(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                        stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The library's answer to task 09.1 (used when a check tests the other piece)."""
    logical = pos // BLOCK_SIZE
    in_row = (pos < seq_len) & (logical < table_width)
    block = tl.load(table_row_ptr + logical, mask=in_row, other=-1).to(tl.int64)
    valid = in_row & (block >= 0) & (block < num_blocks)
    rows = block * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, valid


@triton.jit
def reference_fold(m_i, l_i, acc, scores, v):
    """The library's answer to task 09.2 (used when a check tests the other piece)."""
    m_new = tl.maximum(m_i, tl.max(scores, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(scores - m_safe)
    return m_new, alpha * l_i + tl.sum(p, 0), alpha * acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def _decode_skeleton_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
    stride_qs, stride_qh, stride_kb, stride_kh, stride_kt, stride_ts, stride_os, stride_oh,
    scale, table_width, num_blocks, cache_numel, head_dim,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ADDRESSES: tl.constexpr, FOLD: tl.constexpr,
):
    """Decode attention of one query head of one sequence over its cached tokens."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(lens_ptr + seq)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)

    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        rows, valid = ADDRESSES(table_ptr + seq * stride_ts, pos, seq_len, head, table_width, num_blocks,
                                stride_kb, stride_kh, stride_kt, GROUP, BLOCK_SIZE)
        rows = rows.to(tl.int64)
        # Whatever ADDRESSES says, never read outside the cache (the interpreter checks no bounds).
        safe = valid & (rows >= 0) & (rows + head_dim <= cache_numel)
        mask = safe[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        scores = tl.where(safe, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_i, l_i, acc = FOLD(m_i, l_i, acc, scores, v)

    out = acc / tl.where(l_i > 0, l_i, 1.0)  # a sequence of length 0 attends to nothing: zeros
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def run_decode_skeleton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    addresses: Any = None,
    fold: Any = None,
) -> torch.Tensor:
    """Decode attention through the skeleton kernel, with the given ``@triton.jit`` pieces.

    Shapes as in :func:`paged_kv_lib.attention.paged_attention`: ``q`` is ``[num_seqs,
    num_q_heads, head_dim]``, the caches ``[num_blocks, num_kv_heads, block_size,
    head_dim]``, ``block_tables`` int ``[num_seqs, width]`` padded with -1. The result
    has ``q``'s shape, dtype and device. Under ``TRITON_INTERPRET=1`` the kernel runs on
    the CPU, program by program; otherwise it runs compiled on the GPU (CPU inputs are
    moved there and the result moved back), so the same notebook cell works on both.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, num_kv_heads = k_cache.shape[:2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    home = q.device
    if os.environ.get("TRITON_INTERPRET") != "1" and home.type != "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no GPU: set os.environ['TRITON_INTERPRET'] = '1' before triton is imported "
                               "to run the kernel on the CPU")
        q, k_cache, v_cache = (t.to("cuda") for t in (q, k_cache, v_cache))
    q = q.contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    width = block_tables.shape[1]
    # Spare -1 columns (a tile's worth and then some) and a spare row: a table read one block
    # or one row too far still lands inside this buffer.
    table = torch.full((num_seqs + 1, width + BLOCK_N + 2), -1, dtype=torch.int32, device=q.device)
    table[:num_seqs, :width] = block_tables.to(torch.int32)
    lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty_like(q)
    try:
        _launch(q, k_cache, v_cache, table, lens, out, scale, width, num_blocks, num_kv_heads, addresses, fold)
    except Exception as exc:
        # An untouched task: its jit function raises NotImplementedError (interpreter) or
        # cannot compile (CUDA). Either way the learner should see the one-line "not written".
        found = _UNWRITTEN.search(str(exc))
        if found:
            raise NotImplementedError(found.group(1)) from None
        raise
    return out.to(home)


_UNWRITTEN = re.compile(r"NotImplementedError\(['\"](Task [0-9]{2}\.[0-9]+[^'\"]*)['\"]\)")


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
            lens: torch.Tensor, out: torch.Tensor, scale: float, width: int, num_blocks: int,
            num_kv_heads: int, addresses: Any, fold: Any) -> None:
    num_seqs, num_q_heads, head_dim = q.shape
    block_size = k_cache.shape[2]
    _decode_skeleton_kernel[(num_seqs, num_q_heads)](
        q, k_cache, v_cache, table, lens, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), table.stride(0),
        out.stride(0), out.stride(1),
        float(scale), width, num_blocks, k_cache.numel(), head_dim,
        GROUP=num_q_heads // num_kv_heads, BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N,
        BLOCK_D=triton.next_power_of_2(head_dim),
        ADDRESSES=reference_addresses if addresses is None else addresses,
        FOLD=reference_fold if fold is None else fold,
        enable_fp_fusion=True,
    )
