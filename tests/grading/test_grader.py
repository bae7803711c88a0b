"""The grader's own tests, on the demo exercise in tests/fixtures/grading (no torch in its kernels).

Fast tests cover splicing, finding the course and the pristine exercise, scoring, the
notes on ungraded code and the command's input errors without a kernel. The tests that
start kernels: one ``paged-kv grade`` of a single submission, one that a crashed kernel
costs only the cells after it, and one batch over a class of learners (correct, wrong,
empty, invalid JSON, endless loops, a double submission) that checks every gradebook
row. The attacks on the grader are in ``test_grader_attacks.py``.
"""

from __future__ import annotations

import os
import csv
import time
from pathlib import Path
from typing import Dict

import nbformat
import pytest

from paged_kv_lib import cli
from paged_kv_course.grading import batch, grader
from paged_kv_course.grading.batch import fmt_points
from paged_kv_course.grading.notebook_tasks import cell_task, find_tasks, read_notebook, split_points

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grading"
PRISTINE = FIXTURES / "solutions"
LEARNER = FIXTURES / "90_demo.ipynb"
TIMEOUT = 10  # seconds for a whole submission: the endless loops must cost little

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
BLOCKS_MUTE = (  # hides the check's success line: the judge does not read the kernel's output
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
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


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


def test_the_course_is_found_from_the_notebooks_own_path(tmp_path, monkeypatch):
    course = tmp_path / "course"
    (course / "exercises" / "solutions").mkdir(parents=True)
    (course / "exercises" / "solutions" / "90_demo.ipynb").write_bytes((PRISTINE / "90_demo.ipynb").read_bytes())
    nb = course / "exercises" / "90_demo.ipynb"
    nb.write_bytes(LEARNER.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert grader.find_course(nb) == course.resolve()
    assert grader.default_search(nb) == [course.resolve() / "exercises"]
    assert grader._pristine_source(nb, "90_demo", None) == course.resolve() / "exercises" / "solutions" / "90_demo.ipynb"
    elsewhere = tmp_path / "elsewhere" / "90_demo.ipynb"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(LEARNER.read_bytes())
    with pytest.raises(grader.PristineNotFoundError, match="--course"):
        grader.find_course(elsewhere)
    assert grader.find_course(elsewhere, course) == course.resolve()
    with pytest.raises(grader.InputError, match="no exercises/ folder"):
        grader.find_course(elsewhere, tmp_path / "elsewhere")


@pytest.mark.parametrize("name", ["../90_demo", "/etc/passwd", "90_demo/../../x", "9_demo", "90-demo", "", "90_"])
def test_exercise_names_must_be_nn_topic(name):
    with pytest.raises(grader.InputError, match="not an exercise name"):
        grader.find_pristine(name, [FIXTURES])


def test_a_notebook_of_another_exercise_under_this_name_is_refused(tmp_path):
    nb = read_notebook(LEARNER)
    path = write(nb, tmp_path / "91_other.ipynb")
    with pytest.raises(grader.InputError, match="this is a notebook of exercise 90_demo, not of exercise 91_other"):
        grader.submission_exercise(path, nb)
    del nb.metadata["paged_kv"]
    with pytest.raises(grader.InputError, match="tasks of exercise 90"):
        grader.submission_exercise(path, nb)
    nb.metadata["paged_kv"] = {"exercise": "../../evil/90_demo"}  # not a name: ignored, the file name counts
    assert grader.submission_exercise(write(nb, tmp_path / "90_demo.ipynb"), nb) == "90_demo"
    task_cell = next(cell for cell in nb.cells if cell_task(cell))
    task_cell.metadata["paged_kv"]["task"] = "\x1b]52;c;cm0gLXJm\x07.1"  # a clipboard write, as a task id
    with pytest.raises(grader.InputError) as refused:
        grader.submission_exercise(path, nb)
    assert "tasks of exercise" in str(refused.value) and "\x1b" not in str(refused.value), str(refused.value)


def test_code_outside_solution_cells_is_reported_with_the_task_it_belongs_to():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    sub = submission({"90.1": ADD_OK}, edit_checks={"90.2": "print('PASSED 90.2')"})
    solution_90_3 = find_tasks(pristine)["90.3"].solution_cell
    sub.cells.insert(solution_90_3 + 1, nbformat.v4.new_code_cell(BLOCKS_OK))
    sub.cells.append(nbformat.v4.new_code_cell("x = add(1, 2)"))
    _, _, used = grader.splice_cells(pristine, sub)
    notes = grader.ungraded_code(pristine, sub, used)
    assert len(notes) == 3, notes
    assert "check cell of task 90.2 is not graded" in notes[0]
    assert f"cell {solution_90_3 + 1}: this code is not in a solution cell, so it was not graded; " \
           "it belongs in the solution cell of task 90.3" == notes[1]
    assert notes[2].endswith("it belongs in the solution cell of task 90.3")


def test_score_needs_the_solution_cell_and_every_check():
    pristine = grader.load_pristine(PRISTINE / "90_demo.ipynb")
    cells, roles = grader.prepare_for_run(pristine)
    tasks = find_tasks(pristine)
    by_role = {v: k for k, v in roles.items()}
    results = {n: {"cell": n, "outcome": "passed", "line": "", "detail": ""} for n in range(len(cells))}
    results[by_role[("90.1", "solution")]] = {"outcome": "failed", "line": "SyntaxError: nope", "detail": "x"}
    last_check_of_90_3 = max(n for n, v in roles.items() if v == ("90.3", "check"))
    results[last_check_of_90_3] = {"outcome": "skipped", "line": "skipped", "detail": ""}
    scored = grader.score(roles, tasks, results)
    assert [(t.task, t.passed, t.failure) for t in scored] == [
        ("90.1", False, "solution cell: SyntaxError: nope"),
        ("90.2", True, ""),
        ("90.3", False, "skipped"),
    ]
    assert all(c["role"] in (None, "solution", "check") for c in cells)


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


@pytest.mark.parametrize("args, message", [
    (["--timeout", "0"], "--timeout must be a finite number of seconds above 0"),
    (["--timeout", "-3"], "--timeout must be a finite number"),
    (["--timeout", "nan"], "--timeout must be a finite number"),
    (["--timeout", "inf"], "--timeout must be a finite number"),
    (["--course", "/nonexistent-course"], "--course /nonexistent-course: no exercises/ folder"),
    (["--pristine", "/nonexistent-pristine"], "--pristine /nonexistent-pristine: no such file"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    nb = write(read_notebook(LEARNER), tmp_path / "90_demo.ipynb")
    assert cli.main(["grade", str(nb), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err


def test_an_unwritable_gradebook_is_refused_before_grading(tmp_path, capsys):
    folder = tmp_path / "class"
    write(read_notebook(LEARNER), folder / "ana" / "90_demo.ipynb")
    blocker = tmp_path / "file"
    blocker.write_text("")
    for csv_path, message in [(blocker / "g.csv", "is not a folder"), (tmp_path, "is a folder")]:
        start = time.monotonic()
        assert cli.main(["grade", "--batch", str(folder), "--csv", str(csv_path), "--pristine", str(PRISTINE)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert time.monotonic() - start < 5, "refused before any grading"


@pytest.mark.parametrize("meta", ["/etc/passwd", "../../../etc/passwd", "../solutions/90_demo"])
def test_a_hostile_exercise_name_is_one_line_not_a_traceback(tmp_path, capsys, meta):
    nb = read_notebook(LEARNER)
    nb.metadata["paged_kv"] = {"exercise": meta}
    path = write(nb, tmp_path / "homework.ipynb")
    assert cli.main(["grade", str(path), "--pristine", str(PRISTINE)]) == 2
    out = capsys.readouterr().out
    assert "not an exercise name" in out and "Traceback" not in out


def test_gradebook_cells_are_escaped_and_double_submissions_flagged(tmp_path):
    report = grader.GradeReport(submission=tmp_path / "x.ipynb", exercise="90_demo",
                                tasks=[grader.TaskResult("90.1", 2, False, "=HYPERLINK(\"http://x\")")])
    results = [batch.BatchResult(batch.Submission("@bob", "90_demo", tmp_path / "a" / "90_demo.ipynb"), report),
               batch.BatchResult(batch.Submission("@bob", "90_demo", tmp_path / "@bob__90_demo.ipynb"), report),
               batch.BatchResult(batch.Submission("+al", "90_demo", tmp_path / "-x.ipynb"), report)]
    rows = batch.write_gradebook(results, tmp_path / "g.csv")
    with open(tmp_path / "g.csv", newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [r["learner"] for r in written] == ["'@bob", "'@bob", "'+al"]
    assert all(r["failure"] == "'=HYPERLINK(\"http://x\")" for r in written)
    assert written[0]["path"].endswith("90_demo.ipynb") and written[2]["path"].endswith("-x.ipynb")
    assert [r["flag"] for r in written] == ["2 submissions of 90_demo by this learner"] * 2 + [""]
    assert len(rows) == 3 and not list(tmp_path.glob(".g.csv.*"))


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
def test_grade_restores_deleted_checks_matches_lost_metadata_and_ignores_the_kernels_output(tmp_path, capsys):
    sub = submission({"90.1": ADD_WRONG, "90.2": COUNTER_OK, "90.3": BLOCKS_MUTE},
                     drop_checks=("90.1",), drop_meta=("90.2",))
    sub.cells.append(nbformat.v4.new_code_cell("print(add(2, 2))"))
    path = write(sub, tmp_path / "90_demo.ipynb")
    start = time.monotonic()
    # The committed learner version as the pristine copy: its points metadata reaches the table.
    code = cli.main(["grade", str(path), "--pristine", str(LEARNER), "--timeout", str(TIMEOUT)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert time.monotonic() - start < 60
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("90.", "total"))}
    assert rows["90.1"].split()[1:4] == ["0/2", "FAIL", "add(1,"], rows
    assert rows["90.2"].split()[1:3] == ["1/1", "pass"]
    assert rows["90.3"].split()[1:3] == ["3/3", "pass"], "a check passes on the judge's verdict, not on printed lines"
    assert rows["total"].split()[1] == "4/6"
    assert "expected: 3" in out and "got:      -1" in out, "the check's full message is shown"
    assert "matched cell" in out
    assert "not in a solution cell, so it was not graded; it belongs in the solution cell of task 90.3" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashed_kernel_fails_only_the_rest(tmp_path):
    path = write(submission({"90.1": ADD_OK, "90.2": COUNTER_CRASH, "90.3": BLOCKS_OK}), tmp_path / "90_demo.ipynb")
    start = time.monotonic()
    report = grader.grade_notebook(path, pristine=PRISTINE, cell_timeout=60)
    assert time.monotonic() - start < 60, "a dead kernel is noticed without waiting for the cell timeout"
    assert not report.error
    assert [(t.task, t.passed) for t in report.tasks] == [("90.1", True), ("90.2", False), ("90.3", False)]
    assert "kernel died while running this" in report.tasks[1].failure
    assert "kernel died in an earlier cell" in report.tasks[2].failure


def _expected_rows() -> Dict[str, list]:
    points = {"90.1": 2, "90.2": 1, "90.3": 3}

    def rows(learner, results):
        return [
            [learner, "90_demo", task, str(points[task]), "1" if ok else "0",
             str(fmt_points(points[task] if ok else partial.get((learner, task), 0))), failure]
            for (task, (ok, failure)) in zip(points, results)
        ]

    # ben's floor division fails check_blocks but passes check_blocks_zero: that check's share (partial credit)
    partial = {("ben", "90.3"): split_points(points["90.3"], [None, None])[1]}

    invalid = "not a valid notebook: the file is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)"
    return {
        "ana": rows("ana", [(True, "")] * 3),
        "ben": rows("ben", [(False, "add(1, 2)"), (True, ""), (False, "blocks_needed(1, 4)")]),
        "cat": rows("cat", [(False, f"task {t} is not written yet") for t in points]),
        "dan": rows("dan", [(False, invalid)] * 3),
        "eve": rows("eve", [  # one time limit for the whole submission: the endless loop uses it up
            (False, "timed out"),
            (False, "solution cell: not run: the submission's time ran out"),
            (False, "solution cell: not run: the submission's time ran out"),
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
            assert Path(row[7]).name.endswith("90_demo.ipynb") and row[8] == ""
        assert len(got) == len(wanted), (learner, got)
    assert len(body) == 15
    summary = {line.split()[0]: line.split()[2] for line in out.splitlines() if line.split()[:1] in (["ana"], ["ben"], ["cat"], ["dan"], ["eve"])}
    ben = fmt_points(1 + split_points(3, [None, None])[1])  # 90.2, and check_blocks_zero's share of 90.3
    assert summary == {"ana": "6/6", "ben": f"{ben}/6", "cat": "0/6", "dan": "0/6", "eve": "0/6"}


def test_importing_the_grading_package_pulls_in_no_widgets():
    import subprocess
    import sys

    checks = ", ".join(f"paged_kv_course.grading.checks_{n:02d}" for n in range(2, 10))
    code = ("import sys, paged_kv_course.grading, paged_kv_course.grading.grader, paged_kv_course.grading.batch, "
            f"paged_kv_course.grading.judge, {checks}; "
            "print(sorted(m for m in ('IPython', 'ipywidgets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_kernel_that_cannot_be_interrupted_leaves_no_connection_file_or_process(tmp_path):
    """The judge talks to the kernel over pipes: no Jupyter connection file exists to be left
    behind, and the kernel's whole process group is killed, even without the sandbox."""
    import os
    import signal

    from jupyter_core.paths import jupyter_runtime_dir

    runtime = Path(jupyter_runtime_dir())
    before = set(runtime.glob("kernel-*.json")) if runtime.is_dir() else set()
    marker = tmp_path / "child.pid"
    stubborn = BLOCKS_STUBBORN + (
        "\nimport subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
    )
    path = write(submission({"90.1": ADD_OK, "90.3": stubborn}), tmp_path / "90_demo.ipynb")
    report = grader.grade_notebook(path, pristine=PRISTINE, cell_timeout=8, sandbox_mode="none")
    assert [t.passed for t in report.tasks] == [True, False, False]
    assert "could not be interrupted" in report.tasks[2].failure or report.tasks[2].failure.startswith("timed out")
    after = set(runtime.glob("kernel-*.json")) if runtime.is_dir() else set()
    assert after == before
    child = int(marker.read_text())
    time.sleep(1)
    try:
        os.kill(child, 0)
        alive = Path(f"/proc/{child}/status").read_text().find("State:\tZ") < 0
    except ProcessLookupError:
        alive = False
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "a process the learner's code started outlived grading"
