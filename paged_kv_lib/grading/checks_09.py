"""Checks of exercise 09, paged attention: two pieces of a Triton decode kernel, the split-K merge, split-K decode.

Tasks 09.1 and 09.2 are ``@triton.jit`` functions the learner writes for the exercise's decode
kernel skeleton (``triton_decode.py``); the learner's notebook wraps each in a launcher
(``run_decode_skeleton`` with the learner's piece and the library's other piece), and the checks
call that launcher on small batches from ``make_paged_batch``: sequences scattered over shuffled
blocks, every slot no sequence owns poisoned with NaN, grouped-query heads, ragged lengths. The
expected output is ``paged_attention_reference``. On a failure the check replays the skeleton in
plain torch with the common mistakes planted (one block too far, the wrong grouped-query head, an
online softmax without rescaling, ...) to name the mistake, and points at the sequence, query head
and token where the output first goes wrong. Tasks 09.3 and 09.4 are plain PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..attention import paged_attention_reference
from ..attention.testing import TOLERANCES, PagedBatch, make_paged_batch
from ._common import call_learner, fail, is_tensor, passed, show

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (m, l, acc)
BLOCK_N = 8  # the skeleton's tile (triton_decode.BLOCK_N; kept here so importing checks needs no triton)


def _describe(b: PagedBatch) -> str:
    return (f"q {tuple(b.q.shape)} {str(b.q.dtype).replace('torch.', '')}, caches {tuple(b.k_cache.shape)} "
            f"(num_blocks, kv_heads, block_size, head_dim), block_tables={b.block_tables.tolist()}, "
            f"seq_lens={b.seq_lens.tolist()}")


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-element closeness at the dtype's tolerance (NaN never close)."""
    tol = TOLERANCES[dtype]
    return torch.isclose(got.float(), want.float(), atol=tol["atol"], rtol=tol["rtol"])


# --------------------------------------------------------------------------- the skeleton, replayed in torch
Addr = Callable[[list[int], int, int, int, int], tuple[int, int, int, bool]]


def _right_addr(row: list[int], p: int, n: int, bs: int, h: int, group: int) -> tuple[int, int, int, bool]:
    return row[p // bs], p % bs, h // group, p < n


_ADDRESS_MISTAKES: list[tuple[str, Callable[..., tuple[int, int, int, bool]]]] = [
    ("one block too far: every token is read from the block after its own",
     lambda row, p, n, bs, h, g: (row[p // bs + 1], p % bs, h // g, p < n)),
    ("off by one at a block boundary: the last token of each block is looked up in the next block",
     lambda row, p, n, bs, h, g: (row[(p + 1) // bs], p % bs, h // g, p < n)),
    ("the blocks of a sequence are scattered over the pool, not consecutive after its first block",
     lambda row, p, n, bs, h, g: (row[0] + p // bs, p % bs, h // g, p < n)),
    ("the slot inside the block is wrong: every token of a block is read from the same slot",
     lambda row, p, n, bs, h, g: (row[p // bs], 0, h // g, p < n)),
    ("block and slot are swapped",
     lambda row, p, n, bs, h, g: (row[p % bs], p // bs, h // g, p < n)),
    (("the wrong grouped-query head: consecutive query heads share one K/V head, so query heads "
     "0..GROUP-1 all read K/V head 0"),
     lambda row, p, n, bs, h, g: (row[p // bs], p % bs, h % g, p < n)),
    ("tokens at or past seq_len are read: the tail of the last block holds no token (NaN here)",
     lambda row, p, n, bs, h, g: (row[p // bs], p % bs, h // g, True)),
]


def _fold_right(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> State:
    m_new = torch.maximum(m, s.max())
    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    alpha, p = torch.exp(m - safe), torch.exp(s - safe)
    return m_new, alpha * l + p.sum(), alpha * acc + p @ v


def _fold_no_rescale(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> State:
    m_new = torch.maximum(m, s.max())
    p = torch.exp(s - m_new)
    return m_new, l + p.sum(), acc + p @ v


def _fold_no_max(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> State:
    p = torch.exp(s)
    return torch.maximum(m, s.max()), l + p.sum(), acc + p @ v


def _fold_rescale_l_only(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor,
                         v: torch.Tensor) -> State:
    m_new = torch.maximum(m, s.max())
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
    return m_new, alpha * l + p.sum(), acc + p @ v


_FOLD_MISTAKES = [
    (("online softmax without rescaling: when a tile raises the running maximum, what l and acc summed "
     "so far is still relative to the old maximum"), _fold_no_rescale),
    ("only l is rescaled when the maximum grows; acc was summed under the old maximum too", _fold_rescale_l_only),
    ("the exponentials overflow: exp of a raw score passes float32's range (about 88) in this case",
     _fold_no_max),
]


def _replay(b: PagedBatch, scale: float, addr: Callable[..., tuple[int, int, int, bool]] = _right_addr,
            fold: Callable[..., State] = _fold_right) -> torch.Tensor:
    """The skeleton kernel in torch: same tiles, same masking of unreadable rows, float32."""
    num_blocks, kv_heads, bs, d = b.k_cache.shape
    q_heads = b.q.shape[1]
    group = q_heads // kv_heads
    # The skeleton reads flat element offsets: a wrong slot or head lands in some other row of the cache.
    k_rows, v_rows = b.k_cache.float().reshape(-1, d), b.v_cache.float().reshape(-1, d)
    out = torch.zeros(b.q.shape, dtype=torch.float32)
    pad = [-1] * (BLOCK_N + 2)
    for i, n in enumerate(b.seq_lens.tolist()):
        row = b.block_tables[i].tolist() + pad
        for h in range(q_heads):
            q = b.q[i, h].float()
            m, l, acc = torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(d)
            for start in range(0, n, BLOCK_N):
                ks, vs, ok = [], [], []
                for p in range(start, start + BLOCK_N):
                    blk, slot, kvh, valid = addr(row, p, n, bs, h, group)
                    flat = (blk * kv_heads + kvh) * bs + slot  # row index in [num_blocks * kv_heads * bs, d]
                    valid = valid and 0 <= blk < num_blocks and 0 <= flat < k_rows.shape[0]
                    ks.append(k_rows[flat] if valid else torch.zeros(d))
                    vs.append(v_rows[flat] if valid else torch.zeros(d))
                    ok.append(valid)
                k, v = torch.stack(ks), torch.stack(vs)
                s = torch.where(torch.tensor(ok), (k @ q) * scale, torch.tensor(float("-inf")))
                m, l, acc = fold(m, l, acc, s, v)
            out[i, h] = acc / torch.where(l > 0, l, torch.ones_like(l))  # as the skeleton divides
    return out


def _matches(got: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> bool:
    both_nan = torch.isnan(got.float()) & torch.isnan(other)
    return bool((both_nan | _close(got, other.to(dtype), dtype)).all())


# --------------------------------------------------------------------------- cases of 09.1 and 09.2
def _kernel_cases() -> Iterator[tuple[str, PagedBatch, float | None]]:
    yield ("2 query heads per K/V head, tiles spanning two blocks",
           make_paged_batch([5, 16, 1, 23], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                            spare_blocks=2, pad_columns=2, seed=21), None)
    yield ("blocks larger than a tile, an empty sequence, 3 query heads per K/V head",
           make_paged_batch([17, 0, 30], num_q_heads=6, num_kv_heads=2, head_dim=8, block_size=16,
                            spare_blocks=1, pad_columns=1, seed=22), 0.4)
    yield ("block size 1, every query head on one K/V head",
           make_paged_batch([9, 3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=1, seed=23), None)
    big = make_paged_batch([20, 31], num_q_heads=2, num_kv_heads=2, head_dim=16, block_size=4,
                           pad_columns=1, seed=24)
    big.q = big.q * 60  # scores reach 175: a plain exp overflows float32
    yield "large scores (over 100): exp overflows float32 past 88", big, None
    yield ("bfloat16, 4 query heads per K/V head",
           make_paged_batch([12, 26], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=8,
                            dtype=torch.bfloat16, seed=25), None)


def _first_wrong(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> tuple[int, int] | None:
    bad = ~_close(got, want, dtype).all(dim=-1)  # [num_seqs, q_heads]
    where = torch.nonzero(bad)
    return None if len(where) == 0 else (int(where[0, 0]), int(where[0, 1]))


def _one_sequence(b: PagedBatch, i: int, length: int) -> PagedBatch:
    return PagedBatch(b.q[i:i + 1], b.k_cache, b.v_cache, b.block_tables[i:i + 1],
                      torch.tensor([length], dtype=torch.int32), [], [])


def _first_wrong_token(launch: Callable[..., torch.Tensor], b: PagedBatch, i: int, h: int,
                       scale: float, call: str) -> int | None:
    """Binary search for the shortest prefix of sequence ``i`` whose output (head ``h``) is wrong."""
    dtype = b.q.dtype
    lo, hi = 1, int(b.seq_lens[i])  # the answer lies in [lo, hi]; hi is known wrong
    while lo < hi:
        mid = (lo + hi) // 2
        probe = _one_sequence(b, i, mid)
        want = paged_attention_reference(probe.q, probe.k_cache, probe.v_cache, probe.block_tables,
                                         probe.seq_lens, scale)
        got = call_learner(launch, (probe.q, probe.k_cache, probe.v_cache, probe.block_tables, probe.seq_lens,
                                    scale), call, "a tensor")
        if not is_tensor(got) or tuple(got.shape) != tuple(want.shape):
            return None
        if bool(_close(got[0, h], want[0, h], dtype).all()):
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def _check_decode_launcher(launch: Callable[..., torch.Tensor], task: str, name: str,
                           mistakes: Sequence[tuple[str, Callable[..., Any]]], kind: str) -> None:
    for what, b, scale in _kernel_cases():
        used = 1.0 / math.sqrt(b.q.shape[-1]) if scale is None else scale
        want = paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, used)
        call = f"{name}({_describe(b)}, scale={used:g})   [{what}]"
        got = call_learner(launch, (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, used), call, want)
        if not is_tensor(got) or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise fail(call, want, got, "the launcher returns the kernel's output, shaped and typed like q: "
                                        "did the cell change it?")
        wrong = _first_wrong(got, want, b.q.dtype)
        if wrong is None:
            continue
        i, h = wrong
        group = b.q.shape[1] // b.k_cache.shape[1]
        where = (f"first wrong: sequence {i} (seq_len {int(b.seq_lens[i])}), query head {h} "
                 f"(K/V head {h // group})")
        named = None
        for mistake, variant in mistakes:
            other = _replay(b, used, **{kind: variant})
            if _matches(got, other, b.q.dtype):
                named = mistake
                break
        token = _first_wrong_token(launch, b, i, h, used, call) if named is None or kind == "addr" else None
        if token is not None:
            bs = b.k_cache.shape[2]
            if kind == "addr":
                logical = token // bs
                where += (f"; its output is right up to seq_len {token} and wrong from {token + 1}: token {token} "
                          f"is the first read wrong (logical block {logical}, which the block table maps to "
                          f"physical block {int(b.block_tables[i, logical])}, slot {token % bs})")
            else:
                where += (f"; its output is right up to seq_len {token} and wrong from {token + 1} (tile "
                          f"{token // BLOCK_N}, tiles of {BLOCK_N} tokens)")
        got_nan = bool(torch.isnan(got[i, h].float()).any())
        if named is not None:
            hint = named
        elif got_nan and kind == "addr":
            hint = "NaN: a row was read that holds no token of this sequence (unused slots hold NaN here)"
        elif got_nan:
            hint = "NaN or inf from the fold: check what happens when a score is large, or -inf (a masked row)"
        else:
            hint = ("the rows read are not this query head's keys at these positions" if kind == "addr"
                    else "the folded state does not give softmax attention over every tile seen")
        raise fail(f"{call}\n  {where}", want[i, h], got[i, h], hint)
    passed(task)


def check_tile_addresses(decode_with_my_addresses: Callable[..., torch.Tensor]) -> None:
    """Task 09.1: the skeleton kernel with the learner's ``tile_addresses`` gives reference attention."""
    _check_decode_launcher(decode_with_my_addresses, "09.1", "decode_with_my_addresses", _ADDRESS_MISTAKES, "addr")


def check_fold_tile(decode_with_my_fold: Callable[..., torch.Tensor]) -> None:
    """Task 09.2: the skeleton kernel with the learner's ``fold_tile`` gives reference attention."""
    _check_decode_launcher(decode_with_my_fold, "09.2", "decode_with_my_fold", _FOLD_MISTAKES, "fold")


# --------------------------------------------------------------------------- 09.3
def _state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> State:
    """The online-softmax state of one query over a chunk of keys: (max score, sum of exp, weighted sum)."""
    if k.shape[0] == 0:
        return torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(v.shape[-1])
    s = (k.float() @ q.float()) * scale
    m = s.max()
    p = torch.exp(s - m)
    return m, p.sum(), p @ v.float()


def _state_close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return False
    same_inf = (a == b) & torch.isinf(b)
    return bool((same_inf | torch.isclose(a, b, rtol=1e-5, atol=1e-5)).all())


def _show_state(state: Sequence[Any]) -> str:
    return "(m=" + show(state[0]) + ",\n l=" + show(state[1]) + ",\n acc=" + show(state[2]) + ")"


def _unpack(got: Any, call: str, want: State) -> State:
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(is_tensor(x) for x in got):
        raise fail(call, _show_state(want), got, "return a tuple of three tensors (m, l, acc)")
    return got[0], got[1], got[2]


def _merge_ref(a: State, b: State) -> State:
    m = torch.maximum(a[0], b[0])
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(a[0] - safe), torch.exp(b[0] - safe)
    return m, wa * a[1] + wb * b[1], wa[..., None] * a[2] + wb[..., None] * b[2]


def _stack(states: Sequence[State]) -> State:
    return tuple(torch.stack([s[i] for s in states]) for i in range(3))  # type: ignore[return-value]


def _merge_cases() -> Iterator[tuple[str, State, State, torch.Tensor | None]]:
    """(what, state a, state b, the attention output of the union of their keys or None)."""
    gen = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    d, scale = 16, 0.25
    q, k, v = randn(d), randn(20, d), randn(20, d)
    full = torch.softmax((k @ q) * scale, 0) @ v
    a, b = _state(q, k[:7], v[:7], scale), _state(q, k[7:], v[7:], scale)
    yield "keys 0-6 and 7-19", a, b, full
    yield "the same two chunks, the other way round", b, a, full
    # The second chunk's scores are about 100 above the first's: without rescaling, or with exp(m)
    # taken on its own, the first chunk's weights are wrong or overflow.
    k_far = k.clone()
    k_far[10:] += 400 * q / (q @ q)  # adds 400 * scale = 100 to those scores
    far = torch.softmax((k_far @ q) * scale, 0) @ v
    yield ("chunks whose scores differ by about 100", _state(q, k_far[:10], v[:10], scale),
           _state(q, k_far[10:], v[10:], scale), far)
    empty = _state(q, k[:0], v[:0], scale)
    yield "an empty chunk first", empty, _state(q, k, v, scale), full
    yield "an empty chunk second", _state(q, k, v, scale), empty, full
    yield "two empty chunks", empty, empty, None
    # A batch of 4 heads at once: m and l of shape [4], acc [4, d]; head 2's second chunk is empty.
    heads_q, heads_k, heads_v = randn(4, d), randn(4, 12, d), randn(4, 12, d)
    cut = [5, 1, 12, 8]
    sa = _stack([_state(heads_q[h], heads_k[h, :cut[h]], heads_v[h, :cut[h]], scale) for h in range(4)])
    sb = _stack([_state(heads_q[h], heads_k[h, cut[h]:], heads_v[h, cut[h]:], scale) for h in range(4)])
    outs = torch.stack([torch.softmax((heads_k[h] @ heads_q[h]) * scale, 0) @ heads_v[h] for h in range(4)])
    yield "4 heads at once (m, l of shape [4], acc [4, 16]); one head's second chunk is empty", sa, sb, outs


def check_merge_softmax_states(merge_softmax_states: Callable[[State, State], Any]) -> None:
    """Task 09.3: ``merge_softmax_states(a, b)`` -> the state of both chunks' keys together."""
    for what, a, b, output in _merge_cases():
        want = _merge_ref(a, b)
        call = f"merge_softmax_states(a={_show_state(a)},\n b={_show_state(b)})   [{what}]"
        a_in = tuple(t.clone() for t in a)
        b_in = tuple(t.clone() for t in b)
        got = _unpack(call_learner(merge_softmax_states, (a_in, b_in), call, _show_state(want)), call, want)
        for name, given, original in zip(("a", "b"), (a_in, b_in), (a, b)):
            for part, t, t0 in zip(("m", "l", "acc"), given, original):
                if not (t.shape == t0.shape and bool(((t == t0) | (torch.isnan(t) & torch.isnan(t0))).all())):
                    raise fail(call, f"{name}'s {part} unchanged: {show(t0)}", f"{name}'s {part} after the call: "
                               f"{show(t)}", "the inputs were modified: the caller may still need a and b "
                               "(a kernel merges many splits from the same buffers); build new tensors")
        m, l, acc = got
        if m.shape != want[0].shape or l.shape != want[1].shape or acc.shape != want[2].shape:
            raise fail(call, _show_state(want), _show_state(got),
                       "the merged m and l have the shape of the inputs' m and l; acc has theirs plus head_dim")
        good = _state_close(m, want[0]) and _state_close(l, want[1]) and _state_close(acc, want[2])
        if good and output is not None:
            good = _state_close(acc / l[..., None], output)
        if good:
            continue
        broken = bool(torch.isnan(m).any()) or not (bool(torch.isfinite(l).all()) and bool(torch.isfinite(acc).all()))
        both_empty = bool((torch.isinf(a[0]) & torch.isinf(b[0])).any())
        if broken and both_empty:
            hint = ("NaN where both states are empty: m = -inf there, and exp(-inf - (-inf)) is NaN; an empty "
                    "state must weigh 0")
        elif broken:
            hint = "NaN or inf from an overflow: no weight should ever exceed 1"
        elif _state_close(l, a[1] + b[1]):
            hint = ("online softmax without rescaling: each state's l and acc are relative to its own maximum, "
                    "not to the merged one")
        elif not _state_close(m, want[0]):
            hint = "the merged m is wrong: it is the largest score over both chunks"
        else:
            hint = "l and acc must both be weighed the same way before they are added"
        raise fail(call, _show_state(want), _show_state(got), hint)
    passed("09.3")


# --------------------------------------------------------------------------- 09.4
def _split_cases() -> Iterator[tuple[str, PagedBatch, int, float | None]]:
    yield ("float32, 2 query heads per K/V head, 3 splits",
           make_paged_batch([10, 33, 1], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                            spare_blocks=2, pad_columns=2, seed=31), 3, None)
    yield ("one split (plain decode), an empty sequence, a given scale",
           make_paged_batch([7, 0, 20], num_q_heads=3, num_kv_heads=1, head_dim=8, block_size=16, seed=32), 1, 0.3)
    yield ("more splits than tokens: some chunks are empty",
           make_paged_batch([3, 5], num_q_heads=2, num_kv_heads=2, head_dim=8, block_size=2, seed=33), 4, None)
    big = make_paged_batch([40, 24], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=8, seed=34)
    big.q = big.q * 60  # scores past 88: a plain exp overflows float32
    yield "large scores (over 100), 4 splits", big, 4, None
    yield ("float16, 4 query heads per K/V head, 2 splits",
           make_paged_batch([19, 64], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                            dtype=torch.float16, pad_columns=1, seed=35), 2, None)
    yield ("bfloat16, 2 splits",
           make_paged_batch([30, 9], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                            dtype=torch.bfloat16, seed=36), 2, None)


def _decode_with_kv_head(b: PagedBatch, scale: float, kv_head_of: Callable[[int, int], int]) -> torch.Tensor:
    out = torch.zeros(b.q.shape, dtype=torch.float32)
    group = b.q.shape[1] // b.k_cache.shape[1]
    for i, n in enumerate(b.seq_lens.tolist()):
        if n:
            k, v = b.keys[i].float(), b.values[i].float()
            for h in range(b.q.shape[1]):
                kv = kv_head_of(h, group)
                out[i, h] = torch.softmax((k[kv] @ b.q[i, h].float()) * scale, 0) @ v[kv]
    return out


def check_split_k_decode(split_k_decode: Callable[..., torch.Tensor]) -> None:
    """Task 09.4: ``split_k_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale=None)``."""
    for what, b, splits, scale in _split_cases():
        used = 1.0 / math.sqrt(b.q.shape[-1]) if scale is None else scale
        want = paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, used)
        call = (f"split_k_decode({_describe(b)}, num_splits={splits}"
                + (")" if scale is None else f", scale={scale})") + f"   [{what}]")
        kwargs = {} if scale is None else {"scale": scale}
        inputs = (b.q.clone(), b.k_cache.clone(), b.v_cache.clone(), b.block_tables.clone(), b.seq_lens.clone())
        got = call_learner(split_k_decode, (*inputs, splits), call, want, **kwargs)
        if not is_tensor(got):
            raise fail(call, want, got, "return a torch.Tensor")
        if tuple(got.shape) != tuple(want.shape):
            raise fail(call, want, got, "the output is shaped like q: [num_seqs, num_q_heads, head_dim]")
        if got.dtype != b.q.dtype:
            raise fail(call, want, got, f"the result has dtype {got.dtype}, the queries {b.q.dtype}: compute in "
                                        "float32 if you like, but return the queries' dtype (the next layer "
                                        "expects it)")
        for name, given, original in zip(("q", "k_cache", "v_cache"), inputs, (b.q, b.k_cache, b.v_cache)):
            if not torch.equal(torch.nan_to_num(given), torch.nan_to_num(original)):
                raise fail(call, f"{name} unchanged", f"{name} modified", "the inputs were modified: the cache "
                           "is shared by every later step; never write into it while attending")
        ok = _close(got, want, b.q.dtype)
        if bool(ok.all()):
            continue
        i, h = (int(x) for x in torch.nonzero(~ok.all(dim=-1))[0])
        where = f"\n  first wrong: sequence {i} (seq_len {int(b.seq_lens[i])}), query head {h}"
        group = b.q.shape[1] // b.k_cache.shape[1]
        if not bool(torch.isfinite(got[i, h].float()).all()):
            hint = ("NaN or inf: a slot past a sequence's last token (NaN here) was read, an empty chunk's "
                    "-inf maximum met another -inf, or an exponential overflowed")
        elif int(b.seq_lens[i]) == 0:
            hint = "a sequence of length 0 attends to nothing: its output row is all zeros"
        elif group > 1 and _matches(got, _decode_with_kv_head(b, used, lambda hh, g, kv=b.k_cache.shape[1]: hh % kv),
                                    b.q.dtype):
            hint = ("the wrong grouped-query head: consecutive query heads share a K/V head "
                    f"(here {group} query heads per K/V head)")
        elif scale is not None and _matches(got, _decode_with_kv_head(
                b, 1.0 / math.sqrt(b.q.shape[-1]), lambda hh, g: hh // g), b.q.dtype):
            hint = "the scale argument was ignored"
        elif _matches(got, _decode_with_kv_head(b, 1.0, lambda hh, g: hh // g), b.q.dtype):
            hint = "the scores are not scaled"
        else:
            hint = ("not softmax attention over the sequence's first seq_len tokens: check each chunk's state and "
                    "how the chunks are merged")
        raise fail(call + where, want[i, h], got[i, h], hint)
    passed("09.4")
