"""Check of task 06.5: taking the blocks of a prefix hit out of the linked free queue.

The learner's function gets the queue's two link arrays as :class:`CountingList` objects, so
the check sees how many entries it read (the work must grow with the blocks taken, not with
the queue). Expected arrays come from the library's :class:`FreeBlockQueue` removing the same
blocks one by one.
"""

from __future__ import annotations

import random
from typing import Callable, List

from paged_kv_course.instruments import CountingList
from paged_kv_lib.block_manager import NOT_QUEUED, FreeBlockQueue
from ._common import call_learner, expect_raises, fail, passed

Take = Callable[[List[int], List[int], List[int]], None]


def _arrays(queue: FreeBlockQueue) -> tuple:
    return list(queue._prev), list(queue._next)


def _refusal(queue: FreeBlockQueue, block_ids: List[int], size: int) -> str:
    """Why ``block_ids`` must be refused, or "" when every id is a distinct queued block."""
    seen = set()
    for block_id in block_ids:
        if type(block_id) is not int:
            return f"{block_id!r} is not a block id (an int)"
        if block_id == size:
            return f"{size} is the sentinel, not a block: taking it would cut the queue off from its ends"
        if not 0 <= block_id < size:
            return (f"{block_id} is not a block id (they are 0..{size - 1}); a negative index would reach "
                    "the entries at the end of the lists")
        if block_id not in queue:
            return f"block {block_id} is not in the queue"
        if block_id in seen:
            return f"block {block_id} appears twice: it can leave the queue only once"
        seen.add(block_id)
    return ""


def _show_queue(queue: FreeBlockQueue) -> str:
    order = list(queue)
    return str(order) if len(order) <= 16 else f"<{len(order)} blocks>"


def _check_one(take: Take, queue: FreeBlockQueue, block_ids: List[int], size: int) -> None:
    prev, nxt = _arrays(queue)
    call = f"take_from_free_queue(prev, next_, {block_ids})  with the queue {_show_queue(queue)} (sentinel {size})"
    given_prev, given_next = CountingList(prev), CountingList(nxt)
    why = _refusal(queue, block_ids, size)
    if why:
        expect_raises(take, (given_prev, given_next, list(block_ids)), call, ValueError, why + ": raise ValueError")
        if given_prev.values != prev or given_next.values != nxt:
            raise fail(call + "  -> the arrays afterwards", "unchanged", "changed",
                       "a call that is refused must change nothing, not even for the ids before the bad one")
        return
    for block_id in block_ids:
        queue.remove(block_id)
    want_prev, want_next = _arrays(queue)
    got = call_learner(take, (given_prev, given_next, list(block_ids)), call, None)
    if got is not None:
        raise fail(call, None, got, "change prev and next_ in place and return None")
    reads, budget = given_prev.reads + given_next.reads, 4 * len(block_ids) + 4
    if reads > budget:
        raise fail(call + "  -> entries of prev and next_ read", f"at most {budget}",
                   f"{reads}, taking {len(block_ids)} from a queue of {len(queue) + len(block_ids)} blocks",
                   "your code walks the queue (or scans a list): the work must grow with the blocks taken, "
                   "not with the queue")
    got_prev, got_next = given_prev.values, given_next.values
    unmarked = [b for b in block_ids if got_prev[b] != NOT_QUEUED or got_next[b] != NOT_QUEUED]
    if unmarked:
        raise fail(call + f"  -> prev and next_ at {unmarked}", f"{NOT_QUEUED} in both",
                   [(got_prev[b], got_next[b]) for b in unmarked],
                   "a block taken out must be marked as not queued, so that taking it again is refused")
    for name, want, got_arr in (("next_", want_next, got_next), ("prev", want_prev, got_prev)):
        if got_arr != want:
            bad = [i for i in range(len(want)) if got_arr[i] != want[i]]
            adjacent = any(prev[b] in block_ids or nxt[b] in block_ids for b in block_ids)
            hint = ("the queue is broken afterwards: the blocks left must stay linked, in their order, "
                    f"with the sentinel {size} at both ends")
            if adjacent:
                hint += "; here some blocks you take are neighbours in the queue"
            raise fail(call + f"  -> {name} afterwards, at {bad}", [want[i] for i in bad],
                       [got_arr[i] for i in bad], hint)


def check_take_from_free_queue(take_from_free_queue: Take) -> None:
    """Task 06.5: ``take_from_free_queue(prev, next_, block_ids)`` takes distinct queued blocks out of
    the linked free queue in O(len(block_ids)); anything else is refused with nothing changed."""
    size = 8
    queue = FreeBlockQueue(size, [3, 0, 5, 1, 7, 6])
    cases: List[List[int]] = [
        [5],          # one block in the middle
        [],           # nothing to take
        [8],          # the sentinel
        [-1],         # not a block id
        [9],
        [1, 2],       # 2 was never queued: 1 must stay
        [0, 0],       # the same block twice
        [0, True],    # not an int
        [3],          # the head
        [6],          # the tail
        [1, 0],       # neighbours, taken in queue order reversed
        [7],          # the last one
        [7],          # taken already
    ]
    for block_ids in cases:
        _check_one(take_from_free_queue, queue, block_ids, size)
    rng = random.Random(65)
    for size in (12, 40, 400):
        ids = list(range(size))
        rng.shuffle(ids)
        queue = FreeBlockQueue(size, ids[: size - 3])
        for _ in range(10):
            order = list(queue)
            start = rng.randrange(max(1, len(order)))
            run = order[start:start + rng.randrange(1, 5)]  # a run of neighbours, as a hit's chain often is
            if rng.random() < 0.5:
                run = rng.sample(order, min(len(order), rng.randrange(1, 4)))
            if rng.random() < 0.2:
                run = run + [rng.randrange(size + 1)]  # maybe a bad one at the end
            rng.shuffle(run)
            _check_one(take_from_free_queue, queue, run, size)
    passed("06.5")
