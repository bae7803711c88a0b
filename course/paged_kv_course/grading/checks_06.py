"""Checks of exercise 06, sharing: your allocator's copy-on-write, a block key with an exact
format, prefix caching inside your allocator (and through the real engine), an eviction order
for cached free blocks (a design task graded by a measured threshold), and O(1) removal from
the free queue.

Expected values come from the library (``PagedKVCacheAllocator``, ``block_key``,
``FreeBlockQueue``, the engine) run on the same inputs. A wrong answer's hint names the known
mistake that answers exactly as the learner's code did, without the recipe.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch


try:  # The mistake replays build on the starters of exercises 05 and 06; a release handing out exercise 05
    # or 06 leaves them out (they hold the answers): the checks then still compare with the library, call by
    # call, but cannot name which known mistake a difference is.
    from paged_kv_course.starters.after_05 import AllocatorAfter05
    from paged_kv_course.starters.after_06 import AllocatorAfter06
    REPLAYS = True
except ImportError:
    AllocatorAfter05 = AllocatorAfter06 = object  # type: ignore[misc,assignment]
    REPLAYS = False
from ._checks_06_eviction import check_eviction_order, eviction_trace, library_order, lru_order, simulate_eviction  # noqa: F401,E501  (task 06.4)
from ._checks_06_key import check_salted_block_key  # noqa: F401  (task 06.2, a check of its own module)
from ._checks_06_queue import check_take_from_free_queue  # noqa: F401  (task 06.5)
from ._common import call_learner, fail, passed
from ._steps import NAME, Mistake, Steps
from .checks_05 import random_scenarios, serve_through_engine

# The learner's figures beside the library's are printed on success too, before the PASSED line.
SHOW_FIGURES = True


# --------------------------------------------------------------------------- 06.1
class _WrongCopy(AllocatorAfter05):
    """Exercise 05's allocator with copy-on-write written with one known mistake (``mistake``)."""

    mistake = ""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        missing = self._new_blocks_for(seq_id, num_tokens)
        table, length, bs = self.tables[seq_id], self.lengths[seq_id], self.block_size
        shared = bool(table) and self.ref_counts[table[-1]] > 1
        partial = length % bs != 0
        if self.mistake == "copy_full":
            copy = num_tokens > 0 and shared
        elif self.mistake == "copy_always":
            copy = num_tokens > 0 and bool(table) and partial
        else:
            copy = num_tokens > 0 and shared and partial
        if missing + (copy and self.mistake != "not_atomic") > len(self.free):
            raise RuntimeError("out of blocks")
        if copy and self.mistake == "copy_after":
            grown = super().append_tokens(seq_id, num_tokens)
            if not self.free:
                raise RuntimeError("out of blocks")
            (fresh,) = self.take_blocks(1)
            self.ref_counts[table[len(table) - len(grown) - 1]] -= 1
            table[len(table) - len(grown) - 1] = fresh
            return grown + [fresh]
        fresh_ids: List[int] = []
        if copy:
            if not self.free:
                raise RuntimeError("out of blocks")
            if self.mistake == "copy_from_tail":
                fresh_ids = [self.free.pop()]
                self.ref_counts[fresh_ids[0]] = 1
            else:
                fresh_ids = self.take_blocks(1)
            if self.mistake != "keeps_reference":
                self.ref_counts[table[-1]] -= 1
            table[-1] = fresh_ids[0]
        grown = super().append_tokens(seq_id, num_tokens)
        return grown + fresh_ids if self.mistake == "returned_last" else fresh_ids + grown

    def free_sequence(self, seq_id: int) -> None:
        if self.mistake == "free_forward":
            _free_first_block_first(self, seq_id)
        else:
            super().free_sequence(seq_id)


def _free_first_block_first(alloc: Any, seq_id: int) -> None:
    """free_sequence written in the table's order (first logical block first), otherwise right."""
    for block_id in alloc.tables.pop(seq_id, []):
        alloc.ref_counts[block_id] -= 1
        if alloc.ref_counts[block_id] == 0:
            alloc.free.append(block_id)
    alloc.lengths.pop(seq_id, None)


_FREED_ORDER = ("freed blocks joined the free queue in another order: a sequence's blocks go back last logical "
                "block first, so the block that held its last tokens is handed out again before its first")
def _wrong_copy(mistake: str) -> Callable[[int, int], Any]:
    return type(f"_{mistake}", (_WrongCopy,), {"mistake": mistake})


COPY_MISTAKES: List[Mistake] = [
    (_wrong_copy("returned_last"), "the right blocks, in the wrong order: the copy is the first block this call "
     "took, so it comes first among the ids returned"),
    (_wrong_copy("copy_after"), "the copy and the new blocks were taken in the other order: the copy replaces the "
     "block the next token lands in, so it is taken before any new block"),
    (AllocatorAfter05, "no copy-on-write: the new token lands in a block that other sequences hold and that is not "
     "full, so they would read it as theirs"),
    (_wrong_copy("copy_full"), "a full shared block was copied: the next token starts a new block, so nobody "
     "writes into a full one"),
    (_wrong_copy("copy_always"), "a block with one holder was copied: only a block that others hold too needs a "
     "private copy"),
    (_wrong_copy("keeps_reference"), "after a copy this sequence still counts as a holder of the block it replaced, "
     "so that block never returns to the free queue"),
    (_wrong_copy("not_atomic"), "the copy counts too: with too few free blocks for the copy and the new blocks "
     "together, append_tokens must fail before it changes anything"),
    (_wrong_copy("copy_from_tail"), "the copy came from the tail of the free queue: a private copy is a block "
     "handed out like any other"),
    (_wrong_copy("free_forward"), _FREED_ORDER),
]
if not REPLAYS:
    COPY_MISTAKES = []


def _sharing_scenarios(cls: Any) -> None:
    def run(num_blocks: int, block_size: int) -> Steps:
        return Steps(cls, num_blocks, block_size, mistakes=COPY_MISTAKES)

    # One copy, then the parent leaves: the block the child gave up goes back to the pool.
    r = run(6, 4)
    r.step("allocate_for_sequence", 0, 5)
    r.step("fork", 0, 1)
    r.step("append_tokens", 1, 1)
    r.step("free_sequence", 0)
    r.step("free_sequence", 1)
    # A chunk whose copy fits but whose new blocks do not: nothing changes.
    r = run(4, 2)
    r.step("allocate_for_sequence", 0, 3)
    r.step("fork", 0, 1)
    r.step("append_tokens", 1, 5, hint="the copy and the new blocks do not fit together: RuntimeError, nothing changed")
    r.step("append_tokens", 1, 3)
    # Fork first: the child's blocks stay allocated while it holds them.
    r = run(6, 2)
    r.step("allocate_for_sequence", 0, 5)
    r.step("fork", 0, 1, hint="the child gets the parent's mapping: the same blocks, nothing new taken")
    r.step("free_sequence", 0)
    r.step("allocate_for_sequence", 2, 3)
    r.step("free_sequence", 1)
    # Three samples of a prompt that ends mid-block: two copies, then the last holder writes in place.
    r = run(12, 4)
    r.step("allocate_for_sequence", 0, 6)
    r.step("fork", 0, 1)
    r.step("fork", 0, 2)
    r.step("append_tokens", 1, 1)
    r.step("append_tokens", 2, 1)
    r.step("append_tokens", 0, 1)
    r.step("append_tokens", 1, 2)
    r.step("free_sequence", 1)
    r.step("free_sequence", 2)
    r.step("free_sequence", 0)
    # A shared block that is full: the next token starts a new block, no copy.
    r = run(8, 4)
    r.step("allocate_for_sequence", 0, 8)
    r.step("fork", 0, 1)
    r.step("append_tokens", 1, 1)
    r.step("free_sequence", 0)
    r.step("free_sequence", 1)
    # A chunk into a shared partial block: the copy, then the new blocks.
    r = run(10, 3)
    r.step("allocate_for_sequence", 0, 4)
    r.step("fork", 0, 1)
    r.step("append_tokens", 1, 6)
    r.step("fork", 1, 2)
    r.step("free_sequence", 1)
    r.step("append_tokens", 2, 1)
    r.step("append_tokens", 0, 1)
    # Empty sequences, errors, and a copy that does not fit.
    r = run(3, 4)
    r.step("allocate_for_sequence", 0, 0)
    r.step("fork", 0, 1)
    r.step("append_tokens", 1, 1, hint="a sequence with no block takes a new one: there is nothing to copy")
    r.step("fork", 7, 3, hint="forking an unknown parent raises ValueError")
    r.step("fork", 0, 1, hint="forking into an id that exists raises ValueError")
    r.step("allocate_for_sequence", 2, 7)
    r.step("fork", 1, 3)
    r.step("append_tokens", 3, 1, hint="the copy needs a free block and there is none: RuntimeError, nothing changed")
    r.step("free_sequence", 1)
    r.step("append_tokens", 3, 1)


def check_sharing_allocator(cls: Any) -> None:
    """Task 06.1: ``MyAllocator`` copies a shared block on write (and forks) like the library's allocator."""
    _sharing_scenarios(cls)
    random_scenarios(cls, [11, 12, 13, 14, 15], forks=True, mistakes=COPY_MISTAKES)
    passed("06.1")


def check_allocator_conforms(cls: Any) -> None:
    """Task 06.1 (second check): the library's differential test, ``conformance.check_allocator``."""
    from ..conformance.differential import PARTS, check_allocator

    try:
        check_allocator(cls, max_examples=200, ops=PARTS["06"], name=NAME)  # 50 missed a class without copy-on-write
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


# --------------------------------------------------------------------------- 06.3
class _WrongCache(AllocatorAfter06):
    """The course's exercise-06 allocator with one known prefix-caching mistake switched on."""

    mistake = ""

    def _key(self, parent: Optional[bytes], token_ids: Sequence[int]) -> bytes:
        return super()._key(None if self.mistake == "unchained" else parent, token_ids)

    def _lookup(self, keys: List[bytes]) -> List[int]:
        if self.mistake == "no_cache":
            return []
        return super()._lookup(keys)

    def take_blocks(self, count: int) -> List[int]:
        if self.mistake == "stale":
            return AllocatorAfter05.take_blocks(self, count)
        return super().take_blocks(count)

    def free_sequence(self, seq_id: int) -> None:
        if self.mistake == "free_forward":
            _free_first_block_first(self, seq_id)
            return
        if self.mistake == "forget_on_free":
            for block_id in self.tables.get(seq_id, []):
                if self.ref_counts[block_id] == 1 and block_id in self.key_of:
                    del self.cached[self.key_of.pop(block_id)]
        super().free_sequence(seq_id)

    def allocate_for_sequence(  # type: ignore[override]
        self, seq_id: int, num_prompt_tokens: int, token_ids: Optional[Sequence[int]] = None
    ) -> int:
        if self.mistake in ("partial_cached", "new_before_hits") and token_ids is not None:
            return self._allocate_wrongly(seq_id, num_prompt_tokens, list(token_ids))
        if self.mistake == "hit_in_queue" and token_ids is not None:
            saved = self.free
            self.free = _NoRemove(saved)  # type: ignore[assignment]
            try:
                return self._counted(super().allocate_for_sequence(seq_id, num_prompt_tokens, token_ids))
            finally:
                self.free = saved
        return self._counted(super().allocate_for_sequence(seq_id, num_prompt_tokens, token_ids))

    def _allocate_wrongly(self, seq_id: int, count: int, tokens: List[int]) -> int:
        """The course's allocate_for_sequence with the partial last block keyed too, or the new blocks taken
        before the hits leave the free queue."""
        if len(tokens) != count or seq_id in self.tables:
            raise ValueError("bad prompt or a live sequence")
        bs = self.block_size
        keys: List[bytes] = []
        last = count if self.mistake == "partial_cached" else count - bs + 1
        for start in range(0, max(last, 0), bs):
            keys.append(self._key(keys[-1] if keys else None, tokens[start:start + bs]))
        hits = self._lookup(keys)
        idle = [b for b in hits if self.ref_counts[b] == 0]
        new = -(-count // bs) - len(hits)
        if new + len(idle) > len(self.free):
            raise RuntimeError("out of blocks")
        if self.mistake == "new_before_hits":
            table = hits + self.take_blocks(new)
            for block_id in idle:
                if block_id in self.free:
                    self.free.remove(block_id)
        else:
            for block_id in idle:
                self.free.remove(block_id)
            table = hits + self.take_blocks(new)
        for block_id in hits:
            self.ref_counts[block_id] += 1
        for key, block_id in zip(keys[len(hits):], table[len(hits):]):
            if key not in self.cached and block_id not in self.key_of:
                self.cached[key], self.key_of[block_id] = block_id, key
        self.tables[seq_id], self.lengths[seq_id] = table, count
        return len(hits) * bs

    def _counted(self, cached_tokens: int) -> int:
        return cached_tokens // self.block_size if self.mistake == "blocks_not_tokens" else cached_tokens


class _NoRemove:
    """A free queue whose ``remove`` does nothing (a hit left in the queue); everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def remove(self, block_id: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def __bool__(self) -> bool:
        return bool(self.inner)


def _wrong_cache(mistake: str) -> Callable[[int, int], Any]:
    return type(f"_{mistake}", (_WrongCache,), {"mistake": mistake})


CACHE_MISTAKES: List[Mistake] = [
    (_wrong_cache("blocks_not_tokens"), "allocate_for_sequence returns how many prompt *tokens* it found cached "
     "(whole blocks of them), not how many blocks"),
    (_wrong_cache("forget_on_free"), "a freed block's content was forgotten: a free block keeps its key, and stays "
     "findable until the free queue hands it out again"),
    (_wrong_cache("no_cache"), "nothing was found cached: a prompt whose leading full blocks hold content already "
     "in the pool reuses those blocks"),
    (_wrong_cache("unchained"), "a block was reused after a different prefix: a block's K/V depends on every token "
     "before it, so its key must depend on its parent's key too"),
    (_wrong_cache("stale"), "a block that was handed out again (new content) was still found by its old key: "
     "taking a block from the free queue forgets what it held"),
    (_wrong_cache("partial_cached"), "a prompt reused a block that was not full when it was cached: only full "
     "blocks are cached, since a partial block's content changes as its sequence grows"),
    (_wrong_cache("new_before_hits"), "this prompt took its new blocks before taking its hits out of the free "
     "queue, so a block it reuses was also handed out to it as a new one"),
    (_wrong_cache("free_forward"), _FREED_ORDER),
    (_wrong_cache("hit_in_queue"), "a cache hit on a free block left it in the free queue, so it can be handed out "
     "while a sequence holds it: a hit takes it out of the queue"),
]
if not REPLAYS:
    CACHE_MISTAKES = []


def _prefix_scenarios(cls: Any) -> None:
    def run(num_blocks: int, block_size: int) -> Steps:
        return Steps(cls, num_blocks, block_size, prefix_caching=True, mistakes=CACHE_MISTAKES)

    system = [5, 6, 7, 8, 9, 10, 11, 12]  # two blocks of 4
    r = run(12, 4)
    r.step("allocate_for_sequence", 0, 11, token_ids=system + [1, 2, 3])
    r.step("allocate_for_sequence", 1, 10, token_ids=system + [4, 4],
           hint="a prompt that starts with cached full blocks reuses them")
    r.step("allocate_for_sequence", 2, 8, token_ids=[6, 7, 8, 9, 5, 6, 7, 8],
           hint="the same tokens at another place follow another prefix: no reuse")
    r.step("free_sequence", 0)
    r.step("allocate_for_sequence", 3, 12, token_ids=system + [1, 2, 3, 0],
           hint="a freed block keeps its content: a later prompt finds it")
    r.step("free_sequence", 1)
    r.step("free_sequence", 3)
    r.step("allocate_for_sequence", 4, 16, token_ids=[1] * 16)
    r.step("allocate_for_sequence", 5, 8, token_ids=system)
    # Reuse after the free queue handed a cached block to someone else.
    r = run(4, 2)
    r.step("allocate_for_sequence", 0, 4, token_ids=[1, 2, 3, 4])
    r.step("free_sequence", 0)
    r.step("allocate_for_sequence", 1, 2, token_ids=[9, 9])
    r.step("allocate_for_sequence", 2, 4, token_ids=[1, 2, 3, 4],
           hint="a block the free queue handed out again holds new content")
    r.step("allocate_for_sequence", 3, 2, token_ids=[1, 2])
    r.step("free_sequence", 2)
    r.step("free_sequence", 1)
    r.step("allocate_for_sequence", 4, 6, token_ids=[1, 2, 3, 4, 9, 9])
    # A miss in the middle stops the reuse; a prompt with no full block caches nothing.
    r = run(10, 2)
    r.step("allocate_for_sequence", 0, 6, token_ids=[1, 1, 2, 2, 3, 3])
    r.step("allocate_for_sequence", 1, 6, token_ids=[1, 1, 7, 7, 3, 3])
    r.step("free_sequence", 0)
    r.step("allocate_for_sequence", 2, 6, token_ids=[1, 1, 7, 7, 3, 3])
    r.step("allocate_for_sequence", 3, 1, token_ids=[1])
    r.step("allocate_for_sequence", 4, 0, token_ids=[])
    r.step("allocate_for_sequence", 5, 3, hint="without token_ids nothing is looked up or cached: it returns 0")
    # Errors change nothing, and a cache hit on a free block counts against the pool.
    r = run(4, 2)
    r.step("allocate_for_sequence", 0, 4, token_ids=[1, 2, 3, 4])
    r.step("free_sequence", 0)
    r.step("allocate_for_sequence", 1, 2, token_ids=[8, 8])
    r.step("allocate_for_sequence", 2, 8, token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
           hint="two cached free blocks and two new ones need four free blocks: too few is a RuntimeError")
    r.step("allocate_for_sequence", 1, 2, token_ids=[8, 8])
    r.step("allocate_for_sequence", 3, 3, token_ids=[1, 2],
           hint="token_ids must hold exactly num_prompt_tokens ids: ValueError")
    r.step("allocate_for_sequence", 3, 6, token_ids=[1, 2, 3, 4, 5, 6])
    r.step("fork", 3, 4)
    r.step("append_tokens", 4, 1)
    r.step("free_sequence", 3)
    r.step("free_sequence", 4)
    r.step("allocate_for_sequence", 5, 5, token_ids=[1, 2, 3, 4, 5])


def _random_prefix_scenarios(cls: Any, seeds: List[int]) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        bs = rng.choice([1, 2, 3])
        run = Steps(cls, rng.randrange(5, 12), bs, prefix_caching=True, mistakes=CACHE_MISTAKES)
        next_id = 0
        for _ in range(30):
            live = list(run.ref.seq_ids)
            roll = rng.random()
            if not live or roll < 0.4:
                n = rng.randrange(0, 3 * bs + 2)
                run.step("allocate_for_sequence", next_id, n, token_ids=[rng.choice([1, 2]) for _ in range(n)])
                next_id += 1
            elif roll < 0.5:
                run.step("fork", rng.choice(live), next_id)
                next_id += 1
            elif roll < 0.7:
                run.step("append_tokens", rng.choice(live), rng.randrange(0, bs + 2))
            else:
                run.step("free_sequence", rng.choice(live))


def check_prefix_caching_allocator(cls: Any) -> None:
    """Task 06.3: ``MyAllocator.allocate_for_sequence(seq_id, n, token_ids=...)`` reuses cached blocks like the library."""
    _prefix_scenarios(cls)
    _random_prefix_scenarios(cls, [31, 32, 33, 34, 35, 36])
    passed("06.3")


def _shared_prefix_workload() -> Tuple[List[List[int]], List[List[int]]]:
    """Two waves of prompts behind one shared 72-token prefix (the second wave arrives after the first left)."""
    from paged_kv_lib.model import encode

    prefix = encode("You are a careful assistant. Answer in one short line about blocks and caches. ")
    questions = ["What is a block?", "Why copy on write?", "Who frees a block?", "When is a block full?",
                 "How big is a block?", "Is the free queue FIFO?"]
    prompts = [prefix + encode(q, bos=False) for q in questions]
    return prompts[:3], prompts[3:]


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of K and V one token occupies in the cache, across every layer."""
    cfg = model.config
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=model.dtype).element_size()


def check_serves_shared_prefix(cls: Any) -> None:
    """Task 06.3 (second check): the shared-prefix workload through ``engine_for`` with the learner's prefix cache.

    Tokens must equal the no-cache reference; the learner's hit rate and K/V saved are printed
    beside the library's, and must reach 90% of the library's.
    """
    from ..conformance import engine_for
    from paged_kv_lib.engine import Engine
    from paged_kv_lib.model import generate_no_cache, load_tiny_model

    model = load_tiny_model()
    waves = _shared_prefix_workload()
    max_new, bs, blocks = 4, 4, 40
    prompt_tokens = sum(len(p) for wave in waves for p in wave)
    call = (f"engine_for(model, {NAME}, num_blocks={blocks}, block_size={bs}, enable_prefix_caching=True)"
            f".generate(wave, {max_new}) for two waves of 3 prompts behind a shared {len(waves[0][0]) - 4}-token prefix")
    with torch.no_grad():
        want = [[generate_no_cache(model, p, max_new)] for wave in waves for p in wave]
        mine = call_learner(cls, (blocks, bs), f"{NAME}({blocks}, {bs})", "an allocator object")
        engine = call_learner(engine_for, (model, mine), call, "an engine", num_blocks=blocks, block_size=bs,
                              enable_prefix_caching=True, watermark=0.0)
        got: List[List[List[int]]] = []
        for wave in waves:
            outputs = call_learner(engine.generate, (wave, max_new), call, want)
            got += [[list(s) for s in out.outputs] for out in outputs]
        library = Engine(model, model.new_allocator(blocks, bs, enable_prefix_caching=True), watermark=0.0)
        for wave in waves:
            library.generate(wave, max_new)
    if got != want:
        raise fail(call, want, got, "the tokens differ from the no-cache reference: a prompt reused a block whose "
                   "K/V is not the K/V of its own tokens at those positions")
    per_token = kv_bytes_per_token(model)
    yours, theirs = engine.totals.cached_tokens, library.totals.cached_tokens
    figures = "\n".join(
        f"{who}: {cached:4d} of {prompt_tokens} prompt tokens found cached ({cached / prompt_tokens:6.1%}), "
        f"K/V not recomputed {cached * per_token / 1024:7.1f} KiB"
        for who, cached in (("your MyAllocator", yours), ("the library     ", theirs)))
    if yours < 0.9 * theirs:
        raise fail(f"{call}\n{figures}", f"at least {math.ceil(0.9 * theirs)} prompt tokens found cached "
                   f"(90% of the library's {theirs})", yours,
                   "the second wave's prompts start with the blocks the first wave left in the pool: "
                   "a freed block's content stays findable")
    if SHOW_FIGURES:
        print(figures)
    passed("06.3")
