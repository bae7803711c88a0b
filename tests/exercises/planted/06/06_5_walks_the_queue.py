# expect: your removal walks the queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def remove_from_free_queue(prev, next_, block_id):
    """Unlink `block_id`, finding it by walking from the head."""
    sentinel = len(next_) - 1
    if type(block_id) is not int or not 0 <= block_id < sentinel:
        raise ValueError(f"{block_id!r} is not a block id")
    node = next_[sentinel]
    while node != sentinel and node != block_id:
        node = next_[node]
    if node == sentinel:
        raise ValueError(f"block {block_id} is not in the free queue")
    left, right = prev[block_id], next_[block_id]
    next_[left], prev[right] = right, left
    prev[block_id] = next_[block_id] = NOT_QUEUED
