"""The engine talks to its allocator through ``EngineAllocator`` only, and checks and acts in one call.

A wrapper hands the engine an allocator that records every attribute the engine (and the paged
forward it calls) reads, and refuses any name outside the protocol. Served through it, with
swap and recompute preemption, chunked prefill, parallel samples, prefix caching and aborts,
the engine must produce the no-cache reference's tokens and read nothing else. Counted call by
call, a step grows its decodes with one ``allocate_slots`` call (more only when it preempts) and
admits a prompt with one ``allocate_prompt`` call. The library's allocator, the learner's adapter
and ``BlockManager`` implement the protocol they claim.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, List, Set

import pytest

from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.protocols import EngineAllocator, EngineBookkeeping, PagedKVView
from paged_kv_course.conformance import LearnerBackedAllocator, engine_for
from paged_kv_lib.engine import Engine
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache

from tests.conformance.test_learner_adapter import BookkeepingAllocator



def public_names(*protocols: type) -> Set[str]:
    return {n for p in protocols for n in vars(p) if not n.startswith("_")}


ALLOWED = public_names(EngineBookkeeping, PagedKVView)


class Recording:
    """Forwards the protocol's members to ``inner``; notes each one read and every other name tried."""

    def __init__(self, inner: Any) -> None:
        self.__dict__.update(inner=inner, touched=set(), refused=[], calls=Counter())

    def __getattr__(self, name: str) -> Any:
        if name not in ALLOWED:
            self.refused.append(name)
            raise AttributeError(f"{name} is not part of EngineAllocator")
        self.touched.add(name)
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return value(*args, **kwargs)

        return counted


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=21).eval()


PROMPTS = ["the block table", "copy on write shares a block", "a free queue", "prefix caching finds blocks again"]


def serve(engine: Engine, recording: Recording) -> List[List[int]]:
    recording.touched.clear()
    ids = [engine.add_request(p, 10) for p in PROMPTS]
    ids.append(engine.add_request(PROMPTS[0], 8, n=2, temperature=0.0))
    doomed = engine.add_request("aborted after two steps", 12)
    engine.step()
    engine.step()
    engine.abort_request(doomed)
    outputs = {o.request_id: o for o in engine.run(progress=False)}
    return [[list(s) for s in outputs[i].outputs] for i in ids]


def expected(model: TinyTransformer) -> List[List[List[int]]]:
    out = [[generate_no_cache(model, encode(p), 10)] for p in PROMPTS]
    return out + [[generate_no_cache(model, encode(PROMPTS[0]), 8)] * 2]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@pytest.mark.parametrize("budget", [None, 5])
def test_the_library_allocator_is_driven_through_the_protocol_only(model, mode, budget) -> None:
    inner = model.new_allocator(14, 4, num_cpu_blocks=40)
    recording = Recording(inner)
    engine = Engine(model, recording, watermark=0.05, preemption_mode=mode,  # type: ignore[arg-type]
                    max_num_batched_tokens=budget)
    assert serve(engine, recording) == expected(model)
    assert recording.refused == []
    assert engine.totals.preemptions > 0  # the pool is tight: the preemption questions were asked
    asked = {"blocks_to_hold", "allocate_prompt", "allocate_slots", "fork", "free_sequence"}
    if mode == "swap":
        asked |= {"swap_out", "swap_in"}
    elif budget is None:  # a resumed pair of samples, each prefilled whole: both come back or neither
        asked |= {"can_allocate_many"}
    assert asked <= recording.touched, asked - recording.touched
    inner.check_invariants()


def test_the_learner_adapter_is_driven_through_the_protocol_only(model) -> None:
    adapter = engine_for(model, BookkeepingAllocator(14, 4), num_cpu_blocks=40).allocator
    recording = Recording(adapter)
    engine = Engine(model, recording, watermark=0.05, preemption_mode="swap")  # type: ignore[arg-type]
    assert serve(engine, recording) == expected(model)
    assert recording.refused == [] and {"swap_out", "blocks_to_hold", "allocate_slots"} <= recording.touched
    adapter.check_invariants()


def test_the_implementations_claim_the_protocol(model) -> None:
    alloc = model.new_allocator(8, 4)
    adapter = engine_for(model, BookkeepingAllocator(8, 4)).allocator
    assert isinstance(alloc, EngineAllocator) and isinstance(adapter, EngineAllocator)
    assert isinstance(adapter, LearnerBackedAllocator)
    manager = BlockManager(8, 4)
    assert isinstance(manager, EngineBookkeeping) and not isinstance(manager, EngineAllocator)
    assert public_names(EngineBookkeeping) >= {"allocate_slots", "allocate_prompt", "blocks_to_hold"}
    assert len(public_names(EngineBookkeeping)) <= 12 and len(public_names(PagedKVView)) <= 5


def test_the_engine_refuses_an_object_outside_the_protocol(model) -> None:
    class Partial(Recording):
        def __getattr__(self, name: str) -> Any:
            if name == "allocate_slots":
                raise AttributeError(name)
            return super().__getattr__(name)

    with pytest.raises(TypeError, match="lacks \\['allocate_slots'\\]"):
        Engine(model, Partial(model.new_allocator(8, 4)))  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_the_engine_asks_once_per_step_to_grow_and_once_per_admission(model, prefix_caching) -> None:
    """No preemption: every step that decodes makes exactly one ``allocate_slots`` call, every request
    admitted exactly one ``allocate_prompt`` call, and no question is asked besides."""
    inner = model.new_allocator(64, 4, enable_prefix_caching=prefix_caching)
    recording = Recording(inner)
    engine = Engine(model, recording, watermark=0.0)  # type: ignore[arg-type]
    ids = [engine.add_request(p, 6) for p in PROMPTS]
    decode_steps = 0
    while engine.has_unfinished():
        before = Counter(recording.calls)
        stats = engine.step()
        step = recording.calls - before
        assert stats.preempted == 0
        assert step["allocate_slots"] == (1 if stats.decode_tokens else 0), step
        assert step["allocate_prompt"] == stats.prefill_sequences, step
        decode_steps += bool(stats.decode_tokens)
    assert recording.calls["allocate_prompt"] == len(ids)
    assert recording.calls["allocate_slots"] == decode_steps > 0
    asked = set(recording.calls) - {"allocate_slots", "allocate_prompt", "free_sequence", "block_table_tensor",
                                    "get_num_tokens", "blocks_to_hold"}
    assert asked == set(), asked
