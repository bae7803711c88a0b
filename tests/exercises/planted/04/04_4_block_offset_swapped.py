# expect: block and offset are swapped
import torch


def my_gather_batch(cache, block_tables, seq_lens):
    """Takes the block from p % block_size and the offset from p // block_size."""
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
        for p in range(n):
            out[b, p] = cache[row[p % size], :, p // size, :]
    return out
