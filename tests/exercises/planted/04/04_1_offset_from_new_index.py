# expect: the offset in the block comes from the token's position in the sequence
import torch


def my_step_slot_mapping(tables, num_computed, num_new, block_size):
    """The slots of every new token of a step, sequence after sequence (int64)."""
    slots = []
    for table, done, new in zip(tables, num_computed, num_new):
        if done + new > len(table) * block_size:
            raise ValueError("the step reaches past the table")
        for i in range(new):
            block = table[(done + i) // block_size]
            slots.append(block * block_size + i % block_size)
    return torch.tensor(slots, dtype=torch.int64)
