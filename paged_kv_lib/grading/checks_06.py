"""Checks of exercise 06, sharing: copy-on-write, salted chained keys, prefix lookup, free order.

Each check drives a real ``PagedKVCacheAllocator`` through a scenario and compares the
learner's function, step by step, with what the allocator did from the same state.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..allocator import PagedKVCacheAllocator
from ..prefix_cache import block_key, chain_keys
from ._common import call_learner, expect_equal, fail, passed


# --------------------------------------------------------------------------- 06.1
def _state_of(alloc: PagedKVCacheAllocator) -> Dict[str, Any]:
    """The exercise's plain-data model of an allocator (no prefix caching, nothing swapped)."""
    return {
        "block_size": alloc.block_size,
        "tables": {s: list(t.block_ids) for s, t in alloc.sequence_block_tables.items()},
        "lengths": {s: alloc.get_num_tokens(s) for s in alloc.seq_ids},
        "ref_counts": [b.ref_count for b in alloc.blocks],
        "free": deque(alloc.free_blocks),
    }


def _show(state: Dict[str, Any]) -> str:
    used = {i: c for i, c in enumerate(state["ref_counts"]) if c}
    return (f"block_size={state['block_size']}, tables={state['tables']}, lengths={state['lengths']}, "
            f"ref_counts(nonzero)={used}, free={list(state['free'])}")


_COW_HINT = (
    "append one token at position lengths[seq_id]: a new block from the head of the free queue when "
    "that position starts a block (no copy needed, even if the last block is shared); otherwise, if the "
    "last block's ref count is above 1, copy it: take a free block, give it ref count 1, drop one "
    "reference from the old block, put the new block in the table; return (old, new), else None"
)


def _check_one_append(cow_append: Callable, alloc: PagedKVCacheAllocator, seq_id: int) -> None:
    state = _state_of(alloc)
    before = _show(state)
    copies_before = len(alloc.copy_log)
    alloc.append_tokens(seq_id, 1)
    new_copies = list(alloc.copy_log)[copies_before:]
    want_return = new_copies[0] if new_copies else None
    want = _state_of(alloc)
    call = f"cow_append(state, seq_id={seq_id}) with state: {before}"
    got = call_learner(cow_append, (state, seq_id), call, want_return)
    if got is not None:
        got = tuple(got) if isinstance(got, (list, tuple)) else got
    expect_equal(call + "  -> return value", want_return, got, _COW_HINT)
    for key in ("tables", "lengths", "ref_counts"):
        expect_equal(call + f"  -> state[{key!r}] afterwards", want[key], state[key], _COW_HINT)
    expect_equal(call + "  -> list(state['free']) afterwards", list(want["free"]), list(state["free"]),
                 "take blocks from the head of the free queue (popleft)")


def check_cow_append(cow_append: Callable[[Dict[str, Any], int], Optional[Tuple[int, int]]]) -> None:
    """Task 06.1: ``cow_append(state, seq_id)`` appends one token with copy-on-write."""
    # Hand-made cases first: their messages are the easiest to read.
    alloc = PagedKVCacheAllocator(8, 4, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 6)
    alloc.fork(0, 1)
    alloc.fork(0, 2)
    for seq_id in (1, 2, 0, 1):  # copy, copy, sole holder writes in place, then plain growth
        _check_one_append(cow_append, alloc, seq_id)
    alloc = PagedKVCacheAllocator(8, 4, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 8)  # the shared last block is full: a new block, no copy
    alloc.fork(0, 1)
    _check_one_append(cow_append, alloc, 1)
    alloc.allocate_for_sequence(2, 0)  # an empty sequence: its first token needs a block
    _check_one_append(cow_append, alloc, 2)
    # Random scenarios mixing allocations, forks and appends.
    for seed, block_size in ((1, 4), (2, 2), (3, 1), (4, 3)):
        rng = random.Random(seed)
        alloc = PagedKVCacheAllocator(40, block_size, 1, 1, allocate_cache=False)
        next_id = 0
        for _ in range(70):
            roll = rng.random()
            if not alloc.seq_ids or (roll < 0.15 and alloc.num_free_blocks > 6):
                alloc.allocate_for_sequence(next_id, rng.randrange(0, 3 * block_size + 1))
                next_id += 1
            elif roll < 0.3 and len(alloc.seq_ids) < 8:
                alloc.fork(rng.choice(alloc.seq_ids), next_id)
                next_id += 1
            elif alloc.num_free_blocks >= 2:
                _check_one_append(cow_append, alloc, rng.choice(alloc.seq_ids))
            else:
                alloc.free_sequence(rng.choice(alloc.seq_ids))
    passed("06.1")


# --------------------------------------------------------------------------- 06.2
def check_salted_block_key(salted_block_key: Callable[[Optional[bytes], List[int], Optional[bytes]], bytes]) -> None:
    """Task 06.2: ``salted_block_key(parent_key, token_ids, extra_key=None)`` equals the library's ``block_key``."""
    root = block_key(None, [1, 2, 3, 4])
    parents = [None, root, block_key(root, [5, 6, 7, 8])]
    token_lists = [[1, 2, 3, 4], [0, 0, 0, 0], [7], [], [255, 256, 2**40, 3], list(range(16))]
    salts = [None, b"", b"lora-7", b"tenant:a" * 5, bytes(range(9))]
    for parent in parents:
        for tokens in token_lists:
            for salt in salts:
                want = block_key(parent, tokens, salt)
                shown = "None" if parent is None else f"<key {parent.hex()[:8]}...>"
                call = f"salted_block_key({shown}, {tokens}, extra_key={salt!r})"
                got = call_learner(salted_block_key, (parent, list(tokens), salt), call, want)
                if not isinstance(got, bytes):
                    raise fail(call, want, got, "return the 32-byte digest itself: hashlib.sha256(...).digest()")
                hint = ("SHA-256 over: the parent key (32 zero bytes when None); then, if extra_key is "
                        "non-empty, len(extra_key) as 8 little-endian bytes followed by extra_key; then every "
                        "token id as a signed 8-byte little-endian integer")
                if salt and block_key(parent, tokens) == got:
                    hint = "the extra key is missing from your hash: " + hint
                expect_equal(call, want, got, hint)
    passed("06.2")


# --------------------------------------------------------------------------- 06.3
def check_salted_chain_keys(salted_chain_keys: Callable[[List[int], int, Optional[bytes]], List[bytes]]) -> None:
    """Task 06.3: ``salted_chain_keys(token_ids, block_size, extra_key=None)`` equals the library's ``chain_keys``."""
    rng = random.Random(6)
    cases = [([], 4, None), ([1, 2, 3], 4, None), ([1, 2, 3, 4], 4, None), (list(range(9)), 4, None),
             (list(range(12)), 4, b"lora-1"), (list(range(5)), 1, None), ([9] * 32, 16, b"x")]
    cases += [([rng.randrange(300) for _ in range(rng.randrange(40))], rng.choice([2, 3, 8]), rng.choice([None, b"s"]))
              for _ in range(12)]
    for tokens, bs, salt in cases:
        want = chain_keys(tokens, bs, salt)
        call = f"salted_chain_keys({tokens}, block_size={bs}, extra_key={salt!r})"
        got = call_learner(salted_chain_keys, (list(tokens), bs, salt), call, [k.hex()[:8] for k in want])
        if not isinstance(got, (list, tuple)) or not all(isinstance(k, bytes) for k in got):
            raise fail(call, f"a list of {len(want)} keys (bytes)", got, "return a list of 32-byte digests")
        got = list(got)
        if len(got) != len(want):
            raise fail(call, f"{len(want)} keys (one per full block)", f"{len(got)} keys",
                       "only full blocks get a key; a partial last block has none")
        for i, (w, g) in enumerate(zip(want, got)):
            if w != g:
                hint = "key i is block_key(key i-1, tokens of block i, extra_key), key 0's parent is None"
                if i and g == block_key(None, tokens[i * bs:(i + 1) * bs], salt):
                    hint = "each key must chain on the previous block's key: " + hint
                raise fail(call + f"[{i}]", w.hex(), g.hex(), hint)
    passed("06.3")


# --------------------------------------------------------------------------- 06.4
def check_longest_cached_prefix(longest_cached_prefix: Callable[[List[bytes], Dict[bytes, int]], List[int]]) -> None:
    """Task 06.4: ``longest_cached_prefix(keys, cached)`` -> block ids of the leading run of hits."""
    bs = 4
    alloc = PagedKVCacheAllocator(24, bs, 1, 1, allocate_cache=False)
    system = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    prompts = {0: system + [11, 12, 13, 14, 15, 16], 1: system + [20, 21], 2: [1, 2, 3, 4, 99, 98, 97, 96, 5, 6, 7, 8],
               3: [42] * 9}
    for seq_id, tokens in prompts.items():
        alloc.allocate_for_sequence(seq_id, len(tokens), token_ids=tokens)
    alloc.free_sequence(0)
    alloc.free_sequence(3)
    queries = [
        system + [11, 12, 13, 14, 15, 16, 17],  # all of request 0's blocks (cached, free)
        system + [20, 21, 22],                  # shared system blocks, then request 1's own
        [1, 2, 3, 4, 5, 6, 7, 8, 99, 98, 97, 96],  # [99, 98, 97, 96] is cached, after another prefix
        [1, 2, 3, 4, 99, 98, 97, 96, 5, 6, 7, 8, 0],
        [7, 7, 7, 7, 1, 2, 3, 4],                # first block misses: nothing usable
        [42] * 8,
        [1, 2, 3],                               # no full block at all
    ]
    hint = ("walk the keys in order and stop at the first one not in `cached`; return the block ids "
            "found before it (a block after a miss was computed after a different prefix)")
    # Tiny hand-made dictionaries: a later key present after a miss must not count.
    keys = chain_keys(list(range(16)), bs)
    for cached, want in (({keys[0]: 5, keys[2]: 9}, [5]), ({keys[1]: 3, keys[2]: 4, keys[3]: 6}, []),
                         ({k: 10 + i for i, k in enumerate(keys)}, [10, 11, 12, 13]), ({}, [])):
        call = f"longest_cached_prefix(chain_keys(list(range(16)), {bs}), cached) with cached holding keys " \
               f"{sorted(keys.index(k) for k in cached)}"
        got = call_learner(longest_cached_prefix, (list(keys), dict(cached)), call, want)
        expect_equal(call, want, list(got) if isinstance(got, (list, tuple)) else got, hint)
    # The real allocator's prefix cache, queried with prompts that hit it in different ways.
    for n, tokens in enumerate(queries):
        keys = chain_keys(tokens, bs)
        cached = {b.block_hash: b.block_id for b in alloc.blocks if b.block_hash is not None}
        seq_id = 100 + n
        hit_tokens = alloc.allocate_for_sequence(seq_id, len(tokens), token_ids=tokens)
        want = alloc.get_block_mapping(seq_id)[: hit_tokens // bs]
        alloc.free_sequence(seq_id)
        call = f"longest_cached_prefix(chain_keys({tokens}, {bs}), cached)"
        given = dict(cached)
        got = call_learner(longest_cached_prefix, (list(keys), given), call, want)
        got = list(got) if isinstance(got, (list, tuple)) else got
        expect_equal(call, want, got, hint)
        if given != cached:
            raise fail(call, "cached left unchanged", "cached was modified", "only read the cache")
    passed("06.4")


# --------------------------------------------------------------------------- 06.5
def _check_one_free(free_in_order: Callable, alloc: PagedKVCacheAllocator, seq_id: int) -> None:
    table = alloc.get_block_mapping(seq_id)
    ref_counts = [b.ref_count for b in alloc.blocks]
    queue = deque(alloc.free_blocks)
    shown = (f"free_in_order(table={table}, ref_counts(nonzero)="
             f"{ {i: c for i, c in enumerate(ref_counts) if c} }, free_queue={list(queue)})")
    alloc.free_sequence(seq_id)
    want_queue = list(alloc.free_blocks)
    want_counts = [b.ref_count for b in alloc.blocks]
    result = call_learner(free_in_order, (list(table), ref_counts, queue), shown, want_queue)
    if result is not None:
        raise fail(shown + "  -> return value", None, result, "change ref_counts and free_queue in place, return None")
    expect_equal(shown + "  -> ref_counts afterwards", want_counts, ref_counts,
                 "drop exactly one reference from each block of the table")
    expect_equal(shown + "  -> list(free_queue) afterwards", want_queue, list(queue),
                 "append to the tail only the blocks whose count reached 0, last logical block first "
                 "(reversed table order), so a sequence's tail blocks are reused (evicted) before its head")


def check_free_in_order(free_in_order: Callable[[List[int], List[int], deque], None]) -> None:
    """Task 06.5: ``free_in_order(table, ref_counts, free_queue)`` frees a sequence tail first."""
    for seed, bs in ((0, 4), (1, 2), (2, 1), (3, 4)):
        rng = random.Random(seed)
        alloc = PagedKVCacheAllocator(48, bs, 1, 1, allocate_cache=False)
        shared = [rng.randrange(50) for _ in range(3 * bs)]
        next_id = 0
        for _ in range(60):
            roll = rng.random()
            if alloc.seq_ids and roll < 0.35:
                _check_one_free(free_in_order, alloc, rng.choice(alloc.seq_ids))
                continue
            if alloc.seq_ids and roll < 0.5 and len(alloc.seq_ids) < 10:
                alloc.fork(rng.choice(alloc.seq_ids), next_id)
            else:
                tail = [rng.randrange(50) for _ in range(rng.randrange(0, 2 * bs + 2))]
                tokens = (shared[: rng.randrange(0, len(shared) + 1)] if rng.random() < 0.7 else []) + tail
                if not alloc.can_allocate(len(tokens), token_ids=tokens) or alloc.num_free_blocks < 4:
                    continue
                alloc.allocate_for_sequence(next_id, len(tokens), token_ids=tokens)
            next_id += 1
        for seq_id in list(alloc.seq_ids):
            _check_one_free(free_in_order, alloc, seq_id)
    passed("06.5")
