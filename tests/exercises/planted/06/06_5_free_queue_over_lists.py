# expect: uses paged_kv_lib.free_queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.free_queue import FreeBlockQueue


def remove_from_free_queue(prev, next_, block_id):
    """The library's queue, built over the given lists."""
    queue = FreeBlockQueue.__new__(FreeBlockQueue)
    queue._prev, queue._next = prev, next_
    queue.remove(block_id)
