# expect: some blocks you take are neighbours in the queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def take_from_free_queue(prev, next_, block_ids):
    """Reads every block's neighbours first and relinks them after: wrong when two taken blocks are neighbours."""
    sentinel = len(next_) - 1
    for block_id in block_ids:
        if type(block_id) is not int or not 0 <= block_id < sentinel:
            raise ValueError(f"{block_id!r} is not a block id")
        if next_[block_id] == NOT_QUEUED:
            raise ValueError(f"block {block_id} is not in the free queue")
    if len(set(block_ids)) != len(block_ids):
        raise ValueError("a block is named twice")
    links = [(prev[b], next_[b]) for b in block_ids]
    for block_id, (before, after) in zip(block_ids, links):
        next_[before], prev[after] = after, before
    for block_id in block_ids:
        prev[block_id] = next_[block_id] = NOT_QUEUED
