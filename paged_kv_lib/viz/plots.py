"""The course's matplotlib charts: where the KV memory goes, and how many blocks are in use over time.

``plot_memory_breakdown`` and ``plot_usage_over_time`` take plain numbers (dicts, lists, pairs
of lists), so any lesson can feed them from its own cells; each returns the ``Axes`` it drew on.
``plot_results`` draws a simulation's results (anything with ``SimResult``'s fields) as the
same stacked bars beside batch sizes, and returns the figure.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import InvalidArgumentError, InvalidTypeError
from .colors import (
    ALLOCATOR_COLORS,
    BACKGROUND,
    GUIDE_LINE,
    MEMORY_PART_COLORS,
    MEMORY_PART_LABELS,
    MEMORY_PARTS,
    TEXT_DARK,
    text_color_on,
)

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
        raise InvalidTypeError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidArgumentError(f"{what} must be a finite number >= 0, got {value!r}")
    return number


def normalize_breakdown(parts: Mapping[str, float]) -> Dict[str, float]:
    """Map a breakdown's keys onto the canonical categories (missing ones are 0).

    Accepts ``tokens``, ``reserved``, ``internal``, ``external``, ``free`` and spellings like
    ``"token states"`` or ``"internal_fragmentation"``; anything else is an ``InvalidArgumentError`` (a ``ValueError``).
    """
    known = [key for key, _, _ in BREAKDOWN_CATEGORIES]
    out = {key: 0.0 for key in known}
    for raw_key, value in parts.items():
        key = str(raw_key).strip().lower().replace(" ", "_").replace("-", "_")
        key = _ALIASES.get(key, key)
        if key not in out:
            raise InvalidArgumentError(f"unknown memory category {raw_key!r}; use some of {known}")
        out[key] += _number(value, f"{raw_key!r}")
    return out


def plot_memory_breakdown(
    breakdowns: Breakdowns,
    *,
    ax: Any = None,
    percent: bool = False,
    unit: str = "token slots",
    title: Optional[str] = "Where the KV-cache memory goes",
    legend: bool = True,
) -> Any:
    """Stacked bars, one per allocator: token states, reserved, internal, external, free.

    ``breakdowns`` maps a bar's name to its parts, e.g.
    ``{"naive": {"tokens": 900, "reserved": 2100, "internal": 0, "external": 700, "free": 300},
    "paged": {"tokens": 900, "internal": 40, "free": 3060}}`` (or is a list of such pairs,
    to fix the order). ``percent=True`` draws each bar as shares of its own total;
    ``legend=False`` leaves the legend to the caller (a figure with several panels).

    Example::

        from paged_kv_lib.viz import plot_memory_breakdown
        ax = plot_memory_breakdown({"naive": naive_parts, "paged": paged_parts}, percent=True)
    """
    pairs = list(breakdowns.items()) if isinstance(breakdowns, Mapping) else list(breakdowns)
    if not pairs:
        raise InvalidArgumentError("nothing to plot: give at least one breakdown")
    names = [str(name) for name, _ in pairs]
    rows = [normalize_breakdown(parts) for _, parts in pairs]
    totals = [sum(r.values()) for r in rows]
    ax = _axes(ax)
    bottoms = [0.0] * len(rows)
    for key, label, color in BREAKDOWN_CATEGORIES:
        heights = [
            (r[key] / t * 100.0 if t else 0.0) if percent else r[key] for r, t in zip(rows, totals)
        ]
        bars = ax.bar(names, heights, bottom=bottoms, color=color, label=label, edgecolor=BACKGROUND,
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
    if legend:
        handles, labels = ax.get_legend_handles_labels()
        # Legend top to bottom in the same order as the stack.
        ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.figure.tight_layout()
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def _series_pairs(series: Series) -> List[Tuple[str, List[float], List[float]]]:
    def split(label: str, data: Any) -> Tuple[str, List[float], List[float]]:
        if isinstance(data, tuple) and len(data) == 2 and all(hasattr(d, "__len__") for d in data):
            xs, ys = list(data[0]), list(data[1])
            if len(xs) != len(ys):
                raise InvalidArgumentError(f"series {label!r}: {len(xs)} times but {len(ys)} values")
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
        ax.axhline(_number(total, "total"), color=GUIDE_LINE, linestyle="--", linewidth=1,
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


def plot_results(results: Sequence[Any], path: Optional[str] = None, title: Optional[str] = None) -> Any:
    """A simulation's results: the five parts as stacked bars, mean batch sizes, and a block-size
    panel when the paged rows sweep several sizes.

    ``results`` are :class:`~paged_kv_lib.simulate.SimResult` rows (read by field name). Saves to
    ``path`` when given (PNG via the Agg backend) and returns the figure.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(results)
    if not rows:
        raise InvalidArgumentError("nothing to plot: results is empty (expected at least 1 result)")
    paged = [r for r in rows if r.block_size is not None]
    sweep = len({r.block_size for r in paged}) > 1
    panels = 3 if sweep else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.8), squeeze=False)
    parts = [key for key, _, _ in MEMORY_PARTS]
    plot_memory_breakdown([(r.label, {p: getattr(r, p) for p in parts}) for r in rows], ax=axes[0][0],
                          percent=True, legend=False)
    axes[0][0].set_ylabel("KV-cache capacity (%)")
    axes[0][0].set_xticks(range(len(rows)), [r.label for r in rows], rotation=45, ha="right")
    _batches(axes[0][1], rows)
    if sweep:
        _sweep(axes[0][2], paged)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(parts), fontsize=9, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def _batches(ax: Any, results: Sequence[Any]) -> None:
    names = [r.label for r in results]
    values = [r.mean_batch for r in results]
    kinds = ["paged" if r.block_size is not None else "contiguous" for r in results]
    ax.bar(names, values, color=[ALLOCATOR_COLORS[k] for k in kinds])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("mean running requests")
    ax.set_title("Batch size")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.spines[["top", "right"]].set_visible(False)


def _sweep(ax: Any, paged: Sequence[Any]) -> None:
    rows = sorted(paged, key=lambda r: r.block_size)
    sizes = [r.block_size for r in rows]
    for part in ("token_states", "reserved", "internal", "free"):
        ax.plot(sizes, [100 * getattr(r, part) for r in rows], marker="o", color=MEMORY_PART_COLORS[part],
                label=MEMORY_PART_LABELS[part].split(" (")[0])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("capacity (%)")
    ax.set_title("Paged: block size sweep")
    twin = ax.twinx()
    twin.plot(sizes, [r.mean_batch for r in rows], marker="s", linestyle="--", color=TEXT_DARK, label="mean batch")
    twin.set_ylabel("mean running requests")
    lines, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(lines + more, names + more_names, fontsize=9, loc="center right")
