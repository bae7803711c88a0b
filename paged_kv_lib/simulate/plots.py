"""Matplotlib pictures of simulation results: the paper-style memory breakdown and batch sizes."""

from __future__ import annotations

from typing import List, Optional, Sequence

from .metrics import PARTS, SimResult



def _palette():
    # The course's one palette lives with the views; imported here, when a chart is drawn,
    # so the simulation itself never loads the widget stack.
    from ..viz.colors import MEMORY_PART_COLORS, MEMORY_PART_LABELS, text_color_on

    return MEMORY_PART_COLORS, MEMORY_PART_LABELS, text_color_on


def label(result: SimResult) -> str:
    """A short row name: the allocator, plus the block size for paged rows."""
    if result.block_size is None:
        return result.allocator
    return f"{result.allocator} B={result.block_size}"


def plot_results(results: Sequence[SimResult], path: Optional[str] = None, title: Optional[str] = None):
    """Stacked bars of the five parts and mean batch sizes; adds a block-size panel for a sweep.

    Saves to ``path`` when given (PNG via the Agg backend) and returns the figure.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("nothing to plot: results is empty")
    paged = [r for r in results if r.block_size is not None]
    sweep = len({r.block_size for r in paged}) > 1
    panels = 3 if sweep else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.8), squeeze=False)
    _breakdown(axes[0][0], results)
    _batches(axes[0][1], results)
    if sweep:
        _sweep(axes[0][2], paged)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(PARTS), fontsize=9, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def _breakdown(ax, results: Sequence[SimResult]) -> None:
    colors, labels, text_color_on = _palette()
    names = [label(r) for r in results]
    bottom = [0.0] * len(results)
    for part in PARTS:
        values = [100 * getattr(r, part) for r in results]
        ax.bar(names, values, bottom=bottom, color=colors[part], label=labels[part])
        for i, (b, v) in enumerate(zip(bottom, values)):
            if v >= 6:  # a direct label on every segment tall enough to hold one
                ax.text(i, b + v / 2, f"{v:.0f}", ha="center", va="center", fontsize=9,
                        color=text_color_on(colors[part]))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("KV-cache capacity (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Where the KV-cache memory goes")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")


def _batches(ax, results: Sequence[SimResult]) -> None:
    names = [label(r) for r in results]
    values = [r.mean_batch for r in results]
    ax.bar(names, values, color=["#0072b2" if r.block_size is not None else "#888888" for r in results])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("mean running requests")
    ax.set_title("Batch size")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")


def _sweep(ax, paged: List[SimResult]) -> None:
    rows = sorted(paged, key=lambda r: r.block_size)
    sizes = [r.block_size for r in rows]
    colors, labels, _ = _palette()
    for part in ("token_states", "reserved", "internal", "free"):
        ax.plot(sizes, [100 * getattr(r, part) for r in rows], marker="o", color=colors[part],
                label=labels[part].split(" (")[0])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("capacity (%)")
    ax.set_title("Paged: block size sweep")
    twin = ax.twinx()
    twin.plot(sizes, [r.mean_batch for r in rows], marker="s", linestyle="--", color="#222222", label="mean batch")
    twin.set_ylabel("mean running requests")
    lines, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(lines + more, names + more_names, fontsize=9, loc="center right")


def __getattr__(name: str):
    # PART_COLORS / PART_LABELS: the old names of the palette, now defined once in viz/colors.py.
    if name in ("PART_COLORS", "PART_LABELS"):
        colors, labels, _ = _palette()
        return colors if name == "PART_COLORS" else labels
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
