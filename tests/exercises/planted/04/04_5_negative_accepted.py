# expect: a negative position was accepted
import torch


def read_tokens(k_cache, table, positions):
    """Two bugs fixed; negative positions still read the table from its end."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    pos = torch.tensor(list(positions), dtype=torch.int64)
    if bool((pos >= len(table) * block_size).any()):
        raise ValueError("a position has no slot")
    blocks = torch.tensor(list(table), dtype=torch.int64)[pos // block_size]
    return k_cache[blocks, :, pos % block_size, :]
