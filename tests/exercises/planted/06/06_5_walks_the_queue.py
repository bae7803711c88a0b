# expect: your code walks the queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def take_from_free_queue(prev, next_, block_ids):
    """Finds the queued blocks by walking the queue from its head."""
    sentinel = len(next_) - 1
    queued, node = set(), next_[sentinel]
    while node != sentinel:
        queued.add(node)
        node = next_[node]
    for block_id in block_ids:
        if type(block_id) is not int or block_id not in queued:
            raise ValueError(f"{block_id!r} is not a queued block")
    if len(set(block_ids)) != len(block_ids):
        raise ValueError("a block is named twice")
    for block_id in block_ids:
        before, after = prev[block_id], next_[block_id]
        next_[before], prev[after] = after, before
        prev[block_id] = next_[block_id] = NOT_QUEUED
