"""Helpers shared by the bookkeeping tests: a full snapshot of allocator state, to prove failures change nothing."""

from __future__ import annotations

import functools
from typing import Any, Dict, Union

import torch

from paged_kv_lib import PagedKVCacheAllocator
from paged_kv_lib.block_manager import BlockManager


def snapshot(alloc: Union[PagedKVCacheAllocator, BlockManager]) -> Dict[str, Any]:
    """Everything observable about an allocator or a block manager, through public names, tensors cloned.

    Resident and swapped tables (block ids, token count, token ids, content keys, salt),
    ref counts and hashes, the free queue's order, the prefix cache's map and counters,
    the CPU pool, the copy log and, for an allocator, every device and CPU cache tensor.
    """
    state: Dict[str, Any] = {
        "free": alloc.free_blocks,
        "blocks": [(b.block_id, b.ref_count, b.block_hash) for b in alloc.blocks],
        "tables": alloc.sequence_block_tables,
        "swapped": alloc.swapped_block_tables,
        "cpu_free": alloc.free_cpu_blocks,
        "prefix": alloc.cached_blocks,
        "prefix_counters": alloc.prefix_counters,
        "copy_log": alloc.copy_log,
        "stats": alloc.stats(),
    }
    if isinstance(alloc, PagedKVCacheAllocator):
        if alloc.k_caches:
            state["k"] = [c.clone() for c in alloc.k_caches]
            state["v"] = [c.clone() for c in alloc.v_caches]
        if alloc.cache.cpu_kv is not None:
            state["cpu_kv"] = [alloc.cache.cpu_kv.clone()]
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
