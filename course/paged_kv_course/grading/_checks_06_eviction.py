"""Check of task 06.4 (design): an eviction order for cached free blocks, graded by the block hit rate it
reaches on traces with popular shared prefixes, private tails and long one-off documents, beside plain
LRU's and the library free queue's order.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List

from ._common import call_learner, fail, is_int, passed

# The learner's figures beside LRU's and the library's are printed on success too, before the PASSED line.
SHOW_FIGURES = True

EVICTION_CAPACITY = 32  # cached blocks the pool can keep
FOLLOW_UP = 0.6  # how often a document gets a follow-up question right after the first


def eviction_trace(seed: int, num_requests: int = 200) -> List[List[int]]:
    """Requests as chains of block contents (ints): popular shared prefixes (the popular set changes halfway
    through), private tails, and long one-off documents, most of them asked about once more right away."""
    rng = random.Random(seed)
    counter = iter(range(1, 10 ** 9))
    systems = [[next(counter) for _ in range(6)] for _ in range(6)]
    requests: List[List[int]] = []
    while len(requests) < num_requests:
        if rng.random() < 0.15:  # a long document: a question, often one follow-up at once, then never again
            document = [next(counter) for _ in range(rng.randint(18, 26))]
            requests.append(document)
            if rng.random() < FOLLOW_UP:
                requests.append(document + [next(counter) for _ in range(rng.randint(1, 3))])
            continue
        popular = 0 if len(requests) < num_requests // 2 else 3  # which three system prompts are in fashion
        shared = systems[popular + rng.choices(range(3), weights=[5, 3, 2])[0]] if rng.random() < 0.8 else []
        requests.append(list(shared) + [next(counter) for _ in range(rng.randint(1, 5))])
    return requests[:num_requests]


Order = Callable[[List[Dict[str, int]]], List[int]]


def simulate_eviction(order: Order, requests: List[List[int]], capacity: int = EVICTION_CAPACITY,
                      *, describe: str = "eviction_order") -> float:
    """Serve ``requests`` one after another from a pool of ``capacity`` blocks; returns the block hit rate.

    A request reuses the cached blocks of its longest cached prefix; each of its other blocks takes
    an empty block, or else evicts a cached block no longer in use, in the order ``order`` returns.
    """
    cache: Dict[int, Dict[str, int]] = {}  # content -> what a candidate shows
    hits = total = 0
    for now, chain in enumerate(requests):
        found = 0
        while found < len(chain) and chain[found] in cache:
            found += 1
        hits += found
        total += len(chain)
        for content in chain[:found]:
            cache[content]["last_used"] = now
            cache[content]["uses"] += 1
        excess = len(cache) + len(chain) - found - capacity
        if excess > 0:
            in_use = set(chain[:found])
            candidates = [dict(info) for content, info in cache.items() if content not in in_use]
            call = f"{describe}(<{len(candidates)} candidates at request {now}>)"
            ids = sorted(c["block"] for c in candidates)
            got = call_learner(order, (candidates,), call, "a list of the candidates' block ids")
            if type(got) is not list or not all(is_int(b) for b in got) or sorted(got) != ids:
                raise fail(call, f"the {len(ids)} candidates' block ids, each once, in eviction order", got,
                           "return every candidate's 'block' exactly once, first the one to evict first")
            for block_id in got[:excess]:
                del cache[block_id]
        for depth, content in enumerate(chain[found:], start=found):
            cache[content] = {"block": content, "position": depth, "last_used": now, "uses": 1, "cached_at": now}
    return hits / total


def lru_order(candidates: List[Dict[str, int]]) -> List[int]:
    """Least recently used first (ties: the block cached first goes first)."""
    return [c["block"] for c in sorted(candidates, key=lambda c: (c["last_used"], c["cached_at"], c["position"]))]


def library_order(candidates: List[Dict[str, int]]) -> List[int]:
    """The library's free queue: least recently released first, a request's last block before its first."""
    return [c["block"] for c in sorted(candidates, key=lambda c: (c["last_used"], -c["position"]))]


EVICTION_SEEDS = (64, 65)
EVICTION_MARGIN = 0.035  # hit rate the learner's order must add over LRU's, on every trace


def check_eviction_order(eviction_order: Order) -> None:
    """Task 06.4 (design): an eviction order whose hit rate beats LRU's by ``EVICTION_MARGIN`` on each trace."""
    for seed in EVICTION_SEEDS:
        requests = eviction_trace(seed)
        lru = simulate_eviction(lru_order, requests)
        lib = simulate_eviction(library_order, requests)
        yours = simulate_eviction(eviction_order, requests)
        figures = f"trace {seed}: block hit rate  yours {yours:6.1%}   LRU {lru:6.1%}   the library's free queue {lib:6.1%}"
        if yours < lru + EVICTION_MARGIN:
            raise fail(f"simulate_eviction(eviction_order, eviction_trace({seed}))\n{figures}",
                       f"a hit rate of at least {lru + EVICTION_MARGIN:.1%} (LRU's {lru:.1%} + {EVICTION_MARGIN * 100:.1f} points)",
                       f"{yours:.1%}", "look at which blocks the trace asks for again, and which it never does: "
                       "what does a candidate's record say about that?")
        if SHOW_FIGURES:
            print(figures)
    passed("06.4")
