"""Checks of exercise 09's two Triton warm-ups: a tile's addresses (09.1) and folding a tile (09.2).

Each check launches the learner's ``@triton.jit`` function itself, in a driver kernel of
:mod:`paged_kv_course.triton_skeleton` that adds nothing to what the function answers:
09.1 compares the offsets and readable flags the function gave for every position (past the
length, past the row, at a ``-1`` or out-of-range entry) with the contract, and names the
first part of the first offset that differs; 09.2 compares the running state after every tile
(large scores, an all ``-inf`` tile first and in the middle, a row of nothing but ``-inf``) and
names the mistake whose state it reproduces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._common import fail, passed, run_probe, show
from ._common_09 import unwrap
from .probes import triton_fold_tiles, triton_tile_addresses

# --------------------------------------------------------------------------- 09.1
Table = tuple[str, torch.Tensor, torch.Tensor, tuple[int, int, int, int], int]


def _address_cases() -> Iterator[Table]:
    """(what, block_tables, seq_lens, cache shape, num_q_heads)."""
    yield ("2 query heads per K/V head, ragged lengths, -1 padding in the table",
           torch.tensor([[3, 7, -1, -1], [0, 5, 2, 9], [8, -1, -1, -1], [4, 1, 6, -1]], dtype=torch.int32),
           torch.tensor([5, 16, 1, 10], dtype=torch.int32), (10, 2, 4, 16), 4)
    yield ("3 query heads per K/V head, blocks larger than a tile, an empty sequence",
           torch.tensor([[2, 0, -1], [-1, -1, -1], [1, 3, 4]], dtype=torch.int32),
           torch.tensor([17, 0, 40], dtype=torch.int32), (5, 2, 16, 8), 6)
    yield ("a -1 entry and an entry past num_blocks below seq_len, a length longer than its row",
           torch.tensor([[6, -1, 2, 11], [3, 0, 5, 1]], dtype=torch.int32),
           torch.tensor([15, 22], dtype=torch.int32), (8, 1, 4, 16), 2)
    yield ("a pool of 4,194,304 blocks, so offsets pass 2**31 elements (nothing is allocated: only the numbers)",
           torch.tensor([[2_100_000, 7, 4_194_303, -1], [1_048_576, 4_000_000, -1, -1]], dtype=torch.int32),
           torch.tensor([40, 20], dtype=torch.int32), (4_194_304, 2, 16, 64), 4)


def _expected_addresses(table: torch.Tensor, lens: torch.Tensor, shape: tuple[int, int, int, int],
                        q_heads: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    num_blocks, kv_heads, bs, d = shape
    strides = (kv_heads * bs * d, bs * d, d)
    width = table.shape[1]
    pos = torch.arange(positions)
    logical = pos // bs
    inside = logical < width
    entry = torch.where(inside[None, :], table.long()[:, logical.clamp(max=width - 1)], torch.tensor(-1))
    valid = (pos[None, :] < lens.long()[:, None]) & inside[None, :] & (entry >= 0) & (entry < num_blocks)
    kv = torch.arange(q_heads) // (q_heads // kv_heads)
    rows = entry[:, None, :] * strides[0] + kv[None, :, None] * strides[1] + (pos % bs)[None, None, :] * strides[2]
    return rows, valid[:, None, :].expand(-1, q_heads, -1)


def _why_not_readable(p: int, n: int, width: int, bs: int, entry: int, num_blocks: int) -> str:
    if p >= n:
        return f"position {p} is at or past seq_len {n}: no token is stored there (this slot holds NaN)"
    if p // bs >= width:
        return (f"position {p} is in logical block {p // bs}, past the row's table_width = {width} entries: the row "
                "has no entry for it, so what the load finds there belongs to no block of this sequence")
    if entry < 0:
        return f"position {p} is in logical block {p // bs}, whose table entry is -1: no block holds it"
    return f"position {p}'s table entry is {entry}, not below num_blocks = {num_blocks}: no such block"


def _name_offset(got: int, want_parts: tuple[int, int, int], row: list[int], p: int, h: int, group: int,
                 shape: tuple[int, int, int, int]) -> str:
    _, kv_heads, bs, d = shape
    sb, sh, st = kv_heads * bs * d, bs * d, d
    block, rest = divmod(got, sb)
    head, rest = divmod(rest, sh)
    slot, col = divmod(rest, st)
    want_block, want_head, want_slot = want_parts
    said = f"your offset {got} is block {block}, K/V head {head}, slot {slot}" + (f" (+{col})" if col else "")
    logical = p // bs
    want = want_block * sb + want_head * sh + want_slot * st
    if want >= 2 ** 31 and got != want and (got - want) % 2 ** 32 == 0:
        return (f"your offset {got} is the right one, {want}, wrapped around at 32 bits: block id x stride_kb passes "
                "2**31 here, so widen the block id (or the offset) to int64 before multiplying")
    if got == want_block * sb + want_slot * sh + want_head * st and sh != st:
        return (f"{said}; the head and slot strides are swapped: stride_kh steps from one K/V head to the next, "
                "stride_kt from one slot of a block to the next")
    if got == want_block * sb + want_head * sh + p * st and p != want_slot:
        return (f"{said}; the slot is the position itself: position {p} sits at slot {p} % BLOCK_SIZE = "
                f"{want_slot} of its block, the table having found the block")
    if block != want_block:
        if logical + 1 < len(row) and block == row[logical + 1]:
            why = "one block too far: that is the table's entry for the next logical block"
        elif (p + 1) // bs < len(row) and block == row[(p + 1) // bs] and (p + 1) % bs == 0:
            why = "off by one at a block boundary: the last slot of a block is looked up in the next one"
        elif block == row[0] + logical:
            why = "the blocks of a sequence are scattered over the pool, not consecutive after its first block"
        elif 0 <= p % bs < len(row) and block == row[p % bs]:
            why = "block and slot are swapped"
        else:
            why = f"the block is wrong: logical block {logical} maps to physical block {want_block} here"
    elif head != want_head:
        why = (f"the wrong K/V head for query head {h}: {group} consecutive query heads share one K/V head "
               f"(query heads {want_head * group}..{want_head * group + group - 1} read K/V head {want_head})")
    elif slot != want_slot or col:
        why = f"the slot inside the block is wrong: position {p} sits at slot {want_slot} of its block"
    else:
        why = "the offset is not the element offset of that key row (the strides are in elements)"
    return f"{said}; {why}"


def check_tile_addresses(tile_addresses: Any) -> None:
    """Task 09.1: ``tile_addresses`` gives every position's key-row offset and readability, per the contract."""
    for what, table, lens, shape, q_heads in _address_cases():
        num_blocks, kv_heads, bs, d = shape
        positions = table.shape[1] * bs + 16
        call = (f"tile_addresses over positions 0..{positions - 1} of block_tables={table.tolist()}, "
                f"seq_lens={lens.tolist()}, a cache of shape {shape} (num_blocks, kv_heads, block_size, head_dim), "
                f"{q_heads} query heads   [{what}]")
        want_rows, want_valid = _expected_addresses(table, lens, shape, q_heads, positions)
        got = unwrap(run_probe(triton_tile_addresses, tile_addresses, table, lens, shape, q_heads, positions),
                     call, "offsets and readable flags", "09.1")
        rows, valid = got
        rows, valid = rows[..., :positions], valid[..., :positions]
        wrong = torch.nonzero(valid != want_valid)
        group = q_heads // kv_heads
        if len(wrong):
            i, h, p = (int(x) for x in wrong[0])
            n, width = int(lens[i]), table.shape[1]
            entry = int(table[i, p // bs]) if p // bs < width else -1
            where = f"{call}\n  sequence {i} (seq_len {n}, row {table[i].tolist()}), query head {h}, position {p}"
            if bool(valid[i, h, p]):
                raise fail(where, "a position not to read", "a readable position",
                           _why_not_readable(p, n, width, bs, entry, num_blocks))
            hint = f"position {p} is token {p} of this sequence, stored in block {entry}: it must be read"
            if int(rows[i, h, p]) != int(want_rows[i, h, p]):
                hint += "; " + _name_offset(int(rows[i, h, p]), (entry, h // group, p % bs), table[i].tolist(),
                                            p, h, group, shape)
            raise fail(where, "a readable position", "a position not to read", hint)
        bad = torch.nonzero(want_valid & (rows != want_rows))
        if len(bad):
            i, h, p = (int(x) for x in bad[0])
            want = int(want_rows[i, h, p])
            parts = (int(table[i, p // bs]), h // group, p % bs)
            where = f"{call}\n  sequence {i} (row {table[i].tolist()}), query head {h}, position {p}"
            raise fail(where, want, int(rows[i, h, p]),
                       _name_offset(int(rows[i, h, p]), parts, table[i].tolist(), p, h, group, shape))
    passed("09.1")


# --------------------------------------------------------------------------- 09.2
TILE, DIM = 8, 16
Fold = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _fold_reference(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor,
                    *, rescale_l: bool = True, rescale_acc: bool = True, subtract_max: bool = True,
                    guard: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    top = torch.maximum(m, s.max())
    if not subtract_max:
        base = torch.zeros_like(top)
    else:
        base = torch.where(torch.isinf(top), torch.zeros_like(top), top) if guard else top
    w = torch.exp(s - base)
    shrink = torch.exp(m - base)
    return (top, (shrink if rescale_l else 1.0) * l + w.sum(),
            (shrink if rescale_acc else 1.0) * acc + w @ v)


_FOLD_MISTAKES: list[tuple[str, dict[str, bool]]] = [
    ("online softmax without rescaling: when a tile raises the running maximum, what l and acc summed so far "
     "is still relative to the old maximum", dict(rescale_l=False, rescale_acc=False)),
    ("only l is rescaled when the maximum grows; acc was summed under the old maximum too", dict(rescale_acc=False)),
    ("only acc is rescaled when the maximum grows; l was summed under the old maximum too", dict(rescale_l=False)),
    ("the exponentials overflow: exp of a raw score passes float32's range (about 88) in this case",
     dict(subtract_max=False)),
    ("NaN after a tile of nothing but -inf: with no score seen yet the maximum is -inf, and exp(-inf - (-inf)) "
     "is NaN; an empty tile must leave the state as it was", dict(guard=False)),
]


def _fold_cases() -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Rows of 3 tiles each: (what each row is, scores [rows, 3, TILE], values [rows, 3, TILE, DIM])."""
    gen = torch.Generator().manual_seed(92)
    inf = float("-inf")
    rows: list[tuple[str, torch.Tensor]] = []
    normal = torch.randn(3, TILE, generator=gen)
    normal[2, 5:] = inf  # the last tile's tail is masked
    rows.append(("ordinary scores, the last tile's tail masked", normal))
    rising = torch.randn(3, TILE, generator=gen) + torch.tensor([0.0, 60.0, 130.0])[:, None]
    rows.append(("scores rising tile by tile to over 130", rising))
    first_empty = torch.randn(3, TILE, generator=gen) * 3
    first_empty[0] = inf
    rows.append(("the first tile all -inf (a masked tile)", first_empty))
    middle_empty = torch.randn(3, TILE, generator=gen) - 5
    middle_empty[1] = inf
    rows.append(("the middle tile all -inf", middle_empty))
    rows.append(("every tile all -inf (a sequence with nothing to attend to)", torch.full((3, TILE), inf)))
    scores = torch.stack([s for _, s in rows])
    values = torch.randn(len(rows), 3, TILE, DIM, generator=gen)
    return [w for w, _ in rows], scores, values


def _trajectory(scores: torch.Tensor, values: torch.Tensor, **mistake: Any) -> tuple[torch.Tensor, ...]:
    rows, tiles = scores.shape[:2]
    m = torch.empty(rows, tiles)
    l_out = torch.empty(rows, tiles)
    acc = torch.empty(rows, tiles, values.shape[-1])
    for r in range(rows):
        state = (torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(values.shape[-1]))
        for t in range(tiles):
            state = _fold_reference(*state, scores[r, t], values[r, t], **mistake)
            m[r, t], l_out[r, t], acc[r, t] = state
    return m, l_out, acc


def _same_state(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise: close, or the same infinity, or both NaN."""
    return torch.isclose(a, b, rtol=1e-5, atol=1e-5) | (a == b) | (torch.isnan(a) & torch.isnan(b))


def check_fold_tile(fold_tile: Any) -> None:
    """Task 09.2: ``fold_tile`` folds tile after tile into the running (max, sum, weighted sum) state."""
    names, scores, values = _fold_cases()
    want = _trajectory(scores, values)
    call = "fold_tile, tile after tile from the empty state (m = -inf, l = 0, acc = 0)"
    got = unwrap(run_probe(triton_fold_tiles, fold_tile, scores, values), call, "the state after each tile", "09.2")
    ok = [_same_state(g.float(), w) for g, w in zip(got, want)]
    per_tile = ok[0] & ok[1] & ok[2].all(dim=-1)
    if bool(per_tile.all()):
        passed("09.2")
        return
    r, t = (int(x) for x in torch.nonzero(~per_tile)[0])
    hint = "the state after this tile is not the online-softmax state of every score seen so far"
    for name, mistake in _FOLD_MISTAKES:
        other = _trajectory(scores[r:r + 1], values[r:r + 1], **mistake)
        if all(bool(_same_state(g[r:r + 1].float(), o).all()) for g, o in zip(got, other)):
            hint = name
            break
    shown = "\n    ".join(f"tile {k}: scores {show(scores[r, k])}" for k in range(t + 1))
    where = f"{call}   [{names[r]}]\n  after tile {t} of these tiles:\n    {shown}"
    raise fail(where, _state_text(want, r, t), _state_text(got, r, t), hint)


def _state_text(state: tuple[torch.Tensor, ...], r: int, t: int) -> str:
    acc = ", ".join(f"{x:.5g}" for x in state[2][r, t].tolist()[:6])
    return f"a state with m = {float(state[0][r, t]):.6g}, l = {float(state[1][r, t]):.6g}, acc = [{acc}, ...]"


