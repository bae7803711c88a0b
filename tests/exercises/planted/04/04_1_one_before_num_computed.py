# expect: not num_computed - 1
import torch


def my_step_slot_mapping(tables, num_computed, num_new, block_size):
    """The slots of every new token of a step, sequence after sequence (int64)."""
    slots = []
    for table, done, new in zip(tables, num_computed, num_new):
        if done + new > len(table) * block_size:
            raise ValueError("the step reaches past the table")
        for p in range(max(done - 1, 0), max(done - 1, 0) + new):
            if p // block_size < len(table):
                slots.append(table[p // block_size] * block_size + p % block_size)
    return torch.tensor(slots, dtype=torch.int64)
