# expect: not even for the ids before the bad one
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def take_from_free_queue(prev, next_, block_ids):
    """Checks each block just before unlinking it, so a bad id late in the list comes too late."""
    sentinel = len(next_) - 1
    for block_id in block_ids:
        if type(block_id) is not int or not 0 <= block_id < sentinel:
            raise ValueError(f"{block_id!r} is not a block id")
        if next_[block_id] == NOT_QUEUED:
            raise ValueError(f"block {block_id} is not in the free queue")
        before, after = prev[block_id], next_[block_id]
        next_[before], prev[after] = after, before
        prev[block_id] = next_[block_id] = NOT_QUEUED
