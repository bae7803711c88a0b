"""The grader's own tests, on the demo exercise in tests/fixtures/grading (no torch in its kernels).

Fast tests cover splicing, finding the pristine exercise, scoring and the command's
errors without a kernel. Three tests start kernels: one ``paged-kv grade`` of a single
submission, one that a crashed kernel costs only the cells after it, and one batch over
a class of five learners (correct, wrong, empty, invalid JSON, endless loops) that
checks every gradebook row.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Dict

import nbformat
import pytest

from paged_kv_lib import cli
from paged_kv_lib.grading import batch, grader
from paged_kv_lib.grading.notebook_tasks import cell_task, find_tasks, read_notebook

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "grading"
PRISTINE = FIXTURES / "solutions"
LEARNER = FIXTURES / "90_demo.ipynb"
TIMEOUT = 5  # seconds per cell: the endless loops must cost little

ADD_OK = "def add(a, b):\n    return a + b\n"
ADD_WRONG = "def add(a, b):\n    return a - b\n"
ADD_LOOP = "def add(a, b):\n    while True:\n        pass\n"
COUNTER_OK = (
    "class Counter:\n"
    "    def __init__(self):\n"
    "        self.count = 0\n"
    "\n"
    "    def bump(self):\n"
    "        print('debug: bump')  # extra output does not fail a check\n"
    "        self.count += 1\n"
    "        return self.count\n"
)
COUNTER_CRASH = "import os\n\nclass Counter:\n    def __init__(self):\n        os._exit(1)\n"
BLOCKS_OK = "def blocks_needed(num_tokens, block_size):\n    return -(-num_tokens // block_size)\n"
BLOCKS_FLOOR = "def blocks_needed(num_tokens, block_size):\n    return num_tokens // block_size\n"
BLOCKS_STUBBORN = (  # swallows the interrupt: the kernel has to be stopped
    "import time\n\n"
    "def blocks_needed(num_tokens, block_size):\n"
    "    while True:\n"
    "        try:\n"
    "            time.sleep(0.2)\n"
    "        except KeyboardInterrupt:\n"
    "            pass\n"
)
BLOCKS_MUTE = (  # hides the check's success line
    "import io, sys\n\n"
    "def blocks_needed(num_tokens, block_size):\n"
    "    sys.stdout = io.StringIO()\n"
    "    return -(-num_tokens // block_size)\n"
)
NOT_IMPLEMENTED = "NotImplementedError: Task {task}: replace this line with your code"


@pytest.fixture(autouse=True)
def _demo_checks_importable(monkeypatch):
    """The demo exercise imports ``demo_checks``; its kernels inherit this environment."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))


def submission(sources: Dict[str, str], edit_checks: Dict[str, str] = None, drop_checks=(),
               drop_meta=()) -> nbformat.NotebookNode:
    """The learner version with solution cells replaced, check cells edited or deleted, metadata lost."""
    nb = read_notebook(LEARNER)
    cells = []
    for cell in nb.cells:
        found = cell_task(cell)
        if found and found[1] == "solution" and found[0] in sources:
            cell.source = sources[found[0]]
        if found and found[1] == "check":
            if found[0] in drop_checks:
                continue
            if edit_checks and found[0] in edit_checks:
                cell.source = edit_checks[found[0]]
        if found and found[0] in drop_meta and found[1] == "solution":
            cell.metadata = {}
        cells.append(cell)
    nb.cells = cells
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# ---------------------------------------------------------------------------------------
# Without a kernel


def test_splice_takes_only_solution_cells():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    sub = submission({"90.1": ADD_WRONG}, edit_checks={"90.1": "print('PASSED 90.1')"}, drop_checks=("90.3",))
    sub.cells.insert(1, nbformat.v4.new_code_cell("import demo_checks\ndemo_checks.check_add = print"))
    spliced, notes = grader.splice(pristine, sub)
    assert len(spliced.cells) == len(pristine.cells)
    for mine, theirs in zip(spliced.cells, pristine.cells):
        found = cell_task(theirs)
        if found == ("90.1", "solution"):
            assert mine.source == ADD_WRONG
        elif found and found[1] == "solution":
            assert 'raise NotImplementedError("Task' in mine.source
        else:
            assert mine == theirs, "every cell but the solution cells comes from the pristine copy"
    assert notes == []


def test_splice_falls_back_to_definitions_when_metadata_is_lost():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    sub = submission({"90.2": COUNTER_OK, "90.3": "x = 1\n"}, drop_meta=("90.2", "90.3"))
    sub.cells.append(nbformat.v4.new_code_cell(pristine.cells[1].source))  # an unchanged setup cell
    spliced, notes = grader.splice(pristine, sub)
    tasks = find_tasks(pristine)
    assert spliced.cells[tasks["90.2"].solution_cell].source == COUNTER_OK
    assert "raise NotImplementedError" in spliced.cells[tasks["90.3"].solution_cell].source
    assert any("90.2" in n and "matched cell" in n for n in notes), notes
    assert any("90.3" in n and "no solution cell found" in n for n in notes), notes


def test_splice_notes_duplicate_and_foreign_solution_cells():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    sub = submission({"90.1": ADD_OK})
    extra = nbformat.v4.new_code_cell(ADD_WRONG, metadata={"paged_kv": {"task": "90.1", "role": "solution"}})
    foreign = nbformat.v4.new_code_cell("pass", metadata={"paged_kv": {"task": "91.1", "role": "solution"}})
    sub.cells += [extra, foreign]
    spliced, notes = grader.splice(pristine, sub)
    assert spliced.cells[find_tasks(pristine)["90.1"].solution_cell].source == ADD_OK
    assert any("several solution cells" in n for n in notes)
    assert any("91.1" in n for n in notes)


def test_pristine_is_generated_from_a_solution_and_found_by_name_or_number(tmp_path):
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    assert pristine == read_notebook(LEARNER)
    assert grader.find_pristine("90_demo", [FIXTURES]) == PRISTINE / "90_demo.ipynb"
    assert grader.find_pristine("90_renamed", [FIXTURES]) == PRISTINE / "90_demo.ipynb"
    only_learner = tmp_path / "course"
    only_learner.mkdir()
    (only_learner / "90_demo.ipynb").write_bytes(LEARNER.read_bytes())
    assert grader.find_pristine("90_demo", [only_learner]) == only_learner / "90_demo.ipynb"
    with pytest.raises(grader.PristineNotFoundError):
        grader.find_pristine("90_demo", [only_learner], submission=only_learner / "90_demo.ipynb")
    with pytest.raises(grader.PristineNotFoundError, match="--pristine"):
        grader.find_pristine("77_nothing", [FIXTURES])


def test_the_default_search_is_the_course_exercises_folder():
    assert grader.default_search() == [Path(grader.__file__).resolve().parents[2] / "exercises"]


def test_score_needs_the_solution_cell_and_every_check():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    prepared, roles = grader.prepare_for_run(pristine)
    tasks = find_tasks(pristine)
    by_role = {v: k for k, v in roles.items()}
    results = {n: {"cell": n, "outcome": "passed", "line": "", "detail": ""} for n in range(len(roles) + 2)}
    results[by_role[("90.1", "solution")]] = {"outcome": "failed", "line": "SyntaxError: nope", "detail": "x"}
    last_check_of_90_3 = max(n for n, v in roles.items() if v == ("90.3", "check"))
    results[last_check_of_90_3] = {"outcome": "skipped", "line": "skipped", "detail": ""}
    scored = grader.score(roles, tasks, results)
    assert [(t.task, t.passed, t.failure) for t in scored] == [
        ("90.1", False, "solution cell: SyntaxError: nope"),
        ("90.2", True, ""),
        ("90.3", False, "skipped"),
    ]
    assert all("nbval-ignore-output" in c.metadata["tags"] for c in prepared.cells if c.cell_type == "code")


def test_invalid_json_is_a_clear_error_without_a_kernel(tmp_path, capsys):
    path = tmp_path / "90_demo.ipynb"
    path.write_text('{"cells": [')
    report = grader.grade_notebook(path, pristine=PRISTINE)
    assert "not a valid notebook" in report.error and "not valid JSON" in report.error
    assert [(t.task, t.points, t.passed) for t in report.tasks] == [("90.1", 2, False), ("90.2", 1, False), ("90.3", 3, False)]
    assert cli.main(["grade", str(path), "--pristine", str(PRISTINE)]) == 2
    assert "not valid JSON" in capsys.readouterr().out


def test_command_errors(tmp_path, capsys):
    assert cli.main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    assert cli.main(["grade", "--batch", str(tmp_path)]) == 2
    assert "--csv" in capsys.readouterr().err
    assert cli.main(["grade", "--batch", str(tmp_path), "--csv", str(tmp_path / "g.csv")]) == 2
    assert "no submissions" in capsys.readouterr().err
    nb = write(nbformat.v4.new_notebook(), tmp_path / "77_unknown.ipynb")
    assert cli.main(["grade", str(nb), "--pristine", str(PRISTINE)]) == 2
    assert "cannot grade" in capsys.readouterr().out
    assert cli.main(["grade", str(nb), "--timeout", "0"]) == 2


def test_find_submissions_understands_both_layouts(tmp_path):
    for rel in ("ana/90_demo.ipynb", "ana/.ipynb_checkpoints/90_demo-checkpoint.ipynb",
                "bo/week2/91_more.ipynb", "cy__90_demo.ipynb", "stray.ipynb", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    found, warnings = batch.find_submissions(tmp_path)
    assert [(s.learner, s.exercise, s.path.relative_to(tmp_path).as_posix()) for s in found] == [
        ("ana", "90_demo", "ana/90_demo.ipynb"),
        ("bo", "91_more", "bo/week2/91_more.ipynb"),
        ("cy", "90_demo", "cy__90_demo.ipynb"),
    ]
    assert len(warnings) == 1 and "stray.ipynb" in warnings[0]


# ---------------------------------------------------------------------------------------
# With kernels


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grade_restores_deleted_checks_matches_lost_metadata_and_needs_the_pass_line(tmp_path, capsys):
    sub = submission({"90.1": ADD_WRONG, "90.2": COUNTER_OK, "90.3": BLOCKS_MUTE},
                     drop_checks=("90.1",), drop_meta=("90.2",))
    path = write(sub, tmp_path / "90_demo.ipynb")
    start = time.monotonic()
    # The committed learner version as the pristine copy: its points metadata reaches the table.
    code = cli.main(["grade", str(path), "--pristine", str(LEARNER), "--timeout", str(TIMEOUT)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert time.monotonic() - start < 120
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("90.", "total"))}
    assert rows["90.1"].split()[1:4] == ["0/2", "FAIL", "AssertionError:"] and "add(1, 2)" in rows["90.1"]
    assert rows["90.2"].split()[1:3] == ["1/1", "pass"]
    assert "FAIL" in rows["90.3"] and "did not print 'PASSED 90.3'" in rows["90.3"]
    assert rows["total"].split()[1] == "1/6"
    assert "expected: 3" in out and "got:      -1" in out, "the check's full message is shown"
    assert "matched cell" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashed_kernel_fails_only_the_rest(tmp_path):
    path = write(submission({"90.1": ADD_OK, "90.2": COUNTER_CRASH, "90.3": BLOCKS_OK}), tmp_path / "90_demo.ipynb")
    start = time.monotonic()
    report = grader.grade_notebook(path, pristine=PRISTINE, cell_timeout=60)
    assert time.monotonic() - start < 60, "a dead kernel is noticed without waiting for the cell timeout"
    assert not report.error
    assert [(t.task, t.passed) for t in report.tasks] == [("90.1", True), ("90.2", False), ("90.3", False)]
    assert "kernel died while running this cell" in report.tasks[1].failure
    assert "kernel died or was stopped in an earlier cell" in report.tasks[2].failure


def _expected_rows() -> Dict[str, list]:
    points = {"90.1": 2, "90.2": 1, "90.3": 3}

    def rows(learner, results):
        return [
            [learner, "90_demo", task, str(points[task]), "1" if ok else "0",
             str(points[task] if ok else 0), failure]
            for (task, (ok, failure)) in zip(points, results)
        ]

    invalid = "not a valid notebook: the file is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)"
    return {
        "ana": rows("ana", [(True, "")] * 3),
        "ben": rows("ben", [(False, "AssertionError: add(1, 2)"), (True, ""),
                            (False, "AssertionError: blocks_needed(1, 4)")]),
        "cat": rows("cat", [(False, NOT_IMPLEMENTED.format(task=t)) for t in points]),
        "dan": rows("dan", [(False, invalid)] * 3),
        "eve": rows("eve", [
            (False, f"timed out: the cell ran longer than {TIMEOUT} s (an endless loop?)"),
            (True, ""),
            (False, f"timed out: the cell ran longer than {TIMEOUT} s (an endless loop?); "
                    "the kernel could not be interrupted, later cells cannot run"),
        ]),
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batch_grades_a_class_into_exact_gradebook_rows(tmp_path, capsys):
    folder = tmp_path / "class"
    write(submission({"90.1": ADD_OK, "90.2": COUNTER_OK, "90.3": BLOCKS_OK}), folder / "ana" / "90_demo.ipynb")
    write(submission({"90.1": ADD_WRONG, "90.2": COUNTER_OK, "90.3": BLOCKS_FLOOR},
                     edit_checks={"90.1": "print('PASSED 90.1')"}), folder / "ben__90_demo.ipynb")
    write(submission({}), folder / "cat" / "90_demo.ipynb")
    (folder / "dan__90_demo.ipynb").write_text("{not json")
    write(submission({"90.1": ADD_LOOP, "90.2": COUNTER_OK, "90.3": BLOCKS_STUBBORN}),
          folder / "eve" / "week1" / "90_demo.ipynb")
    gradebook = tmp_path / "out" / "gradebook.csv"
    start = time.monotonic()
    code = cli.main(["grade", "--batch", str(folder), "--csv", str(gradebook), "--pristine", str(PRISTINE),
                     "--timeout", str(TIMEOUT), "--jobs", "2"])
    elapsed = time.monotonic() - start
    out = capsys.readouterr().out
    assert code == 0, out
    assert elapsed < 300, f"batch took {elapsed:.0f} s"
    with open(gradebook, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == list(batch.GRADEBOOK_COLUMNS)
    body = rows[1:]
    expected = _expected_rows()
    for learner, wanted in expected.items():
        got = [r for r in body if r[0] == learner]
        for row, want in zip(got, wanted):
            assert row[:6] == want[:6], (learner, row)
            assert row[6].startswith(want[6]), (learner, row[6], want[6])
        assert len(got) == len(wanted), (learner, got)
    assert len(body) == 15
    summary = {line.split()[0]: line.split()[2] for line in out.splitlines() if line.split()[:1] in (["ana"], ["ben"], ["cat"], ["dan"], ["eve"])}
    assert summary == {"ana": "6/6", "ben": "1/6", "cat": "0/6", "dan": "0/6", "eve": "1/6"}
