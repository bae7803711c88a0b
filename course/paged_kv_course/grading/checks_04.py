"""Checks of exercise 04, address translation for a whole engine step.

The tasks go past lesson 04, which translates one sequence at a time: the slot mapping of
a step that mixes prefills, chunks and decodes; the padded block tables and lengths the
attention kernel receives; a K/V write that skips padding slots (-1); and a batched gather
into a zero-padded tensor that refuses to read padding. Every expected value comes from
the library (``PagedKVCacheAllocator.slot_mapping``, ``block_table_tensor``, ``read_kv``,
``cache_ops.write_slots``) on allocators driven into scattered states. When a wrong answer
matches a common mistake, the hint names that mistake.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Sequence

import torch

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_lib.kv_cache import write_slots
from ._checks_04_pools import SWAPPED, Tables, blocks_for, check_tensor, pools, steps, unchanged
from ._checks_04_reading import check_gather_batch, check_read_tokens
from ._common import call_learner, expect_raises, fail, passed, show

__all__ = ["check_gather_batch", "check_read_tokens", "check_step_block_tables",
           "check_step_slot_mapping", "check_write_kv_padded"]


# --------------------------------------------------------------------------- 04.1
def _step_slots(alloc: PagedKVCacheAllocator, seq_ids: Sequence[int], done: Sequence[int],
                new: Sequence[int]) -> torch.Tensor:
    parts = [alloc.slot_mapping(s, list(range(c, c + n))) for s, c, n in zip(seq_ids, done, new) if n]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def _slots_variants(tables: Tables, done: List[int], new: List[int], bs: int) -> Dict[str, torch.Tensor]:
    """What common wrong answers return for one step."""
    def slots(first: Callable[[int], int], logical_only: bool = False, index_offset: bool = False) -> torch.Tensor:
        out = []
        for table, c, n in zip(tables, done, new):
            for i, p in enumerate(range(first(c), first(c) + n)):
                block = p // bs
                if logical_only:
                    out.append(p)
                elif 0 <= block < len(table):
                    out.append(table[block] * bs + (i if index_offset else p) % bs)
                else:
                    return torch.full((1,), -99)
        return torch.tensor(out, dtype=torch.int64)
    # The index-offset mistake comes first: on a step of prefills and of decodes one token into a block it
    # answers exactly as "num_computed - 1" does, and it is the one a learner who numbers new tokens makes.
    return {
        "the block is right but the offset in the block comes from the token's position in the sequence, "
        "not from its index among the step's new tokens": slots(lambda c: c, index_offset=True),
        "off by one: the step's first new token is at position num_computed, not num_computed + 1":
            slots(lambda c: c + 1),
        "off by one: the step's first new token is at position num_computed, not num_computed - 1":
            slots(lambda c: max(c - 1, 0)),
        "the positions restart at 0 for every sequence: a decode token sits after the num_computed stored ones":
            slots(lambda c: 0),
        "these are the logical positions: a slot goes through the block table to the physical block":
            slots(lambda c: c, logical_only=True),
        **_swapped_variant(tables, done, new, bs),
    }


def _swapped_variant(tables: Tables, done: List[int], new: List[int], bs: int) -> Dict[str, torch.Tensor]:
    """The slots of a solution that takes the block from ``p % bs`` and the offset from ``p // bs``."""
    out = []
    for table, c, n in zip(tables, done, new):
        for p in range(c, c + n):
            if not 0 <= p % bs < len(table):
                return {}
            out.append(table[p % bs] * bs + p // bs)
    return {SWAPPED: torch.tensor(out, dtype=torch.int64)}


def check_step_slot_mapping(my_step_slot_mapping: Callable[..., torch.Tensor]) -> None:
    """Task 04.1: ``my_step_slot_mapping(tables, num_computed, num_new, block_size)`` -> int64 slots of the step."""
    hint = ("one slot per new token: sequences in the order given, each sequence's new positions in increasing "
            "order; compare your slots with the tables above")
    rng = random.Random(41)
    for alloc in pools():
        bs = alloc.block_size
        for seq_ids, done, new in steps(alloc, rng):
            tables = [alloc.get_block_mapping(s) for s in seq_ids]
            want = _step_slots(alloc, seq_ids, done, new)
            given = ([list(t) for t in tables], list(done), list(new), bs)
            call = f"my_step_slot_mapping({tables}, num_computed={done}, num_new={new}, block_size={bs})"
            got = call_learner(my_step_slot_mapping, given, call, want)
            check_tensor(call, want, got, _slots_variants(tables, done, new, bs), hint,
                          "slots are int64 (torch.tensor of an empty list is float32: give the dtype)")
            unchanged(call, list(given[:3]), [tables, done, new], "tables, num_computed, num_new")
        # A step that reaches past a table's last block: the allocator has not grown that sequence yet.
        for seq in alloc.seq_ids:
            table = alloc.get_block_mapping(seq)
            capacity = len(table) * bs
            for c, n in ((capacity, 1), (max(capacity - 1, 0), 2)):
                call = f"my_step_slot_mapping([{table}], num_computed=[{c}], num_new=[{n}], block_size={bs})"
                expect_raises(my_step_slot_mapping, ([list(table)], [c], [n], bs), call, ValueError,
                              f"position {c + n - 1} needs {blocks_for(c + n, bs)} blocks and the table has "
                              f"{len(table)}: a position past the table's last block must raise ValueError, "
                              "not read whatever the index lands on")
    passed("04.1")


# --------------------------------------------------------------------------- 04.2
def check_step_block_tables(my_step_block_tables: Callable[..., Any]) -> None:
    """Task 04.2: ``my_step_block_tables(tables, num_computed, num_new, block_size, max_blocks=None)``."""
    hint = "row i is table i, padded on the right with -1 up to the width; seq_lens[i] is its length after the step"
    rng = random.Random(42)
    for alloc in pools():
        bs = alloc.block_size
        for seq_ids, done, new in steps(alloc, rng):
            tables = [alloc.get_block_mapping(s) for s in seq_ids]
            longest = max((len(t) for t in tables), default=0)
            for max_blocks in (None, longest + 2):
                want_tables = alloc.block_table_tensor(seq_ids, max_blocks=max_blocks)
                want_lens = torch.tensor([c + n for c, n in zip(done, new)], dtype=torch.int32)
                given = [[list(t) for t in tables], list(done), list(new), bs]
                extra = "" if max_blocks is None else f", max_blocks={max_blocks}"
                call = f"my_step_block_tables({tables}, num_computed={done}, num_new={new}, block_size={bs}{extra})"
                args = tuple(given) if max_blocks is None else (*given, max_blocks)
                got = call_learner(my_step_block_tables, args, call, (want_tables, want_lens))
                if type(got) is not tuple or len(got) != 2:
                    raise fail(call, (want_tables, want_lens), got, "return a tuple (block_tables, seq_lens)")
                zero_padded = want_tables.clamp(min=0) if (want_tables < 0).any() else None
                variants = {} if zero_padded is None else {
                    "the padding is 0, a real block id: a kernel that reads it reads another sequence's "
                    "K/V; pad with -1": zero_padded}
                check_tensor(call + "[0]", want_tables, got[0], variants, hint,
                              "block tables are int32, the dtype attention kernels take")
                check_tensor(call + "[1]", want_lens, got[1], {
                    "off by one: the length after the step counts the step's new tokens, all of them":
                        want_lens - 1,
                    "these are the lengths before the step: the step's own tokens are attended to too":
                        torch.tensor(done, dtype=torch.int32),
                }, "seq_lens[i] = tokens stored after this step", "seq_lens are int32")
                unchanged(call, given, [tables, done, new, bs], "arguments")
            if longest:
                call = f"my_step_block_tables({tables}, ..., block_size={bs}, max_blocks={longest - 1})"
                expect_raises(my_step_block_tables, ([list(t) for t in tables], done, new, bs, longest - 1), call,
                              ValueError, "a max_blocks smaller than the longest table would cut a table off")
        seq = alloc.seq_ids[0]
        table = alloc.get_block_mapping(seq)
        call = f"my_step_block_tables([{table}], num_computed=[{len(table) * bs}], num_new=[1], block_size={bs})"
        expect_raises(my_step_block_tables, ([list(table)], [len(table) * bs], [1], bs), call, ValueError,
                      "this length needs one block more than the table has: raise ValueError (the allocator "
                      "must grow the sequence before the step)")
    passed("04.2")


# --------------------------------------------------------------------------- 04.3
def check_write_kv_padded(my_write_kv: Callable[..., None]) -> None:
    """Task 04.3: ``my_write_kv(k_cache, v_cache, slot_mapping, k, v)``: in place, slots of -1 skipped."""
    gen = torch.Generator().manual_seed(43)
    shapes = ((6, 3, 4, 5, torch.float32), (5, 1, 1, 3, torch.float32), (4, 2, 8, 2, torch.float16),
              (3, 2, 2, 4, torch.bfloat16))
    for num_blocks, heads, bs, dim, dtype in shapes:
        total = num_blocks * bs
        perm = torch.randperm(total, generator=gen)
        pad = torch.tensor([-1, -1], dtype=torch.int64)
        slot_sets = [
            perm[:5], torch.cat([perm[:3], pad]),                      # a batch padded at the end
            torch.cat([perm[:1], pad[:1], perm[1:4]]),                  # a token that stores nothing
            torch.tensor([total - 1]), torch.zeros(0, dtype=torch.int64), pad, perm,
        ]
        for slots in slot_sets:
            k_cache = torch.randn(num_blocks, heads, bs, dim, generator=gen).to(dtype)
            v_cache = torch.randn(num_blocks, heads, bs, dim, generator=gen).to(dtype)
            k = torch.randn(len(slots), heads, dim, generator=gen).to(dtype)
            v = torch.randn(len(slots), heads, dim, generator=gen).to(dtype)
            keep = slots >= 0
            want_k, want_v = k_cache.clone(), v_cache.clone()
            write_slots(want_k, want_v, slots[keep], k[keep], v[keep])
            swapped = {"k_cache": k_cache.clone(), "v_cache": v_cache.clone()}
            write_slots(swapped["k_cache"], swapped["v_cache"], slots[keep], v[keep], k[keep])
            before_k, before_v = k_cache.clone(), v_cache.clone()
            args = (k_cache, v_cache, slots.clone(), k.clone(), v.clone())
            call = (f"my_write_kv(k_cache of shape {tuple(k_cache.shape)} ({dtype}), v_cache, "
                    f"slot_mapping={show(slots)}, k of shape {tuple(k.shape)}, v)")
            call_learner(my_write_kv, args, call, None)
            for name, want, got in (("k_cache", want_k, args[0]), ("v_cache", want_v, args[1])):
                if torch.equal(got, want):
                    continue
                if bool(keep.any()) and name == "k_cache" and torch.equal(got, before_k):
                    raise fail(f"{call}  then {name}", f"a {name} with new vectors at slots {slots[keep].tolist()}",
                               f"a {name} left unchanged", "the new vectors never reached the cache you were given: "
                               "write into it in place (a new tensor is lost when the function returns)")
                wrong = sorted({b * bs + o for b, o in (got != want).any(dim=1).any(dim=-1).nonzero().tolist()})
                before = before_k if name == "k_cache" else before_v
                untouched = [s for s in wrong if torch.equal(got[s // bs, :, s % bs], before[s // bs, :, s % bs])]
                if 0 in untouched and 0 in slots.tolist():
                    hint = ("slot 0 is a real slot (block 0, offset 0) and a token goes there, but it was left "
                            "as it was: only -1 marks padding")
                elif untouched == wrong and set(wrong) <= set(slots[keep].tolist()):
                    hint = (f"slots {untouched[:10]} were left as they were although a token goes there: every "
                            "slot other than -1 is written")
                elif (slots < 0).any() and total - 1 in wrong and total - 1 not in slots.tolist():
                    hint = (f"slot {total - 1}, the last slot of the pool, changed although no token goes there: "
                            "a padding slot -1 was used as an index, and -1 counts from the end")
                elif not set(wrong) & set(slots[keep].tolist()) or set(wrong) - set(slots.tolist()):
                    hint = ("slots that should not change did: a slot s is block s // block_size, offset "
                            "s % block_size, and this layout keeps the heads between the two")
                elif torch.equal(got, swapped[name]):
                    hint = f"{name} received the other tensor's vectors: K goes to k_cache, V to v_cache"
                else:
                    hint = "the right slots changed, with the wrong values: token i's vectors go to slot_mapping[i]"
                first = wrong[0]
                where = f"{name}[{first // bs}, :, {first % bs}, :]"
                raise fail(f"{call}  then {where} (slot {first})", want[first // bs, :, first % bs, :],
                           got[first // bs, :, first % bs, :],
                           f"{name} differs at slots {wrong[:10]}; new vectors belong at slots "
                           f"{slots[keep].tolist()}, every other slot stays as it was. {hint}")
            if not (torch.equal(args[2], slots) and torch.equal(args[3], k) and torch.equal(args[4], v)):
                raise fail(call + "  then slot_mapping, k, v", "unchanged", "changed",
                           "your function modified its inputs; only the caches may change")
    passed("04.3")
