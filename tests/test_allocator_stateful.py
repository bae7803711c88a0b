"""A hypothesis state machine over the allocator: every mix of operations keeps the invariants.

A shadow model holds what each sequence's K/V should be (one row per token, the token
written most recently at that position); after every step the allocator's
``check_invariants`` must pass and ``read_kv`` must return the model bit for bit.
Failed calls must raise a typed error and change nothing.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged_kv_lib import OutOfBlocksError, PagedKVCacheAllocator, PagedKVError

from helpers import assert_same_state, snapshot

HEADS, DIM = 2, 3


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = None
        self.kv = {}  # seq_id -> (k, v) tensors [num_tokens, HEADS, DIM]
        self.counter = 0

    @initialize(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 3, 4, 8]))
    def init(self, num_blocks, block_size):
        self.alloc = PagedKVCacheAllocator(num_blocks, block_size, HEADS, DIM, torch.float32)

    def _fresh(self, n):
        """Distinct values per write, so a misplaced write can't go unnoticed."""
        self.counter += 1
        base = torch.arange(n * HEADS * DIM, dtype=torch.float32).reshape(n, HEADS, DIM)
        return base + 1000 * self.counter, -(base + 1000 * self.counter)

    def _expect_failure(self, call, exc=PagedKVError):
        before = snapshot(self.alloc)
        try:
            call()
        except exc:
            pass
        else:  # pragma: no cover - reported by hypothesis
            raise AssertionError("the call should have failed")
        assert_same_state(before, snapshot(self.alloc))

    @rule(seq_id=st.integers(0, 5), n=st.integers(0, 20))
    def allocate(self, seq_id, n):
        a = self.alloc
        if seq_id in self.kv or a.blocks_needed(n) > a.num_free_blocks:
            self._expect_failure(lambda: a.allocate_for_sequence(seq_id, n))
            return
        a.allocate_for_sequence(seq_id, n)
        k, v = self._fresh(n)
        if n:
            a.write_kv(seq_id, range(n), k, v)
        self.kv[seq_id] = (k, v)

    @precondition(lambda self: self.kv)
    @rule(data=st.data(), n=st.integers(0, 9))
    def append(self, data, n):
        a = self.alloc
        seq_id = data.draw(st.sampled_from(sorted(self.kv)))
        old = a.get_num_tokens(seq_id)
        capacity = len(a.get_block_mapping(seq_id)) * a.block_size
        needed = max(0, a.blocks_needed(old + n) - len(a.get_block_mapping(seq_id)))
        if old + n > capacity and needed > a.num_free_blocks:
            self._expect_failure(lambda: a.append_tokens(seq_id, n), OutOfBlocksError)
            return
        new_blocks = a.append_tokens(seq_id, n)
        assert len(new_blocks) == needed
        assert len(set(new_blocks)) == len(new_blocks)
        k, v = self._fresh(n)
        if n:
            a.write_kv(seq_id, range(old, old + n), k, v)
        ok, ov = self.kv[seq_id]
        self.kv[seq_id] = (torch.cat([ok, k]), torch.cat([ov, v]))

    @precondition(lambda self: self.kv)
    @rule(data=st.data())
    def overwrite(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.kv)))
        n = self.alloc.get_num_tokens(seq_id)
        if n == 0:
            return
        positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        k, v = self._fresh(len(positions))
        self.alloc.write_kv(seq_id, positions, k, v)
        ok, ov = self.kv[seq_id]
        ok, ov = ok.clone(), ov.clone()
        ok[positions], ov[positions] = k, v
        self.kv[seq_id] = (ok, ov)

    @rule(seq_id=st.integers(0, 6))
    def free(self, seq_id):
        self.alloc.free_sequence(seq_id)  # unknown ids are a no-op
        self.kv.pop(seq_id, None)

    @precondition(lambda self: self.kv)
    @rule(data=st.data(), past=st.integers(0, 3))
    def bad_position(self, data, past):
        a = self.alloc
        seq_id = data.draw(st.sampled_from(sorted(self.kv)))
        n = a.get_num_tokens(seq_id)
        k, v = self._fresh(1)
        self._expect_failure(lambda: a.write_kv(seq_id, [n + past], k, v))
        self._expect_failure(lambda: a.slot_mapping(seq_id, [n + past]))

    @rule(seq_id=st.integers(7, 9))
    def unknown_sequence(self, seq_id):
        a = self.alloc
        self._expect_failure(lambda: a.append_tokens(seq_id))
        self._expect_failure(lambda: a.get_block_mapping(seq_id))

    @invariant()
    def consistent(self):
        a = self.alloc
        a.check_invariants()
        assert set(a.seq_ids) == set(self.kv)
        used = set()
        for seq_id, (k, v) in self.kv.items():
            rk, rv = a.read_kv(seq_id)
            assert torch.equal(rk, k) and torch.equal(rv, v), f"K/V of sequence {seq_id} differ"
            used.update(a.get_block_mapping(seq_id))
        assert a.num_used_blocks == len(used)
        assert a.stats().logical_tokens == sum(k.shape[0] for k, _ in self.kv.values())


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase
