"""What a learner sees first: pictures without a kernel, refusals in words, a reset, what changed, readable colours."""

from __future__ import annotations

import re

import ipywidgets as widgets
import matplotlib
import pytest

matplotlib.use("Agg")

from paged_kv_lib import PagedKVCacheAllocator  # noqa: E402
from paged_kv_lib.viz import AddressTranslationView, BlockTableView, FreeQueueView, Playground  # noqa: E402
from paged_kv_lib.viz.colors import MEMORY_PARTS, SEQUENCE_PALETTE, TEXT_DARK  # noqa: E402
from paged_kv_lib.viz.playground import MAX_TOKEN_ID, parse_count, parse_token_ids  # noqa: E402
from paged_kv_lib.viz.static import interact, with_picture  # noqa: E402

WIDGET = "application/vnd.jupyter.widget-view+json"


def _alloc():
    a = PagedKVCacheAllocator(8, 4, 1, 2)
    a.allocate_for_sequence(0, 6)
    return a


@pytest.mark.parametrize("view_cls", [BlockTableView, FreeQueueView, AddressTranslationView])
def test_every_live_view_stores_a_picture_beside_the_widget(view_cls):
    view = view_cls(_alloc())
    bundle = view.widget()._repr_mimebundle_()
    assert WIDGET in bundle
    assert bundle["text/html"] == view.to_html()
    assert "<img" in bundle["text/html"] and "VBox(" not in bundle["text/plain"]


def test_playground_bundle_has_widget_picture_and_text():
    pg = Playground(num_blocks=8, block_size=4)
    pg.add_sequence(5)
    bundle = pg._repr_mimebundle_()
    assert WIDGET in bundle and "<img" in bundle["text/html"]
    assert bundle["text/plain"] == pg.summary()


def test_interact_stores_its_first_drawing():
    import matplotlib.pyplot as plt

    def draw(n=2):
        fig, ax = plt.subplots()
        ax.bar(range(n), range(n))
        plt.show()
        print(f"bars: {n}")

    box = interact(draw, n=widgets.IntSlider(value=3, min=1, max=5))
    html = box._repr_mimebundle_()["text/html"]
    assert "bars: 3" in html
    assert WIDGET in box._repr_mimebundle_()


def test_with_picture_calls_the_picture_each_time():
    state = {"n": 0}
    box = with_picture(widgets.Label("x"), lambda: f"<b>{state['n']}</b>")
    state["n"] = 7
    assert box._repr_mimebundle_()["text/html"] == "<b>7</b>"


@pytest.mark.parametrize("typed", ["2.5", "-5", "x", "", "1e3", "²"])
def test_counts_that_are_not_whole_numbers_are_refused_in_words(typed):
    with pytest.raises(ValueError, match="whole number"):
        parse_count(typed, "prompt tokens")


def test_parse_count_accepts_whole_numbers():
    assert parse_count(" 12 ", "tokens") == 12
    assert parse_count(0, "tokens") == 0


@pytest.mark.parametrize("typed", ["2.5", "-5", "abc"])
def test_playground_logs_a_refused_count_and_changes_nothing(typed):
    pg = Playground(num_blocks=8, block_size=4)
    pg.prompt_tokens.value = typed
    pg.add_button.click()
    assert pg.allocator.seq_ids == ()
    assert pg.log[-1].startswith("error: ValueError: prompt tokens must be a whole number")
    pg.add_sequence(4)
    pg.num_tokens.value = typed
    pg.append_button.click()
    assert pg.allocator.get_num_tokens(0) == 4
    assert "tokens to append must be a whole number" in pg.log[-1]


def test_token_ids_out_of_range_are_refused():
    with pytest.raises(ValueError, match="too large"):
        parse_token_ids(str(MAX_TOKEN_ID + 1))
    with pytest.raises(ValueError, match="whole numbers"):
        parse_token_ids("1 -2 3")
    assert parse_token_ids(f"0 {MAX_TOKEN_ID}") == [0, MAX_TOKEN_ID]
    pg = Playground(num_blocks=8, block_size=4)
    pg.token_ids.value = "99999999999999999999"
    pg.add_button.click()
    assert pg.allocator.seq_ids == () and "too large" in pg.log[-1]


def test_a_huge_count_is_refused_by_the_allocator_not_capped():
    pg = Playground(num_blocks=8, block_size=4)
    pg.prompt_tokens.value = "1000000000"
    pg.add_button.click()
    assert pg.allocator.seq_ids == ()
    assert pg.log[-1].startswith("error: OutOfBlocksError")


def test_reset_starts_again_from_a_fresh_allocator():
    pg = Playground(num_blocks=8, block_size=4)
    first = pg.allocator.free_blocks
    pg.add_sequence(9)
    pg.fork(0)
    pg.free(0)
    pg.reset_button.click()
    assert pg.allocator.seq_ids == () and pg.log == []
    assert pg.allocator.free_blocks == first
    assert pg.block_table.allocator is pg.allocator and pg.translation.allocator is pg.allocator
    assert pg.add_sequence(3) == 0


def test_reset_of_a_given_allocator_frees_everything_in_place():
    alloc = PagedKVCacheAllocator(8, 4, 1, 2, enable_prefix_caching=True)
    pg = Playground(alloc)
    pg.add_sequence(token_ids=list(range(8)))
    pg.reset()
    assert pg.allocator is alloc
    assert alloc.num_free_blocks == 8 and alloc.num_cached_free_blocks == 0


def test_the_last_action_outlines_exactly_the_blocks_it_changed():
    pg = Playground(num_blocks=8, block_size=4)
    pg.add_sequence(4)
    assert pg.block_table.changed == set(pg.allocator.get_block_mapping(0))
    pg.add_sequence(2)
    assert pg.block_table.changed == set(pg.allocator.get_block_mapping(1))
    pg.fork(0)
    pg.append(2, 1)  # the child's append takes a new block; block of seq 0 loses an owner
    new = set(pg.allocator.get_block_mapping(2)) - set(pg.allocator.get_block_mapping(0))
    assert new <= pg.block_table.changed
    assert set(pg.allocator.get_block_mapping(1)).isdisjoint(pg.block_table.changed)
    outlined = [b["block_id"] for b in pg.block_table.model()["blocks"] if b["changed"]]
    assert sorted(outlined) == sorted(pg.block_table.changed)
    pg.append(99, 1)  # refused: nothing changed, nothing outlined
    assert pg.block_table.changed == set()


def test_translation_view_starts_folded():
    pg = Playground(num_blocks=8, block_size=4)
    assert pg.translation_panel.selected_index is None


def _luminance(hex_color):
    def lin(c):
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(int(hex_color[i:i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_labels_are_dark_text_at_readable_contrast_and_fonts_are_large_enough():
    white = 1.0
    assert (white + 0.05) / (_luminance(TEXT_DARK) + 0.05) >= 4.5
    alloc = _alloc()
    for fork_child in (1, 2, 3):
        alloc.fork(0, fork_child)
    for view in (BlockTableView(alloc), FreeQueueView(alloc), AddressTranslationView(alloc)):
        svg = view.svg()
        sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
        assert sizes and min(sizes) >= 11
        text_fills = re.findall(r'<text[^>]* fill="(#[0-9a-fA-F]{6})"', svg)
        assert not set(c.lower() for c in text_fills) & set(SEQUENCE_PALETTE)


def test_one_palette_for_the_memory_parts_everywhere():
    from paged_kv_lib.simulate import PARTS
    from paged_kv_lib.viz.plots import BREAKDOWN_CATEGORIES

    colors = [c for _, _, c in MEMORY_PARTS]
    assert [c for _, _, c in BREAKDOWN_CATEGORIES] == colors
    assert [k for k, _, _ in MEMORY_PARTS] == list(PARTS)  # the simulation's parts, in the palette's order
    assert len(set(colors)) == 5


def test_counts_read_as_english():
    alloc = PagedKVCacheAllocator(2, 1, 1, 2)
    alloc.allocate_for_sequence(0, 1)
    queue, table = FreeQueueView(alloc), BlockTableView(alloc)
    assert "1 blocks" not in queue.summary() and "free queue: 1 block," in queue.summary()
    assert "1 slots" not in table.summary() and "2 blocks of 1 slot" in table.summary()
    assert "1 sequences" not in table.svg()
