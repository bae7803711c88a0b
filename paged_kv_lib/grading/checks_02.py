"""Checks of exercise 02, blocks and block tables: blocks needed, a checked lookup, block fills,
and the first part of "your allocator" (create, allocate, the mapping, the free count).

Expected values come from the library (``PagedKVCacheAllocator.blocks_needed``,
``slot_mapping``, the views' ``snapshot`` data) on allocators driven into scattered
states here, never from stored answers, except a few tiny cases verified by hand. When
an answer is wrong in a way learners often get it wrong, the hint names that mistake.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Iterator, List

from ..allocator import PagedKVCacheAllocator
from ..block import tokens_in_blocks
from ..block_table import BlockTable
from ._common import CheckFailure, call_learner, expect_equal, expect_raises, fail, is_int, not_written, passed



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
def _blocks_needed_mistake(n: int, bs: int, got: Any) -> str:
    """Name the usual wrong formula behind a wrong block count."""
    if got == n // bs + 1 and n % bs == 0:
        return ("n // block_size + 1 blocks: one block too many whenever the tokens fill their last block "
                "exactly (and one block for 0 tokens)")
    if got == n // bs and n % bs:
        return "n // block_size blocks: the partly filled last block is left out"
    if n > 2**53:
        return "this count passes 2**53, where a float can no longer hold every integer: stay in integers"
    return "a partly filled last block still counts as a block; 0 tokens need 0 blocks"


def check_blocks_needed(my_blocks_needed: Callable[[int, int], int]) -> None:
    """Task 02.1: ``my_blocks_needed(num_tokens, block_size)`` is ceil(num_tokens / block_size), exactly."""
    hand = [(0, 4), (1, 4), (3, 4), (4, 4), (5, 4), (8, 4), (9, 4), (1, 1), (16, 16), (17, 16)]
    library = [(n, bs) for bs in (1, 2, 3, 4, 7, 16, 256)
               for n in sorted(set(range(0, 3 * bs + 3)) | {10 * bs - 1, 10 * bs, 10 * bs + 1, 12345})]
    huge = [(2**53 + 1, 1), (2**60 + 1, 2**30), (3**40, 7)]
    for n, bs in hand + library + huge:
        want = PagedKVCacheAllocator(1, bs, 1, 1, allocate_cache=False).blocks_needed(n)
        call = f"my_blocks_needed({n}, {bs})"
        got = call_learner(my_blocks_needed, (n, bs), call, want)
        if not is_int(got):
            raise fail(call, want, got, "return an int, a number of blocks (not a float, not a bool)")
        expect_equal(call, want, got, _blocks_needed_mistake(n, bs, got))
    for n, bs in ((-1, 4), (-16, 16)):
        expect_raises(my_blocks_needed, (n, bs), f"my_blocks_needed({n}, {bs})", ValueError,
                      "a negative token count is a caller's bug: raise ValueError")
    for n, bs in ((4, 0), (4, -2)):
        expect_raises(my_blocks_needed, (n, bs), f"my_blocks_needed({n}, {bs})", ValueError,
                      "a block holds at least one token: raise ValueError when block_size < 1")
    passed("02.1")


# --------------------------------------------------------------------------- 02.2
def _lookup_mistake(table: BlockTable, p: int, bs: int, got: Any) -> str:
    ids = table.block_ids
    logical = p // bs
    for shift in (-1, 1):
        if 0 <= logical + shift < len(ids) and got == ids[logical + shift] and got != ids[logical]:
            edge = "first" if p % bs == 0 else "last" if p % bs == bs - 1 else "a"
            return (f"off by one block: position {p} is the {edge} slot of logical block {logical}, "
                    f"and you returned the block of logical block {logical + shift}")
    if got == logical:
        return "that is the logical block index; the answer is the physical block the table maps it to"
    return "the physical block id comes from table.block_ids"


def check_physical_block(my_physical_block: Callable[[BlockTable, int, int], int]) -> None:
    """Task 02.2: ``my_physical_block(table, position, block_size)``: the block holding a token, checked."""
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
                expect_equal(call, want, got, _lookup_mistake(table, p, bs, got))
                if given != table:
                    raise fail(call, f"the table left as {_table_text(table)}", _table_text(given),
                               "inputs modified: only read the table")
            capacity = len(table.block_ids) * bs
            # Past-the-capacity slots before position num_tokens, so each mistake gets its own hint.
            invalid = [-bs, -1, capacity - 1, capacity, capacity + bs, table.num_tokens]
            for p in dict.fromkeys(q for q in invalid if not 0 <= q < table.num_tokens):
                call = f"my_physical_block({_table_text(table)}, position={p}, block_size={bs})"
                if p < 0:
                    hint = ("a negative position was accepted: Python's negative indexing quietly reads a block "
                            "from the end of the list")
                elif p == table.num_tokens:
                    hint = (f"off by one at the end: the sequence holds {table.num_tokens} tokens, so position "
                            f"{p} holds none")
                elif p < capacity:
                    hint = (f"position {p} is a slot of the last block that holds no token yet: the limit is the "
                            "token count, not the capacity of the blocks")
                else:
                    hint = f"position {p} lies past every block of the table"
                expect_raises(my_physical_block, (table.copy(), p, bs), call, ValueError, hint)
    passed("02.2")


# --------------------------------------------------------------------------- 02.3
def _fills_mistake(table: BlockTable, bs: int, want: List[int], got: List[Any]) -> str:
    if len(got) != len(want):
        return ("one entry per block in table.block_ids, including a block reserved ahead that holds no "
                "token yet")
    if any(isinstance(x, int) and x < 0 for x in got):
        return ("a negative count: a block reserved ahead of the tokens holds 0 of them (a missing clamp "
                "at 0)")
    full_last = [i for i, (w, g) in enumerate(zip(want, got)) if w == bs and g == 0]
    if full_last:
        return (f"block {full_last[0]} is full and you counted 0: num_tokens % block_size is 0 both for an "
                "empty last block and for a full one")
    if any(isinstance(x, int) and x > bs for x in got):
        return f"a block holds at most block_size = {bs} tokens"
    return "every block but the last used one is full; the last one holds what is left"


def check_block_fills(my_block_fills: Callable[[BlockTable, int], List[int]]) -> None:
    """Task 02.3: ``my_block_fills(table, block_size)``: tokens stored in each block, in logical order."""
    hand = [(BlockTable([3, 1], num_tokens=6), 4, [4, 2]),
            (BlockTable([0, 2], num_tokens=8), 4, [4, 4]),
            (BlockTable([], num_tokens=0), 4, []),
            # Blocks reserved ahead of the tokens (lookahead slots for speculative decoding).
            (BlockTable([4, 7, 1], num_tokens=2), 4, [2, 0, 0]),
            (BlockTable([3, 6], num_tokens=0), 2, [0, 0]),
            (BlockTable([9, 8, 5, 0], num_tokens=3), 1, [1, 1, 1, 0])]
    cases = [(t, bs, want) for t, bs, want in hand]
    for alloc in _scenarios():
        for table in alloc.sequence_block_tables.values():
            cases.append((table, alloc.block_size,
                          tokens_in_blocks(table.num_tokens, len(table.block_ids), alloc.block_size)))
    for table, bs, want in cases:
        given = table.copy()
        call = f"my_block_fills({_table_text(table)}, block_size={bs})"
        got = call_learner(my_block_fills, (given, bs), call, want)
        if not isinstance(got, list) or not all(is_int(x) for x in got):
            raise fail(call, want, got, "return a list of ints, one per block of the table")
        expect_equal(call, want, got, _fills_mistake(table, bs, want, got))
        if given != table:
            raise fail(call, f"the table left as {_table_text(table)}", _table_text(given),
                       "inputs modified: only read the table")
    passed("02.3")


# --------------------------------------------------------------------------- 02.4
def _new(cls: Any, num_blocks: int, block_size: int) -> Any:
    return call_learner(cls, (num_blocks, block_size), f"MyAllocator({num_blocks}, {block_size})", "an allocator")


def _free_count(alloc: Any, call: str, want: int, hint: str) -> None:
    try:
        got = alloc.num_free_blocks
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except Exception as exc:  # the learner's property raised
        raise fail(f"{call}  then a.num_free_blocks", want, f"it raised {type(exc).__name__}: {exc}", hint) from None
    if callable(got):
        raise fail(f"{call}  then a.num_free_blocks", want, "a method",
                   "num_free_blocks is read without calling it: make it an attribute or a @property")
    if not is_int(got):
        raise fail(f"{call}  then a.num_free_blocks", want, got, "num_free_blocks must be an int")
    expect_equal(f"{call}  then a.num_free_blocks", want, got, hint)


def _mapping(alloc: Any, seq_id: int, call: str, want: List[int], hint: Any) -> List[int]:
    """``hint`` is a string, or a function of the wrong mapping that returns one."""
    full = f"{call}  then a.get_block_mapping({seq_id})"
    got = call_learner(alloc.get_block_mapping, (seq_id,), full, want)
    if not isinstance(got, list) or not all(is_int(b) for b in got):
        raise fail(full, want, got, "get_block_mapping returns a list of int block ids")
    if got != want:
        raise fail(full, want, got, hint(got) if callable(hint) else hint)
    return got


def _count_mistake(n: int, bs: int) -> Callable[[List[int]], str]:
    def hint(got: List[int]) -> str:
        if len(got) != -(-n // bs):
            return _blocks_needed_mistake(n, bs, len(got))
        return "take the blocks from the head of the free queue, in order"
    return hint


def _state(alloc: Any, call: str, want: dict) -> None:
    """The pinned attributes exercises 03, 05 and 06 build on."""
    for name, value in want.items():
        try:
            got = getattr(alloc, name)
        except AttributeError:
            raise fail(f"{call}  then a.{name}", value, "no such attribute",
                       f"keep your state in the attributes the exercise names (a.{name}): the next exercises "
                       "build on them") from None
        if name == "free":
            if not isinstance(got, deque):
                raise fail(f"{call}  then type(a.free)", "collections.deque", type(got).__name__,
                           "keep the free queue a deque (popleft takes the head, append adds at the tail)")
            got = list(got)
            value = list(value)
        expect_equal(f"{call}  then a.{name}", value, got,
                     f"a.{name} disagrees with what your methods report: keep it up to date")


def check_my_allocator_02(MyAllocator: Any) -> None:
    """Task 02.4: the first methods of "your allocator", in scripted cases that name the usual mistakes."""
    a = _new(MyAllocator, 8, 4)
    _free_count(a, "a = MyAllocator(8, 4)", 8, "a new pool has every block free")
    steps = "a = MyAllocator(8, 4); a.allocate_for_sequence(0, 10)"
    call_learner(a.allocate_for_sequence, (0, 10), steps, None)
    _mapping(a, 0, steps, [0, 1, 2], _count_mistake(10, 4))
    _free_count(a, steps, 5, "num_free_blocks must drop by the blocks handed out")
    steps += "; a.allocate_for_sequence(1, 8)"
    call_learner(a.allocate_for_sequence, (1, 8), steps, None)
    _mapping(a, 1, steps, [3, 4], _count_mistake(8, 4))
    steps += "; a.allocate_for_sequence(2, 0)"
    call_learner(a.allocate_for_sequence, (2, 0), steps, None)
    _mapping(a, 2, steps, [], _count_mistake(0, 4))
    _free_count(a, steps, 3, "a sequence of 0 tokens takes no block")
    _state(a, steps, {"block_size": 4, "free": [5, 6, 7], "ref_counts": [1, 1, 1, 1, 1, 0, 0, 0],
                      "tables": {0: [0, 1, 2], 1: [3, 4], 2: []}, "lengths": {0: 10, 1: 8, 2: 0}})

    # Refusals: each must raise the right kind of error and change nothing.
    refusals = [((0, 1), ValueError, "sequence 0 already exists: a duplicate id is a ValueError"),
                ((3, 13), RuntimeError, "13 tokens need 4 blocks and only 3 are free: too few blocks is a RuntimeError"),
                ((4, -1), ValueError, "a negative token count is a ValueError")]
    for args, error, hint in refusals:
        call = f"{steps}; a.allocate_for_sequence{args}"
        expect_raises(a.allocate_for_sequence, args, call, error, hint)
        _free_count(a, call, 3, "a refused call must change nothing: it took blocks before it knew it would fail")
        if args[0] != 0:
            expect_raises(a.get_block_mapping, (args[0],), f"{call}  then a.get_block_mapping({args[0]})", ValueError,
                          f"a refused call must change nothing: sequence {args[0]} was registered anyway")
        _mapping(a, 0, call, [0, 1, 2], "a refused call must change nothing")
    _state(a, f"{steps} (then three refused calls)",
           {"free": [5, 6, 7], "ref_counts": [1, 1, 1, 1, 1, 0, 0, 0],
            "tables": {0: [0, 1, 2], 1: [3, 4], 2: []}, "lengths": {0: 10, 1: 8, 2: 0}})

    # The mapping is a copy, and unknown ids are refused.
    mapping = call_learner(a.get_block_mapping, (0,), f"{steps}; a.get_block_mapping(0)", [0, 1, 2])
    if isinstance(mapping, list):
        mapping.append(7)
        _mapping(a, 0, f"{steps}; m = a.get_block_mapping(0); m.append(7)", [0, 1, 2],
                 "get_block_mapping handed out your own list: a caller's edit changed your table. Return a copy")
    expect_raises(a.get_block_mapping, (9,), f"{steps}; a.get_block_mapping(9)", ValueError,
                  "an unknown sequence id is a ValueError")

    # A pool filled exactly, in blocks of 1 and of 5.
    for bs, tokens in ((1, [3, 2, 1]), (5, [5, 20, 1])):
        b = _new(MyAllocator, 6, bs)
        line = f"a = MyAllocator(6, {bs})"
        start = 0
        for seq_id, n in enumerate(tokens):
            line += f"; a.allocate_for_sequence({seq_id}, {n})"
            call_learner(b.allocate_for_sequence, (seq_id, n), line, None)
            k = -(-n // bs)
            _mapping(b, seq_id, line, list(range(start, start + k)), _count_mistake(n, bs))
            start += k
        _free_count(b, line, 6 - start, "free blocks = blocks never handed out")
        expect_raises(b.allocate_for_sequence, (7, 1), f"{line}; a.allocate_for_sequence(7, 1)", RuntimeError,
                      "the pool is full: one more token needs a block that is not there")
    passed("02.4")


def run_differential(cls: Any, part: str, task: str, max_examples: int = 50) -> None:
    """Run ``check_allocator`` on the parts built so far and turn its report into a check failure."""
    from ..conformance.differential import PARTS, check_allocator

    try:
        check_allocator(cls, ops=PARTS[part], max_examples=max_examples, name="MyAllocator")
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except AssertionError as exc:
        raise CheckFailure(str(exc)) from None
    passed(task)


def check_allocator_02(MyAllocator: Any) -> None:
    """Task 02.4, second check: random call sequences beside the library's allocator (allocate and look up)."""
    run_differential(MyAllocator, "02", "02.4")
