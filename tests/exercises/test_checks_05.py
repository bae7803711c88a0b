"""Exercise 05's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from paged_kv_lib.grading import check_blocks_to_add, check_decode_slots, check_paged_generate

from check_helpers import fails, not_implemented, passes


pytestmark = pytest.mark.usefixtures("one_thread")





@pytest.mark.parametrize("check", [check_blocks_to_add, check_decode_slots, check_paged_generate])
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 05.1
def blocks_to_add(num_tokens, num_blocks_held, num_new_tokens, block_size):
    return max(0, -(-(num_tokens + num_new_tokens) // block_size) - num_blocks_held)


def test_blocks_to_add_correct(capsys):
    passes(check_blocks_to_add, blocks_to_add, "05.1", capsys)


@pytest.mark.parametrize(
    "wrong",
    [
        # the seed's rule, generalised: one step early, and nothing after a full prompt
        lambda n, held, k, bs: sum((n + i + 1) % bs == 0 for i in range(k)),
        # counts only the new tokens' own blocks, ignoring where the sequence ends
        lambda n, held, k, bs: -(-k // bs),
        # forgets that blocks reserved ahead already count: can go negative
        lambda n, held, k, bs: -(-(n + k) // bs) - held,
        # ignores the blocks actually held, assumes exactly ceil(n / bs)
        lambda n, held, k, bs: -(-(n + k) // bs) - -(-n // bs),
        # floor instead of ceil
        lambda n, held, k, bs: max(0, (n + k) // bs - held),
        # returns a bool
        lambda n, held, k, bs: (n + k) > held * bs,
    ],
    ids=["seed-rule", "new-tokens-only", "negative", "ignores-held", "floor", "bool"],
)
def test_blocks_to_add_wrong(wrong):
    fails(check_blocks_to_add, wrong)


# --------------------------------------------------------------------------- 05.2
def decode_slots(prompt_len, num_new_tokens, block_size, free_block_ids):
    free = deque(free_block_ids)
    table = [free.popleft() for _ in range(-(-prompt_len // block_size))]
    slots = []
    for position in range(prompt_len, prompt_len + num_new_tokens):
        if position % block_size == 0:
            table.append(free.popleft())
        slots.append(table[position // block_size] * block_size + position % block_size)
    return table, slots


def test_decode_slots_correct(capsys):
    passes(check_decode_slots, decode_slots, "05.2", capsys)


def seed_rule(prompt_len, num_new_tokens, block_size, free_block_ids):
    free = deque(free_block_ids)
    table = [free.popleft() for _ in range(-(-prompt_len // block_size))]
    slots = []
    for position in range(prompt_len, prompt_len + num_new_tokens):
        if (position + 1) % block_size == 0:
            table.append(free.popleft())
        slots.append(table[position // block_size] * block_size + position % block_size)
    return table, slots


def takes_from_the_tail(prompt_len, num_new_tokens, block_size, free_block_ids):
    free = list(free_block_ids)
    table = [free.pop() for _ in range(-(-prompt_len // block_size))]
    slots = []
    for position in range(prompt_len, prompt_len + num_new_tokens):
        if position % block_size == 0:
            table.append(free.pop())
        slots.append(table[position // block_size] * block_size + position % block_size)
    return table, slots


def mutates_the_free_list(prompt_len, num_new_tokens, block_size, free_block_ids):
    table = [free_block_ids.pop(0) for _ in range(-(-prompt_len // block_size))]
    slots = []
    for position in range(prompt_len, prompt_len + num_new_tokens):
        if position % block_size == 0:
            table.append(free_block_ids.pop(0))
        slots.append(table[position // block_size] * block_size + position % block_size)
    return table, slots


def logical_slots(prompt_len, num_new_tokens, block_size, free_block_ids):
    table, _ = decode_slots(prompt_len, num_new_tokens, block_size, free_block_ids)
    return table, list(range(prompt_len, prompt_len + num_new_tokens))  # positions, not slots


def reserves_ahead(prompt_len, num_new_tokens, block_size, free_block_ids):
    free = deque(free_block_ids)
    table = [free.popleft() for _ in range(-(-prompt_len // block_size))]
    slots = []
    for position in range(prompt_len, prompt_len + num_new_tokens):
        if position // block_size >= len(table):
            table.append(free.popleft())
        slots.append(table[position // block_size] * block_size + position % block_size)
        if (position + 1) % block_size == 0:
            table.append(free.popleft())  # a block for the next token, one step early
    return table, slots


@pytest.mark.parametrize(
    "wrong", [seed_rule, takes_from_the_tail, mutates_the_free_list, logical_slots, reserves_ahead]
)
def test_decode_slots_wrong(wrong):
    fails(check_decode_slots, wrong)


def test_decode_slots_seed_rule_message_names_the_failing_call():
    message = fails(check_decode_slots, seed_rule)
    assert "decode_slots(prompt_len=8" in message and "expected" in message and "hint" in message


# --------------------------------------------------------------------------- 05.3
@torch.no_grad()
def paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens):
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])
    new_tokens = []
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        if step + 1 < max_new_tokens:
            allocator.append_tokens(seq_id, 1)
            logits = model.forward_paged(allocator, [seq_id], [[token]])
    return new_tokens


def test_paged_generate_correct(capsys):
    passes(check_paged_generate, paged_generate, "05.3", capsys)


@torch.no_grad()
def feeds_the_last_token(model, allocator, seq_id, prompt_ids, max_new_tokens):
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])
    new_tokens = []
    for _ in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        allocator.append_tokens(seq_id, 1)
        logits = model.forward_paged(allocator, [seq_id], [[token]])
    return new_tokens


@torch.no_grad()
def seed_growth_rule(model, allocator, seq_id, prompt_ids, max_new_tokens):
    """Grows by hand with the seed's rule: fails after a prompt that fills its blocks."""
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])
    new_tokens, length = [], len(prompt_ids)
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        if step + 1 == max_new_tokens:
            break
        if (length + 1) % allocator.block_size == 0:
            allocator.append_block_to_sequence(seq_id)
        allocator.append_tokens(seq_id, 1)
        length += 1
        logits = model.forward_paged(allocator, [seq_id], [[token]])
    return new_tokens


@torch.no_grad()
def never_counts_the_token(model, allocator, seq_id, prompt_ids, max_new_tokens):
    """Feeds each token without append_tokens: it overwrites the last prompt position."""
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])
    new_tokens = []
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        if step + 1 < max_new_tokens:
            logits = model.forward_paged(allocator, [seq_id], [[token]])
    return new_tokens


def frees_at_the_end(model, allocator, seq_id, prompt_ids, max_new_tokens):
    out = paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens)
    allocator.free_sequence(seq_id)
    return out


def no_cache_then_allocates(model, allocator, seq_id, prompt_ids, max_new_tokens):
    """Right tokens, right counts, but nothing written to the cache."""
    from paged_kv_lib.model import generate_no_cache

    out = generate_no_cache(model, prompt_ids, max_new_tokens)
    allocator.allocate_for_sequence(seq_id, len(prompt_ids) + max_new_tokens - 1)
    return out


@torch.no_grad()
def appends_after_feeding(model, allocator, seq_id, prompt_ids, max_new_tokens):
    """Counts each token only after feeding it: its K/V overwrites the previous position."""
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])
    new_tokens = []
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        if step + 1 < max_new_tokens:
            logits = model.forward_paged(allocator, [seq_id], [[token]])
            allocator.append_tokens(seq_id, 1)
    return new_tokens


@pytest.mark.parametrize(
    "wrong",
    [feeds_the_last_token, seed_growth_rule, never_counts_the_token, frees_at_the_end,
     no_cache_then_allocates, appends_after_feeding],
)
def test_paged_generate_wrong(wrong):
    fails(check_paged_generate, wrong)
