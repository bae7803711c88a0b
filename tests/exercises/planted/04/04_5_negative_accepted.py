# expect: a negative position was accepted


def read_tokens(k_cache, table, num_tokens, positions):
    """A rewrite that bounds positions from above only: negative ones read the table from its end."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    if any(position >= num_tokens for position in positions):
        raise ValueError(f"positions {positions}: the sequence holds {num_tokens} tokens")
    blocks = [table[position // block_size] for position in positions]
    offsets = [position % block_size for position in positions]
    return k_cache[blocks, :, offsets, :]
