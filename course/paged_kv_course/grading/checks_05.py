"""Checks of exercise 05, growing on demand: your allocator's ``append_tokens`` (a debug task on
growth code written in the seed's style), its ``can_append`` (the scheduler's question), and a
chunked prefill followed by decoding through the paged cache.

Every expected value is computed here from the library (a fresh ``PagedKVCacheAllocator``,
``generate_no_cache``, ``engine_for``), never stored. A wrong answer's hint names the known
mistake that gives exactly the learner's answers (each one a small wrong allocator replayed on
the same calls), without the recipe.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, List, Sequence

import torch

from paged_kv_lib.block import cdiv
from paged_kv_lib.kv_cache import gather_tokens
from paged_kv_course.recording import RecordingAllocator, RecordingModel

try:  # The mistake replays below build on exercise 05's starter. A release handing out exercise 05 leaves
    # the starter out (it holds the answer): the checks then still compare with the library, call by call,
    # but cannot name which known mistake a difference is.
    from paged_kv_course.starters.after_05 import AllocatorAfter05
    REPLAYS = True
except ImportError:
    AllocatorAfter05 = object  # type: ignore[misc,assignment]
    REPLAYS = False
from paged_kv_lib.model import ModelConfig, TinyTransformer
from ._common_given import GIVEN
from ._common_repair import check_repair
from ._common import call_learner, expect_equal, expect_raises, fail, is_int, passed, show
from ._steps import NAME, Mistake, Steps


# --------------------------------------------------------------------------- 05.1
class _WrongGrowth(AllocatorAfter05):
    """Exercise 05's allocator with one known growth mistake switched on (``mistake``)."""

    mistake = ""

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> List[int]:
        if self.mistake == "not_atomic":
            self._new_blocks_for(seq_id, num_tokens)  # the argument checks
            taken = []
            for _ in range(num_tokens):
                if self.lengths[seq_id] % self.block_size == 0:
                    if not self.free:
                        raise RuntimeError("out of blocks")
                    taken += self.take_blocks(1)
                    self.tables[seq_id].append(taken[-1])
                self.lengths[seq_id] += 1
            return taken
        if self.mistake == "no_length_positions":  # counts new positions that open a block, length left as it was
            self._new_blocks_for(seq_id, num_tokens)
            length = self.lengths[seq_id]
            opening = sum(1 for pos in range(length, length + num_tokens) if pos % self.block_size == 0)
            if opening > len(self.free):
                raise RuntimeError("out of blocks")
            taken = self.take_blocks(opening)
            self.tables[seq_id].extend(taken)
            return taken
        if self.mistake == "seed_rule":
            length = self.lengths.get(seq_id, 0)
            missing = sum((length + i + 1) % self.block_size == 0 for i in range(num_tokens))
            self._new_blocks_for(seq_id, num_tokens)
            if missing > len(self.free):
                raise RuntimeError("out of blocks")
            taken = self.take_blocks(missing)
            self.tables[seq_id].extend(taken)
            self.lengths[seq_id] += num_tokens
            return taken
        before = self.lengths.get(seq_id, 0)
        taken = super().append_tokens(seq_id, num_tokens)
        if self.mistake == "no_length":
            self.lengths[seq_id] = before
        elif self.mistake == "no_ref_count":
            for block_id in taken:
                self.ref_counts[block_id] = 0
        elif self.mistake == "whole_table":
            return list(self.tables[seq_id])
        return taken


def _wrong(mistake: str) -> Callable[[int, int], Any]:
    return type(f"_{mistake}", (_WrongGrowth,), {"mistake": mistake})


_NO_LENGTH = ("the sequence's length did not grow: after append_tokens(seq_id, k) the sequence holds k more "
              "tokens, and the next call starts from there")
GROWTH_MISTAKES: List[Mistake] = [
    (_wrong("whole_table"), "append_tokens returned the whole block table: it returns only the ids this call "
     "newly took (an empty list when none)"),
    (_wrong("no_length"), _NO_LENGTH),
    (_wrong("no_length_positions"), _NO_LENGTH),
    (_wrong("no_ref_count"), "a block that append_tokens took has no holder on record, so freeing the "
     "sequence did not send it back to the free queue: a block a table holds counts that table"),
    (_wrong("not_atomic"), "append_tokens raised after taking some blocks (or counting some tokens): when the "
     "free queue is short, a growth step must fail before it changes anything"),
    (_wrong("seed_rule"), "off by one at a block boundary: the new block came one token early, and never "
     "after a prompt that filled its blocks (the seed's rule); a block is needed by a token that finds no "
     "free slot in the blocks the sequence holds"),
]
if not REPLAYS:
    GROWTH_MISTAKES = []


def _growth_scenarios(cls: Any) -> None:
    def run(num_blocks: int, block_size: int) -> Steps:
        return Steps(cls, num_blocks, block_size, mistakes=GROWTH_MISTAKES)

    # A prompt that fills its blocks, then decode steps across two block boundaries.
    r = run(10, 4)
    r.step("allocate_for_sequence", 0, 8)
    for _ in range(5):
        r.step("append_tokens", 0, 1)
    r.step("allocate_for_sequence", 1, 6)
    for _ in range(3):
        r.step("append_tokens", 1, 1)
    r.step("append_tokens", 1)  # num_tokens defaults to 1
    r.step("free_sequence", 0)
    r.step("free_sequence", 1)
    # Chunks of several tokens at once (a chunked prefill), starting from an empty sequence.
    r = run(8, 4)
    r.step("allocate_for_sequence", 0, 0, hint="an empty prompt needs no block at all")
    r.step("append_tokens", 0, 0, hint="growing by 0 tokens takes nothing and returns []")
    for chunk in (5, 7, 4, 1, 3):
        r.step("append_tokens", 0, chunk)
    r.step("free_sequence", 0)
    # Errors change nothing.
    r = run(5, 3)
    r.step("allocate_for_sequence", 0, 7)
    r.step("append_tokens", 9, 1)
    r.step("allocate_for_sequence", 1, 3)
    r.step("append_tokens", 0, 9)
    r.step("append_tokens", 0, 5)
    r.step("free_sequence", 4, hint="freeing an unknown id does nothing")
    r.step("append_tokens", 0, 2)
    r.step("append_tokens", 0, 1, hint="the pool is empty now: a block that is needed cannot be found")
    r.step("free_sequence", 0)
    # Free order: the last block first, so a sequence's tail is reused before its head.
    r = run(5, 4)
    r.step("allocate_for_sequence", 0, 2)
    r.step("append_tokens", 0, 8)
    r.step("allocate_for_sequence", 1, 4)
    r.step("free_sequence", 0)
    r.step("append_tokens", 1, 1)
    r.step("allocate_for_sequence", 2, 7)


def random_scenarios(cls: Any, seeds: List[int], *, forks: bool, mistakes: List[Mistake]) -> None:
    """Random call sequences on small pools (prefix caching off), compared call by call."""
    for seed in seeds:
        rng = random.Random(seed)
        bs = rng.choice([1, 2, 3, 5])
        run = Steps(cls, rng.randrange(6, 13), bs, mistakes=mistakes)
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
    """Task 05.1: ``MyAllocator.append_tokens`` grows sequences like the library's allocator.

    ``cls`` is built with ``cls(num_blocks, block_size)`` and driven beside a
    ``PagedKVCacheAllocator`` (prefix caching off) through decode steps, chunks, errors and
    frees; mappings, free counts and returned block ids must agree.
    """
    _growth_scenarios(cls)
    random_scenarios(cls, [1, 2, 3, 4], forks=False, mistakes=GROWTH_MISTAKES)
    check_repair(GIVEN["05.1"], cls)
    passed("05.1")


def serve_through_engine(cls: Any, task: str, *, n: int, repair: bool = False) -> None:
    """Generate with ``engine_for``, the course's tiny model and the learner's class at block sizes
    1, 3 and 16 (a small pool each, so sequences are preempted); tokens must equal the no-cache
    reference."""
    from ..conformance import engine_for
    from paged_kv_lib.model import encode, generate_no_cache, load_tiny_model

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
    if repair:
        check_repair(GIVEN[task], cls)
    passed(task)


def check_serves_tiny_model(cls: Any) -> None:
    """Task 05.1 (second check): the learner's class does the bookkeeping of the real engine."""
    serve_through_engine(cls, "05.1", n=1, repair=True)


# --------------------------------------------------------------------------- 05.2
_WATERMARK_RULES = [  # (a wrong answer learners write, the mistake it makes)
    (lambda free, need, nb, wm: free - need >= math.floor(wm * nb),
     "the reserve rounds up: a watermark of w keeps ceil(w * num_blocks) blocks free, so a fraction of a "
     "block reserves a whole one"),
    (lambda free, need, nb, wm: free - need > math.ceil(wm * nb),
     "growing may use every block down to the reserve itself: exactly the reserve left free is allowed"),
    (lambda free, need, nb, wm: free - need >= math.ceil(wm * free),
     "the reserve is a fraction of all the pool's blocks (num_blocks), not of the blocks free right now"),
    (lambda free, need, nb, wm: free - need >= 0,
     "the watermark is ignored: blocks it reserves (ceil(watermark * num_blocks)) must stay free"),
]


def _quiet_answers(cls: Any, cases: Sequence[tuple]) -> List[tuple]:
    """The learner's answers on the cases after the first wrong one, as evidence for naming the mistake; a case
    the learner's class cannot answer is left out."""
    answers = []
    for bs, nb, prompts, asked, k, wm in cases:
        try:
            mine = cls(nb, bs)
            for seq_id, n in enumerate(prompts):
                mine.allocate_for_sequence(seq_id, n)
            got = mine.can_append(list(asked), k, watermark=wm)
        except Exception:  # noqa: BLE001 - only evidence: a case that fails says nothing about the rule
            continue
        if type(got) is bool:
            free = nb - sum(cdiv(n, bs) for n in prompts)
            need = sum(max(0, cdiv(prompts[s] + k, bs) - cdiv(prompts[s], bs)) for s in asked)
            answers.append((free, need, nb, wm, got))
    return answers


def _can_append_hint(asked: Sequence[int], free: int, need: int, nb: int, wm: float, got: bool,
                     seen: List[tuple]) -> str:
    """The mistake behind a wrong answer: a rule is named only when it gives every answer the learner gave."""
    if not asked and got:
        return ("nothing grows here, but an empty list still leaves the reserve to check: the watermark's blocks "
                "must be free even when no sequence asks for one")
    for rule, why in _WATERMARK_RULES:
        if wm and all(rule(f, n, b, w) == g for f, n, b, w, g in seen):
            return why
    return (f"the listed sequences need {need} new blocks in all, {free} are free and the watermark "
            f"keeps {math.ceil(wm * nb)}; count each sequence's new blocks from its own length")


def _can_append_cases() -> List[tuple]:
    """(block_size, num_blocks, prompts, seq_ids asked, num_tokens, watermark), small enough to read."""
    cases = [
        (4, 10, [8, 6, 3], [0, 1, 2], 1, 0.0),     # one sequence at a boundary: 1 block
        (4, 5, [8, 7, 4], [0, 1, 2], 1, 0.0),      # two at a boundary, 1 free: no
        (4, 6, [8, 7, 4], [0, 1, 2], 1, 0.0),      # exactly enough
        (4, 6, [8, 7, 4], [1], 1, 0.0),            # room in the last block: needs nothing
        (4, 6, [8, 7, 4], [], 1, 0.0),             # nobody grows
        (4, 8, [5, 2], [0, 1], 6, 0.0),            # chunks: 11 and 8 tokens
        (4, 8, [5, 2], [0, 1], 7, 0.0),
        (4, 8, [5, 2], [0, 1], 0, 0.0),            # growing by 0 needs nothing
        (4, 10, [8, 8], [0, 1], 1, 0.2),           # 2 needed, 6 free, reserve 2
        (4, 10, [8, 8, 8], [0, 1, 2], 1, 0.25),    # reserve ceil(2.5) = 3: 1 left, no
        (4, 10, [8, 8, 8], [0, 1, 2], 1, 0.1),     # reserve 1: exactly
        (4, 10, [8, 8, 8], [0, 1, 2], 1, 0.11),    # reserve ceil(1.1) = 2: no
        (1, 6, [2, 2], [0, 1], 1, 0.0),
        (3, 4, [0], [0], 12, 0.0),
        (3, 4, [0], [0], 13, 0.0),
    ]
    rng = random.Random(52)
    for _ in range(25):
        bs = rng.choice([1, 2, 3, 4])
        prompts = [rng.randrange(0, 3 * bs + 1) for _ in range(rng.randrange(1, 4))]
        nb = sum(cdiv(p, bs) for p in prompts) + rng.randrange(0, 5)
        asked = [s for s in range(len(prompts)) if rng.random() < 0.7]
        cases.append((bs, nb, prompts, asked, rng.choice([0, 1, 1, 2, bs, bs + 1]), rng.choice([0.0, 0.0, 0.1, 0.3, 0.5])))
    return cases


def check_can_append(cls: Any) -> None:
    """Task 05.2: ``MyAllocator.can_append(seq_ids, num_tokens=1, *, watermark=0.0)`` answers like the library's."""
    cases = _can_append_cases()
    seen: List[tuple] = []  # (free, need, num_blocks, watermark, the learner's answer) of every case so far
    for index, (bs, nb, prompts, asked, k, wm) in enumerate(cases):
        run = Steps(cls, nb, bs)
        for seq_id, n in enumerate(prompts):
            run.step("allocate_for_sequence", seq_id, n)
        free = run.ref.num_free_blocks
        need = sum(max(0, cdiv(prompts[s] + k, bs) - cdiv(prompts[s], bs)) for s in asked)
        want = run.ref.can_append(asked, k, watermark=wm)
        run.calls.append(("can_append", (asked, k), {"watermark": wm}))
        call = run.program()
        got = call_learner(run.mine.can_append, (list(asked), k), call, want, watermark=wm)
        if type(got) is not bool:
            raise fail(call, want, got, "can_append answers with a bool (True or False)")
        seen.append((free, need, nb, wm, got))
        if got != want:
            seen += _quiet_answers(cls, cases[index + 1:])
            raise fail(call, want, got, _can_append_hint(asked, free, need, nb, wm, got, seen))
        run.compare("can_append only asks: it must change nothing", None)
    run = Steps(cls, 6, 2)
    run.step("allocate_for_sequence", 0, 3)
    run.step("allocate_for_sequence", 1, 2)
    for args, kwargs, hint in (
        (([0, 5], 1), {}, "an unknown sequence id raises ValueError (it cannot grow)"),
        (([1, 0, 1], 1), {}, "a sequence listed twice raises ValueError (it would be counted twice)"),
        (([0], 1), {"watermark": 1.5}, "a watermark outside 0..1 raises ValueError"),
        (([0], 1), {"watermark": -0.1}, "a watermark outside 0..1 raises ValueError"),
    ):
        run.calls.append(("can_append", args, kwargs))
        expect_raises(lambda *a, kw=kwargs: run.mine.can_append(*a, **kw), args, run.program(), ValueError, hint)
        run.calls.pop()
        run.compare("a call that raises must change nothing", None)
    passed("05.2")


# --------------------------------------------------------------------------- 05.3
# RecordingAllocator and RecordingModel live in paged_kv_course.recording (rebuilt in the kernel).
def _recording_allocator(model: TinyTransformer, num_blocks: int, block_size: int) -> RecordingAllocator:
    cfg = model.config
    return RecordingAllocator(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device,
                              num_layers=cfg.num_layers, enable_prefix_caching=False)


def check_chunked_generate(paged_generate: Callable[..., List[int]]) -> None:
    """Task 05.3: ``paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size)``."""
    from paged_kv_lib.model import generate_no_cache

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
        prefill = alloc.events[: cdiv(prompt_len, chunk)]
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
        expect_equal(call + f" then len(allocator.get_block_mapping({seq_id}))", cdiv(held, bs), len(mapping),
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
