"""A contiguous allocator over one address range: what systems without paging must use.

Each allocation is one run of consecutive slots ``[start, start + size)``. Free space
is a list of holes sorted by address; freeing a region merges it with the holes right
before and after it (coalescing), so two neighbouring holes never stay apart. Because
regions must be contiguous, a request can be refused while the total free space is
larger than it asks for: that is external fragmentation, and here it is real.

``policy`` picks the hole: "first-fit" (lowest address that fits, the classic
default) or "best-fit" (the smallest hole that fits).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Dict, List, Optional, Tuple

from .._validate import as_count
from ..errors import InvalidArgumentError

POLICIES = ("first-fit", "best-fit")


class ContiguousAllocator:
    """Hands out contiguous slot ranges of ``[0, capacity)``; ``try_allocate`` returns None when no hole fits."""

    __slots__ = ("capacity", "policy", "_starts", "_sizes", "_used", "_num_used", "_largest")

    def __init__(self, capacity: int, policy: str = "first-fit") -> None:
        capacity = as_count(capacity, "capacity", minimum=1)
        if not isinstance(policy, str) or policy not in POLICIES:
            raise InvalidArgumentError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.capacity = capacity
        self.policy = policy
        # Holes sorted by start; _sizes[i] is the length of the hole at _starts[i].
        self._starts: List[int] = [0]
        self._sizes: List[int] = [self.capacity]
        self._used: Dict[int, int] = {}
        self._num_used = 0
        self._largest: Optional[int] = self.capacity  # None: recompute on demand

    # ---------------------------------------------------------------- views
    @property
    def holes(self) -> Tuple[Tuple[int, int], ...]:
        """The free list: ``(start, size)`` of every hole, by address."""
        return tuple(zip(self._starts, self._sizes))

    @property
    def allocations(self) -> Dict[int, int]:
        """A copy of the live regions: ``{start: size}``."""
        return dict(self._used)

    @property
    def num_free(self) -> int:
        return self.capacity - self._num_used

    @property
    def num_used(self) -> int:
        return self._num_used

    @property
    def largest_hole(self) -> int:
        """The biggest request that would succeed right now (0 when full)."""
        if self._largest is None:
            self._largest = max(self._sizes, default=0)
        return self._largest

    def footprint(self, size: int) -> int:
        """Slots a request of ``size`` takes: exactly ``size`` (no rounding)."""
        return size

    def __repr__(self) -> str:
        return (
            f"ContiguousAllocator(used={self._num_used}/{self.capacity}, holes={len(self._starts)}, "
            f"largest_hole={self.largest_hole}, policy={self.policy!r})"
        )

    # ----------------------------------------------------------- operations
    def try_allocate(self, size: int) -> Optional[int]:
        """Reserve ``size`` consecutive slots; returns the start, or None if no hole is big enough."""
        if type(size) is not int or size < 1:
            size = as_count(size, "size", minimum=1)
        if size > self.largest_hole:
            return None
        index = self._pick(size)
        start = self._starts[index]
        left = self._sizes[index] - size
        if left:
            self._starts[index] = start + size
            self._sizes[index] = left
        else:
            del self._starts[index]
            del self._sizes[index]
        if size + left == self._largest:
            self._largest = None  # the largest hole shrank; recompute lazily
        self._used[start] = size
        self._num_used += size
        return start

    def free(self, start: int) -> int:
        """Release the region that begins at ``start``; returns its size. Unknown starts raise."""
        size = self._used.pop(start, None)
        if size is None:
            raise InvalidArgumentError(f"no allocated region starts at {start!r} (double free or wrong address); "
                                       f"allocated starts: {sorted(self._used)[:8]}")
        self._num_used -= size
        index = bisect_left(self._starts, start)
        end = start + size
        merged_start, merged_size = start, size
        if index < len(self._starts) and self._starts[index] == end:
            merged_size += self._sizes[index]  # absorb the hole right after
            del self._starts[index]
            del self._sizes[index]
        if index and self._starts[index - 1] + self._sizes[index - 1] == start:
            index -= 1  # grow the hole right before
            merged_start = self._starts[index]
            merged_size += self._sizes[index]
            self._sizes[index] = merged_size
        else:
            self._starts.insert(index, merged_start)
            self._sizes.insert(index, merged_size)
        if self._largest is not None and merged_size > self._largest:
            self._largest = merged_size
        return size

    def check_invariants(self) -> None:
        """Raise AssertionError unless holes and regions tile ``[0, capacity)`` exactly, holes coalesced."""
        spans = [(s, n, "hole") for s, n in zip(self._starts, self._sizes)]
        spans += [(s, n, "region") for s, n in self._used.items()]
        spans.sort()
        cursor = 0
        previous = None
        for start, size, kind in spans:
            assert size >= 1, f"{kind} at {start} has size {size}"
            assert start == cursor, f"{kind} at {start} but the previous span ends at {cursor} (gap or overlap)"
            assert not (kind == previous == "hole"), f"holes meeting at {start} were not coalesced"
            cursor, previous = start + size, kind
        assert cursor == self.capacity, f"spans end at {cursor}, capacity is {self.capacity}"
        assert self._starts == sorted(self._starts), "free list is not sorted by address"
        assert self._num_used == sum(self._used.values()), "used counter disagrees with the regions"
        if self._largest is not None:
            assert self._largest == max(self._sizes, default=0), "cached largest hole is stale"

    # ------------------------------------------------------------ internals
    def _pick(self, size: int) -> int:
        sizes = self._sizes
        if self.policy == "first-fit":
            for index, hole in enumerate(sizes):
                if hole >= size:
                    return index
        best = -1
        for index, hole in enumerate(sizes):
            if hole >= size and (best < 0 or hole < sizes[best]):
                best = index
        return best
