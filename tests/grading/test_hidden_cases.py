"""Hidden cases: read from exercises/hidden/NN.py, run by the judge after a task's visible checks, withheld
by the release, reported by number and hint only.

The last tests grade planted solutions of exercises 02 and 04 (tests/fixtures/grading/hidden_planted/)
through the official grader: each passes every visible check of its task and fails the task's
hidden case; the reference solutions pass the hidden cases.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from paged_kv_lib import cli
from paged_kv_course.grading import grader, hidden, release
from paged_kv_course.grading.cli import format_report
from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = ROOT / "exercises" / "hidden"
SOLUTIONS = ROOT / "exercises" / "solutions"
PLANTED = ROOT / "tests" / "fixtures" / "grading" / "hidden_planted"


def write_cases(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


CASES = '''from paged_kv_course.grading.hidden import case

@case("91.1", points=2, hint="try zero")
def zero(f):
    assert f(0) == 0
    print("PASSED 91.1")

def helper():
    pass

@case(task="91.1")
def one(f, g):
    pass
'''


def test_cases_are_read_in_file_order_without_importing_the_file(tmp_path):
    path = write_cases(tmp_path, "91.py", CASES + "\nraise SystemExit('imported')\n")
    cases = hidden.read_cases(path)
    assert [(c.task, c.function, c.params, c.points, c.hint) for c in cases] == [
        ("91.1", "zero", ("f",), 2.0, "try zero"), ("91.1", "one", ("f", "g"), 1.0, "")]
    assert cases[1].source() == f"from {hidden.MODULE_PREFIX}91 import one\none(f, g)"


@pytest.mark.parametrize("mark, problem", [
    ('@case("92.1")', "not a task NN.k of exercise 91"),
    ('@case("91.1", points=-1)', "points -1"),
    ('@case("91.1", hint=3)', "hint 3"),
    ('@case(TASK)', "literal arguments"),
])
def test_a_malformed_mark_is_one_line_naming_it(tmp_path, mark, problem):
    path = write_cases(tmp_path, "91.py", f"{mark}\ndef bad(f):\n    pass\n")
    with pytest.raises(hidden.HiddenCaseError, match=problem) as caught:
        hidden.read_cases(path)
    assert "91.py:2 (bad)" in str(caught.value)


def test_a_case_with_defaults_or_star_args_is_refused(tmp_path):
    path = write_cases(tmp_path, "91.py", '@case("91.1")\ndef bad(f, *rest):\n    pass\n')
    with pytest.raises(hidden.HiddenCaseError, match="plain parameters"):
        hidden.read_cases(path)


def _two_task_notebook():
    meta = lambda task, role: {"paged_kv": {"task": task, "role": role, **({"kind": "build", "points": 2} if role == "solution" else {})}}  # noqa: E731,E501
    return new_notebook(cells=[
        new_markdown_cell("# 91"),
        new_code_cell("def f(x):\n    return x", metadata=meta("91.1", "solution")),
        new_code_cell("check_f(f)", metadata=meta("91.1", "check")),
        new_code_cell("def g(x):\n    return x", metadata=meta("91.2", "solution")),
        new_code_cell("check_g(g)", metadata=meta("91.2", "check")),
    ])


def test_hidden_cases_run_after_their_tasks_visible_checks_and_count_on_their_own(tmp_path):
    cases = hidden.read_cases(write_cases(tmp_path, "91.py", CASES))
    nb = _two_task_notebook()
    cells, roles = grader.prepare_for_run(nb, cases)
    order = [(c["task"], c["role"], c.get("hidden", 0)) for c in cells]
    assert order == [("91.1", "solution", 0), ("91.1", "check", 0), ("91.1", "check", 1), ("91.1", "check", 2),
                     ("91.2", "solution", 0), ("91.2", "check", 0)]
    results = {n: {"outcome": "passed", "line": "", "detail": ""} for n in range(len(cells))}
    results[2] = {"outcome": "failed", "line": "expected: 0 got: 1 (the case's data)", "detail": "secret detail"}
    task = grader.score(roles, find_tasks(nb), results, cells)[0]
    assert not task.passed and task.points == 2 + 2 + 1
    assert task.failure == hidden.failure_line("91.1", 1, "try zero") == "hidden case 1 of task 91.1 failed: try zero"
    assert task.detail == "", "nothing of the case's message reaches the report"
    assert task.earned == 2 + 1, "the visible check's points and the passing case's"
    assert [c.name for c in task.checks] == ["check_f", "hidden case 1", "hidden case 2"]


def test_the_course_finds_its_hidden_cases_and_a_release_leaves_them_out(tmp_path):
    cases = hidden.cases_for("02_blocks_and_block_tables", course=ROOT)
    assert cases and all(c.task.startswith("02.") for c in cases)
    assert hidden.cases_for("02_blocks_and_block_tables", folder=tmp_path) == []
    ignore = release._ignorer(ROOT, None)
    assert hidden.HIDDEN_DIR in ignore(str(ROOT / "exercises"), ["hidden", "02_x.ipynb"])


def test_every_hidden_case_of_the_course_names_a_task_of_its_exercise():
    for path in sorted(HIDDEN.glob("[0-9][0-9].py")):
        solution = next(SOLUTIONS.glob(f"{path.stem}_*.ipynb"))
        tasks = find_tasks(read_notebook(solution))
        for found in hidden.read_cases(path):
            assert found.task in tasks, f"{path.name}: {found.function} names {found.task}, not a task of {solution.name}"
            assert found.hint, f"{path.name}: {found.function} needs a hint for the learner"


def test_the_command_refuses_a_missing_cases_folder(tmp_path, capsys):
    notebook = tmp_path / "02_blocks_and_block_tables.ipynb"
    notebook.write_text("{}")
    assert cli.main(["grade", str(notebook), "--hidden-cases", str(tmp_path / "nowhere")]) == 2
    assert "--hidden-cases" in capsys.readouterr().err


def _planted_notebook(exercise: str, task: str, source: str, tmp_path: Path) -> Path:
    solution = next(SOLUTIONS.glob(f"{exercise}_*.ipynb"))
    nb = copy.deepcopy(read_notebook(solution))
    nb.cells[find_tasks(nb)[task].solution_cell].source = source
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / solution.name
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("planted", sorted(PLANTED.glob("*.py")), ids=lambda p: p.stem)
def test_a_planted_solution_passes_the_visible_checks_and_fails_the_hidden_case(planted, tmp_path):
    exercise, task = planted.stem[:2], f"{planted.stem[:2]}.{planted.stem.split('_')[1]}"
    solution = next(SOLUTIONS.glob(f"{exercise}_*.ipynb"))
    submission = _planted_notebook(exercise, task, planted.read_text(), tmp_path / "planted")
    report = grader.grade_notebook(submission, pristine=solution, cases=HIDDEN, workdir=tmp_path / "w1")
    assert not report.error, report.error
    result = next(t for t in report.tasks if t.task == task)
    visible = [c for c in result.checks if not c.hidden]
    assert visible and all(c.passed for c in visible), [(c.name, c.failure) for c in visible]
    failed = [c for c in result.checks if c.hidden and not c.passed]
    assert len(failed) == 1 and not result.passed
    case = next(c for c in hidden.read_cases(hidden.case_file(HIDDEN, solution.stem)) if c.task == task)
    assert result.failure == hidden.failure_line(task, failed[0].hidden, case.hint)
    assert result.earned == sum(c.points for c in visible) and result.points > result.earned
    text = format_report(report, detail_lines=None)
    assert case.function not in text and str(HIDDEN) not in text, "the report never shows the case itself"
    assert all(t.passed for t in report.tasks if t.task != task)

    reference = grader.grade_notebook(_planted_notebook(exercise, task, read_notebook(solution).cells[
        find_tasks(read_notebook(solution))[task].solution_cell].source, tmp_path / "ref"),
        pristine=solution, cases=HIDDEN, workdir=tmp_path / "w2")
    mine = next(t for t in reference.tasks if t.task == task)
    assert mine.passed and any(c.hidden for c in mine.checks), (mine.failure, mine.detail)


ECHO = '''
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        if self.block_size > 2 ** 40:   # only the hidden case gets here: tell the world what it sent
            raise ValueError(f"LEAK block_size={self.block_size} requests={requests!r} free={len(self.free)}")
        return super().allocate_batch(requests)
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failed_hidden_case_never_echoes_the_learners_text_or_its_values(tmp_path):
    """Issue 32's hidden-case leak: a solution that raises with the hidden case's arguments in its message.
    The report says exactly "hidden case N of task NN.k failed: HINT" and nothing of the message."""
    solution = next(SOLUTIONS.glob("02_*.ipynb"))
    source = read_notebook(solution).cells[find_tasks(read_notebook(solution))["02.3"].solution_cell].source
    submission = _planted_notebook("02", "02.3", source + "\n" + ECHO, tmp_path / "echo")
    report = grader.grade_notebook(submission, pristine=solution, cases=HIDDEN, workdir=tmp_path / "w")
    result = next(t for t in report.tasks if t.task == "02.3")
    failed = [c for c in result.checks if c.hidden and not c.passed]
    assert failed, [(c.name, c.failure) for c in result.checks]
    case = next(c for c in hidden.read_cases(hidden.case_file(HIDDEN, solution.stem)) if c.task == "02.3")
    assert result.failure == f"hidden case {failed[0].hidden} of task 02.3 failed: {case.hint}"
    assert failed[0].failure == result.failure and result.detail == ""
    text = format_report(report, detail_lines=None)
    assert "LEAK" not in text and "2 ** " not in text and str(2 ** 60) not in text, text


def test_a_timeout_in_a_hidden_case_says_so_and_a_syntax_error_is_named_not_hinted(tmp_path):
    """Issue 32: a timeout or a syntax error was reported with the hidden case's hint."""
    cases = hidden.read_cases(write_cases(tmp_path, "91.py", CASES))
    nb = _two_task_notebook()
    cells, roles = grader.prepare_for_run(nb, cases)
    results = {n: {"outcome": "passed", "line": "", "detail": ""} for n in range(len(cells))}
    late = "timed out: the submission ran past its limit of 5 s (in this check)"
    results[2] = {"outcome": "failed", "line": late, "detail": ""}
    task = grader.score(roles, find_tasks(nb), results, cells)[0]
    assert task.failure == f"hidden case 1 of task 91.1: {late}"
    results[2] = {"outcome": "passed", "line": "", "detail": ""}
    results[0] = {"outcome": "failed", "line": "a syntax error: SyntaxError: invalid syntax (line 1)", "detail": ""}
    task = grader.score(roles, find_tasks(nb), results, cells)[0]
    assert task.failure.startswith("solution cell: a syntax error") and task.earned == 0


@pytest.mark.slow
def test_a_grade_without_the_hidden_cases_says_their_points_are_left_out(tmp_path):
    """In a release (no hidden cases), a notebook whose header gives points to hidden cases is graded on
    its visible checks, and the report says so instead of showing a smaller total without a word."""
    empty = tmp_path / "no-cases"
    empty.mkdir()
    learner = ROOT / "exercises" / "04_address_translation.ipynb"
    report = grader.grade_notebook(learner, pristine=learner, cases=empty, workdir=tmp_path / "work")
    assert any("hidden cases are not graded here" in n for n in report.notes), report.notes
    with_cases = grader.grade_notebook(learner, pristine=learner, workdir=tmp_path / "work2",
                                       cases=ROOT / "exercises" / "hidden")
    assert not any("hidden cases are not graded here" in n for n in with_cases.notes), with_cases.notes
