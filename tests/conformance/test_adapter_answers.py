"""The learner's adapter answers the scheduler as the library's block manager does, from the same rules.

Both receive the same random history (allocate, grow, fork, free, swap out and in); after every
act each of the engine's questions gets the same answer from both, though the learner's object
picks different block ids. A rule restated differently in the adapter would show here.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from paged_kv_lib.block_manager import BlockManager
from paged_kv_course.conformance import engine_for
from paged_kv_lib.errors import PagedKVError
from paged_kv_lib.model import ModelConfig, TinyTransformer

from tests.conformance.test_learner_adapter import BookkeepingAllocator

NUM_BLOCKS, BLOCK_SIZE, CPU_BLOCKS = 12, 3, 8
MODEL = TinyTransformer(ModelConfig(num_layers=1, dim=32, num_heads=2, num_kv_heads=1, hidden_dim=32), seed=0)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(0, 5), st.integers(0, 10)),
        st.tuples(st.just("append"), st.integers(0, 5), st.integers(0, 7)),
        st.tuples(st.just("fork"), st.integers(0, 5), st.integers(0, 5)),
        st.tuples(st.just("free"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("swap_out"), st.integers(0, 5), st.integers(0, 5)),
        st.tuples(st.just("swap_in"), st.integers(0, 5), st.integers(0, 1)),
        st.tuples(st.just("slots"), st.integers(0, 4), st.integers(0, 1)),
        st.tuples(st.just("prompt"), st.integers(0, 5), st.integers(0, 10)),
        st.tuples(st.just("chunk"), st.integers(0, 5), st.integers(0, 30)),
    ),
    max_size=25,
)


def act(target, op: str, a: int, b: int):
    """Apply one op; False when the target refused it (then it must have changed nothing): a typed error, or
    ``None`` from a call that checks and acts."""
    try:
        if op == "allocate":
            target.allocate_for_sequence(a, b)
        elif op == "append":
            target.append_tokens(a, b)
        elif op == "fork":
            target.fork(a, b)
        elif op == "free":
            target.free_sequence(a)
        elif op == "swap_out":  # one sequence, or two together: all or none
            return target.swap_out(*sorted({a, b})) is not None
        elif op == "slots":  # the decode step's one call: every resident sequence, or None
            placed = target.allocate_slots(sorted(target.seq_ids), a, watermark=(0.0, 0.2)[b])
            return placed is not None and (sorted(placed), sorted(map(len, placed.values())))
        elif op == "prompt":  # one admission: its first 3 tokens, leaving the watermark, or None
            return target.allocate_prompt(a, list(range(b)), max_new_tokens=3, watermark=0.1) is not None
        elif op == "chunk":  # a resident sequence's next prompt chunk: as much of b tokens as fits, or None
            held = target.get_num_tokens(a)
            return target.allocate_prompt(a, list(range(held + b)), max_new_tokens=b, watermark=0.25) is not None
        else:
            return target.swap_in(a, watermark=(0.0, 0.3)[b]) is not None
    except (PagedKVError, ValueError, RuntimeError):
        return False
    return True


def answers(target, resident, swapped) -> dict:
    out = {
        "free": target.num_free_blocks,
        "used": target.num_used_blocks,
        "cpu_free": target.num_free_cpu_blocks,
        "can_allocate_many": [target.can_allocate_many(ns, watermark=0.1) for ns in ([3, 3], [7, 1, 2], [])],
        "hold": [target.blocks_to_hold(n, num_seqs=k, watermark=w) for n in (0, 5, 10, 33, 36) for k in (1, 2)
                 for w in (0.0, 0.1, 0.3)],
        "lengths": [target.get_num_tokens(s) for s in resident + swapped],
        "table_lengths": [len(target.get_block_mapping(s)) for s in resident],
    }
    return out


@settings(max_examples=120, deadline=None)
@given(ops=OPS)
# Found in CI: 3 blocks free, 2 kept back, a new prompt's first 3 tokens (one block) fit; the adapter
# checked room for twice that, as it must only where a learner's prefix cache may add hits.
@example(ops=[("allocate", 0, 0), ("chunk", 0, 25), ("prompt", 1, 4)])
def test_the_adapter_and_the_block_manager_answer_alike(ops):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False, num_cpu_blocks=CPU_BLOCKS)
    adapter = engine_for(MODEL, BookkeepingAllocator(NUM_BLOCKS, BLOCK_SIZE), num_cpu_blocks=CPU_BLOCKS,
                         watermark=0.0).allocator
    for op, a, b in ops:
        done = act(manager, op, a, b)
        assert act(adapter, op, a, b) == done, (op, a, b)
        resident = sorted(manager.seq_ids)
        swapped = sorted(manager.swapped_seq_ids)
        assert (resident, swapped) == (sorted(adapter.seq_ids), sorted(adapter.swapped_seq_ids))
        assert answers(manager, resident, swapped) == answers(adapter, resident, swapped)
    adapter.check_invariants()


@pytest.mark.parametrize("call", ["allocate_slots", "swap_out"])
def test_both_refuse_a_repeated_id(call):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False, num_cpu_blocks=CPU_BLOCKS)
    adapter = engine_for(MODEL, BookkeepingAllocator(NUM_BLOCKS, BLOCK_SIZE), num_cpu_blocks=CPU_BLOCKS).allocator
    for target in (manager, adapter):
        target.allocate_for_sequence(0, 4)
        with pytest.raises(ValueError, match="twice"):
            getattr(target, call)(*([[0, 0]] if call == "allocate_slots" else [0, 0]))
