"""Exercise 02's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

import math

import pytest

from paged_kv_lib.grading import check_block_fills, check_blocks_needed, check_logical_address, check_physical_block

from check_helpers import fails, not_implemented, passes




@pytest.mark.parametrize("check", [check_blocks_needed, check_logical_address, check_physical_block, check_block_fills])
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
    "wrong",
    [
        _checked(lambda n, bs: n // bs + 1),                # a whole extra block at exact multiples
        _checked(lambda n, bs: n // bs),                    # drops the partly filled last block
        _checked(lambda n, bs: math.ceil(n / bs)),          # float: wrong past 2**53
        _checked(lambda n, bs: (n + bs) // bs),             # off by one the other way
        _checked(lambda n, bs: float(-(-n // bs))),         # right value, wrong type
        lambda n, bs: (n + bs - 1) // bs,                   # no validation: -1 tokens give 0 blocks
        lambda n, bs: max(0, (n + bs - 1) // bs) if bs > 0 else 0,  # ignores a bad block size
    ],
    ids=["plus-one", "floor", "float-ceil", "off-by-one", "float-type", "no-validation", "no-bs-check"],
)
def test_blocks_needed_wrong(wrong):
    message = fails(check_blocks_needed, wrong)
    assert "my_blocks_needed(" in message and "expected" in message


def test_blocks_needed_failure_message_names_the_call():
    message = fails(check_blocks_needed, _checked(lambda n, bs: n // bs + 1))
    assert "my_blocks_needed(0, 4)" in message and "got:      1" in message


# --------------------------------------------------------------------------- 02.2
def logical_address(position, block_size):
    if position < 0 or block_size < 1:
        raise ValueError("position must be >= 0 and block_size >= 1")
    return divmod(position, block_size)


def test_logical_address_correct(capsys):
    passes(check_logical_address, logical_address, "02.2", capsys)


@pytest.mark.parametrize(
    "wrong",
    [
        lambda p, bs: divmod(p, bs),                                        # accepts negative positions
        lambda p, bs: logical_address(p, bs)[::-1],                         # (offset, block)
        lambda p, bs: (p // bs + 1, p % bs) if p >= 0 and bs > 0 else logical_address(p, bs),  # 1-based blocks
        lambda p, bs: ((p - 1) // bs, (p - 1) % bs) if p >= 0 and bs > 0 else logical_address(p, bs),
        lambda p, bs: [p // bs] if p >= 0 and bs > 0 else logical_address(p, bs),  # not a pair
    ],
    ids=["no-validation", "swapped", "one-based", "shifted", "not-a-pair"],
)
def test_logical_address_wrong(wrong):
    fails(check_logical_address, wrong)


# --------------------------------------------------------------------------- 02.3
def physical_block(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError(f"position {position} is outside 0..{table.num_tokens - 1}")
    return table.block_ids[position // block_size]


def test_physical_block_correct(capsys):
    passes(check_physical_block, physical_block, "02.3", capsys)


def against_capacity(table, position, block_size):
    if not 0 <= position < len(table.block_ids) * block_size:
        raise ValueError("outside the blocks")
    return table.block_ids[position // block_size]


def no_negative_check(table, position, block_size):
    if position >= table.num_tokens:
        raise ValueError("past the end")
    return table.block_ids[position // block_size]


def index_error_instead(table, position, block_size):
    return table.block_ids[position // block_size]


def sorted_table(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError("outside")
    return sorted(table.block_ids)[position // block_size]


def mutates(table, position, block_size):
    if not 0 <= position < table.num_tokens:
        raise ValueError("outside")
    table.block_ids.sort()
    return table.block_ids[position // block_size]


@pytest.mark.parametrize("wrong", [against_capacity, no_negative_check, index_error_instead, sorted_table, mutates])
def test_physical_block_wrong(wrong):
    fails(check_physical_block, wrong)


def test_physical_block_hint_mentions_num_tokens():
    assert "num_tokens" in fails(check_physical_block, against_capacity)


# --------------------------------------------------------------------------- 02.4
def block_fills(table, block_size):
    return [max(0, min(block_size, table.num_tokens - i * block_size)) for i in range(len(table.block_ids))]


def test_block_fills_correct(capsys):
    passes(check_block_fills, block_fills, "02.4", capsys)


def modulo_last(table, block_size):
    n, k = table.num_tokens, len(table.block_ids)
    return [block_size] * (k - 1) + [n % block_size] if k else []


def ignores_reserved(table, block_size):
    n = table.num_tokens
    return [min(block_size, n - i * block_size) for i in range(-(-n // block_size))]


def all_full(table, block_size):
    return [block_size] * len(table.block_ids)


def off_by_one(table, block_size):
    return [max(0, min(block_size, table.num_tokens - i * block_size - 1)) for i in range(len(table.block_ids))]


@pytest.mark.parametrize("wrong", [modulo_last, ignores_reserved, all_full, off_by_one])
def test_block_fills_wrong(wrong):
    fails(check_block_fills, wrong)
