# expect: but not those of that position's slot
import torch


def read_tokens(k_cache, table, num_tokens, positions):
    """Two bugs fixed; the rows still come from a reshape that ignores where the heads sit."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    out = torch.zeros(len(positions), num_heads, head_dim, dtype=k_cache.dtype)
    rows = k_cache.reshape(num_blocks * block_size, num_heads, head_dim)
    for i, position in enumerate(positions):
        if not 0 <= position < num_tokens:
            raise ValueError(f"position {position} is not one of the sequence's {num_tokens} tokens")
        block = table[position // block_size]
        out[i] = rows[block * block_size + position % block_size]
    return out
