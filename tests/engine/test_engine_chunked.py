"""Chunked prefill under ``max_num_batched_tokens``: same tokens as the no-cache reference, whatever the budget.

Each step carries at most the budget's tokens, decodes first; prompts longer than what is
left spread over steps, their sequences growing chunk by chunk (the learner's allocator
too: tests/conformance/test_learner_chunked.py); cached prefixes are skipped. Invariants are checked after
every step, and every run ends with nothing leaked.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_kv_lib.engine import Engine, StepStats
from paged_kv_lib.errors import PagedKVError
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache


BASE = "A block table maps each sequence to its blocks; "
PROMPTS = [BASE + "the free queue", "copy on write", BASE + "a slot", "ab", BASE]
MAX_NEW = 6


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=7).eval()


@pytest.fixture(scope="module")
def reference(model):
    memo: Dict[Tuple, List[int]] = {}

    def get(prompt: str, max_new: int = MAX_NEW, temperature: float = 0.0, seed: int = 0, index: int = 0) -> List[int]:
        key = (prompt, max_new, temperature, seed, index)
        if key not in memo:
            memo[key] = generate_no_cache(
                model, encode(prompt), max_new, temperature=temperature, seed=seed, sample_index=index
            )
        return memo[key]

    return get


def drive(engine: Engine, prompts, max_new: int = MAX_NEW, **sampling) -> Tuple[List, List[StepStats]]:
    """Queue the prompts, step to the end checking invariants and the budget after every step."""
    ids = [engine.add_request(p, max_new, **sampling) for p in prompts]
    steps = []
    while engine.has_unfinished():
        stats = engine.step()
        engine.allocator.check_invariants()
        assert stats.batched_tokens <= engine.max_num_batched_tokens
        steps.append(stats)
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    alloc = engine.allocator
    assert alloc.seq_ids == () and alloc.num_free_blocks == alloc.num_blocks  # nothing leaked
    return [outputs[i] for i in ids], steps


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_greedy_tokens_equal_the_reference_for_every_budget(model, reference, budget) -> None:
    engine = Engine(model, model.new_allocator(96, 4), max_num_batched_tokens=budget)
    outputs, steps = drive(engine, PROMPTS)
    assert [list(o.token_ids) for o in outputs] == [reference(p) for p in PROMPTS]
    longest = max(len(encode(p)) for p in PROMPTS)
    if budget < longest:  # some prompt really was cut into chunks
        assert any(s.prefill_tokens and not s.prefill_completed for s in steps)


def test_a_step_mixes_a_prompt_chunk_with_decodes(model, reference) -> None:
    engine = Engine(model, model.new_allocator(96, 4), max_num_batched_tokens=8)
    first = engine.add_request("ab", MAX_NEW)
    engine.step()  # "ab" is prefilled in one chunk and samples its first token
    late = engine.add_request(BASE, MAX_NEW)  # 50 tokens: seven steps of chunks beside the decode
    stats = engine.step()
    assert stats.decode_tokens == 1 and stats.decode_sequences == 1
    assert stats.prefill_tokens == 7 and stats.prefill_sequences == 1 and stats.prefill_completed == 0
    assert stats.batched_tokens == 8
    assert engine.allocator.get_num_tokens(engine.running[1].samples[0].seq_id) == 7  # grown by one chunk
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    assert list(outputs[first].token_ids) == reference("ab")
    assert list(outputs[late].token_ids) == reference(BASE)


def test_the_budget_goes_to_decodes_first(model) -> None:
    engine = Engine(model, model.new_allocator(96, 4), max_num_batched_tokens=3)
    for p in ("ab", "cd", "ef"):
        engine.add_request(p, MAX_NEW)
    while len(engine.running) < 3 or not all(r.started for r in engine.running):
        engine.step()
    engine.add_request(BASE, MAX_NEW)
    stats = engine.step()
    assert (stats.decode_tokens, stats.prefill_tokens) == (3, 0)  # three decodes fill the budget


def test_prefix_cache_hits_skip_their_chunks(model, reference) -> None:
    engine = Engine(model, model.new_allocator(96, 4), max_num_batched_tokens=5)
    (warm,), _ = drive(engine, [BASE])
    (again,), steps = drive(engine, [BASE + "!"])
    cached = (len(encode(BASE)) // 4) * 4
    assert again.num_cached_tokens == cached
    assert sum(s.prefill_tokens for s in steps) == len(encode(BASE + "!")) - cached
    assert list(again.token_ids) == reference(BASE + "!")
    assert list(warm.token_ids) == reference(BASE)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_in_the_middle_of_chunked_prompts(model, reference, mode) -> None:
    alloc = model.new_allocator(20, 4, num_cpu_blocks=64)
    engine = Engine(model, alloc, max_num_batched_tokens=9, watermark=0.0, preemption_mode=mode)
    prompts = [BASE[:30], BASE[:25] + "x", "short one", BASE[:20]]
    outputs, steps = drive(engine, prompts, max_new=12)
    assert sum(s.preempted for s in steps) > 0  # the pool really ran short
    assert [list(o.token_ids) for o in outputs] == [reference(p, 12) for p in prompts]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    budget=st.integers(1, 40),
    block_size=st.sampled_from([1, 3, 4, 8]),
    num_blocks_extra=st.integers(0, 30),
    mode=st.sampled_from(["recompute", "swap"]),
    picks=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=1, max_size=4),
    caching=st.booleans(),
    n=st.sampled_from([1, 1, 2]),
)
def test_property_any_budget_block_size_and_pool(model, reference, budget, block_size, num_blocks_extra,
                                                 mode, picks, caching, n) -> None:
    prompts = [PROMPTS[i] for i in picks]
    longest = max(len(encode(p)) for p in prompts) + MAX_NEW
    num_blocks = n * -(-longest // block_size) + 1 + num_blocks_extra  # the longest fits alone, barely at first
    alloc = model.new_allocator(num_blocks, block_size, num_cpu_blocks=64, enable_prefix_caching=caching)
    engine = Engine(model, alloc, max_num_batched_tokens=budget, watermark=0.0, preemption_mode=mode)
    temperature = 0.0 if n == 1 else 0.9
    outputs, _ = drive(engine, prompts, n=n, temperature=temperature, seed=3)
    for prompt, out in zip(prompts, outputs):
        assert [list(o) for o in out.outputs] == [reference(prompt, MAX_NEW, temperature, 3, i) for i in range(n)]


def test_samples_of_one_prompt_share_it_after_a_chunked_prefill(model) -> None:
    engine = Engine(model, model.new_allocator(64, 4), max_num_batched_tokens=4)
    unchunked = Engine(model, model.new_allocator(64, 4))
    (chunked,), _ = drive(engine, [BASE], n=3, temperature=0.8, seed=5)
    (whole,), _ = drive(unchunked, [BASE], n=3, temperature=0.8, seed=5)
    assert chunked.outputs == whole.outputs


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_a_budget_that_is_not_a_positive_int_is_refused(model, bad) -> None:
    with pytest.raises(PagedKVError, match="max_num_batched_tokens"):
        Engine(model, model.new_allocator(8, 4), max_num_batched_tokens=bad)


def test_the_cli_takes_a_token_budget(capsys) -> None:
    from paged_kv_lib.cli import main as cli_main

    args = ["generate", "A block table", "--max-new-tokens", "5", "--random-weights", "--no-progress"]
    assert cli_main(args + ["--max-num-batched-tokens", "3"]) == 0
    chunked = capsys.readouterr().out
    assert cli_main(args) == 0
    whole = capsys.readouterr().out
    assert chunked.splitlines()[0] == whole.splitlines()[0]  # the same text
    assert "steps 9," in chunked and "steps 5," in whole  # 14 prompt tokens in 5 chunks of 3, then 4 decodes
    assert cli_main(args + ["--max-num-batched-tokens", "0"]) == 2
    assert "max_num_batched_tokens must be >= 1" in capsys.readouterr().err
