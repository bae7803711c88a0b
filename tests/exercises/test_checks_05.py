"""Exercise 05's checks bite: correct solutions pass with the one success line, planted wrong ones
fail with a message that names the mistake."""

from __future__ import annotations

import pytest
import torch

from paged_kv_lib.conformance.starter import SharingStarterAllocator
from paged_kv_lib.grading import (
    check_blocks_to_add,
    check_chunked_generate,
    check_growing_allocator,
    check_serves_tiny_model,
)

from check_helpers import fails, not_implemented, passes

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_untouched_task_says_so_in_one_line():
    for check in (check_blocks_to_add, check_chunked_generate):
        assert fails(check, not_implemented).startswith("this task is not written yet")

    class Untouched(SharingStarterAllocator):
        def append_tokens(self, seq_id, num_tokens=1):
            raise NotImplementedError("Task 05.2: replace this line with your code")

    assert fails(check_growing_allocator, Untouched) == "task 05.2 is not written yet"
    assert fails(check_serves_tiny_model, Untouched) == "task 05.2 is not written yet"


# --------------------------------------------------------------------------- 05.1
def blocks_to_add(num_tokens, num_blocks_held, num_new_tokens, block_size):
    return max(0, -(-(num_tokens + num_new_tokens) // block_size) - num_blocks_held)


def test_blocks_to_add_correct(capsys):
    passes(check_blocks_to_add, blocks_to_add, "05.1", capsys)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (lambda n, held, k, bs: sum((n + i + 1) % bs == 0 for i in range(k)), "off by one at a block boundary"),
        (lambda n, held, k, bs: -(-k // bs), "only the new tokens"),
        (lambda n, held, k, bs: -(-(n + k) // bs) - held, "negative"),
        (lambda n, held, k, bs: max(0, -(-(n + k) // bs) - -(-n // bs)), "reserved ahead"),
        (lambda n, held, k, bs: max(0, (n + k) // bs - held), "floor"),
        (lambda n, held, k, bs: max(0, (n + k) // bs + 1 - held), "one too many"),
        (lambda n, held, k, bs: (n + k) > held * bs, "not a bool"),
    ],
    ids=["seed-rule", "new-tokens-only", "negative", "ignores-held", "floor", "n//bs+1", "bool"],
)
def test_blocks_to_add_wrong(wrong, named):
    assert named in fails(check_blocks_to_add, wrong)


# --------------------------------------------------------------------------- 05.2
class Growing(SharingStarterAllocator):
    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        table = self.tables[seq_id]
        missing = max(0, -(-(self.lengths[seq_id] + num_tokens) // self.block_size) - len(table))
        if missing > len(self.free):
            raise RuntimeError("out of blocks")
        taken = self.take_blocks(missing)
        table.extend(taken)
        self.lengths[seq_id] += num_tokens
        return taken


def test_growing_allocator_correct(capsys):
    passes(check_growing_allocator, Growing, "05.2", capsys)


def test_serves_tiny_model_correct(capsys):
    passes(check_serves_tiny_model, Growing, "05.2", capsys)


class SeedRule(Growing):
    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(seq_id)
        length = self.lengths[seq_id]
        need = sum((length + i + 1) % self.block_size == 0 for i in range(num_tokens))
        if need > len(self.free):
            raise RuntimeError("out of blocks")
        taken = self.take_blocks(need)
        self.tables[seq_id].extend(taken)
        self.lengths[seq_id] += num_tokens
        return taken


class PromptPlusOne(Growing):
    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError(seq_id)
        need = num_prompt_tokens // self.block_size + 1
        if need > len(self.free):
            raise RuntimeError("out of blocks")
        self.tables[seq_id] = self.take_blocks(need)
        self.lengths[seq_id] = num_prompt_tokens


class HeadFirstFree(Growing):
    def free_sequence(self, seq_id):
        for block_id in self.tables.pop(seq_id, []):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)
        self.lengths.pop(seq_id, None)


class NotAtomic(Growing):
    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(seq_id)
        table = self.tables[seq_id]
        taken = []
        while len(table) * self.block_size < self.lengths[seq_id] + num_tokens:
            if not self.free:
                raise RuntimeError("out of blocks")  # after taking some
            taken += self.take_blocks(1)
            table.append(taken[-1])
        self.lengths[seq_id] += num_tokens
        return taken


class ReturnsNothing(Growing):
    def append_tokens(self, seq_id, num_tokens=1):
        super().append_tokens(seq_id, num_tokens)


class ReturnsTuple(Growing):
    def append_tokens(self, seq_id, num_tokens=1):
        return tuple(super().append_tokens(seq_id, num_tokens))


class TakesFromTheTail(Growing):
    def take_blocks(self, count):
        taken = [self.free.pop() for _ in range(count)]
        for b in taken:
            self.ref_counts[b] = 1
        return taken


class KeyErrorForUnknown(Growing):
    def append_tokens(self, seq_id, num_tokens=1):
        self.tables[seq_id]  # KeyError is not a ValueError
        return super().append_tokens(seq_id, num_tokens)


class FreeCountMethod(Growing):
    def num_free_blocks(self):  # a method, not a property
        return len(self.free)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (SeedRule, "off by one at a block boundary"),
        (PromptPlusOne, "n // block_size + 1 is one block too many"),
        (HeadFirstFree, "last logical block first"),
        (NotAtomic, "must change nothing"),
        (ReturnsNothing, "returns a list"),
        (ReturnsTuple, "returns a list"),
        (TakesFromTheTail, "head of the free queue"),
        (KeyErrorForUnknown, "a ValueError"),
        (FreeCountMethod, "@property"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:30],
)
def test_growing_allocator_wrong(wrong, named):
    message = fails(check_growing_allocator, wrong)
    assert named in message, message
    assert "a = MyAllocator(" in message  # the calls so far, as code


# --------------------------------------------------------------------------- 05.3
@torch.no_grad()
def paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    allocator.allocate_for_sequence(seq_id, 0)
    for start in range(0, len(prompt_ids), chunk_size):
        chunk = list(prompt_ids[start:start + chunk_size])
        allocator.append_tokens(seq_id, len(chunk))
        logits = model.forward_paged(allocator, [seq_id], [chunk])
    new_tokens = []
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        new_tokens.append(token)
        if step + 1 < max_new_tokens:
            allocator.append_tokens(seq_id, 1)
            logits = model.forward_paged(allocator, [seq_id], [[token]])
    return new_tokens


def test_chunked_generate_correct(capsys):
    passes(check_chunked_generate, paged_generate, "05.3", capsys)


@torch.no_grad()
def whole_prompt_at_once(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    return paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, len(prompt_ids))


@torch.no_grad()
def counts_the_whole_prompt_first(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    allocator.allocate_for_sequence(seq_id, len(prompt_ids))
    for start in range(0, len(prompt_ids), chunk_size):
        logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids[start:start + chunk_size])])
    new_tokens = []
    for step in range(max_new_tokens):
        new_tokens.append(int(logits[0].argmax()))
        if step + 1 < max_new_tokens:
            allocator.append_tokens(seq_id, 1)
            logits = model.forward_paged(allocator, [seq_id], [[new_tokens[-1]]])
    return new_tokens


@torch.no_grad()
def feeds_the_last_token(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    out = paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size)
    allocator.append_tokens(seq_id, 1)
    model.forward_paged(allocator, [seq_id], [[out[-1]]])
    return out


@torch.no_grad()
def appends_after_feeding(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    allocator.allocate_for_sequence(seq_id, 0)
    for start in range(0, len(prompt_ids), chunk_size):
        chunk = list(prompt_ids[start:start + chunk_size])
        allocator.append_tokens(seq_id, len(chunk))
        logits = model.forward_paged(allocator, [seq_id], [chunk])
    new_tokens = []
    for step in range(max_new_tokens):
        new_tokens.append(int(logits[0].argmax()))
        if step + 1 < max_new_tokens:
            logits = model.forward_paged(allocator, [seq_id], [[new_tokens[-1]]])  # overwrites the last slot
            allocator.append_tokens(seq_id, 1)
    return new_tokens


def frees_at_the_end(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    out = paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size)
    allocator.free_sequence(seq_id)
    return out


def consumes_the_prompt(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    out = paged_generate(model, allocator, seq_id, list(prompt_ids), max_new_tokens, chunk_size)
    prompt_ids.clear()
    return out


def no_cache(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    from paged_kv_lib.model import generate_no_cache

    out = generate_no_cache(model, prompt_ids, max_new_tokens)
    allocator.allocate_for_sequence(seq_id, len(prompt_ids) + max_new_tokens - 1)
    return out


@pytest.mark.parametrize(
    "wrong, named",
    [
        (whole_prompt_at_once, "chunk by chunk"),
        (counts_the_whole_prompt_first, "newest"),
        (feeds_the_last_token, "never fed back"),
        (appends_after_feeding, "counted by the allocator"),
        (frees_at_the_end, "leave the sequence allocated"),
        (consumes_the_prompt, "inputs modified"),
        (no_cache, "chunk by chunk"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:30],
)
def test_chunked_generate_wrong(wrong, named):
    message = fails(check_chunked_generate, wrong)
    assert named in message, message
