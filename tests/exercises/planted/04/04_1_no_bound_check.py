# expect: must raise ValueError
import torch


def my_step_slot_mapping(tables, num_computed, num_new, block_size):
    """The slots of every new token of a step; forgets that a table can be too short."""
    slots = []
    for table, done, new in zip(tables, num_computed, num_new):
        for p in range(done, done + new):
            slots.append(table[min(p // block_size, len(table) - 1)] * block_size + p % block_size)
    return torch.tensor(slots, dtype=torch.int64)
