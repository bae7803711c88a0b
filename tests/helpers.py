"""Helpers shared by the allocator tests: a full snapshot of allocator state, to prove failures change nothing."""

from __future__ import annotations

import functools
from typing import Any, Dict

import torch

from paged_kv_lib import PagedKVCacheAllocator


def _table_state(table) -> tuple:
    """Every field of a block table, the derived fast-path limit included."""
    tokens = None if table.token_ids is None else list(table.token_ids)
    return (list(table.block_ids), table.num_tokens, tokens, list(table.block_keys), table.extra_key,
            table.append_limit)


def snapshot(alloc: PagedKVCacheAllocator) -> Dict[str, Any]:
    """Everything observable about an allocator, and the private state behind it, tensors cloned.

    Resident and swapped tables (block ids, token count, token ids, content keys, salt),
    ref counts and hashes, the free queue's order, the prefix cache's map and counters,
    the CPU pool, the copy log and every device and CPU cache tensor.
    """
    manager = alloc.manager
    state: Dict[str, Any] = {
        "free": alloc.free_blocks,
        "blocks": [(b.block_id, b.ref_count, b.block_hash) for b in alloc.blocks],
        "tables": {s: _table_state(t) for s, t in manager._tables.items()},
        "public_tables": alloc.sequence_block_tables,
        "swapped": {s: _table_state(t) for s, t in manager._swapped.items()},
        "cpu_free": list(manager._cpu_free),
        "prefix": dict(manager._prefix.items()),
        "prefix_counters": (manager._prefix.queries, manager._prefix.hits),
        "copy_log": alloc.copy_log,
        "stats": alloc.stats(),
    }
    if alloc.k_caches:
        state["k"] = [c.clone() for c in alloc.k_caches]
        state["v"] = [c.clone() for c in alloc.v_caches]
    if alloc.store.cpu_kv is not None:
        state["cpu_kv"] = [alloc.store.cpu_kv.clone()]
    return state


def assert_same_state(before: Dict[str, Any], after: Dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key in ("k", "v", "cpu_kv"):
            for a, b in zip(before[key], after[key], strict=True):
                assert torch.equal(a, b), f"{key} cache changed"
        else:
            assert before[key] == after[key], f"{key} changed: {before[key]} -> {after[key]}"


def kv_for(tokens, num_heads: int, head_dim: int, layer: int = 0):
    """K/V that depend on each token's whole prefix, as a real model's do (so cache hits are checkable)."""
    k, v = _kv_for(tuple(tokens), num_heads, head_dim, layer)
    return k.clone(), v.clone()


@functools.lru_cache(maxsize=4096)
def _kv_for(tokens, num_heads, head_dim, layer):
    out = torch.empty(len(tokens), num_heads, head_dim)
    ramp = torch.arange(num_heads * head_dim, dtype=torch.float32).reshape(num_heads, head_dim) / 64
    acc = 0
    for i, t in enumerate(tokens):
        acc = (acc * 31 + t + 1) % 1009
        out[i] = acc + layer * 0.5 + ramp
    return out, -out
