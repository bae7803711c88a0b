# expect: the cache's layout is (block, head, offset, dim)
import torch


def read_tokens(k_cache, table, positions):
    """Two bugs fixed; slots still index a reshape that ignores where the heads sit."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    pos = torch.tensor(list(positions), dtype=torch.int64)
    if bool(((pos < 0) | (pos >= len(table) * block_size)).any()):
        raise ValueError("a position has no slot")
    blocks = torch.tensor(list(table), dtype=torch.int64)[pos // block_size]
    slots = blocks * block_size + pos % block_size
    return k_cache.reshape(-1, num_heads, head_dim)[slots]
