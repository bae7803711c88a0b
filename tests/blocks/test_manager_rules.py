"""The block manager's rules (``growth_demand``, ``room_to_grow``, ``watermark_blocks``, ``blocks_to_hold``),
checked against what the block manager then does.

The questions and the acts share these helpers (and so does the learner's adapter); here each answer is
compared with the blocks a :class:`BlockManager` really takes when it acts (grow, fork and grow,
allocate), so a rule that drifts from the acts fails, and bad numbers get the library's typed errors.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib import block_manager as rules
from paged_kv_lib.block import BlockTable
from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError


@settings(max_examples=150, deadline=None)
@given(block_size=st.integers(1, 6), prompt=st.integers(0, 20), forks=st.integers(0, 3), grow=st.integers(0, 13))
def test_growth_demand_is_what_growing_takes(block_size, prompt, forks, grow):
    manager = BlockManager(64, block_size, enable_prefix_caching=False)
    manager.allocate_for_sequence(0, prompt)
    for child in range(1, forks + 1):
        manager.fork(0, child)
    needed = rules.growth_demand([manager.table(0)], grow, block_size, manager.blocks)
    free = manager.num_free_blocks
    placed = manager.append_tokens(0, grow)
    assert free - manager.num_free_blocks == needed == len(placed)
    copy = grow > 0 and prompt % block_size != 0 and forks > 0
    assert needed == max(0, -(-(prompt + grow) // block_size) - -(-prompt // block_size)) + copy


@pytest.mark.parametrize("holders, growers, copies", [(2, 1, 1), (2, 2, 1), (3, 3, 2), (5, 2, 2), (4, 1, 1)])
def test_a_shared_tail_is_copied_once_per_writer_but_the_last(holders, growers, copies):
    manager = BlockManager(16, 4)
    manager.allocate_for_sequence(0, 2)
    for child in range(1, holders):
        manager.fork(0, child)
    tables = [manager.table(s) for s in range(growers)]
    assert rules.growth_demand(tables, 1, 4, manager.blocks) == copies
    free = manager.num_free_blocks
    manager.append_tokens_batch(list(range(growers)))
    assert free - manager.num_free_blocks == copies


def test_growth_demand_of_plain_tables():
    blocks = BlockManager(4, 4).blocks
    tables = [BlockTable([0], 4), BlockTable([1], 3), BlockTable([], 0), BlockTable([2, 3], 4)]
    assert rules.growth_demand(tables, 1, 4, blocks) == 2  # the reserve of table 3 takes the token
    assert rules.growth_demand(tables, 0, 4, blocks) == 0


@settings(max_examples=150, deadline=None)
@given(block_size=st.integers(1, 5), prompt=st.integers(1, 12), forked=st.booleans(), free=st.integers(1, 8),
       up_to=st.integers(0, 40))
def test_room_to_grow_is_the_most_that_grows_and_one_more_does_not(block_size, prompt, forked, free, up_to):
    manager = BlockManager(64, block_size, enable_prefix_caching=False)
    manager.allocate_for_sequence(0, prompt)
    if forked:
        manager.fork(0, 1)
    manager.allocate_for_sequence(2, (manager.num_free_blocks - free) * block_size)  # leave `free` blocks
    spare = manager.num_free_blocks
    table = manager.table(0)
    n = rules.room_to_grow(table, up_to, spare, block_size, manager.blocks)
    assert 0 <= n <= up_to
    if n < up_to:  # one token more needs one block more than there is
        assert rules.growth_demand([table], n + 1, block_size, manager.blocks) > spare
    held = table.num_tokens  # and the prompt's next chunk grows by n, or is refused (None) when n is 0
    assert manager.allocate_prompt(0, [7] * (held + up_to), max_new_tokens=up_to) == (held if n else None)
    assert manager.get_num_tokens(0) == held + n


@pytest.mark.parametrize("watermark, num_blocks, reserve", [(0.0, 10, 0), (0.01, 10, 1), (0.1, 10, 1),
                                                            (0.25, 10, 3), (1.0, 7, 7), (1, 7, 7)])
def test_watermark_blocks_is_the_ceiling(watermark, num_blocks, reserve):
    assert rules.watermark_blocks(watermark, num_blocks) == reserve


@pytest.mark.parametrize("bad, error", [(-0.1, InvalidArgumentError), (1.01, InvalidArgumentError),
                                        ("0.1", InvalidTypeError), (True, InvalidTypeError), (None, InvalidTypeError)])
def test_a_bad_watermark_is_a_typed_error_naming_it(bad, error):
    with pytest.raises(error, match="watermark"):
        rules.watermark_blocks(bad, 10)


@settings(max_examples=100, deadline=None)
@given(block_size=st.integers(1, 5), num_blocks=st.integers(1, 24), num_tokens=st.integers(0, 30),
       num_seqs=st.integers(1, 4), watermark=st.sampled_from([0.0, 0.05, 0.2, 0.5]))
def test_blocks_to_hold_says_whether_private_sequences_fit_an_empty_pool(block_size, num_blocks, num_tokens,
                                                                         num_seqs, watermark):
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
    fits = rules.blocks_to_hold(num_tokens, num_seqs, block_size, num_blocks, watermark) <= num_blocks
    placed = 0
    for seq_id in range(num_seqs):
        if manager.can_allocate(num_tokens):
            manager.allocate_for_sequence(seq_id, num_tokens)
            placed += 1
    left = manager.num_free_blocks >= rules.watermark_blocks(watermark, num_blocks)
    assert fits == (placed == num_seqs and left)


def test_blocks_to_hold_refuses_bad_counts():
    with pytest.raises(InvalidArgumentError, match="num_seqs must be >= 1, got 0"):
        rules.blocks_to_hold(4, 0, 4, 10, 0.0)
    with pytest.raises(InvalidTypeError, match="num_tokens"):
        rules.blocks_to_hold(2.5, 1, 4, 10, 0.0)
