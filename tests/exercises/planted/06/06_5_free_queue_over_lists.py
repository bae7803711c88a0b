# expect: uses paged_kv_lib.block_manager
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.block_manager import FreeBlockQueue


def take_from_free_queue(prev, next_, block_ids):
    """The library's queue, built over the given lists."""
    queue = FreeBlockQueue.__new__(FreeBlockQueue)
    queue._prev, queue._next = prev, next_
    for block_id in block_ids:
        queue.remove(block_id)
