"""Debug tasks are passed by repairing the given code (issue 34, item 2): the given code the checks hold is the
notebooks' provided cell, each reference repair stays within its task's stated limit, and the text states it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paged_kv_course.grading._common_given import GIVEN
from paged_kv_course.grading._common_repair import changed_lines, repair_distance
from paged_kv_course.grading.notebook_tasks import KINDS

REPO = Path(__file__).resolve().parents[2]


def _notebook(task: str, learner: bool = False) -> list:
    folder = REPO / "exercises" if learner else REPO / "exercises" / "solutions"
    (path,) = folder.glob(f"{task[:2]}_*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _solution(cells: list, task: str) -> tuple[int, dict]:
    for index, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("paged_kv", {})
        if meta.get("task") == task and meta.get("role") == "solution":
            return index, cell
    raise KeyError(task)


def test_every_debug_task_has_given_code():
    debug = set()
    for path in sorted((REPO / "exercises" / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("paged_kv", {})
            if meta.get("role") == "solution" and meta.get("kind") == "debug":
                debug.add(meta["task"])
    assert "debug" in KINDS and debug == set(GIVEN)


@pytest.mark.parametrize("task", sorted(GIVEN))
@pytest.mark.parametrize("learner", [False, True], ids=["solution", "learner"])
def test_the_given_code_is_the_provided_cell(task, learner):
    cells = _notebook(task, learner)
    index, _ = _solution(cells, task)
    provided = ["".join(c["source"]) for c in cells[:index] if c["cell_type"] == "code"]
    assert GIVEN[task].given in provided


@pytest.mark.parametrize("task", sorted(GIVEN))
def test_the_reference_is_a_repair_and_the_text_states_the_limit(task):
    cells = _notebook(task)
    index, cell = _solution(cells, task)
    count, _ = repair_distance(GIVEN[task], "".join(cell["source"]))
    assert 0 < count <= GIVEN[task].limit
    header = "".join("".join(c["source"]) for c in cells[max(0, index - 3):index] if c["cell_type"] == "markdown")
    assert f"At most {GIVEN[task].limit} changed lines is a repair" in header


def test_changed_lines_counts_a_replaced_run_by_its_longer_side():
    assert changed_lines(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert changed_lines(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert changed_lines(["a", "b", "c"], ["a", "x", "y", "c"]) == 2
    assert changed_lines(["a", "b", "c"], ["a", "c"]) == 1
    assert changed_lines(["a", "b"], ["x", "y", "z"]) == 3


def test_comments_docstrings_and_layout_do_not_count():
    spec = GIVEN["09.5"]
    given = spec.given.replace("def split_k_decode_with_bugs", "def split_k_decode")
    relaid = given.replace("  # the usual softmax scale", "").replace('"""Decode', '"""Another docstring. Decode')
    assert repair_distance(spec, relaid)[0] == 0
