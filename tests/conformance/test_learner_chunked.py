"""A learner's allocator behind ``engine_for`` under chunked prefill: it grows chunk by chunk, and the
tokens equal the no-cache reference."""

from __future__ import annotations

from typing import List, Tuple


from paged_kv_course.conformance import engine_for
from tests.engine.test_engine_chunked import PROMPTS, drive, model, reference  # noqa: F401, F811 - fixtures



def test_the_learner_allocator_grows_chunk_by_chunk(model, reference) -> None:  # noqa: F811 - fixtures
    from tests.conformance.test_learner_adapter import BookkeepingAllocator

    calls: List[Tuple[int, int]] = []

    class Recording(BookkeepingAllocator):
        def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
            calls.append((seq_id, num_tokens))
            return super().append_tokens(seq_id, num_tokens)

    engine = engine_for(model, Recording(64, 4), max_num_batched_tokens=6)
    outputs, _ = drive(engine, PROMPTS[:3])
    assert [list(o.token_ids) for o in outputs] == [reference(p) for p in PROMPTS[:3]]
    assert any(n > 1 for _, n in calls)  # later chunks of a prompt, through the learner's append_tokens


def test_a_learners_prefix_hits_under_a_token_budget_leave_the_engine_in_step() -> None:
    """The protocol places a prompt's cached prefix plus the budget's tokens; a learner's object reports its hits
    only after allocating, so the adapter grows it by the rest. Without that, a preempted request recomputed
    with hits held fewer tokens than the scheduler counted, and its next tokens went wrong."""
    from paged_kv_course import capstone
    from paged_kv_course.starters.after_06 import AllocatorAfter06

    engine = engine_for(capstone._model(), AllocatorAfter06, num_blocks=40, block_size=4, enable_prefix_caching=True,
                        max_batch_size=3, max_num_batched_tokens=24, watermark=0.0)
    outputs = engine.generate(list(capstone.WORKLOAD), capstone.MAX_NEW_TOKENS)
    assert engine.totals.cached_tokens > 0 and engine.totals.preemptions > 0  # the case this test is about
    assert [list(o.token_ids) for o in outputs] == [list(t) for t in capstone.reference_tokens()[:len(outputs)]]
