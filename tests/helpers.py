"""Helpers shared by the allocator tests: a full snapshot of allocator state, to prove failures change nothing."""

from __future__ import annotations

import functools
from typing import Any, Dict

import torch

from paged_kv_lib import PagedKVCacheAllocator


def snapshot(alloc: PagedKVCacheAllocator) -> Dict[str, Any]:
    """Everything observable about an allocator, tensors included (cloned)."""
    state: Dict[str, Any] = {
        "free": alloc.free_blocks,
        "blocks": [(b.block_id, b.ref_count, b.block_hash) for b in alloc.blocks],
        "tables": {s: (t.block_ids, t.num_tokens) for s, t in alloc.sequence_block_tables.items()},
        "stats": alloc.stats(),
    }
    if alloc.k_caches:
        state["k"] = [c.clone() for c in alloc.k_caches]
        state["v"] = [c.clone() for c in alloc.v_caches]
    for name in ("swapped_state", "prefix_cache_state"):
        getter = getattr(alloc, "_" + name, None)
        if callable(getter):
            state[name] = getter()
    return state


def assert_same_state(before: Dict[str, Any], after: Dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key in ("k", "v"):
            for a, b in zip(before[key], after[key]):
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
