# expect: the wrong grouped-query head
def split_k_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale=None):
    """Decode attention the split-K way: one partial state per chunk of each sequence, merged; q's dtype."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n)
        ids = block_tables[i].long()[pos // block_size]
        keys = k_cache[ids, :, pos % block_size].float().transpose(0, 1)  # [kv_heads, n, head_dim]
        vals = v_cache[ids, :, pos % block_size].float().transpose(0, 1)
        queries = q[i].float().reshape(group, num_kv_heads, head_dim).transpose(0, 1)  # [kv_heads, group, d]
        state = (torch.full((num_kv_heads, group), float("-inf")), torch.zeros(num_kv_heads, group),
                 torch.zeros(num_kv_heads, group, head_dim))
        chunk = max(1, -(-n // num_splits))
        for start in range(0, n, chunk):
            part_k, part_v = keys[:, start:start + chunk], vals[:, start:start + chunk]
            scores = queries @ part_k.transpose(1, 2) * scale  # [kv_heads, group, c]
            top = scores.amax(dim=-1)
            weights = torch.exp(scores - top[..., None])
            state = merge_softmax_states(state, (top, weights.sum(dim=-1), weights @ part_v))
        _, total, acc = state
        safe_total = torch.where(total > 0, total, torch.ones_like(total))  # empty sequence: stays zero
        out[i] = (acc / safe_total[..., None]).transpose(0, 1).reshape(num_q_heads, head_dim)
    return out.to(q.dtype)