"""Checks of exercise 03, the allocator: "your allocator" gets ``fork`` and ``free_sequence``, and an
invariant checker that catches a corrupted pool.

Expected states come from the library's ``PagedKVCacheAllocator`` driven through the same
operations. The invariant checker works on a :class:`MiniPool`, the bookkeeping of "your
allocator" (the same attribute names) as plain data, built from library states.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from ..allocator import PagedKVCacheAllocator
from ._common import call_learner, expect_equal, expect_raises, fail, is_int, not_written, passed
from .checks_02 import run_differential

Op = Tuple[Any, ...]
State = Tuple[Dict[int, List[int]], List[int], List[int]]


class MiniPool:
    """A paged allocator's bookkeeping, and nothing else (no tensors, no methods to cheat with).

    * ``block_size``: token slots per block;
    * ``free``: a ``collections.deque`` of free block ids, head (handed out next) first;
    * ``ref_counts``: a list, ``ref_counts[block_id]`` = how many tables hold the block;
    * ``tables``: a dict ``seq_id -> list of block ids`` in logical order.

    ``MiniPool(num_blocks, block_size)`` is an empty pool: every block free, in id order.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free: Deque[int] = deque(range(num_blocks))
        self.ref_counts: List[int] = [0] * num_blocks
        self.tables: Dict[int, List[int]] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    @classmethod
    def from_allocator(cls, allocator: PagedKVCacheAllocator) -> "MiniPool":
        """A pool holding the same free queue, reference counts and tables as a library allocator."""
        pool = cls(allocator.num_blocks, allocator.block_size)
        pool.free = deque(allocator.free_blocks)
        pool.ref_counts = [b.ref_count for b in allocator.blocks]
        pool.tables = {s: allocator.get_block_mapping(s) for s in allocator.seq_ids}
        return pool

    def __repr__(self) -> str:
        return (f"MiniPool(block_size={self.block_size}, free={list(self.free)}, "
                f"ref_counts={self.ref_counts}, tables={self.tables})")


# ----------------------------------------------------------------------- helpers
def _library(num_blocks: int, block_size: int) -> PagedKVCacheAllocator:
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)


def _apply(alloc: PagedKVCacheAllocator, op: Op) -> None:
    kind, *args = op
    if kind == "allocate":
        alloc.allocate_for_sequence(*args)
    elif kind == "free":
        alloc.free_sequence(*args)
    else:
        alloc.fork(*args)


def _replay(num_blocks: int, block_size: int, trace: Sequence[Op]) -> PagedKVCacheAllocator:
    alloc = _library(num_blocks, block_size)
    for op in trace:
        _apply(alloc, op)
    return alloc


def _pool_state(pool: MiniPool) -> State:
    return ({s: list(ids) for s, ids in pool.tables.items()}, list(pool.ref_counts), list(pool.free))


# Traces over small pools: allocations that fit exactly, frees that scatter the free queue,
# forks that share blocks, empty sequences.
TRACES: List[Tuple[int, int, List[Op]]] = [
    (8, 4, [("allocate", 0, 10), ("allocate", 1, 3), ("allocate", 2, 9), ("fork", 1, 3), ("free", 0),
            ("allocate", 4, 12), ("free", 1), ("free", 3), ("allocate", 5, 4), ("allocate", 6, 0)]),
    (10, 4, [("allocate", 0, 10), ("allocate", 1, 5), ("allocate", 2, 7), ("free", 1),
             ("allocate", 3, 14), ("free", 2), ("allocate", 4, 8), ("fork", 4, 5), ("free", 4)]),
    (12, 1, [("allocate", 0, 3), ("allocate", 1, 2), ("fork", 0, 2), ("free", 0), ("allocate", 3, 5),
             ("free", 1), ("allocate", 4, 3), ("fork", 2, 5), ("free", 2)]),
    (6, 16, [("allocate", 7, 33), ("allocate", 8, 16), ("free", 7), ("allocate", 9, 40), ("fork", 8, 10),
             ("allocate", 11, 1)]),
]


# ----------------------------------------------------------- your allocator
def _new(cls: Any, num_blocks: int, block_size: int) -> Any:
    return call_learner(cls, (num_blocks, block_size), f"MyAllocator({num_blocks}, {block_size})", "an allocator")


def _do(alloc: Any, method: str, args: Tuple[Any, ...], steps: List[str]) -> None:
    steps.append(f"a.{method}({', '.join(map(repr, args))})")
    call_learner(getattr(alloc, method), args, "; ".join(steps), None)


def _read(alloc: Any, name: str, steps: List[str]) -> Any:
    try:
        value = getattr(alloc, name)
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except AttributeError:
        raise fail(f"{'; '.join(steps)}  then a.{name}", "the attribute exercise 02 pinned", "no such attribute",
                   f"keep the state in a.{name}, as in exercise 02 (the starter class does)") from None
    if name == "free" and isinstance(value, deque):
        return list(value)
    return value


def _expect(alloc: Any, steps: List[str], *, free: int, tables: Dict[int, List[int]], hints: Dict[str, str],
            ref_counts: Optional[List[int]] = None) -> None:
    where = "; ".join(steps)
    got_free = _read(alloc, "num_free_blocks", steps)
    if not is_int(got_free):
        raise fail(f"{where}  then a.num_free_blocks", free, got_free, "num_free_blocks must be an int")
    expect_equal(f"{where}  then a.num_free_blocks", free, got_free, hints.get("free", ""))
    for seq_id, want in tables.items():
        call = f"{where}  then a.get_block_mapping({seq_id})"
        got = call_learner(alloc.get_block_mapping, (seq_id,), call, want)
        expect_equal(call, want, got, hints.get("tables", ""))
    if ref_counts is not None:
        expect_equal(f"{where}  then a.ref_counts", ref_counts, _read(alloc, "ref_counts", steps),
                     hints.get("ref_counts", ""))


# --------------------------------------------------------------------------- 03.1
def check_my_fork(MyAllocator: Any) -> None:
    """Task 03.1: ``fork`` shares every block of the parent: references, not copies."""
    a = _new(MyAllocator, 8, 4)
    steps = ["a = MyAllocator(8, 4)"]
    _do(a, "allocate_for_sequence", (0, 10), steps)
    _do(a, "fork", (0, 1), steps)
    _expect(a, steps, free=5, tables={0: [0, 1, 2], 1: [0, 1, 2]},
            hints={"free": "fork copied blocks: the child shares the parent's blocks, it takes none from the "
                           "free queue",
                   "tables": "the child's table lists the parent's blocks, in the same order",
                   "ref_counts": "a shared block is held by two tables now; its reference count says so"},
            ref_counts=[2, 2, 2, 0, 0, 0, 0, 0])
    tables = _read(a, "tables", steps)
    if isinstance(tables, dict) and 0 in tables and 1 in tables and tables[0] is tables[1]:
        raise fail(f"{'; '.join(steps)}  then a.tables[1] is a.tables[0]", False, True,
                   "the child got the parent's own list object: when one of them grows (exercise 05) the "
                   "other would grow with it. Give the child a new list")
    lengths = _read(a, "lengths", steps)
    expect_equal(f"{'; '.join(steps)}  then a.lengths", {0: 10, 1: 10}, lengths,
                 "the child holds as many tokens as its parent")
    _do(a, "fork", (1, 2), steps)
    _expect(a, steps, free=5, tables={2: [0, 1, 2]}, hints={"ref_counts": "forking a fork adds one more reference"},
            ref_counts=[3, 3, 3, 0, 0, 0, 0, 0])
    _do(a, "allocate_for_sequence", (3, 0), steps)
    _do(a, "fork", (3, 4), steps)
    _expect(a, steps, free=5, tables={4: []}, hints={"tables": "forking an empty sequence gives an empty table"})

    # Refusals change nothing.
    refusals = [((9, 5), "sequence 9 does not exist: an unknown parent is a ValueError"),
                ((0, 1), "sequence 1 already exists: forking onto a live id is a ValueError"),
                ((0, 0), "a sequence cannot be forked onto itself (its id is taken): ValueError")]
    for args, hint in refusals:
        where = "; ".join(steps) + f"; a.fork{args}"
        expect_raises(a.fork, args, where, ValueError, hint)
        _expect(a, steps + [f"a.fork{args} (refused)"], free=5, tables={0: [0, 1, 2], 1: [0, 1, 2]},
                hints={"ref_counts": "a refused fork must change nothing: check both ids before any count"},
                ref_counts=[3, 3, 3, 0, 0, 0, 0, 0])
        if args[1] == 5:
            expect_raises(a.get_block_mapping, (5,), f"{where}  then a.get_block_mapping(5)", ValueError,
                          "a refused fork must change nothing: sequence 5 was registered anyway")
    passed("03.1")


# --------------------------------------------------------------------------- 03.2
def check_my_free(MyAllocator: Any) -> None:
    """Task 03.2: ``free_sequence`` drops one reference per block, tail first; blocks nobody holds go back."""
    a = _new(MyAllocator, 3, 2)
    steps = ["a = MyAllocator(3, 2)"]
    _do(a, "allocate_for_sequence", (0, 6), steps)
    _do(a, "free_sequence", (0,), steps)
    _expect(a, steps, free=3, tables={}, hints={"free": "every block of the freed sequence is free again"})
    queue = _read(a, "free", steps)
    if queue == [0, 1, 2]:
        raise fail(f"{'; '.join(steps)}  then a.free", [2, 1, 0], queue,
                   "head-first free: the blocks went back in table order. The library returns them last "
                   "block first (lesson 03 says why)")
    expect_equal(f"{'; '.join(steps)}  then a.free", [2, 1, 0], queue,
                 "freed blocks join the tail of the free queue, last block of the table first")
    expect_raises(a.get_block_mapping, (0,), f"{'; '.join(steps)}  then a.get_block_mapping(0)", ValueError,
                  "a freed sequence is gone: drop its table")
    _do(a, "allocate_for_sequence", (1, 2), steps)
    _expect(a, steps, free=2, tables={1: [2]}, hints={"tables": "the next allocation takes the head of the queue"})
    expect_equal(f"{'; '.join(steps)}  then a.lengths", {1: 2}, _read(a, "lengths", steps),
                 "a freed sequence's length must go too")
    before = _read(a, "free", steps)
    steps.append("a.free_sequence(42)")
    try:
        a.free_sequence(42)
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except Exception as exc:  # the learner's free raised on an unknown id
        raise fail("; ".join(steps), "no error", f"it raised {type(exc).__name__}: {exc}",
                   "freeing an unknown id is not an error (a request may be cancelled before it got "
                   "blocks): it does nothing") from None
    _expect(a, steps, free=2, tables={1: [2]}, hints={"free": "freeing an unknown id does nothing"})
    expect_equal(f"{'; '.join(steps)}  then a.free", before, _read(a, "free", steps),
                 "freeing an unknown id does nothing")

    # Shared blocks: freed only when the last holder lets go.
    b = _new(MyAllocator, 6, 2)
    steps = ["a = MyAllocator(6, 2)"]
    _do(b, "allocate_for_sequence", (0, 3), steps)
    _do(b, "fork", (0, 1), steps)
    _do(b, "allocate_for_sequence", (2, 2), steps)
    _do(b, "free_sequence", (0,), steps)
    _expect(b, steps, free=3, tables={1: [0, 1], 2: [2]},
            hints={"free": "blocks 0 and 1 are still held by sequence 1: a block is free only when its reference "
                           "count reaches 0",
                   "ref_counts": "freeing drops one reference per block"},
            ref_counts=[1, 1, 1, 0, 0, 0])
    _do(b, "free_sequence", (0,), steps)
    _expect(b, steps, free=3, tables={1: [0, 1]},
            hints={"ref_counts": "sequence 0 is already gone: freeing it again must not drop references again"},
            ref_counts=[1, 1, 1, 0, 0, 0])
    _do(b, "free_sequence", (1,), steps)
    _expect(b, steps, free=5, tables={2: [2]}, hints={"free": "now nobody holds blocks 0 and 1"},
            ref_counts=[0, 0, 1, 0, 0, 0])
    expect_equal(f"{'; '.join(steps)}  then a.free", [3, 4, 5, 1, 0], _read(b, "free", steps),
                 "freed blocks join the tail of the free queue, last block of the table first")
    passed("03.2")


def check_allocator_03(MyAllocator: Any) -> None:
    """Task 03.2, second check: random allocate / fork / free / lookup sequences beside the library."""
    run_differential(MyAllocator, "03", "03.2")


# --------------------------------------------------------------------------- 03.3
def _valid_pools() -> List[Tuple[str, MiniPool]]:
    pools = [("an empty pool of 4 blocks", MiniPool(4, 2))]
    for num_blocks, bs, trace in TRACES:
        alloc = _library(num_blocks, bs)
        for i, op in enumerate(trace):
            _apply(alloc, op)
            if i % 2 or i == len(trace) - 1:
                pools.append((f"a valid pool, after {trace[: i + 1]}", MiniPool.from_allocator(alloc)))
    full = _replay(3, 2, [("allocate", 0, 6)])
    pools.append(("a full pool (no free block)", MiniPool.from_allocator(full)))
    return pools


def _corrupted_pools() -> List[Tuple[str, MiniPool]]:
    # Base: 10 blocks; seq 1 and 2 share block 3; seq 3 holds 4, 5; free queue [6, 7, 8, 9, 2, 1, 0].
    base = MiniPool.from_allocator(_replay(10, 4, [("allocate", 0, 10), ("allocate", 1, 3), ("fork", 1, 2),
                                                   ("allocate", 3, 5), ("free", 0)]))
    out: List[Tuple[str, MiniPool]] = []

    def variant(what: str, *, queue_add: Sequence[int] = (), queue_remove: Sequence[int] = (),
                refs: Optional[Dict[int, int]] = None, table_add: Optional[Dict[int, int]] = None) -> None:
        pool = copy.deepcopy(base)
        for block_id in queue_remove:
            pool.free.remove(block_id)
        pool.free.extend(queue_add)
        for block_id, count in (refs or {}).items():
            pool.ref_counts[block_id] = count
        for seq_id, block_id in (table_add or {}).items():
            pool.tables[seq_id].append(block_id)
        out.append((what, pool))

    variant("block 9 is free (ref count 0) but missing from the free queue: it leaked", queue_remove=[9])
    variant("block 6 is in the free queue twice", queue_add=[6])
    variant("block 4 is held by sequence 3 and also in the free queue", queue_add=[4])
    variant("block 4 is in the free queue while sequence 3 holds it, and free block 9 is missing "
            "(the counts still add up)", queue_add=[4], queue_remove=[9])
    variant("block 4 has ref count 2 but one table holds it", refs={4: 2})
    variant("block 3 is held by sequences 1 and 2 but has ref count 1", refs={3: 1})
    variant("sequence 3's table lists block 10, outside a pool of 10 blocks", table_add={3: 10})
    variant("the free queue holds block id 10, outside a pool of 10 blocks", queue_add=[10])
    variant("sequence 3's table lists block 5 twice (and block 5 counts 2 references)",
            table_add={3: 5}, refs={5: 2})
    variant("sequence 3's table lists block 4 twice (block 4 counts 1 reference: one table holds it)",
            table_add={3: 4})
    variant("block 9 has ref count -1", refs={9: -1})
    variant("block 3 has ref count 0 while two tables hold it, and it sits in the free queue",
            refs={3: 0}, queue_add=[3])
    return out


def check_pool_invariants(my_check_pool: Callable[[MiniPool], None]) -> None:
    """Task 03.3: ``my_check_pool(pool)`` raises AssertionError exactly when the bookkeeping is inconsistent."""
    for what, pool in _valid_pools():
        before = _pool_state(pool)
        call = f"my_check_pool({pool!r})  # {what}"
        try:
            my_check_pool(pool)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except Exception as exc:
            raise fail(call, "no error (the pool is consistent)", f"{type(exc).__name__}: {exc}",
                       "shared blocks (ref count > 1, in several tables) and empty tables are fine") from None
        if _pool_state(pool) != before:
            raise fail(f"{call}  then the pool", before, _pool_state(pool), "inputs modified: a checker only reads the pool")
    for what, pool in _corrupted_pools():
        call = f"my_check_pool({pool!r})  # {what}"
        try:
            my_check_pool(pool)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except AssertionError:
            continue
        except Exception as exc:
            raise fail(call, "an AssertionError", f"{type(exc).__name__}: {exc}",
                       "report every inconsistency with AssertionError (an assert statement does that), "
                       "even for block ids outside the pool") from None
        raise fail(call, "an AssertionError", "no error", f"your checker missed it: {what}")
    passed("03.3")
