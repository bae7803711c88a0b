# expect: uses paged_kv_lib.free_queue
from paged_kv_lib.free_queue import FreeBlockQueue


def remove_from_free_queue(prev, next_, block_id):
    """The library's queue, built over the given lists."""
    queue = FreeBlockQueue.__new__(FreeBlockQueue)
    queue._prev, queue._next = prev, next_
    queue.remove(block_id)
