"""The contiguous allocators behind the Orca baselines: first-fit, best-fit and buddy."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv_lib.simulate import ContiguousAllocator
from paged_kv_lib.simulate.buddy import BuddyAllocator, round_up_pow2


def gaps(capacity, regions):
    """The maximal free intervals left by ``regions`` ({start: size}): a fully coalesced free list."""
    out, cursor = [], 0
    for start in sorted(regions):
        if start > cursor:
            out.append((cursor, start - cursor))
        cursor = start + regions[start]
    if cursor < capacity:
        out.append((cursor, capacity - cursor))
    return out


class AllocatorMachine(RuleBasedStateMachine):
    """Random interleavings of allocations and frees, checked against a plain model of live regions."""

    def __init__(self):
        super().__init__()
        self.alloc = None
        self.regions = {}  # start -> (requested size, footprint)

    @precondition(lambda self: self.alloc is None)
    @rule(capacity=st.integers(1, 300), kind=st.sampled_from(["first-fit", "best-fit", "buddy"]))
    def create(self, capacity, kind):
        self.alloc = BuddyAllocator(capacity) if kind == "buddy" else ContiguousAllocator(capacity, kind)

    @precondition(lambda self: self.alloc is not None)
    @rule(size=st.integers(1, 120))
    def allocate(self, size):
        alloc = self.alloc
        holes_before = alloc.holes
        start = alloc.try_allocate(size)
        footprint = alloc.footprint(size)
        fitting = [(s, n) for s, n in holes_before if n >= footprint]
        if start is None:
            assert not fitting, f"refused {size} although holes {fitting} fit it"
            assert alloc.holes == holes_before  # a refusal changes nothing
            return
        assert fitting
        if alloc.policy == "first-fit":
            assert start == fitting[0][0]
        elif alloc.policy == "best-fit":
            assert start == min(fitting, key=lambda h: (h[1], h[0]))[0]
        else:
            assert footprint == round_up_pow2(size) and size <= footprint < 2 * size
            smallest = min(n for _, n in fitting)
            assert start == min(s for s, n in fitting if n == smallest)
        for other, (_, other_size) in self.regions.items():
            assert start + footprint <= other or other + other_size <= start, "regions overlap"
        assert 0 <= start and start + footprint <= alloc.capacity
        self.regions[start] = (size, footprint)

    @precondition(lambda self: self.alloc is not None and self.regions)
    @rule(data=st.data())
    def free(self, data):
        start = data.draw(st.sampled_from(sorted(self.regions)))
        _, footprint = self.regions.pop(start)
        assert self.alloc.free(start) == footprint
        with pytest.raises(ValueError, match="double free"):
            self.alloc.free(start)

    @invariant()
    def accounting(self):
        if self.alloc is None:
            return
        alloc = self.alloc
        alloc.check_invariants()
        live = {s: f for s, (_, f) in self.regions.items()}
        assert alloc.allocations == live
        assert alloc.num_used == sum(live.values())
        assert alloc.num_free + alloc.num_used == alloc.capacity
        assert sum(n for _, n in alloc.holes) == alloc.num_free
        assert alloc.largest_hole == max((n for _, n in alloc.holes), default=0)
        if alloc.policy != "buddy":
            # Fully coalesced: the holes are exactly the maximal gaps between live regions.
            assert list(alloc.holes) == gaps(alloc.capacity, live)
        else:
            # Union of the holes is exactly the complement of the live blocks.
            covered = sorted(alloc.holes + tuple(live.items()))
            cursor = 0
            for start, size in covered:
                assert start == cursor
                cursor += size
            assert cursor == alloc.capacity


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestAllocatorMachine = AllocatorMachine.TestCase


@pytest.mark.parametrize("kind", ["first-fit", "best-fit", "buddy"])
def test_freeing_everything_restores_the_initial_free_list(kind):
    alloc = BuddyAllocator(1000) if kind == "buddy" else ContiguousAllocator(1000, kind)
    initial = alloc.holes
    starts = [alloc.try_allocate(size) for size in (100, 7, 300, 33, 60, 1, 20)]
    assert None not in starts
    for start in starts[::2] + starts[1::2]:
        alloc.free(start)
    assert alloc.holes == initial and alloc.num_free == 1000


def test_first_fit_external_fragmentation_is_real():
    alloc = ContiguousAllocator(10)
    a, b, c = (alloc.try_allocate(3) for _ in range(3))
    alloc.free(b)
    assert alloc.holes == ((3, 3), (9, 1))
    assert alloc.num_free == 4 and alloc.largest_hole == 3
    assert alloc.try_allocate(4) is None  # 4 slots free, but not in one piece
    alloc.free(a)
    assert alloc.holes == ((0, 6), (9, 1))  # merged with its neighbour
    assert alloc.try_allocate(4) == 0


def test_buddy_neighbours_that_are_not_buddies_do_not_merge():
    alloc = BuddyAllocator(16)
    starts = [alloc.try_allocate(4) for _ in range(4)]
    assert starts == [0, 4, 8, 12]
    alloc.free(4)
    alloc.free(8)
    assert alloc.holes == ((4, 4), (8, 4))  # adjacent, but halves of different 8-blocks
    assert alloc.try_allocate(8) is None
    alloc.free(0)
    assert alloc.free_lists == {4: (8,), 8: (0,)}
    assert alloc.try_allocate(3) == 8 and alloc.allocations[8] == 4  # rounded up to a power of two


def test_buddy_roots_for_a_capacity_that_is_not_a_power_of_two():
    alloc = BuddyAllocator(15728)
    assert alloc.free_lists == {16: (15712,), 32: (15680,), 64: (15616,), 256: (15360,),
                                1024: (14336,), 2048: (12288,), 4096: (8192,), 8192: (0,)}
    # Seven 2048-slot regions fit, as with the paper's Orca (Max).
    assert [alloc.try_allocate(2048) is not None for _ in range(8)] == [True] * 7 + [False]


@pytest.mark.parametrize("make", [lambda: ContiguousAllocator(8), lambda: BuddyAllocator(8)])
def test_bad_arguments(make):
    alloc = make()
    with pytest.raises(ValueError):
        alloc.try_allocate(0)
    with pytest.raises(TypeError):
        alloc.try_allocate(2.0)
    with pytest.raises(ValueError, match="no allocated"):
        alloc.free(3)
    assert alloc.num_free == 8
    with pytest.raises(ValueError):
        ContiguousAllocator(0)
    with pytest.raises(ValueError, match="policy"):
        ContiguousAllocator(8, "worst-fit")


def test_invariant_checks_catch_corruption():
    alloc = ContiguousAllocator(20)
    alloc.try_allocate(5)
    alloc._sizes[0] += 1  # hole now overlaps nothing but overruns capacity
    with pytest.raises(AssertionError):
        alloc.check_invariants()
    buddy = BuddyAllocator(16)
    start = buddy.try_allocate(4)
    buddy.free(start)
    buddy._free[4].discard(0)
    buddy._free[2].update({0, 4})  # two free buddies left unmerged
    buddy._free[3].add(8)
    with pytest.raises(AssertionError):
        buddy.check_invariants()


@pytest.mark.parametrize("prompt_len, output_len", [(5, 0), (0, 3), (-1, 2), (4, True)])
def test_reservation_refuses_empty_requests(prompt_len, output_len):
    from paged_kv_lib.errors import PagedKVError
    from paged_kv_lib.simulate.reservation import reservation_size

    for kind in ("orca-max", "orca-pow2", "orca-oracle"):
        # below 1: an InvalidArgumentError (a ValueError); a bool: an InvalidTypeError (a TypeError)
        with pytest.raises(PagedKVError, match=r"(prompt_len|output_len) must be (>= 1|an int)"):
            reservation_size(kind, prompt_len, output_len, 64)
