"""Checks of exercise 02, blocks and block tables: blocks needed, logical address, lookup, fills.

Expected values come from the library (``PagedKVCacheAllocator.blocks_needed``,
``slot_mapping``, the views' ``snapshot`` data) on allocators driven into scattered
states here, never from stored answers, except a few tiny cases verified by hand.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator, List, Tuple

from ..allocator import PagedKVCacheAllocator
from ..block_table import BlockTable
from ..viz import snapshot
from ._common import call_learner, expect_equal, expect_raises, fail, is_int, passed



def _table_text(table: BlockTable) -> str:
    return f"BlockTable(block_ids={table.block_ids}, num_tokens={table.num_tokens})"


def _scenarios(num_heads: int = 1, head_dim: int = 1, allocate_cache: bool = False) -> Iterator[PagedKVCacheAllocator]:
    """Allocators in varied states: scattered blocks, full last blocks, a reserved empty block, empty sequences."""
    def make(num_blocks: int, block_size: int) -> PagedKVCacheAllocator:
        return PagedKVCacheAllocator(num_blocks, block_size, num_heads, head_dim, allocate_cache=allocate_cache)

    # Lesson 02's pool: sequence 3 lives in blocks 8, 9, 4, 3.
    a = make(10, 4)
    a.allocate_for_sequence(0, 10)
    a.allocate_for_sequence(1, 5)
    a.allocate_for_sequence(2, 7)
    a.free_sequence(1)
    a.append_tokens(0, 3)
    a.allocate_for_sequence(3, 14)
    yield a
    # Full blocks, a block reserved ahead (8 tokens in 3 blocks), an empty sequence.
    b = make(12, 4)
    b.allocate_for_sequence(5, 8)
    b.append_block_to_sequence(5)
    b.allocate_for_sequence(6, 0)
    b.allocate_for_sequence(7, 4)
    b.allocate_for_sequence(8, 1)
    yield b
    # Block size 1 and block size 16, after frees.
    c = make(9, 1)
    c.allocate_for_sequence(0, 3)
    c.allocate_for_sequence(1, 2)
    c.free_sequence(0)
    c.allocate_for_sequence(2, 5)
    yield c
    d = make(8, 16)
    d.allocate_for_sequence(0, 40)
    d.allocate_for_sequence(1, 17)
    d.free_sequence(0)
    d.allocate_for_sequence(2, 33)
    d.append_tokens(1, 15)
    yield d
    # Block size 3, random growth and frees (seeded).
    rng = random.Random(2)
    e = make(30, 3)
    live: List[int] = []
    for seq_id in range(12):
        e.allocate_for_sequence(seq_id, rng.randrange(0, 8))
        live.append(seq_id)
        if len(live) > 3:
            e.free_sequence(live.pop(rng.randrange(len(live))))
        for s in live:
            e.append_tokens(s, rng.randrange(0, 4))
    yield e


# --------------------------------------------------------------------------- 02.1
def check_blocks_needed(my_blocks_needed: Callable[[int, int], int]) -> None:
    """Task 02.1: ``my_blocks_needed(num_tokens, block_size)`` is ceil(num_tokens / block_size), exactly."""
    hand = [(0, 4, 0), (1, 4, 1), (3, 4, 1), (4, 4, 1), (5, 4, 2), (8, 4, 2), (9, 4, 3),
            (1, 1, 1), (16, 16, 1), (17, 16, 2)]
    for n, bs, want in hand:
        call = f"my_blocks_needed({n}, {bs})"
        got = call_learner(my_blocks_needed, (n, bs), call, want)
        if not is_int(got):
            raise fail(call, want, got, "return an int, a number of blocks (not a float, not a bool)")
        expect_equal(call, want, got, "a partly filled last block still counts; 0 tokens need 0 blocks")
    for bs in (1, 2, 3, 4, 7, 16, 256):
        lib = PagedKVCacheAllocator(1, bs, 1, 1, allocate_cache=False)
        for n in sorted(set(range(0, 3 * bs + 3)) | {10 * bs - 1, 10 * bs, 10 * bs + 1, 12345}):
            want = lib.blocks_needed(n)
            call = f"my_blocks_needed({n}, {bs})"
            got = call_learner(my_blocks_needed, (n, bs), call, want)
            if not is_int(got):
                raise fail(call, want, got, "return an int, a number of blocks")
            expect_equal(call, want, got, "n // block_size full blocks, plus one if anything is left over")
    for n, bs in ((2**53 + 1, 1), (2**60 + 1, 2**30), (3**40, 7)):
        want = PagedKVCacheAllocator(1, bs, 1, 1, allocate_cache=False).blocks_needed(n)
        call = f"my_blocks_needed({n}, {bs})"
        got = call_learner(my_blocks_needed, (n, bs), call, want)
        expect_equal(call, want, got, "do not go through floats (n / block_size loses digits past 2**53): "
                     "use integer ceiling division, (n + block_size - 1) // block_size")
    for n, bs in ((-1, 4), (-16, 16)):
        expect_raises(my_blocks_needed, (n, bs), f"my_blocks_needed({n}, {bs})", ValueError,
                       "a negative token count is a caller's bug: raise ValueError")
    for n, bs in ((4, 0), (4, -2)):
        expect_raises(my_blocks_needed, (n, bs), f"my_blocks_needed({n}, {bs})", ValueError,
                       "a block holds at least one token: raise ValueError when block_size < 1")
    passed("02.1")


# --------------------------------------------------------------------------- 02.2
def check_logical_address(my_logical_address: Callable[[int, int], Tuple[int, int]]) -> None:
    """Task 02.2: ``my_logical_address(position, block_size) -> (logical_block, offset)``."""
    hand = [(0, 4, (0, 0)), (3, 4, (0, 3)), (4, 4, (1, 0)), (9, 4, (2, 1)), (5, 1, (5, 0)), (17, 16, (1, 1))]
    for p, bs, want in hand:
        call = f"my_logical_address({p}, {bs})"
        got = call_learner(my_logical_address, (p, bs), call, want)
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(is_int(x) for x in got):
            raise fail(call, want, got, "return a pair of ints: (logical block index, offset in the block)")
        expect_equal(call, want, tuple(got), "logical block = position // block_size, offset = position % block_size")
    for bs in (1, 2, 3, 4, 16):
        length = 5 * bs + 2
        alloc = PagedKVCacheAllocator(-(-length // bs), bs, 1, 1, allocate_cache=False)
        alloc.allocate_for_sequence(0, length)
        for p in range(length):
            t = snapshot.translate(alloc, 0, p)
            want = (t["logical_block"], t["offset"])
            call = f"my_logical_address({p}, {bs})"
            got = call_learner(my_logical_address, (p, bs), call, want)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise fail(call, want, got, "return a pair (logical block index, offset in the block)")
            expect_equal(call, want, tuple(got), "positions count from 0, so does the offset; "
                         "block_size consecutive positions share a logical block")
    for p, bs in ((-1, 4), (-5, 1)):
        expect_raises(my_logical_address, (p, bs), f"my_logical_address({p}, {bs})", ValueError,
                       "positions start at 0; a negative one is a bug: raise ValueError "
                       "(Python's divmod would quietly give block -1)")
    expect_raises(my_logical_address, (3, 0), "my_logical_address(3, 0)", ValueError,
                   "raise ValueError when block_size < 1")
    passed("02.2")


# --------------------------------------------------------------------------- 02.3
def check_physical_block(my_physical_block: Callable[[BlockTable, int, int], int]) -> None:
    """Task 02.3: ``my_physical_block(table, position, block_size)``: the block holding a token, checked."""
    for alloc in _scenarios():
        bs = alloc.block_size
        for seq_id, table in alloc.sequence_block_tables.items():
            for p in range(table.num_tokens):
                want = int(alloc.slot_mapping(seq_id, [p])[0]) // bs
                given = table.copy()
                call = f"my_physical_block({_table_text(table)}, position={p}, block_size={bs})"
                got = call_learner(my_physical_block, (given, p, bs), call, want)
                if not is_int(got):
                    raise fail(call, want, got, "return the physical block id, an int")
                expect_equal(call, want, got, "look the logical block (position // block_size) up in "
                             "table.block_ids")
                if given != table:
                    raise fail(call, f"the table left as {_table_text(table)}", _table_text(given),
                               "only read the table; do not change it")
            capacity = len(table.block_ids) * bs
            for p in sorted({table.num_tokens, capacity - 1, capacity, capacity + bs, -1, -bs} - set(range(table.num_tokens))):
                call = f"my_physical_block({_table_text(table)}, position={p}, block_size={bs})"
                expect_raises(my_physical_block, (table.copy(), p, bs), call, ValueError,
                               "valid positions are 0 .. num_tokens - 1: compare with table.num_tokens, not with "
                               "the capacity of the blocks, and refuse negative positions (Python's negative "
                               "indexing would silently return the last block)")
    passed("02.3")


# --------------------------------------------------------------------------- 02.4
def check_block_fills(my_block_fills: Callable[[BlockTable, int], List[int]]) -> None:
    """Task 02.4: ``my_block_fills(table, block_size)``: tokens stored in each block, in logical order."""
    hand = [(BlockTable([3, 1], num_tokens=6), 4, [4, 2]),
            (BlockTable([0, 2], num_tokens=8), 4, [4, 4]),
            (BlockTable([], num_tokens=0), 4, [])]
    for table, bs, want in hand:
        call = f"my_block_fills({_table_text(table)}, block_size={bs})"
        got = call_learner(my_block_fills, (table.copy(), bs), call, want)
        if not isinstance(got, (list, tuple)):
            raise fail(call, want, got, "return a list with one count per block")
        expect_equal(call, want, list(got), "every block but the last is full; the last holds what is left")
    for alloc in _scenarios():
        bs = alloc.block_size
        tables = alloc.sequence_block_tables
        for row in snapshot.sequence_rows(alloc):
            table = tables[row["seq_id"]]
            want = [entry["fill"] for entry in row["blocks"]]
            given = table.copy()
            call = f"my_block_fills({_table_text(table)}, block_size={bs})"
            got = call_learner(my_block_fills, (given, bs), call, want)
            if not isinstance(got, (list, tuple)) or not all(is_int(x) for x in got):
                raise fail(call, want, got, "return a list of ints, one per block of the table")
            if len(got) != len(table.block_ids):
                raise fail(call, want, list(got), "one entry per block in table.block_ids, including a block "
                           "reserved ahead that holds no token yet (its count is 0)")
            expect_equal(call, want, list(got), "block i holds min(block_size, num_tokens - i * block_size) "
                         "tokens, and never fewer than 0; a full last block holds block_size, not 0")
            if given != table:
                raise fail(call, f"the table left as {_table_text(table)}", _table_text(given),
                           "only read the table; do not change it")
    passed("02.4")
