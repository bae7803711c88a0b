"""Static SVG/HTML of one token's address translation (lesson 04's picture and its arithmetic).

Built from the same block cells, links and primitives as the pool picture in ``svg.py``, so a
block looks the same in every view; like it, every function is pure and returns a string.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional

from .colors import HIGHLIGHT, MUTED_TEXT, TABLE_LABEL_TEXT
from .svg import (
    CELL_H,
    CELL_W,
    FONT,
    GAP,
    LABEL_W,
    MARGIN,
    _el,
    _grid_height,
    _grid_positions,
    _link,
    _seq_label,
    _svg,
    _text,
    logical_block,
    pool_block,
)


def render_translation(model: Dict[str, Any], *, columns: int = 16) -> str:
    """One token's address translation: the sequence's logical blocks above the pool, the token's
    logical block linked to its physical block, and the slot outlined in both."""
    t, blocks, row = model["translation"], model["blocks"], model["sequence"]
    columns = max(1, min(columns, len(blocks)))
    x0 = MARGIN + LABEL_W
    parts: List[str] = []
    y: float = MARGIN
    if t is None:
        parts.append(_text(MARGIN, y + 14, "no sequence to translate: allocate one first", size=12,
                           fill=MUTED_TEXT))
        return _svg(420, 40, parts, "address translation (no sequence)", "translation")
    parts.append(_el("g", _seq_label(MARGIN, y + CELL_H / 2 + 4, t["seq_id"], f"seq {t['seq_id']}"),
                     class_="pkv-seq-label", data_seq=t["seq_id"]))
    logical_pos = {}
    for i, entry in enumerate(row["blocks"]):
        lx = x0 + i * (CELL_W + GAP)
        logical_pos[entry["logical"]] = (lx, y)
        offset = t["offset"] if entry["logical"] == t["logical_block"] else None
        parts.append(logical_block(t["seq_id"], entry, t["block_size"], lx, y, highlight_offset=offset))
    y += CELL_H + 56
    parts.append(_text(MARGIN, y + CELL_H / 2 + 4, "physical pool", size=11, weight="bold"))
    pool_pos = _grid_positions(len(blocks), columns, x0, y)
    link = ""
    for block, (bx, by) in zip(blocks, pool_pos):
        hit = block["block_id"] == t["block_id"]
        parts.append(pool_block(block, bx, by, highlighted=hit, highlight_offset=t["offset"] if hit else None))
        if hit:
            lx, ly = logical_pos[t["logical_block"]]
            link = _link((lx + CELL_W / 2, ly + CELL_H), (bx + CELL_W / 2, by), HIGHLIGHT,
                         width=2.5, opacity=0.9, cls="pkv-link pkv-translation-link")
    y += _grid_height(len(blocks), columns) + MARGIN
    width = x0 + max(columns, len(row["blocks"])) * (CELL_W + GAP) - GAP + MARGIN
    label = (f"token {t['position']} of seq {t['seq_id']}: logical block {t['logical_block']}, "
             f"offset {t['offset']}, physical block {t['block_id']}, slot {t['slot']}")
    return _svg(width, y, parts + [link], label, "translation")


def translation_table(t: Optional[Dict[str, Any]]) -> str:
    """The arithmetic of one translation as a small HTML table (readable without the picture)."""
    if t is None:
        return _el("div", "no sequence to translate", class_="pkv-translation-text")
    bs = t["block_size"]
    rows = [
        ("token position", f"{t['position']} (of {t['num_tokens']} in seq {t['seq_id']})"),
        ("logical block", f"{t['position']} // {bs} = {t['logical_block']}"),
        ("offset in block", f"{t['position']} % {bs} = {t['offset']}"),
        ("physical block", f"block_table[{t['logical_block']}] = {t['block_id']}"),
        ("slot", f"{t['block_id']} \u00d7 {bs} + {t['offset']} = {t['slot']}"),
    ]
    cells = "".join(
        _el("tr", _el("td", html.escape(k), style=f"padding:1px 10px 1px 0;color:{TABLE_LABEL_TEXT}")
            + _el("td", _el("code", html.escape(v))), data_field=k.replace(" ", "-"))
        for k, v in rows)
    return _el("table", cells, class_="pkv-translation-text", data_slot=t["slot"],
               data_block_id=t["block_id"], style="border-collapse:collapse;font-size:13px;font-family:" + FONT)
