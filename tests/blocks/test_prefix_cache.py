"""PrefixCache and the content keys, directly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged_kv_lib import InvalidTypeError, block_key, chain_keys
from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.prefix_cache import PrefixCache, as_extra_key


def test_keys_chain_over_the_prefix_and_salt():
    a = chain_keys([1, 2, 3, 4], 2)
    b = chain_keys([9, 9, 3, 4], 2)
    assert len(a) == len(b) == 2 and all(len(k) == 32 for k in a)
    assert a[1] != b[1], "equal tokens after different prefixes get different keys"
    assert a[0] == block_key(None, [1, 2]) and a[1] == block_key(a[0], [3, 4])
    assert chain_keys([1, 2, 3, 4], 2, b"x") != a
    assert chain_keys([1, 2, 3], 2) == a[:1], "a partial block has no key"


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.integers(1, 5),
       st.lists(st.integers(1, 7), max_size=6), st.booleans())
def test_keys_made_as_blocks_fill_equal_chaining_at_once(tokens, block_size, cuts, bare):
    """A sequence whose tokens arrive in pieces (one-token steps given bare or as rows, longer appends) ends up
    with the keys of chaining all its tokens at once: each block keyed once, when it fills."""
    manager = BlockManager(64, block_size)
    held = min(len(tokens), cuts[0]) if cuts else len(tokens)
    manager.allocate_for_sequence(0, held, token_ids=tokens[:held])
    for cut in cuts[1:] + [len(tokens)]:
        new = tokens[held : min(len(tokens), held + cut)]
        if len(new) == 1:
            manager.allocate_slots([0], 1, token_ids=[new[0] if bare else new])
        else:
            manager.append_tokens(0, len(new), new)
        held += len(new)
    assert manager.table(0).block_keys == chain_keys(tokens, block_size)
    manager.check_invariants()


def test_as_extra_key():
    assert as_extra_key(None) is None and as_extra_key("é") == "é".encode() and as_extra_key(b"x") == b"x"
    with pytest.raises(InvalidTypeError, match="bytes or str, got int"):
        as_extra_key(3)


def test_the_map_and_its_longest_prefix():
    cache = PrefixCache()
    keys = chain_keys(list(range(8)), 2)
    assert len(cache) == 0 and cache.longest_prefix(keys) == []
    cache[keys[0]] = 5
    cache[keys[1]] = 2
    cache[keys[3]] = 7  # not reachable: keys[2] is missing
    assert len(cache) == 3 and keys[1] in cache and cache.get(keys[3]) == 7 and cache.get(keys[2]) is None
    assert cache.longest_prefix(keys) == [5, 2]
    del cache[keys[0]]
    assert cache.longest_prefix(keys) == [] and dict(cache.items()) == {keys[1]: 2, keys[3]: 7}
    cache.clear()
    assert len(cache) == 0 and (cache.queries, cache.hits) == (0, 0)


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=30))
def test_longest_prefix_matches_a_model(ops):
    keys = chain_keys(list(range(8)), 2)
    cache, model = PrefixCache(), {}
    for i, insert in ops:
        if insert:
            cache[keys[i]] = i + 10
            model[keys[i]] = i + 10
        elif keys[i] in model:
            del cache[keys[i]]
            del model[keys[i]]
    expected = []
    for k in keys:
        if k not in model:
            break
        expected.append(model[k])
    assert cache.longest_prefix(keys) == expected and len(cache) == len(model)


def test_no_salt_never_reads_as_a_salt():
    """With no salt written at all, a salt of 8k bytes would read as token ids: its length, then its bytes."""
    tenant = int.from_bytes(b"tenant-7", "little", signed=True)
    salted = block_key(None, [5], b"tenant-7")
    assert salted != block_key(None, [8, tenant, 5])
    assert salted != block_key(None, [tenant, 5])
    assert block_key(None, [5], b"") == block_key(None, [5])  # an empty salt is no salt
