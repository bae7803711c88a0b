"""Static SVG/HTML drawings of the snapshot models (``snapshot.py``): pool, tables, queue.

Everything here is a pure function of plain data and returns a string, so the same state
always gives byte-identical output (no random ids, no timestamps): a lesson can store it,
nbval can compare it, and GitHub or nbviewer can show it. Colours are SVG presentation
attributes rather than CSS, which survives HTML sanitizers. Every drawn block carries
``data-*`` attributes (``data-block-id``, ``data-seq``, ``data-state``...) for tests and
for anyone inspecting the DOM.
"""

from __future__ import annotations

import base64
import html
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..block import cdiv
from .colors import (
    BACKGROUND,
    CACHED_FILL,
    CACHED_STROKE,
    CHANGED_DASH,
    FREE_DASH,
    FREE_FILL,
    FREE_STROKE,
    HIGHLIGHT,
    MUTED_TEXT,
    NEUTRAL,
    OUTLINE,
    TEXT_DARK,
    seq_color,
    tint,
)

FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
CELL_W = 58
HEADER_H = 14
BODY_H = 30
CELL_H = HEADER_H + BODY_H
GAP = 6
MARGIN = 10
LABEL_W = 118  # room for "seq 12 · 100 tok" left of a block-table row
LINE_H = 18

Point = Tuple[float, float]


# ----------------------------------------------------------------- primitives
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{round(value, 2):g}"
    return str(value)


def _el(tag: str, content: Optional[str] = None, **attrs: Any) -> str:
    """One SVG/HTML element; ``data_block_id=3`` becomes ``data-block-id="3"``, ``None`` is dropped."""
    rendered = "".join(
        f' {name.rstrip("_").replace("_", "-")}="{html.escape(_fmt(value), quote=True)}"'
        for name, value in attrs.items()
        if value is not None
    )
    if content is None:
        return f"<{tag}{rendered}/>"
    return f"<{tag}{rendered}>{content}</{tag}>"


def _text(x: float, y: float, text: str, *, size: int = 11, anchor: str = "start",
          weight: Optional[str] = None, fill: str = TEXT_DARK, **attrs: Any) -> str:
    return _el("text", html.escape(text), x=x, y=y, font_size=size, text_anchor=anchor,
               font_weight=weight, fill=fill, **attrs)


def _seq_label(x: float, baseline: float, seq_id: int, text: str) -> str:
    """A sequence's name in dark text beside a swatch of its colour (coloured text reads badly)."""
    swatch = _el("rect", x=x, y=baseline - 9, width=10, height=10, rx=2, fill=seq_color(seq_id),
                 stroke=TEXT_DARK, stroke_width=0.5)
    return swatch + _text(x + 14, baseline, text, size=11, weight="bold")


def _hover_style(seq_ids: Iterable[int]) -> str:
    """CSS that brightens a sequence's links while the pointer is on its label (inline SVG only)."""
    rules = "".join(
        f'.pkv-svg:has(.pkv-seq-label[data-seq="{s}"]:hover) .pkv-link[data-seq="{s}"]'
        "{stroke-opacity:1;stroke-width:3}"
        for s in sorted(set(seq_ids)))
    return f"<style>{rules}</style>" if rules else ""


def _svg(width: float, height: float, parts: Iterable[str], label: str, kind: str) -> str:
    body = "".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pkv-svg pkv-{kind}" '
        f'width="{_fmt(width)}" height="{_fmt(height)}" viewBox="0 0 {_fmt(width)} {_fmt(height)}" '
        f'style="max-width:100%;height:auto" role="img" aria-label="{html.escape(label, quote=True)}" '
        f'font-family="{html.escape(FONT, quote=True)}">'
        f"{body}</svg>"
    )


def as_img(svg_text: str, alt: str) -> str:
    """The SVG as an ``<img>`` with a data URI: notebook sanitizers (JupyterLab's, for an
    untrusted notebook) strip inline ``<svg>`` but keep this, so stored outputs still show."""
    data = base64.b64encode(svg_text.encode("utf-8")).decode("ascii")
    return _el("img", src=f"data:image/svg+xml;base64,{data}", alt=alt, title=alt,
               style="max-width:100%;height:auto")


def count(n: int, noun: str) -> str:
    """``count(1, "block")`` -> ``"1 block"``, ``count(3, "block")`` -> ``"3 blocks"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _approx_text_width(text: str, size: int = 11) -> float:
    return len(text) * size * 0.56


# -------------------------------------------------------------- block cells
def _fill_rows(x: float, y: float, colors: Sequence[str], fill: int, block_size: int) -> List[str]:
    """The body of a block: one horizontal band per owner, filled left to right, slot by slot."""
    parts = []
    band_h = BODY_H / len(colors)
    filled_w = CELL_W * fill / block_size
    for i, color in enumerate(colors):
        by = y + i * band_h
        parts.append(_el("rect", x=x, y=by, width=CELL_W, height=band_h, fill=tint(color)))
        if filled_w:
            parts.append(_el("rect", x=x, y=by, width=filled_w, height=band_h, fill=color))
    if block_size <= 16:
        # Faint slot dividers: a block is block_size token slots in a row.
        step = CELL_W / block_size
        ticks = " ".join(f"M{_fmt(x + k * step)} {_fmt(y)}v{_fmt(BODY_H)}" for k in range(1, block_size))
        if ticks:
            parts.append(_el("path", d=ticks, stroke=BACKGROUND, stroke_width=1, stroke_opacity=0.55))
    return parts


def _pill(cx: float, cy: float, text: str) -> List[str]:
    """A small white label readable on any block colour."""
    w = _approx_text_width(text, 10) + 8
    return [
        _el("rect", x=cx - w / 2, y=cy - 7, width=w, height=14, rx=7, fill=BACKGROUND, fill_opacity=0.88),
        _text(cx, cy + 3.5, text, size=11, anchor="middle"),
    ]


def _owner_label(owners: Sequence[int], ref_count: int) -> str:
    if len(owners) == 1:
        return f"s{owners[0]}"
    if len(owners) == 2:
        return f"s{owners[0]}+s{owners[1]}"
    return f"\u00d7{ref_count}"


def _block_tooltip(block: Dict[str, Any]) -> str:
    bid, state = block["block_id"], block["state"]
    if state == "used":
        who = ", ".join(str(s) for s in block["owners"])
        text = (f"block {bid}: used by seq {who}, ref_count {block['ref_count']}, "
                f"{block['fill']}/{block['block_size']} slots filled")
    elif state == "cached":
        text = f"block {bid}: free but cached (its contents can be reused by a matching prefix)"
    else:
        text = f"block {bid}: free"
    if block.get("hash"):
        text += f", hash {block['hash']}"
    return text


SHARED_WIDTH = 2  # the border of a shared block; every other block border is 1 wide


def pool_block(block: Dict[str, Any], x: float, y: float, *, highlight_offset: Optional[int] = None,
               highlighted: bool = False) -> str:
    """One physical block: header with its id and fill, body coloured by owner(s) or state.

    Each mark means one thing, and :func:`legend_items` names each one:

    * ``shared``: colour bands (one per owner) and a thick border: ``ref_count > 1``;
    * ``free``: grey body, thin dashed border, the word "free": in the free queue, empty;
    * ``cached``: pale yellow body, the word "cached": free, but it keeps its prefix hash;
    * ``hashed``: a corner flag on a used block: its full content is in the prefix cache;
    * ``changed``: a dashed halo around the block (``block["changed"]``, set by the
      playground): the last action changed it (took, freed, filled, copied or evicted it).

    ``highlighted`` is the address-translation view's own solid halo around the block the
    chosen token lives in. The group's ``data-marks`` lists the marks drawn, for tests and
    for anyone inspecting the DOM; every mark's element has the class ``pkv-mark-<mark>``.
    """
    state, size = block["state"], block["block_size"]
    marks: List[str] = []
    parts = [_el("title", html.escape(_block_tooltip(block)))]
    body_y = y + HEADER_H
    parts.append(_el("rect", x=x, y=y, width=CELL_W, height=HEADER_H, fill=BACKGROUND))
    parts.append(_text(x + 3, y + 11, f"#{block['block_id']}", size=11, weight="bold"))
    if state == "used":
        parts.append(_text(x + CELL_W - 3, y + 11, f"{block['fill']}/{size}", size=11,
                           anchor="end", fill=MUTED_TEXT))
        parts += _fill_rows(x, body_y, [seq_color(s) for s in block["owners"]] or [NEUTRAL],
                            block["fill"], size)
        parts += _pill(x + CELL_W / 2, body_y + BODY_H / 2, _owner_label(block["owners"], block["ref_count"]))
        if block.get("hash"):
            # A corner flag: this full block's content is in the prefix cache.
            marks.append("hashed")
            parts.append(_el("path", class_="pkv-hashed pkv-mark-hashed", d=f"M{x + CELL_W - 9} {body_y}h9v9z",
                             fill=CACHED_STROKE))
        shared = block["ref_count"] > 1
        if shared:
            marks.append("shared")
        border = _el("rect", class_="pkv-mark-shared" if shared else None, x=x, y=y, width=CELL_W,
                     height=CELL_H, fill="none", stroke=OUTLINE, stroke_width=SHARED_WIDTH if shared else 1)
    else:
        marks.append(state)
        fill, stroke = (CACHED_FILL, CACHED_STROKE) if state == "cached" else (FREE_FILL, FREE_STROKE)
        parts.append(_el("rect", class_=f"pkv-mark-{state}", x=x, y=body_y, width=CELL_W, height=BODY_H,
                         fill=fill))
        parts.append(_text(x + CELL_W / 2, body_y + BODY_H / 2 + 4, state, size=11,
                           anchor="middle", fill=MUTED_TEXT))
        border = _el("rect", x=x, y=y, width=CELL_W, height=CELL_H, fill="none", stroke=stroke, stroke_width=1,
                     stroke_dasharray=FREE_DASH if state == "free" else None)
    parts.append(border)
    if highlight_offset is not None:
        sw = CELL_W / size
        parts.append(_el("rect", class_="pkv-slot", x=x + highlight_offset * sw, y=body_y,
                         width=sw, height=BODY_H, fill="none", stroke=HIGHLIGHT, stroke_width=2))
    if block.get("changed"):
        marks.append("changed")
        parts.append(_el("rect", class_="pkv-mark-changed", x=x - 3, y=y - 3, width=CELL_W + 6,
                         height=CELL_H + 6, rx=4, fill="none", stroke=HIGHLIGHT, stroke_width=2,
                         stroke_dasharray=CHANGED_DASH))
    if highlighted:
        parts.append(_el("rect", x=x - 3, y=y - 3, width=CELL_W + 6, height=CELL_H + 6, rx=3,
                         fill="none", stroke=HIGHLIGHT, stroke_width=2.5))
    return _el(
        "g", "".join(parts),
        class_="pkv-block" + (" pkv-changed" if block.get("changed") else "") + (" pkv-highlight" if highlighted else ""),
        data_block_id=block["block_id"], data_state=state,
        data_seq=" ".join(str(s) for s in block["owners"]), data_ref_count=block["ref_count"],
        data_fill=block["fill"], data_marks=" ".join(marks),
    )


def logical_block(seq_id: int, entry: Dict[str, Any], block_size: int, x: float, y: float, *,
                  highlight_offset: Optional[int] = None) -> str:
    """One logical block of a sequence: ``L<i>``, its fill, and the physical block it maps to."""
    color = seq_color(seq_id)
    tooltip = (f"seq {seq_id}, logical block {entry['logical']} -> physical block {entry['block_id']}, "
               f"{entry['fill']}/{block_size} of its tokens here"
               + (f", shared (ref_count {entry['ref_count']})" if entry["shared"] else ""))
    parts = [_el("title", html.escape(tooltip))]
    parts.append(_el("rect", x=x, y=y, width=CELL_W, height=HEADER_H, fill=BACKGROUND))
    parts.append(_text(x + 3, y + 11, f"L{entry['logical']}", size=11, weight="bold"))
    parts.append(_text(x + CELL_W - 3, y + 11, f"{entry['fill']}/{block_size}", size=11,
                       anchor="end", fill=MUTED_TEXT))
    parts += _fill_rows(x, y + HEADER_H, [color], entry["fill"], block_size)
    parts += _pill(x + CELL_W / 2, y + HEADER_H + BODY_H / 2, f"\u2192#{entry['block_id']}")
    parts.append(_el("rect", x=x, y=y, width=CELL_W, height=CELL_H, fill="none", stroke=color,
                     stroke_width=2 if entry["shared"] else 1))
    if highlight_offset is not None:
        sw = CELL_W / block_size
        parts.append(_el("rect", class_="pkv-slot", x=x + highlight_offset * sw, y=y + HEADER_H,
                         width=sw, height=BODY_H, fill="none", stroke=HIGHLIGHT, stroke_width=2))
    return _el("g", "".join(parts), class_="pkv-logical", data_seq=seq_id,
               data_logical=entry["logical"], data_block_id=entry["block_id"], data_fill=entry["fill"])


# ------------------------------------------------------------------ layouts
def _grid_positions(count: int, columns: int, x0: float, y0: float) -> List[Point]:
    return [(x0 + (i % columns) * (CELL_W + GAP), y0 + (i // columns) * (CELL_H + GAP))
            for i in range(count)]


def _grid_height(count: int, columns: int) -> float:
    rows = max(1, cdiv(count, columns))
    return rows * CELL_H + (rows - 1) * GAP


def _link(start: Point, end: Point, color: str, *, width: float = 1.5, opacity: float = 0.45,
          cls: str = "pkv-link", seq_id: Optional[int] = None) -> str:
    """A smooth curve from a logical block's edge to its physical block's edge (either above the other)."""
    (x1, y1), (x2, y2) = start, end
    dy = y2 - y1
    bend = max(20.0, abs(dy) * 0.45) * (1 if dy >= 0 else -1)
    d = f"M{_fmt(x1)} {_fmt(y1)}C{_fmt(x1)} {_fmt(y1 + bend)} {_fmt(x2)} {_fmt(y2 - bend)} {_fmt(x2)} {_fmt(y2)}"
    return _el("path", class_=cls, d=d, fill="none", stroke=color, stroke_width=width,
               stroke_opacity=opacity, data_seq=seq_id)


def legend_items(seq_ids: Iterable[int], *, shared: bool = False, cached: bool = True,
                 hashed: bool = False, changed: bool = False) -> List[Tuple[str, str, str]]:
    """(kind, colour, label) entries for :func:`legend`: the sequences shown, then one entry per
    block mark (see :func:`pool_block`), each label saying what its mark means."""
    items = [("seq", seq_color(s), f"seq {s}") for s in seq_ids]
    items.append(("free", FREE_FILL, "free: in the free queue"))
    if cached:
        items.append(("cached", CACHED_FILL, "cached: free, keeps its prefix for reuse"))
    if shared:
        items.append(("shared", BACKGROUND, "bands + thick border: shared (ref count > 1)"))
    if hashed:
        items.append(("hashed", CACHED_STROKE, "corner flag: full block in the prefix cache"))
    if changed:
        items.append(("changed", HIGHLIGHT, "dashed halo: changed by the last action"))
    items.append(("fill", NEUTRAL, "solid part = filled slots"))
    return items


def legend(items: Sequence[Tuple[str, str, str]], x0: float, y0: float, width: float) -> Tuple[List[str], float]:
    """Swatch + label entries flowing left to right, wrapping at ``width``; returns parts and height."""
    parts: List[str] = []
    x, y = x0, y0
    for kind, color, label in items:
        w = 14 + 5 + _approx_text_width(label, 11) + 14
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + LINE_H
        if kind == "free":
            swatch = _el("rect", x=x, y=y, width=14, height=12, fill=color, stroke=FREE_STROKE,
                         stroke_dasharray=FREE_DASH)
        elif kind == "cached":
            swatch = _el("rect", x=x, y=y, width=14, height=12, fill=color, stroke=CACHED_STROKE)
        elif kind == "shared":
            swatch = _el("rect", x=x, y=y, width=14, height=12, fill=color, stroke=OUTLINE, stroke_width=SHARED_WIDTH)
        elif kind == "changed":
            swatch = _el("rect", x=x + 1, y=y + 1, width=12, height=10, rx=2, fill="none", stroke=color,
                         stroke_width=2, stroke_dasharray=CHANGED_DASH)
        elif kind == "hashed":
            swatch = (_el("rect", x=x, y=y, width=14, height=12, fill=BACKGROUND, stroke=OUTLINE)
                      + _el("path", d=f"M{x + 6} {y}h8v8z", fill=color))
        elif kind == "fill":
            swatch = (_el("rect", x=x, y=y, width=14, height=12, fill=tint(color))
                      + _el("rect", x=x, y=y, width=8, height=12, fill=color))
        else:
            swatch = _el("rect", x=x, y=y, width=14, height=12, fill=color)
        parts.append(_el("g", swatch + _text(x + 19, y + 10, label, size=11), class_="pkv-legend-item",
                         data_kind=kind))
        x += w
    return parts, (y - y0) + LINE_H


def render_block_table(model: Dict[str, Any], *, columns: int = 16, links: bool = True) -> str:
    """The pool as a grid of blocks, and under it each sequence's logical blocks, linked up to the
    physical blocks they map to."""
    blocks, rows, size = model["blocks"], model["sequences"], model["block_size"]
    columns = max(1, min(columns, len(blocks)))
    pool_x, y = MARGIN + LABEL_W, MARGIN
    parts: List[str] = []
    links_parts: List[str] = []
    used = sum(1 for b in blocks if b["state"] == "used")
    parts.append(_text(MARGIN, y + 11, f"physical pool: {count(len(blocks), 'block')} of {count(size, 'slot')}, "
                       f"{used} used, {len(blocks) - used} free", size=12, weight="bold"))
    y += LINE_H + 4
    pool_pos = _grid_positions(len(blocks), columns, pool_x, y)
    for i in range(0, len(blocks), columns):
        parts.append(_text(pool_x - 8, pool_pos[i][1] + CELL_H / 2 + 4,
                           f"blocks {blocks[i]['block_id']}\u2013{blocks[min(i + columns, len(blocks)) - 1]['block_id']}",
                           size=11, anchor="end", fill=MUTED_TEXT))
    for block, (bx, by) in zip(blocks, pool_pos):
        parts.append(pool_block(block, bx, by))
    where = {b["block_id"]: p for b, p in zip(blocks, pool_pos)}
    y += _grid_height(len(blocks), columns) + 46
    widest = columns
    parts.append(_text(MARGIN, y - 12, "block tables: logical block \u2192 physical block",
                       size=12, weight="bold"))
    if not rows:
        parts.append(_text(pool_x, y + 14, "no sequences yet", size=11, fill=MUTED_TEXT))
        y += LINE_H + 8
    for row in rows:
        color = seq_color(row["seq_id"])
        parts.append(_el("g", _seq_label(MARGIN, y + CELL_H / 2 + 4, row["seq_id"],
                                         f"seq {row['seq_id']} \u00b7 {row['num_tokens']} tok"), class_="pkv-seq-label",
                         data_seq=row["seq_id"], data_tokens=row["num_tokens"]))
        for i, entry in enumerate(row["blocks"]):
            lx = pool_x + i * (CELL_W + GAP)
            parts.append(logical_block(row["seq_id"], entry, size, lx, y))
            if links and entry["block_id"] in where:
                px, py = where[entry["block_id"]]
                links_parts.append(_link((lx + CELL_W / 2, y), (px + CELL_W / 2, py + CELL_H), color,
                                         seq_id=row["seq_id"]))
        widest = max(widest, len(row["blocks"]))
        y += CELL_H + GAP
    for row in model.get("swapped", ()):
        color = seq_color(row["seq_id"])
        text = f"swapped out to the CPU pool: {row['num_tokens']} tokens, no device blocks"
        parts.append(_el(
            "g",
            _seq_label(MARGIN, y + 15, row["seq_id"], f"seq {row['seq_id']}")
            + _el("rect", x=pool_x, y=y + 2, width=_approx_text_width(text) + 16, height=20, rx=3,
                  fill=BACKGROUND, stroke=color, stroke_dasharray="4 2")
            + _text(pool_x + 8, y + 16, text, size=11, fill=MUTED_TEXT),
            class_="pkv-swapped", data_seq=row["seq_id"], data_tokens=row["num_tokens"]))
        y += 24 + GAP
    width = pool_x + widest * (CELL_W + GAP) - GAP + MARGIN
    seqs = [r["seq_id"] for r in rows] + [r["seq_id"] for r in model.get("swapped", ())]
    items = legend_items(seqs, shared=any(b["ref_count"] > 1 for b in blocks),
                         hashed=any(b["state"] == "used" and b.get("hash") for b in blocks),
                         changed=any(b.get("changed") for b in blocks))
    legend_parts, legend_h = legend(items, MARGIN, y + 8, width - 2 * MARGIN)
    height = y + 8 + legend_h + MARGIN
    label = f"paged KV pool with {count(len(blocks), 'block')} and {count(len(rows), 'sequence')}"
    # Links first, so the blocks are drawn over them.
    return _svg(width, height, [_hover_style(seqs)] + links_parts + parts + legend_parts, label, "block-table")


def render_free_queue(entries: Sequence[Dict[str, Any]], num_blocks: int, *, columns: int = 16) -> str:
    """The free queue as a chain from head (handed out next) to tail, free and cached told apart."""
    columns = max(1, columns)
    w, h, gap = 40, 30, 16
    parts: List[str] = []
    cached = sum(1 for e in entries if e["state"] == "cached")
    title = (f"free queue: {len(entries)} of {num_blocks} blocks"
             + (f" ({cached} cached)" if cached else "") + ", head \u2192 tail")
    parts.append(_text(MARGIN, MARGIN + 11, title, size=12, weight="bold"))
    y0 = MARGIN + LINE_H + 16
    if not entries:
        parts.append(_text(MARGIN, y0 + 14, "empty: every block is in use", size=11, fill=MUTED_TEXT))
    for i, entry in enumerate(entries):
        x = MARGIN + (i % columns) * (w + gap)
        y = y0 + (i // columns) * (h + 26)
        fill, stroke = (CACHED_FILL, CACHED_STROKE) if entry["state"] == "cached" else (FREE_FILL, FREE_STROKE)
        tooltip = f"position {i} in the free queue: block {entry['block_id']}, {entry['state']}"
        if entry.get("hash"):
            tooltip += f", hash {entry['hash']}"
        cell = [_el("title", html.escape(tooltip)),
                _el("rect", x=x, y=y, width=w, height=h, rx=3, fill=fill, stroke=stroke,
                    stroke_dasharray=None if entry["state"] == "cached" else FREE_DASH),
                _text(x + w / 2, y + h / 2 + 4, f"#{entry['block_id']}", size=11, anchor="middle", weight="bold")]
        if i == 0:
            cell.append(_text(x + w / 2, y - 5, "head", size=11, anchor="middle", fill=MUTED_TEXT))
        if i == len(entries) - 1:
            cell.append(_text(x + w / 2, y - 5 if i else y + h + 12, "tail", size=11, anchor="middle",
                              fill=MUTED_TEXT))
        if i + 1 < len(entries) and (i + 1) % columns:
            cell.append(_el("path", d=f"M{x + w + 2} {y + h / 2}h{gap - 6}m-4 -3l4 3l-4 3",
                            fill="none", stroke=NEUTRAL, stroke_width=1.2))
        parts.append(_el("g", "".join(cell), class_="pkv-free-entry", data_block_id=entry["block_id"],
                         data_state=entry["state"], data_position=i))
    rows = max(1, cdiv(len(entries), columns))
    y = y0 + rows * (h + 26) - 10
    shown = min(max(len(entries), 1), columns)
    width = max(MARGIN * 2 + shown * (w + gap) - gap, 560)
    legend_parts, legend_h = legend(
        [("free", FREE_FILL, "free (empty)"), ("cached", CACHED_FILL, "cached (keeps a prefix hash; reused last)")],
        MARGIN, y, width - 2 * MARGIN)
    return _svg(width, y + legend_h + MARGIN, parts + legend_parts,
                f"free queue of {count(len(entries), 'block')}", "free-queue")
