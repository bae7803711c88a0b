"""The matplotlib helpers draw exactly the numbers they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from paged_kv_lib.viz import plot_memory_breakdown, plot_usage_over_time  # noqa: E402
from paged_kv_lib.viz.plots import BREAKDOWN_CATEGORIES, normalize_breakdown  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


NAIVE = {"tokens": 900, "reserved": 2100, "internal": 0, "external": 700, "free": 300}
PAGED = {"token states": 900, "internal fragmentation": 40, "free": 3060}


def stacks(ax):
    """Per category label: the bars' (height, bottom) in x order."""
    return {c.get_label(): [(p.get_height(), p.get_y()) for p in c.patches] for c in ax.containers}


def test_breakdown_bars_stack_the_given_numbers():
    ax = plot_memory_breakdown({"naive": NAIVE, "paged": PAGED})
    drawn = stacks(ax)
    rows = [normalize_breakdown(NAIVE), normalize_breakdown(PAGED)]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["naive", "paged"]
    bottoms = [0.0, 0.0]
    for key, label, _ in BREAKDOWN_CATEGORIES:
        for i, row in enumerate(rows):
            assert drawn[label][i] == pytest.approx((row[key], bottoms[i]))
            bottoms[i] += row[key]
    assert bottoms == [sum(NAIVE.values()), sum(PAGED.values())]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [l for _, l, _ in BREAKDOWN_CATEGORIES][::-1]


def test_breakdown_in_percent_fills_each_bar_to_100():
    ax = plot_memory_breakdown([("paged", PAGED), ("naive", NAIVE)], percent=True)
    drawn = stacks(ax)
    for i in range(2):
        assert sum(drawn[label][i][0] for _, label, _ in BREAKDOWN_CATEGORIES) == pytest.approx(100.0)
    tokens_label = BREAKDOWN_CATEGORIES[0][1]
    assert drawn[tokens_label][0][0] == pytest.approx(100.0 * 900 / sum(PAGED.values()))
    assert any(t.get_text() == f"{900 / sum(NAIVE.values()):.0%}" for t in ax.texts)


def test_breakdown_refuses_unknown_or_negative_parts():
    with pytest.raises(ValueError, match="unknown memory category"):
        plot_memory_breakdown({"x": {"tokens": 1, "wasted": 2}})
    with pytest.raises(ValueError):
        plot_memory_breakdown({"x": {"tokens": -1}})
    with pytest.raises(TypeError):
        plot_memory_breakdown({"x": {"tokens": "many"}})
    with pytest.raises(ValueError):
        plot_memory_breakdown({})


def test_normalize_breakdown_accepts_spellings():
    assert normalize_breakdown({"Token-States": 3, "external_fragmentation": 2}) == {
        "tokens": 3.0, "reserved": 0.0, "internal": 0.0, "external": 2.0, "free": 0.0}


def test_usage_over_time_draws_each_series_and_the_capacity():
    fig, ax = plt.subplots()
    used = [0, 2, 5, 5, 3, 7]
    out = plot_usage_over_time({"paged": used, "naive": ([0, 2, 4], [4, 8, 8])}, total=8, ax=ax)
    assert out is ax
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["paged"].get_ydata()) == used
    assert list(lines["paged"].get_xdata()) == list(range(len(used)))
    assert list(lines["naive"].get_xdata()) == [0, 2, 4]
    assert set(lines["capacity (8)"].get_ydata()) == {8}
    assert lines["paged"].get_drawstyle() == "steps-post"


def test_usage_over_time_single_series_and_errors():
    ax = plot_usage_over_time([1, 2, 3])
    (line,) = ax.get_lines()
    assert line.get_label() == "blocks used" and list(line.get_ydata()) == [1, 2, 3]
    assert ax.get_legend() is None
    with pytest.raises(ValueError):
        plot_usage_over_time({"a": ([0, 1], [1])})
    with pytest.raises(ValueError):
        plot_usage_over_time([1, -2])
