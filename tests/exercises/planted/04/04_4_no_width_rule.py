# expect: the width rule
import torch


def my_gather_batch(cache, block_tables, seq_lens):
    """Refuses a -1 entry but never compares the blocks needed with the row's width."""
    num_seqs, width = block_tables.shape
    _, heads, size, dim = cache.shape
    longest = int(seq_lens.max()) if num_seqs else 0
    out = torch.zeros(num_seqs, longest, heads, dim, dtype=cache.dtype)
    for b in range(num_seqs):
        n = int(seq_lens[b])
        row = block_tables[b, : -(-n // size)].long()
        if bool((row < 0).any()):
            raise ValueError("the row reaches padding")
        n = min(n, len(row) * size)
        for p in range(n):
            out[b, p] = cache[row[p // size], :, p % size, :]
    return out
