# expect: a rewrite, not a repair
def split_k_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale=None):
    """A plain gather and softmax per sequence, no splits: it never looks at the given code."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32)
    size = k_cache.shape[2]
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        pos = torch.arange(n)
        ids = block_tables[i].long()[pos // size]
        keys = k_cache[ids, :, pos % size].float().repeat_interleave(group, dim=1)  # [n, q_heads, d]
        vals = v_cache[ids, :, pos % size].float().repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[i].float(), keys) * scale, dim=-1)
        out[i] = torch.einsum("hn,nhd->hd", weights, vals)
    return out.to(q.dtype)
