"""The course's colours: one fixed colour per sequence id, and one per block state.

A sequence keeps its colour in every view and every lesson (``seq_color(3)`` is always
the same), so a learner can follow a sequence from the block table to the pool by colour.
"""

from __future__ import annotations

from typing import Dict, Tuple

# Ten colours told apart with the common colour-vision deficiencies too: Okabe and Ito's set
# (minus black and yellow) followed by Paul Tol's muted ones. No grey or pale yellow: those mean
# "free" and "cached" in every view. Text never uses them: a label is dark text beside a swatch.
SEQUENCE_PALETTE: Tuple[str, ...] = (
    "#0072b2",  # blue
    "#e69f00",  # orange
    "#009e73",  # bluish green
    "#cc79a7",  # reddish purple
    "#56b4e9",  # sky blue
    "#d55e00",  # vermillion
    "#332288",  # indigo
    "#999933",  # olive
    "#882255",  # wine
    "#44aa99",  # teal
)

# The five parts of KV memory, bottom of a stacked bar to top: (key, label, colour). Every chart
# of the course draws them in these colours (blue shades for what holds or will hold tokens,
# orange and purple for the two kinds of waste, grey for free), safe under deuteranopia and
# protanopia, and with no red set against green.
MEMORY_PARTS: Tuple[Tuple[str, str, str], ...] = (
    ("token_states", "token states (K/V in use)", "#0072b2"),
    ("reserved", "reserved for future tokens", "#56b4e9"),
    ("internal", "internal fragmentation", "#e69f00"),
    ("external", "external fragmentation", "#882255"),
    ("free", "free", "#d9d9d9"),
)
MEMORY_PART_COLORS: Dict[str, str] = {key: color for key, _, color in MEMORY_PARTS}
MEMORY_PART_LABELS: Dict[str, str] = {key: label for key, label, _ in MEMORY_PARTS}

# Fill / outline of blocks that no sequence holds.
FREE_FILL = "#f2f2f2"
FREE_STROKE = "#b5b5b5"
CACHED_FILL = "#fff1c7"
CACHED_STROKE = "#c99700"
HIGHLIGHT = "#111111"  # the translated token's block and slot, and the "changed" halo; near-black reads for everyone
TEXT_DARK = "#222222"
TEXT_LIGHT = "#ffffff"
MUTED_TEXT = "#666666"
MUTED_TEXT_SHORT = "#666"  # the same grey, as the playground's stored log HTML spells it
TABLE_LABEL_TEXT = "#555"  # the label column of the translation table
BACKGROUND = "#ffffff"  # a block's header strip, label pills, slot dividers
NEUTRAL = "#888888"  # no sequence colour: an ownerless used block, the "filled slots" swatch, arrows
OUTLINE = "#333333"  # the border of a used block and of the legend's shared/hashed swatches

# The dash patterns of the block marks (SVG stroke-dasharray): one pattern, one meaning, in the
# blocks and in the legend alike.
FREE_DASH = "4 2"  # the thin grey border of a free block
CHANGED_DASH = "5 3"  # the halo around a block the last action changed
GUIDE_LINE = "#444444"  # a reference line on a chart (a pool's capacity)
OK_TEXT = "#1b5e20"  # a log line for an action that succeeded
ERROR_TEXT = "#b00020"  # a log line for an action that was refused or broke an invariant

# A simulation's rows by kind of allocator (its batch-size bars): paged in the first sequence
# colour, contiguous reservations in the neutral grey.
ALLOCATOR_COLORS: Dict[str, str] = {"paged": SEQUENCE_PALETTE[0], "contiguous": NEUTRAL}

# A request's state over an engine run (lesson 07's timeline), from the same safe set.
REQUEST_STATE_COLORS: Dict[str, str] = {
    "waiting": SEQUENCE_PALETTE[1],  # orange
    "running": SEQUENCE_PALETTE[0],  # blue
    "swapped": SEQUENCE_PALETTE[3],  # reddish purple
    "finished": FREE_FILL,
}
# What a step's batched tokens are (stacked bars of one step): decodes and prompt chunks.
TOKEN_KIND_COLORS: Dict[str, str] = {"decode": SEQUENCE_PALETTE[0], "prefill": SEQUENCE_PALETTE[1]}
EVENT_LINE = SEQUENCE_PALETTE[5]  # vermillion: a moment marked on a time axis (a preemption)

STATE_COLORS: Dict[str, Tuple[str, str]] = {
    "free": (FREE_FILL, FREE_STROKE),
    "cached": (CACHED_FILL, CACHED_STROKE),
}


def seq_color(seq_id: int) -> str:
    """The colour of sequence ``seq_id`` (cycles through :data:`SEQUENCE_PALETTE`)."""
    return SEQUENCE_PALETTE[int(seq_id) % len(SEQUENCE_PALETTE)]


def _rgb(hex_color: str) -> Tuple[float, float, float]:
    value = hex_color.lstrip("#")
    r, g, b = (int(value[i : i + 2], 16) / 255.0 for i in (0, 2, 4))
    return r, g, b


def text_color_on(hex_color: str) -> str:
    """Dark or light text, whichever reads better on ``hex_color`` (by relative luminance)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in _rgb(hex_color))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    # Compare contrast ratios against white (1.0) and near-black (~0.016).
    return TEXT_LIGHT if (1.05 / (luminance + 0.05)) > ((luminance + 0.05) / 0.066) else TEXT_DARK


def tint(hex_color: str, amount: float = 0.75) -> str:
    """``hex_color`` mixed with white (``amount`` 0 = unchanged, 1 = white): the empty part of a block."""
    r, g, b = (c + (1.0 - c) * amount for c in _rgb(hex_color))
    return "#{:02x}{:02x}{:02x}".format(round(r * 255), round(g * 255), round(b * 255))
