"""A hypothesis state machine over the allocator: every mix of operations keeps the invariants.

The shadow model holds each sequence's token ids. K/V are a function of the token prefix
(``helpers.kv_for``), as a real model's are, so prefix-cache hits, copy-on-write and
swapping can all be checked the same way: after every step ``check_invariants`` passes
and ``read_kv`` of every resident sequence equals ``kv_for`` of its tokens, bit for bit,
in every layer. Failed calls must raise a typed error and change nothing.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged_kv_lib import OutOfBlocksError, PagedKVCacheAllocator, PagedKVError

from helpers import assert_same_state, kv_for, snapshot

HEADS, DIM, LAYERS = 2, 3, 2
TOKENS = st.lists(st.integers(0, 2), max_size=14)  # a tiny alphabet: prefixes repeat often


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tokens = {}  # resident seq_id -> token ids
        self.swapped = {}  # swapped-out seq_id -> token ids
        self.next_id = 0

    @initialize(
        num_blocks=st.integers(1, 10),
        block_size=st.sampled_from([1, 2, 3, 4]),
        num_cpu_blocks=st.integers(0, 6),
        caching=st.booleans(),
    )
    def init(self, num_blocks, block_size, num_cpu_blocks, caching):
        self.alloc = PagedKVCacheAllocator(
            num_blocks, block_size, HEADS, DIM, torch.float32,
            num_layers=LAYERS, num_cpu_blocks=num_cpu_blocks, enable_prefix_caching=caching,
        )

    # -------------------------------------------------------------- helpers
    def _write(self, seq_id, start):
        tokens = self.tokens[seq_id]
        for layer in range(LAYERS):
            k, v = kv_for(tokens, HEADS, DIM, layer)
            if len(tokens) > start:
                self.alloc.write_kv(seq_id, range(start, len(tokens)), k[start:], v[start:], layer=layer)

    def _expect_failure(self, call, exc=PagedKVError):
        before = snapshot(self.alloc)
        try:
            call()
        except exc as err:
            assert_same_state(before, snapshot(self.alloc))
            return err
        raise AssertionError("the call should have failed")

    def _assert_owns(self, seq_id, positions):
        mapping = self.alloc.get_block_mapping(seq_id)
        for p in positions:
            block = mapping[p // self.alloc.block_size]
            assert self.alloc.blocks[block].ref_count == 1, f"position {p} of sequence {seq_id} is in shared block {block}"

    def _pick(self, data, pool):
        return data.draw(st.sampled_from(sorted(pool)))

    # ---------------------------------------------------------------- rules
    @rule(tokens=TOKENS, with_ids=st.booleans())
    def allocate(self, tokens, with_ids):
        a = self.alloc
        seq_id, n = self.next_id, len(tokens)
        ids = tokens if with_ids else None
        fits = a.can_allocate(n, token_ids=ids)
        if not fits:
            err = self._expect_failure(lambda: a.allocate_for_sequence(seq_id, n, token_ids=ids), OutOfBlocksError)
            assert err.needed > err.free
            return
        free_before = a.num_free_blocks
        cached = a.allocate_for_sequence(seq_id, n, token_ids=ids)
        assert cached % a.block_size == 0 and 0 <= cached <= n
        if not with_ids or not a.enable_prefix_caching:
            assert cached == 0 and a.num_free_blocks == free_before - a.blocks_needed(n)
        self.next_id += 1
        self.tokens[seq_id] = list(tokens)
        self._write(seq_id, cached)  # only the uncached tail is computed, as an engine does

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=TOKENS, with_ids=st.booleans())
    def append(self, data, new, with_ids):
        a = self.alloc
        seq_id = self._pick(data, self.tokens)
        old = len(self.tokens[seq_id])
        predicted, fits = a.blocks_to_append(seq_id, len(new)), a.can_append([seq_id], len(new))
        free_before = a.num_free_blocks
        try:
            before = snapshot(a)
            placed = a.append_tokens(seq_id, len(new), token_ids=new if with_ids else None)
        except OutOfBlocksError as err:
            assert err.needed == predicted > err.free == a.num_free_blocks and not fits
            assert_same_state(before, snapshot(a))
            return
        assert fits and free_before - a.num_free_blocks == predicted, "the scheduler's answer is the act"
        assert len(set(placed)) == len(placed)
        assert set(placed) <= set(a.get_block_mapping(seq_id))
        self._assert_owns(seq_id, range(old, old + len(new)))  # appending never writes a shared block
        self.tokens[seq_id].extend(new)
        self._write(seq_id, old)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        a = self.alloc
        parent = self._pick(data, self.tokens)
        free_before = a.num_free_blocks
        a.fork(parent, self.next_id)
        assert a.num_free_blocks == free_before, "fork allocates nothing"
        self.tokens[self.next_id] = list(self.tokens[parent])
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def rewrite(self, data):
        """Write a sequence's own K/V again at some positions: shared blocks get copied first."""
        a = self.alloc
        seq_id = self._pick(data, self.tokens)
        n = len(self.tokens[seq_id])
        if n == 0:
            return
        positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        k, v = kv_for(self.tokens[seq_id], HEADS, DIM, layer=1)
        call = lambda: a.write_kv(seq_id, positions, k[positions], v[positions], layer=1)  # noqa: E731
        try:
            before = snapshot(a)
            copies = call()
        except OutOfBlocksError:
            assert_same_state(before, snapshot(a))
            return
        for src, dst in copies:
            assert dst in a.get_block_mapping(seq_id) and src not in a.get_block_mapping(seq_id)
        self._assert_owns(seq_id, positions)  # the writer holds every block it wrote alone

    @rule(data=st.data())
    def free(self, data):
        pool = set(self.tokens) | set(self.swapped) | {self.next_id + 5}  # unknown ids are a no-op
        seq_id = self._pick(data, pool)
        self.alloc.free_sequence(seq_id)
        self.tokens.pop(seq_id, None)
        self.swapped.pop(seq_id, None)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def swap_out(self, data):
        a = self.alloc
        seq_id = self._pick(data, self.tokens)
        if len(a.get_block_mapping(seq_id)) > a.stats().cpu_free_blocks:
            before = snapshot(a)
            assert a.swap_out(seq_id) is None  # refused: nothing changed
            assert_same_state(before, snapshot(a))
            return
        a.swap_out(seq_id)
        self.swapped[seq_id] = self.tokens.pop(seq_id)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        a = self.alloc
        seq_id = self._pick(data, self.swapped)
        n = a.blocks_needed(len(self.swapped[seq_id]))
        if n > a.num_free_blocks:
            before = snapshot(a)
            assert a.swap_in(seq_id) is None  # refused: nothing changed
            assert_same_state(before, snapshot(a))
            return
        a.swap_in(seq_id)
        self.tokens[seq_id] = self.swapped.pop(seq_id)

    @rule(data=st.data())
    def failed_calls(self, data):
        a = self.alloc
        unknown = self.next_id + 7
        self._expect_failure(lambda: a.append_tokens(unknown))
        self._expect_failure(lambda: a.fork(unknown, unknown + 1))
        self._expect_failure(lambda: a.allocate_for_sequence(unknown, -1), ValueError)
        if self.tokens:
            seq_id = self._pick(data, self.tokens)
            n = len(self.tokens[seq_id])
            k, v = kv_for([0], HEADS, DIM)
            self._expect_failure(lambda: a.write_kv(seq_id, [n], k, v))
            self._expect_failure(lambda: a.fork(seq_id, seq_id))
            self._expect_failure(lambda: a.append_tokens(seq_id, 1, token_ids=[1, 2]), ValueError)
        if self.swapped:
            seq_id = self._pick(data, self.swapped)
            self._expect_failure(lambda: a.append_tokens(seq_id))
            self._expect_failure(lambda: a.swap_out(seq_id))

    # ------------------------------------------------------------ invariants
    @invariant()
    def consistent(self):
        a = self.alloc
        a.check_invariants()
        assert set(a.seq_ids) == set(self.tokens)
        assert set(a.swapped_seq_ids) == set(self.swapped)
        held = set()
        for seq_id, tokens in self.tokens.items():
            assert a.get_num_tokens(seq_id) == len(tokens)
            for layer in range(LAYERS):
                k, v = a.read_kv(seq_id, layer=layer)
                ek, ev = kv_for(tokens, HEADS, DIM, layer)
                assert torch.equal(k, ek) and torch.equal(v, ev), f"K/V of sequence {seq_id}, layer {layer}"
            held.update(a.get_block_mapping(seq_id))
        assert a.num_used_blocks == len(held)
        for seq_id, tokens in self.swapped.items():
            assert a.get_num_tokens(seq_id) == len(tokens)


AllocatorMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase
