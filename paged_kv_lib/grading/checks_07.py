"""Checks of exercise 07, under load: FCFS admission, preemption victims (the engine's rule and a
priority policy), the cost of preempting.

Admission (task 07.1) is checked in :mod:`._checks_07_admission`. Victims are compared with what the real :class:`~paged_kv_lib.engine.Engine` preempts at every step of
a run (the priority policy, with equal priorities, must agree with it too, and otherwise
with the policy's reference below); costs with what the allocator does when a sequence is
freed and re-allocated or swapped out and back in. A wrong answer that matches a common
mistake gets a hint naming that mistake.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..block_manager import BlockManager
from ..errors import OutOfBlocksError
from ._checks_07_admission import check_plan_admission  # noqa: F401  (task 07.1, a check of its own module)
from ._common import CheckFailure, call_learner, expect_equal, fail, passed

# What a solution of exercise 07 may not lean on (interfaces.md item 1): the allocator's admission
# and growth questions, the engine's scheduler and the simulator's preemption rule.
FORBIDDEN: Tuple[str, ...] = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.conformance.differential",
    "paged_kv_lib.conformance.simulation",
    "paged_kv_lib.allocator",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.engine",
    "paged_kv_lib.simulate",
    "paged_kv_lib.seed",
)


# --------------------------------------------------------------------------- 07.2
Running = List[Tuple[int, int, int]]


def _walk(running: Sequence[tuple], free: int, pick: Callable[[list, int], int], *, need_at: int = 2,
          held_at: int = 1, release: bool = True, free_victims: bool = True, reserve: bool = True,
          asker_only: bool = False) -> List[int]:
    """The decode-step walk, with the victim chosen by ``pick(alive, index)``; switches plant known mistakes."""
    alive = [tuple(r) for r in running]
    victims: List[int] = []
    reserved, i = 0, 0
    while i < len(alive):
        if alive[i][need_at] <= free - (reserved if reserve else 0):
            reserved += alive[i][need_at]
            i += 1
            continue
        j = i if asker_only else pick(alive, i)
        victim = alive.pop(j)
        victims.append(victim[0])
        if free_victims:
            free += victim[held_at]
        if j < i:
            if release:
                reserved -= victim[need_at]
            i -= 1
    return victims


def _newest(alive: list, i: int) -> int:
    return len(alive) - 1


def _engine_victims(running: Running, free: int) -> List[int]:
    return _walk(running, free, _newest)


def _victim_mistakes(running: Running, free: int) -> Dict[str, List[int]]:
    return {
        "the wrong preemption victim: you preempted the oldest request, the engine preempts the newest running "
        "one (it has done the least work)": _walk(running, free, lambda alive, i: 0),
        "the wrong preemption victim: you preempted the request that needed the block; the engine preempts the "
        "newest running request, which is usually another one": _walk(running, free, _newest, asker_only=True),
        "a preempted request's blocks_held become free for the others; yours never came back":
            _walk(running, free, _newest, free_victims=False),
        "blocks reserved by older requests earlier in this step are no longer free for the next one":
            _walk(running, free, _newest, reserve=False),
    }


def _run_cases(fn: Callable, name: str, cases: Sequence[Tuple[list, int, List[int]]],
               mistakes: Callable[[list, int], Dict[str, List[int]]], default: str) -> None:
    """Run every case; on failures, name the one mistake that explains all the failures seen.

    Two mistakes can give the same answer on one case, so the hint is chosen from the
    mistakes that reproduce the learner's answer on every failing case (up to 20 of them).
    """
    first: Optional[Tuple[str, List[int], object]] = None
    candidates: Optional[List[str]] = None
    failures = 0
    for running, free, want in cases:
        call = f"{name}({running}, free_blocks={free})"
        given = [tuple(r) for r in running]
        try:
            got = call_learner(fn, (given, free), call, want)
        except CheckFailure:
            if first is None:
                raise
            break
        if given != [tuple(r) for r in running]:
            raise fail(call + "  then running", running, given, "your function modified its input list; copy it")
        if type(got) is list and got == want:
            continue
        if type(got) is not list:
            raise fail(call, want, got, "return a list of request ids")
        matching = [m for m, value in mistakes(running, free).items() if value != want and value == got]
        if sorted(got) == sorted(want):
            matching.append("the right requests, in the wrong order: list them in the order they are preempted")
        candidates = matching if candidates is None else [m for m in candidates if m in matching]
        first = first or (call, want, got)
        failures += 1
        if failures == 20:
            break
    if first is not None:
        call, want, got = first
        raise fail(call, want, got, candidates[0] if candidates else default)


_VICTIM_HINT = ("follow the engine's rule step by step on this call: who is short of blocks first, and which "
                "request the engine takes from then")


@lru_cache(maxsize=1)
def _engine_traces() -> Tuple[Tuple[Running, int, List[int]], ...]:
    """(running, free blocks, requests the real engine preempted) before every step of tight runs."""
    from ..engine import Engine
    from ..model import ModelConfig, TinyTransformer

    model = TinyTransformer(ModelConfig(), seed=3).eval()
    traces = []
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
        with torch.no_grad():
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
                traces.append((running, free, [rid for rid, _, _ in reversed(running) if rid in hit]))
    preempting = [t for t in traces if t[2]]
    # The runs must exercise what they are for (a failure here is a bug in the check, not yours).
    assert len(preempting) >= 10 and any(len(t[2]) > 1 for t in preempting), len(preempting)
    return tuple(traces)


def check_choose_victims(choose_victims: Callable[[Running, int], List[int]]) -> None:
    """Task 07.2: ``choose_victims(running, free_blocks)`` -> ids preempted, in order (the engine's rule)."""
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
    cases = [(r, f, w) for r, f, w in hand] + list(_engine_traces())
    for running, free, want in cases:
        assert want == _engine_victims(running, free)  # the rule as the check reads it is the engine's
    _run_cases(choose_victims, "choose_victims", cases, _victim_mistakes, _VICTIM_HINT)
    passed("07.2")


# --------------------------------------------------------------------------- 07.3
Prioritised = List[Tuple[int, int, int, int]]


def _least_important(alive: list, i: int) -> int:
    """The largest priority value; among equals, the newest (latest in the list)."""
    return max(range(len(alive)), key=lambda j: (alive[j][1], j))


def priority_victims(running: Prioritised, free: int) -> List[int]:
    """The reference of task 07.3's policy (see the exercise): who is preempted, in order."""
    return _walk(running, free, _least_important, need_at=3, held_at=2)


def _priority_mistakes(running: Prioritised, free: int) -> Dict[str, List[int]]:
    walk = dict(need_at=3, held_at=2)
    return {
        "the wrong preemption victim: you preempted the newest request whatever its priority (the engine's "
        "rule of task 07.2); this policy preempts the least important one":
            _walk(running, free, _newest, **walk),
        "the wrong preemption victim: you preempted the MOST important request; a smaller priority value means "
        "more important": _walk(running, free, lambda a, i: max(range(len(a)), key=lambda j: (-a[j][1], j)), **walk),
        "the wrong preemption victim among equal priorities: of those, preempt the newest":
            _walk(running, free, lambda a, i: max(range(len(a)), key=lambda j: (a[j][1], -j)), **walk),
        "you only looked for victims from the asking request onwards; requests already served this step can be "
        "preempted too": _walk(running, free, lambda a, i: max(range(i, len(a)), key=lambda j: (a[j][1], j)), **walk),
        "a preempted request that had already reserved its blocks this step no longer needs them: give its "
        "reservation back": _walk(running, free, _least_important, release=False, **walk),
    }


_PRIORITY_HINT = ("work through this call by hand: at each shortage, which running request is least important, "
                  "and what does preempting it give back")


def check_choose_victims_by_priority(choose_victims_by_priority: Callable[[Prioritised, int], List[int]]) -> None:
    """Task 07.3: ``choose_victims_by_priority(running, free_blocks)`` -> ids preempted, in order."""
    hand = [  # (running, free, expected), verified by hand
        ([(0, 1, 2, 1), (1, 0, 2, 1), (2, 1, 1, 0)], 0, [2, 0]),  # request 0 is preempted after it reserved
        ([(0, 0, 3, 1), (1, 0, 3, 0), (2, 0, 2, 1), (3, 0, 2, 0)], 0, [3]),  # equal priorities: the newest
        ([(0, 0, 1, 0), (1, 5, 2, 1)], 0, [1]),                   # the asker is the least important
        ([(0, 2, 2, 1), (1, 2, 2, 1), (2, 0, 1, 1)], 1, [1]),     # equal priority 2: the newer one goes
        ([(7, 3, 1, 1), (8, 1, 1, 1), (9, 2, 1, 1)], 0, [7, 9]),   # 7 preempts itself, then 9 does
        ([(4, 0, 2, 1), (5, 9, 0, 1)], 0, [5, 4]),                # preempting a request that holds nothing
        ([], 0, []),
    ]
    for running, free, want in hand:
        assert want == priority_victims(running, free)  # keeps the hand cases honest
    rng = random.Random(73)
    randoms = []
    for _ in range(400):
        n = rng.randrange(0, 7)
        running = [(rid, rng.randrange(0, 4), rng.randrange(0, 5), rng.choice((0, 0, 1, 1, 2)))
                   for rid in rng.sample(range(20), n)]
        free = rng.randrange(0, 4)
        randoms.append((running, free, priority_victims(running, free)))
    # With every priority equal, the policy is the engine's rule: the real engine's steps must agree.
    engine = [([(rid, 0, held, need) for rid, held, need in running], free, want)
              for running, free, want in _engine_traces()]
    _run_cases(choose_victims_by_priority, "choose_victims_by_priority", hand + randoms + engine,
               _priority_mistakes, _PRIORITY_HINT)
    passed("07.3")


# --------------------------------------------------------------------------- 07.4
def _library_costs(prompt_len: int, generated: int, block_size: int, mode: str) -> Dict[str, int]:
    held_tokens = prompt_len + generated - 1  # the last sampled token is not stored yet
    alloc = BlockManager(64, block_size, num_cpu_blocks=64)
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
    back = len(alloc.swap_in(0)[1])  # (cpu ids, device ids): the blocks copied back
    return {"freed_blocks": freed, "blocks_copied": out + back, "prefill_tokens": 0,
            "blocks_on_resume": alloc.num_used_blocks}


def check_preemption_cost(preemption_cost: Callable[[int, int, int, str], Dict[str, int]]) -> None:
    """Task 07.4: ``preemption_cost(prompt_len, num_generated, block_size, mode)`` -> the four counts."""
    keys = ("freed_blocks", "blocks_copied", "prefill_tokens", "blocks_on_resume")
    hints = {
        "freed_blocks": "count the tokens the request holds at the moment it is preempted: its newest sampled "
                        "token has not been fed back yet, so it is not in the cache (and a block is freed whole)",
        "blocks_copied": "think about both directions: a recompute moves no K/V, a swap moves it out and back",
        "prefill_tokens": "a recompute rebuilds the K/V of everything the request will attend to next, and "
                          "its next token comes from the prefill's last logits; a swap rebuilds nothing",
        "blocks_on_resume": "after a recompute the request holds one token more than when it was preempted; "
                            "a swap brings back what it held",
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
    passed("07.4")


# --------------------------------------------------------------------------- 07.5 (design)
View = List[Tuple[int, int, int]]  # (request_id, tokens_held, tokens_to_go), oldest admitted first
# A policy passes when it recomputes at most this share of what newest-first recomputes, summed
# over the check's workloads (newest-first is the engine's rule; cheaper policies reach about 0.76).
RECOMPUTE_THRESHOLD = 0.9
# The learner's figures beside the library's are printed on success too, before the PASSED line.
PRINT_FIGURES_ON_PASS = True


class _PolicyBroke(Exception):
    """The learner's policy answered something the scheduler cannot act on; the message says what."""


def _newest_first(running: View, asking: int) -> int:
    return running[-1][0]


def _serve(requests: Sequence[Tuple[int, int]], num_blocks: int, block_size: int,
           choose: Callable[[View, int], int]) -> Tuple[int, int]:
    """Serve every request (prompt, output) with preemption by recompute; returns (recomputed tokens, preemptions).

    Each step admits the waiting queue head first while the pool has room for a request's
    tokens plus one, prefills it (its first token), then every running request stores its
    newest token; when that needs a block and none is free, ``choose(running, asking)``
    names the request to preempt: its blocks are freed and it goes back to the head of the
    queue, to prefill its prompt and every token it generated again when re-admitted.
    """
    alloc = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
    waiting = list(range(len(requests)))[::-1]  # the end is the head
    generated = [0] * len(requests)
    running: List[int] = []
    recomputed = preemptions = finished = 0
    limit = 50 * len(requests)
    while finished < len(requests):
        while waiting:
            rid = waiting[-1]
            tokens = requests[rid][0] + generated[rid]
            if not alloc.can_allocate(tokens + 1):
                break
            waiting.pop()
            alloc.allocate_for_sequence(rid, tokens)
            recomputed += tokens if generated[rid] else 0
            generated[rid] += 1
            if generated[rid] == requests[rid][1]:
                alloc.free_sequence(rid)
                finished += 1
            else:
                running.append(rid)
        if not running:
            raise AssertionError(f"request {waiting[-1]} does not fit the empty pool (a bug in the check)")
        i = 0
        while i < len(running):
            rid = running[i]
            try:
                alloc.append_tokens(rid, 1)
                i += 1
                continue
            except OutOfBlocksError:
                pass
            view = [(r, alloc.get_num_tokens(r), requests[r][1] - generated[r]) for r in running]
            victim = choose([tuple(v) for v in view], rid)
            if type(victim) is not int or victim not in running:
                raise _PolicyBroke(f"choose_victim({view}, asking={rid}) returned {victim!r}, which is not the id "
                                   "of a running request")
            j = running.index(victim)
            running.pop(j)
            alloc.free_sequence(victim)
            waiting.append(victim)
            preemptions += 1
            if preemptions > limit:
                raise _PolicyBroke(f"{preemptions} preemptions for {len(requests)} requests and the workload is "
                                   "not done: your policy keeps evicting requests that have to come straight back")
            if j < i:
                i -= 1
        for rid in list(running):
            generated[rid] += 1
            if generated[rid] == requests[rid][1]:
                running.remove(rid)
                alloc.free_sequence(rid)
                finished += 1
    return recomputed, preemptions


def _policy_workloads() -> List[Tuple[str, List[Tuple[int, int]], int, int]]:
    """(what, [(prompt, output)], pool blocks, block size): pools far too small for their queues."""
    out = []
    for seed, n, prompt_max, output_max, num_blocks, block_size in (
        (11, 40, 60, 80, 48, 4), (12, 60, 120, 40, 64, 8), (13, 40, 20, 120, 40, 4), (14, 50, 200, 60, 120, 16),
    ):
        rng = random.Random(seed)
        requests = [(rng.randint(1, prompt_max), rng.randint(1, output_max)) for _ in range(n)]
        out.append((f"{n} requests, prompts 1..{prompt_max}, outputs 1..{output_max}, {num_blocks} blocks of "
                    f"{block_size}", requests, num_blocks, block_size))
    return out


def check_victim_policy(choose_victim: Callable[[View, int], int]) -> None:
    """Task 07.5 (design): a preemption victim policy that recomputes fewer tokens than newest-first."""
    rows = []
    for what, requests, num_blocks, block_size in _policy_workloads():
        base, base_count = _serve(requests, num_blocks, block_size, _newest_first)

        def asked(running: View, asking: int) -> int:
            call = f"choose_victim({running}, asking={asking})"
            given = [tuple(r) for r in running]
            got = call_learner(choose_victim, (given, asking), call, "a running request's id")
            if given != running:
                raise fail(call + "  then running", running, given, "your policy modified the list it was given")
            return got

        try:
            mine, count = _serve(requests, num_blocks, block_size, asked)
        except _PolicyBroke as exc:
            raise fail(f"serving <{what}>", "every request served", str(exc),
                       "a policy must name one of the running requests, and not one it will need right back") from None
        rows.append((what, base, base_count, mine, count))
    base_total = sum(r[1] for r in rows)
    mine_total = sum(r[3] for r in rows)
    table = "\n".join(f"  {what}: newest-first (the engine's rule) {base} tokens in {bc} preemptions; "
                      f"yours {mine} tokens in {mc}" for what, base, bc, mine, mc in rows)
    ratio = mine_total / base_total
    summary = (f"recomputed tokens, all workloads: yours {mine_total}, newest-first {base_total} "
               f"({ratio:.0%} of it; the bar is {RECOMPUTE_THRESHOLD:.0%})")
    if ratio > RECOMPUTE_THRESHOLD:
        hint = ("newest-first never asks what a preemption costs; take a few of its preemptions on one workload "
                "and work out what each other running request would have cost instead")
        if ratio == 1.0:
            hint = "this is newest-first itself (the engine's rule); the task asks for a cheaper one. " + hint
        raise fail(f"your policy on the check's workloads (recomputed tokens)\n{table}",
                   f"at most {RECOMPUTE_THRESHOLD:.0%} of newest-first's {base_total} recomputed tokens",
                   f"{mine_total} ({ratio:.0%})", hint)
    if PRINT_FIGURES_ON_PASS:
        print(table)
        print(summary)
    passed("07.5")
