"""Block and BlockTable, directly: the block arithmetic, the seed's ``append_block``, copies."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from paged_kv_lib import Block, BlockTable, InvalidArgumentError, InvalidTypeError, blocks_needed, cdiv
from paged_kv_lib.block import tokens_in_blocks


@given(st.integers(0, 10**30), st.integers(1, 10**6))
def test_cdiv_is_the_exact_ceiling(a, b):
    assert cdiv(a, b) == math.ceil(Fraction(a, b))


@given(st.integers(0, 5000), st.integers(1, 64))
def test_blocks_needed_and_tokens_in_blocks(num_tokens, block_size):
    n = blocks_needed(num_tokens, block_size)
    assert n == math.ceil(num_tokens / block_size)
    fill = tokens_in_blocks(num_tokens, n + 1, block_size)  # one block reserved ahead
    assert sum(fill) == num_tokens and fill[-1] == 0 and all(0 <= f <= block_size for f in fill)
    assert fill[:-1] == sorted(fill[:-1], reverse=True)


@pytest.mark.parametrize("num_tokens, block_size, exc, msg", [
    (-1, 4, InvalidArgumentError, "num_tokens must be >= 0, got -1"),
    (1.5, 4, InvalidTypeError, "num_tokens must be an int"),
    (True, 4, InvalidTypeError, "num_tokens must be an int"),
    (4, 0, InvalidArgumentError, "block_size must be >= 1, got 0"),
])
def test_blocks_needed_refuses_bad_counts(num_tokens, block_size, exc, msg):
    with pytest.raises(exc, match=msg):
        blocks_needed(num_tokens, block_size)


def test_block_starts_free():
    block = Block(3)
    assert (block.block_id, block.ref_count, block.block_hash, block.is_free) == (3, 0, None, True)
    block.ref_count = 1
    assert not block.is_free


def test_append_block_is_the_seeds_method():
    table = BlockTable()
    table.append_block(7)
    table.append_block(0)
    assert table.block_ids == [7, 0] and len(table) == 2 and table.num_tokens == 0


@pytest.mark.parametrize("bad, exc, msg", [
    (True, InvalidTypeError, "must be an int"),
    (2.0, InvalidTypeError, "must be an int"),
    ("3", InvalidTypeError, "must be an int"),
    (-1, InvalidArgumentError, ">= 0, got -1"),
    (4, InvalidArgumentError, "block 4 is already logical block 1"),
])
def test_append_block_refuses_bad_ids_and_changes_nothing(bad, exc, msg):
    table = BlockTable([2, 4], 5)
    with pytest.raises(exc, match=msg):
        table.append_block(bad)
    assert table == BlockTable([2, 4], 5)


def test_copy_is_independent_and_equal():
    table = BlockTable([1, 2], 6, [5, 6, 7, 8, 9, 10], [b"k" * 32], b"salt")
    twin = table.copy()
    assert twin == table and twin is not table
    twin.append_block(3)
    twin.token_ids.append(11)
    twin.block_keys.clear()
    assert table == BlockTable([1, 2], 6, [5, 6, 7, 8, 9, 10], [b"k" * 32], b"salt")


class BlockTableMachine(RuleBasedStateMachine):
    """``append_block`` against a plain list: good ids go on the end, bad ones change nothing."""

    def __init__(self):
        super().__init__()
        self.table = BlockTable()
        self.model = []
        self.copies = []

    @rule(block_id=st.one_of(st.integers(-3, 12), st.booleans(), st.floats(0, 3), st.none()))
    def append(self, block_id):
        good = type(block_id) is int and block_id >= 0 and block_id not in self.model
        if good:
            self.table.append_block(block_id)
            self.model.append(block_id)
        else:
            with pytest.raises((InvalidArgumentError, InvalidTypeError)):
                self.table.append_block(block_id)

    @rule()
    def copy(self):
        self.copies.append((self.table.copy(), list(self.model)))

    @invariant()
    def matches_the_model(self):
        assert self.table.block_ids == self.model and len(self.table) == len(self.model)
        for twin, then in self.copies:
            assert twin.block_ids == then, "a copy never sees later appends"


TestBlockTableMachine = BlockTableMachine.TestCase


def test_the_table_is_plain_data():
    """The block manager's fast-path limit is the manager's own: a table holds only its mapping and content."""
    from dataclasses import fields

    assert [f.name for f in fields(BlockTable)] == ["block_ids", "num_tokens", "token_ids", "block_keys", "extra_key"]
