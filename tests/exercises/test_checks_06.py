"""Exercise 06's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

import hashlib
from array import array

import pytest

from paged_kv_lib import block_key
from paged_kv_lib.grading import (
    check_cow_append,
    check_free_in_order,
    check_longest_cached_prefix,
    check_salted_block_key,
    check_salted_chain_keys,)

from check_helpers import fails, not_implemented, passes

CHECKS = [check_cow_append, check_salted_block_key, check_salted_chain_keys, check_longest_cached_prefix,
          check_free_in_order]




@pytest.mark.parametrize("check", CHECKS)
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 06.1
def cow_append(state, seq_id, *, copy_rule=True, decrement=True, count=True, swap_pair=False, from_tail=False):
    """The solution, with switches that plant one bug each."""
    block_size = state["block_size"]
    table = state["tables"][seq_id]
    ref_counts = state["ref_counts"]
    length = state["lengths"][seq_id]
    take = state["free"].pop if from_tail else state["free"].popleft
    copied = None
    if length % block_size == 0:
        new = take()
        ref_counts[new] = 1
        table.append(new)
    elif ref_counts[table[-1]] > 1 or not copy_rule:
        old, new = table[-1], take()
        ref_counts[new] = 1
        if decrement:
            ref_counts[old] -= 1
        table[-1] = new
        copied = (new, old) if swap_pair else (old, new)
    if count:
        state["lengths"][seq_id] = length + 1
    return copied


def test_cow_append_correct(capsys):
    passes(check_cow_append, cow_append, "06.1", capsys)


def never_copies(state, seq_id):
    block_size, table = state["block_size"], state["tables"][seq_id]
    if state["lengths"][seq_id] % block_size == 0:
        new = state["free"].popleft()
        state["ref_counts"][new] = 1
        table.append(new)
    state["lengths"][seq_id] += 1
    return None


def copies_at_a_boundary_too(state, seq_id):
    """Copies a shared full last block before adding the new block: a wasted copy."""
    table, ref_counts = state["tables"][seq_id], state["ref_counts"]
    if table and ref_counts[table[-1]] > 1:
        old, new = table[-1], state["free"].popleft()
        ref_counts[new], table[-1] = 1, new
        ref_counts[old] -= 1
        result = (old, new)
    else:
        result = None
    if state["lengths"][seq_id] % state["block_size"] == 0:
        new = state["free"].popleft()
        ref_counts[new] = 1
        table.append(new)
    state["lengths"][seq_id] += 1
    return result


@pytest.mark.parametrize(
    "wrong",
    [
        never_copies,
        copies_at_a_boundary_too,
        lambda s, q: cow_append(s, q, from_tail=True),    # hands out the tail of the free queue
        lambda s, q: cow_append(s, q, copy_rule=False),   # copies even an unshared block
        lambda s, q: cow_append(s, q, decrement=False),   # the old block keeps the reference
        lambda s, q: cow_append(s, q, count=False),       # forgets to count the token
        lambda s, q: cow_append(s, q, swap_pair=True),    # returns (new, old)
    ],
    ids=["never-copies", "boundary-copy", "tail", "always-copies", "no-decrement", "no-count", "swapped-pair"],
)
def test_cow_append_wrong(wrong):
    fails(check_cow_append, wrong)


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


def no_length_prefix(parent_key, token_ids, extra_key=None):
    digest = hashlib.sha256(parent_key if parent_key is not None else bytes(32))
    digest.update(extra_key or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def ignores_the_salt(parent_key, token_ids, extra_key=None):
    return salted_block_key(parent_key, token_ids)


def four_byte_tokens(parent_key, token_ids, extra_key=None):
    digest = hashlib.sha256(parent_key if parent_key is not None else bytes(32))
    if extra_key:
        digest.update(len(extra_key).to_bytes(8, "little"))
        digest.update(extra_key)
    digest.update(array("i", [t % 2**31 for t in token_ids]).tobytes())
    return digest.digest()


def ignores_the_parent(parent_key, token_ids, extra_key=None):
    return salted_block_key(None, token_ids, extra_key)


def hex_digest(parent_key, token_ids, extra_key=None):
    return salted_block_key(parent_key, token_ids, extra_key).hex()


def salt_after_tokens(parent_key, token_ids, extra_key=None):
    digest = hashlib.sha256(parent_key if parent_key is not None else bytes(32))
    digest.update(array("q", token_ids).tobytes())
    if extra_key:
        digest.update(len(extra_key).to_bytes(8, "little"))
        digest.update(extra_key)
    return digest.digest()


@pytest.mark.parametrize(
    "wrong", [no_length_prefix, ignores_the_salt, four_byte_tokens, ignores_the_parent, hex_digest, salt_after_tokens]
)
def test_salted_block_key_wrong(wrong):
    fails(check_salted_block_key, wrong)


def test_salted_block_key_hint_names_a_missing_salt():
    assert "extra key is missing" in fails(check_salted_block_key, ignores_the_salt)


# --------------------------------------------------------------------------- 06.3
def salted_chain_keys(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size], extra_key)
        keys.append(parent)
    return keys


def test_salted_chain_keys_correct(capsys):
    passes(check_salted_chain_keys, salted_chain_keys, "06.3", capsys)


def unchained(token_ids, block_size, extra_key=None):
    return [block_key(None, token_ids[s:s + block_size], extra_key)
            for s in range(0, len(token_ids) - block_size + 1, block_size)]


def keys_partial_block(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids), block_size):
        parent = block_key(parent, token_ids[start:start + block_size], extra_key)
        keys.append(parent)
    return keys


def misses_the_last_full_block(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids) - block_size, block_size):
        parent = block_key(parent, token_ids[start:start + block_size], extra_key)
        keys.append(parent)
    return keys


def salts_only_the_first_block(token_ids, block_size, extra_key=None):
    keys, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size], extra_key if not keys else None)
        keys.append(parent)
    return keys


@pytest.mark.parametrize("wrong", [unchained, keys_partial_block, misses_the_last_full_block, salts_only_the_first_block])
def test_salted_chain_keys_wrong(wrong):
    fails(check_salted_chain_keys, wrong)


def test_salted_chain_keys_hint_names_the_missing_chain():
    assert "chain on the previous block" in fails(check_salted_chain_keys, unchained)


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


@pytest.mark.parametrize(
    "wrong",
    [
        lambda keys, cached: [cached[k] for k in keys if k in cached],           # skips over misses
        lambda keys, cached: longest_cached_prefix(keys, cached)[:-1],           # one block short
        lambda keys, cached: [k for k in keys if k in cached],                   # keys, not block ids
        lambda keys, cached: [cached.pop(k) for k in longest_cached_prefix(keys, cached)],  # empties the cache
    ],
    ids=["skips-misses", "one-short", "keys", "mutates"],
)
def test_longest_cached_prefix_wrong(wrong):
    fails(check_longest_cached_prefix, wrong)


# --------------------------------------------------------------------------- 06.5
def free_in_order(table, ref_counts, free_queue):
    for block_id in reversed(table):
        ref_counts[block_id] -= 1
        if ref_counts[block_id] == 0:
            free_queue.append(block_id)


def test_free_in_order_correct(capsys):
    passes(check_free_in_order, free_in_order, "06.5", capsys)


def head_first(table, ref_counts, free_queue):
    for block_id in table:
        ref_counts[block_id] -= 1
        if ref_counts[block_id] == 0:
            free_queue.append(block_id)


def queues_shared_blocks(table, ref_counts, free_queue):
    for block_id in reversed(table):
        ref_counts[block_id] -= 1
        if block_id not in free_queue:
            free_queue.append(block_id)


def to_the_head(table, ref_counts, free_queue):
    for block_id in table:
        ref_counts[block_id] -= 1
        if ref_counts[block_id] == 0:
            free_queue.appendleft(block_id)


def forgets_the_counts(table, ref_counts, free_queue):
    for block_id in reversed(table):
        if ref_counts[block_id] == 1:
            free_queue.append(block_id)


@pytest.mark.parametrize("wrong", [head_first, queues_shared_blocks, to_the_head, forgets_the_counts])
def test_free_in_order_wrong(wrong):
    fails(check_free_in_order, wrong)
