# expect: the heads sit between the block and the offset
import torch


def my_gather_batch(cache, block_tables, seq_lens):
    """Gathers whole blocks and reshapes them to tokens without moving the heads."""
    num_seqs, width = block_tables.shape
    _, heads, size, dim = cache.shape
    longest = int(seq_lens.max()) if num_seqs else 0
    out = torch.zeros(num_seqs, longest, heads, dim, dtype=cache.dtype)
    for b in range(num_seqs):
        n = int(seq_lens[b])
        used = -(-n // size)
        row = block_tables[b, :used].long()
        if used > width or bool((row < 0).any()):
            raise ValueError("the row is too short")
        out[b, :n] = cache[row].reshape(-1, heads, dim)[:n]
    return out
