"""Colours live only in ``paged_kv_lib/viz/colors.py`` (issue 24): no module of the library spells one.

Every string constant of every other module (f-string parts included) is searched for a hex
colour (``#abc``, ``#a1b2c3``, with alpha too), a CSS colour function (``rgb(``, ``hsl(``...) or
a ``color:`` style with a literal value; and a keyword argument that sets a colour
(``color=``, ``facecolor=``, ``fill=``, ``stroke=``...) may not be given a named colour either
(``"white"``, ``"tab:blue"``, ``"C0"``). ``"none"`` is not a colour (it turns a fill off).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "paged_kv_lib"
HOME = PACKAGE / "viz" / "colors.py"

HEX = re.compile(r"(?<![\w&])#(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})(?![\w-])")
FUNCTION = re.compile(r"\b(?:rgba?|hsla?|hwb|lab|lch|oklab|oklch)\(", re.IGNORECASE)
CSS_COLOR = re.compile(r"(?:^|[;{\s\"'])(?:background-)?colou?r\s*:\s*(?=[#a-zA-Z(])(?!var\()", re.IGNORECASE)
COLOR_KEYWORD = re.compile(r"(?:^|_)(?:colou?rs?|facecolor|edgecolor|fill|stroke|background|bg|fg)$")
NAMED = {
    "white", "black", "red", "green", "blue", "orange", "purple", "yellow", "grey", "gray", "pink",
    "brown", "cyan", "magenta", "lightgrey", "lightgray", "darkgrey", "darkgray", "silver", "navy",
    "teal", "olive", "maroon", "gold", "k", "w", "r", "g", "b", "c", "m", "y",
}
NAMED_PATTERN = re.compile(r"^(?:tab:[a-z]+|xkcd:.+|C\d)$")


def library_modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != HOME)


def colour_literals(source: str):
    """(line, text) of every colour spelled in ``source``."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if HEX.search(text) or FUNCTION.search(text) or CSS_COLOR.search(text):
                found.append((node.lineno, text))
        elif isinstance(node, ast.keyword) and node.arg and COLOR_KEYWORD.search(node.arg):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    name = value.value.strip()
                    if name.lower() in NAMED or NAMED_PATTERN.match(name):
                        found.append((value.lineno, f"{node.arg}={name!r}"))
    return found


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_colour_outside_colors_py(path):
    found = colour_literals(path.read_text(encoding="utf-8"))
    assert not found, (f"{path.relative_to(PACKAGE.parent)} spells colours; name them in viz/colors.py and import "
                       f"them: " + "; ".join(f"line {line}: {text[:60]!r}" for line, text in found))


@pytest.mark.parametrize("snippet", [
    'x = "#0072b2"',
    "x = '#fff'",
    "style = 'padding:1px;color:#555'",
    "style = 'color: red'",
    "x = f'fill:rgb(1, 2, 3)'",
    'ax.bar(names, values, color="white")',
    'ax.plot(xs, ys, color="tab:blue")',
    'ax.bar(names, values, edgecolor="k")',
    'ax.stackplot(x, y, colors=["C0", "C1"])',
    '_el("rect", fill="#ffffff")',
    '_el("rect", stroke="grey")',
])
def test_the_search_finds_what_it_forbids(snippet):
    assert colour_literals(snippet)


@pytest.mark.parametrize("snippet", [
    'text = f"#{block_id}"',  # a block's number, not a colour
    'text = "#12 and #3"',
    '_el("rect", fill="none")',
    'style = f"color:{MUTED_TEXT}"',
    'ax.text(0, 0, "x", color=TEXT_DARK)',
    'label = "the fill colour"',
])
def test_the_search_lets_the_rest_through(snippet):
    assert not colour_literals(snippet)


def test_colors_py_holds_the_palette():
    # The file the rule points to does define colours, so the search above would see them there.
    assert len(colour_literals(HOME.read_text(encoding="utf-8"))) >= 10
