"""The engine talks to its allocator through ``EngineAllocator`` only, and asks it every question.

A wrapper hands the engine an allocator that records every attribute the engine (and the paged
forward it calls) reads, and refuses any name outside the protocol. Served through it, with
swap and recompute preemption, chunked prefill, parallel samples, prefix caching and aborts,
the engine must produce the no-cache reference's tokens, read nothing else, and ask the
questions that replaced its own arithmetic (``can_ever_fit``, ``can_swap_out``,
``can_allocate_many``). The library's allocator, the learner's adapter and ``BlockManager``
implement the protocol they claim.
"""

from __future__ import annotations

from typing import Any, List, Set

import pytest

from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.bookkeeping import EngineAllocator, EngineBookkeeping, PagedKVView
from paged_kv_course.conformance import LearnerBackedAllocator, engine_for
from paged_kv_lib.engine import Engine
from paged_kv_lib.model import ModelConfig, TinyTransformer, encode, generate_no_cache

from tests.conformance.test_learner_adapter import BookkeepingAllocator

pytestmark = pytest.mark.usefixtures("one_thread")


def public_names(*protocols: type) -> Set[str]:
    return {n for p in protocols for n in vars(p) if not n.startswith("_")}


ALLOWED = public_names(EngineBookkeeping, PagedKVView)


class Recording:
    """Forwards the protocol's members to ``inner``; notes each one read and every other name tried."""

    def __init__(self, inner: Any) -> None:
        self.__dict__.update(inner=inner, touched=set(), refused=[])

    def __getattr__(self, name: str) -> Any:
        if name not in ALLOWED:
            self.refused.append(name)
            raise AttributeError(f"{name} is not part of EngineAllocator")
        self.touched.add(name)
        return getattr(self.inner, name)


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
    asked = {"can_ever_fit", "can_allocate", "can_append", "append_tokens_batch", "fork", "free_sequence"}
    if mode == "swap":
        asked |= {"can_swap_out", "can_swap_in", "swap_out"}
    elif budget is None:  # a resumed pair of samples, each prefilled whole: both come back or neither
        asked |= {"can_allocate_many"}
    assert asked <= recording.touched, asked - recording.touched
    inner.check_invariants()


def test_the_learner_adapter_is_driven_through_the_protocol_only(model) -> None:
    adapter = engine_for(model, BookkeepingAllocator(14, 4), num_cpu_blocks=40).allocator
    recording = Recording(adapter)
    engine = Engine(model, recording, watermark=0.05, preemption_mode="swap")  # type: ignore[arg-type]
    assert serve(engine, recording) == expected(model)
    assert recording.refused == [] and {"can_swap_out", "can_ever_fit"} <= recording.touched
    adapter.check_invariants()


def test_the_implementations_claim_the_protocol(model) -> None:
    alloc = model.new_allocator(8, 4)
    adapter = engine_for(model, BookkeepingAllocator(8, 4)).allocator
    assert isinstance(alloc, EngineAllocator) and isinstance(adapter, EngineAllocator)
    assert isinstance(adapter, LearnerBackedAllocator)
    manager = BlockManager(8, 4)
    assert isinstance(manager, EngineBookkeeping) and not isinstance(manager, EngineAllocator)
    assert public_names(EngineBookkeeping) >= {"can_allocate_many", "can_swap_out", "can_ever_fit"}


def test_the_engine_refuses_an_object_outside_the_protocol(model) -> None:
    class Partial(Recording):
        def __getattr__(self, name: str) -> Any:
            if name == "can_swap_out":
                raise AttributeError(name)
            return super().__getattr__(name)

    with pytest.raises(TypeError, match="lacks \\['can_swap_out'\\]"):
        Engine(model, Partial(model.new_allocator(8, 4)))  # type: ignore[arg-type]
