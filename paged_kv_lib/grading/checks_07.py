"""Checks of exercise 07, under load: FCFS admission, preemption victims, the cost of preempting.

Admission is compared with the allocator's ``can_allocate`` applied request by request,
victims with what the real :class:`~paged_kv_lib.engine.Engine` preempts at every step of
a run, costs with what the allocator does when a sequence is freed and re-allocated or
swapped out and back in.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Tuple

import torch

from ..allocator import PagedKVCacheAllocator
from ._common import call_learner, expect_equal, fail, passed


# --------------------------------------------------------------------------- 07.1
def _library_admissions(prompt_blocks: List[int], free: int, total: int, watermark: float, slots: int) -> int:
    """How many requests the allocator's can_allocate admits, head first, stopping at the first refusal."""
    bs = 4
    alloc = PagedKVCacheAllocator(total, bs, 1, 1, allocate_cache=False)
    if total - free:
        alloc.allocate_for_sequence(-1, (total - free) * bs)
    admitted = 0
    for seq_id, blocks in enumerate(prompt_blocks):
        if admitted == slots or not alloc.can_allocate(blocks * bs, watermark=watermark):
            break
        alloc.allocate_for_sequence(seq_id, blocks * bs)
        admitted += 1
    return admitted


def check_admit_fcfs(admit_fcfs: Callable[[List[int], int, int, float, int], int]) -> None:
    """Task 07.1: ``admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots)``."""
    hint = ("admit from the head while the request's blocks leave at least watermark * total_blocks blocks free "
            "(free - need >= watermark * total) and a batch slot is left; take its blocks; stop at the first "
            "request that does not fit, even if a later, smaller one would")
    hand = [  # (prompt_blocks, free, total, watermark, slots, expected), verified by hand
        ([3, 3, 3], 10, 10, 0.0, 8, 3),
        ([3, 3, 3], 10, 10, 0.1, 8, 3),   # 10-3 = 7, 7-3 = 4, 4-3 = 1 >= 1: all three
        ([3, 3, 3, 1], 10, 10, 0.15, 8, 2),  # 1 < 1.5 refuses the third; the fourth would fit but waits
        ([5, 1, 1], 4, 20, 0.0, 8, 0),    # the head does not fit: nobody behind it is admitted
        ([2, 2, 2], 14, 14, 0.05, 8, 3),  # 14 - 6 = 8 >= 0.7
        ([7, 7], 14, 14, 0.05, 8, 1),     # 14 - 14 = 0 < 0.7: the watermark refuses the second
        ([1, 1, 1, 1], 50, 50, 0.0, 2, 2),  # only two batch slots left
        ([], 5, 5, 0.0, 4, 0),
    ]
    for blocks, free, total, wm, slots, want in hand:
        assert want == _library_admissions(blocks, free, total, wm, slots)  # keeps the hand cases honest
        call = f"admit_fcfs({blocks}, free_blocks={free}, total_blocks={total}, watermark={wm}, batch_slots={slots})"
        got = call_learner(admit_fcfs, (list(blocks), free, total, wm, slots), call, want)
        expect_equal(call, want, got, hint)
    rng = random.Random(7)
    for _ in range(300):
        total = rng.choice([8, 10, 14, 20, 64])
        free = rng.randrange(0, total + 1)
        blocks = [rng.randrange(0, 6) for _ in range(rng.randrange(0, 7))]
        wm = rng.choice([0.0, 0.01, 0.05, 0.1, 0.2, 0.3])
        slots = rng.randrange(0, 8)
        want = _library_admissions(blocks, free, total, wm, slots)
        call = f"admit_fcfs({blocks}, free_blocks={free}, total_blocks={total}, watermark={wm}, batch_slots={slots})"
        given = list(blocks)
        got = call_learner(admit_fcfs, (given, free, total, wm, slots), call, want)
        expect_equal(call, want, got, hint)
        if given != blocks:
            raise fail(call, f"prompt_blocks left as {blocks}", given, "do not modify the queue you are given")
    passed("07.1")


# --------------------------------------------------------------------------- 07.2
_VICTIM_HINT = (
    "walk the running requests oldest first, reserving the blocks each needs; when a request needs more "
    "than free - reserved, preempt the NEWEST running request (the last in the list, possibly the one "
    "asking), add its blocks_held to the free blocks, and try again; a request that preempted itself is done"
)


def _engine_runs():
    """(engine, its allocator) pairs to step through, each short of blocks at some point."""
    from ..engine import Engine
    from ..model import ModelConfig, TinyTransformer

    model = TinyTransformer(ModelConfig(), seed=3).eval()
    runs = []
    # (pool blocks, block size, preemption mode, requests, seed): tight pools, some steps preempt twice.
    for num_blocks, block_size, mode, n_requests, seed in (
        (10, 4, "recompute", 6, 11), (12, 4, "swap", 8, 11), (6, 4, "swap", 6, 13), (9, 2, "recompute", 6, 12),
    ):
        rng = random.Random(seed)
        alloc = model.new_allocator(num_blocks, block_size, enable_prefix_caching=False, num_cpu_blocks=64)
        engine = Engine(model, alloc, watermark=0.0, preemption_mode=mode)
        for _ in range(n_requests):
            prompt = [rng.randrange(256) for _ in range(rng.randrange(1, 3 * block_size))]
            max_new = rng.randrange(2, 3 * block_size + 4)
            try:
                engine.add_request(prompt, max_new)
            except ValueError:  # a request that could never fit the pool alone
                continue
        runs.append((engine, alloc))
    return runs


def check_choose_victims(choose_victims: Callable[[List[Tuple[int, int, int]], int], List[int]]) -> None:
    """Task 07.2: ``choose_victims(running, free_blocks)`` -> ids preempted, in order."""
    hand = [  # (running, free, expected), verified by hand
        ([(0, 3, 1), (1, 3, 0), (2, 2, 1), (3, 2, 0)], 0, [3]),
        ([(0, 3, 1), (1, 2, 1)], 2, []),
        ([(0, 3, 1), (1, 2, 1)], 1, [1]),         # request 0 takes the free block; request 1 preempts itself
        ([(0, 3, 1), (1, 2, 1)], 0, [1]),         # request 0 takes one of request 1's two blocks
        ([(0, 4, 1)], 0, [0]),                     # alone and short: it preempts itself
        ([(0, 2, 0), (1, 1, 1), (2, 0, 1)], 0, [2, 1]),  # request 2 holds nothing: preempting it frees nothing
        ([(5, 1, 0), (9, 1, 1)], 0, [9]),
        ([], 3, []),
    ]
    for running, free, want in hand:
        call = f"choose_victims({running}, free_blocks={free})"
        got = call_learner(choose_victims, ([tuple(r) for r in running], free), call, want)
        expect_equal(call, want, list(got) if isinstance(got, (list, tuple)) else got, _VICTIM_HINT)
    steps_with_preemption = steps_with_two = 0
    with torch.no_grad():
        for engine, alloc in _engine_runs():
            while engine.has_unfinished():
                running = []
                for request in engine.running:
                    (sample,) = request.live_samples()
                    tokens = alloc.get_num_tokens(sample.seq_id)
                    held = len(alloc.get_block_mapping(sample.seq_id))
                    running.append((request.request_id, held, 1 if tokens % alloc.block_size == 0 else 0))
                free = alloc.num_free_blocks
                before = {r.request_id: r.num_preemptions for r in engine.running}
                engine.step()
                by_request = {r.request_id: r for r in list(engine.running) + list(engine.waiting)}
                hit = {rid for rid, n in before.items() if rid in by_request and by_request[rid].num_preemptions > n}
                want = [rid for rid, _, _ in reversed(running) if rid in hit]  # popped newest first
                steps_with_preemption += bool(want)
                steps_with_two += len(want) > 1
                call = f"choose_victims({running}, free_blocks={free})"
                got = call_learner(choose_victims, (list(running), free), call, want)
                expect_equal(call + "  (a step of the real engine)", want,
                             list(got) if isinstance(got, (list, tuple)) else got, _VICTIM_HINT)
    # The scenarios must exercise what they are for (a failure here is a bug in the check, not yours).
    assert steps_with_preemption >= 10 and steps_with_two >= 1, (steps_with_preemption, steps_with_two)
    passed("07.2")


# --------------------------------------------------------------------------- 07.3
def _library_costs(prompt_len: int, generated: int, block_size: int, mode: str) -> Dict[str, int]:
    held_tokens = prompt_len + generated - 1  # the last sampled token is not stored yet
    alloc = PagedKVCacheAllocator(64, block_size, 1, 1, allocate_cache=False, num_cpu_blocks=64)
    alloc.allocate_for_sequence(0, held_tokens)
    used = alloc.num_used_blocks
    if mode == "recompute":
        alloc.free_sequence(0)
        freed = used - alloc.num_used_blocks
        tokens = prompt_len + generated  # re-admission prefills the prompt and every generated token
        alloc.allocate_for_sequence(0, tokens)
        return {"freed_blocks": freed, "blocks_copied": 0, "prefill_tokens": tokens,
                "blocks_on_resume": alloc.num_used_blocks}
    alloc.swap_out(0)
    freed = used - alloc.num_used_blocks
    out = alloc.stats().cpu_total_blocks - alloc.stats().cpu_free_blocks
    back = len(alloc.swap_in(0))
    return {"freed_blocks": freed, "blocks_copied": out + back, "prefill_tokens": 0,
            "blocks_on_resume": alloc.num_used_blocks}


def check_preemption_cost(preemption_cost: Callable[[int, int, int, str], Dict[str, int]]) -> None:
    """Task 07.3: ``preemption_cost(prompt_len, num_generated, block_size, mode)`` -> the four counts."""
    keys = ("freed_blocks", "blocks_copied", "prefill_tokens", "blocks_on_resume")
    hints = {
        "freed_blocks": "the request holds prompt_len + num_generated - 1 tokens (its last sampled token is "
                        "not stored yet), in ceil(tokens / block_size) blocks; preempting frees all of them",
        "blocks_copied": "recompute copies nothing; swap copies every held block to the CPU and back",
        "prefill_tokens": "recompute prefills the prompt and every generated token, the last one included "
                          "(the prefill's last logits give the next token); swap computes nothing again",
        "blocks_on_resume": "recompute allocates blocks for prompt_len + num_generated tokens; swap brings "
                            "back exactly the blocks it held",
    }
    cases = [(prompt, gen, bs, mode)
             for bs in (1, 4, 16)
             for prompt in (1, bs, bs + 1, 3 * bs - 1, 37)
             for gen in (1, 2, bs, bs + 1, 2 * bs)
             for mode in ("recompute", "swap")]
    for prompt, gen, bs, mode in cases:
        want = _library_costs(prompt, gen, bs, mode)
        call = f"preemption_cost(prompt_len={prompt}, num_generated={gen}, block_size={bs}, mode={mode!r})"
        got = call_learner(preemption_cost, (prompt, gen, bs, mode), call, want)
        if not isinstance(got, dict) or set(got) != set(keys):
            raise fail(call, want, got, f"return a dict with exactly the keys {list(keys)}")
        for key in keys:
            expect_equal(call + f"[{key!r}]", want[key], got[key], hints[key])
    passed("07.3")
