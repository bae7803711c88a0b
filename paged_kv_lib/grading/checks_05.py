"""Checks of exercise 05, growing on demand: blocks for a growth step, decode slots, paged generation.

Every expected value is computed here from the library (a fresh ``PagedKVCacheAllocator``,
``generate_no_cache``), never stored, except a few tiny cases small enough to verify by hand.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import torch

from ..allocator import PagedKVCacheAllocator
from ._common import call_learner, expect_equal, fail, passed


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- 05.1
def _blocks_added_by_library(num_tokens: int, num_new: int, block_size: int) -> int:
    alloc = PagedKVCacheAllocator(num_tokens + num_new + 4, block_size, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, num_tokens)
    return len(alloc.append_tokens(0, num_new))


def check_blocks_to_add(blocks_to_add: Callable[[int, int, int, int], int]) -> None:
    """Task 05.1: ``blocks_to_add(num_tokens, num_blocks_held, num_new_tokens, block_size)``."""
    hand = [  # (num_tokens, held, new, block_size, expected), verified by hand
        (8, 2, 1, 4, 1),   # a prompt that fills its blocks: the first new token needs a block
        (6, 2, 1, 4, 0),   # room left in the last block
        (7, 2, 1, 4, 0),   # the last slot of block 1: still no new block (the seed's rule says 1)
        (0, 0, 1, 16, 1),  # an empty sequence has no block at all
        (5, 2, 9, 4, 2),   # 14 tokens need 4 blocks, 2 are held
        (5, 4, 3, 4, 0),   # blocks reserved ahead: nothing to add
    ]
    for n, held, k, bs, want in hand:
        call = f"blocks_to_add(num_tokens={n}, num_blocks_held={held}, num_new_tokens={k}, block_size={bs})"
        got = call_learner(blocks_to_add, (n, held, k, bs), call, want)
        if not _is_count(got):
            raise fail(call, want, got, "return an int (a number of blocks)")
        expect_equal(call, want, got, "the new tokens occupy positions num_tokens .. num_tokens + "
                     "num_new_tokens - 1; count the blocks those positions need beyond the ones held")
    for bs in (1, 2, 4, 16):
        for n in range(0, 3 * bs + 2):
            least = -(-n // bs)
            for k in sorted({0, 1, 2, bs - 1, bs, bs + 1, 2 * bs + 3}):
                want = _blocks_added_by_library(n, k, bs)
                call = f"blocks_to_add(num_tokens={n}, num_blocks_held={least}, num_new_tokens={k}, block_size={bs})"
                got = call_learner(blocks_to_add, (n, least, k, bs), call, want)
                expect_equal(call, want, got, "this is what the allocator's append_tokens adds; "
                             "a block is needed for every position that starts a block past the held ones")
                for extra in (1, 2):  # blocks reserved ahead of time
                    held = least + extra
                    want = max(0, -(-(n + k) // bs) - held)
                    call = f"blocks_to_add(num_tokens={n}, num_blocks_held={held}, num_new_tokens={k}, block_size={bs})"
                    got = call_learner(blocks_to_add, (n, held, k, bs), call, want)
                    expect_equal(call, want, got, "with blocks reserved ahead the answer can be 0, never negative")
    passed("05.1")


# --------------------------------------------------------------------------- 05.2
def _library_decode_slots(prompt_len: int, num_new: int, block_size: int,
                          free_ids: Sequence[int]) -> Tuple[List[int], List[int]]:
    """The allocator's answer, with its fresh free order 0, 1, 2, ... renamed to ``free_ids``."""
    alloc = PagedKVCacheAllocator(len(free_ids), block_size, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, prompt_len)
    slots = []
    for position in range(prompt_len, prompt_len + num_new):
        alloc.append_tokens(0, 1)
        slot = int(alloc.slot_mapping(0, [position])[0])
        slots.append(free_ids[slot // block_size] * block_size + slot % block_size)
    return [free_ids[i] for i in alloc.get_block_mapping(0)], slots


def check_decode_slots(decode_slots: Callable[[int, int, int, List[int]], Tuple[List[int], List[int]]]) -> None:
    """Task 05.2: ``decode_slots(prompt_len, num_new_tokens, block_size, free_block_ids) -> (table, slots)``."""
    cases = [
        (8, 4, 4, [0, 1, 2, 3, 4, 5]),       # a prompt that fills its blocks (the seed's failing case)
        (6, 4, 4, [0, 1, 2, 3, 4, 5]),
        (0, 5, 2, [9, 4, 7, 1]),             # empty prompt: the first token needs a block
        (5, 0, 4, [3, 2, 1]),                # nothing to decode
        (3, 12, 4, [11, 2, 8, 5, 0, 7, 1]),  # a free list in no particular order
        (16, 17, 8, list(range(40, 30, -1))),
        (1, 9, 1, list(range(20))),          # block_size 1: a block per token
        (15, 1, 16, [5, 6]),
        (16, 1, 16, [5, 6]),
    ]
    for prompt_len, num_new, bs, free_ids in cases:
        want_table, want_slots = _library_decode_slots(prompt_len, num_new, bs, free_ids)
        given = list(free_ids)
        call = f"decode_slots(prompt_len={prompt_len}, num_new_tokens={num_new}, block_size={bs}, free_block_ids={free_ids})"
        got = call_learner(decode_slots, (prompt_len, num_new, bs, given), call, (want_table, want_slots))
        if given != list(free_ids):
            raise fail(call, f"free_block_ids left as {free_ids}", given,
                       "work on a copy of the free list (e.g. collections.deque(free_block_ids))")
        if not isinstance(got, tuple) or len(got) != 2:
            raise fail(call, (want_table, want_slots), got, "return a pair (block_table, slots)")
        table, slots = list(got[0]), list(got[1])
        expect_equal(call + "[1]  (the slots of the new tokens)", want_slots, slots,
                     "slot = block_table[position // block_size] * block_size + position % block_size; "
                     "take a new block from the head of the free list exactly when position % block_size == 0 "
                     "and the table has no block for it yet")
        expect_equal(call + "[0]  (the final block table)", want_table, table,
                     "the prompt takes ceil(prompt_len / block_size) blocks from the head of the free list, "
                     "then one more block each time a new token starts a block, never earlier")
    passed("05.2")


# --------------------------------------------------------------------------- 05.3
def check_paged_generate(paged_generate: Callable[..., List[int]]) -> None:
    """Task 05.3: ``paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens) -> new token ids``."""
    from ..model import ModelConfig, TinyTransformer, generate_no_cache

    model = TinyTransformer(ModelConfig(), seed=11).eval()
    cases = [  # (block_size, prompt length, new tokens): prompts that fill their blocks, and not
        (4, 8, 6),
        (4, 6, 7),
        (8, 5, 1),
        (8, 16, 10),
        (2, 1, 5),
    ]
    gen = torch.Generator().manual_seed(5)
    for case, (bs, prompt_len, max_new) in enumerate(cases):
        prompt = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
        want = generate_no_cache(model, prompt, max_new)
        alloc = model.new_allocator(32, bs)
        seq_id = 7 + case
        call = (f"paged_generate(model, allocator(block_size={bs}), seq_id={seq_id}, "
                f"prompt_ids=<{prompt_len} tokens>, max_new_tokens={max_new})")
        with torch.no_grad():
            got = call_learner(paged_generate, (model, alloc, seq_id, list(prompt), max_new), call, want)
        got = [int(t) for t in got] if isinstance(got, (list, tuple)) else got
        expect_equal(call, want, got,
                     "the new tokens must equal generate_no_cache's; prefill the prompt with forward_paged, "
                     "then before feeding each token call allocator.append_tokens(seq_id, 1)")
        if seq_id not in alloc.seq_ids:
            raise fail(call + " then allocator.seq_ids", f"a tuple containing {seq_id}", alloc.seq_ids,
                       "leave the sequence allocated when you return (the check reads its K/V)")
        held = alloc.get_num_tokens(seq_id)
        expect_equal(call + f" then allocator.get_num_tokens({seq_id})", prompt_len + max_new - 1, held,
                     "the cache holds the prompt and every new token except the last, which is returned "
                     "but never fed back to the model")
        alloc.check_invariants()
        expect_equal(call + f" then len(allocator.get_block_mapping({seq_id}))",
                     alloc.blocks_needed(held), len(alloc.get_block_mapping(seq_id)),
                     "a sequence holds exactly ceil(tokens / block_size) blocks")
        # Layer 0's keys depend only on each token and its position: recompute them in one prefill.
        ref = model.new_allocator(32, bs)
        tokens = list(prompt) + want[:-1]
        ref.allocate_for_sequence(0, len(tokens))
        with torch.no_grad():
            model.forward_paged(ref, [0], [tokens])
        k_got, _ = alloc.read_kv(seq_id, layer=0)
        k_want, _ = ref.read_kv(0, layer=0)
        close = torch.isclose(k_got, k_want, atol=1e-4, rtol=1e-4).flatten(1).all(dim=1)
        if not bool(close.all()):
            bad = [int(p) for p in torch.nonzero(~close).flatten()]
            raise fail(call + " then allocator.read_kv(seq_id, layer=0)",
                       "the keys of every stored token", f"wrong keys at positions {bad}",
                       "write each token's K/V through model.forward_paged after counting it with "
                       "append_tokens, so it lands in its own position's slot")
    passed("05.3")
