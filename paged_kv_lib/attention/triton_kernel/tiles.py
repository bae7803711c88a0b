"""Two helpers every kernel inlines: address translation of a K/V tile, and one online-softmax step."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kv_tile_offsets(
    block_tables_ptr,
    table_row,  # int64 offset of this sequence's row in the block table
    stride_btb,
    pos,  # [BLOCK_N] logical token positions
    in_range,  # [BLOCK_N] which positions this program may read
    max_blocks,  # the block table's width: entries per row
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
):
    """Translate logical positions into (physical block, slot) and say which are readable.

    The block table is only read where ``in_range`` holds and the entry lies inside this
    sequence's row (a length longer than the row must not run into the next row), and a
    block id outside ``[0, num_blocks)`` (a -1 pad, say) is never dereferenced: its token
    is masked out.
    """
    logical_block = pos // BLOCK_SIZE
    in_row = in_range & (logical_block < max_blocks)
    physical_block = tl.load(
        block_tables_ptr + table_row + logical_block * stride_btb, mask=in_row, other=-1
    ).to(tl.int64)
    valid = in_row & (physical_block >= 0) & (physical_block < num_blocks)
    slot = pos % BLOCK_SIZE
    return physical_block, slot, valid


@triton.jit
def _online_softmax_step(
    q,  # [M, BLOCK_D] queries
    k,  # [BLOCK_N, BLOCK_D]
    v,  # [BLOCK_N, BLOCK_D]
    visible,  # [M, BLOCK_N] which (query, key) pairs may attend
    m_i,  # [M] running max score (log2 units)
    l_i,  # [M] running sum of exp2(score - m_i)
    acc,  # [M, BLOCK_D] running sum of exp2(score - m_i) * v
    scale_log2,
    DOT_IN_FP32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Fold one K/V tile into the running softmax; returns the new ``(m_i, l_i, acc)``."""
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(scores, 1))
    # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead so the
    # exponentials below give 0 rather than NaN (-inf - -inf).
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)  # rescales what was summed under the old max
    p = tl.exp2(scores - m_safe[:, None])

    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc
