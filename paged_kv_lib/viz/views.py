"""Views of a live allocator: its block tables, its free queue, and one token's address.

Each view reads the allocator it is given (never changes it) and offers four faces:

* ``model()``: the plain data it draws (lists of dicts, see ``snapshot.py``);
* ``_repr_html_()``: a static SVG picture, deterministic, stored in the notebook so it
  shows on GitHub and nbviewer (this is what a view displays as by default); it is an
  ``<img>`` of the SVG, which survives the HTML sanitizer of an untrusted notebook;
* ``summary()`` / ``repr()``: a short text version, for logs and for nbval to compare;
* ``widget()``: a live ipywidgets control that ``refresh()`` redraws after the allocator
  changes (the :class:`~paged_kv_lib.viz.playground.Playground` refreshes for you).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

import ipywidgets as widgets

from ..errors import InvalidArgumentError, PositionError, UnknownSequenceError
from . import snapshot, svg, svg_translation
from .static import PicturedBox, PicturedHTML


# ipywidgets' HTML widget sets a tall line height for one-line labels; text blocks need a normal one.
_WRAP_STYLE = ' style="line-height:1.35"'


class _View:
    """What every view shares: static HTML by default, a live widget on demand."""

    _kind = "view"

    def __init__(self, allocator: Any, *, columns: int = 16) -> None:
        if columns < 1:
            raise InvalidArgumentError(f"columns must be >= 1, got {columns}")
        self.allocator = allocator
        self.columns = columns
        self._html: Optional[widgets.HTML] = None
        self._box: Optional[widgets.Widget] = None

    def model(self) -> Any:  # pragma: no cover - every view overrides it
        raise NotImplementedError

    def svg(self) -> str:  # pragma: no cover - every view overrides it
        raise NotImplementedError

    def summary(self) -> str:  # pragma: no cover - every view overrides it
        raise NotImplementedError

    def to_html(self, *, inline: bool = False) -> str:
        """The picture in a ``div``: an ``<img>`` of the SVG (what ``_repr_html_`` stores), or with
        ``inline=True`` the SVG itself, with tooltips and ``data-*`` attributes (the live widget's)."""
        return f'<div class="pkv-view pkv-{self._kind}-view"{_WRAP_STYLE}>{self._picture(self.svg(), inline)}</div>'

    def _picture(self, svg_text: str, inline: bool) -> str:
        return svg_text if inline else svg.as_img(svg_text, self.summary())

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return self.summary()

    def widget(self) -> widgets.Widget:
        """The live widget (the same object on every call); :meth:`refresh` redraws it."""
        if self._box is None:
            self._html = PicturedHTML(self.to_html(inline=True), self.to_html, text=self.summary)
            self._box = self._build(self._html)
        return self._box

    def _build(self, html_widget: widgets.HTML) -> widgets.Widget:
        return html_widget

    def refresh(self) -> None:
        """Redraw the live widget from the allocator's current state (no-op before ``widget()``)."""
        if self._html is not None:
            self._html.value = self.to_html(inline=True)


class BlockTableView(_View):
    """The physical pool as a grid, and each sequence's block table lined up against it.

    A block's colour is its owner's; the solid part of a block is its filled slots. Each
    other mark means one thing, and the legend under the picture says which: bands of
    several colours and a thick border, a shared block (``ref_count`` > 1); grey dashed,
    free; pale yellow, free but cached; a corner flag, a used block in the prefix cache;
    a dashed halo, a block the playground's last action changed (``changed``). Curves
    link each logical block to the physical block it maps to.

    Example::

        from paged_kv_lib import PagedKVCacheAllocator
        from paged_kv_lib.viz import BlockTableView

        alloc = PagedKVCacheAllocator(12, 4, 1, 8)
        alloc.allocate_for_sequence(0, 10)
        alloc.allocate_for_sequence(1, 3)
        BlockTableView(alloc)            # last line of a cell: the static picture
        print(BlockTableView(alloc))     # the text summary
        BlockTableView(alloc).model()    # the data behind the picture
    """

    _kind = "block-table"

    def __init__(self, allocator: Any, *, columns: int = 16, links: bool = True) -> None:
        super().__init__(allocator, columns=columns)
        self.links = links
        self.changed: Set[int] = set()  # block ids to mark "changed" (the playground sets it after each action)

    def model(self) -> Dict[str, Any]:
        """``{"block_size", "blocks": [per physical block], "sequences": [per sequence], "swapped": [...]}``."""
        blocks = snapshot.pool_blocks(self.allocator)
        for block in blocks:
            block["changed"] = block["block_id"] in self.changed
        return {
            "block_size": self.allocator.block_size,
            "blocks": blocks,
            "sequences": snapshot.sequence_rows(self.allocator),
            "swapped": snapshot.swapped_rows(self.allocator),
        }

    def svg(self) -> str:
        return svg.render_block_table(self.model(), columns=self.columns, links=self.links)

    def summary(self) -> str:
        m = self.model()
        blocks = m["blocks"]
        counts = {state: sum(1 for b in blocks if b["state"] == state) for state in ("used", "free", "cached")}
        lines = [
            f"pool: {svg.count(len(blocks), 'block')} of {svg.count(m['block_size'], 'slot')}: {counts['used']} used, "
            f"{counts['free'] + counts['cached']} free ({counts['cached']} cached)"
        ]
        for row in m["sequences"]:
            ids = [e["block_id"] for e in row["blocks"]]
            lines.append(f"seq {row['seq_id']}: {row['num_tokens']} tokens -> blocks {ids}")
        for row in m["swapped"]:
            lines.append(f"seq {row['seq_id']}: {row['num_tokens']} tokens, swapped out to the CPU")
        for b in blocks:
            if b["ref_count"] > 1:
                owners = ", ".join(str(s) for s in b["owners"])
                lines.append(f"block {b['block_id']} shared by seq {owners} (ref_count {b['ref_count']})")
        return "\n".join(lines)


class FreeQueueView(_View):
    """The free queue in order, from the head (the next block handed out) to the tail.

    Freed blocks join at the tail; a cached block (one that kept its prefix hash) waits
    there until a new prompt with the same prefix takes it back, or until it reaches the
    head and is reused for something else (least recently freed goes first).

    Example::

        from paged_kv_lib.viz import FreeQueueView

        view = FreeQueueView(alloc)
        view                    # the chain of free blocks, head to tail
        view.model()[0]         # {"position": 0, "block_id": ..., "state": "free" or "cached", ...}
    """

    _kind = "free-queue"

    def model(self) -> List[Dict[str, Any]]:
        """One dict per queued block, head first: ``position``, ``block_id``, ``state``, ``hash``."""
        return snapshot.free_queue_entries(self.allocator)

    def svg(self) -> str:
        return svg.render_free_queue(self.model(), self.allocator.num_blocks, columns=self.columns)

    def summary(self) -> str:
        entries = self.model()
        cached = sum(1 for e in entries if e["state"] == "cached")
        ids = " ".join(f"{e['block_id']}*" if e["state"] == "cached" else str(e["block_id"]) for e in entries)
        note = f" ({cached} cached, marked *)" if cached else ""
        return f"free queue: {svg.count(len(entries), 'block')}{note}, head -> tail: [{ids}]"


class AddressTranslationView(_View):
    """Follow one token from its logical position to its slot in the physical pool.

    ``position // block_size`` picks the logical block, the block table maps it to a
    physical block, and ``block_id * block_size + position % block_size`` is the slot
    the attention kernel reads. The widget has a sequence dropdown and a position slider.

    Example::

        from paged_kv_lib.viz import AddressTranslationView

        view = AddressTranslationView(alloc, seq_id=0, position=6)
        view                            # the picture, token 6 of seq 0 outlined in red
        view.model()["translation"]     # {"logical_block": 1, "offset": 2, "block_id": ..., "slot": ...}
        view.select(0, 9)               # another token
        view.widget()                   # dropdown + slider
    """

    _kind = "translation"

    def __init__(self, allocator: Any, seq_id: Optional[int] = None, position: int = 0, *,
                 columns: int = 16) -> None:
        super().__init__(allocator, columns=columns)
        self.seq_id = seq_id
        self.position = position
        self._seq_select: Optional[widgets.Dropdown] = None
        self._slider: Optional[widgets.IntSlider] = None
        self._syncing = False
        if seq_id is not None:
            self.select(seq_id, position)

    def select(self, seq_id: int, position: int = 0) -> None:
        """Point the view at token ``position`` of sequence ``seq_id`` (both must exist)."""
        tables = self.allocator.sequence_block_tables
        if seq_id not in tables:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
        if not 0 <= position < max(tables[seq_id].num_tokens, 1):
            raise PositionError(f"position {position} is outside sequence {seq_id} "
                             f"({tables[seq_id].num_tokens} tokens)")
        self.seq_id, self.position = seq_id, position
        self.refresh()

    def _current(self):
        """The selected sequence and position, falling back to the first sequence and clamping."""
        seq_ids = list(self.allocator.seq_ids)
        if not seq_ids:
            return None, 0
        seq_id = self.seq_id if self.seq_id in seq_ids else seq_ids[0]
        tokens = self.allocator.get_num_tokens(seq_id)
        return seq_id, max(0, min(self.position, tokens - 1))

    def model(self) -> Dict[str, Any]:
        """``{"translation": dict or None, "sequence": that sequence's row, "blocks": the pool}``."""
        seq_id, position = self._current()
        rows = {r["seq_id"]: r for r in snapshot.sequence_rows(self.allocator)}
        translation = None
        if seq_id is not None and rows[seq_id]["num_tokens"] > 0:
            translation = snapshot.translate(self.allocator, seq_id, position)
        return {
            "translation": translation,
            "sequence": rows.get(seq_id),
            "blocks": snapshot.pool_blocks(self.allocator),
        }

    def svg(self) -> str:
        return svg_translation.render_translation(self.model(), columns=self.columns)

    def to_html(self, *, inline: bool = False) -> str:
        m = self.model()
        picture = self._picture(svg_translation.render_translation(m, columns=self.columns), inline)
        return (f'<div class="pkv-view pkv-translation-view"{_WRAP_STYLE}>'
                f'{svg_translation.translation_table(m["translation"])}{picture}</div>')

    def summary(self) -> str:
        t = self.model()["translation"]
        if t is None:
            return "address translation: no token to translate (no sequence, or an empty one)"
        return (f"seq {t['seq_id']} token {t['position']}: logical block {t['logical_block']}, "
                f"offset {t['offset']} -> physical block {t['block_id']}, slot {t['slot']}")

    def _build(self, html_widget: widgets.HTML) -> widgets.Widget:
        self._seq_select = widgets.Dropdown(description="sequence", layout=widgets.Layout(width="180px"))
        self._slider = widgets.IntSlider(description="token position", min=0, max=0,
                                         style={"description_width": "initial"},
                                         layout=widgets.Layout(width="420px"), continuous_update=True)
        self._seq_select.observe(self._on_seq, names="value")
        self._slider.observe(self._on_position, names="value")
        self._sync_controls()
        return PicturedBox([widgets.HBox([self._seq_select, self._slider]), html_widget], self.to_html,
                           text=self.summary, layout=widgets.Layout(overflow="auto"))

    def _on_seq(self, change: Dict[str, Any]) -> None:
        if not self._syncing and change["new"] is not None:
            self.seq_id, self.position = change["new"], 0
            self.refresh()

    def _on_position(self, change: Dict[str, Any]) -> None:
        if not self._syncing:
            self.position = change["new"]
            self.refresh()

    def _sync_controls(self) -> None:
        """Make the dropdown and slider match the allocator (sequences come and go)."""
        if self._seq_select is None or self._slider is None:
            return
        seq_id, position = self._current()
        self._syncing = True
        try:
            self._seq_select.options = [(f"seq {s}", s) for s in self.allocator.seq_ids]
            self._seq_select.value = seq_id
            tokens = self.allocator.get_num_tokens(seq_id) if seq_id is not None else 0
            self._slider.max = max(tokens - 1, 0)
            self._slider.value = position
            self._slider.disabled = tokens == 0
        finally:
            self._syncing = False

    def refresh(self) -> None:
        self._sync_controls()
        super().refresh()
