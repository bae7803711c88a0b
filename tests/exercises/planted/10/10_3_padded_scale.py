# expect: the padded width
def make_decode_attention(kernel, merge):
    """Glue that scales the scores by the padded width's square root."""
    def decode_attention(q, k_cache, v_cache, block_tables, seq_lens):
        head_dim = q.shape[-1]
        width = max(16, 1 << (head_dim - 1).bit_length())
        q, k_cache, v_cache = (F.pad(t, (0, width - head_dim)) for t in (q, k_cache, v_cache))
        out = paged_decode(kernel, merge, q, k_cache, v_cache, block_tables, seq_lens, 1 / math.sqrt(width), 2)
        return out[..., :head_dim]

    return decode_attention
