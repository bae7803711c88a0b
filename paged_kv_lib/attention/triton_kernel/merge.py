"""The split-K merge kernel: combines the partial softmax results of a sequence's splits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _merge_splits_kernel(
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    num_q_heads,
    stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """Combine the splits of one (sequence, query head): rescale each to the global max.

    Grid: ``(num_seqs, num_q_heads)``. A split that saw no tokens has max -inf and sum 0,
    so its weight is 0; if every split is empty the output is 0.
    """
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    part = (seq * num_q_heads + head) * NUM_SPLITS + offs_s
    m = tl.load(part_max_ptr + part)
    sums = tl.load(part_sum_ptr + part)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=d_mask[None, :], other=0.0)

    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m - m_max)
    total = tl.sum(weight * sums, 0)
    out = tl.sum(weight[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )
