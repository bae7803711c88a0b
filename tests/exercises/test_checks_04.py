"""Exercise 04's checks bite: correct solutions pass with the one success line; planted wrong ones fail
with a message that names the mistake."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from check_helpers import fails, not_implemented, passes

# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_04 import (check_gather_batch, check_step_block_tables, check_step_slot_mapping, check_read_tokens, check_write_kv_padded)
from paged_kv_course.grading.delegation import forbidden_modules

CHECKS = [check_step_slot_mapping, check_step_block_tables, check_write_kv_padded, check_gather_batch,
          check_read_tokens]
PLANTED = Path(__file__).parent / "planted" / "04"
# task -> (check, the name the solution cell defines)
TASKS = {"04.1": (check_step_slot_mapping, "my_step_slot_mapping"),
         "04.2": (check_step_block_tables, "my_step_block_tables"),
         "04.3": (check_write_kv_padded, "my_write_kv"),
         "04.4": (check_gather_batch, "my_gather_batch"),
         "04.5": (check_read_tokens, "read_tokens")}


@pytest.mark.parametrize("path", sorted(PLANTED.glob("04_*.py")), ids=lambda p: p.stem)
def test_a_planted_mistake_is_named(path):
    """Each planted wrong solution fails its check with the message its first line promises."""
    source = path.read_text(encoding="utf-8")
    expect = source.splitlines()[0].removeprefix("# expect: ")
    task = f"{path.stem[:2]}.{path.stem.split('_')[1]}"
    check, name = TASKS[task]
    namespace = {"torch": torch}
    exec(compile(source, str(path), "exec"), namespace)
    assert expect in fails(check, namespace[name])


def test_every_task_has_a_planted_mistake():
    assert {f"04.{p.stem.split('_')[1]}" for p in PLANTED.glob("04_*.py")} == set(TASKS)


def test_the_library_that_answers_is_forbidden():
    forbidden = forbidden_modules("04")
    for name in ("paged_kv_course.grading", "paged_kv_lib.kv_cache", "paged_kv_lib.allocator", "paged_kv_lib.attention"):
        assert name in forbidden


@pytest.mark.parametrize("check", CHECKS)
def test_an_untouched_task_says_it_is_not_written(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 04.1
def step_slots(tables, num_computed, num_new, block_size, first=lambda c: c, check=True):
    slots = []
    for table, done, new in zip(tables, num_computed, num_new):
        if check and done + new > len(table) * block_size:
            raise ValueError("past the table")
        for p in range(first(done), first(done) + new):
            slots.append(table[p // block_size] * block_size + p % block_size)
    return torch.tensor(slots, dtype=torch.int64)


def test_step_slot_mapping_correct(capsys):
    passes(check_step_slot_mapping, step_slots, "04.1", capsys)


@pytest.mark.parametrize("wrong, words", [
    (lambda t, c, n, bs: step_slots(t, c, n, bs, first=lambda d: d + 1), "off by one"),
    (lambda t, c, n, bs: step_slots(t, c, n, bs, first=lambda d: 0), "restart at 0"),
    (lambda t, c, n, bs: step_slots(t, c, n, bs).to(torch.int32), "int64"),
    (lambda t, c, n, bs: torch.tensor([s for s in step_slots(t, c, n, bs).tolist()]), "int64"),  # float when empty
    (lambda t, c, n, bs: torch.tensor([p for d, k in zip(c, n) for p in range(d, d + k)], dtype=torch.int64),
     "logical positions"),
    (lambda t, c, n, bs: step_slots(t, c, n, bs).sort().values, "order"),
])
def test_step_slot_mapping_names_the_mistake(wrong, words):
    assert words in fails(check_step_slot_mapping, wrong)


def test_step_slot_mapping_without_the_bound_check_fails():
    def no_check(tables, num_computed, num_new, block_size):
        try:
            return step_slots(tables, num_computed, num_new, block_size, check=False)
        except IndexError:
            return torch.zeros(0, dtype=torch.int64)
    message = fails(check_step_slot_mapping, no_check)
    assert "ValueError" in message and "past the table's last block" in message


def test_step_slot_mapping_that_modifies_its_input_fails():
    def pops(tables, num_computed, num_new, block_size):
        out = step_slots(tables, num_computed, num_new, block_size)
        num_new.clear()
        return out
    assert "modified its input" in fails(check_step_slot_mapping, pops)


# --------------------------------------------------------------------------- 04.2
def block_tables(tables, num_computed, num_new, block_size, max_blocks=None, pad=-1, lens=lambda d, n: d + n,
                 dtype=torch.int32, in_place=False):
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else max_blocks
    if width < longest:
        raise ValueError("too narrow")
    for t, d, n in zip(tables, num_computed, num_new):
        if d + n > len(t) * block_size:
            raise ValueError("too short")
    if in_place:
        rows = tables
        for t in rows:
            t.extend([pad] * (width - len(t)))
    else:
        rows = [list(t) + [pad] * (width - len(t)) for t in tables]
    grid = torch.tensor(rows, dtype=dtype).reshape(len(tables), width)
    return grid, torch.tensor([lens(d, n) for d, n in zip(num_computed, num_new)], dtype=torch.int32)


def test_step_block_tables_correct(capsys):
    passes(check_step_block_tables, block_tables, "04.2", capsys)


@pytest.mark.parametrize("options, words", [
    ({"pad": 0}, "a real block id"),
    ({"lens": lambda d, n: d + n - 1}, "off by one"),
    ({"lens": lambda d, n: d}, "before the step"),
    ({"dtype": torch.int64}, "int32"),
    ({"in_place": True}, "modified its input"),
])
def test_step_block_tables_names_the_mistake(options, words):
    def wrong(tables, num_computed, num_new, block_size, max_blocks=None):
        return block_tables(tables, num_computed, num_new, block_size, max_blocks, **options)
    assert words in fails(check_step_block_tables, wrong)


def test_step_block_tables_that_ignores_max_blocks_fails():
    def ignores(tables, num_computed, num_new, block_size, max_blocks=None):
        return block_tables(tables, num_computed, num_new, block_size)
    assert "shape" in fails(check_step_block_tables, ignores)


# --------------------------------------------------------------------------- 04.3
def write_kv(k_cache, v_cache, slot_mapping, k, v, skip_pad=True):
    keep = slot_mapping >= 0 if skip_pad else torch.ones_like(slot_mapping, dtype=torch.bool)
    slots = slot_mapping[keep]
    bs = k_cache.shape[2]
    k_cache[slots // bs, :, slots % bs, :] = k[keep]
    v_cache[slots // bs, :, slots % bs, :] = v[keep]


def test_write_kv_padded_correct(capsys):
    passes(check_write_kv_padded, write_kv, "04.3", capsys)


def test_writing_the_padding_slot_is_named():
    message = fails(check_write_kv_padded, lambda kc, vc, s, k, v: write_kv(kc, vc, s, k, v, skip_pad=False))
    assert "-1 counts from the end" in message


def test_write_into_rows_of_a_reshaped_cache_fails():
    def rows(k_cache, v_cache, slot_mapping, k, v):
        keep = slot_mapping >= 0
        heads, dim = k_cache.shape[1], k_cache.shape[3]
        k_cache.view(-1, heads, dim)[slot_mapping[keep]] = k[keep]
        v_cache.view(-1, heads, dim)[slot_mapping[keep]] = v[keep]
    assert "should not change" in fails(check_write_kv_padded, rows)


def test_write_into_a_copy_fails():
    def copy(k_cache, v_cache, slot_mapping, k, v):
        write_kv(k_cache.clone(), v_cache.clone(), slot_mapping, k, v)
    assert "in place" in fails(check_write_kv_padded, copy)


def test_write_that_swaps_k_and_v_fails():
    assert "K goes to k_cache" in fails(check_write_kv_padded, lambda kc, vc, s, k, v: write_kv(kc, vc, s, v, k))


def test_write_that_modifies_k_fails():
    def scales(k_cache, v_cache, slot_mapping, k, v):
        write_kv(k_cache, v_cache, slot_mapping, k, v)
        k.mul_(2)
    assert "modified its inputs" in fails(check_write_kv_padded, scales)


# --------------------------------------------------------------------------- 04.4
def gather(cache, block_tables, seq_lens, dtype=None, mask=True, multiply=False, zero_tail=False, check=True,
           shift=0, floor=False):
    num_seqs, width = block_tables.shape
    _, heads, bs, dim = cache.shape
    longest = int(seq_lens.max()) if num_seqs else 0
    out = torch.zeros(num_seqs, longest, heads, dim, dtype=dtype or cache.dtype)
    for b in range(num_seqs):
        n = int(seq_lens[b])
        used = -(-n // bs)
        if check and (used > width or bool((block_tables[b, :used] < 0).any())):
            raise ValueError("reads padding")
        ids = block_tables[b].long()
        if zero_tail and used:
            cache[ids[used - 1], :, n - (used - 1) * bs:, :] = 0
        tokens = cache[ids].permute(0, 2, 1, 3).reshape(-1, heads, dim)[:longest]
        if floor:  # n // bs blocks: the last, partly filled block is left out
            tokens = tokens[: (n // bs) * bs]
            out[b, : len(tokens)] = tokens
            continue
        if shift:
            tokens = torch.cat([tokens[:1], tokens[:-1]]) if len(tokens) else tokens
        if multiply:
            out[b, : len(tokens)] = tokens * (torch.arange(len(tokens)) < n)[:, None, None]
        elif mask:
            out[b, :n] = tokens[:n]
        else:
            out[b, : len(tokens)] = tokens
    return out


def test_gather_batch_correct(capsys):
    passes(check_gather_batch, gather, "04.4", capsys)


@pytest.mark.parametrize("options, words", [
    ({"zero_tail": True}, "wrote into the cache"),
    ({"dtype": torch.float32}, "wrong dtype"),
    ({"mask": False}, "past that sequence's length"),
    ({"multiply": True}, "0 * NaN"),
    ({"floor": True}, "block boundary"),
    ({"shift": 1}, "wrong vectors at position"),
])
def test_gather_batch_names_the_mistake(options, words):
    assert words in fails(check_gather_batch, lambda c, t, s: gather(c, t, s, **options))


def test_gather_batch_that_reads_padding_silently_fails():
    def silent(cache, block_tables, seq_lens):
        try:
            return gather(cache, block_tables, seq_lens, check=False)
        except (IndexError, RuntimeError):
            return torch.zeros(0)
    message = fails(check_gather_batch, silent)
    assert "ValueError" in message and "silently reads the cache's last block" in message


# --------------------------------------------------------------------------- 04.5
def read_tokens(k_cache, table, num_tokens, positions, lower=True, limit="tokens", permute=True, dtype=True):
    """A correct reader (an other design than the notebook's), with each planted bug as an option."""
    _, heads, bs, dim = k_cache.shape
    pos = torch.tensor(list(positions), dtype=torch.int64)
    top = {"tokens": num_tokens - 1, "one more": num_tokens, "room": len(table) * bs - 1}[limit]
    if (lower and bool((pos < 0).any())) or bool((pos > top).any()):
        raise ValueError("no token there")
    blocks = torch.tensor(list(table), dtype=torch.int64)[pos // bs]
    got = k_cache[blocks, :, pos % bs, :] if permute else k_cache.reshape(-1, heads, dim)[blocks * bs + pos % bs]
    return got if dtype else got.float()


def test_read_tokens_correct(capsys):
    """The solution cell's repair passes, and the check prints how many lines it changed before its success line."""
    import json

    from check_helpers import compiled

    nb = json.loads((Path(__file__).resolve().parents[2] / "exercises" / "solutions" /
                     "04_address_translation.ipynb").read_text(encoding="utf-8"))
    (source,) = ["".join(c["source"]) for c in nb["cells"]
                 if c.get("metadata", {}).get("paged_kv", {}) == {"kind": "debug", "points": 2, "role": "solution",
                                                                  "task": "04.5"}]
    namespace = {"torch": torch}
    exec(compiled(source, "<solution 04.5>"), namespace)
    passes(check_read_tokens, namespace["read_tokens"], "04.5", capsys)


def test_a_rewrite_of_the_reader_is_not_a_repair():
    assert "a rewrite, not a repair" in fails(check_read_tokens, read_tokens)  # this file's own reader


@pytest.mark.parametrize("options, words", [
    ({"lower": False}, "negative position was accepted"),
    ({"limit": "one more"}, "off by one at the end"),
    ({"limit": "room"}, "but no token was written there"),
    ({"permute": False}, "but not those of that position's slot"),
    ({"dtype": False}, "the result came out torch.float32 from a"),
])
def test_read_tokens_names_each_bug(options, words):
    message = fails(check_read_tokens, lambda kc, t, n, p: read_tokens(kc, t, n, p, **options))
    assert words in message
    assert len(message) < 800, "a failure of 04.5 shows a summary of each tensor, not its values"
