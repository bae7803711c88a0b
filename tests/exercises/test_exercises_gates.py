"""CI gates for the exercises, and the generator's tests.

Gates: every committed learner version equals a fresh generation from its solution;
every untouched learner version runs top to bottom failing exactly at its check cells
(one kernel per notebook, errors allowed). The solutions themselves pass under nbval in
``make test``; the per-task planted wrong solutions live in ``tests/exercises/``.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import List, Optional

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from paged_kv_course.grading import generate as gen
from paged_kv_course.grading.learner_work import in_learner_fork
from paged_kv_course.grading.notebook_tasks import (
    ExerciseSpecError,
    NotebookFormatError,
    find_tasks,
    marker_regions,
    notebook_from_text,
    notebook_to_text,
    read_notebook,
    strip_solutions,
    validate_solution_notebook,
)

REPO = Path(__file__).resolve().parents[2]
EXERCISES = REPO / "exercises"
SOLUTIONS = EXERCISES / "solutions"
FIXTURES = REPO / "tests" / "fixtures" / "grading"


# ---------------------------------------------------------------------------------------
# Building small solution notebooks


def solution_cell(task: str, body: str = "    return 1", points: Optional[float] = None, name: str = "f"):
    meta = {"task": task, "role": "solution", "kind": "build"}
    if points is not None:
        meta["points"] = points
    source = f"def {name}():\n    ### BEGIN SOLUTION\n{body}\n    ### END SOLUTION"
    return new_code_cell(source, metadata={"paged_kv": meta})


def check_cell(task: str, printed: Optional[str] = None):
    cell = new_code_cell(f"check_{task.replace('.', '_')}(f)", metadata={"paged_kv": {"task": task, "role": "check"}})
    cell.outputs = [new_output("stream", name="stdout", text=(printed if printed is not None else f"PASSED {task}\n"))]
    cell.execution_count = 1
    return cell


def small_notebook(tasks=("42.1", "42.2", "42.3")):
    cells = [new_markdown_cell("# 42"), new_code_cell("import math", execution_count=1)]
    for task in tasks:
        cells += [solution_cell(task), check_cell(task)]
    nb = new_notebook(cells=cells)
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"c{index}"
    return nb


def errors_of(nb, name: str = "42_small.ipynb") -> str:
    with pytest.raises(ExerciseSpecError) as info:
        validate_solution_notebook(nb, name)
    return str(info.value)


# ---------------------------------------------------------------------------------------
# Markers


def test_strip_keeps_indentation_and_surrounding_code():
    source = (
        "class A:\n"
        "    def f(self):\n"
        "        x = 1\n"
        "        ### BEGIN SOLUTION\n"
        "        y = x + 1\n"
        "        return y\n"
        "        ### END SOLUTION\n"
        "\n"
        "    def g(self):\n"
        "      ### BEGIN SOLUTION  \n"
        "      return 2\n"
        "      ### END SOLUTION"
    )
    out = strip_solutions(source, "07.3")
    line = 'raise NotImplementedError("Task 07.3: replace this line with your code")'
    assert out == (
        "class A:\n"
        "    def f(self):\n"
        "        x = 1\n"
        f"        {line}\n"
        "\n"
        "    def g(self):\n"
        f"      {line}"
    )
    compile(out, "<cell>", "exec")


@pytest.mark.parametrize(
    "source, message",
    [
        ("### BEGIN SOLUTION\nx\n", "never closed"),
        ("x\n### END SOLUTION\n", "without a ### BEGIN SOLUTION"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside the region"),
        ("x = 1  ### BEGIN SOLUTION\n", "alone on its line"),
    ],
)
def test_unbalanced_or_misplaced_markers_are_errors(source, message):
    with pytest.raises(ExerciseSpecError, match=message):
        marker_regions(source)


# ---------------------------------------------------------------------------------------
# Validation


def test_a_valid_notebook_gives_its_tasks_in_order_with_points():
    nb = small_notebook()
    nb.cells[2].metadata["paged_kv"]["points"] = 3
    tasks = validate_solution_notebook(nb, "42_small.ipynb")
    assert [(t.task, t.points, t.solution_cell, t.check_cells) for t in tasks] == [
        ("42.1", 3, 2, (3,)), ("42.2", 1, 4, (5,)), ("42.3", 1, 6, (7,)),
    ]


def test_validation_names_every_problem():
    nb = small_notebook()
    nb.cells.append(solution_cell("42.2"))  # duplicate solution, no check after it
    nb.cells.append(check_cell("42.9"))  # check without solution
    nb.cells[5].outputs = []  # 42.2's check lost its stored PASSED line
    nb.cells.append(new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))  # markers in a plain cell
    nb.cells.append(new_code_cell("x", metadata={"paged_kv": {"task": "42.4", "role": "grader"}}))
    nb.cells.append(new_code_cell("x", metadata={"paged_kv": {"task": "4.1", "role": "check"}}))
    nb.cells[2].metadata["paged_kv"]["points"] = 0
    text = errors_of(nb)
    for expected in (
        "second solution cell for task 42.2",
        "check cell for task 42.9, which has no solution cell",
        "must have one stored output, the line 'PASSED 42.2'",
        "solution markers in a cell without paged_kv task metadata",
        "role 'grader'",
        "'4.1' is not of the form 'NN.k'",
        "points 0",
    ):
        assert expected in text, text


@pytest.mark.parametrize("kind", [None, "", "Build", "bugfix", 3])
def test_every_solution_cell_names_its_kind(kind):
    nb = small_notebook()
    if kind is None:
        del nb.cells[4].metadata["paged_kv"]["kind"]
    else:
        nb.cells[4].metadata["paged_kv"]["kind"] = kind
    text = errors_of(nb)
    assert f"cell 4: solution cell of task 42.2 has kind {kind!r}" in text, text
    assert "build, debug, design" in text
    assert "42.1" not in text and "42.3" not in text


def test_the_kind_of_each_task_is_read():
    nb = small_notebook()
    nb.cells[4].metadata["paged_kv"]["kind"] = "debug"
    nb.cells[6].metadata["paged_kv"]["kind"] = "design"
    tasks = validate_solution_notebook(nb, "42_small.ipynb")
    assert [t.kind for t in tasks] == ["build", "debug", "design"]


def test_check_must_follow_its_solution():
    nb = small_notebook()
    nb.cells[2], nb.cells[3] = nb.cells[3], nb.cells[2]
    assert "task 42.1: no check cell after its solution cell" in errors_of(nb)


def test_fewer_than_three_tasks_and_foreign_task_ids_are_errors():
    assert "2 task(s); an exercise notebook has at least 3" in errors_of(small_notebook(("42.1", "42.2")))
    assert "task 43.1 does not belong to notebook 42" in errors_of(small_notebook(("43.1", "42.2", "42.3")))


def test_a_solution_cell_without_region_or_with_a_top_level_region_is_an_error():
    nb = small_notebook()
    nb.cells[2].source = "def f():\n    return 1"
    assert "has no ### BEGIN SOLUTION" in errors_of(nb)
    nb = small_notebook()
    nb.cells[2].source = "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"
    assert "not inside a function" in errors_of(nb)


def test_markers_in_a_check_cell_and_a_check_without_check_call_are_errors():
    nb = small_notebook()
    nb.cells[3].source = "### BEGIN SOLUTION\nprint('PASSED 42.1')\n### END SOLUTION"
    text = errors_of(nb)
    assert "solution markers in a check cell" in text
    assert "calls no check_* function" in text


def test_not_json_is_a_notebook_format_error(tmp_path):
    path = tmp_path / "42_x.ipynb"
    path.write_text("{ nope")
    with pytest.raises(NotebookFormatError, match="not valid JSON"):
        read_notebook(path)
    with pytest.raises(NotebookFormatError, match="no list of cells"):
        notebook_from_text('{"metadata": {}}')


def test_missing_cell_ids_get_deterministic_ones():
    data = json.loads(notebook_to_text(small_notebook()))
    for cell in data["cells"]:
        del cell["id"]
    text = json.dumps(data)
    assert notebook_to_text(notebook_from_text(text)) == notebook_to_text(notebook_from_text(text))


# ---------------------------------------------------------------------------------------
# Generation


def test_learner_version_strips_solutions_and_opens_clean():
    solution = small_notebook()
    solution.cells[2].outputs = [new_output("stream", name="stdout", text="leak\n")]
    solution.cells[2].execution_count = 4
    solution.cells[2].metadata["paged_kv"]["points"] = 2
    before = copy.deepcopy(solution)
    learner = gen.make_learner_version(solution, "42_small.ipynb")
    assert solution == before, "the solution notebook must not be modified"
    cell = learner.cells[2]
    assert "return 1" not in cell.source
    assert 'raise NotImplementedError("Task 42.1: replace this line with your code")' in cell.source
    assert cell.outputs == [] and cell.execution_count is None
    assert cell.metadata["paged_kv"] == {"task": "42.1", "role": "solution", "kind": "build", "points": 2}
    assert cell.metadata["deletable"] is False
    check = learner.cells[3]
    assert check.outputs == [] and check.execution_count is None, "no stored PASSED line before any work"
    assert check.source == solution.cells[3].source
    assert check.metadata["editable"] is False and check.metadata["deletable"] is False
    assert learner.cells[1] == solution.cells[1]
    first = learner.cells[0].source
    assert first.startswith(solution.cells[0].source) and gen.HOWTO_MARK in first
    assert "paged-kv grade exercises/42_small.ipynb" in first and "task 42.1 is not written yet" in first
    again = gen.make_learner_version(learner_with_solutions(learner, solution), "42_small.ipynb")
    assert again.cells[0].source.count(gen.HOWTO_MARK) == 1, "the note is added once"
    assert learner.metadata["paged_kv"]["exercise"] == "42_small"
    assert [t.points for t in find_tasks(learner).values()] == [2, 1, 1]


def learner_with_solutions(learner, solution):
    """A solution notebook whose first cell already carries the note (as an author may write it)."""
    nb = copy.deepcopy(solution)
    nb.cells[0].source = learner.cells[0].source
    return nb


def test_a_notebook_starting_with_code_gets_the_note_in_a_new_first_cell():
    solution = small_notebook()
    solution.cells.pop(0)
    learner = gen.make_learner_version(solution, "42_small.ipynb")
    assert learner.cells[0].cell_type == "markdown" and gen.HOWTO_MARK in learner.cells[0].source
    assert len(learner.cells) == len(solution.cells) + 1


def _write_solutions(folder: Path, names: List[str]) -> None:
    folder.mkdir(parents=True)
    for name in names:
        nbformat.write(small_notebook(), folder / name)


def test_generate_is_deterministic_and_check_reports_stale_files(tmp_path, capsys):
    solutions = tmp_path / "exercises" / "solutions"
    _write_solutions(solutions, ["42_small.ipynb"])
    args = ["--solutions", str(solutions)]
    assert gen.main(args) == 0
    learner = tmp_path / "exercises" / "42_small.ipynb"
    first = learner.read_bytes()
    assert gen.main(args + ["--check"]) == 0
    assert gen.main(args) == 0
    assert learner.read_bytes() == first
    learner.write_text(first.decode().replace("Task 42.2", "Task 42.2 edited"))
    (tmp_path / "exercises" / "43_orphan.ipynb").write_text("{}")
    capsys.readouterr()
    assert gen.main(args + ["--check"]) == 1
    err = capsys.readouterr().err
    assert "42_small.ipynb" in err and "43_orphan.ipynb" in err
    assert learner.read_bytes() != first, "--check must not write"


def test_generate_refuses_broken_solutions_and_writes_nothing(tmp_path, capsys):
    solutions = tmp_path / "exercises" / "solutions"
    _write_solutions(solutions, ["42_small.ipynb", "43_bad.ipynb"])
    nb = nbformat.read(solutions / "43_bad.ipynb", as_version=4)
    nb.cells[3].outputs = []
    nbformat.write(nb, solutions / "43_bad.ipynb")
    assert gen.main(["--solutions", str(solutions)]) == 2
    err = capsys.readouterr().err
    assert "43_bad.ipynb" in err and "PASSED 42.1" in err
    assert not (tmp_path / "exercises" / "42_small.ipynb").exists()


# ---------------------------------------------------------------------------------------
# Gate: the course's mix of tasks (issue 22, section 3)

COURSE_EXERCISES = 9
FIRST_WITH_DEBUG_OR_DESIGN = 3
# The capstone builds the whole engine from the learner's earlier parts: all its tasks are builds.
CAPSTONE = "10"
MIN_OF_EACH_KIND = 3


def course_tasks() -> dict:
    """``exercise number -> [(task, kind), ...]`` read from every real solution notebook (unvalidated)."""
    out = {}
    for path in gen.solution_paths(SOLUTIONS):
        out[path.name[:2]] = [(t.task, t.kind) for t in find_tasks(read_notebook(path)).values()]
    return out


def test_the_course_mixes_build_debug_and_design_tasks():
    """Each of the 9 notebooks has at least 3 graded tasks; from exercise 03 on each but the capstone has a
    debug or design task; the course has at least 3 of each kind; every solution cell names its kind."""
    tasks = course_tasks()
    problems = []
    if len(tasks) != COURSE_EXERCISES:
        problems.append(f"{len(tasks)} exercise notebooks, expected {COURSE_EXERCISES}: {sorted(tasks)}")
    for number, found in sorted(tasks.items()):
        missing = [task for task, kind in found if kind not in ("build", "debug", "design")]
        if missing:
            problems.append(f"exercise {number}: tasks {missing} name no kind (build, debug or design)")
        if len(found) < 3:
            problems.append(f"exercise {number}: {len(found)} graded task(s); each notebook has at least 3")
        if int(number) >= FIRST_WITH_DEBUG_OR_DESIGN and number != CAPSTONE and not any(k in ("debug", "design") for _, k in found):
            problems.append(f"exercise {number}: no debug or design task (kinds: {[k for _, k in found]})")
    for kind in ("build", "debug", "design"):
        count = sum(1 for found in tasks.values() for _, k in found if k == kind)
        print(f"{kind}: {count} task(s)")
        if count < MIN_OF_EACH_KIND:
            problems.append(f"the course has {count} {kind} task(s); it needs at least {MIN_OF_EACH_KIND}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Gate (a): committed learner versions are fresh


def _exercise_pairs():
    pairs = [(FIXTURES / "solutions", FIXTURES)]
    if gen.solution_paths(SOLUTIONS):
        pairs.append((SOLUTIONS, EXERCISES))
    return pairs


@pytest.mark.parametrize("solutions, out", _exercise_pairs(), ids=lambda p: str(p.relative_to(REPO)))
def test_committed_learner_versions_equal_a_fresh_generation(solutions, out):
    stale = gen.generate(solutions, out, check=True, learner_work=in_learner_fork())  # a fork: learners' work counts
    assert not stale, f"stale learner versions (run `make exercises`): {[str(p) for p in stale]}"
    for path in gen.solution_paths(solutions):
        assert (out / path.name).is_file(), f"missing learner version of {path.name}"


# ---------------------------------------------------------------------------------------
# Gate (b): untouched learner versions fail exactly at their check cells


def _learner_notebooks():
    found = [FIXTURES / "90_demo.ipynb"]
    found += [EXERCISES / p.name for p in gen.solution_paths(SOLUTIONS) if (EXERCISES / p.name).is_file()]
    return found


def _skip_learner_work(path: Path) -> None:
    """In a learner's fork (PAGED_KV_LEARNER_FORK=true) a learner version holding their work is theirs: skipped."""
    solution = SOLUTIONS / path.name
    if in_learner_fork() and solution.is_file() and path.read_text(encoding="utf-8") != gen.learner_text(solution):
        pytest.skip(f"{path.name} holds the learner's work (a learner's fork): `make check` grades it")


def _run_with_errors(path: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")]))}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", allow_errors=True, record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb


def _errors(cell) -> list:
    return [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]


@pytest.mark.parametrize("path", _learner_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_learner_versions_open_clean(path):
    _skip_learner_work(path)
    nb = read_notebook(path)
    for task in find_tasks(nb).values():
        for index in (task.solution_cell, *task.check_cells):
            assert nb.cells[index].outputs == [], f"cell {index} of {path.name} has stored output"
    if path.parent == EXERCISES:
        assert nb.cells[0].cell_type == "markdown" and gen.HOWTO_MARK in nb.cells[0].source
        assert f"paged-kv grade exercises/{path.name}" in nb.cells[0].source


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", _learner_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_untouched_learner_version_fails_exactly_at_its_check_cells(path):
    """By executing: every check cell raises (no stored output decides it), no other cell does, and
    a course check says in one line which task is not written yet."""
    _skip_learner_work(path)
    nb = read_notebook(path)
    checks = sorted(i for task in find_tasks(nb).values() for i in task.check_cells)
    assert checks, "a learner version without check cells"
    ran = _run_with_errors(path)
    failing = [i for i, cell in enumerate(ran.cells) if cell.cell_type == "code" and _errors(cell)]
    assert failing == checks
    if path.parent != EXERCISES:
        return  # the grader's demo checks do not use the course's helpers
    for index in checks:
        (error,) = _errors(ran.cells[index])
        task = next(t.task for t in find_tasks(nb).values() if index in t.check_cells)
        assert len(error["traceback"]) == 1, f"cell {index}: a traceback instead of one line: {error['traceback']}"
        assert "is not written yet" in error["traceback"][0], (index, error["traceback"])
        assert error["ename"] == "TaskNotWrittenError", (index, error["ename"], task)


# ---------------------------------------------------------------------------------------
# Gate (c): the grader, judging outside the kernel, gives each solution full marks and each
# untouched learner version nothing (every check works through the judge's proxies)


def _real_exercises():
    return [p for p in gen.solution_paths(SOLUTIONS) if (EXERCISES / p.name).is_file()]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("solution", _real_exercises(), ids=lambda p: p.stem)
def test_the_grader_gives_the_solution_full_marks_and_the_untouched_version_nothing(solution, tmp_path):
    from paged_kv_course.grading import grader

    copy_of_solution = tmp_path / "solved" / solution.name
    copy_of_solution.parent.mkdir()
    copy_of_solution.write_bytes(solution.read_bytes())
    report = grader.grade_notebook(copy_of_solution, course=REPO)
    assert not report.error, report.error
    assert [(t.task, t.passed) for t in report.tasks if not t.passed] == [], [(t.task, t.failure) for t in report.tasks]
    _skip_learner_work(EXERCISES / solution.name)
    untouched = grader.grade_notebook(EXERCISES / solution.name, course=REPO)
    assert not untouched.error, untouched.error
    for task in untouched.tasks:
        assert not task.passed and task.failure == f"task {task.task} is not written yet", (task.task, task.failure)
