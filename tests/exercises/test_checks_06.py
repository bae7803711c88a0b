"""Exercise 06's checks bite: correct solutions pass with the one success line, planted wrong ones
fail with a message that names the mistake."""

from __future__ import annotations

import hashlib
import importlib.util
from array import array

import pytest

from paged_kv_lib.conformance.starter import GrowingStarterAllocator
from paged_kv_lib.free_queue import NOT_QUEUED
from paged_kv_lib.grading import (
    check_allocator_conforms,
    check_longest_cached_prefix,
    check_remove_from_free_queue,
    check_salted_block_key,
    check_salted_chain_keys,
    check_serves_forked_samples,
    check_sharing_allocator,
)

from check_helpers import fails, not_implemented, passes

pytestmark = pytest.mark.usefixtures("one_thread")
HAS_DIFFERENTIAL = importlib.util.find_spec("paged_kv_lib.conformance.differential") is not None


# --------------------------------------------------------------------------- 06.1
class Sharing(GrowingStarterAllocator):
    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        table, length = self.tables[seq_id], self.lengths[seq_id]
        copy = num_tokens > 0 and length % self.block_size and self.ref_counts[table[-1]] > 1
        missing = max(0, -(-(length + num_tokens) // self.block_size) - len(table))
        if copy + missing > len(self.free):
            raise RuntimeError("out of blocks")
        placed = []
        if copy:
            (fresh,) = self.take_blocks(1)
            self.ref_counts[table[-1]] -= 1
            table[-1] = fresh
            placed.append(fresh)
        return placed + super().append_tokens(seq_id, num_tokens)


def test_untouched_tasks_say_so_in_one_line():
    class Untouched(GrowingStarterAllocator):
        def append_tokens(self, seq_id, num_tokens=1):
            raise NotImplementedError("Task 06.1: replace this line with your code")

    assert fails(check_sharing_allocator, Untouched) == "task 06.1 is not written yet"
    for check in (check_salted_block_key, check_salted_chain_keys, check_longest_cached_prefix,
                  check_remove_from_free_queue):
        assert fails(check, not_implemented).startswith("this task is not written yet")


def test_sharing_allocator_correct(capsys):
    passes(check_sharing_allocator, Sharing, "06.1", capsys)


def test_serves_forked_samples_correct(capsys):
    passes(check_serves_forked_samples, Sharing, "06.1", capsys)


@pytest.mark.skipif(not HAS_DIFFERENTIAL, reason="conformance.check_allocator not there yet")
def test_allocator_conforms_correct(capsys):
    passes(check_allocator_conforms, Sharing, "06.1", capsys)


class NoCopyOnWrite(Sharing):
    def append_tokens(self, seq_id, num_tokens=1):
        return GrowingStarterAllocator.append_tokens(self, seq_id, num_tokens)


class KeepsOldReference(Sharing):
    def append_tokens(self, seq_id, num_tokens=1):
        table = self.tables.get(seq_id, [])
        old = table[-1] if table else None
        placed = super().append_tokens(seq_id, num_tokens)
        if old is not None and old not in table:
            self.ref_counts[old] += 1  # the reference the copy should have dropped
        return placed


class CopiesFullBlocks(Sharing):
    def append_tokens(self, seq_id, num_tokens=1):
        table = self.tables[seq_id]
        if table and self.ref_counts[table[-1]] > 1 and self.lengths[seq_id] % self.block_size == 0:
            (fresh,) = self.take_blocks(1)
            self.ref_counts[table[-1]] -= 1
            table[-1] = fresh
            return [fresh] + super().append_tokens(seq_id, num_tokens)
        return super().append_tokens(seq_id, num_tokens)


class ForkWithoutCounts(Sharing):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables or child_seq_id in self.tables:
            raise ValueError("bad fork")
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]


class ForkSharesTheList(Sharing):
    def fork(self, parent_seq_id, child_seq_id):
        super().fork(parent_seq_id, child_seq_id)
        self.tables[child_seq_id] = self.tables[parent_seq_id]  # one list for both


class HeadFirstFree(Sharing):
    def free_sequence(self, seq_id):
        for block_id in self.tables.pop(seq_id, []):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free.append(block_id)
        self.lengths.pop(seq_id, None)


class CopyAfterGrowth(Sharing):
    """Takes the new blocks before the copy: same blocks, wrong order of ids."""

    def append_tokens(self, seq_id, num_tokens=1):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        copy = num_tokens > 0 and length % self.block_size and self.ref_counts[table[-1]] > 1
        old_last = len(table) - 1
        placed = GrowingStarterAllocator.append_tokens(self, seq_id, num_tokens)
        if copy:
            (fresh,) = self.take_blocks(1)
            self.ref_counts[table[old_last]] -= 1
            table[old_last] = fresh
            placed = placed + [fresh]
        return placed


class ForkAcceptsExistingChild(Sharing):
    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.tables:
            raise ValueError("unknown parent")
        self.free_sequence(child_seq_id)
        super().fork(parent_seq_id, child_seq_id)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (NoCopyOnWrite, "no copy-on-write"),
        (KeepsOldReference, "keeps the old reference"),
        (CopiesFullBlocks, "is full: the new token starts a new block"),
        (ForkWithoutCounts, "fork adds a holder"),
        (ForkSharesTheList, "expected"),
        (HeadFirstFree, "last logical block first"),
        (CopyAfterGrowth, "taken from the free queue first"),
        (ForkAcceptsExistingChild, "ValueError"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:30],
)
def test_sharing_allocator_wrong(wrong, named):
    message = fails(check_sharing_allocator, wrong)
    assert named in message, message


def test_serving_catches_a_missing_copy():
    assert "expected" in fails(check_serves_forked_samples, NoCopyOnWrite)


@pytest.mark.skipif(not HAS_DIFFERENTIAL, reason="conformance.check_allocator not there yet")
class PromptPlusOne(Sharing):
    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError(seq_id)
        need = num_prompt_tokens // self.block_size + 1
        if need > len(self.free):
            raise RuntimeError("out of blocks")
        self.tables[seq_id] = self.take_blocks(need)
        self.lengths[seq_id] = num_prompt_tokens


def test_allocator_conforms_catches_a_wrong_prompt_size():
    message = fails(check_allocator_conforms, PromptPlusOne)
    assert "check_allocator(MyAllocator)" in message and "a = MyAllocator(" in message


# --------------------------------------------------------------------------- 06.2
def salted_block_key(parent_key, token_ids, extra_key=None):
    digest = hashlib.sha256(parent_key if parent_key is not None else bytes(32))
    if extra_key:
        digest.update(len(extra_key).to_bytes(8, "little"))
        digest.update(extra_key)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def test_salted_block_key_correct(capsys):
    passes(check_salted_block_key, salted_block_key, "06.2", capsys)


def no_salt(parent_key, token_ids, extra_key=None):
    return salted_block_key(parent_key, token_ids)


def salt_without_length(parent_key, token_ids, extra_key=None):
    digest = hashlib.sha256(parent_key if parent_key is not None else bytes(32))
    if extra_key:
        digest.update(extra_key)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def hex_digest(parent_key, token_ids, extra_key=None):
    return salted_block_key(parent_key, token_ids, extra_key).hex()


@pytest.mark.parametrize(
    "wrong, named",
    [(no_salt, "extra key is missing"), (salt_without_length, "SHA-256 over"), (hex_digest, "digest itself")],
)
def test_salted_block_key_wrong(wrong, named):
    assert named in fails(check_salted_block_key, wrong)


# --------------------------------------------------------------------------- 06.3
def salted_chain_keys(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = salted_block_key(parent, token_ids[start:start + block_size], extra_key)
        keys.append(parent)
    return keys


def test_salted_chain_keys_correct(capsys):
    passes(check_salted_chain_keys, salted_chain_keys, "06.3", capsys)


def unchained(token_ids, block_size, extra_key=None):
    return [salted_block_key(None, token_ids[s:s + block_size], extra_key)
            for s in range(0, len(token_ids) - block_size + 1, block_size)]


def keys_partial_block(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids), block_size):
        parent = salted_block_key(parent, token_ids[start:start + block_size], extra_key)
        keys.append(parent)
    return keys


def salt_only_first(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = salted_block_key(parent, token_ids[start:start + block_size], extra_key if not keys else None)
        keys.append(parent)
    return keys


@pytest.mark.parametrize(
    "wrong, named",
    [(unchained, "an unchained hash"), (keys_partial_block, "only full blocks"),
     (salt_only_first, "every block's key")],
)
def test_salted_chain_keys_wrong(wrong, named):
    assert named in fails(check_salted_chain_keys, wrong)


# --------------------------------------------------------------------------- 06.4
def longest_cached_prefix(keys, cached):
    hits = []
    for key in keys:
        if key not in cached:
            break
        hits.append(cached[key])
    return hits


def test_longest_cached_prefix_correct(capsys):
    passes(check_longest_cached_prefix, longest_cached_prefix, "06.4", capsys)


def every_hit(keys, cached):
    return [cached[k] for k in keys if k in cached]


def pops_hits(keys, cached):
    hits = longest_cached_prefix(keys, cached)
    for key in keys[: len(hits)]:
        del cached[key]
    return hits


@pytest.mark.parametrize("wrong, named", [(every_hit, "stop at the first"), (pops_hits, "only read the cache")])
def test_longest_cached_prefix_wrong(wrong, named):
    assert named in fails(check_longest_cached_prefix, wrong)


# --------------------------------------------------------------------------- 06.5
def remove_from_free_queue(prev, next_, block_id):
    if not 0 <= block_id < len(prev) - 1 or prev[block_id] == NOT_QUEUED:
        raise ValueError(f"block {block_id} is not queued")
    before, after = prev[block_id], next_[block_id]
    next_[before] = after
    prev[after] = before
    prev[block_id] = next_[block_id] = NOT_QUEUED


def test_remove_from_free_queue_correct(capsys):
    passes(check_remove_from_free_queue, remove_from_free_queue, "06.5", capsys)


def walks_the_queue(prev, next_, block_id):
    sentinel = len(prev) - 1
    node = next_[sentinel]
    while node != sentinel and node != block_id:
        node = next_[node]
    if node == sentinel:
        raise ValueError(f"block {block_id} is not queued")
    remove_from_free_queue(prev, next_, block_id)


def keeps_its_links(prev, next_, block_id):
    if prev[block_id] == NOT_QUEUED:
        raise ValueError(block_id)
    before, after = prev[block_id], next_[block_id]
    next_[before] = after
    prev[after] = before


def forward_only(prev, next_, block_id):
    if prev[block_id] == NOT_QUEUED:
        raise ValueError(block_id)
    next_[prev[block_id]] = next_[block_id]
    prev[block_id] = next_[block_id] = NOT_QUEUED


def no_check(prev, next_, block_id):
    before, after = prev[block_id], next_[block_id]
    next_[before] = after
    prev[after] = before
    prev[block_id] = next_[block_id] = NOT_QUEUED


@pytest.mark.parametrize(
    "wrong, named",
    [(walks_the_queue, "walks the queue"), (keeps_its_links, "not queued"),
     (forward_only, "both directions"), (no_check, "raise ValueError")],
)
def test_remove_from_free_queue_wrong(wrong, named):
    message = fails(check_remove_from_free_queue, wrong)
    assert named in message, message
