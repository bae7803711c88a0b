# expect: the padding is 0, a real block id
import torch


def my_step_block_tables(tables, num_computed, num_new, block_size, max_blocks=None):
    """Block tables padded with 0 instead of -1."""
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else max_blocks
    if width < longest:
        raise ValueError("too narrow")
    lens = [d + n for d, n in zip(num_computed, num_new)]
    for t, n in zip(tables, lens):
        if n > len(t) * block_size:
            raise ValueError("too short")
    grid = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        grid[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return grid, torch.tensor(lens, dtype=torch.int32)
