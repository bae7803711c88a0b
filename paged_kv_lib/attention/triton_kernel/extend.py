"""The extend (prefill) kernel: several new query tokens per sequence, attending causally."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _kv_tile_offsets, _online_softmax_step


@triton.jit
def _paged_extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr,
    scale_log2, num_blocks, max_blocks,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_bts, stride_btb,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per tile; BLOCK_Q * BLOCK_G >= 16
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Causal attention of one sequence's new tokens (one K/V head's group), ``BLOCK_Q`` at a time.

    Grid: ``(num_seqs, programs_per_seq, num_kv_heads)``. Program ``p`` takes this
    sequence's query tiles ``p, p + programs_per_seq, ...``, so every new token is
    covered whatever grid the launcher chose (a short ``max_query_len`` hint, or a grid
    capped at CUDA's 65,535 in its second dimension, only means more tiles per program).

    Row ``r`` of a tile is query token ``r // BLOCK_G`` of the tile and query head
    ``r % BLOCK_G`` of the group. New token ``j`` sits at position
    ``seq_len - query_len + j`` and sees every key at or before it.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    query_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64) - q_start
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    context_len = seq_len - query_len  # tokens cached before the new ones
    # Keys past the row's last block do not exist for this sequence (see the decode kernel).
    key_limit = tl.minimum(seq_len, max_blocks * BLOCK_SIZE)

    offs_r = tl.arange(0, BLOCK_Q * BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_r % BLOCK_G
    head_mask = offs_r % BLOCK_G < GROUP
    d_mask = offs_d < HEAD_DIM

    num_q_tiles = tl.cdiv(query_len, BLOCK_Q)
    for q_tile in range(tl.program_id(1), num_q_tiles, tl.num_programs(1)):
        q_idx = q_tile * BLOCK_Q + offs_r // BLOCK_G
        row_mask = (q_idx < query_len) & head_mask
        q_pos = context_len + q_idx

        q = tl.load(
            q_ptr + (q_start + q_idx)[:, None] * stride_qt + heads[:, None] * stride_qh
            + offs_d[None, :] * stride_qd,
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )

        m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_Q * BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], dtype=tl.float32)

        # Keys past the last query of this tile are invisible to all its rows.
        end = tl.minimum(key_limit, context_len + (q_tile + 1) * BLOCK_Q)
        for tile_start in range(0, end, BLOCK_N):
            pos = tile_start + offs_n
            block, slot, valid = _kv_tile_offsets(
                block_tables_ptr, seq * stride_bts, stride_btb, pos, pos < end, max_blocks, num_blocks,
                BLOCK_SIZE,
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
            visible = valid[None, :] & (pos[None, :] <= q_pos[:, None]) & row_mask[:, None]
            m_i, l_i, acc = _online_softmax_step(
                q, k, v, visible, m_i, l_i, acc, scale_log2, DOT_IN_FP32, INPUT_PRECISION
            )

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (q_start + q_idx)[:, None] * stride_ot + heads[:, None] * stride_oh
            + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )
