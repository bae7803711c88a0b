# expect: not the contract's refusal (a ValueError)
import torch


def read_tokens(k_cache, table, num_tokens, positions):
    """A rewrite that lets the table's own IndexError refuse positions past its end."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    if any(position < 0 for position in positions):
        raise ValueError(f"positions {positions}: a negative position holds no token")
    blocks = torch.tensor([table[position // block_size] for position in positions], dtype=torch.int64)
    offsets = torch.tensor([position % block_size for position in positions], dtype=torch.int64)
    return k_cache[blocks, :, offsets, :]
