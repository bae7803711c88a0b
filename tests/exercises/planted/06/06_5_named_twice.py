# expect: appears twice
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def take_from_free_queue(prev, next_, block_ids):
    """Checks every id against the queue as it was, so a block named twice is unlinked twice."""
    sentinel = len(next_) - 1
    for block_id in block_ids:
        if type(block_id) is not int or not 0 <= block_id < sentinel:
            raise ValueError(f"{block_id!r} is not a block id")
        if next_[block_id] == NOT_QUEUED:
            raise ValueError(f"block {block_id} is not in the free queue")
    links = {block_id: (prev[block_id], next_[block_id]) for block_id in block_ids}
    for block_id in block_ids:
        before, after = links[block_id]
        next_[before], prev[after] = after, before
        prev[block_id] = next_[block_id] = NOT_QUEUED
