"""``engine_for``: a learner-style bookkeeping class serves the tiny model token for token.

``BookkeepingAllocator`` below is a correct learner answer to the contract (kept here, not
in the library, so the library hands out no graded answer). The engine it drives must
generate exactly what the no-cache reference generates: greedy, forked samples, preemption
by recompute and by swap, block sizes 1, 3 and 16. Broken variants must be stopped, either
by the adapter's contract checks or by different tokens.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, List

import pytest
import torch

from paged_kv_course.conformance import engine_for
from paged_kv_course.conformance import AllocatorContractError, LearnerBackedAllocator
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache


PROMPTS = ["A block table maps", "copy on write", "the free queue hands out blocks", "ab"]
MAX_NEW = 8


class BookkeepingAllocator:
    """Block ids, ref counts, a free queue: the learner's contract, nothing else."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def _take(self, n: int) -> List[int]:
        ids = [self.free.popleft() for _ in range(n)]
        for b in ids:
            self.ref_counts[b] = 1
        return ids

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} exists")
        need = -(-num_prompt_tokens // self.block_size)
        if need > len(self.free):
            raise RuntimeError(f"need {need} blocks, {len(self.free)} free")
        self.tables[seq_id] = self._take(need)
        self.lengths[seq_id] = num_prompt_tokens

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        table, length = self.tables[seq_id], self.lengths[seq_id]
        copy = num_tokens > 0 and length % self.block_size != 0 and self.ref_counts[table[-1]] > 1
        grow = max(0, -(-(length + num_tokens) // self.block_size) - len(table))
        if copy + grow > len(self.free):
            raise RuntimeError("out of blocks")
        placed = []
        if copy:
            (fresh,) = self._take(1)
            self.ref_counts[table[-1]] -= 1
            table[-1] = fresh
            placed.append(fresh)
        new = self._take(grow)
        table.extend(new)
        self.lengths[seq_id] = length + num_tokens
        return placed + new

    def free_sequence(self, seq_id: int) -> None:
        for b in reversed(self.tables.pop(seq_id, [])):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free.append(b)
        self.lengths.pop(seq_id, None)

    def get_block_mapping(self, seq_id: int) -> List[int]:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        return list(self.tables[seq_id])

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("bad fork")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]
        for b in self.tables[child_seq_id]:
            self.ref_counts[b] += 1


class NoCopyOnWrite(BookkeepingAllocator):
    """Grows correctly but writes into a shared last block: forks corrupt each other."""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        table, length = self.tables[seq_id], self.lengths[seq_id]
        grow = max(0, -(-(length + num_tokens) // self.block_size) - len(table))
        new = self._take(grow)
        table.extend(new)
        self.lengths[seq_id] = length + num_tokens
        return new


class SeedGrowth(BookkeepingAllocator):
    """The seed's rule: a block when (length + 1) % block_size == 0, one token early."""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        table, length = self.tables[seq_id], self.lengths[seq_id]
        new = []
        for i in range(num_tokens):
            if (length + i + 1) % self.block_size == 0:
                new += self._take(1)
        table.extend(new)
        self.lengths[seq_id] = length + num_tokens
        return new


class KeepsOldReference(BookkeepingAllocator):
    """Copies a shared last block but never drops the old block's reference: it leaks."""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        table = self.tables[seq_id]
        old = table[-1] if table else None
        placed = super().append_tokens(seq_id, num_tokens)
        if old is not None and old not in table:  # a copy replaced it
            self.ref_counts[old] += 1  # the reference the copy should have dropped
        return placed


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=7).eval()


@pytest.fixture(scope="module")
def reference(model):
    memo: Dict[tuple, List[int]] = {}

    def get(prompt: str, temperature: float = 0.0, seed: int = 0, index: int = 0) -> List[int]:
        key = (prompt, temperature, seed, index)
        if key not in memo:
            memo[key] = generate_no_cache(model, encode(prompt), MAX_NEW, temperature=temperature, seed=seed, sample_index=index)
        return memo[key]

    return get


def serve(model, cls, num_blocks, block_size, prompts=PROMPTS, **options):
    sampling = {k: options.pop(k) for k in ("n", "temperature", "seed") if k in options}
    engine = engine_for(model, cls(num_blocks, block_size), **options)
    outputs = engine.generate(prompts, MAX_NEW, **sampling)
    alloc = engine.allocator
    alloc.check_invariants()
    assert alloc.seq_ids == () and alloc.num_free_blocks == num_blocks  # nothing leaked
    return engine, outputs


@pytest.mark.parametrize("block_size, num_blocks", [(1, 160), (3, 60), (16, 12)])
def test_greedy_matches_no_cache(model, reference, block_size, num_blocks):
    engine, outputs = serve(model, BookkeepingAllocator, num_blocks, block_size)
    assert [list(o.token_ids) for o in outputs] == [reference(p) for p in PROMPTS]
    assert engine.totals.preemptions == 0
    assert engine.totals.cached_tokens == 0  # prefix caching is off


@pytest.mark.parametrize("block_size, num_blocks", [(1, 160), (3, 60), (16, 16)])
def test_forked_samples_match_no_cache(model, reference, block_size, num_blocks):
    prompts = PROMPTS[:2]
    engine, outputs = serve(model, BookkeepingAllocator, num_blocks, block_size, prompts,
                            n=3, temperature=0.8, seed=5)
    for prompt, out in zip(prompts, outputs):
        assert [list(s) for s in out.outputs] == [reference(prompt, 0.8, 5, i) for i in range(3)]
    assert engine.allocator.num_copies > 0 or block_size == 1  # forked tails were copied on write


@pytest.mark.parametrize("block_size, num_blocks", [(1, 40), (3, 14), (16, 3)])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_matches_no_cache(model, reference, block_size, num_blocks, mode):
    extra = {"num_cpu_blocks": 2 * num_blocks} if mode == "swap" else {}
    engine, outputs = serve(model, BookkeepingAllocator, num_blocks, block_size,
                            preemption_mode=mode, watermark=0.0, **extra)
    assert [list(o.token_ids) for o in outputs] == [reference(p) for p in PROMPTS]
    assert engine.totals.preemptions > 0


def test_greedy_forks_with_preemption(model, reference):
    engine, outputs = serve(model, BookkeepingAllocator, 20, 3, PROMPTS[:2], n=2, watermark=0.0)
    for prompt, out in zip(PROMPTS[:2], outputs):
        assert [list(s) for s in out.outputs] == [reference(prompt)] * 2
    assert engine.totals.preemptions > 0


def test_no_copy_on_write_is_stopped_with_a_message(model):
    with pytest.raises(AllocatorContractError, match="no copy-on-write"):
        serve(model, NoCopyOnWrite, 60, 3, PROMPTS[:2], n=3, temperature=0.8, seed=5)


def test_seed_growth_is_stopped_with_a_message(model):
    with pytest.raises(AllocatorContractError, match=r"blocks of 4 need exactly"):
        serve(model, SeedGrowth, 40, 4, ["abcdefg"])  # BOS + 7 bytes fill two blocks exactly


def test_kept_reference_is_stopped_with_a_message(model):
    with pytest.raises(AllocatorContractError, match="num_free_blocks"):
        serve(model, KeepsOldReference, 60, 3, PROMPTS[:1], n=2)


class TakesThenFails(BookkeepingAllocator):
    """Takes blocks one by one and raises when it runs out, keeping what it took."""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        table, length = self.tables[seq_id], self.lengths[seq_id]
        new = []
        while (len(table) + len(new)) * self.block_size < length + num_tokens:
            if not self.free:
                table.extend(new)
                raise RuntimeError("out of blocks")
            new += self._take(1)
        table.extend(new)
        self.lengths[seq_id] = length + num_tokens
        return new


def test_a_failed_call_that_changes_state_is_named(model):
    alloc = engine_for(model, TakesThenFails(3, 2)).allocator
    alloc.allocate_for_sequence(0, 4)
    with pytest.raises(AllocatorContractError, match="must change nothing"):
        alloc.append_tokens(0, 5)


def test_the_class_itself_and_bad_options(model):
    engine = engine_for(model, BookkeepingAllocator, num_blocks=20, block_size=4)
    assert isinstance(engine.allocator, LearnerBackedAllocator)
    assert engine.allocator.block_size == 4 and engine.allocator.num_blocks == 20
    with pytest.raises(TypeError, match="num_blocks"):
        engine_for(model, BookkeepingAllocator)
    with pytest.raises(ValueError, match="prefix caching"):
        engine_for(model, BookkeepingAllocator(8, 4), enable_prefix_caching=True)
    used = BookkeepingAllocator(8, 4)
    used.allocate_for_sequence(0, 5)
    with pytest.raises(AllocatorContractError, match="fresh allocator"):
        engine_for(model, used)


def test_swap_round_trip_is_bit_exact(model):
    engine = engine_for(model, BookkeepingAllocator(10, 4), num_cpu_blocks=6)
    alloc = engine.allocator
    tokens = encode("paged!")
    alloc.allocate_for_sequence(0, len(tokens))
    with torch.no_grad():
        model.forward_paged(alloc, [0], [tokens])
    k, v = alloc.read_kv(0, layer=1)
    alloc.swap_out(0)
    assert alloc.is_swapped(0) and alloc.num_free_blocks == 10
    alloc.allocate_for_sequence(1, 4)  # the blocks come back elsewhere
    alloc.swap_in(0)
    k2, v2 = alloc.read_kv(0, layer=1)
    assert k.equal(k2) and v.equal(v2)
    assert alloc.num_free_cpu_blocks == 6
