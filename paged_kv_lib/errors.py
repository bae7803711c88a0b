"""The typed errors of paged_kv_lib.

Every error the library raises on bad input derives from :class:`PagedKVError`, and
also from the built-in class a caller would expect (``ValueError``, ``TypeError``,
``RuntimeError``), so ``except ValueError`` keeps working. A call that raises one of
these has changed nothing.
"""

from __future__ import annotations


class PagedKVError(Exception):
    """Base class of every error raised by paged_kv_lib."""


class InvalidArgumentError(PagedKVError, ValueError):
    """An argument has the right type but a value outside what the call accepts."""


class InvalidTypeError(PagedKVError, TypeError):
    """An argument has the wrong type (for example a bool or a float where an int id belongs)."""


class UnknownSequenceError(PagedKVError, ValueError):
    """The sequence id is not allocated."""


class DuplicateSequenceError(PagedKVError, ValueError):
    """The sequence id is already allocated."""


class PositionError(PagedKVError, ValueError):
    """A logical token position lies outside the sequence."""


class OutOfBlocksError(PagedKVError, RuntimeError):
    """Not enough free blocks in a pool; says how many were needed and how many are free."""

    def __init__(self, needed: int, free: int, what: str = "", pool: str = "device") -> None:
        self.needed = needed
        self.free = free
        self.pool = pool
        detail = f" to {what}" if what else ""
        super().__init__(
            f"out of {pool} blocks{detail}: need {needed}, only {free} free"
        )


class InvariantError(PagedKVError, AssertionError):
    """``check_invariants`` found the allocator in an inconsistent state (a bug)."""


class SequenceStateError(PagedKVError, ValueError):
    """The sequence is in the wrong state for the call (swapped out or not, or its last block still has room)."""


class BlocksInUseError(PagedKVError, RuntimeError):
    """The operation needs every block to be free (for example resetting the prefix cache)."""


class CacheNotAllocatedError(PagedKVError, RuntimeError):
    """The call reads or writes K/V, but the allocator was built without cache tensors."""


class EmptyFreeQueueError(PagedKVError, IndexError):
    """A pop asked the free queue for more blocks than it holds (an ``IndexError``, as ``deque`` raises)."""
