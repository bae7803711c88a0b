"""Checks of exercise 04, address translation: slot mapping, block-table tensor, writing and gathering K/V.

Expected values come from the library: ``PagedKVCacheAllocator.slot_mapping``,
``block_table_tensor`` and ``read_kv`` on allocators driven into scattered states, and
``cache_ops.write_slots`` on copies of the same caches.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch

from ..cache_ops import write_slots
from ._common import call_learner, expect_raises, fail, passed
from .checks_02 import _scenarios


def _t(x: torch.Tensor) -> str:
    """A short, readable rendering of a tensor argument for a failure message."""
    values = x.tolist() if x.numel() <= 24 else f"<{x.numel()} values>"
    return f"tensor({values}, dtype={x.dtype})" if x.dim() <= 1 else f"<tensor of shape {tuple(x.shape)}>"


def _expect_tensor(call: str, want: torch.Tensor, got: Any, hint: str, exact: bool = True) -> None:
    if not isinstance(got, torch.Tensor):
        raise fail(call, _t(want), got, "return a torch.Tensor")
    if got.dtype != want.dtype:
        raise fail(call + ".dtype", want.dtype, got.dtype, f"return a {want.dtype} tensor")
    if tuple(got.shape) != tuple(want.shape):
        raise fail(call + ".shape", tuple(want.shape), tuple(got.shape), hint)
    same = torch.equal(got, want) if exact else torch.allclose(got, want)
    if not same:
        if got.dim() > 1:
            rows = (got != want).flatten(1).any(dim=1).nonzero().flatten().tolist()
            raise fail(call, f"a tensor of shape {tuple(want.shape)}",
                       f"the right shape, but wrong values at index {rows[:8]} of the first dimension", hint)
        raise fail(call, _t(want), _t(got), hint)


# --------------------------------------------------------------------------- 04.1
def check_slot_mapping(my_slot_mapping: Callable[[List[int], int, torch.Tensor, int], torch.Tensor]) -> None:
    """Task 04.1: ``my_slot_mapping(block_ids, num_tokens, positions, block_size)``: slots of positions, checked."""
    hint = "slot = block_ids[position // block_size] * block_size + position % block_size"
    gen = torch.Generator().manual_seed(4)
    for alloc in _scenarios():
        bs = alloc.block_size
        for seq_id, table in alloc.sequence_block_tables.items():
            n = table.num_tokens
            cases = [torch.arange(n), torch.arange(n).flip(0), torch.zeros(0, dtype=torch.int64)]
            if n:
                cases += [torch.randint(0, n, (7,), generator=gen), torch.tensor([n - 1])]
            for positions in cases:
                want = alloc.slot_mapping(seq_id, positions)
                ids, given = list(table.block_ids), positions.clone()
                call = f"my_slot_mapping({ids}, num_tokens={n}, positions={_t(positions)}, block_size={bs})"
                got = call_learner(my_slot_mapping, (ids, n, given, bs), call, _t(want))
                _expect_tensor(call, want, got, hint + "; one slot per position, in the same order")
                if ids != table.block_ids or not torch.equal(given, positions):
                    raise fail(call + "  then its arguments", "unchanged", f"{ids}, {_t(given)}",
                               "only read block_ids and positions")
            capacity = len(table.block_ids) * bs
            for bad in sorted({n, capacity, -1} - set(range(n))):
                positions = torch.tensor(list(range(min(n, 2))) + [bad])
                call = f"my_slot_mapping({table.block_ids}, num_tokens={n}, positions={_t(positions)}, block_size={bs})"
                expect_raises(my_slot_mapping, (list(table.block_ids), n, positions, bs), call, ValueError,
                               "every position must hold a token: 0 <= position < num_tokens (not the capacity "
                               "of the blocks); raise ValueError otherwise, before computing anything")
    passed("04.1")


# --------------------------------------------------------------------------- 04.2
def check_block_table_tensor(my_block_table_tensor: Callable[..., torch.Tensor]) -> None:
    """Task 04.2: ``my_block_table_tensor(tables, max_blocks=None)``: int32, padded with -1."""
    hint = ("one row per table, in the given order, each padded on the right with -1 to the width "
            "(the longest table, or max_blocks when given)")
    for alloc in _scenarios():
        seq_ids = list(alloc.seq_ids)
        for ids in (seq_ids, seq_ids[::-1], seq_ids[:1], []):
            tables = [alloc.get_block_mapping(s) for s in ids]
            longest = max((len(t) for t in tables), default=0)
            for max_blocks in (None, longest, longest + 3):
                want = alloc.block_table_tensor(ids, max_blocks=max_blocks)
                given = [list(t) for t in tables]
                call = f"my_block_table_tensor({tables}" + ("" if max_blocks is None else f", max_blocks={max_blocks}") + ")"
                args = (given,) if max_blocks is None else (given, max_blocks)
                got = call_learner(my_block_table_tensor, args, call, want.tolist())
                _expect_tensor(call, want, got, hint + "; an empty list of tables gives shape (0, width)")
                if given != tables:
                    raise fail(call + "  then the tables", tables, given,
                               "pad a copy of each row (t + [-1] * k), not the caller's lists")
            if longest:
                tables = [alloc.get_block_mapping(s) for s in ids]
                call = f"my_block_table_tensor({tables}, max_blocks={longest - 1})"
                expect_raises(my_block_table_tensor, ([list(t) for t in tables], longest - 1), call, ValueError,
                               "a max_blocks smaller than the longest table would cut a table: raise ValueError")
    passed("04.2")


# --------------------------------------------------------------------------- 04.3
def check_write_kv(my_write_kv: Callable[..., None]) -> None:
    """Task 04.3: ``my_write_kv(k_cache, v_cache, slots, k, v)`` stores K/V at slots, in place."""
    hint = ("slot s is block s // block_size, offset s % block_size: k_cache[block, :, offset, :] = k[i] "
            "(the heads sit between the block and the offset in this layout)")
    gen = torch.Generator().manual_seed(7)
    for num_blocks, heads, bs, dim in ((6, 3, 4, 5), (5, 1, 1, 3), (4, 2, 8, 2)):
        total = num_blocks * bs
        slot_sets = [torch.randperm(total, generator=gen)[:5], torch.arange(total).flip(0)[: bs + 1],
                     torch.tensor([total - 1]), torch.zeros(0, dtype=torch.int64), torch.randperm(total, generator=gen)]
        for slots in slot_sets:
            k_cache = torch.randn(num_blocks, heads, bs, dim, generator=gen)
            v_cache = torch.randn(num_blocks, heads, bs, dim, generator=gen)
            k = torch.randn(len(slots), heads, dim, generator=gen)
            v = torch.randn(len(slots), heads, dim, generator=gen)
            want_k, want_v = k_cache.clone(), v_cache.clone()
            write_slots(want_k, want_v, slots, k, v)
            before_k, before_v = k_cache.clone(), v_cache.clone()
            args = (k_cache, v_cache, slots.clone(), k.clone(), v.clone())
            call = (f"my_write_kv(k_cache of shape {tuple(k_cache.shape)}, v_cache, slots={_t(slots)}, "
                    f"k of shape {tuple(k.shape)}, v)")
            call_learner(my_write_kv, args, call, None)
            for name, want, got, before in (("k_cache", want_k, args[0], before_k), ("v_cache", want_v, args[1], before_v)):
                if len(slots) and torch.equal(got, before):
                    raise fail(f"{call}  then {name}", f"{name} with new vectors at slots {slots.tolist()}",
                               f"{name} unchanged", "write into the tensors you were given (in place, with "
                               "indexed assignment); a new tensor is lost when the function returns")
                if not torch.equal(got, want):
                    wrong = (got != want).any(dim=1).any(dim=-1).nonzero().tolist()
                    where = [b * bs + o for b, o in wrong][:8]
                    raise fail(f"{call}  then {name}", f"{name} with the new vectors at slots {slots.tolist()} "
                               "and every other slot unchanged", f"differences at slots {where}",
                               hint + ("; write v into v_cache" if name == "v_cache" else ""))
            if not (torch.equal(args[2], slots) and torch.equal(args[3], k) and torch.equal(args[4], v)):
                raise fail(call + "  then slots, k, v", "unchanged", "changed", "only write into the caches")
    passed("04.3")


# --------------------------------------------------------------------------- 04.4
def check_gather_tokens(my_gather_tokens: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> None:
    """Task 04.4: ``my_gather_tokens(cache, block_ids, num_tokens)``: a sequence's K in position order."""
    hint = ("take cache[block_ids] ([blocks, heads, block_size, dim]), put the slot axis next to the block axis "
            "(permute(0, 2, 1, 3)), flatten them into one token axis, and keep the first num_tokens")
    gen = torch.Generator().manual_seed(9)
    for alloc in _scenarios(num_heads=3, head_dim=5, allocate_cache=True):
        for seq_id in alloc.seq_ids:
            n = alloc.get_num_tokens(seq_id)
            alloc.write_kv(seq_id, range(n), torch.randn(n, 3, 5, generator=gen), torch.randn(n, 3, 5, generator=gen))
        for seq_id in alloc.seq_ids:
            n = alloc.get_num_tokens(seq_id)
            ids = alloc.get_block_mapping(seq_id)
            for cache, want in zip((alloc.k_cache, alloc.v_cache), alloc.read_kv(seq_id)):
                given = cache.clone()
                block_ids = torch.tensor(ids, dtype=torch.int64)
                call = (f"my_gather_tokens(cache of shape {tuple(cache.shape)}, block_ids={_t(block_ids)}, "
                        f"num_tokens={n})")
                got = call_learner(my_gather_tokens, (given, block_ids, n), call, f"a tensor of shape {tuple(want.shape)}")
                _expect_tensor(call, want, got, hint)
                if not torch.equal(given, cache):
                    raise fail(call + "  then the cache", "unchanged", "changed", "only read the cache")
    passed("04.4")
