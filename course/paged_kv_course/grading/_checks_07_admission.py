"""Check of task 07.1: first-come-first-served admission of a waiting queue, with a watermark and
the rejection of a prompt that can never fit.

The expected plan comes from the library's allocator: ``can_allocate`` (watermark included) on a
pool in the given state for "fits now", and on an empty pool of the same size for "can ever fit".
A wrong plan is compared with a reference that has one known mistake switched on; the mistake that
explains every failure seen is named, without the rule.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Callable, Dict, List, Sequence, Tuple

from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.block import cdiv
from ._common import call_learner, expect_raises, fail, passed

Plan = Tuple[List[int], List[int]]


def _library_plan(prompts: Sequence[int], block_size: int, free: int, total: int, watermark: float,
                  slots: int) -> Plan:
    """(admitted, rejected) queue positions, from the library allocator's ``can_allocate``."""
    empty = BlockManager(total, block_size)
    pool = BlockManager(total, block_size)
    if total - free:
        pool.allocate_for_sequence(-1, (total - free) * block_size)
    admitted: List[int] = []
    rejected: List[int] = []
    for position, tokens in enumerate(prompts):
        if not empty.can_allocate(tokens, watermark=watermark):
            rejected.append(position)
            continue
        if len(admitted) == slots or not pool.can_allocate(tokens, watermark=watermark):
            break
        pool.allocate_for_sequence(position, tokens)
        admitted.append(position)
    return admitted, rejected


def _plan(prompts: Sequence[int], bs: int, free: int, total: int, wm: float, slots: int, *,
          stop: bool = True, take: bool = True, of_total: bool = True, inclusive: bool = True,
          use_slots: bool = True, round_up: bool = True, exact_wm: bool = True, reject: bool = True,
          never_keeps_wm: bool = True, reject_free: bool = True, float_ceil: bool = True) -> Plan:
    """The rule with switches that plant the known mistakes (all True: the rule)."""
    admitted: List[int] = []
    rejected: List[int] = []
    for position, tokens in enumerate(prompts):
        need = cdiv(tokens, bs) if round_up else tokens // bs
        used = len(admitted) + (0 if reject_free else len(rejected))
        pool_reserve = (wm * total if float_ceil else math.ceil(Fraction(wm) * total)) if exact_wm else int(wm * total)
        if reject and need > total - (pool_reserve if never_keeps_wm else 0):
            if not reject_free and used >= slots:
                break
            rejected.append(position)
            continue
        floor = pool_reserve if of_total else wm * free
        if (use_slots and used >= slots) or not (free - need >= floor if inclusive else free - need > math.ceil(floor)):
            if stop:
                break
            continue
        if take:
            free -= need
        admitted.append(position)
    return admitted, rejected


MISTAKES: Dict[str, dict] = {
    "admission went on past a request that had to wait: the queue is served in order, and a request that "
    "waits keeps everyone behind it waiting (head-of-line)": dict(stop=False),
    "the free count never went down: an admitted request's blocks are gone before the next one is weighed":
        dict(take=False),
    "the watermark is a fraction of the whole pool, not of the blocks free at the moment": dict(of_total=False),
    "the reserve came out one block larger than the task's on a pool where watermark * total_blocks is a whole "
    "number in floats (a watermark of 0.1 on 20 blocks is a reserve of 2): read again which number the reserve is":
        dict(float_ceil=False),
    "a request that leaves exactly the reserve free was refused: that much is enough": dict(inclusive=False),
    "more requests were admitted than the batch has slots for": dict(use_slots=False),
    "a prompt whose last block is not full was counted as if that block were not needed": dict(round_up=False),
    "the reserve was rounded down to whole blocks: it must never be less than the fraction asks": dict(exact_wm=False),
    "whether a prompt can ever fit was judged without the reserve: an empty pool keeps its reserve too":
        dict(never_keeps_wm=False),
    "a prompt that can never fit stopped the queue: it must leave it, so that the requests behind it are "
    "served": dict(reject=False),
    "a rejected request used a batch slot: it never runs": dict(reject_free=False),
}

_BAD_ARGUMENTS = [  # (args, why it is refused)
    (([4], 0, 10, 10, 0.1, 2), "block_size 0: a block holds at least one token"),
    (([4], 4, 11, 10, 0.1, 2), "free_blocks 11 is more than total_blocks 10"),
    (([4], 4, -1, 10, 0.1, 2), "free_blocks -1 is negative"),
    (([4], 4, 10, 10, 1.5, 2), "watermark 1.5 is not a fraction in [0, 1]"),
    (([4], 4, 10, 10, -0.1, 2), "watermark -0.1 is not a fraction in [0, 1]"),
    (([4, -3], 4, 10, 10, 0.1, 2), "a prompt of -3 tokens"),
    (([4], 4, 10, 10, 0.1, -1), "batch_slots -1 is negative"),
]


def _show(prompts: Sequence[int], bs: int, free: int, total: int, wm: float, slots: int) -> str:
    return (f"plan_admission({list(prompts)}, block_size={bs}, free_blocks={free}, total_blocks={total}, "
            f"watermark={wm}, batch_slots={slots})")


def _as_plan(got: object) -> bool:
    return (type(got) is tuple and len(got) == 2 and all(type(part) is list for part in got)
            and all(type(x) is int for part in got for x in part))


def _cases() -> List[tuple]:
    hand = [
        ([10, 90, 13, 2, 5], 4, 9, 20, 0.1, 3),   # admit, reject, admit, wait
        ([3, 3, 3], 1, 10, 10, 0.0, 8),
        ([12, 12, 12, 4], 4, 10, 10, 0.15, 8),    # the reserve of 1.5 blocks is 2
        ([20, 4, 4], 4, 4, 20, 0.0, 8),           # the head waits: nobody behind it goes
        ([28, 28], 4, 14, 14, 0.05, 8),            # exactly the reserve left
        ([4, 4, 4, 4], 4, 50, 50, 0.0, 2),         # two batch slots
        ([16, 16], 4, 8, 20, 0.25, 8),            # the pool's watermark, not the free blocks'
        ([41, 1], 4, 10, 10, 0.0, 1),              # 11 blocks never fit in 10; the next takes the one slot
        ([37, 1], 4, 10, 10, 0.1, 1),              # 10 blocks fit an empty pool of 10, not with its reserve
        ([5, 5], 4, 10, 10, 0.0, 4),               # 5 tokens need 2 blocks of 4
        ([0, 0], 4, 3, 10, 0.3, 4),                # an empty prompt needs no block, but the reserve holds
        ([], 4, 5, 5, 0.0, 4),
        ([8, 8], 4, 5, 10, 0.1, 4),                # 0.1 * 10 is 1.0 in floats: a reserve of 1, both admitted
        ([41, 4, 90], 4, 10, 10, 0.0, 0),          # no slot left: 41 tokens are rejected all the same, 4 waits
    ]
    rng = random.Random(71)
    cases = list(hand)
    for _ in range(300):
        total = rng.choice([8, 10, 14, 20, 64])
        bs = rng.choice([1, 2, 4, 16])
        prompts = [rng.randrange(0, bs * total + 2 * bs) if rng.random() < 0.15 else rng.randrange(0, 6 * bs + 1)
                   for _ in range(rng.randrange(0, 7))]
        cases.append((prompts, bs, rng.randrange(0, total + 1), total,
                      rng.choice([0.0, 0.01, 0.05, 0.1, 0.2, 0.3]), rng.randrange(0, 6)))
    return cases


def check_plan_admission(plan_admission: Callable[..., Plan]) -> None:
    """Task 07.1: ``plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark,
    batch_slots)`` returns the (admitted, rejected) queue positions of one FCFS admission round."""
    first = None
    candidates = None
    failures = 0
    for args in _cases():
        prompts = list(args[0])
        want = _library_plan(*args)
        call = _show(*args)
        given = list(prompts)
        got = call_learner(plan_admission, (given, *args[1:]), call, want)
        if given != prompts:
            raise fail(call, f"prompt_tokens left as {prompts}", given, "do not modify the queue you are given")
        if not _as_plan(got):
            raise fail(call, want, got, "return a tuple of two lists of ints: (admitted, rejected) queue positions")
        if got == want:
            continue
        matching = [name for name, switches in MISTAKES.items() if _plan(*args, **switches) == got]
        candidates = matching if candidates is None else [m for m in candidates if m in matching]
        first = first or (call, want, got)
        failures += 1
        if failures == 20:
            break
    if first is not None:
        call, want, got = first
        raise fail(call, want, got, candidates[0] if candidates else
                   "work through this call request by request: which ones leave, which one waits first, and why")
    for args, why in _BAD_ARGUMENTS:
        expect_raises(plan_admission, (list(args[0]), *args[1:]), _show(*args), ValueError, why + ": raise ValueError")
    passed("07.1")
