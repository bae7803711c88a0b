# expect: must run your kernels
def make_decode_attention(kernel, merge):
    """Glue that ignores the kernels and gathers K/V in plain torch."""
    def decode_attention(q, k_cache, v_cache, block_tables, seq_lens):
        out = torch.empty_like(q)
        group = q.shape[1] // k_cache.shape[1]
        for i, n in enumerate(seq_lens.tolist()):
            blocks = block_tables[i, : -(-n // k_cache.shape[2])].long()
            k = k_cache[blocks].transpose(0, 1).reshape(k_cache.shape[1], -1, q.shape[-1])[:, :n]
            v = v_cache[blocks].transpose(0, 1).reshape(v_cache.shape[1], -1, q.shape[-1])[:, :n]
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            scores = (k @ q[i].unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])
            out[i] = (scores.softmax(-1).unsqueeze(1) @ v).squeeze(1)
        return out

    return decode_attention
