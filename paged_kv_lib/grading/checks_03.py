"""Checks of exercise 03, the allocator: allocate, free, fork and an invariant checker on a bare pool.

The learner's functions work on a :class:`MiniPool`, the allocator's bookkeeping as plain
Python data. Every expected state comes from the library's ``PagedKVCacheAllocator``
driven through the same operations (its free queue, reference counts and tables), and the
pools handed to later tasks are built from library states, so a learner stuck on one
task can still do the next.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Sequence, Tuple

from ..allocator import PagedKVCacheAllocator
from ..errors import OutOfBlocksError
from ._common import call_learner, fail, passed

Op = Tuple[Any, ...]
State = Tuple[Dict[int, List[int]], List[int], List[int]]


class MiniPool:
    """A paged allocator's bookkeeping, and nothing else (no tensors, no methods to cheat with).

    * ``block_size``: token slots per block;
    * ``free_queue``: a ``collections.deque`` of free block ids, head (handed out next) first;
    * ``ref_counts``: a list, ``ref_counts[block_id]`` = how many tables hold the block;
    * ``tables``: a dict ``seq_id -> list of block ids`` in logical order.

    ``MiniPool(num_blocks, block_size)`` is an empty pool: every block free, in id order.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_queue: Deque[int] = deque(range(num_blocks))
        self.ref_counts: List[int] = [0] * num_blocks
        self.tables: Dict[int, List[int]] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    @classmethod
    def from_allocator(cls, allocator: PagedKVCacheAllocator) -> "MiniPool":
        """A pool holding the same free queue, reference counts and tables as a library allocator."""
        pool = cls(allocator.num_blocks, allocator.block_size)
        pool.free_queue = deque(allocator.free_blocks)
        pool.ref_counts = [b.ref_count for b in allocator.blocks]
        pool.tables = {s: allocator.get_block_mapping(s) for s in allocator.seq_ids}
        return pool

    def __repr__(self) -> str:
        return (f"MiniPool(block_size={self.block_size}, free_queue={list(self.free_queue)}, "
                f"ref_counts={self.ref_counts}, tables={self.tables})")


# ----------------------------------------------------------------------- helpers
def _library(num_blocks: int, block_size: int) -> PagedKVCacheAllocator:
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)


def _apply(alloc: PagedKVCacheAllocator, op: Op) -> None:
    kind, *args = op
    {"allocate": alloc.allocate_for_sequence, "free": alloc.free_sequence, "fork": alloc.fork}[kind](*args)


def _replay(num_blocks: int, block_size: int, trace: Sequence[Op]) -> PagedKVCacheAllocator:
    alloc = _library(num_blocks, block_size)
    for op in trace:
        _apply(alloc, op)
    return alloc


def _lib_state(alloc: PagedKVCacheAllocator) -> State:
    return ({s: alloc.get_block_mapping(s) for s in alloc.seq_ids},
            [b.ref_count for b in alloc.blocks], list(alloc.free_blocks))


def _pool_state(pool: MiniPool) -> State:
    return ({s: list(ids) for s, ids in pool.tables.items()}, list(pool.ref_counts), list(pool.free_queue))


def _compare(call: str, want: State, pool: MiniPool, hint: str) -> None:
    got = _pool_state(pool)
    for name, w, g in zip(("tables", "ref_counts", "free_queue"), want, got):
        if w != g:
            raise fail(f"{call}  then pool.{name}", w, g, hint)
    if not isinstance(pool.free_queue, deque):
        raise fail(f"{call}  then type(pool.free_queue)", "collections.deque", type(pool.free_queue).__name__,
                   "keep the free queue a deque: change it with popleft() and append()")
    for seq_id, ids in pool.tables.items():
        if not isinstance(ids, list):
            raise fail(f"{call}  then type(pool.tables[{seq_id}])", "list", type(ids).__name__,
                       "store each table as a list of block ids")


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


# --------------------------------------------------------------------------- 03.1
def check_mini_allocate(my_allocate: Callable[[MiniPool, int, int], List[int]]) -> None:
    """Task 03.1: ``my_allocate(pool, seq_id, num_tokens)`` takes blocks from the head, atomically."""
    hint = ("take ceil(num_tokens / block_size) blocks with pool.free_queue.popleft(), in that order, set each "
            "one's reference count to 1, and store them as a new list in pool.tables[seq_id]")
    # A run of allocations on one pool, then allocations after frees (the queue no longer in id order).
    for num_blocks, bs, trace in TRACES:
        alloc = _library(num_blocks, bs)
        pool = MiniPool(num_blocks, bs)
        for op in trace:
            if op[0] != "allocate":
                _apply(alloc, op)
                pool = MiniPool.from_allocator(alloc)
                continue
            _, seq_id, n = op
            _apply(alloc, op)
            want_ids = alloc.get_block_mapping(seq_id)
            call = f"my_allocate({pool!r}, seq_id={seq_id}, num_tokens={n})"
            got = call_learner(my_allocate, (pool, seq_id, n), call, want_ids)
            if not isinstance(got, list) or got != want_ids:
                raise fail(call, want_ids, got, "return the new sequence's block ids as a list; " + hint)
            _compare(call, _lib_state(alloc), pool, hint)
            if got is pool.tables[seq_id]:
                raise fail(f"{call} is pool.tables[{seq_id}]", False, True,
                           "return a copy (list(...)): a caller that edits the returned list must not "
                           "change the pool's table")
    # Refusals change nothing.
    alloc = _replay(8, 4, [("allocate", 0, 10), ("allocate", 1, 9), ("free", 0)])  # 5 free
    cases = [
        (1, 4, ValueError, "seq_id is already in pool.tables: raise ValueError before changing anything"),
        (2, 21, OutOfBlocksError, "6 blocks needed, 5 free: raise OutOfBlocksError(needed, free) "
                                  "before taking any block (check first, then change)"),
        (2, 100, OutOfBlocksError, "raise OutOfBlocksError(needed, free) before taking any block"),
        (2, -1, ValueError, "a negative token count is a bug: raise ValueError"),
    ]
    for seq_id, n, error, why in cases:
        pool = MiniPool.from_allocator(alloc)
        before = _pool_state(pool)
        call = f"my_allocate({pool!r}, seq_id={seq_id}, num_tokens={n})"
        try:
            got = my_allocate(pool, seq_id, n)
        except NotImplementedError:
            raise
        except error as exc:
            if isinstance(exc, OutOfBlocksError):
                needed, free = -(-n // 4), len(before[2])
                if (exc.needed, exc.free) != (needed, free):
                    raise fail(call + " raised OutOfBlocksError with (needed, free)", (needed, free),
                               (exc.needed, exc.free), "OutOfBlocksError(needed, free): the blocks the "
                               "sequence needs and the blocks in the free queue") from exc
        except Exception as exc:
            raise fail(call, f"a {error.__name__}", f"{type(exc).__name__}: {exc}", why) from exc
        else:
            raise fail(call, f"a {error.__name__}", f"it returned {got!r}", why)
        after = _pool_state(pool)
        if after != before:
            raise fail(f"{call} raised as it should, then the pool", before, after,
                       "a refused call must leave the pool exactly as it was: check everything first, "
                       "then take blocks (popping as you go leaks the blocks taken before the failure)")
    # An exact fit succeeds, leaving the queue empty.
    pool = MiniPool.from_allocator(alloc)
    call = f"my_allocate({pool!r}, seq_id=2, num_tokens=20)"
    alloc.allocate_for_sequence(2, 20)
    got = call_learner(my_allocate, (pool, 2, 20), call, alloc.get_block_mapping(2))
    if got != alloc.get_block_mapping(2):
        raise fail(call, alloc.get_block_mapping(2), got, "5 blocks needed and 5 free: that fits")
    _compare(call, _lib_state(alloc), pool, hint)
    passed("03.1")


# --------------------------------------------------------------------------- 03.2
def check_mini_free(my_free: Callable[[MiniPool, int], List[int]]) -> None:
    """Task 03.2: ``my_free(pool, seq_id)`` drops a table, tail block first; returns the blocks freed."""
    hint = ("pop the table, then for its blocks from the last to the first: decrement the reference count, and "
            "append the block to the free queue when the count reaches 0")
    for num_blocks, bs, trace in TRACES:
        base = _replay(num_blocks, bs, trace)
        # Each live sequence freed on its own, and one unknown id.
        for seq_id in list(base.seq_ids) + [99]:
            alloc = _replay(num_blocks, bs, trace)
            pool = MiniPool.from_allocator(alloc)
            shown = repr(pool)
            queued = len(alloc.free_blocks)
            alloc.free_sequence(seq_id)
            want = list(alloc.free_blocks)[queued:]
            call = f"my_free({shown}, seq_id={seq_id})"
            got = call_learner(my_free, (pool, seq_id), call, want)
            if got is None or list(got) != want:
                extra = " (an unknown sequence id frees nothing and returns [])" if seq_id == 99 else ""
                raise fail(call, want, got, "return the block ids appended to the free queue, in the order "
                           "appended" + extra + "; " + hint)
            _compare(call, _lib_state(alloc), pool, hint)
        # All of them, one after the other, on the same pool.
        alloc = _replay(num_blocks, bs, trace)
        pool = MiniPool.from_allocator(alloc)
        for seq_id in sorted(alloc.seq_ids, reverse=True):
            call = f"my_free({pool!r}, seq_id={seq_id})"
            queued = len(alloc.free_blocks)
            alloc.free_sequence(seq_id)
            want = list(alloc.free_blocks)[queued:]
            got = call_learner(my_free, (pool, seq_id), call, want)
            if got is None or list(got) != want:
                raise fail(call, want, got, hint)
            _compare(call, _lib_state(alloc), pool, hint)
        if sorted(pool.free_queue) != list(range(num_blocks)):
            raise fail("after freeing every sequence, sorted(pool.free_queue)", list(range(num_blocks)),
                       sorted(pool.free_queue), "every block must be back in the free queue exactly once")
    passed("03.2")


# --------------------------------------------------------------------------- 03.3
def check_mini_fork(my_fork: Callable[[MiniPool, int, int], None]) -> None:
    """Task 03.3: ``my_fork(pool, parent_seq_id, child_seq_id)`` shares every block of the parent."""
    hint = ("the child's table is a new list with the parent's block ids, and every one of those blocks gains a "
            "reference; the free queue does not change")
    for num_blocks, bs, trace in TRACES:
        base = _replay(num_blocks, bs, trace)
        for parent in base.seq_ids:
            child = 50 + parent
            alloc = _replay(num_blocks, bs, trace)
            pool = MiniPool.from_allocator(alloc)
            call = f"my_fork({pool!r}, parent_seq_id={parent}, child_seq_id={child})"
            alloc.fork(parent, child)
            call_learner(my_fork, (pool, parent, child), call, None)
            _compare(call, _lib_state(alloc), pool, hint)
            if pool.tables[child] is pool.tables[parent]:
                raise fail(f"{call}  then pool.tables[{child}] is pool.tables[{parent}]", False, True,
                           "give the child its own list (list(parent_table)): when one of them grows later, "
                           "the other must not")
        # Refusals change nothing: an unknown parent, a child id in use, a sequence forked onto itself.
        for parent, child in ((99, 98), (base.seq_ids[0], base.seq_ids[-1]), (base.seq_ids[0], base.seq_ids[0])):
            pool = MiniPool.from_allocator(base)
            before = _pool_state(pool)
            call = f"my_fork({pool!r}, parent_seq_id={parent}, child_seq_id={child})"
            try:
                my_fork(pool, parent, child)
            except NotImplementedError:
                raise
            except ValueError:
                pass
            except Exception as exc:
                raise fail(call, "a ValueError", f"{type(exc).__name__}: {exc}",
                           "an unknown parent, or a child id already in pool.tables, is refused with "
                           "ValueError") from exc
            else:
                raise fail(call, "a ValueError", "no error", "an unknown parent, or a child id already in "
                           "pool.tables, is refused with ValueError")
            if _pool_state(pool) != before:
                raise fail(f"{call} raised as it should, then the pool", before, _pool_state(pool),
                           "check both ids before changing any reference count")
    passed("03.3")


# --------------------------------------------------------------------------- 03.4
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

    def variant(what: str, change: Callable[[MiniPool], None]) -> None:
        pool = copy.deepcopy(base)
        change(pool)
        out.append((what, pool))

    variant("block 9 is free (ref count 0) but missing from the free queue: it leaked",
            lambda p: p.free_queue.remove(9))
    variant("block 6 is in the free queue twice", lambda p: p.free_queue.append(6))
    variant("block 4 is held by sequence 3 and also in the free queue", lambda p: p.free_queue.append(4))
    variant("block 4 is in the free queue while sequence 3 holds it, and free block 9 is missing "
            "(the counts still add up)", lambda p: (p.free_queue.append(4), p.free_queue.remove(9)))
    variant("block 4 has ref count 2 but one table holds it",
            lambda p: p.ref_counts.__setitem__(4, 2))
    variant("block 3 is held by sequences 1 and 2 but has ref count 1",
            lambda p: p.ref_counts.__setitem__(3, 1))
    variant("sequence 3's table lists block 10, outside a pool of 10 blocks",
            lambda p: p.tables[3].append(10))
    variant("the free queue holds block id 10, outside a pool of 10 blocks", lambda p: p.free_queue.append(10))
    variant("sequence 3's table lists block 5 twice (and block 5 counts 2 references)",
            lambda p: (p.tables[3].append(5), p.ref_counts.__setitem__(5, 2)))
    variant("block 9 has ref count -1", lambda p: p.ref_counts.__setitem__(9, -1))
    variant("block 3 has ref count 0 while two tables hold it, and it sits in the free queue",
            lambda p: (p.ref_counts.__setitem__(3, 0), p.free_queue.append(3)))
    return out


def check_mini_validate(my_check_pool: Callable[[MiniPool], None]) -> None:
    """Task 03.4: ``my_check_pool(pool)`` raises AssertionError exactly when the bookkeeping is inconsistent."""
    for what, pool in _valid_pools():
        before = _pool_state(pool)
        call = f"my_check_pool({pool!r})  # {what}"
        try:
            my_check_pool(pool)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise fail(call, "no error (the pool is consistent)", f"{type(exc).__name__}: {exc}",
                       "shared blocks (ref count > 1, in several tables) and empty tables are fine") from exc
        if _pool_state(pool) != before:
            raise fail(f"{call}  then the pool", before, _pool_state(pool), "a checker only reads the pool")
    for what, pool in _corrupted_pools():
        call = f"my_check_pool({pool!r})  # {what}"
        try:
            my_check_pool(pool)
        except NotImplementedError:
            raise
        except AssertionError:
            continue
        except Exception as exc:
            raise fail(call, "an AssertionError", f"{type(exc).__name__}: {exc}",
                       "report every inconsistency with AssertionError (an assert statement does that), "
                       "even for block ids outside the pool") from exc
        raise fail(call, "an AssertionError", "no error",
                   f"this pool is corrupted: {what}. Check every rule of the task")
    passed("03.4")
