"""The course's matplotlib charts: where the KV memory goes, and how many blocks are in use over time.

They take plain numbers (dicts, lists, pairs of lists), not the simulate package's types,
so any lesson can feed them from its own cells. Each returns the ``Axes`` it drew on.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .colors import MEMORY_PARTS, text_color_on

# Canonical categories of a memory breakdown, bottom of the bar to top, with label and colour
# (the course's one palette, from colors.py; "tokens" is this module's short key for token states).
BREAKDOWN_CATEGORIES: Tuple[Tuple[str, str, str], ...] = tuple(
    ("tokens" if key == "token_states" else key, label, color) for key, label, color in MEMORY_PARTS
)
_ALIASES = {
    "token_states": "tokens",
    "token": "tokens",
    "used": "tokens",
    "reserved_unused": "reserved",
    "reservation": "reserved",
    "internal_fragmentation": "internal",
    "external_fragmentation": "external",
}

Breakdowns = Union[Mapping[str, Mapping[str, float]], Sequence[Tuple[str, Mapping[str, float]]]]
Series = Union[Sequence[float], Mapping[str, Union[Sequence[float], Tuple[Sequence[float], Sequence[float]]]]]


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 4))
    return ax


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return number


def normalize_breakdown(parts: Mapping[str, float]) -> Dict[str, float]:
    """Map a breakdown's keys onto the canonical categories (missing ones are 0).

    Accepts ``tokens``, ``reserved``, ``internal``, ``external``, ``free`` and spellings like
    ``"token states"`` or ``"internal_fragmentation"``; anything else is a ``ValueError``.
    """
    known = [key for key, _, _ in BREAKDOWN_CATEGORIES]
    out = {key: 0.0 for key in known}
    for raw_key, value in parts.items():
        key = str(raw_key).strip().lower().replace(" ", "_").replace("-", "_")
        key = _ALIASES.get(key, key)
        if key not in out:
            raise ValueError(f"unknown memory category {raw_key!r}; use some of {known}")
        out[key] += _number(value, f"{raw_key!r}")
    return out


def plot_memory_breakdown(
    breakdowns: Breakdowns,
    *,
    ax: Any = None,
    percent: bool = False,
    unit: str = "token slots",
    title: Optional[str] = "Where the KV-cache memory goes",
) -> Any:
    """Stacked bars, one per allocator: token states, reserved, internal, external, free.

    ``breakdowns`` maps a bar's name to its parts, e.g.
    ``{"naive": {"tokens": 900, "reserved": 2100, "internal": 0, "external": 700, "free": 300},
    "paged": {"tokens": 900, "internal": 40, "free": 3060}}`` (or is a list of such pairs,
    to fix the order). ``percent=True`` draws each bar as shares of its own total.

    Example::

        from paged_kv_lib.viz import plot_memory_breakdown
        ax = plot_memory_breakdown({"naive": naive_parts, "paged": paged_parts}, percent=True)
    """
    pairs = list(breakdowns.items()) if isinstance(breakdowns, Mapping) else list(breakdowns)
    if not pairs:
        raise ValueError("nothing to plot: give at least one breakdown")
    names = [str(name) for name, _ in pairs]
    rows = [normalize_breakdown(parts) for _, parts in pairs]
    totals = [sum(r.values()) for r in rows]
    ax = _axes(ax)
    bottoms = [0.0] * len(rows)
    for key, label, color in BREAKDOWN_CATEGORIES:
        heights = [
            (r[key] / t * 100.0 if t else 0.0) if percent else r[key] for r, t in zip(rows, totals)
        ]
        bars = ax.bar(names, heights, bottom=bottoms, color=color, label=label, edgecolor="white",
                      linewidth=0.8, width=0.6)
        for bar, h, bottom, total, r in zip(bars, heights, bottoms, totals, rows):
            share = r[key] / total if total else 0.0
            if share >= 0.06:  # label only segments tall enough to hold text
                ax.text(bar.get_x() + bar.get_width() / 2, bottom + h / 2, f"{share:.0%}",
                        ha="center", va="center", fontsize=9, color=text_color_on(color))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("share of the cache (%)" if percent else unit)
    if percent:
        ax.set_ylim(0, 100)
    if title:
        ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    # Legend top to bottom in the same order as the stack.
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.figure.tight_layout()
    return ax


def _series_pairs(series: Series) -> List[Tuple[str, List[float], List[float]]]:
    def split(label: str, data: Any) -> Tuple[str, List[float], List[float]]:
        if isinstance(data, tuple) and len(data) == 2 and all(hasattr(d, "__len__") for d in data):
            xs, ys = list(data[0]), list(data[1])
            if len(xs) != len(ys):
                raise ValueError(f"series {label!r}: {len(xs)} times but {len(ys)} values")
        else:
            ys = list(data)
            xs = list(range(len(ys)))
        return label, [float(x) for x in xs], [_number(y, f"series {label!r} value") for y in ys]

    if isinstance(series, Mapping):
        return [split(str(label), data) for label, data in series.items()]
    return [split("blocks used", series)]


def plot_usage_over_time(
    series: Series,
    *,
    total: Optional[float] = None,
    ax: Any = None,
    xlabel: str = "step",
    ylabel: str = "blocks in use",
    title: Optional[str] = "Blocks in use over time",
) -> Any:
    """Blocks in use against time, as steps, with the pool's capacity as a dashed line.

    ``series`` is a list of values (one per step), or a dict of named series, each a list
    of values or a pair ``(times, values)``.

    Example::

        from paged_kv_lib.viz import plot_usage_over_time
        used = []
        for step in range(50):
            ...                                   # drive the allocator
            used.append(alloc.num_used_blocks)
        plot_usage_over_time(used, total=alloc.num_blocks)
    """
    pairs = _series_pairs(series)
    ax = _axes(ax)
    for label, xs, ys in pairs:
        ax.step(xs, ys, where="post", label=label, linewidth=1.8)
    if total is not None:
        ax.axhline(_number(total, "total"), color="#444444", linestyle="--", linewidth=1,
                   label=f"capacity ({total:g})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    if len(pairs) > 1 or total is not None:
        ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return ax
