"""Checks of exercise 04's reading tasks: 04.4, a batched gather into a zero-padded tensor with its width
rule, and 04.5, the repair of a token reader with three planted bugs. Caches are NaN wherever no token
wrote, so a read of padding or of an empty slot shows."""

from __future__ import annotations

import random
from typing import Any, Callable, Dict

import torch

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_lib.kv_cache import gather_tokens
from ._checks_04_pools import SWAPPED, blocks_for, pools, unchanged
from ._common_given import GIVEN
from ._common_repair import check_repair
from ._common import CheckFailure, call_learner, expect_raises, expect_tensor, fail, is_tensor, not_written, passed, show


def _k_cache(alloc: PagedKVCacheAllocator) -> torch.Tensor:
    """The K cache of an allocator made with ``cache=True`` (its tensors exist)."""
    assert alloc.k_cache is not None, "a pool made with cache=True has tensors"
    return alloc.k_cache


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
        used = blocks_for(n, bs)
        row = block_tables[b, :used].long()
        flat[b, :n] = cache[row].reshape(-1, heads, dim)[:n]
        for p in range(n):
            if p % bs >= used or p // bs >= bs:
                swapped_ok = False
                break
            swapped[b, p] = cache[row[p % bs], :, p // bs, :]
    variants = {_UNPERMUTED: flat} if heads > 1 else {}
    if swapped_ok:
        variants[SWAPPED] = swapped
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
        want[row, :n] = gather_tokens(cache, block_tables[row, : blocks_for(n, 2)].long(), n)
    call = f"my_gather_batch(cache of shape {tuple(cache.shape)}, block_tables={show(block_tables)}, seq_lens={show(seq_lens)})"
    got = call_learner(my_gather_batch, (cache.clone(), block_tables.clone(), seq_lens.clone()), call, want)
    expect_tensor(call, got, dtype=want.dtype, shape=tuple(want.shape),
                  hint="one row per sequence, as long as the longest sequence (not the table width)")
    _diagnose_gather(call, got, want, cache, block_tables, seq_lens)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for alloc in pools(heads, dim, dtype, cache=True):
            bs = alloc.block_size
            cache = _k_cache(alloc)
            cache.fill_(float("nan"))  # every slot no token wrote reads as NaN
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                alloc.write_kv(seq, range(n), torch.randn(n, heads, dim, generator=gen).to(dtype),
                               torch.randn(n, heads, dim, generator=gen).to(dtype))
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
                unchanged(call, given[1], block_tables, "block_tables")
                unchanged(call, given[2], seq_lens, "seq_lens")
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
                              f"a length of {bad_len} needs {blocks_for(bad_len, bs)} blocks and {hint}")
    passed("04.4")


# --------------------------------------------------------------------------- 04.5 (debug)
_NEGATIVE = "a negative position was accepted: the sequence has no position below 0, yet a row came back for it"
_EMPTY_SLOT = "its slot lies in the table's blocks, but no token was written there (the cache holds NaN in it)"


def _brief(value: Any) -> str:
    """A short description of a tensor for a failure message (shape and dtype, no values); other values shown."""
    return f"a {value.dtype} tensor of shape {tuple(value.shape)}" if is_tensor(value) else show(value)


def _row_at(t: torch.Tensor, i: int) -> str:
    return str([round(float(x), 4) for x in t[i].flatten()[:6].tolist()])


def _first_row_differing(got: torch.Tensor, want: torch.Tensor) -> int:
    """The first row where ``got`` and ``want`` differ (NaN equal to NaN); shapes and dtypes equal."""
    for i in range(len(want)):
        if not _same_bits(got[i], want[i]):
            return i
    return 0


def _refusal_hint(position: int, num_tokens: int, capacity: int, block_size: int) -> str:
    """Why ``position`` must be refused, in the words of the mistake that lets it through."""
    if position < 0:
        return _NEGATIVE
    if position == num_tokens:
        slot = f"; {_EMPTY_SLOT}" if position < capacity else ""
        return (f"off by one at the end: the sequence holds {num_tokens} tokens, so position {position} is the "
                f"first that holds none{slot}")
    if position < capacity:
        return (f"position {position} was read, but the sequence holds {num_tokens} tokens (its table has "
                f"{capacity} slots): {_EMPTY_SLOT}")
    return f"position {position} is past the table's last block of {block_size} slots"


def _read_call(cache: torch.Tensor, table: list, num_tokens: int, positions: list) -> str:
    return (f"read_tokens(k_cache of shape {tuple(cache.shape)} ({cache.dtype}, NaN where no token was written), "
            f"table={table}, num_tokens={num_tokens}, positions={positions})")


def _refused(read_tokens: Callable[..., Any], args: tuple, call: str, accepted: str, position: int) -> None:
    """The call must raise ValueError; ``accepted`` names the mistake when it returned, another error is named as such."""
    try:
        got = read_tokens(*args)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except ValueError:
        return
    except Exception as exc:
        raise fail(call, "a ValueError", f"it raised {type(exc).__name__}: {exc}",
                   f"position {position} holds no token and was refused, but with a {type(exc).__name__}: that is "
                   "what indexing past a list or a tensor raises, not the contract's refusal (a ValueError)") from None
    raise fail(call, "a ValueError", f"it returned {_brief(got)}", f"{accepted}; the contract refuses such a position")


def check_read_tokens(read_tokens: Callable[..., torch.Tensor]) -> None:
    """Task 04.5 (debug): ``read_tokens(k_cache, table, num_tokens, positions)`` -> [len(positions), heads, dim]."""
    gen = torch.Generator().manual_seed(45)
    rng = random.Random(45)
    heads, dim = 3, 2
    for dtype in (torch.float32, torch.bfloat16):
        for alloc in pools(heads, dim, dtype, cache=True):
            bs = alloc.block_size
            cache = _k_cache(alloc)
            cache.fill_(float("nan"))
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                alloc.write_kv(seq, range(n), torch.randn(n, heads, dim, generator=gen).to(dtype),
                               torch.randn(n, heads, dim, generator=gen).to(dtype))
            for seq in alloc.seq_ids:
                n = alloc.get_num_tokens(seq)
                table = alloc.get_block_mapping(seq)
                stored = alloc.read_kv(seq)[0]
                everything = list(range(n))
                picks = [everything, everything[::-1], [rng.randrange(n) for _ in range(5)] if n else [], []]
                for positions in picks:
                    want = stored[positions] if positions else torch.zeros(0, heads, dim, dtype=dtype)
                    given = (cache.clone(), list(table), n, list(positions))
                    call = _read_call(cache, table, n, positions)
                    got = call_learner(read_tokens, given, call, f"a {dtype} tensor of shape {tuple(want.shape)}")
                    if is_tensor(got) and got.dtype != dtype:
                        on = " (a read of no positions)" if not positions else ""
                        raise fail(call, _brief(want), _brief(got),
                                   f"the result came out {got.dtype} from a {dtype} cache{on}")
                    if not is_tensor(got) or tuple(got.shape) != tuple(want.shape):
                        raise fail(call, _brief(want), _brief(got),
                                   "one [heads, dim] row per position asked for, in the cache's dtype")
                    if not _same_bits(given[0], cache):
                        raise fail(call + "  then k_cache", "k_cache unchanged", "changed",
                                   "reading must not write into the cache")
                    unchanged(call, [given[1], given[2], given[3]], [table, n, positions],
                              "table, num_tokens, positions")
                    if _same_bits(got, want):
                        continue
                    slots = [table[p // bs] * bs + p % bs for p in positions]
                    i = _first_row_differing(got, want)
                    wanted = f"{_brief(want)}; row {i} (position {positions[i]}) starts {_row_at(want, i)}"
                    came = f"{_brief(got)}; row {i} starts {_row_at(got, i)}"
                    if _same_bits(got, cache.reshape(-1, heads, dim)[slots]):
                        raise fail(call, wanted, came,
                                   f"row {i} (position {positions[i]}) holds values of the right block, but not "
                                   "those of that position's slot: they belong to other heads or offsets of the block")
                    raise fail(call, wanted, came, f"row {i} (position {positions[i]}) is not that position's "
                                                   "vectors: compare the rows position by position with the table")
                capacity = len(table) * bs
                for position in dict.fromkeys((-1, -bs, capacity + bs, capacity, n + 1, capacity - 1, n)):
                    if 0 <= position < n:
                        continue
                    positions = [0, position] if n else [position]
                    call = _read_call(cache, table, n, positions)
                    _refused(read_tokens, (cache.clone(), list(table), n, positions), call,
                             _refusal_hint(position, n, capacity, bs), position)
    check_repair(GIVEN["04.5"], read_tokens)
    passed("04.5")
