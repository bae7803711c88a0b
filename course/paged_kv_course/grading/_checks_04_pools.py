"""What the checks of exercise 04 share: allocators in scattered states, engine steps over them, and
strict tensor comparisons that name a known mistake when a wrong answer matches it."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Tuple

import torch

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_lib.block import cdiv
from ._common import expect_tensor, fail, is_tensor

Tables = List[List[int]]

SWAPPED = ("block and offset are swapped (`%` where `//` belongs, and the other way round): this is not an "
            "off by one; ask which of the two grows by one every block_size positions")


def pools(num_heads: int = 1, head_dim: int = 1, dtype: torch.dtype = torch.float32,
           cache: bool = False) -> List[PagedKVCacheAllocator]:
    """Allocators in scattered states: sequences allocated, grown, freed, one with a block reserved ahead."""
    pools = []
    for seed, block_size, num_blocks in ((1, 4, 16), (2, 1, 12), (3, 3, 14), (4, 8, 10), (5, 2, 20)):
        rng = random.Random(seed)
        alloc = PagedKVCacheAllocator(num_blocks, block_size, num_heads, head_dim, dtype,
                                      allocate_cache=cache, enable_prefix_caching=False)
        next_id = 0
        for _ in range(14):
            action = rng.random()
            live = list(alloc.seq_ids)
            if action < 0.45 or not live:
                tokens = rng.randrange(0, 3 * block_size + 2)
                if alloc.can_allocate(tokens):
                    alloc.allocate_for_sequence(next_id, tokens)
                    next_id += 1
            elif action < 0.8:
                seq = rng.choice(live)
                grow = rng.randrange(1, 2 * block_size + 1)
                if alloc.blocks_to_append(seq, grow) <= alloc.num_free_blocks:
                    alloc.append_tokens(seq, grow)
            else:
                alloc.free_sequence(rng.choice(live))
        live = [s for s in alloc.seq_ids
                if 0 < alloc.get_num_tokens(s) == len(alloc.get_block_mapping(s)) * block_size]
        if live and alloc.num_free_blocks:
            alloc.append_block_to_sequence(live[0])  # a block reserved ahead, holding no token yet
        if not alloc.seq_ids or alloc.num_free_blocks == 0:
            alloc.free_sequence(alloc.seq_ids[0])
        alloc.allocate_for_sequence(next_id, 1 if alloc.num_free_blocks else 0)
        pools.append(alloc)
    return pools


def steps(alloc: PagedKVCacheAllocator, rng: random.Random) -> List[Tuple[List[int], List[int], List[int]]]:
    """Steps over the pool's sequences: (seq_ids, num_computed, num_new) mixing prefill, chunk and decode."""
    ids = list(alloc.seq_ids)
    steps = []
    for order in (ids, ids[::-1], ids[:1], rng.sample(ids, len(ids)), []):
        done, new = [], []
        for seq in order:
            n = alloc.get_num_tokens(seq)
            kind = rng.choice(("prefill", "decode", "chunk"))
            if kind == "prefill" or n == 0:
                c = 0
            elif kind == "decode":
                c = n - 1
            else:
                c = rng.randrange(0, n)
            done.append(c)
            new.append(n - c)
        steps.append((list(order), done, new))
    return steps


def mistake(got: Any, variants: Dict[str, Any]) -> Optional[str]:
    """The name of the first known mistake whose result ``got`` equals, if any."""
    for hint, value in variants.items():
        if is_tensor(got) and is_tensor(value) and got.shape == value.shape and got.dtype == value.dtype:
            if torch.equal(got, value):
                return hint
    return None


def check_tensor(call: str, want: torch.Tensor, got: Any, variants: Dict[str, torch.Tensor], hint: str,
                  dtype_hint: str) -> None:
    """``got`` must equal ``want`` exactly; a known mistake is named in the hint."""
    if is_tensor(got) and got.dtype != want.dtype:
        raise fail(call, want, got, dtype_hint)
    expect_tensor(call, got, dtype=want.dtype, shape=tuple(want.shape),
                  hint=mistake(got, variants) or f"the result needs shape {tuple(want.shape)}; {hint}")
    if not torch.equal(got, want):
        raise fail(call, want, got, mistake(got, variants) or hint)


def unchanged(call: str, given: Any, original: Any, what: str) -> None:
    equal = torch.equal(given, original) if is_tensor(original) else given == original
    if not equal:
        raise fail(f"{call}  then {what}", original, given,
                   f"your function modified its input {what}; it must only read it")


def blocks_for(tokens: int, block_size: int) -> int:
    return cdiv(tokens, block_size)
