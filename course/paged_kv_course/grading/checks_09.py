"""Checks of exercise 09, paged attention: a Triton decode kernel, its warm-ups, the split merge, a debug task.

* 09.1 and 09.2 (Triton warm-ups) and 09.4 (the whole kernel) launch the learner's
  ``@triton.jit`` code themselves: see :mod:`._checks_09_warmups` and :mod:`._checks_09_kernel`.
* 09.3 (PyTorch): ``merge_softmax_states``, the merge of two partial online-softmax states.
* 09.5 (debug, PyTorch): the fixed version of a provided split-K decode with three planted bugs.

A solution that uses the library code answering these tasks (the attention implementations)
earns 0 on that task (:mod:`.delegation`); ``paged_kv_course.triton_skeleton`` (the launchers)
and ``paged_kv_lib.attention.testing`` (batches to try things on) stay usable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from paged_kv_lib.attention import paged_attention_reference
from paged_kv_lib.attention.testing import PagedAttentionCase, make_paged_batch
from ._checks_09_kernel import check_paged_decode_kernel
from ._checks_09_warmups import check_fold_tile, check_tile_addresses
from ._common_given import GIVEN
from ._common_repair import check_repair
from ._common import Shown, call_learner, fail, is_tensor, passed, show
from ._common_09 import close, describe, matches


State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (m, l, acc)

__all__ = [
    "check_fold_tile",
    "check_merge_softmax_states",
    "check_paged_decode_kernel",
    "check_split_k_decode",
    "check_tile_addresses",
]


# --------------------------------------------------------------------------- 09.3
def _state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> State:
    """The online-softmax state of one query over a chunk of keys: (max score, sum of exp, weighted sum)."""
    if k.shape[0] == 0:
        return torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(v.shape[-1])
    s = (k.float() @ q.float()) * scale
    m = s.max()
    p = torch.exp(s - m)
    return m, p.sum(), p @ v.float()


def _stateclose(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return False
    same_inf = (a == b) & torch.isinf(b)
    return bool((same_inf | torch.isclose(a, b, rtol=1e-5, atol=1e-5)).all())


def _show_state(state: Sequence[Any]) -> Shown:
    return Shown("(m=" + show(state[0]) + ",\n l=" + show(state[1]) + ",\n acc=" + show(state[2]) + ")")


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
        good = _stateclose(m, want[0]) and _stateclose(l, want[1]) and _stateclose(acc, want[2])
        if good and output is not None:
            good = _stateclose(acc / l[..., None], output)
        if good:
            continue
        broken = bool(torch.isnan(m).any()) or not (bool(torch.isfinite(l).all()) and bool(torch.isfinite(acc).all()))
        both_empty = bool((torch.isinf(a[0]) & torch.isinf(b[0])).any())
        if broken and both_empty:
            hint = ("NaN where both states are empty: m = -inf there, and exp(-inf - (-inf)) is NaN; an empty "
                    "state must weigh 0")
        elif broken:
            hint = "NaN or inf from an overflow: no weight should ever exceed 1"
        elif _stateclose(l, a[1] + b[1]):
            hint = ("online softmax without rescaling: each state's l and acc are relative to its own maximum, "
                    "not to the merged one")
        elif not _stateclose(m, want[0]):
            hint = "the merged m is wrong: it is the largest score over both chunks"
        else:
            hint = "l and acc must both be weighed the same way before they are added"
        raise fail(call, _show_state(want), _show_state(got), hint)
    passed("09.3")


# --------------------------------------------------------------------------- 09.5 (debug)
def _split_cases() -> Iterator[tuple[str, PagedAttentionCase, int, float | None]]:
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


def _decode_with_kv_head(b: PagedAttentionCase, scale: float, kv_head_of: Callable[[int, int], int]) -> torch.Tensor:
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
    """Task 09.5: ``split_k_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale=None)``."""
    for what, b, splits, scale in _split_cases():
        used = 1.0 / math.sqrt(b.q.shape[-1]) if scale is None else scale
        want = paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, used)
        call = (f"split_k_decode({describe(b)}, num_splits={splits}"
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
        ok = close(got, want, b.q.dtype)
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
        elif group > 1 and matches(got, _decode_with_kv_head(b, used, lambda hh, g: hh % b.k_cache.shape[1]),
                                    b.q.dtype):
            hint = ("the wrong grouped-query head: consecutive query heads share a K/V head "
                    f"(here {group} query heads per K/V head)")
        elif scale is not None and matches(got, _decode_with_kv_head(
                b, 1.0 / math.sqrt(b.q.shape[-1]), lambda hh, g: hh // g), b.q.dtype):
            hint = "the scale argument was ignored"
        elif matches(got, _decode_with_kv_head(b, 1.0, lambda hh, g: hh // g), b.q.dtype):
            hint = "the scores are not scaled"
        else:
            hint = ("not softmax attention over the sequence's first seq_len tokens: check each chunk's state and "
                    "how the chunks are merged")
        raise fail(call + where, want[i, h], got[i, h], hint)
    check_repair(GIVEN["09.5"], split_k_decode)
    passed("09.5")
