"""The decode kernel: one query token per sequence, one program per (sequence, K/V head, split)."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _kv_tile_offsets, _online_softmax_step


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    scale_log2, num_blocks, max_blocks, num_q_heads,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_bts, stride_btb,
    stride_os, stride_oh, stride_od,
    GROUP: tl.constexpr,  # query heads per K/V head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two >= 16 (tl.dot's minimum)
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    BLOCK_N: tl.constexpr,  # tokens per tile
    NUM_SPLITS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Attention of one sequence's query heads (one K/V head's group) over one token range.

    Grid: ``(num_seqs, num_kv_heads, NUM_SPLITS)``. With one split the normalised output
    is written straight to ``out``; otherwise the unnormalised partial sums go to the
    ``part_*`` buffers for ``_merge_splits_kernel``. Each sequence is cut into splits by
    its own length, so a short sequence in a batch of long ones gets short splits.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # A length the row cannot hold is cut to the row (value checks report it; unchecked,
    # the kernel must still not read the next sequence's row or past the table).
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    seq_len = tl.maximum(tl.minimum(seq_len, max_blocks * BLOCK_SIZE), 0)
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_g
    row_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM

    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)

    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n
        block, slot, valid = _kv_tile_offsets(
            block_tables_ptr, seq * stride_bts, stride_btb, pos, pos < end, max_blocks, num_blocks, BLOCK_SIZE
        )
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(
            k_cache_ptr + block[:, None] * stride_kb + kv_head * stride_kh
            + slot[:, None] * stride_kt + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )
        v = tl.load(
            v_cache_ptr + block[:, None] * stride_vb + kv_head * stride_vh
            + slot[:, None] * stride_vt + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )
        m_i, l_i, acc = _online_softmax_step(
            q, k, v, valid[None, :], m_i, l_i, acc, scale_log2, DOT_IN_FP32, INPUT_PRECISION
        )

    if NUM_SPLITS == 1:
        # A sequence with no tokens has l_i == 0 and acc == 0: its output is 0.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )
    else:
        # Partial buffers are contiguous [num_seqs, num_q_heads, NUM_SPLITS(, HEAD_DIM)].
        part = (seq * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_max_ptr + part, m_i, mask=row_mask)
        tl.store(part_sum_ptr + part, l_i, mask=row_mask)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
            acc,
            mask=row_mask[:, None] & d_mask[None, :],
        )
