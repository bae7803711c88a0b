# expect: the kernel is the part that breaks
@triton.jit
def paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    scale, num_blocks, max_blocks, num_q_heads,
    stride_qs, stride_qh, stride_kb, stride_kh, stride_kt, stride_bts, stride_os, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    """Attention of one K/V head's group of query heads, over one split of one sequence."""
    seq = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    n_tokens = tl.load(seq_lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(n_tokens, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, n_tokens)

    g = tl.arange(0, BLOCK_G)
    col = tl.arange(0, HEAD_DIM)
    head = kv * GROUP + g
    live = g < GROUP
    queries = tl.load(q_ptr + seq * stride_qs + head[:, None] * stride_qh + col[None, :],
                      mask=live[:, None], other=0.0).to(tl.float32)
    top = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for first in range(lo, hi, BLOCK_N):
        pos = first + tl.arange(0, BLOCK_N)
        inside = (pos < hi) & (pos // BLOCK_SIZE < max_blocks)
        ids = tl.load(block_tables_ptr + seq * stride_bts + pos // BLOCK_SIZE, mask=inside, other=-1).to(tl.int64)
        ok = inside & (ids >= 0) & (ids < num_blocks)
        where = ids[:, None] * stride_kb + kv * stride_kh + (pos % BLOCK_SIZE)[:, None] * stride_kt + col[None, :]
        keys = tl.load(k_cache_ptr + where, mask=ok[:, None], other=0.0).to(tl.float32)
        vals = tl.load(v_cache_ptr + where, mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.dot(queries, tl.trans(keys), input_precision="ieee") * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        new_top = tl.maximum(top, tl.max(s, 1))
        ref = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row with nothing visible yet
        shrink = tl.exp(top - ref)
        w = tl.exp(s - ref[:, None])
        total = total * shrink + tl.sum(w, 1)
        acc = acc + tl.dot(w, vals, input_precision="ieee")
        top = new_top
    if NUM_SPLITS == 1:
        res = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_os + head[:, None] * stride_oh + col[None, :],
                 res.to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:
        slot = (seq * num_q_heads + head) * NUM_SPLITS + split
        tl.store(part_max_ptr + slot, top, mask=live)
        tl.store(part_sum_ptr + slot, total, mask=live)
        tl.store(part_acc_ptr + slot[:, None] * HEAD_DIM + col[None, :], acc, mask=live[:, None])


@triton.jit
def merge_splits_kernel(out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, num_q_heads, stride_os, stride_oh,
                        HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """One (sequence, query head): its splits' partial states merged into the output row."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    first = (seq * num_q_heads + head) * NUM_SPLITS
    s = tl.arange(0, NUM_SPLITS)
    col = tl.arange(0, HEAD_DIM)
    tops = tl.load(part_max_ptr + first + s)
    sums = tl.load(part_sum_ptr + first + s)
    accs = tl.load(part_acc_ptr + (first + s)[:, None] * HEAD_DIM + col[None, :])
    best = tl.max(tops, 0)
    best = tl.where(best == float("-inf"), 0.0, best)  # every split empty: all weights exp(-inf) = 0
    w = tl.exp(tops - best)
    total = tl.sum(w * sums, 0)
    res = tl.sum(w[:, None] * accs, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + col, res.to(out_ptr.dtype.element_ty))
