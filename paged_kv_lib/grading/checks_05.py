"""Checks of exercise 05, growing on demand: blocks for a growth step, your allocator's
``append_tokens``, and a chunked prefill followed by decoding through the paged cache.

Every expected value is computed here from the library (a fresh ``PagedKVCacheAllocator``,
``generate_no_cache``, ``engine_for``), never stored, except a few tiny cases small enough
to verify by hand. Hints name the mistake a wrong answer most likely made.
"""

from __future__ import annotations

import random
from typing import Any, Callable, List

import torch

from ..allocator import PagedKVCacheAllocator
from ..cache_ops import gather_tokens
from ..model import ModelConfig, TinyTransformer
from ._allocator_steps import NAME, allocator_steps
from ._common import call_learner, expect_equal, fail, is_int, passed, show


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- 05.1
def _blocks_added_by_library(num_tokens: int, num_new: int, block_size: int) -> int:
    alloc = PagedKVCacheAllocator(num_tokens + num_new + 4, block_size, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, num_tokens)
    return len(alloc.append_tokens(0, num_new))


_GROWTH_RULES = [  # (a wrong rule learners write, the mistake it makes)
    (lambda n, held, k, bs: sum((n + i + 1) % bs == 0 for i in range(k)),
     "off by one at a block boundary: the seed's (length + 1) % block_size == 0 fires one token early "
     "and never after a prompt that fills its blocks; a block is needed when a new token's position "
     "is a multiple of block_size"),
    (lambda n, held, k, bs: _ceil(n + k, bs) - held,
     "the answer went negative: blocks held ahead of time already count, so nothing is added then"),
    (lambda n, held, k, bs: max(0, (n + k) // bs - held),
     "floor instead of ceiling: a partly filled block is still a block"),
    (lambda n, held, k, bs: max(0, (n + k) // bs + 1 - held),
     "(tokens // block_size) + 1 blocks is one too many when the tokens fill their blocks exactly"),
    (lambda n, held, k, bs: _ceil(k, bs),
     "counted only the new tokens' own blocks: they continue where the sequence ends"),
    (lambda n, held, k, bs: max(0, _ceil(n + k, bs) - _ceil(n, bs)),
     "num_blocks_held counts blocks reserved ahead too: use it instead of recomputing it"),
]
_PROBES = [(n, _ceil(n, bs) + extra, k, bs) for bs in (1, 3, 4) for n in (0, 2, bs, 2 * bs + 1)
           for k in (0, 1, bs, bs + 2) for extra in (0, 1)]


def _growth_mistake(blocks_to_add: Callable[[int, int, int, int], int]) -> str:
    """Name the wrong rule that gives the learner's answers on a set of probes (if one does)."""
    answers = [call_learner(blocks_to_add, case, f"blocks_to_add{case}", "an int") for case in _PROBES]
    for rule, why in _GROWTH_RULES:
        if all(rule(*case) == got for case, got in zip(_PROBES, answers)):
            return why
    return ("the new tokens occupy positions num_tokens .. num_tokens + num_new_tokens - 1; count the "
            "blocks those positions need beyond the ones held")


def check_blocks_to_add(blocks_to_add: Callable[[int, int, int, int], int]) -> None:
    """Task 05.1: ``blocks_to_add(num_tokens, num_blocks_held, num_new_tokens, block_size)``."""
    cases = [  # (num_tokens, held, new, block_size), the first few verified by hand
        (8, 2, 1, 4),   # a prompt that fills its blocks: the first new token needs a block (1)
        (6, 2, 1, 4),   # room left in the last block (0)
        (7, 2, 1, 4),   # the last slot of block 1: still no new block, the seed's rule says 1 (0)
        (0, 0, 1, 16),  # an empty sequence has no block at all (1)
        (5, 2, 9, 4),   # 14 tokens need 4 blocks, 2 are held (2)
        (5, 4, 3, 4),   # blocks reserved ahead: nothing to add (0)
    ]
    rng = random.Random(5)
    for bs in (1, 2, 3, 4, 16):
        lengths = sorted({0, 1, bs - 1, bs, bs + 1, 2 * bs, 3 * bs - 1} | {rng.randrange(0, 4 * bs + 2) for _ in range(4)})
        for n in lengths:
            for k in sorted({0, 1, 2, bs - 1, bs, bs + 1, 2 * bs + 3}):
                cases += [(n, _ceil(n, bs) + extra, k, bs) for extra in (0, 1, 2)]
    for n, held, k, bs in cases:
        want = max(0, _blocks_added_by_library(n, k, bs) - (held - _ceil(n, bs)))
        call = f"blocks_to_add(num_tokens={n}, num_blocks_held={held}, num_new_tokens={k}, block_size={bs})"
        got = call_learner(blocks_to_add, (n, held, k, bs), call, want)
        if not is_int(got):
            raise fail(call, want, got, "return an int (a number of blocks), not a bool or a float")
        if got != want:
            raise fail(call, want, got, _growth_mistake(blocks_to_add))
    passed("05.1")


# --------------------------------------------------------------------------- 05.2
_PROMPT_HINT = ("a prompt of n tokens takes ceil(n / block_size) blocks from the head of the free queue; "
                "n // block_size + 1 is one too many when n is a multiple of block_size")
_BOUNDARY_HINT = ("a new block is needed exactly when a new token's position (the length before it) is a "
                  "multiple of block_size; the seed's (length + 1) % block_size == 0 is off by one")


def _growth_scenarios(cls: Any) -> None:
    # A prompt that fills its blocks, then decode steps across two block boundaries.
    run = allocator_steps(cls, 10, 4)
    run.step("allocate_for_sequence", 0, 8, hint=_PROMPT_HINT)
    run.step("append_tokens", 0, 1, hint=_BOUNDARY_HINT)
    for _ in range(4):
        run.step("append_tokens", 0, 1, hint=_BOUNDARY_HINT)
    run.step("allocate_for_sequence", 1, 6, hint=_PROMPT_HINT)
    for _ in range(3):
        run.step("append_tokens", 1, 1, hint=_BOUNDARY_HINT)
    run.step("append_tokens", 1)  # num_tokens defaults to 1
    # Chunks of several tokens at once (a chunked prefill), starting from an empty sequence.
    run = allocator_steps(cls, 8, 4)
    run.step("allocate_for_sequence", 0, 0, hint="an empty prompt needs no block at all")
    run.step("append_tokens", 0, 0, hint="growing by 0 tokens takes nothing and returns []")
    for chunk in (5, 7, 4, 1, 3):
        run.step("append_tokens", 0, chunk, hint="a chunk of k tokens needs every block its positions start")
    # Errors change nothing.
    run = allocator_steps(cls, 5, 3)
    run.step("allocate_for_sequence", 0, 7)
    run.step("append_tokens", 9, 1)
    run.step("allocate_for_sequence", 0, 2)
    run.step("allocate_for_sequence", 1, 7)
    run.step("append_tokens", 0, 9)
    run.step("append_tokens", 0, 5)
    run.step("get_block_mapping", 4)
    run.step("free_sequence", 4, hint="freeing an unknown id does nothing")
    run.step("append_tokens", 0, 2)
    run.step("append_tokens", 0, 1, hint="the pool is empty now: a block that is needed cannot be found")
    # Free order: the last block first, so a sequence's tail is reused before its head.
    run = allocator_steps(cls, 5, 4)
    run.step("allocate_for_sequence", 0, 10)
    run.step("allocate_for_sequence", 1, 4)
    run.step("free_sequence", 0)
    run.step("append_tokens", 1, 1, hint="freed blocks join the tail of the free queue, last logical block "
             "first; freeing head first would hand out a sequence's first block first")
    run.step("allocate_for_sequence", 2, 7, hint="freed blocks join the tail of the free queue, last logical "
             "block first (head-first order evicts the start of a prefix first)")


def _random_scenarios(cls: Any, seeds: List[int], *, forks: bool) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        bs = rng.choice([1, 2, 3, 5])
        run = allocator_steps(cls, rng.randrange(6, 13), bs)
        next_id = 0
        for _ in range(30):
            live = list(run.ref.seq_ids)
            roll = rng.random()
            if not live or roll < 0.25:
                run.step("allocate_for_sequence", next_id, rng.randrange(0, 3 * bs + 2))
                next_id += 1
            elif forks and roll < 0.4:
                run.step("fork", rng.choice(live), next_id)
                next_id += 1
            elif roll < 0.8:
                k = 1 if rng.random() < 0.6 else rng.randrange(0, 2 * bs + 2)
                run.step("append_tokens", rng.choice(live), k)
            elif roll < 0.95:
                run.step("free_sequence", rng.choice(live))
            else:
                run.step("append_tokens", next_id + 7, 1)


def check_growing_allocator(cls: Any) -> None:
    """Task 05.2: ``MyAllocator.append_tokens`` grows sequences like the library's allocator.

    ``cls`` is the learner's class; it is built with ``cls(num_blocks, block_size)`` and
    driven beside a ``PagedKVCacheAllocator`` (prefix caching off) through decode steps,
    chunks, errors and frees; mappings, free counts and returned block ids must agree.
    """
    _growth_scenarios(cls)
    _random_scenarios(cls, [1, 2, 3, 4], forks=False)
    passed("05.2")


def serve_through_engine(cls: Any, task: str, *, n: int) -> None:
    """Generate with ``engine_for``, the course's tiny model and the learner's class at block sizes
    1, 3 and 16 (a small pool each, so sequences are preempted); tokens must equal the no-cache
    reference."""
    from ..conformance import engine_for
    from ..model import encode, generate_no_cache, load_tiny_model

    model = load_tiny_model()
    prompts = [encode(text) for text in ("When a block is full", "Copy on write", "The free queue hands out")]
    max_new = 6
    temperature = 0.0 if n == 1 else 0.9
    with torch.no_grad():
        want = [[generate_no_cache(model, p, max_new, temperature=temperature, seed=4, sample_index=i)
                 for i in range(n)] for p in prompts]
        for bs, blocks in ((1, 31 * n + 4), (3, 11 * n + 2), (16, 3 if n == 1 else 6)):
            call = (f"engine_for(model, {NAME}, num_blocks={blocks}, block_size={bs})"
                    f".generate(<3 prompts of 21, 14, 25 tokens>, {max_new}, n={n}"
                    + (f", temperature={temperature}, seed=4)" if n > 1 else ")"))
            mine = call_learner(cls, (blocks, bs), f"{NAME}({blocks}, {bs})", "an allocator object")
            engine = call_learner(engine_for, (model, mine), call, "an engine",
                                  num_blocks=blocks, block_size=bs, watermark=0.0)
            outputs = call_learner(engine.generate, (prompts, max_new), call, want,
                                   n=n, temperature=temperature, seed=4)
            got = [[list(s) for s in out.outputs] for out in outputs]
            if got != want:
                raise fail(call, want, got, "the bookkeeping looked right call by call, but the tokens differ: "
                           "a sequence reads K/V it does not own (a block shared without copy-on-write, "
                           "or handed out twice)")
            left = call_learner(lambda: mine.num_free_blocks, (), call + " then num_free_blocks", blocks)
            expect_equal(call + " then num_free_blocks", blocks, left,
                         "every request finished and freed its sequences: every block must be free again")
    passed(task)


def check_serves_tiny_model(cls: Any) -> None:
    """Task 05.2 (second check): the learner's class does the bookkeeping of the real engine."""
    serve_through_engine(cls, "05.2", n=1)


# --------------------------------------------------------------------------- 05.3
class RecordingAllocator(PagedKVCacheAllocator):
    """A ``PagedKVCacheAllocator`` with a log, ``events``, that :class:`RecordingModel` writes to.

    The log lives in the allocator because the allocator is the argument whose state comes back
    to the check after the learner's call (in the notebook and when judged outside it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: List[List[int]] = []


class RecordingModel(TinyTransformer):
    """The tiny transformer, logging the chunk lengths of every ``forward_paged`` call in the allocator."""

    def forward_paged(self, allocator, seq_ids, chunks, *, write=None):
        events = getattr(allocator, "events", None)
        if isinstance(events, list):
            events.append([len(c) for c in chunks])
        return super().forward_paged(allocator, seq_ids, chunks, write=write)


def _recording_allocator(model: TinyTransformer, num_blocks: int, block_size: int) -> RecordingAllocator:
    cfg = model.config
    return RecordingAllocator(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device,
                              num_layers=cfg.num_layers, enable_prefix_caching=False)


def check_chunked_generate(paged_generate: Callable[..., List[int]]) -> None:
    """Task 05.3: ``paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size)``."""
    from ..model import generate_no_cache

    model = RecordingModel(ModelConfig(), seed=11).eval()
    cases = [  # (block_size, prompt length, new tokens, chunk size)
        (4, 8, 6, 3),
        (4, 6, 7, 4),
        (8, 5, 1, 8),
        (8, 16, 5, 5),
        (2, 1, 5, 2),
        (3, 10, 4, 1),
    ]
    gen = torch.Generator().manual_seed(5)
    for case, (bs, prompt_len, max_new, chunk) in enumerate(cases):
        prompt = torch.randint(1, 256, (prompt_len,), generator=gen).tolist()
        with torch.no_grad():
            want = generate_no_cache(model, prompt, max_new)
        alloc = _recording_allocator(model, 32, bs)
        seq_id = 7 + case
        given = list(prompt)
        call = (f"paged_generate(model, allocator(block_size={bs}), seq_id={seq_id}, "
                f"prompt_ids=<{prompt_len} tokens>, max_new_tokens={max_new}, chunk_size={chunk})")
        with torch.no_grad():
            got = call_learner(paged_generate, (model, alloc, seq_id, given, max_new, chunk), call, want)
        if given != prompt:
            raise fail(call + " then prompt_ids", prompt, given, "inputs modified: read prompt_ids, do not change it")
        if type(got) is not list or not all(is_int(t) for t in got):
            raise fail(call, want, got, "return a list of ints (the new token ids)")
        prefill = alloc.events[: _ceil(prompt_len, chunk)]
        want_chunks = [[min(chunk, prompt_len - start)] for start in range(0, prompt_len, chunk)]
        if prefill != want_chunks:
            raise fail(call + "  -> the chunk lengths of your forward_paged calls, prefill first",
                       want_chunks, alloc.events,
                       "the prefill goes chunk by chunk: chunk_size prompt tokens per forward_paged call "
                       "(the last chunk may be shorter), in order")
        expect_equal(call, want, got,
                     "the new tokens must equal generate_no_cache's; each forward_paged call must see its tokens "
                     "counted by the allocator as the sequence's newest ones, and only those")
        if seq_id not in alloc.seq_ids:
            raise fail(call + " then allocator.seq_ids", f"a tuple containing {seq_id}", alloc.seq_ids,
                       "leave the sequence allocated when you return (the check reads its K/V)")
        held = alloc.get_num_tokens(seq_id)
        expect_equal(call + f" then allocator.get_num_tokens({seq_id})", prompt_len + max_new - 1, held,
                     "the cache holds the prompt and every new token except the last, which is returned "
                     "but never fed back to the model")
        mapping = alloc.get_block_mapping(seq_id)
        expect_equal(call + f" then len(allocator.get_block_mapping({seq_id}))", _ceil(held, bs), len(mapping),
                     "a sequence holds exactly ceil(tokens / block_size) blocks")
        # Layer 0's keys depend only on each token and its position: recompute them in one prefill.
        # (Read through the table and the cache tensor only: what survives a judged call intact.)
        ref = model.new_allocator(32, bs)
        tokens = list(prompt) + want[:-1]
        ref.allocate_for_sequence(0, len(tokens))
        with torch.no_grad():
            model.forward_paged(ref, [0], [tokens])
        k_got = gather_tokens(alloc.k_caches[0], torch.tensor(mapping, dtype=torch.int64), held)
        k_want, _ = ref.read_kv(0, layer=0)
        close = torch.isclose(k_got, k_want, atol=1e-4, rtol=1e-4).flatten(1).all(dim=1)
        if not bool(close.all()):
            bad = [int(p) for p in torch.nonzero(~close).flatten()]
            raise fail(call + " then allocator.read_kv(seq_id, layer=0)",
                       "the keys of every stored token", f"wrong keys at positions {bad}: {show(k_got[bad, 0, :4])}",
                       "a token's K/V is written to the slot of the position forward_paged believes it has: "
                       "count tokens with append_tokens before the call that feeds them, never after")
    passed("05.3")
