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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..allocator import PagedKVCacheAllocator
from ..cache_ops import gather_tokens, write_slots
from ._common import (
    call_learner,
    expect_raises,
    expect_tensor,
    fail,
    is_tensor,
    passed,
    show,
)

Tables = List[List[int]]

# What a solution of exercise 04 may not lean on (interfaces.md item 1): the library's slot
# mapping, K/V writes and gathers, padded block tables and the attention references.
FORBIDDEN: Tuple[str, ...] = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.conformance.differential",
    "paged_kv_lib.conformance.engine",
    "paged_kv_lib.conformance.simulation",
    "paged_kv_lib.allocator",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.kv_store",
    "paged_kv_lib.cache_ops",
    "paged_kv_lib.attention",
    "paged_kv_lib.seed",
    "paged_kv_lib.viz.plots",  # these three hold 04.2's and 04.5's index arithmetic in other words
    "paged_kv_lib.viz.hash_chain",
    "paged_kv_lib.model",
)


# --------------------------------------------------------------------------- shared
def _pools(num_heads: int = 1, head_dim: int = 1, dtype: torch.dtype = torch.float32,
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


def _steps(alloc: PagedKVCacheAllocator, rng: random.Random) -> List[Tuple[List[int], List[int], List[int]]]:
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


def _mistake(got: Any, variants: Dict[str, Any]) -> Optional[str]:
    """The name of the first known mistake whose result ``got`` equals, if any."""
    for hint, value in variants.items():
        if is_tensor(got) and is_tensor(value) and got.shape == value.shape and got.dtype == value.dtype:
            if torch.equal(got, value):
                return hint
    return None


def _check_tensor(call: str, want: torch.Tensor, got: Any, variants: Dict[str, torch.Tensor], hint: str,
                  dtype_hint: str) -> None:
    """``got`` must equal ``want`` exactly; a known mistake is named in the hint."""
    if is_tensor(got) and got.dtype != want.dtype:
        raise fail(call, want, got, dtype_hint)
    expect_tensor(call, got, dtype=want.dtype, shape=tuple(want.shape),
                  hint=_mistake(got, variants) or f"the result needs shape {tuple(want.shape)}; {hint}")
    if not torch.equal(got, want):
        raise fail(call, want, got, _mistake(got, variants) or hint)


def _unchanged(call: str, given: Any, original: Any, what: str) -> None:
    equal = torch.equal(given, original) if is_tensor(original) else given == original
    if not equal:
        raise fail(f"{call}  then {what}", original, given,
                   f"your function modified its input {what}; it must only read it")


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


# --------------------------------------------------------------------------- 04.1
def _step_slots(alloc: PagedKVCacheAllocator, seq_ids: Sequence[int], done: Sequence[int],
                new: Sequence[int]) -> torch.Tensor:
    parts = [alloc.slot_mapping(s, list(range(c, c + n))) for s, c, n in zip(seq_ids, done, new) if n]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def _slots_variants(tables: Tables, done: List[int], new: List[int], bs: int) -> Dict[str, torch.Tensor]:
    """What common wrong answers return for one step."""
    def slots(first: Callable[[int], int], logical_only: bool = False) -> torch.Tensor:
        out = []
        for table, c, n in zip(tables, done, new):
            for p in range(first(c), first(c) + n):
                block = p // bs
                if logical_only:
                    out.append(p)
                elif 0 <= block < len(table):
                    out.append(table[block] * bs + p % bs)
                else:
                    return torch.full((1,), -99)
        return torch.tensor(out, dtype=torch.int64)
    return {
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


_SWAPPED = ("block and offset are swapped (`%` where `//` belongs, and the other way round): this is not an "
            "off by one; ask which of the two grows by one every block_size positions")


def _swapped_variant(tables: Tables, done: List[int], new: List[int], bs: int) -> Dict[str, torch.Tensor]:
    """The slots of a solution that takes the block from ``p % bs`` and the offset from ``p // bs``."""
    out = []
    for table, c, n in zip(tables, done, new):
        for p in range(c, c + n):
            if not 0 <= p % bs < len(table):
                return {}
            out.append(table[p % bs] * bs + p // bs)
    return {_SWAPPED: torch.tensor(out, dtype=torch.int64)}


def check_step_slot_mapping(my_step_slot_mapping: Callable[..., torch.Tensor]) -> None:
    """Task 04.1: ``my_step_slot_mapping(tables, num_computed, num_new, block_size)`` -> int64 slots of the step."""
    hint = ("one slot per new token: sequences in the order given, each sequence's new positions in increasing "
            "order; compare your slots with the tables above")
    rng = random.Random(41)
    for alloc in _pools():
        bs = alloc.block_size
        for seq_ids, done, new in _steps(alloc, rng):
            tables = [alloc.get_block_mapping(s) for s in seq_ids]
            want = _step_slots(alloc, seq_ids, done, new)
            given = ([list(t) for t in tables], list(done), list(new), bs)
            call = f"my_step_slot_mapping({tables}, num_computed={done}, num_new={new}, block_size={bs})"
            got = call_learner(my_step_slot_mapping, given, call, want)
            _check_tensor(call, want, got, _slots_variants(tables, done, new, bs), hint,
                          "slots are int64 (torch.tensor of an empty list is float32: give the dtype)")
            _unchanged(call, list(given[:3]), [tables, done, new], "tables, num_computed, num_new")
        # A step that reaches past a table's last block: the allocator has not grown that sequence yet.
        for seq in alloc.seq_ids:
            table = alloc.get_block_mapping(seq)
            capacity = len(table) * bs
            for c, n in ((capacity, 1), (max(capacity - 1, 0), 2)):
                call = f"my_step_slot_mapping([{table}], num_computed=[{c}], num_new=[{n}], block_size={bs})"
                expect_raises(my_step_slot_mapping, ([list(table)], [c], [n], bs), call, ValueError,
                              f"position {c + n - 1} needs {_blocks_for(c + n, bs)} blocks and the table has "
                              f"{len(table)}: a position past the table's last block must raise ValueError, "
                              "not read whatever the index lands on")
    passed("04.1")


# --------------------------------------------------------------------------- 04.2
def check_step_block_tables(my_step_block_tables: Callable[..., Any]) -> None:
    """Task 04.2: ``my_step_block_tables(tables, num_computed, num_new, block_size, max_blocks=None)``."""
    hint = "row i is table i, padded on the right with -1 up to the width; seq_lens[i] is its length after the step"
    rng = random.Random(42)
    for alloc in _pools():
        bs = alloc.block_size
        for seq_ids, done, new in _steps(alloc, rng):
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
                _check_tensor(call + "[0]", want_tables, got[0], variants, hint,
                              "block tables are int32, the dtype attention kernels take")
                _check_tensor(call + "[1]", want_lens, got[1], {
                    "off by one: the length after the step counts the step's new tokens, all of them":
                        want_lens - 1,
                    "these are the lengths before the step: the step's own tokens are attended to too":
                        torch.tensor(done, dtype=torch.int32),
                }, "seq_lens[i] = tokens stored after this step", "seq_lens are int32")
                _unchanged(call, given, [tables, done, new, bs], "arguments")
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
            before_k = k_cache.clone()
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
                if (slots < 0).any() and total - 1 in wrong and total - 1 not in slots.tolist():
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


# --------------------------------------------------------------------------- 04.4
def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values with NaN equal to NaN (the caches are NaN where no token was written)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and torch.equal(
        a.nan_to_num(0.0), b.nan_to_num(0.0))


_UNPERMUTED = ("the cache's layout is (block, head, offset, dim): the heads sit between the block and the "
               "offset, so a block's tokens are not consecutive rows of a reshape; this is not an off by one")


def _gather_variants(cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor) -> Dict[str, torch.Tensor]:
    """What a gather with a known mistake returns: blocks reshaped without moving the heads, ``%``/``//`` swapped."""
    _, heads, bs, dim = cache.shape
    longest = int(seq_lens.max()) if len(seq_lens) else 0
    flat = torch.zeros(len(seq_lens), longest, heads, dim, dtype=cache.dtype)
    swapped = flat.clone()
    swapped_ok = True
    for b, n in enumerate(seq_lens.tolist()):
        used = _blocks_for(n, bs)
        row = block_tables[b, :used].long()
        flat[b, :n] = cache[row].reshape(-1, heads, dim)[:n]
        for p in range(n):
            if p % bs >= used or p // bs >= bs:
                swapped_ok = False
                break
            swapped[b, p] = cache[row[p % bs], :, p // bs, :]
    variants = {_UNPERMUTED: flat} if heads > 1 else {}
    if swapped_ok:
        variants[_SWAPPED] = swapped
    return variants


def _diagnose_gather(call: str, got: torch.Tensor, want: torch.Tensor, cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Raise a failure naming the mistake when ``got`` differs from ``want`` (NaN equal to NaN)."""
    bs = cache.shape[2]
    if not _same_bits(got, want):
        for name, variant in _gather_variants(cache, block_tables, seq_lens).items():
            if _same_bits(got, variant):
                raise fail(call, want, got, name)
        bad = (~((got == want) | (got.isnan() & want.isnan()))).any(dim=-1).any(dim=-1).nonzero()
        row, pos = (int(x) for x in bad[0])
        n = int(seq_lens[row])
        if pos >= n:
            hint = (f"position {pos} of row {row} is past that sequence's length {n} and must be 0; "
                    "it holds what some slot no token wrote holds (NaN here): past the length, or "
                    "through a padding entry -1, you read and kept it (and 0 * NaN is NaN)")
        elif pos % bs == 0 or pos % bs == bs - 1:
            hint = (f"wrong vectors at position {pos} of row {row}, at a block boundary "
                    f"(block size {bs}): an off by one in the block or the offset")
        else:
            hint = (f"wrong vectors at position {pos} of row {row} (logical block {pos // bs}, "
                    f"offset {pos % bs}): position p of a sequence is its table's block p // "
                    "block_size at offset p % block_size")
        raise fail(call + f"[{row}, {pos}]", want[row, pos], got[row, pos], hint)


def check_gather_batch(my_gather_batch: Callable[..., torch.Tensor]) -> None:
    """Task 04.4: ``my_gather_batch(cache, block_tables, seq_lens)`` -> [num_seqs, longest, heads, dim], zero-padded."""
    gen = torch.Generator().manual_seed(44)
    rng = random.Random(44)
    heads, dim = 2, 3
    # First a small hand case where tables are long and blocks short, so that a mix-up of
    # block and offset returns wrong vectors (and is named) instead of raising an IndexError.
    cache = torch.randn(6, heads, 2, dim, generator=gen)
    cache[[0, 3]] = float("nan")  # blocks nobody holds, and the unwritten tail of block 5
    cache[5, :, 1] = float("nan")
    block_tables = torch.tensor([[4, 1, 3], [2, 5, -1]], dtype=torch.int32)
    seq_lens = torch.tensor([4, 3], dtype=torch.int32)
    want = torch.zeros(2, 4, heads, dim)
    for row, n in enumerate(seq_lens.tolist()):
        want[row, :n] = gather_tokens(cache, block_tables[row, : _blocks_for(n, 2)].long(), n)
    call = f"my_gather_batch(cache of shape {tuple(cache.shape)}, block_tables={show(block_tables)}, seq_lens={show(seq_lens)})"
    got = call_learner(my_gather_batch, (cache.clone(), block_tables.clone(), seq_lens.clone()), call, want)
    expect_tensor(call, got, dtype=want.dtype, shape=tuple(want.shape),
                  hint="one row per sequence, as long as the longest sequence (not the table width)")
    _diagnose_gather(call, got, want, cache, block_tables, seq_lens)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for alloc in _pools(heads, dim, dtype, cache=True):
            bs = alloc.block_size
            alloc.k_cache.fill_(float("nan"))  # every slot no token wrote reads as NaN
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                alloc.write_kv(seq, range(n), torch.randn(n, heads, dim, generator=gen).to(dtype),
                               torch.randn(n, heads, dim, generator=gen).to(dtype))
            cache = alloc.k_cache
            ids = list(alloc.seq_ids)
            for order in (ids, ids[::-1], rng.sample(ids, len(ids)), []):
                longest_table = max((len(alloc.get_block_mapping(s)) for s in order), default=0)
                block_tables = alloc.block_table_tensor(order, max_blocks=longest_table + rng.randrange(0, 3))
                seq_lens = torch.tensor([alloc.get_num_tokens(s) for s in order], dtype=torch.int32)
                longest = int(seq_lens.max()) if len(order) else 0
                want = torch.zeros(len(order), longest, heads, dim, dtype=dtype)
                for row, seq in enumerate(order):
                    want[row, : alloc.get_num_tokens(seq)] = alloc.read_kv(seq)[0]
                given = (cache.clone(), block_tables.clone(), seq_lens.clone())
                call = (f"my_gather_batch(cache of shape {tuple(cache.shape)} ({dtype}, NaN where no token was "
                        f"written), block_tables={show(block_tables)}, seq_lens={show(seq_lens)})")
                got = call_learner(my_gather_batch, given, call, f"a {dtype} tensor of shape {tuple(want.shape)}")
                if is_tensor(got) and got.dtype != dtype:
                    raise fail(call, f"a {dtype} tensor of shape {tuple(want.shape)}", got,
                               f"the result is {got.dtype}, the cache holds {dtype}: a result in the wrong dtype "
                               "(torch.zeros makes float32 unless told otherwise)")
                expect_tensor(call, got, dtype=dtype, shape=tuple(want.shape),
                              hint="one row per sequence, as long as the longest sequence (not the table width)")
                if not _same_bits(given[0], cache):
                    diff = ~((given[0] == cache) | (given[0].isnan() & cache.isnan()))
                    changed = diff.any(dim=1).any(dim=-1).nonzero().tolist()
                    raise fail(call + "  then the cache", "the cache unchanged",
                               f"changed at (block, offset) {changed[:8]}",
                               "your gather wrote into the cache (zeroing the unused tail of a block, say): "
                               "other sequences' K/V and the allocator's state live there; only read it")
                _unchanged(call, given[1], block_tables, "block_tables")
                _unchanged(call, given[2], seq_lens, "seq_lens")
                _diagnose_gather(call, got, want, cache, block_tables, seq_lens)
            # A length that reaches a padding entry (-1), and one that reaches past the row's width
            # in a table with no padding at all (so a test for -1 alone cannot catch it), must fail loudly.
            seq = ids[0]
            table_len = len(alloc.get_block_mapping(seq))
            padded = alloc.block_table_tensor([seq], max_blocks=table_len + 1)
            full = alloc.block_table_tensor([seq], max_blocks=table_len)
            for block_tables, bad_len, hint in (
                (padded, table_len * bs + 1,
                 "needs the row's entry -1, which is padding, not a block: raise ValueError (indexing with -1 "
                 "silently reads the cache's last block)"),
                (full, table_len * bs + 1,
                 "needs one block more than the row is wide (the width rule: this row has no -1 to "
                 "notice): raise ValueError rather than read past the row or cut the sequence short"),
            ):
                seq_lens = torch.tensor([bad_len], dtype=torch.int32)
                call = (f"my_gather_batch(cache of shape {tuple(cache.shape)}, block_tables={show(block_tables)}, "
                        f"seq_lens={show(seq_lens)})")
                expect_raises(my_gather_batch, (cache.clone(), block_tables.clone(), seq_lens), call, ValueError,
                              f"a length of {bad_len} needs {_blocks_for(bad_len, bs)} blocks and {hint}")
    passed("04.4")


# --------------------------------------------------------------------------- 04.5 (debug)
_NEGATIVE = ("a negative position was accepted: it is no token of the sequence, yet Python's negative "
             "indexing quietly found a block for it; positions below 0 must raise ValueError")


def check_read_tokens(read_tokens: Callable[..., torch.Tensor]) -> None:
    """Task 04.5 (debug): ``read_tokens(k_cache, table, positions)`` -> [len(positions), heads, dim]."""
    gen = torch.Generator().manual_seed(45)
    rng = random.Random(45)
    heads, dim = 3, 2
    for dtype in (torch.float32, torch.bfloat16):
        for alloc in _pools(heads, dim, dtype, cache=True):
            bs = alloc.block_size
            alloc.k_cache.fill_(float("nan"))
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                alloc.write_kv(seq, range(n), torch.randn(n, heads, dim, generator=gen).to(dtype),
                               torch.randn(n, heads, dim, generator=gen).to(dtype))
            cache = alloc.k_cache
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                table = alloc.get_block_mapping(seq)
                stored = alloc.read_kv(seq)[0]
                everything = list(range(n))
                picks = [everything, everything[::-1], [rng.randrange(n) for _ in range(5)] if n else [], []]
                for positions in picks:
                    want = stored[positions] if positions else torch.zeros(0, heads, dim, dtype=dtype)
                    given = (cache.clone(), list(table), list(positions))
                    call = (f"read_tokens(k_cache of shape {tuple(cache.shape)} ({dtype}), table={table}, "
                            f"positions={positions})")
                    got = call_learner(read_tokens, given, call, f"a {dtype} tensor of shape {tuple(want.shape)}")
                    expect_tensor(call, got, dtype=dtype, shape=tuple(want.shape),
                                  hint="one [heads, dim] row per position asked for, in the cache's dtype")
                    if not _same_bits(given[0], cache):
                        raise fail(call + "  then k_cache", "k_cache unchanged", "changed",
                                   "reading must not write into the cache")
                    _unchanged(call, [given[1], given[2]], [table, positions], "table, positions")
                    if _same_bits(got, want):
                        continue
                    slots = [table[p // bs] * bs + p % bs for p in positions]
                    if heads > 1 and _same_bits(got, cache.reshape(-1, heads, dim)[slots]):
                        raise fail(call, want, got, _UNPERMUTED)
                    raise fail(call, want, got, "some rows are another token's vectors: compare them position "
                                                "by position with the table")
                capacity = len(table) * bs
                for positions, hint in (
                    ([-1], _NEGATIVE),
                    ([0, -bs] if n else [-bs], _NEGATIVE),
                    ([capacity], f"position {capacity} is the first one past the table's {len(table)} blocks of "
                                 f"{bs}: it has no slot, so it must raise ValueError (look at where the bound is)"),
                    ([capacity + bs], f"position {capacity + bs} is past the table's last block: raise ValueError"),
                ):
                    call = f"read_tokens(k_cache of shape {tuple(cache.shape)}, table={table}, positions={positions})"
                    expect_raises(read_tokens, (cache.clone(), list(table), list(positions)), call, ValueError, hint)
    passed("04.5")
