"""A picture of chained prefix-block keys: each key hashes its parent's key and its block's tokens.

Used by lesson 06. One row per prompt: the prompt's full blocks (their tokens), and under
each block its key, drawn as an arrow from the parent key. Equal keys get the same colour,
so a reader sees where two prompts can share blocks and where the chain makes the same
tokens after a different prefix a different key.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..errors import InvalidArgumentError
from ..prefix_cache import chain_keys
from .colors import FREE_FILL, FREE_STROKE, SEQUENCE_PALETTE, TEXT_DARK, text_color_on, tint


def plot_hash_chain(
    prompts: Sequence[Sequence[int]],
    block_size: int,
    *,
    labels: Optional[Sequence[str]] = None,
    title: str = "Prefix-block keys chain: key[i] = hash(key[i-1], tokens of block i)",
) -> Figure:
    """Draw each prompt's full blocks and their chained keys; equal keys share a colour."""
    if block_size < 1:
        raise InvalidArgumentError(f"block_size must be >= 1, got {block_size}")
    rows = [list(p) for p in prompts]
    if not rows:
        raise InvalidArgumentError("give at least one prompt")
    labels = list(labels) if labels is not None else [f"prompt {i}" for i in range(len(rows))]
    keys = [chain_keys(tokens, block_size) for tokens in rows]
    colours: Dict[bytes, str] = {}
    for row in keys:
        for key in row:
            colours.setdefault(key, SEQUENCE_PALETTE[len(colours) % len(SEQUENCE_PALETTE)])

    width = max(len(r) for r in keys) if any(keys) else 1
    fig, ax = plt.subplots(figsize=(2.0 + 2.1 * width, 1.55 * len(rows) + 0.5))
    box_w, box_h, gap = 1.7, 0.45, 0.4
    for r, (tokens, row_keys) in enumerate(zip(rows, keys)):
        y = -1.5 * r
        ax.text(-0.25, y + 0.05, labels[r], ha="right", va="center", fontsize=11, color=TEXT_DARK)
        for i, key in enumerate(row_keys):
            x = i * (box_w + gap)
            block = tokens[i * block_size:(i + 1) * block_size]
            ax.add_patch(FancyBboxPatch((x, y), box_w, box_h, boxstyle="round,pad=0.02",
                                        facecolor=FREE_FILL, edgecolor=FREE_STROKE))
            ax.text(x + box_w / 2, y + box_h / 2, " ".join(str(t) for t in block), ha="center",
                    va="center", fontsize=11, color=TEXT_DARK)
            colour = colours[key]
            ky = y - 0.75
            ax.add_patch(FancyBboxPatch((x, ky), box_w, box_h, boxstyle="round,pad=0.02",
                                        facecolor=tint(colour, 0.2), edgecolor=colour))
            fill = tint(colour, 0.2)
            ax.text(x + box_w / 2, ky + box_h / 2, f"key {key.hex()[:6]}", ha="center", va="center",
                    fontsize=11, color=text_color_on(fill), family="monospace")
            ax.add_patch(FancyArrowPatch((x + box_w / 2, y), (x + box_w / 2, ky + box_h),
                                         arrowstyle="-|>", mutation_scale=10, color=FREE_STROKE))
            if i:
                ax.add_patch(FancyArrowPatch((x - gap, ky + box_h / 2), (x, ky + box_h / 2),
                                             arrowstyle="-|>", mutation_scale=12, color=TEXT_DARK))
        tail = len(tokens) - len(row_keys) * block_size
        if tail:
            x = len(row_keys) * (box_w + gap)
            ax.text(x, y + box_h / 2, f"+{tail} token(s): partial block, no key", va="center",
                    fontsize=11, color=TEXT_DARK)
    ax.set_xlim(-2.2, width * (box_w + gap) + 2.2)
    ax.set_ylim(-1.5 * (len(rows) - 1) - 1.0, 0.8)
    ax.axis("off")
    ax.set_title(title, fontsize=12, color=TEXT_DARK)
    fig.tight_layout()
    return fig
