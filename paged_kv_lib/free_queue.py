"""The free block queue: which blocks can be handed out next, in order.

The seed used ``collections.deque`` of block ids. That is fine until prefix caching:
a cache hit on a block that sits in the middle of the free queue must take it out,
and ``deque.remove`` scans the whole queue (O(n)). This queue is a doubly linked
list threaded through two integer arrays indexed by block id (``_prev``, ``_next``),
so popping the head, appending at the tail and removing any block are all O(1), and
no Python object is created per operation.

Invariants (checked by :meth:`check`):

* following ``_next`` from the head visits every queued block exactly once and ends
  at the tail; ``_prev`` is the mirror image;
* a block is queued exactly when ``_prev[block_id] != NOT_QUEUED``;
* ``len(queue)`` is the number of queued blocks.

Order matters: the head is the block handed out next. Freed blocks go to the tail,
so the head holds the least recently freed block (LRU eviction for cached blocks).
"""

from __future__ import annotations

from typing import Iterable, Iterator, List

from ._validate import as_count
from .errors import EmptyFreeQueueError, InvalidArgumentError, InvalidTypeError

NOT_QUEUED = -2


class FreeBlockQueue:
    """An O(1) FIFO of block ids with removal from the middle.

    Ids are ints in ``[0, num_blocks)``. A bad id (a bool, out of range, already queued
    or not queued) raises :class:`InvalidArgumentError` or :class:`InvalidTypeError`,
    popping more than is queued :class:`EmptyFreeQueueError` (an ``IndexError``, as
    ``deque`` raises); a call that raises leaves the queue as it was.
    """

    __slots__ = ("_prev", "_next", "_sentinel", "_len")

    def __init__(self, num_blocks: int, block_ids: Iterable[int] = ()) -> None:
        num_blocks = as_count(num_blocks, "num_blocks")
        # Index ``num_blocks`` is a sentinel node: its next is the head, its prev the tail.
        self._sentinel = num_blocks
        self._prev: List[int] = [NOT_QUEUED] * (num_blocks + 1)
        self._next: List[int] = [NOT_QUEUED] * (num_blocks + 1)
        self._prev[num_blocks] = num_blocks
        self._next[num_blocks] = num_blocks
        self._len = 0
        self.extend(block_ids)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block_id: object) -> bool:
        return (
            type(block_id) is int
            and 0 <= block_id < self._sentinel
            and self._prev[block_id] != NOT_QUEUED
        )

    def __iter__(self) -> Iterator[int]:
        """Block ids from head (next to be handed out) to tail."""
        node = self._next[self._sentinel]
        while node != self._sentinel:
            yield node
            node = self._next[node]

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self)})"

    def peek(self) -> int:
        """The id at the head, without removing it."""
        if self._len == 0:
            raise EmptyFreeQueueError("peek from an empty free queue")
        return self._next[self._sentinel]

    def popleft(self) -> int:
        """Remove and return the id at the head."""
        if self._len == 0:
            raise EmptyFreeQueueError("pop from an empty free queue")
        sentinel, nxt_of = self._sentinel, self._next
        block_id = nxt_of[sentinel]
        after = nxt_of[block_id]
        nxt_of[sentinel] = after
        self._prev[after] = sentinel
        self._prev[block_id] = NOT_QUEUED
        nxt_of[block_id] = NOT_QUEUED
        self._len -= 1
        return block_id

    def pop_many(self, n: int) -> List[int]:
        """Remove and return the ``n`` ids at the head, in order (one call for a whole allocation)."""
        if type(n) is not int or not 0 <= n <= self._len:
            if type(n) is not int:
                raise InvalidTypeError(f"n must be an int, got {type(n).__name__} {n!r}")
            if n < 0:
                raise InvalidArgumentError(f"n must be >= 0, got {n}")
            raise EmptyFreeQueueError(f"pop {n} from a free queue of {self._len}")
        sentinel, prev_of, next_of = self._sentinel, self._prev, self._next
        ids = []
        block_id = next_of[sentinel]
        for _ in range(n):
            ids.append(block_id)
            after = next_of[block_id]
            prev_of[block_id] = next_of[block_id] = NOT_QUEUED
            block_id = after
        next_of[sentinel] = block_id
        prev_of[block_id] = sentinel
        self._len -= n
        return ids

    def extend(self, block_ids: Iterable[int]) -> None:
        """Append several ids at the tail, in order; every id is checked before any is linked."""
        ids = list(block_ids)
        sentinel, prev_of = self._sentinel, self._prev
        for block_id in ids:
            if type(block_id) is not int or not 0 <= block_id < sentinel or prev_of[block_id] != NOT_QUEUED:
                self._refuse(block_id, queued=False)
        if len(set(ids)) != len(ids):
            twice = next(b for b in ids if ids.count(b) > 1)
            raise InvalidArgumentError(f"block {twice} appears twice in one extend")
        self.extend_unchecked(ids)

    def extend_unchecked(self, block_ids: List[int]) -> None:
        """:meth:`extend` without the checks, for a caller that knows the ids are valid, distinct and
        not queued (the block manager, releasing blocks whose ref count just fell to 0). Wrong ids
        corrupt the queue; :meth:`check` would then fail."""
        sentinel, prev_of, next_of = self._sentinel, self._prev, self._next
        tail = prev_of[sentinel]
        for block_id in block_ids:
            next_of[tail] = block_id
            prev_of[block_id] = tail
            tail = block_id
        next_of[tail] = sentinel
        prev_of[sentinel] = tail
        self._len += len(block_ids)

    def append(self, block_id: int) -> None:
        """Put ``block_id`` at the tail (it will be handed out last)."""
        if type(block_id) is not int or not 0 <= block_id < self._sentinel or self._prev[block_id] != NOT_QUEUED:
            self._refuse(block_id, queued=False)
        tail = self._prev[self._sentinel]
        self._next[tail] = block_id
        self._prev[block_id] = tail
        self._next[block_id] = self._sentinel
        self._prev[self._sentinel] = block_id
        self._len += 1

    def appendleft(self, block_id: int) -> None:
        """Put ``block_id`` at the head (it will be handed out first)."""
        if type(block_id) is not int or not 0 <= block_id < self._sentinel or self._prev[block_id] != NOT_QUEUED:
            self._refuse(block_id, queued=False)
        head = self._next[self._sentinel]
        self._prev[head] = block_id
        self._next[block_id] = head
        self._prev[block_id] = self._sentinel
        self._next[self._sentinel] = block_id
        self._len += 1

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` out of the queue, wherever it is, in O(1)."""
        if type(block_id) is not int or not 0 <= block_id < self._sentinel or self._prev[block_id] == NOT_QUEUED:
            self._refuse(block_id, queued=True)
        prev = self._prev[block_id]
        nxt = self._next[block_id]
        self._next[prev] = nxt
        self._prev[nxt] = prev
        self._prev[block_id] = NOT_QUEUED
        self._next[block_id] = NOT_QUEUED
        self._len -= 1

    def _refuse(self, block_id: object, *, queued: bool) -> None:
        """Raise the typed error for a bad id (``queued``: the call needed it in the queue)."""
        if type(block_id) is not int:
            raise InvalidTypeError(f"block id must be an int, got {type(block_id).__name__} {block_id!r}")
        if not 0 <= block_id < self._sentinel:
            raise InvalidArgumentError(f"block {block_id} is out of range: the queue holds ids 0..{self._sentinel - 1}")
        state = "not in" if queued else "already in"
        raise InvalidArgumentError(f"block {block_id} is {state} the free queue")

    def check(self) -> None:
        """Raise ``AssertionError`` if the links are inconsistent."""
        seen = 0
        node = self._sentinel
        while True:
            nxt = self._next[node]
            assert self._prev[nxt] == node, f"broken link between {node} and {nxt}"
            if nxt == self._sentinel:
                break
            seen += 1
            assert seen <= self._len, "free queue has a cycle or more nodes than its length"
            node = nxt
        assert seen == self._len, f"free queue length {self._len} but {seen} linked"
        queued = sum(1 for p in self._prev[: self._sentinel] if p != NOT_QUEUED)
        assert queued == self._len, f"{queued} blocks marked queued, length {self._len}"
