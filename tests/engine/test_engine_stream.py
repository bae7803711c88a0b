"""``Engine.stream``: every token as it is sampled, and ``abort_request`` between two of them frees at once."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

import pytest

from paged_kv_lib.engine import Engine, TokenEvent
from paged_kv_lib.errors import PagedKVError
from paged_kv_lib.model import ModelConfig, TinyTransformer


PROMPTS = ["A block table maps each sequence", "copy on write", "the free queue hands out blocks"]
MAX_NEW = 6


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=7).eval()


def collect(events) -> Dict[int, Dict[int, List[int]]]:
    out: Dict[int, Dict[int, List[int]]] = defaultdict(lambda: defaultdict(list))
    for event in events:
        assert isinstance(event, TokenEvent)
        out[event.request_id][event.sample_index].append(event.token_id)
    return out


@pytest.mark.parametrize("budget", [None, 5])
def test_stream_yields_what_generate_returns(model, budget) -> None:
    options = dict(n=2, temperature=0.8, seed=11)
    expected = Engine(model, model.new_allocator(64, 4)).generate(PROMPTS, MAX_NEW, **options)
    engine = Engine(model, model.new_allocator(64, 4), max_num_batched_tokens=budget)
    streamed = collect(engine.stream(PROMPTS, MAX_NEW, **options))
    assert [tuple(tuple(streamed[o.request_id][i]) for i in range(2)) for o in expected] == [o.outputs for o in expected]
    assert engine.allocator.num_used_blocks == 0 and not engine.has_unfinished()
    assert engine.run(progress=False) == []  # streamed outputs are not kept


def test_tokens_come_out_step_by_step(model) -> None:
    engine = Engine(model, model.new_allocator(64, 4))
    stream = engine.stream(["ab"], 4)
    first = next(stream)
    assert engine.totals.steps == 1 and first.request_id == 0 and first.sample_index == 0
    assert len(list(stream)) == 3


def test_abort_during_a_stream_frees_the_request_at_once(model) -> None:
    alloc = model.new_allocator(64, 4)
    engine = Engine(model, alloc, max_num_batched_tokens=8)
    seen = []
    dropped = None
    for event in engine.stream(PROMPTS, MAX_NEW):
        alloc.check_invariants()
        seen.append(event)
        if dropped is None and event.request_id == 1:
            dropped = 1
            held = alloc.num_used_blocks
            assert engine.abort_request(1) is True
            assert alloc.num_used_blocks < held  # its blocks went back now, not at the end
            assert all(s.seq_id not in alloc for r in engine.running if r.request_id == 1 for s in r.samples)
            alloc.check_invariants()
    after = [e for e in seen if e.request_id == 1]
    assert len(after) == 1  # nothing of request 1 after the abort
    assert sum(1 for e in seen if e.request_id == 0) == MAX_NEW
    assert alloc.num_used_blocks == 0 and alloc.seq_ids == ()


def test_closing_a_stream_early_aborts_its_requests(model) -> None:
    alloc = model.new_allocator(64, 4)
    engine = Engine(model, alloc)
    other = engine.add_request("queued before", 3)
    stream = engine.stream(PROMPTS, MAX_NEW)
    next(stream)
    stream.close()
    assert [r.request_id for r in engine.running + list(engine.queue)] == [other]
    (kept,) = engine.run(progress=False)
    assert kept.request_id == other and alloc.num_used_blocks == 0


def test_a_stream_with_unknown_options_queues_nothing(model) -> None:
    engine = Engine(model, model.new_allocator(64, 4))
    with pytest.raises(PagedKVError, match="top_k"):
        engine.stream(PROMPTS, 4, top_k=5)
    with pytest.raises(PagedKVError):
        engine.stream(PROMPTS + [[10**6]], 4)  # a token outside the vocabulary: all refused
    assert not engine.has_unfinished() and engine._next_request_id == 0


def test_aborting_an_unknown_id_changes_nothing(model) -> None:
    engine = Engine(model, model.new_allocator(64, 4))
    engine.add_request("ab", 3)
    engine.step()
    used = engine.allocator.num_used_blocks
    for bad in (5, -1, "0", 1.0):
        with pytest.raises(PagedKVError):
            engine.abort_request(bad)  # type: ignore[arg-type]
    assert engine.allocator.num_used_blocks == used and len(engine.running) == 1
