"""Checks of exercise 09, paged attention: gathering K, the reference decode, online-softmax states and their merge.

Expected values come from the library: ``make_paged_batch`` (sequences scattered over shuffled
blocks, every slot no sequence owns poisoned with NaN), ``gather_kv`` and
``paged_attention_reference``. The online-softmax states of tasks 09.3 and 09.4 are computed
here in a few lines of float32 torch (the library's kernel keeps the same state, in base 2,
on the GPU), and their final outputs are checked against ``torch.softmax`` attention. Task
09.4's check builds its inputs with this module's states, never with the learner's 09.3.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..attention import gather_kv, paged_attention_reference
from ..attention.testing import make_paged_batch
from ._common import call_learner, fail, passed

State = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (m, l, acc)


def _brief(t: torch.Tensor) -> str:
    """A tensor in a failure message: shape and dtype, and the values when there are few."""
    if t.numel() <= 8:
        return f"tensor({[round(float(x), 5) for x in t.flatten()]}, shape={tuple(t.shape)}, dtype={t.dtype})"
    return f"tensor of shape {tuple(t.shape)}, dtype {t.dtype}"


def _off_by(got: torch.Tensor, want: torch.Tensor) -> str:
    """How far a tensor of the right shape is from the expected one."""
    if bool(torch.isnan(got.float()).any()):
        return f"{_brief(got)} containing NaN"
    return f"{_brief(got)}, max |got - expected| = {(got.float() - want.float()).abs().max().item():.3g}"


def _as_tensor(value: Any, call: str, what: str, expected: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    raise fail(call, expected, value, f"{what} must be a torch.Tensor (or a number)")


# --------------------------------------------------------------------------- 09.1
def _gather_cases() -> Iterator[Tuple[str, torch.Tensor, torch.Tensor, int, List[int]]]:
    """(what, k_cache, block_table_row, seq_len, positions)."""
    a = make_paged_batch([10, 3, 17], num_q_heads=2, num_kv_heads=2, head_dim=16, block_size=4, seed=1)
    yield "every position in order", a.k_cache, a.block_tables[0], 10, list(range(10))
    yield "positions in reverse", a.k_cache, a.block_tables[2], 17, list(range(16, -1, -1))
    yield "one position", a.k_cache, a.block_tables[1], 3, [2]
    yield "the edges of blocks", a.k_cache, a.block_tables[0], 10, [3, 4, 7, 8, 0]
    yield "a repeated position", a.k_cache, a.block_tables[2], 17, [5, 5, 16]
    yield "no positions", a.k_cache, a.block_tables[0], 10, []
    b = make_paged_batch([33, 5], num_q_heads=3, num_kv_heads=3, head_dim=8, block_size=16, spare_blocks=4,
                         pad_columns=3, seed=2)
    yield "a sliding window, table padded with -1", b.k_cache, b.block_tables[0], 33, list(range(28, 33))
    c = make_paged_batch([6, 2], num_q_heads=1, num_kv_heads=1, head_dim=4, block_size=1, seed=3)
    yield "block size 1", c.k_cache, c.block_tables[0], 6, [5, 0, 3]


def check_gather_k_at(gather_k_at: Callable[[torch.Tensor, torch.Tensor, List[int]], torch.Tensor]) -> None:
    """Task 09.1: ``gather_k_at(k_cache, block_table_row, positions)`` -> ``[kv_heads, len(positions), head_dim]``."""
    for what, cache, row, seq_len, positions in _gather_cases():
        want = gather_kv(cache, row, seq_len)[:, positions]
        call = (f"gather_k_at(k_cache of shape {tuple(cache.shape)}, block_table_row={row.tolist()}, "
                f"positions={positions})   [{what}]")
        got = call_learner(gather_k_at, (cache, row, list(positions)), call, _brief(want))
        if not isinstance(got, torch.Tensor):
            raise fail(call, _brief(want), got, "return a torch.Tensor")
        if tuple(got.shape) != tuple(want.shape):
            raise fail(call, _brief(want), _brief(got),
                       "the result is [kv_heads, len(positions), head_dim]: heads first, then one row per position")
        if got.dtype != cache.dtype:
            raise fail(call, _brief(want), _brief(got), "keep the cache's dtype")
        if not torch.equal(got, want):
            wrong = (got != want).flatten(2).any(dim=2).any(dim=0)  # per position
            column = int(torch.nonzero(wrong)[0, 0])
            shown = f"{_brief(got)}, first wrong at positions[{column}] = {positions[column]}"
            if bool(torch.isnan(got).any()):
                hint = ("you read a slot that holds no token (unused slots hold NaN here): position p lives in "
                        "block block_table_row[p // block_size], at offset p % block_size")
            else:
                hint = ("position p lives in block block_table_row[p // block_size], at offset p % block_size; "
                        "the blocks of a sequence are scattered, not consecutive")
            raise fail(call, _brief(want), shown, hint)
    passed("09.1")


# --------------------------------------------------------------------------- 09.2
def _decode_with_mapping(batch: Any, scale: float, kv_head_of: Callable[[int, int, int], int]) -> torch.Tensor:
    """Decode attention with a chosen query-head -> K/V-head mapping (to name a wrong GQA mapping)."""
    q = batch.q
    q_heads, kv_heads = q.shape[1], batch.k_cache.shape[1]
    out = torch.zeros_like(q)
    for i, n in enumerate(batch.seq_lens.tolist()):
        if n == 0:
            continue
        k = gather_kv(batch.k_cache, batch.block_tables[i], n)
        v = gather_kv(batch.v_cache, batch.block_tables[i], n)
        for h in range(q_heads):
            kv = kv_head_of(h, q_heads, kv_heads)
            out[i, h] = torch.softmax((k[kv] @ q[i, h]) * scale, dim=0) @ v[kv]
    return out


def _decode_cases() -> Iterator[Tuple[str, Any, Optional[float]]]:
    common = dict(block_size=4, seed=4)
    yield ("one query head per K/V head", make_paged_batch([5, 16, 1], num_q_heads=2, num_kv_heads=2,
                                                           head_dim=16, **common), None)
    gqa = make_paged_batch([1, 17, 33, 64], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                           spare_blocks=2, pad_columns=2, seed=5)
    yield "grouped-query attention, 4 query heads per K/V head", gqa, None
    yield ("one K/V head for all query heads, an empty sequence",
           make_paged_batch([7, 0, 12], num_q_heads=4, num_kv_heads=1, head_dim=16, **common), None)
    yield ("block size 1, 2 query heads per K/V head",
           make_paged_batch([9, 20], num_q_heads=6, num_kv_heads=3, head_dim=16, block_size=1, seed=6), None)
    yield "a scale given by the caller", gqa, 0.3


def check_paged_decode_attention(paged_decode_attention: Callable[..., torch.Tensor]) -> None:
    """Task 09.2: ``paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None)``."""
    for what, b, scale in _decode_cases():
        used = 1.0 / math.sqrt(b.q.shape[-1]) if scale is None else scale
        want = paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, used)
        call = (f"paged_decode_attention(q {tuple(b.q.shape)}, k_cache/v_cache {tuple(b.k_cache.shape)}, "
                f"block_tables={b.block_tables.tolist()}, seq_lens={b.seq_lens.tolist()}"
                + (")" if scale is None else f", scale={scale})") + f"   [{what}]")
        kwargs = {} if scale is None else {"scale": scale}
        got = call_learner(paged_decode_attention, (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens), call,
                    _brief(want), **kwargs)
        if not isinstance(got, torch.Tensor):
            raise fail(call, _brief(want), got, "return a torch.Tensor")
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise fail(call, _brief(want), _brief(got), "return q's shape [num_seqs, num_q_heads, head_dim] and dtype")
        if torch.allclose(got, want, atol=1e-5, rtol=1e-5):
            continue
        empty = [i for i, n in enumerate(b.seq_lens.tolist()) if n == 0]
        if not bool(torch.isfinite(got[[i for i in range(len(got)) if i not in empty]]).all()):
            hint = ("NaN or inf in the output: you read slots past a sequence's last token (the tail of its last "
                    "block holds NaN here) or followed a -1 entry of the block table; use only its first "
                    "seq_len tokens")
        elif empty and not torch.equal(got[empty], want[empty]):
            hint = "a sequence of length 0 attends to nothing: its output row is all zeros"
        elif torch.allclose(got, _decode_with_mapping(b, used, lambda h, hq, hk: h % hk), atol=1e-5, rtol=1e-5):
            hint = ("consecutive query heads share a K/V head: query head h uses K/V head h // (num_q_heads // "
                    "num_kv_heads), not h % num_kv_heads")
        elif scale is not None and torch.allclose(
                got, paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens,
                                               1.0 / math.sqrt(b.q.shape[-1])), atol=1e-5, rtol=1e-5):
            hint = "use the scale argument when it is given; 1/sqrt(head_dim) only when it is None"
        elif torch.allclose(got, _decode_with_mapping(b, 1.0, lambda h, hq, hk: h // (hq // hk)),
                            atol=1e-5, rtol=1e-5):
            hint = "multiply the scores by the scale, 1/sqrt(head_dim) by default, before the softmax"
        else:
            hint = ("for each sequence: gather its first seq_len keys and values through its block table, "
                    "scores = (K @ q) * scale for each query head, softmax over the keys, weighted sum of V")
        raise fail(call, _brief(want), _off_by(got, want), hint)
    passed("09.2")


# --------------------------------------------------------------------------- 09.3
def _state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> State:
    """The online-softmax state of one query over a chunk of keys: (max score, sum of exp, weighted sum)."""
    if k.shape[0] == 0:
        return torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(v.shape[-1])
    s = (k.float() @ q.float()) * scale
    m = s.max()
    p = torch.exp(s - m)
    return m, p.sum(), p @ v.float()


def _state_cases() -> Iterator[Tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, float]]:
    gen = torch.Generator().manual_seed(9)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    yield "10 keys", randn(16), randn(10, 16), randn(10, 16), 0.25
    yield "one key", randn(16), randn(1, 16), randn(1, 16), 0.25
    yield "no keys", randn(8), torch.zeros(0, 8), torch.zeros(0, 8), 0.3
    yield "scores in the hundreds (exp overflows float32 past 88)", 40 * randn(16), randn(7, 16), randn(7, 16), 1.0
    yield "all scores far below zero", -40 * torch.ones(8), torch.ones(5, 8), randn(5, 8), 1.0
    yield "head_dim 8, scale 1", randn(8), randn(33, 8), randn(33, 8), 1.0


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return False
    same_inf = (a == b) & torch.isinf(b)
    return bool((same_inf | torch.isclose(a, b, rtol=1e-5, atol=1e-5)).all())


def _show_state(state: Sequence[Any]) -> str:
    parts = [_brief(x) if isinstance(x, torch.Tensor) else repr(x) for x in state]
    return "(m=" + parts[0] + ", l=" + parts[1] + ", acc=" + parts[2] + ")"


def _unpack(got: Any, call: str, want: State) -> State:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise fail(call, _show_state(want), got, "return a tuple (m, l, acc)")
    m = _as_tensor(got[0], call, "m", _show_state(want))
    l = _as_tensor(got[1], call, "l", _show_state(want))
    acc = _as_tensor(got[2], call, "acc", _show_state(want))
    return m, l, acc


def check_partial_softmax_state(partial_softmax_state: Callable[..., Any]) -> None:
    """Task 09.3: ``partial_softmax_state(q, k, v, scale)`` -> ``(m, l, acc)`` of one chunk of keys."""
    for what, q, k, v, scale in _state_cases():
        want = _state(q, k, v, scale)
        call = f"partial_softmax_state(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, scale={scale})   [{what}]"
        got = _unpack(call_learner(partial_softmax_state, (q.clone(), k.clone(), v.clone(), scale), call,
                            _show_state(want)), call, want)
        shapes_ok = got[0].numel() == 1 and got[1].numel() == 1 and tuple(got[2].shape) == tuple(want[2].shape)
        if not shapes_ok:
            raise fail(call, _show_state(want), _show_state(got),
                       "m and l are single numbers (0-dim tensors); acc has head_dim entries")
        m, l, acc = got[0].reshape(()), got[1].reshape(()), got[2]
        if _close(m, want[0]) and _close(l, want[1]) and _close(acc, want[2]):
            continue
        if k.shape[0] == 0:
            hint = ("with no keys the state is m = -inf (no score seen yet), l = 0, acc = zeros(head_dim), "
                    "so that merging it with another state changes nothing")
        elif not (bool(torch.isfinite(l)) and bool(torch.isfinite(acc).all())):
            hint = "exp of a large score overflows: subtract the chunk's maximum score m before taking exp"
        elif _close(acc, want[2] / want[1]):
            hint = "acc is the unnormalised weighted sum, sum(exp(s - m) * v); do not divide by l"
        elif not _close(m, want[0]):
            hint = "m is the largest scaled score of the chunk, max((k @ q) * scale)"
        else:
            hint = "with s = (k @ q) * scale and m = max(s): l = sum(exp(s - m)), acc = exp(s - m) @ v"
        raise fail(call, _show_state(want), _show_state(got), hint)
    passed("09.3")


# --------------------------------------------------------------------------- 09.4
def _merge_ref(a: State, b: State) -> State:
    m = torch.maximum(a[0], b[0])
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(a[0] - safe), torch.exp(b[0] - safe)
    return m, wa * a[1] + wb * b[1], wa[..., None] * a[2] + wb[..., None] * b[2]


def _stack(states: Sequence[State]) -> State:
    return tuple(torch.stack([s[i] for s in states]) for i in range(3))  # type: ignore[return-value]


def _merge_cases() -> Iterator[Tuple[str, State, State, Optional[torch.Tensor]]]:
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
    """Task 09.4: ``merge_softmax_states(a, b)`` -> the state of both chunks' keys together."""
    for what, a, b, output in _merge_cases():
        want = _merge_ref(a, b)
        call = f"merge_softmax_states(a={_show_state(a)}, b={_show_state(b)})   [{what}]"
        a_in = tuple(t.clone() for t in a)
        b_in = tuple(t.clone() for t in b)
        got = _unpack(call_learner(merge_softmax_states, (a_in, b_in), call, _show_state(want)), call, want)
        m, l, acc = got
        if m.shape != want[0].shape or l.shape != want[1].shape or acc.shape != want[2].shape:
            raise fail(call, _show_state(want), _show_state(got),
                       "the merged m and l have the shape of the inputs' m and l; acc has theirs plus head_dim")
        good = _close(m, want[0]) and _close(l, want[1]) and _close(acc, want[2])
        if good and output is not None:
            good = _close(acc / l[..., None], output)
        if good:
            continue
        broken = bool(torch.isnan(m).any()) or not (bool(torch.isfinite(l).all()) and bool(torch.isfinite(acc).all()))
        both_empty = bool((torch.isinf(a[0]) & torch.isinf(b[0])).any())
        if broken and both_empty:
            hint = ("NaN: when both states are empty, m = -inf and exp(-inf - (-inf)) is NaN; give an empty "
                    "state (m = -inf) the weight 0 without computing that difference (torch.where helps)")
        elif broken:
            hint = ("NaN or inf from an overflow: never take exp of a max score on its own; weigh each state "
                    "by exp(m_j - m) with m = max(m_a, m_b), which is at most 1")
        elif _close(l, a[1] + b[1]):
            hint = ("each state's l and acc are relative to its own max; rescale both by exp(m_j - m), "
                    "m = max(m_a, m_b), before adding them")
        elif not _close(m, want[0]):
            hint = "the merged m is the larger of the two maxima, torch.maximum(m_a, m_b)"
        else:
            hint = "l = exp(m_a - m) * l_a + exp(m_b - m) * l_b, and acc the same with acc_a and acc_b"
        raise fail(call, _show_state(want), _show_state(got), hint)
    passed("09.4")
