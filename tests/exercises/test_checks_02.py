"""Exercise 02's checks bite: correct solutions pass with the one success line, planted wrong ones fail
with a message that names the mistake."""

from __future__ import annotations

import math
from collections import deque

import pytest

from paged_kv_lib.grading import (
    check_allocator_02,
    check_block_fills,
    check_blocks_needed,
    check_my_allocator_02,
    check_physical_block,
)
from paged_kv_lib.grading._common import TaskNotWrittenError

from check_helpers import fails, not_implemented, passes


@pytest.mark.parametrize("check", [check_blocks_needed, check_physical_block, check_block_fills])
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 02.1
def blocks_needed(num_tokens, block_size):
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if num_tokens < 0:
        raise ValueError("num_tokens must be >= 0")
    return (num_tokens + block_size - 1) // block_size


def test_blocks_needed_correct(capsys):
    passes(check_blocks_needed, blocks_needed, "02.1", capsys)


def _checked(formula):
    def fn(n, bs):
        if n < 0 or bs < 1:
            raise ValueError("bad input")
        return formula(n, bs)
    return fn


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_checked(lambda n, bs: n // bs + 1), "n // block_size + 1"),
        (_checked(lambda n, bs: n // bs), "partly filled last block is left out"),
        (_checked(lambda n, bs: math.ceil(n / bs)), "2**53"),
        (_checked(lambda n, bs: (n + bs) // bs), "n // block_size + 1"),
        (_checked(lambda n, bs: float(-(-n // bs))), "return an int"),
        (lambda n, bs: (n + bs - 1) // bs, "ValueError"),
        (lambda n, bs: max(0, (n + bs - 1) // bs) if bs > 0 else 0, "ValueError"),
    ],
    ids=["plus-one", "floor", "float-ceil", "off-by-one", "float-type", "no-validation", "no-bs-check"],
)
def test_blocks_needed_wrong(wrong, words):
    message = fails(check_blocks_needed, wrong)
    assert "my_blocks_needed(" in message and words in message, message
    assert "(n + block_size - 1)" not in message and "-(-n" not in message  # no recipe


# --------------------------------------------------------------------------- 02.2
def physical_block(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError(f"position {position} is outside the sequence")
    return table.block_ids[position // block_size]


def test_physical_block_correct(capsys):
    passes(check_physical_block, physical_block, "02.2", capsys)


def capacity_limit(table, position, block_size):
    if not 0 <= position < len(table.block_ids) * block_size:
        raise ValueError("outside")
    return table.block_ids[position // block_size]


def end_inclusive(table, position, block_size):
    if not 0 <= position <= table.num_tokens:
        raise ValueError("outside")
    return table.block_ids[min(position // block_size, len(table.block_ids) - 1)]


def negative_allowed(table, position, block_size):
    if position >= table.num_tokens:
        raise ValueError("outside")
    return table.block_ids[position // block_size]


def off_by_one_block(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError("outside")
    return table.block_ids[min((position + 1) // block_size, len(table.block_ids) - 1)]


def logical_index(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError("outside")
    return position // block_size




def edits_the_table(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError("outside")
    block = table.block_ids[position // block_size]
    table.num_tokens = position  # "consumes" the table
    return block


@pytest.mark.parametrize(
    "wrong, words",
    [
        (capacity_limit, "not the capacity"),
        (end_inclusive, "off by one at the end"),
        (negative_allowed, "negative"),
        (off_by_one_block, "off by one block"),
        (logical_index, "logical block index"),
        (edits_the_table, "inputs modified"),
    ],
    ids=["capacity", "end-inclusive", "negative", "off-by-one-block", "logical-index", "edits-table"],
)
def test_physical_block_wrong(wrong, words):
    message = fails(check_physical_block, wrong)
    assert "my_physical_block(" in message and words in message, message


# --------------------------------------------------------------------------- 02.3
def block_fills(table, block_size):
    return [max(0, min(block_size, table.num_tokens - i * block_size)) for i in range(len(table.block_ids))]


def test_block_fills_correct(capsys):
    passes(check_block_fills, block_fills, "02.3", capsys)


def no_clamp(table, block_size):
    return [min(block_size, table.num_tokens - i * block_size) for i in range(len(table.block_ids))]


def modulo_last(table, block_size):
    n = len(table.block_ids)
    return [block_size] * (n - 1) + [table.num_tokens % block_size] if n else []


def used_blocks_only(table, block_size):
    used = -(-table.num_tokens // block_size)
    return [min(block_size, table.num_tokens - i * block_size) for i in range(used)]


def no_upper_bound(table, block_size):
    return [max(0, table.num_tokens - i * block_size) for i in range(len(table.block_ids))]


def consumes_tokens(table, block_size):
    fills = []
    for _ in table.block_ids:
        fills.append(max(0, min(block_size, table.num_tokens)))
        table.num_tokens = max(0, table.num_tokens - block_size)
    return fills


def returns_tuple(table, block_size):
    return tuple(block_fills(table, block_size))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (no_clamp, "missing clamp"),
        (modulo_last, "counted 0"),
        (used_blocks_only, "one entry per block"),
        (no_upper_bound, "at most block_size"),
        (consumes_tokens, "inputs modified"),
        (returns_tuple, "a list of ints"),
    ],
    ids=["no-clamp", "modulo-last", "used-only", "no-upper-bound", "consumes", "tuple"],
)
def test_block_fills_wrong(wrong, words):
    message = fails(check_block_fills, wrong)
    assert "my_block_fills(" in message and words in message, message


# --------------------------------------------------------------------------- 02.4
class Part1:
    """Exercise 02's part of "your allocator", done right."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables = {}
        self.lengths = {}

    @property
    def num_free_blocks(self):
        return len(self.free)

    def blocks_for(self, n):
        return -(-n // self.block_size)

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if num_prompt_tokens < 0:
            raise ValueError("num_prompt_tokens must be >= 0")
        needed = self.blocks_for(num_prompt_tokens)
        if needed > len(self.free):
            raise RuntimeError(f"need {needed} blocks, {len(self.free)} free")
        table = [self.free.popleft() for _ in range(needed)]
        for block_id in table:
            self.ref_counts[block_id] = 1
        self.tables[seq_id] = table
        self.lengths[seq_id] = num_prompt_tokens

    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        return list(self.tables[seq_id])


def test_my_allocator_02_correct(capsys):
    passes(check_my_allocator_02, Part1, "02.4", capsys)
    passes(check_allocator_02, Part1, "02.4", capsys)


class PlusOne(Part1):
    def blocks_for(self, n):
        return n // self.block_size + 1


class Floor(Part1):
    def blocks_for(self, n):
        return n // self.block_size


class NotAtomic(Part1):
    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables or num_prompt_tokens < 0:
            raise ValueError("bad call")
        self.tables[seq_id] = []
        self.lengths[seq_id] = num_prompt_tokens
        for _ in range(self.blocks_for(num_prompt_tokens)):
            if not self.free:
                raise RuntimeError("out of blocks")
            block_id = self.free.popleft()
            self.ref_counts[block_id] = 1
            self.tables[seq_id].append(block_id)


class OwnList(Part1):
    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError("unknown")
        return self.tables[seq_id]


class FromTheTail(Part1):
    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables or num_prompt_tokens < 0:
            raise ValueError("bad call")
        needed = self.blocks_for(num_prompt_tokens)
        if needed > len(self.free):
            raise RuntimeError("out of blocks")
        self.tables[seq_id] = [self.free.pop() for _ in range(needed)]
        for block_id in self.tables[seq_id]:
            self.ref_counts[block_id] = 1
        self.lengths[seq_id] = num_prompt_tokens


class KeyErrors(Part1):
    def get_block_mapping(self, seq_id):
        return list(self.tables[seq_id])


class WrongError(Part1):
    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if self.blocks_for(num_prompt_tokens) > len(self.free):
            raise ValueError("not enough blocks")
        super().allocate_for_sequence(seq_id, num_prompt_tokens)


class FreeCountMethod(Part1):
    def num_free_blocks(self):
        return len(self.free)


class OtherAttributeNames(Part1):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free_list = self.free
        del self.free

    @property
    def num_free_blocks(self):
        return len(self.free_list)

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        self.free = self.free_list
        try:
            super().allocate_for_sequence(seq_id, num_prompt_tokens)
        finally:
            del self.free


@pytest.mark.parametrize(
    "wrong, words",
    [
        (PlusOne, "n // block_size + 1"),
        (Floor, "partly filled last block"),
        (NotAtomic, "change nothing"),
        (OwnList, "Return a copy"),
        (FromTheTail, "head of the free queue"),
        (KeyErrors, "ValueError"),
        (WrongError, "RuntimeError"),
        (FreeCountMethod, "@property"),
        (OtherAttributeNames, "a.free"),
    ],
    ids=["plus-one", "floor", "not-atomic", "own-list", "from-the-tail", "key-error", "wrong-error", "method",
         "attribute-names"],
)
def test_my_allocator_02_wrong(wrong, words):
    message = fails(check_my_allocator_02, wrong)
    assert words in message, message


@pytest.mark.parametrize("wrong", [PlusOne, Floor, NotAtomic, OwnList, KeyErrors, WrongError, FreeCountMethod])
def test_the_differential_check_catches_them_too(wrong):
    message = fails(check_allocator_02, wrong)
    assert "MyAllocator differs from the library's allocator" in message and "a = MyAllocator(" in message


def test_an_untouched_allocator_is_not_written_yet():
    class Untouched(Part1):
        def allocate_for_sequence(self, seq_id, num_prompt_tokens):
            raise NotImplementedError("Task 02.4: replace this line with your code")

    for check in (check_my_allocator_02, check_allocator_02):
        with pytest.raises(TaskNotWrittenError, match="task 02.4 is not written yet"):
            check(Untouched)
