"""The engine generates exactly what the no-cache reference generates, however it schedules.

Every run ends with a leak check: all blocks back in the free queue (cached ones count as
free), no sequence left, invariants intact.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from paged_kv_lib.engine import Engine
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache

BASE = "A block table maps each sequence to its blocks; "
PROMPTS = [BASE + "the free queue", BASE + "a slot", "copy on write", BASE]
MAX_NEW = 10





@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=7).eval()


@pytest.fixture(scope="module")
def reference(model):
    """No-cache outputs, computed once per (prompt, temperature, seed, sample index)."""
    memo: Dict[Tuple, List[int]] = {}

    def get(prompt: str, max_new: int = MAX_NEW, temperature: float = 0.0, seed: int = 0, index: int = 0):
        key = (prompt, max_new, temperature, seed, index)
        if key not in memo:
            memo[key] = generate_no_cache(
                model, encode(prompt), max_new, temperature=temperature, seed=seed, sample_index=index
            )
        return memo[key]

    return get


def assert_clean(alloc) -> None:
    """The leak check: nothing allocated, every block free, bookkeeping consistent."""
    alloc.check_invariants()
    assert alloc.seq_ids == ()
    assert alloc.num_free_blocks == alloc.num_blocks
    assert alloc.num_used_blocks == 0


def run_engine(model, prompts, *, num_blocks, block_size, max_new=MAX_NEW, **options):
    alloc_opts = {k: options.pop(k) for k in ("enable_prefix_caching", "num_cpu_blocks") if k in options}
    sampling = {k: options.pop(k) for k in ("n", "temperature", "seed") if k in options}
    alloc = model.new_allocator(num_blocks, block_size, **alloc_opts)
    engine = Engine(model, alloc, **options)
    outputs = engine.generate(prompts, max_new, **sampling)
    assert_clean(alloc)
    return engine, outputs


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix", "noprefix"])
@pytest.mark.parametrize("block_size, num_blocks", [(1, 256), (2, 128), (16, 16), (64, 6)])
def test_greedy_matches_no_cache(model, reference, block_size, num_blocks, prefix_caching) -> None:
    engine, outputs = run_engine(
        model, PROMPTS, num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=prefix_caching
    )
    for prompt, out in zip(PROMPTS, outputs):
        assert list(out.token_ids) == reference(prompt), prompt
    assert engine.totals.preemptions == 0
    assert engine.totals.generated_tokens == len(PROMPTS) * MAX_NEW
    cached = engine.totals.cached_tokens
    if prefix_caching and block_size < 64:
        assert cached > 0  # the shared BASE was found, not recomputed
    if not prefix_caching:
        assert cached == 0


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix", "noprefix"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_outputs_identical(model, reference, mode, prefix_caching) -> None:
    # Each request alone needs at most 5 blocks of 16; four of them cannot run together in 8.
    engine, outputs = run_engine(
        model, PROMPTS, num_blocks=8, block_size=16, max_new=24, watermark=0.0,
        preemption_mode=mode, enable_prefix_caching=prefix_caching, num_cpu_blocks=32,
    )
    assert engine.totals.preemptions > 0
    assert sum(o.num_preemptions for o in outputs) == engine.totals.preemptions
    for prompt, out in zip(PROMPTS, outputs):
        assert list(out.token_ids) == reference(prompt, 24), prompt


def test_swap_without_cpu_space_falls_back_to_recompute(model, reference) -> None:
    engine, outputs = run_engine(
        model, PROMPTS, num_blocks=8, block_size=16, max_new=24, watermark=0.0,
        preemption_mode="swap", num_cpu_blocks=0,
    )
    assert engine.totals.preemptions > 0
    for prompt, out in zip(PROMPTS, outputs):
        assert list(out.token_ids) == reference(prompt, 24)


def test_swapped_request_really_goes_to_the_cpu_pool(model, reference) -> None:
    alloc = model.new_allocator(8, 16, num_cpu_blocks=32)
    engine = Engine(model, alloc, watermark=0.0, preemption_mode="swap")
    for p in PROMPTS:
        engine.add_request(p, 24)
    saw_swapped = False
    while engine.has_unfinished():
        stats = engine.step()
        if stats.swapped:
            saw_swapped = True
            assert alloc.stats().swapped_sequences > 0
    assert saw_swapped
    assert_clean(alloc)
    assert alloc.stats().cpu_free_blocks == 32


@pytest.mark.parametrize("block_size", [4, 16])
def test_parallel_samples_share_the_prompt(model, reference, block_size) -> None:
    prompt = BASE + "fork"  # its last block is partial: the first decode step copies it
    alloc = model.new_allocator(64, block_size)
    engine = Engine(model, alloc)
    engine.add_request(prompt, MAX_NEW, n=3)
    stats = engine.step()
    prompt_blocks = alloc.blocks_needed(len(encode(prompt)))
    assert stats.blocks_used == prompt_blocks  # three samples, one copy of the prompt
    (out,) = engine.run(progress=False)
    assert [list(o) for o in out.outputs] == [reference(prompt)] * 3
    assert alloc.stats().cow_copies >= 2  # two of the three samples copied the shared tail
    assert_clean(alloc)


def test_parallel_sampling_is_seeded_per_sample(model, reference) -> None:
    prompt = BASE + "samples"
    _, (out,) = run_engine(model, [prompt], num_blocks=64, block_size=4, n=3, temperature=1.0, seed=21)
    expected = [reference(prompt, MAX_NEW, 1.0, 21, i) for i in range(3)]
    assert [list(o) for o in out.outputs] == expected
    assert len({tuple(o) for o in out.outputs}) > 1  # the samples differ from each other


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_survive_preemption(model, reference, mode) -> None:
    engine, outputs = run_engine(
        model, [BASE + "one", BASE + "two"], num_blocks=22, block_size=8, max_new=16, watermark=0.0,
        preemption_mode=mode, num_cpu_blocks=64, n=2, temperature=0.8, seed=3,
        enable_prefix_caching=False,  # else the two prompts share blocks and fit
    )
    assert engine.totals.preemptions > 0
    for prompt, out in zip([BASE + "one", BASE + "two"], outputs):
        assert [list(o) for o in out.outputs] == [reference(prompt, 16, 0.8, 3, i) for i in range(2)]


def test_requests_arriving_mid_run_join_the_batch(model, reference) -> None:
    alloc = model.new_allocator(64, 4)
    engine = Engine(model, alloc)
    first = [engine.add_request(p, MAX_NEW) for p in PROMPTS[:2]]
    for _ in range(3):
        engine.step()
    assert len(engine.running) == 2
    late = [engine.add_request(p, MAX_NEW) for p in PROMPTS[2:]]
    stats = engine.step()
    assert stats.running == 4 and stats.prefill_tokens > 0 and stats.decode_tokens == 2
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    for rid, prompt in zip(first + late, PROMPTS):
        assert list(outputs[rid].token_ids) == reference(prompt)
    assert_clean(alloc)


def test_seeded_sampling_ignores_batch_and_preemption(model, reference) -> None:
    prompt = "sampling with a seed"
    expected = reference(prompt, 16, 0.9, 5)
    _, (alone,) = run_engine(model, [prompt], num_blocks=64, block_size=4, max_new=16, temperature=0.9, seed=5)
    assert list(alone.token_ids) == expected

    alloc = model.new_allocator(24, 4)
    engine = Engine(model, alloc, watermark=0.0)
    engine.add_request(PROMPTS[0], 16)
    engine.add_request(PROMPTS[3], 16, temperature=1.3, seed=1)
    rid = engine.add_request(prompt, 16, temperature=0.9, seed=5)
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    assert outputs[rid].num_preemptions > 0
    assert list(outputs[rid].token_ids) == expected
    assert_clean(alloc)

    _, (other,) = run_engine(model, [prompt], num_blocks=64, block_size=4, max_new=16, temperature=0.9, seed=6)
    assert list(other.token_ids) != expected


def test_prefix_cache_computes_only_the_uncached_tail(model, reference) -> None:
    alloc = model.new_allocator(64, 4)
    engine = Engine(model, alloc)
    prompt_ids = encode(BASE)[:48]  # exactly 12 full blocks
    engine.add_request(prompt_ids, 4)
    engine.run(progress=False)
    # Same prompt again: every block is cached; only the last token is recomputed.
    rid = engine.add_request(prompt_ids, 4)
    stats = engine.step()
    assert stats.cached_tokens == 48 and stats.prefill_tokens == 1
    # A longer prompt sharing those blocks computes only its own tail.
    longer = prompt_ids + encode("tail", bos=False)
    rid2 = engine.add_request(longer, 4)
    stats = engine.step()
    assert stats.cached_tokens == 48 and stats.prefill_tokens == 4
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    assert list(outputs[rid].token_ids) == generate_no_cache(model, prompt_ids, 4)
    assert list(outputs[rid2].token_ids) == generate_no_cache(model, longer, 4)
    assert outputs[rid].num_cached_tokens == 48
    assert_clean(alloc)
    assert alloc.num_cached_free_blocks > 0  # cached blocks stay findable, yet count as free


def test_identical_prompts_admitted_together_share_blocks(model, reference) -> None:
    alloc = model.new_allocator(64, 4)
    engine = Engine(model, alloc)
    for _ in range(3):
        engine.add_request(BASE, MAX_NEW)
    stats = engine.step()
    # The full blocks are shared; each request has its own partial last block.
    assert stats.blocks_used == len(encode(BASE)) // 4 + 3
    outputs = engine.run(progress=False)
    assert all(list(o.token_ids) == reference(BASE) for o in outputs)
    assert_clean(alloc)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_every_admission_leaves_the_watermark_free(model, reference, mode) -> None:
    alloc = model.new_allocator(24, 4, num_cpu_blocks=64)
    engine = Engine(model, alloc, watermark=0.2, preemption_mode=mode)  # keep 5 blocks free
    ids = [engine.add_request(p, 20) for p in PROMPTS[1:]]
    resumed = False
    while engine.has_unfinished():
        before = {r.request_id for r in engine.running}
        stats = engine.step()
        admitted = {r.request_id for r in engine.running} - before
        if admitted:
            assert alloc.num_free_blocks >= 5, stats
            resumed |= any(r.num_preemptions for r in engine.running if r.request_id in admitted)
    assert resumed  # a preempted request came back through admission too
    outputs = {o.request_id: o for o in engine.run(progress=False)}  # collects the finished ones
    for rid, prompt in zip(ids, PROMPTS[1:]):
        assert list(outputs[rid].token_ids) == reference(prompt, 20)
    assert_clean(alloc)


def test_forked_samples_reserve_room_for_copy_on_write(model, reference) -> None:
    """Two samples share a partial tail block: their next token needs a copy, not just a slot."""
    alloc = model.new_allocator(6, 4)
    engine = Engine(model, alloc, watermark=0.0)
    first = list(range(60, 72))  # 3 full blocks: its next token needs a new block
    engine.add_request(first, 5)
    engine.add_request("fork", 3, n=2)  # 5 tokens: 1 full + 1 shared partial block
    assert engine.step().blocks_used == 5
    stats = engine.step()  # 2 blocks needed, 1 free: the forked request must give way
    assert stats.preempted == 1
    outputs = engine.run(progress=False)
    assert list(outputs[0].token_ids) == generate_no_cache(model, first, 5)
    assert [list(o) for o in outputs[1].outputs] == [reference("fork", 3)] * 2
    assert_clean(alloc)
