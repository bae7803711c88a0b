# expect: marked as not queued
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def take_from_free_queue(prev, next_, block_ids):
    """Unlinks each block but leaves its own links as they were."""
    sentinel = len(next_) - 1
    for block_id in block_ids:
        if type(block_id) is not int or not 0 <= block_id < sentinel:
            raise ValueError(f"{block_id!r} is not a block id")
        if next_[block_id] == NOT_QUEUED:
            raise ValueError(f"block {block_id} is not in the free queue")
    if len(set(block_ids)) != len(block_ids):
        raise ValueError("a block is named twice")
    for block_id in block_ids:
        before, after = prev[block_id], next_[block_id]
        next_[before], prev[after] = after, before
