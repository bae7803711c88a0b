"""The views' data models and static pictures, checked against the allocator itself (no browser)."""

from __future__ import annotations

import base64
import html
import random
import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from paged_kv_lib import Block, BlockTable, PagedKVCacheAllocator, PositionError, UnknownSequenceError
from paged_kv_lib.viz import AddressTranslationView, BlockTableView, FreeQueueView, seq_color
from paged_kv_lib.viz import snapshot

SVG = "{http://www.w3.org/2000/svg}"


def make(num_blocks=12, block_size=4):
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 2)


def busy(seed: int, num_blocks=12, block_size=4) -> PagedKVCacheAllocator:
    """An allocator after a seeded mix of allocations, appends and frees."""
    rng = random.Random(seed)
    alloc = make(num_blocks, block_size)
    next_id = 0
    for _ in range(25):
        op = rng.random()
        if op < 0.4 and alloc.num_free_blocks:
            n = rng.randint(0, alloc.num_free_blocks * block_size)
            alloc.allocate_for_sequence(next_id, n)
            next_id += 1
        elif op < 0.75 and alloc.seq_ids:
            seq = rng.choice(alloc.seq_ids)
            room = alloc.num_free_blocks * block_size
            alloc.append_tokens(seq, rng.randint(0, room))
        elif alloc.seq_ids:
            alloc.free_sequence(rng.choice(alloc.seq_ids))
    return alloc


def expected_fill(alloc, seq_id, logical):
    tokens = alloc.get_num_tokens(seq_id)
    return max(0, min(alloc.block_size, tokens - logical * alloc.block_size))


def parse(svg_text: str) -> ET.Element:
    return ET.fromstring(svg_text)


def groups(root: ET.Element, cls: str):
    return [g for g in root.iter(SVG + "g") if cls in g.get("class", "").split()]


@pytest.mark.parametrize("seed", range(6))
def test_pool_model_matches_allocator(seed):
    alloc = busy(seed)
    model = BlockTableView(alloc).model()
    tables = alloc.sequence_block_tables
    assert [b["block_id"] for b in model["blocks"]] == list(range(alloc.num_blocks))
    for info, block in zip(model["blocks"], alloc.blocks):
        holders = [s for s in alloc.seq_ids if block.block_id in tables[s].block_ids]
        assert info["owners"] == tuple(holders)
        assert info["ref_count"] == block.ref_count == len(holders)
        assert info["state"] == ("used" if holders else "free")
        fills = [expected_fill(alloc, s, tables[s].block_ids.index(block.block_id)) for s in holders]
        assert info["fill"] == max(fills, default=0)
    assert sum(b["state"] == "free" for b in model["blocks"]) == alloc.num_free_blocks


@pytest.mark.parametrize("seed", range(6))
def test_sequence_rows_match_block_tables(seed):
    alloc = busy(seed)
    rows = BlockTableView(alloc).model()["sequences"]
    assert [r["seq_id"] for r in rows] == list(alloc.seq_ids)
    for row in rows:
        mapping = alloc.get_block_mapping(row["seq_id"])
        assert [e["block_id"] for e in row["blocks"]] == mapping
        assert row["num_tokens"] == alloc.get_num_tokens(row["seq_id"])
        assert sum(e["fill"] for e in row["blocks"]) == row["num_tokens"]
        for e in row["blocks"]:
            assert e["fill"] == expected_fill(alloc, row["seq_id"], e["logical"])


@pytest.mark.parametrize("seed", range(4))
def test_block_table_svg_draws_the_model(seed):
    alloc = busy(seed)
    view = BlockTableView(alloc)
    root = parse(view.svg())
    drawn = groups(root, "pkv-block")
    model = view.model()
    assert [int(g.get("data-block-id")) for g in drawn] == [b["block_id"] for b in model["blocks"]]
    for g, info in zip(drawn, model["blocks"]):
        assert g.get("data-state") == info["state"]
        assert g.get("data-seq") == " ".join(map(str, info["owners"]))
        assert int(g.get("data-ref-count")) == info["ref_count"]
        colors = {r.get("fill") for r in g.iter(SVG + "rect")}
        for owner in info["owners"]:
            assert seq_color(owner) in colors
    logical = groups(root, "pkv-logical")
    expected = [(s, i, b) for s in alloc.seq_ids for i, b in enumerate(alloc.get_block_mapping(s))]
    assert [(int(g.get("data-seq")), int(g.get("data-logical")), int(g.get("data-block-id")))
            for g in logical] == expected
    links = [p for p in root.iter(SVG + "path") if "pkv-link" in p.get("class", "")]
    assert len(links) == len(expected)


def test_static_html_is_deterministic_and_id_free():
    first, second = busy(3), busy(3)
    for view_cls in (BlockTableView, FreeQueueView, AddressTranslationView):
        a, b = view_cls(first)._repr_html_(), view_cls(second)._repr_html_()
        assert a == b
        assert " id=" not in a
        assert a == view_cls(first)._repr_html_()


def test_repr_is_the_summary_and_names_every_sequence():
    alloc = busy(1)
    view = BlockTableView(alloc)
    text = repr(view)
    assert text == view.summary()
    for seq_id in alloc.seq_ids:
        line = f"seq {seq_id}: {alloc.get_num_tokens(seq_id)} tokens -> blocks {alloc.get_block_mapping(seq_id)}"
        assert line in text.splitlines()
    assert f"{alloc.num_used_blocks} used" in text.splitlines()[0]


def test_views_never_change_the_allocator():
    alloc = busy(2)
    before = (alloc.free_blocks, [(b.block_id, b.ref_count, b.block_hash) for b in alloc.blocks],
              {s: (t.block_ids, t.num_tokens) for s, t in alloc.sequence_block_tables.items()})
    for view in (BlockTableView(alloc), FreeQueueView(alloc), AddressTranslationView(alloc)):
        view.model(), view._repr_html_(), view.summary(), view.widget()
    after = (alloc.free_blocks, [(b.block_id, b.ref_count, b.block_hash) for b in alloc.blocks],
             {s: (t.block_ids, t.num_tokens) for s, t in alloc.sequence_block_tables.items()})
    assert before == after


@pytest.mark.parametrize("seed", range(4))
def test_free_queue_model_in_queue_order(seed):
    alloc = busy(seed)
    view = FreeQueueView(alloc)
    model = view.model()
    assert [e["block_id"] for e in model] == list(alloc.free_blocks)
    assert [e["position"] for e in model] == list(range(len(model)))
    drawn = groups(parse(view.svg()), "pkv-free-entry")
    assert [int(g.get("data-block-id")) for g in drawn] == list(alloc.free_blocks)
    assert view.summary().endswith("[" + " ".join(map(str, alloc.free_blocks)) + "]")


class FakeAllocator(SimpleNamespace):
    """Just the read-only surface the views use, to stage a state (cached free blocks) directly."""


def staged_with_cached_blocks():
    blocks = (Block(0, 1), Block(1, 0, b"\xab\xcd\x01\x02\x03"), Block(2, 0), Block(3, 2, b"\x00" * 4),
              Block(4, 0, b"\x11" * 4))
    return FakeAllocator(
        block_size=2, num_blocks=5, blocks=blocks, free_blocks=(4, 2, 1),
        seq_ids=(7, 9), sequence_block_tables={7: BlockTable([3, 0], 3), 9: BlockTable([3], 2)},
        get_num_tokens=lambda s: {7: 3, 9: 2}[s],
    )


def test_cached_free_blocks_are_told_apart():
    fake = staged_with_cached_blocks()
    queue = FreeQueueView(fake).model()
    assert [(e["block_id"], e["state"]) for e in queue] == [(4, "cached"), (2, "free"), (1, "cached")]
    assert queue[2]["hash"] == "abcd0102"
    pool = {b["block_id"]: b for b in BlockTableView(fake).model()["blocks"]}
    assert pool[1]["state"] == "cached" and pool[1]["fill"] == fake.block_size
    assert pool[2]["state"] == "free" and pool[2]["fill"] == 0
    assert pool[3]["state"] == "used" and pool[3]["owners"] == (7, 9) and pool[3]["ref_count"] == 2
    text = FreeQueueView(fake).summary()
    assert "[4* 2 1*]" in text and "2 cached" in text
    assert "block 3 shared by seq 7, 9 (ref_count 2)" in BlockTableView(fake).summary()
    drawn = {int(g.get("data-block-id")): g.get("data-state")
             for g in groups(parse(FreeQueueView(fake).svg()), "pkv-free-entry")}
    assert drawn == {4: "cached", 2: "free", 1: "cached"}


def test_prefix_cached_blocks_show_as_cached_after_free():
    alloc = make(num_blocks=8, block_size=4)
    try:
        alloc.allocate_for_sequence(0, 8, token_ids=list(range(8)))
    except TypeError:
        pytest.skip("allocate_for_sequence takes no token_ids yet (prefix caching not landed)")
    alloc.free_sequence(0)
    cached = {b.block_id for b in alloc.blocks if b.ref_count == 0 and b.block_hash is not None}
    assert cached, "two full blocks freed with token ids should stay cached"
    queue = FreeQueueView(alloc).model()
    assert {e["block_id"] for e in queue if e["state"] == "cached"} == cached
    pool = BlockTableView(alloc).model()["blocks"]
    assert {b["block_id"] for b in pool if b["state"] == "cached"} == cached


@pytest.mark.parametrize("seed", range(4))
def test_address_translation_agrees_with_slot_mapping(seed):
    alloc = busy(seed)
    view = AddressTranslationView(alloc)
    for seq_id in alloc.seq_ids:
        for position in range(alloc.get_num_tokens(seq_id)):
            view.select(seq_id, position)
            t = view.model()["translation"]
            assert t["slot"] == int(alloc.slot_mapping(seq_id, [position])[0])
            assert t["block_id"] == alloc.get_block_mapping(seq_id)[position // alloc.block_size]
            assert (t["logical_block"], t["offset"]) == divmod(position, alloc.block_size)


def test_address_translation_highlights_the_block_and_slot():
    alloc = make(num_blocks=10, block_size=4)
    alloc.allocate_for_sequence(0, 3)
    alloc.allocate_for_sequence(1, 11)
    view = AddressTranslationView(alloc, seq_id=1, position=9)
    target = alloc.get_block_mapping(1)[2]
    root = parse(view.svg())
    hits = [g for g in groups(root, "pkv-block") if "pkv-highlight" in g.get("class")]
    assert [int(g.get("data-block-id")) for g in hits] == [target]
    slots = [r for r in root.iter(SVG + "rect") if r.get("class") == "pkv-slot"]
    assert len(slots) == 2  # in the logical block and in the physical one
    html = view._repr_html_()
    assert f'data-slot="{target * 4 + 1}"' in html
    assert view.summary() == f"seq 1 token 9: logical block 2, offset 1 -> physical block {target}, slot {target * 4 + 1}"


def test_address_translation_refuses_bad_selection_and_follows_frees():
    alloc = make()
    alloc.allocate_for_sequence(0, 5)
    alloc.allocate_for_sequence(1, 2)
    view = AddressTranslationView(alloc, seq_id=1, position=1)
    with pytest.raises(UnknownSequenceError):
        view.select(5, 0)
    with pytest.raises(PositionError):
        view.select(0, 5)
    with pytest.raises(PositionError):
        snapshot.translate(alloc, 0, -1)
    alloc.free_sequence(1)
    assert view.model()["translation"]["seq_id"] == 0  # falls back to a live sequence
    alloc.free_sequence(0)
    assert view.model()["translation"] is None
    assert "no token" in view.summary()
    parse(view.svg())


def test_widgets_redraw_on_refresh():
    alloc = make()
    view = BlockTableView(alloc)
    box = view.widget()
    assert view.widget() is box
    before = box.value
    alloc.allocate_for_sequence(0, 6)
    assert box.value == before  # nothing redraws by itself...
    view.refresh()
    assert box.value == view.to_html(inline=True) != before  # ...until refresh()
    assert 'data-seq="0"' in box.value


def test_translation_widget_controls_follow_the_allocator():
    alloc = make(block_size=4)
    alloc.allocate_for_sequence(0, 6)
    alloc.allocate_for_sequence(1, 9)
    view = AddressTranslationView(alloc)
    box = view.widget()
    dropdown, slider = box.children[0].children
    html = box.children[1]
    assert [v for _, v in dropdown.options] == [0, 1]
    dropdown.value = 1
    assert slider.max == 8
    slider.value = 7
    assert view.model()["translation"]["position"] == 7
    assert html.value == view.to_html(inline=True)
    assert f'data-slot="{alloc.get_block_mapping(1)[1] * 4 + 3}"' in html.value
    alloc.free_sequence(1)
    view.refresh()
    assert [v for _, v in dropdown.options] == [0] and dropdown.value == 0 and slider.max == 5


def test_forked_blocks_show_as_shared():
    alloc = make()
    if not hasattr(alloc, "fork"):
        pytest.skip("PagedKVCacheAllocator.fork has not landed yet")
    alloc.allocate_for_sequence(0, 6)
    alloc.fork(0, 1)
    view = BlockTableView(alloc)
    for info in view.model()["blocks"]:
        if info["block_id"] in alloc.get_block_mapping(0):
            assert info["owners"] == (0, 1) and info["ref_count"] == 2
    assert "shared by seq 0, 1" in view.summary()
    shared = [g for g in groups(parse(view.svg()), "pkv-block") if g.get("data-ref-count") == "2"]
    assert len(shared) == len(alloc.get_block_mapping(0))


def test_columns_must_be_positive():
    with pytest.raises(ValueError):
        BlockTableView(make(), columns=0)
    wide = BlockTableView(make(num_blocks=20), columns=5).svg()
    narrow = BlockTableView(make(num_blocks=20), columns=20).svg()
    assert float(parse(wide).get("height")) > float(parse(narrow).get("height"))


def test_short_hash_forms():
    assert snapshot.short_hash(None) is None
    assert snapshot.short_hash(b"\x01\x02\x03\x04\x05") == "01020304"
    assert snapshot.short_hash(0x1234ABCD9) == "234abcd9"


def test_swapped_sequences_are_listed_without_device_blocks():
    if not hasattr(PagedKVCacheAllocator, "swap_out"):
        pytest.skip("swap_out has not landed yet")
    alloc = PagedKVCacheAllocator(8, 4, 1, 2, num_cpu_blocks=8)
    alloc.allocate_for_sequence(0, 5)
    alloc.allocate_for_sequence(1, 7)
    alloc.swap_out(0)
    view = BlockTableView(alloc)
    assert view.model()["swapped"] == [{"seq_id": 0, "num_tokens": 5}]
    assert "seq 0: 5 tokens, swapped out to the CPU" in view.summary().splitlines()
    swapped = groups(parse(view.svg()), "pkv-swapped")
    assert [(g.get("data-seq"), g.get("data-tokens")) for g in swapped] == [("0", "5")]
    assert all(b["owners"] in ((), (1,)) for b in view.model()["blocks"])


def test_full_blocks_in_the_prefix_cache_carry_a_flag():
    alloc = make(num_blocks=8, block_size=4)
    try:
        alloc.allocate_for_sequence(0, 9, token_ids=list(range(9)))
    except TypeError:
        pytest.skip("prefix caching (token_ids) has not landed yet")
    hashed = {b.block_id for b in alloc.blocks if b.block_hash is not None}
    assert hashed, "the two full prompt blocks should be in the prefix cache"
    flagged = {int(g.get("data-block-id")) for g in groups(parse(BlockTableView(alloc).svg()), "pkv-block")
               if any("pkv-hashed" in (p.get("class") or "").split() for p in g.iter(SVG + "path"))}
    assert flagged == hashed


@pytest.mark.parametrize("view_cls", [BlockTableView, FreeQueueView, AddressTranslationView])
def test_stored_picture_is_an_img_of_the_svg(view_cls):
    alloc = busy(4)
    view = view_cls(alloc)
    stored = view._repr_html_()
    assert "<svg" not in stored  # a sanitizer would strip inline SVG from a stored output
    (data,) = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', stored)
    assert base64.b64decode(data).decode("utf-8") == view.svg()
    assert f'alt="{html.escape(view.summary())}"' in stored
    assert "<svg" in view.to_html(inline=True)
