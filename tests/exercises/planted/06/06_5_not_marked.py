# expect: marked as not queued
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def remove_from_free_queue(prev, next_, block_id):
    """Unlink `block_id` from the doubly linked free queue held in `prev` / `next_`, in O(1)."""
    sentinel = len(next_) - 1
    if type(block_id) is not int or not 0 <= block_id < sentinel:
        raise ValueError(f"{block_id!r} is not a block id: blocks are 0..{sentinel - 1}")
    left, right = prev[block_id], next_[block_id]
    if left == NOT_QUEUED:
        raise ValueError(f"block {block_id} is not in the free queue")
    next_[left], prev[right] = right, left
