"""conformance.simulate_with_classes: a learner's allocator class runs the paged memory model of the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from paged_kv_course.conformance import simulate_with_classes as simulate
from paged_kv_lib.simulate import make_workload
from paged_kv_lib.simulate import simulate as library_simulate


class BookAllocator:
    """A correct bookkeeping-only allocator in the learner's contract (ref counts, copy-on-write, fork)."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() takes the lowest id first
        self.refs = [0] * num_blocks
        self.tables = {}
        self.tokens = {}

    @property
    def num_free_blocks(self):
        return len(self.free)

    def _take(self, count):
        if count > len(self.free):
            raise RuntimeError(f"need {count} blocks, {len(self.free)} free")
        taken = [self.free.pop() for _ in range(count)]
        for b in taken:
            self.refs[b] = 1
        return taken

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} exists")
        self.tables[seq_id] = self._take(-(-num_prompt_tokens // self.block_size))
        self.tokens[seq_id] = num_prompt_tokens

    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        table, n = self.tables[seq_id], self.tokens[seq_id]
        extra = -(-(n + num_tokens) // self.block_size) - len(table)
        copy = bool(table) and n % self.block_size != 0 and self.refs[table[-1]] > 1
        taken = self._take(extra + copy)
        if copy:
            self.refs[table[-1]] -= 1
            table[-1] = taken[0]
        table.extend(taken[copy:])
        self.tokens[seq_id] = n + num_tokens
        return taken

    def free_sequence(self, seq_id):
        for b in reversed(self.tables.pop(seq_id, [])):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)
        self.tokens.pop(seq_id, None)

    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        return list(self.tables[seq_id])

    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("unknown parent or existing child")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.tokens[child_seq_id] = self.tokens[parent_seq_id]
        for b in self.tables[child_seq_id]:
            self.refs[b] += 1


class OffByOneGrowth(BookAllocator):
    """The seed's rule: a new block when the token count reaches a multiple of the block size."""

    def append_tokens(self, seq_id, num_tokens=1):
        n = self.tokens[seq_id] + num_tokens
        taken = self._take(n // self.block_size + 1 - len(self.tables[seq_id]))
        self.tables[seq_id].extend(taken)
        self.tokens[seq_id] = n
        return taken

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):  # n // bs + 1 blocks
        super().allocate_for_sequence(seq_id, 0)
        self.tables[seq_id] = self._take(num_prompt_tokens // self.block_size + 1)
        self.tokens[seq_id] = num_prompt_tokens


class NeverFrees(BookAllocator):
    def free_sequence(self, seq_id):
        self.tables.pop(seq_id, None)
        self.tokens.pop(seq_id, None)


class TakesBeforeRefusing(BookAllocator):
    """Keeps the last free block in reserve, but takes it before refusing: a refusal that changed the pool."""

    def append_tokens(self, seq_id, num_tokens=1):
        n = self.tokens[seq_id]
        extra = -(-(n + num_tokens) // self.block_size) - len(self.tables[seq_id])
        if extra and len(self.free) <= extra:
            self._take(1)
            raise RuntimeError("out of blocks")
        return super().append_tokens(seq_id, num_tokens)


def _same_numbers(row, paged):
    return dataclasses.replace(row, allocator="paged") == paged


@pytest.mark.parametrize("name, n, capacity, block_size", [
    ("sharegpt", 60, 8000, 16),   # loaded, with preemptions
    ("alpaca", 200, 1500, 7),     # capacity not a multiple of the block size
    ("sharegpt", 30, 6000, [1, 16, 64]),
])
def test_a_correct_class_gives_the_paged_row(name, n, capacity, block_size):
    workload = make_workload(name, n, seed=3, max_len=1024)
    paged = library_simulate(workload, capacity, allocators=["paged"], block_size=block_size)
    mine = simulate(workload, capacity, allocators=["paged", BookAllocator], block_size=block_size)
    assert mine[: len(paged)] == paged
    rows = mine[len(paged):]
    assert [r.allocator for r in rows] == ["BookAllocator"] * len(paged)
    for row, lib in zip(rows, paged):
        assert _same_numbers(row, lib), (row, lib)
    assert any(r.preemptions for r in paged) or name == "alpaca"


def test_contiguous_baselines_and_a_class_side_by_side_with_checking():
    workload = make_workload("sharegpt", 40, seed=1, max_len=1024)
    rows = simulate(workload, 6000, allocators=["orca-oracle", BookAllocator], check=True)
    assert [r.allocator for r in rows] == ["orca-oracle", "BookAllocator"]
    assert rows[1].token_states > rows[0].token_states


def test_off_by_one_growth_gives_a_different_row():
    workload = make_workload("sharegpt", 60, seed=3, max_len=1024)
    paged, mine = simulate(workload, 8000, allocators=["paged", OffByOneGrowth])
    assert not _same_numbers(mine, paged)
    assert mine.reserved + mine.internal > paged.reserved + paged.internal  # the extra blocks show as waste
    with pytest.raises(AssertionError, match=r"tokens in \d+ blocks of 16, expected"):  # checking names it
        simulate(workload, 8000, allocators=[OffByOneGrowth], check=True)


def test_an_allocator_that_never_frees_runs_out():
    workload = make_workload("alpaca", 80, seed=2, max_len=512)
    with pytest.raises(RuntimeError):
        simulate(workload, 1024, allocators=[NeverFrees])


def test_a_refusal_that_changes_the_pool_is_named():
    workload = make_workload("sharegpt", 60, seed=3, max_len=1024)
    with pytest.raises(AssertionError, match="must change nothing"):
        simulate(workload, 8000, allocators=[TakesBeforeRefusing])


def test_bad_arguments():
    workload = make_workload("alpaca", 5, seed=0)
    with pytest.raises(ValueError, match="unknown allocator"):
        simulate(workload, 4000, allocators=["pagd"])
    with pytest.raises(TypeError, match="allocator class"):
        simulate(workload, 4000, allocators=[3])
    with pytest.raises(ValueError):
        simulate(workload, 4000, allocators=[BookAllocator], block_size=[])
    with pytest.raises(ValueError):
        simulate(workload, 8, allocators=[BookAllocator], block_size=16)  # not even one block


def test_a_wrong_free_count_is_named():
    class Miscounts(BookAllocator):
        @property
        def num_free_blocks(self):
            return float(len(self.free))

    with pytest.raises(AssertionError, match="num_free_blocks"):
        simulate(make_workload("alpaca", 5, seed=0), 4000, allocators=[Miscounts])
