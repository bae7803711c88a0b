"""Checks of exercise 06, sharing: your allocator's copy-on-write (and fork), the salted chained
block key, the keys of a prompt, the longest cached prefix, and O(1) removal from the free queue.

Every expected value comes from the library (``PagedKVCacheAllocator``, ``block_key``,
``chain_keys``, ``FreeBlockQueue``) run on the same inputs; hints name the likely mistake.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Optional

from ..allocator import PagedKVCacheAllocator
from ..free_queue import NOT_QUEUED, FreeBlockQueue
from ..prefix_cache import block_key, chain_keys
from ._allocator_steps import NAME, allocator_steps
from ._common import call_learner, expect_equal, expect_raises, fail, passed
from .checks_05 import _random_scenarios, serve_through_engine

# --------------------------------------------------------------------------- 06.1
_NO_COPY = ("no copy-on-write: the new token lands in a shared block that is not full, so the writer "
            "must first get a private copy of it (the other holders keep reading the original)")
_NEEDLESS_COPY = ("a full shared block needs no copy (the new token starts a new block), and a block "
                  "whose only holder writes needs none either")
_KEEPS_REFERENCE = ("a copy-on-write that keeps the old reference: after the copy the writer no longer holds "
                    "the block it replaced, so that block must lose one holder (or it never returns to the "
                    "free queue)")
_FORK_COUNTS = ("fork adds a holder to every block the child shares: freeing the parent must leave the "
                "child's blocks allocated, and only the last holder's free returns a block")


def _sharing_scenarios(cls: Any) -> None:
    # Fork first: the child's blocks stay allocated while it holds them.
    run = allocator_steps(cls, 6, 2)
    run.step("allocate_for_sequence", 0, 5)
    run.step("fork", 0, 1, hint="the child gets the parent's mapping: the same blocks, nothing new taken")
    run.step("free_sequence", 0, hint=_FORK_COUNTS)
    run.step("allocate_for_sequence", 2, 3, hint=_FORK_COUNTS)
    run.step("free_sequence", 1, hint=_FORK_COUNTS)
    # Three samples of a prompt that ends mid-block: two copies, then the last holder writes in place.
    run = allocator_steps(cls, 12, 4)
    run.step("allocate_for_sequence", 0, 6)
    run.step("fork", 0, 1, hint="the child gets the parent's mapping: the same blocks, nothing new taken")
    run.step("fork", 0, 2)
    run.step("append_tokens", 1, 1, hint=_NO_COPY)
    run.step("append_tokens", 2, 1, hint=_NO_COPY)
    run.step("append_tokens", 0, 1, hint=_NEEDLESS_COPY)
    run.step("append_tokens", 1, 2)
    run.step("free_sequence", 1, hint=_KEEPS_REFERENCE)
    run.step("free_sequence", 2, hint=_KEEPS_REFERENCE)
    run.step("free_sequence", 0, hint=_KEEPS_REFERENCE)
    # A shared block that is full: the next token starts a new block, no copy.
    run = allocator_steps(cls, 8, 4)
    run.step("allocate_for_sequence", 0, 8)
    run.step("fork", 0, 1)
    run.step("append_tokens", 1, 1, hint=_NEEDLESS_COPY)
    run.step("free_sequence", 0, hint=_FORK_COUNTS)
    run.step("free_sequence", 1, hint=_FORK_COUNTS)
    # A chunk into a shared partial block: the copy first, then the new blocks.
    run = allocator_steps(cls, 10, 3)
    run.step("allocate_for_sequence", 0, 4)
    run.step("fork", 0, 1)
    run.step("append_tokens", 1, 6, hint=_NO_COPY + "; the copy is taken (and returned) before the new blocks")
    run.step("fork", 1, 2)
    run.step("free_sequence", 1, hint=_FORK_COUNTS)
    run.step("append_tokens", 2, 1, hint=_NO_COPY)
    run.step("append_tokens", 0, 1, hint=_NEEDLESS_COPY)
    # Empty sequences, errors, and a copy that does not fit.
    run = allocator_steps(cls, 3, 4)
    run.step("allocate_for_sequence", 0, 0)
    run.step("fork", 0, 1)
    run.step("append_tokens", 1, 1, hint="a sequence with no block takes a new one: there is nothing to copy")
    run.step("fork", 7, 3, hint="forking an unknown parent raises ValueError")
    run.step("fork", 0, 1, hint="forking into an id that exists raises ValueError")
    run.step("allocate_for_sequence", 2, 7)
    run.step("fork", 1, 3)
    run.step("append_tokens", 3, 1, hint="the copy needs a free block and there is none: RuntimeError, nothing changed")
    run.step("free_sequence", 1)
    run.step("append_tokens", 3, 1, hint=_NEEDLESS_COPY)


def check_sharing_allocator(cls: Any) -> None:
    """Task 06.1: ``MyAllocator`` copies a shared block on write (and forks) like the library's allocator."""
    _sharing_scenarios(cls)
    _random_scenarios(cls, [11, 12, 13, 14, 15], forks=True)
    passed("06.1")


def check_allocator_conforms(cls: Any) -> None:
    """Task 06.1 (second check): the library's differential test, ``conformance.check_allocator``."""
    from ..conformance.differential import PARTS, check_allocator

    try:
        check_allocator(cls, max_examples=50, ops=PARTS["06"], name=NAME)  # ~2,000 learner calls at most
    except NotImplementedError as exc:
        call_learner(_raise, (exc,), "check_allocator(MyAllocator)", "no difference")
    except AssertionError as exc:
        raise fail(f"check_allocator({NAME})", "no difference from the library's allocator",
                   str(exc), "run the calls above on your class and read what differs") from None
    passed("06.1")


def _raise(exc: BaseException) -> None:
    raise exc


def check_serves_forked_samples(cls: Any) -> None:
    """Task 06.1 (third check): forked samples (n=2) served through ``engine_for``, token for token."""
    serve_through_engine(cls, "06.1", n=2)


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
                    hint = ("an unchained hash: key i was computed from block i's tokens alone, so the same "
                            "tokens after different prefixes would share K/V; " + hint)
                elif i and salt and g == block_key(want[i - 1], tokens[i * bs:(i + 1) * bs]):
                    hint = "the extra key must go into every block's key, not only the first: " + hint
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
class CountingList:
    """A list of ints that counts how many entries a function reads (to tell O(1) from a walk).

    Indexing, assignment, ``len``, iteration, ``in``, ``index`` and ``count`` behave as on a
    list; reads are counted (a slice, a scan or an iteration counts every entry). A plain
    object holding a list, so its state comes back to the check after a judged call too.
    """

    def __init__(self, values: List[int]) -> None:
        self.values = list(values)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        got = self.values[index]
        self.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __setitem__(self, index: Any, value: Any) -> None:
        self.values[index] = value

    def __iter__(self) -> Any:
        self.reads += len(self.values)
        return iter(list(self.values))

    def __contains__(self, value: object) -> bool:
        self.reads += len(self.values)
        return value in self.values

    def index(self, *args: Any) -> int:
        self.reads += len(self.values)
        return self.values.index(*args)

    def count(self, value: Any) -> int:
        self.reads += len(self.values)
        return self.values.count(value)

    def copy(self) -> List[int]:
        self.reads += len(self.values)
        return list(self.values)

    def __eq__(self, other: object) -> bool:
        self.reads += len(self.values)
        return self.values == (other.values if isinstance(other, CountingList) else other)

    def __repr__(self) -> str:
        return repr(self.values)


def _queue_arrays(queue: FreeBlockQueue) -> tuple:
    return list(queue._prev), list(queue._next)


def _check_one_removal(remove: Callable, queue: FreeBlockQueue, block_id: int, size: int) -> None:
    prev, nxt = _queue_arrays(queue)
    order = list(queue)
    call = (f"remove_from_free_queue(prev, next_, {block_id})  with the queue {order if len(order) <= 16 else '<' + str(len(order)) + ' blocks>'}"
            f" (sentinel {size})")
    given_prev, given_next = CountingList(prev), CountingList(nxt)
    queued = block_id in queue
    if not queued:
        expect_raises(remove, (given_prev, given_next, block_id), call, ValueError,
                      f"block {block_id} is not in the queue: raise ValueError")
        if given_prev.values != prev or given_next.values != nxt:
            raise fail(call + "  -> the arrays afterwards", "unchanged", "changed",
                       "a removal that fails must change nothing")
        return
    queue.remove(block_id)
    want_prev, want_next = _queue_arrays(queue)
    got = call_learner(remove, (given_prev, given_next, block_id), call, None)
    if got is not None:
        raise fail(call, None, got, "change prev and next_ in place and return None")
    reads = given_prev.reads + given_next.reads
    if reads > 8:
        raise fail(call + "  -> entries of prev and next_ read", "a few (the block and its neighbours)",
                   f"it read {reads} entries, for a queue of {len(order)} blocks",
                   "your removal walks the queue: O(1) removal reads only the block's own two links and "
                   "writes its neighbours' links, whatever the queue's length")
    got_prev, got_next = given_prev.values, given_next.values
    if got_prev[block_id] != NOT_QUEUED or got_next[block_id] != NOT_QUEUED:
        raise fail(call + f"  -> prev[{block_id}], next_[{block_id}]", (NOT_QUEUED, NOT_QUEUED),
                   (got_prev[block_id], got_next[block_id]),
                   "the removed block must be marked as not queued (NOT_QUEUED in both arrays), so a later "
                   "removal of it is refused")
    p, n = prev[block_id], nxt[block_id]
    for name, want, got_arr in (("next_", want_next, got_next), ("prev", want_prev, got_prev)):
        if got_arr != want:
            bad = [i for i in range(len(want)) if got_arr[i] != want[i]]
            raise fail(call + f"  -> {name} afterwards, at {bad}", [want[i] for i in bad], [got_arr[i] for i in bad],
                       f"block {block_id} sat between {p} and {n} ({size} is the sentinel: head and tail); "
                       "link them to each other in both directions, and change nothing else")


def check_remove_from_free_queue(remove_from_free_queue: Callable[[List[int], List[int], int], None]) -> None:
    """Task 06.5: ``remove_from_free_queue(prev, next_, block_id)`` unlinks a block in O(1)."""
    rng = random.Random(9)
    size = 8
    queue = FreeBlockQueue(size, [3, 0, 5, 1, 7])
    for block_id in (5, 3, 7, 2, 5, 0, 1):  # middle, head, tail, never queued, removed twice, the last two
        _check_one_removal(remove_from_free_queue, queue, block_id, size)
    for size in (12, 40, 400):
        ids = list(range(size))
        rng.shuffle(ids)
        queue = FreeBlockQueue(size, ids[: size - 2])
        for _ in range(12):
            _check_one_removal(remove_from_free_queue, queue, rng.randrange(size), size)
    passed("06.5")
