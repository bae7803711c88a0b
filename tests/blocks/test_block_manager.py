"""BlockManager, directly and through public names only: the bookkeeping without any tensor.

A hypothesis state machine drives every act (allocate with and without token ids, grow one
sequence or a batch, fork, copy before a write, reserve a block, swap out and in, free) against
a model of each sequence's token count and content; after every step the invariants hold, every
count agrees with the model, and every refused call raised a typed error and changed nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged_kv_lib import (
    BlocksInUseError,
    BlockTable,
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidTypeError,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    PagedKVError,
    SequenceStateError,
    UnknownSequenceError,
    cdiv,
)
from paged_kv_lib.block_manager import BlockManager

from helpers import assert_same_state, snapshot


def test_a_walkthrough_without_tensors():
    copies = []
    m = BlockManager(6, 4, on_copy=lambda src, dst: copies.append((src, dst)))
    assert m.allocate_for_sequence(0, 6) == 0
    assert m.get_block_mapping(0) == [0, 1] and m.get_num_tokens(0) == 6 and m.num_free_blocks == 4
    assert m.append_tokens(0, 2) == () and m.append_tokens(0) == (2,)
    m.fork(0, 1)
    assert m.blocks[2].ref_count == 2 and m.sequence_block_tables[1] == m.sequence_block_tables[0]
    assert m.append_tokens(1) == (3,) and copies == [(2, 3)], "the child's write copies the shared tail"
    assert m.copy_log == ((2, 3),) and m.num_copies == 1
    m.free_sequence(0)
    assert m.free_blocks == (4, 5, 2) and m.seq_ids == (1,)
    m.free_sequence(0)  # unknown: a no-op, as in the seed
    m.check_invariants()
    stats = m.stats()
    assert (stats.used_blocks, stats.num_sequences, stats.logical_tokens, stats.cow_copies) == (3, 1, 10, 1)


def test_the_seeds_names_are_copies():
    m = BlockManager(4, 2)
    m.allocate_for_sequence(5, 3)
    m.sequence_block_tables[5].block_ids.append(3)
    m.blocks[0].ref_count = 9
    m.get_block_mapping(5).clear()
    assert m.get_block_mapping(5) == [0, 1] and m.blocks[0].ref_count == 1
    assert isinstance(m.sequence_block_tables[5], BlockTable) and m.free_blocks == (2, 3)


def test_append_block_to_sequence_only_when_full():
    m = BlockManager(3, 4)
    m.allocate_for_sequence(0, 3)
    with pytest.raises(SequenceStateError, match="still has room: 3 tokens in 1 blocks of 4"):
        m.append_block_to_sequence(0)
    m.append_tokens(0)
    assert m.append_block_to_sequence(0) == 1 and m.get_block_mapping(0) == [0, 1]
    assert m.append_tokens(0, 4) == (), "the reserved block takes the next tokens"
    m.check_invariants()


def test_prefix_hits_and_reset():
    m = BlockManager(8, 2)
    assert m.allocate_for_sequence(0, 5, token_ids=[1, 2, 3, 4, 5]) == 0
    assert m.cached_prefix_tokens([1, 2, 3, 4, 9]) == 4
    assert m.allocate_for_sequence(1, 5, token_ids=[1, 2, 3, 4, 9]) == 4
    assert m.get_block_mapping(1)[:2] == m.get_block_mapping(0)[:2] and m.prefix_counters == (4, 2)
    assert m.allocate_for_sequence(2, 4, token_ids=[1, 2, 3, 4], extra_key="tenant") == 0
    with pytest.raises(BlocksInUseError):
        m.reset_prefix_cache()
    for s in (0, 1, 2):
        m.free_sequence(s)
    assert m.num_cached_free_blocks == len(m.cached_blocks) == 4
    assert m.reset_prefix_cache() == 4 and m.cached_blocks == {} and m.num_cached_free_blocks == 0
    m.check_invariants()


def test_swap_round_trip_names_the_blocks_to_copy():
    m = BlockManager(4, 2, num_cpu_blocks=3)
    m.allocate_for_sequence(0, 3)
    m.fork(0, 1)
    device, cpu = m.swap_out(1)
    assert device == [0, 1] and cpu == [0, 1] and m.is_swapped(1) and m.swapped_seq_ids == (1,)
    assert m.num_free_blocks == 2, "the blocks 0 still holds stay on the device"
    assert m.swapped_block_tables[1].block_ids == [0, 1] and m.free_cpu_blocks == (2,)
    with pytest.raises(SequenceStateError, match="swapped out"):
        m.append_tokens(1)
    back_cpu, back_device = m.swap_in(1)
    assert back_cpu == [0, 1] and back_device == [2, 3] and not m.is_swapped(1) and m.get_num_tokens(1) == 3
    assert m.num_free_cpu_blocks == 3
    m.check_invariants()


def declining_pool(kind):
    """A nearly full pool (prefix caching on, a CPU pool of 3): sequence 0 of 8 tokens, 1 (its fork) and 2 (20 tokens)
    resident, 3 and 4 swapped out (1 block each); one block free, one CPU block free."""
    m = kind(8, 4, num_cpu_blocks=3) if kind is BlockManager else kind(8, 4, 1, 2, num_cpu_blocks=3)
    m.allocate_for_sequence(0, 8, token_ids=list(range(8)))
    m.fork(0, 1)
    for seq_id, n in ((3, 4), (4, 3), (2, 20)):
        m.allocate_for_sequence(seq_id, n, token_ids=[seq_id] * n)
        if seq_id != 2:
            m.swap_out(seq_id)
    m.allocate_for_sequence(5, 4)
    m.free_sequence(5)
    return m


DECLINED = [  # each call checks and acts in one: it does not fit here, so it answers None and changes nothing
    ("allocate_slots", lambda m: m.allocate_slots([0, 1, 2], 4)),
    ("allocate_slots, watermark", lambda m: m.allocate_slots([2], 1, watermark=0.2)),
    ("allocate_prompt, new", lambda m: m.allocate_prompt(6, list(range(100, 109)))),
    ("allocate_prompt, watermark", lambda m: m.allocate_prompt(6, [1], watermark=0.2)),
    ("allocate_prompt, next chunk", lambda m: m.allocate_prompt(0, list(range(8)) + [5] * 9, watermark=0.2)),
    ("allocate_prompt, chunk of a full table", lambda m: m.allocate_prompt(2, [2] * 20 + [7] * 9, watermark=0.2)),
    ("swap_out, a group", lambda m: m.swap_out(0, 1)),
    ("swap_out, one", lambda m: m.swap_out(2)),
    ("swap_in, a group", lambda m: m.swap_in(3, 4)),
    ("swap_in, watermark", lambda m: m.swap_in(3, watermark=0.2)),
]


@pytest.mark.parametrize("kind", [BlockManager, PagedKVCacheAllocator], ids=["manager", "allocator"])
@pytest.mark.parametrize("name, call", DECLINED, ids=[c[0] for c in DECLINED])
def test_a_check_and_act_call_that_does_not_fit_changes_nothing(kind, name, call):
    m = declining_pool(kind)
    assert m.num_free_blocks == 1 and m.num_free_cpu_blocks == 1
    before = snapshot(m)
    assert call(m) is None
    assert_same_state(before, snapshot(m))
    m.check_invariants()


BAD_CALLS = [
    ("unknown id", lambda m: m.append_tokens(42), UnknownSequenceError, "42"),
    ("bool id", lambda m: m.append_tokens(True), InvalidTypeError, "bool"),
    ("negative growth", lambda m: m.append_tokens(0, -1), InvalidArgumentError, ">= 0"),
    ("float growth", lambda m: m.append_tokens(0, 1.0), InvalidTypeError, "float"),
    ("duplicate", lambda m: m.allocate_for_sequence(0, 1), DuplicateSequenceError, "already"),
    ("too big", lambda m: m.allocate_for_sequence(7, 99), OutOfBlocksError, "need 25"),
    ("batch too big", lambda m: m.append_tokens_batch([0, 1], 40), OutOfBlocksError, "grow 2 sequences"),
    ("batch of bools equal to the last ids", lambda m: m.append_tokens_batch([False, True]), InvalidTypeError, "bool"),
    ("batch repeat", lambda m: m.append_tokens_batch([0, 0]), InvalidArgumentError, "twice"),
    ("batch unknown", lambda m: m.append_tokens_batch([0, 9]), UnknownSequenceError, "9"),
    ("batch tokens", lambda m: m.append_tokens_batch([0], token_ids=[[1], [2]]), InvalidArgumentError, "2 entries"),
    ("bare bool token", lambda m: m.allocate_slots([0], 1, token_ids=[True]), InvalidTypeError, "bool"),
    ("bare float token", lambda m: m.allocate_slots([0], 1, token_ids=[1.5]), InvalidTypeError, "sequence of ints"),
    ("bare token past 64 bits", lambda m: m.allocate_slots([0], 1, token_ids=[2**64]), InvalidArgumentError, "64 bits"),
    ("a bad token after a good one", lambda m: m.allocate_slots([0, 1], 1, token_ids=[3, True]), InvalidTypeError,
     "bool"),
    ("bare token for two", lambda m: m.allocate_slots([0], 2, token_ids=[3]), InvalidArgumentError, "1 token_ids"),
    ("fork onto itself", lambda m: m.fork(0, 0), DuplicateSequenceError, "already"),
    ("swap out twice", lambda m: m.swap_out(0, 0), InvalidArgumentError, "twice"),
    ("swap out unknown", lambda m: m.swap_out(0, 9), UnknownSequenceError, "9"),
    ("swap in resident", lambda m: m.swap_in(0), SequenceStateError, "not swapped out"),
    ("token count mismatch", lambda m: m.append_tokens(0, 2, token_ids=[1]), InvalidArgumentError, "1 token_ids"),
]


@pytest.mark.parametrize("name, call, exc, msg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_typed_errors_and_change_nothing(name, call, exc, msg):
    m = BlockManager(6, 4)
    m.allocate_for_sequence(0, 5, token_ids=[1, 2, 3, 4, 5])
    m.allocate_for_sequence(1, 4)
    m.append_tokens_batch([0, 1])  # a step before: refusals must not trust the last one's ids
    before = snapshot(m)
    with pytest.raises(exc, match=msg) as info:
        call(m)
    assert isinstance(info.value, PagedKVError)
    assert_same_state(before, snapshot(m))
    m.check_invariants()


@pytest.mark.parametrize("call, exc, msg", [
    (lambda m: m.swap_in(1, 1), InvalidArgumentError, "twice"),
    (lambda m: m.swap_in(1, 9), UnknownSequenceError, "9"),
    (lambda m: m.swap_in(1, 0), SequenceStateError, "not swapped out"),
    (lambda m: m.swap_in(True), InvalidTypeError, "bool"),
], ids=["repeated", "unknown", "resident", "bool id"])
def test_a_bad_swap_in_raises_a_typed_error_and_brings_nothing_back(call, exc, msg):
    m = BlockManager(6, 4, num_cpu_blocks=4)
    m.allocate_for_sequence(0, 5)
    m.allocate_for_sequence(1, 3)
    m.swap_out(1)
    before = snapshot(m)
    with pytest.raises(exc, match=msg):
        call(m)
    assert_same_state(before, snapshot(m))
    assert m.is_swapped(1)
    m.check_invariants()


class ManagerMachine(RuleBasedStateMachine):
    """Every act of the block manager against a model of each sequence's length and content."""

    def __init__(self):
        super().__init__()
        self.lengths = {}  # resident seq_id -> tokens
        self.swapped = {}  # swapped-out seq_id -> tokens
        self.next_id = 0
        self.last_batch = []

    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 3, 4]),
                num_cpu_blocks=st.integers(0, 6), caching=st.booleans())
    def init(self, num_blocks, block_size, num_cpu_blocks, caching):
        self.copies = []
        self.m = BlockManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks,
                              enable_prefix_caching=caching, on_copy=lambda s, d: self.copies.append((s, d)))

    def _refused(self, call, exc=PagedKVError):
        before = snapshot(self.m)
        with pytest.raises(exc):
            call()
        assert_same_state(before, snapshot(self.m))

    def _declined(self, call):
        """A check-and-act call that does not fit answers ``None`` and changes nothing."""
        before = snapshot(self.m)
        assert call() is None
        assert_same_state(before, snapshot(self.m))

    def _pick(self, data, pool):
        return data.draw(st.sampled_from(sorted(pool)))

    @rule(tokens=st.lists(st.integers(0, 2), max_size=12), with_ids=st.booleans())
    def allocate(self, tokens, with_ids):
        m, seq_id, n = self.m, self.next_id, len(tokens)
        ids = tokens if with_ids else None
        if not m.can_allocate(n, token_ids=ids):
            self._refused(lambda: m.allocate_for_sequence(seq_id, n, token_ids=ids), OutOfBlocksError)
            return
        cached = m.allocate_for_sequence(seq_id, n, token_ids=ids)
        assert 0 <= cached <= n and cached % m.block_size == 0
        self.lengths[seq_id] = n
        self.next_id += 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), n=st.integers(0, 6), with_ids=st.booleans())
    def grow_one(self, data, n, with_ids):
        m = self.m
        seq_id = self._pick(data, self.lengths)
        ids = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)) if with_ids else None
        if m.blocks_to_append(seq_id, n) > m.num_free_blocks:
            self._refused(lambda: m.append_tokens(seq_id, n, token_ids=ids), OutOfBlocksError)
            return
        before = m.get_block_mapping(seq_id)
        placed = m.append_tokens(seq_id, n, token_ids=ids)
        self.lengths[seq_id] += n
        after = m.get_block_mapping(seq_id)
        assert set(placed) == set(after) - set(before), "it returns exactly the blocks it placed"

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), n=st.integers(0, 3), with_ids=st.booleans(), again=st.booleans())
    def grow_batch(self, data, n, with_ids, again):
        m = self.m
        ids = data.draw(st.lists(st.sampled_from(sorted(self.lengths)), min_size=1, unique=True))
        if again and self.last_batch and set(self.last_batch) <= set(self.lengths):
            ids = self.last_batch  # the same ids as last time: the batch's memo answers
        tokens = [[1] * n for _ in ids] if with_ids else None
        if not m.can_append(ids, n):
            self._refused(lambda: m.append_tokens_batch(ids, n, token_ids=tokens), OutOfBlocksError)
            return
        placed = m.append_tokens_batch(ids, n, token_ids=tokens)
        self.last_batch = list(ids)
        assert set(placed) <= set(ids)
        for seq_id in ids:
            self.lengths[seq_id] += n

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def fork(self, data):
        parent = self._pick(data, self.lengths)
        self.m.fork(parent, self.next_id)
        self.lengths[self.next_id] = self.lengths[parent]
        self.next_id += 1

    @precondition(lambda self: any(self.lengths.values()))
    @rule(data=st.data())
    def write_into(self, data):
        m = self.m
        seq_id = self._pick(data, [s for s, n in self.lengths.items() if n])
        logical = data.draw(st.lists(st.integers(0, cdiv(self.lengths[seq_id], m.block_size) - 1), min_size=1))
        shared = {i for i in logical if m.blocks[m.get_block_mapping(seq_id)[i]].ref_count > 1}
        if len(shared) > m.num_free_blocks:
            self._refused(lambda: m.make_writable(seq_id, logical), OutOfBlocksError)
            return
        copies = m.make_writable(seq_id, logical)
        assert len(copies) == len(shared)
        mapping = m.get_block_mapping(seq_id)
        assert all(m.blocks[mapping[i]].ref_count == 1 for i in logical), "the writer now holds them alone"

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def reserve_block(self, data):
        m = self.m
        seq_id = self._pick(data, self.lengths)
        full = self.lengths[seq_id] == len(m.get_block_mapping(seq_id)) * m.block_size
        if not full or not m.num_free_blocks:
            self._refused(lambda: m.append_block_to_sequence(seq_id))
            return
        assert m.append_block_to_sequence(seq_id) == m.get_block_mapping(seq_id)[-1]

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def swap_out(self, data):
        m = self.m
        seq_id = self._pick(data, self.lengths)
        if len(m.get_block_mapping(seq_id)) > m.num_free_cpu_blocks:
            self._declined(lambda: m.swap_out(seq_id))
            return
        m.swap_out(seq_id)
        self.swapped[seq_id] = self.lengths.pop(seq_id)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        m = self.m
        seq_id = self._pick(data, self.swapped)
        if len(m.swapped_block_tables[seq_id]) > m.num_free_blocks:
            self._declined(lambda: m.swap_in(seq_id))
            return
        m.swap_in(seq_id)
        self.lengths[seq_id] = self.swapped.pop(seq_id)

    @precondition(lambda self: self.lengths or self.swapped)
    @rule(data=st.data())
    def free(self, data):
        seq_id = self._pick(data, list(self.lengths) + list(self.swapped))
        self.m.free_sequence(seq_id)
        self.lengths.pop(seq_id, None)
        self.swapped.pop(seq_id, None)

    @rule(seq_id=st.one_of(st.just(10**6), st.booleans(), st.just(-1)))
    def bad_ids(self, seq_id):
        for call in (lambda: self.m.append_tokens(seq_id), lambda: self.m.append_tokens_batch([seq_id]),
                     lambda: self.m.fork(seq_id, 10**7), lambda: self.m.append_block_to_sequence(seq_id)):
            self._refused(call)

    @invariant()
    def agrees_with_the_model(self):
        m = self.m
        m.check_invariants()
        assert set(m.seq_ids) == set(self.lengths) and set(m.swapped_seq_ids) == set(self.swapped)
        for seq_id, n in {**self.lengths, **self.swapped}.items():
            assert m.get_num_tokens(seq_id) == n
        assert m.num_free_blocks + m.num_used_blocks == m.num_blocks
        assert m.stats().logical_tokens == sum(self.lengths.values())


ManagerMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None)
TestManagerMachine = ManagerMachine.TestCase


def test_the_batch_memo_follows_the_callers_list():
    m = BlockManager(8, 4)
    for s in (0, 1, 2):
        m.allocate_for_sequence(s, 1)
    ids = [0, 1]
    m.append_tokens_batch(ids)
    ids[1] = 2  # the caller edits its list in place: the memo is a copy, so it notices
    m.append_tokens_batch(ids)
    assert [m.get_num_tokens(s) for s in (0, 1, 2)] == [3, 2, 2]
    m.free_sequence(2)
    with pytest.raises(UnknownSequenceError, match="sequence 2"):
        m.append_tokens_batch(ids)  # same list, but a table was dropped since
    assert [m.get_num_tokens(s) for s in (0, 1)] == [3, 2]
