# expect: the first one past the table's
import torch


def read_tokens(k_cache, table, positions):
    """Two bugs fixed; the bound still lets the first position past the table through."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    pos = torch.tensor(list(positions), dtype=torch.int64)
    if bool(((pos < 0) | (pos > len(table) * block_size)).any()):
        raise ValueError("a position has no slot")
    blocks = torch.tensor(list(table), dtype=torch.int64)[pos // block_size]
    return k_cache[blocks, :, pos % block_size, :]
