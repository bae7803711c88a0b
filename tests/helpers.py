"""Helpers shared by the allocator tests: a full snapshot of allocator state, to prove failures change nothing."""

from __future__ import annotations

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
