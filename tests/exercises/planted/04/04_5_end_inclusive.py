# expect: off by one at the end
import torch


def read_tokens(k_cache, table, num_tokens, positions):
    """A rewrite whose bound lets the position just past the last token through."""
    num_blocks, num_heads, block_size, head_dim = k_cache.shape
    if any(not 0 <= position <= num_tokens for position in positions):
        raise ValueError(f"positions {positions}: the sequence holds {num_tokens} tokens")
    blocks = torch.tensor([table[position // block_size] for position in positions], dtype=torch.int64)
    offsets = torch.tensor([position % block_size for position in positions], dtype=torch.int64)
    return k_cache[blocks, :, offsets, :]
