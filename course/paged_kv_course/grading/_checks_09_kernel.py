"""Check of exercise 09's whole Triton task (09.4): the learner's paged decode kernel and split merge.

The check launches the learner's two ``@triton.jit`` kernels itself, through
:func:`paged_kv_course.triton_skeleton.paged_decode` (run by a probe where the learner's
objects live), on batches whose every unused byte is NaN: the unused slots of each cache, blocks
before and after the cache, a trap block past the last and the block table's padding. Cases:
ragged lengths, grouped-query heads, a sequence of length 0, blocks dropped from a table (``-1``
below ``seq_len``, so a whole tile is ``-inf``), an entry past ``num_blocks`` after a visible tile, a
table narrower than a sequence (its row runs into the next), scores over 100, 16-bit caches, 1 to 4 splits.

With more than one split it compares each split's partial state first (the chunk rule is part
of the contract), then the merged output. On a failure it replays the decode in torch with each
common mistake planted (one block too far, a dropped mask (position, ``-1``, width, ``num_blocks``), the wrong grouped-query heads, no
rescale, no ``-inf`` guard, no split, a wrong scale; for the merge: no rescale, one split only,
no guard) and names the one the learner's numbers reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from paged_kv_lib.attention import paged_attention_reference
from paged_kv_lib.attention.testing import PagedAttentionCase, make_paged_batch
from paged_kv_lib.block import cdiv
from ._common import fail, passed, run_probe
from ._common_09 import close, describe, matches, unwrap
from .probes import triton_paged_decode

BLOCK_N = 16  # the launcher's tile (triton_skeleton.BLOCK_N; restated so importing the check needs no triton)
INF = float("-inf")
WIDE_STRIDE = 2 ** 28  # the block stride of the case whose offsets pass 2**31 elements
_WIDEN = ("offsets past 2**31 elements came out wrong: block id x stride_kb passes 2**31 in this case, and in "
          "int32 it wraps around (to memory that is not the cache); widen the block id to int64 before multiplying")
_READS = {
    "query": ("the query load read rows past the last query head: the program of the last K/V head loads BLOCK_G "
              "rows where GROUP exist; mask the query load to the group's rows, as its store is masked"),
    "table": ("the block-table load read entries past a row's max_blocks entries (or past the last row): the output "
              "is right only because other masks hid what it found; mask the table load itself"),
    "outside": ("a load reached memory outside every tensor the kernel was given (on a GPU, a fault or another "
                "tensor's data): an offset is wrong or unmasked"),
}


@dataclass
class Case:
    """One launch: a batch, its splits and scale; ``holes`` are the (sequence, logical block) entries
    overwritten below ``seq_len`` (with -1, or with an id past ``num_blocks`` when a third item is given)."""

    what: str
    batch: PagedAttentionCase
    splits: int
    scale: float
    holes: tuple[tuple[Any, ...], ...] = ()
    narrow: bool = False  # the table was cut narrower than a sequence: positions past its width hold nothing
    block_stride: int = 0  # the caches' block stride the kernel is told (the launcher reads them compact)


def _case(what: str, lens: list[int], splits: int, scale: float | None = None, holes: tuple = (),
          q_times: float = 1.0, width: int | None = None, block_stride: int = 0, **shape: Any) -> Case:
    b = make_paged_batch(lens, **shape)
    if width is not None:  # rows of `width` entries: a longer sequence's row runs into the next row
        b.block_tables = b.block_tables[:, :width].contiguous()
    for i, j, *past in holes:
        # -1, or (past) an id at or above the num_blocks the kernel is told (the cache's blocks and the trap)
        b.block_tables[i, j] = b.k_cache.shape[0] + 1 if past else -1
    b.q = b.q * q_times
    return Case(what, b, splits, 1.0 / math.sqrt(b.q.shape[-1]) if scale is None else scale, holes,
                width is not None, block_stride)


def _cases() -> Iterator[Case]:
    yield _case("ragged lengths, 2 query heads per K/V head, one split", [5, 33, 1, 16], 1,
                num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, spare_blocks=2, pad_columns=1, seed=41)
    yield _case("blocks larger than a tile, an empty sequence, 3 query heads per K/V head, a given scale, 2 splits",
                [17, 0, 40], 2, 0.3, num_q_heads=6, num_kv_heads=2, head_dim=32, block_size=16, spare_blocks=1,
                pad_columns=1, seed=42)
    yield _case("rows of 3 entries (blocks of 8): sequence 0 is 40 tokens long, so its positions past 23 have "
                "no entry in its row; one split", [40, 20, 9], 1, width=3, num_q_heads=4, num_kv_heads=2,
                head_dim=16, block_size=8, seed=47)
    yield _case("an entry past num_blocks below seq_len, after a tile that is visible: sequence 0's third block; "
                "one split", [40, 33], 1, holes=((0, 2, "past"),), num_q_heads=2, num_kv_heads=1, head_dim=16,
                block_size=8, seed=48)
    yield _case("blocks dropped from the tables below seq_len: sequence 0's first entry is past num_blocks, "
                "sequence 1's last is -1, so a whole tile of each is -inf; a sequence of length 0; one split",
                [48, 20, 0], 1, holes=((0, 0, "past"), (1, 1)), num_q_heads=4,
                num_kv_heads=1, head_dim=16, block_size=16, seed=43)
    yield _case("blocks dropped (-1 below seq_len) so that split 0 of sequence 0 sees nothing; scores over 100; "
                "more splits than a short sequence has tiles; 4 splits", [64, 40, 9], 4, 1.0,
                holes=((0, 0), (0, 1), (1, 2)), q_times=8.0, num_q_heads=2, num_kv_heads=2, head_dim=16,
                block_size=8, seed=44)
    yield _case(f"blocks {WIDE_STRIDE:,} elements apart (stride_kb), so block id x stride_kb passes 2**31 from "
                "block 8 on (the launcher keeps the memory compact); one split", [40, 30, 56], 1,
                num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8, spare_blocks=12, seed=49,
                block_stride=WIDE_STRIDE)
    yield _case("bfloat16, 4 query heads per K/V head, 2 splits", [30, 50], 2, num_q_heads=8, num_kv_heads=2,
                head_dim=32, block_size=8, dtype=torch.bfloat16, seed=45)
    yield _case("float16, one query head per K/V head, an empty sequence cut into 2 splits", [0, 26], 2,
                num_q_heads=4, num_kv_heads=4, head_dim=16, block_size=4, dtype=torch.float16, pad_columns=1,
                seed=46)


def _expected_out(c: Case) -> torch.Tensor:
    """The reference on the same batch with its dropped blocks taken out (attention ignores key order)."""
    b = c.batch
    bs = b.k_cache.shape[2]
    if c.narrow:
        width = b.block_tables.shape[1]
        clamped = torch.clamp(b.seq_lens, max=width * bs).to(torch.int32)
        return paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, clamped, c.scale)
    if not c.holes:
        return paged_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, c.scale)
    rows, lens = b.block_tables.tolist(), b.seq_lens.tolist()
    for i, j, *_ in sorted(c.holes, key=lambda h: -h[1]):
        lens[i] -= max(0, min(bs, lens[i] - j * bs))
        rows[i] = rows[i][:j] + rows[i][j + 1:] + [-1]
    table = torch.tensor(rows, dtype=torch.int32)
    return paged_attention_reference(b.q, b.k_cache, b.v_cache, table, torch.tensor(lens, dtype=torch.int32),
                                     c.scale)


# --------------------------------------------------------------------------- the decode, replayed in torch
def split_tokens(seq_len: int, splits: int) -> int:
    """Tokens per split in the contract: ceil(seq_len / splits), rounded up to a multiple of BLOCK_N."""
    return cdiv(cdiv(seq_len, splits), BLOCK_N) * BLOCK_N


def _model(c: Case, mistake: str = "") -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A decode kernel in torch, as the launcher runs one (same tiles, same poisoned memory), with one
    ``mistake`` planted; returns (output before the merge or after it, partial states)."""
    b = c.batch
    q, k_cache, v_cache = b.q.float(), b.k_cache.float(), b.v_cache.float()
    num_blocks, kv_heads, bs, d = k_cache.shape
    num_seqs, q_heads = q.shape[:2]
    group, splits = q_heads // kv_heads, c.splits
    scale = {"scale_default": 1.0 / math.sqrt(d), "scale_ln2": c.scale * math.log(2), "scale_one": 1.0,
             "scale_log2e": c.scale / math.log(2)}.get(mistake, c.scale)
    kv_of = torch.arange(q_heads) % kv_heads if mistake == "gqa" else torch.arange(q_heads) // group
    width = b.block_tables.shape[1]
    part_m = torch.full((num_seqs, q_heads, splits), INF)
    part_l = torch.zeros(num_seqs, q_heads, splits)
    part_acc = torch.zeros(num_seqs, q_heads, splits, d)
    for i, n in enumerate(b.seq_lens.tolist()):
        row = b.block_tables[i].tolist()
        chunk = split_tokens(n, splits)
        for s in range(splits):
            lo, hi = (0, n) if mistake == "no_split" else (s * chunk, min(s * chunk + chunk, n))
            top, total, acc = torch.full((q_heads,), INF), torch.zeros(q_heads), torch.zeros(q_heads, d)
            for first in range(lo, hi, BLOCK_N):
                keys, vals = torch.zeros(q_heads, BLOCK_N, d), torch.zeros(q_heads, BLOCK_N, d)
                ok = torch.zeros(BLOCK_N, dtype=torch.bool)
                for t, p in enumerate(range(first, first + BLOCK_N)):
                    inside = p < hi or mistake == "no_pos_mask"
                    logical = p // bs + (1 if mistake == "far" else 0)
                    if logical < width:
                        entry = row[logical]
                    elif mistake in ("no_width_mask", "far", "no_pos_mask"):
                        entry = num_blocks  # past the row the launcher's padding holds the trap block's id
                    else:
                        inside = False  # past the row's width: no entry, nothing to read
                    entry = entry if inside else -1
                    ok[t] = (inside and (entry >= 0 or mistake == "no_block_mask")
                             and (entry < num_blocks + 1 or mistake == "no_num_blocks_mask"))
                    if ok[t]:
                        real = 0 <= entry < num_blocks  # the trap block and the guards hold NaN
                        keys[:, t] = k_cache[entry, kv_of, p % bs] if real else float("nan")
                        vals[:, t] = v_cache[entry, kv_of, p % bs] if real else float("nan")
                scores = torch.where(ok, torch.einsum("hd,htd->ht", q[i], keys) * scale, torch.tensor(INF))
                new_top = torch.maximum(top, scores.max(dim=1).values)
                ref = new_top if mistake == "no_inf_guard" else torch.where(torch.isinf(new_top), 0.0, new_top)
                shrink, w = torch.exp(top - ref), torch.exp(scores - ref[:, None])
                total = total * shrink + w.sum(dim=1)
                acc = acc * (1.0 if mistake == "no_rescale" else shrink[:, None]) + torch.einsum("ht,htd->hd", w, vals)
                top = new_top
            part_m[i, :, s], part_l[i, :, s], part_acc[i, :, s] = top, total, acc
    parts = (part_m, part_l, part_acc)
    if splits == 1:
        denominator = part_l[..., 0] if mistake == "no_zero_guard" else torch.where(part_l[..., 0] > 0,
                                                                                      part_l[..., 0], 1.0)
        return part_acc[..., 0, :] / denominator[..., None], parts
    return _merge(parts), parts


def _merge(parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], mistake: str = "") -> torch.Tensor:
    m, l_, acc = parts
    if mistake in ("merge_first", "merge_last"):
        k = 0 if mistake == "merge_first" else -1
        return acc[..., k, :] / torch.where(l_[..., k] > 0, l_[..., k], 1.0)[..., None]
    best = m.max(dim=-1).values
    ref = best if mistake == "merge_no_guard" else torch.where(torch.isinf(best), 0.0, best)
    w = torch.ones_like(m) if mistake == "merge_no_rescale" else torch.exp(m - ref[..., None])
    total = (w * l_).sum(dim=-1)
    return (w[..., None] * acc).sum(dim=-2) / torch.where(total > 0, total, 1.0)[..., None]


_DECODE_MISTAKES = [
    ("far", "one block too far: each token is read from the block the table lists after its own"),
    ("no_pos_mask", "positions at or past the end were read: the tail of a sequence's last block holds no token "
                    "(NaN here), and a split ends where the next one begins"),
    ("no_block_mask", "a table entry of -1 was dereferenced: a negative block id holds none of the sequence's "
                      "tokens (the memory before the cache holds NaN here)"),
    ("gqa", "the wrong grouped-query heads: the program of K/V head k serves GROUP consecutive query heads"),
    ("no_width_mask", "positions past the row's max_blocks entries were looked up: a row has max_blocks "
                      "entries, and what lies after it is not this sequence's"),
    ("no_rescale", "online softmax without rescaling acc: when a tile raises the running maximum, the values "
                   "summed so far are still weighed against the old maximum"),
    ("no_inf_guard", "NaN after a tile of nothing but -inf scores: with nothing seen yet the maximum is -inf, "
                     "and exp(-inf - (-inf)) is NaN; such a tile must leave the state as it was"),
    ("no_num_blocks_mask", "a table entry not below num_blocks was dereferenced: there is no such block (the "
                           "memory past the cache holds NaN here)"),
    ("no_split", "every split attended to the whole sequence: split s covers only its own chunk of tokens"),
    ("scale_default", "the scale argument was ignored: the scores were scaled by 1/sqrt(head_dim)"),
    ("scale_ln2", "the scores are scaled by scale * ln(2), not scale: exp2 of a score needs it times log2(e)"),
    ("scale_log2e", "the scores are scaled by scale * log2(e), then taken through exp rather than exp2"),
    ("scale_one", "the scores are not scaled"),
    ("no_zero_guard", "a sequence of length 0 attends to nothing: its output row is all zeros, not 0 / 0"),
]
_SIXTEEN_BITS = ("close, but not float32 close: part of the arithmetic ran in 16 bits; the contract computes "
                 "in float32 from the loads on")
_BF16_DOT = ("right in float32, wrong in bfloat16: under the interpreter tl.dot multiplies bfloat16 "
             "operands wrongly, and the contract computes in float32 from the loads on")
_MERGE_MISTAKES = [
    ("merge_no_rescale", "the merge adds the splits' sums without rescaling each to the largest maximum"),
    ("merge_first", "the merge used only the first split"),
    ("merge_last", "the merge used only the last split"),
    ("merge_no_guard", "NaN in the merge where every split is empty (all maxima -inf, all sums 0): either "
                       "exp(-inf - (-inf)) with no guard on the maximum, or 0 / 0 with no guard on the total; the "
                       "two give the same NaN, so check both; such a row's output is zeros"),
]


# --------------------------------------------------------------------------- comparing
def _same(got: torch.Tensor, want: torch.Tensor, tol: float) -> torch.Tensor:
    g, w = got.float(), want.float()
    return torch.isclose(g, w, rtol=tol, atol=tol) | ((g == w) & torch.isinf(w)) | (torch.isnan(g) & torch.isnan(w))


def _parts_ok(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], tol: float = 2e-4) -> torch.Tensor:
    """[num_seqs, q_heads, splits]: whether each split's (m, l, acc) is right."""
    return _same(got[0], want[0], tol) & _same(got[1], want[1], tol) & _same(got[2], want[2], tol).all(dim=-1)


def _state_text(parts: tuple[torch.Tensor, ...], i: int, h: int, s: int) -> str:
    acc = ", ".join(f"{x:.5g}" for x in parts[2][i, h, s].tolist()[:6])
    return (f"a partial state with max = {float(parts[0][i, h, s]):.6g}, sum = {float(parts[1][i, h, s]):.6g}, "
            f"acc = [{acc}, ...]")


def _name(c: Case, out: torch.Tensor, parts: tuple[torch.Tensor, ...], on_parts: bool) -> str | None:
    for mistake, hint in _DECODE_MISTAKES:
        model_out, model_parts = _model(c, mistake)
        if on_parts and bool(_parts_ok(parts, model_parts).all()):
            return hint
        if not on_parts and matches(out, model_out, c.batch.q.dtype):
            return hint
    return None


def check_paged_decode_kernel(paged_decode_kernel: Any, merge_splits_kernel: Any) -> None:
    """Task 09.4: the learner's decode kernel (and merge) give reference attention and the contract's partials."""
    for c in _cases():
        b = c.batch
        call = (f"paged_decode(paged_decode_kernel, merge_splits_kernel, {describe(b)}, scale={c.scale:g}, "
                f"num_splits={c.splits})   [{c.what}]")
        want = _expected_out(c)
        report = run_probe(triton_paged_decode, paged_decode_kernel, merge_splits_kernel, b.q, b.k_cache,
                           b.v_cache, b.block_tables, b.seq_lens, c.scale, c.splits, c.block_stride)
        out, parts, reads = unwrap(report, call, want, "09.4")
        if c.block_stride and (reads or not bool(close(out, want, b.q.dtype).all())):
            raise fail(call, want, out, _WIDEN)
        group = b.q.shape[1] // b.k_cache.shape[1]
        if c.splits > 1:
            _, want_parts = _model(c)
            ok = _parts_ok(parts, want_parts)
            if not bool(ok.all()):
                i, h, s = (int(x) for x in torch.nonzero(~ok)[0])
                n = int(b.seq_lens[i])
                chunk = split_tokens(n, c.splits)
                lo, hi = min(s * chunk, n), min(s * chunk + chunk, n)
                where = (f"{call}\n  first wrong partial: sequence {i} (seq_len {n}), query head {h} (K/V head "
                         f"{h // group}), split {s} of {c.splits} (tokens {lo}..{hi - 1}"
                         + (", none" if lo >= hi else "") + f"; splits of {chunk} tokens, a multiple of BLOCK_N)")
                hint = _name(c, out, parts, on_parts=True)
                if hint is None and bool(torch.isnan(parts[0]).all() & torch.isnan(parts[1]).all()):
                    hint = ("no partial state was written: with NUM_SPLITS > 1 every program leaves its split's "
                            "(max, sum, acc) in the part_* buffers, and the merge kernel combines them")
                elif hint is None and bool(_parts_ok(parts, want_parts, 3e-2).all()):
                    hint = _SIXTEEN_BITS
                elif hint is None and b.q.dtype == torch.bfloat16:
                    hint = _BF16_DOT
                raise fail(where, _state_text(want_parts, i, h, s), _state_text(parts, i, h, s),
                           hint or "this split's state is not the online-softmax state of its chunk's tokens")
        good = close(out, want, b.q.dtype)
        if bool(good.all()) and out.dtype == b.q.dtype:
            if reads:
                raise fail(call, "no load outside what the kernel may read", f"it read: {', '.join(reads)}",
                           _READS.get(str(reads[0]), "a load read memory it should not have"))
            continue
        i, h = (int(x) for x in torch.nonzero(~good.all(dim=-1))[0]) if not bool(good.all()) else (0, 0)
        where = (f"{call}\n  first wrong output: sequence {i} (seq_len {int(b.seq_lens[i])}), query head {h} "
                 f"(K/V head {h // group})")
        if c.splits > 1:
            hint = next((text for mistake, text in _MERGE_MISTAKES if matches(out, _merge(parts, mistake),
                                                                           b.q.dtype)), None)
            hint = hint or "the splits' partial states are right; the merge does not combine them into softmax"
        else:
            hint = _name(c, out, parts, on_parts=False)
            if hint is None and bool(torch.isnan(out[i, h].float()).any()):
                hint = "NaN: something was read that no mask should have let through (unused memory holds NaN here)"
            elif hint is None and b.q.dtype == torch.float32 and bool(_same(out, want, 3e-2).all()):
                hint = _SIXTEEN_BITS
            elif hint is None and b.q.dtype == torch.bfloat16:
                hint = _BF16_DOT
            hint = hint or "not softmax attention of this query head over its sequence's tokens"
        raise fail(where, want[i, h], out[i, h], hint)
    passed("09.4")


__all__ = ["check_paged_decode_kernel", "split_tokens"]
