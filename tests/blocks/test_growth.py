"""The decode step's one call (``allocate_slots``, and ``append_tokens_batch`` that raises instead of
returning ``None``) against one ``append_tokens`` call per sequence.

Two block managers live side by side. One grows its sequences through one call per step, with the
lists a decode loop passes (the same list again, the same list less finished sequences, a reordered or a
longer list, or any list); the other, its twin, grows the same sequences by one ``append_tokens`` call
each, in the listed order. Every other act (allocate, grow one, fork, copy before a write, reserve a
block, swap, free) goes to both. After every step the two are the same in everything observable: tables,
counts, content keys, ref counts, the free queue's order, the CPU pool. A refused batch changes nothing.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged_kv_lib import OutOfBlocksError, PagedKVError
from paged_kv_lib.block_manager import BlockManager

from helpers import assert_same_state, snapshot


class BatchTwinMachine(RuleBasedStateMachine):
    """A batch-grown manager and its one-call-per-sequence twin, kept in step."""

    @initialize(num_blocks=st.integers(2, 40), block_size=st.sampled_from([1, 2, 3, 4, 16]),
                num_cpu_blocks=st.integers(0, 8), caching=st.booleans())
    def init(self, num_blocks, block_size, num_cpu_blocks, caching):
        make = lambda: BlockManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks,  # noqa: E731
                                    enable_prefix_caching=caching)
        self.batch, self.twin = make(), make()
        self.last = []
        self.next_id = 0

    def both(self, act):
        """Do ``act`` to both managers: the same answer, or the same typed refusal that changed nothing."""
        outcomes = []
        for m in (self.batch, self.twin):
            before = snapshot(m)
            try:
                outcomes.append(("ok", act(m)))
            except PagedKVError as exc:
                assert_same_state(before, snapshot(m))
                outcomes.append(("refused", type(exc)))
        assert outcomes[0] == outcomes[1]
        return outcomes[0]

    def _resident(self):
        return list(self.twin.seq_ids)

    @rule(n=st.integers(0, 20), with_ids=st.sampled_from([False, False, True]))
    def allocate(self, n, with_ids):
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.both(lambda m: m.allocate_for_sequence(seq_id, n, token_ids=[seq_id % 3] * n if with_ids else None))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data(), how=st.sampled_from(["again", "less", "reorder", "more", "any"]),
          n=st.sampled_from([1, 1, 1, 1, 0, 2, 5]), with_ids=st.sampled_from([False, False, True]))
    def grow_batch(self, data, how, n, with_ids, raising=True):
        resident = self._resident()
        last = [s for s in self.last if s in resident] if how != "again" else self.last
        if how == "again" and last and set(last) <= set(resident):
            ids = list(last)
        elif how == "less" and len(last) > 1:
            keep = data.draw(st.lists(st.booleans(), min_size=len(last), max_size=len(last)))
            ids = [s for s, k in zip(last, keep) if k] or last[:1]
        elif how == "reorder" and len(last) > 1:
            ids = list(reversed(last))
        elif how == "more" and set(resident) - set(last):
            ids = last + sorted(set(resident) - set(last))
        else:
            ids = data.draw(st.lists(st.sampled_from(resident), min_size=1, unique=True))
        tokens = [[(s + j) % 3 for j in range(n)] for s in ids] if with_ids else None
        given = [row[0] for row in tokens] if tokens and n == 1 and data.draw(st.booleans()) else tokens  # bare
        before = snapshot(self.batch)
        try:
            placed = (self.batch.append_tokens_batch(ids, n, token_ids=given) if raising
                      else self.batch.allocate_slots(ids, n, token_ids=given))
            if placed is None:
                raise OutOfBlocksError(0, 0)
        except OutOfBlocksError:
            assert_same_state(before, snapshot(self.batch))
            assert not self.twin.can_append(ids, n), "refused only when the blocks are short"
            return
        expected = {}
        for i, seq_id in enumerate(ids):
            got = self.twin.append_tokens(seq_id, n, token_ids=None if tokens is None else tokens[i])
            if got:
                expected[seq_id] = got
        assert placed == expected
        self.last = list(ids)

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data(), steps=st.integers(1, 12))
    def decode_run(self, data, steps):
        """Steps of one token in a row, as a decode loop takes them: sometimes a sequence leaves the list."""
        for _ in range(steps):
            how = data.draw(st.sampled_from(["again", "again", "less"]))
            self.grow_batch(data, how, 1, data.draw(st.booleans()), raising=data.draw(st.booleans()))
            self.twins_agree()

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data(), n=st.integers(0, 5))
    def grow_one(self, data, n):
        seq_id = data.draw(st.sampled_from(self._resident()))
        self.both(lambda m: m.append_tokens(seq_id, n))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self._resident()))
        child, self.next_id = self.next_id, self.next_id + 1
        self.both(lambda m: m.fork(parent, child))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data())
    def write_last_block(self, data):
        seq_id = data.draw(st.sampled_from(self._resident()))
        last = len(self.twin.get_block_mapping(seq_id)) - 1
        if last >= 0:
            self.both(lambda m: m.make_writable(seq_id, [last]))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data())
    def reserve_block(self, data):
        seq_id = data.draw(st.sampled_from(self._resident()))
        self.both(lambda m: m.append_block_to_sequence(seq_id))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data())
    def swap_out(self, data):
        seq_id = data.draw(st.sampled_from(self._resident()))
        self.both(lambda m: m.swap_out(seq_id))

    @precondition(lambda self: self.twin.swapped_seq_ids)
    @rule(data=st.data())
    def swap_in(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.twin.swapped_seq_ids)))
        self.both(lambda m: m.swap_in(seq_id))

    @precondition(lambda self: self.twin.seq_ids)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(self._resident()))
        self.both(lambda m: m.free_sequence(seq_id))

    @invariant()
    def twins_agree(self):
        assert_same_state(snapshot(self.twin), snapshot(self.batch))
        self.batch.check_invariants()


BatchTwinMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBatchTwinMachine = BatchTwinMachine.TestCase


def test_a_decode_loop_with_finishing_sequences_matches_single_calls():
    """Many steps of one token, sequences leaving the list as they finish."""
    batch, twin = BlockManager(400, 4), BlockManager(400, 4)
    ends = {s: 3 + 5 * s for s in range(12)}
    for m in (batch, twin):
        for s in ends:
            m.allocate_for_sequence(s, 1 + s % 4)
    for step in range(60):
        ids = [s for s in ends if ends[s] > step]
        placed = batch.append_tokens_batch(ids)
        expected = {s: got for s in ids if (got := twin.append_tokens(s))}
        assert placed == expected
        assert_same_state(snapshot(twin), snapshot(batch))


def test_a_dropped_sequence_comes_back_checked():
    """A sequence left out of one step grows again from where it stood when listed again."""
    m = BlockManager(20, 2)
    for s in (0, 1):
        m.allocate_for_sequence(s, 1)
    m.append_tokens_batch([0, 1])  # both fill their first block
    assert m.append_tokens_batch([0]) == {0: (2,)}
    assert m.append_tokens_batch([0, 1]) == {1: (3,)}  # 1 needs its second block a tick after 0 did
    assert (m.get_num_tokens(0), m.get_num_tokens(1)) == (4, 3)
    assert m.append_tokens_batch([0, 1]) == {0: (4,)}
    m.check_invariants()


def test_sequences_due_together_take_blocks_in_listed_order():
    """A sequence given an empty block and one at a boundary can need a block at the same step: the blocks
    go out in listed order."""
    batch, twin = BlockManager(20, 2), BlockManager(20, 2)
    for m in (batch, twin):
        m.allocate_for_sequence(0, 2)  # full: due at the first step
        m.allocate_for_sequence(1, 2)
        m.append_block_to_sequence(1)  # full, plus an empty block: due two steps after 0
    for _ in range(4):
        placed = batch.append_tokens_batch([0, 1])
        assert placed == {s: got for s in (0, 1) if (got := twin.append_tokens(s))}
    assert_same_state(snapshot(twin), snapshot(batch))
