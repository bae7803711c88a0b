"""Learner versions live one folder above their source: their relative links must follow."""

import glob
import re
from pathlib import Path

import nbformat

from paged_kv_course.grading.generate import relocate_links


def test_relocate_links():
    assert relocate_links("see [lesson 03](../../lessons/03_the_allocator.ipynb)") == (
        "see [lesson 03](../lessons/03_the_allocator.ipynb)"
    )
    assert relocate_links("[docs](https://example.org/../../x)") == "[docs](https://example.org/../../x)"


ROOT = Path(__file__).resolve().parents[2]


def test_every_relative_link_in_the_course_resolves():
    notebooks = [str(p) for pattern in ("lessons/*.ipynb", "exercises/*.ipynb", "exercises/solutions/*.ipynb")
                 for p in ROOT.glob(pattern)]
    assert len(notebooks) >= 26
    for path in notebooks:
        folder = path.rsplit("/", 1)[0]
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for target in re.findall(r"\]\((\.\.?/[^)#]+)", cell.source):
                assert glob.glob(f"{folder}/{target}"), f"{path}: link {target} leads nowhere"
