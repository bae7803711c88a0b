"""A binary buddy allocator: the contiguous allocator the PagedAttention paper assumes for Orca.

Memory is split into power-of-two blocks. A request is rounded up to a power of two
and served by the smallest free block that holds it, halving bigger blocks as
needed; a freed block merges with its "buddy" (the other half of the block it came
from) whenever that buddy is free too, recursively. Both steps are cheap, but the
rounding wastes up to half of each block, and free blocks that are neighbours yet
not buddies never merge: external fragmentation.

A capacity that is not a power of two is split into power-of-two roots, largest
first (15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16); blocks merge only
inside their root. Each root starts at a multiple of its size, so a block's buddy is
its address XOR its size.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Dict, List, Optional, Set, Tuple

from .._validate import as_count
from ..errors import InvalidArgumentError


def round_up_pow2(size: int) -> int:
    """The smallest power of two >= ``size`` (``size`` >= 1)."""
    return 1 << (size - 1).bit_length()


class BuddyAllocator:
    """Power-of-two blocks of ``[0, capacity)``; ``try_allocate`` returns None when no block fits."""

    __slots__ = ("capacity", "policy", "_roots", "_root_orders", "_free", "_used", "_num_used")

    def __init__(self, capacity: int) -> None:
        self.capacity = as_count(capacity, "capacity", minimum=1)
        self.policy = "buddy"
        self._roots: List[int] = []        # root starts, ascending
        self._root_orders: List[int] = []  # log2 of each root's size
        self._free: List[Set[int]] = [set() for _ in range(self.capacity.bit_length())]
        start = 0
        for order in reversed(range(self.capacity.bit_length())):
            if self.capacity >> order & 1:
                self._roots.append(start)
                self._root_orders.append(order)
                self._free[order].add(start)
                start += 1 << order
        self._used: Dict[int, int] = {}  # start -> order
        self._num_used = 0

    # ---------------------------------------------------------------- views
    @property
    def holes(self) -> Tuple[Tuple[int, int], ...]:
        """The free lists flattened: ``(start, size)`` of every free block, by address."""
        return tuple(sorted((start, 1 << order) for order, starts in enumerate(self._free) for start in starts))

    @property
    def free_lists(self) -> Dict[int, Tuple[int, ...]]:
        """Free block starts per block size (only sizes that have free blocks)."""
        return {1 << order: tuple(sorted(s)) for order, s in enumerate(self._free) if s}

    @property
    def allocations(self) -> Dict[int, int]:
        """A copy of the live blocks: ``{start: size}`` (sizes are powers of two)."""
        return {start: 1 << order for start, order in self._used.items()}

    @property
    def num_free(self) -> int:
        return self.capacity - self._num_used

    @property
    def num_used(self) -> int:
        return self._num_used

    @property
    def largest_hole(self) -> int:
        """The biggest request that would succeed right now (0 when full)."""
        for order in reversed(range(len(self._free))):
            if self._free[order]:
                return 1 << order
        return 0

    def footprint(self, size: int) -> int:
        """Slots a request of ``size`` actually takes: rounded up to a power of two."""
        return round_up_pow2(size)

    def __repr__(self) -> str:
        return (
            f"BuddyAllocator(used={self._num_used}/{self.capacity}, "
            f"free_blocks={sum(map(len, self._free))}, largest_hole={self.largest_hole})"
        )

    # ----------------------------------------------------------- operations
    def try_allocate(self, size: int) -> Optional[int]:
        """Reserve a block of at least ``size`` slots; returns its start, or None if none is free."""
        if type(size) is not int or size < 1:
            size = as_count(size, "size", minimum=1)
        want = (size - 1).bit_length()
        free = self._free
        order = want
        while order < len(free) and not free[order]:
            order += 1
        if order >= len(free):
            return None
        start = min(free[order])  # lowest address: deterministic, keeps the top of memory whole
        free[order].discard(start)
        while order > want:  # split, keeping the lower half, freeing the upper
            order -= 1
            free[order].add(start + (1 << order))
        self._used[start] = want
        self._num_used += 1 << want
        return start

    def free(self, start: int) -> int:
        """Release the block at ``start``, merging with free buddies; returns the block's size."""
        order = self._used.pop(start, None)
        if order is None:
            raise InvalidArgumentError(f"no allocated block starts at {start!r} (double free or wrong address); "
                                       f"allocated starts: {sorted(self._used)[:8]}")
        size = 1 << order
        self._num_used -= size
        limit = self._root_orders[bisect_right(self._roots, start) - 1]
        while order < limit:
            buddy = start ^ (1 << order)
            if buddy not in self._free[order]:
                break
            self._free[order].discard(buddy)
            start = min(start, buddy)
            order += 1
        self._free[order].add(start)
        return size

    def check_invariants(self) -> None:
        """Raise AssertionError unless blocks tile the memory, are aligned, and free buddies are merged."""
        spans = [(s, o, "free") for o, starts in enumerate(self._free) for s in starts]
        spans += [(s, o, "used") for s, o in self._used.items()]
        spans.sort()
        cursor = 0
        for start, order, kind in spans:
            assert start == cursor, f"{kind} block at {start}, previous block ends at {cursor} (gap or overlap)"
            root = bisect_right(self._roots, start) - 1
            offset = start - self._roots[root]
            assert order <= self._root_orders[root], f"block at {start} is larger than its root"
            assert offset % (1 << order) == 0, f"block at {start} of size {1 << order} is misaligned"
            if kind == "free" and order < self._root_orders[root]:
                buddy = start ^ (1 << order)
                assert buddy not in self._free[order], f"free buddies {start} and {buddy} were not merged"
            cursor = start + (1 << order)
        assert cursor == self.capacity, f"blocks end at {cursor}, capacity is {self.capacity}"
        assert self._num_used == sum(1 << o for o in self._used.values()), "used counter disagrees with the blocks"
