"""Gate: every planted wrong solution fails through the official grader, with the message it names.

A planted file ``tests/exercises/planted/NN/<NN>_<k>_<slug>.py`` holds the whole source of
task NN.k's solution cell as a learner would write it, first line
``# expect: <a substring of the check's failure message>`` (interfaces.md item 5). The
gate splices it into a copy of the solution notebook (the rest stays the reference),
grades that copy with ``paged-kv grade``'s Python entry (``grader.grade_notebook``,
sandbox auto), and wants the planted task failed with the expected text in its failure
line or the check's full message. Checks that lose their bite between the kernel and the
judge (identity, aliasing) fail here, not only in a notebook.

To keep CI time down, all files of one exercise share one notebook and one grading run
(:func:`stacked`): after each task's reference solution (a plain cell there, not graded) come
copies of the task, one per planted file (its solution cell holding the file, then the task's
check cells, under the task id ``NN.(100k+i)``), each starting from the bindings the task's own
solution cell started from, and after them the task's reference solution cell again, so later
tasks build on the reference. A file whose expected line the shared run does not show
(a planted mistake can break the cells after it) is graded again alone, spliced into the
solution notebook, before it counts as a failure. Every graded task of every exercise must
have at least one planted file.

The folder is a parameter: the exercise authors own ``tests/exercises/planted/``;
``tests/fixtures/grading/planted_demo/`` holds the gate's own demo (90: the grader's demo
exercise).
Run: ``.venv/bin/python -m pytest -p no:randomly -p no:nbval -q -s tests/grading/test_planted_through_grader.py``.
"""

from __future__ import annotations

import os
import copy
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import nbformat
import pytest

from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook, write_notebook

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "exercises" / "solutions"
PLANTED = ROOT / "tests" / "exercises" / "planted"
FIXTURES = ROOT / "tests" / "fixtures" / "grading"
DEMO = FIXTURES / "planted_demo"
CELL_TIMEOUT_S = 600  # the whole stacked notebook (one time limit per submission)

FILE_NAME = re.compile(r"^(\d{2})_(\d+)_[A-Za-z0-9_]+\.py$")
EXPECT = re.compile(r"^# expect: (.+?)\s*$")


@dataclass(frozen=True)
class Planted:
    """One planted wrong solution: its file, the task it replaces and the text its failure must show."""

    path: Path
    task: str
    expect: str

    @property
    def source(self) -> str:
        return self.path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Outcome:
    """What the grader said about one task of one run."""

    passed: bool
    text: str  # the failure line, then the check's full message


Grade = Callable[[Path, Path, Path], Dict[str, Outcome]]  # (submission, solution, workdir) -> task -> outcome


def read_planted(folder: Path) -> Tuple[Dict[str, List[Planted]], List[str]]:
    """``exercise number -> planted files`` under ``folder/NN/``, and a problem line for each ill-formed file."""
    found: Dict[str, List[Planted]] = {}
    problems: List[str] = []
    for path in sorted(folder.glob("*/*.py")) if folder.is_dir() else []:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        match = FILE_NAME.match(path.name)
        if not match:
            problems.append(f"{where}: not named <NN>_<k>_<slug>.py")
            continue
        if match.group(1) != path.parent.name:
            problems.append(f"{where}: a file of exercise {match.group(1)} in folder {path.parent.name}")
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        expect = EXPECT.match(lines[0]) if lines else None
        if expect is None:
            problems.append(f"{where}: its first line must be '# expect: <a substring of the failure message>'")
            continue
        task = f"{match.group(1)}.{int(match.group(2))}"
        found.setdefault(match.group(1), []).append(Planted(path, task, expect.group(1)))
    return found, problems


def solution_of(number: str, solutions: Path = SOLUTIONS) -> Path:
    found = sorted(solutions.glob(f"{number}_*.ipynb"))
    if len(found) != 1:
        raise FileNotFoundError(f"exercise {number}: expected one solution notebook in {solutions}, found {found}")
    return found[0]


def copy_id(task: str, number: int) -> str:
    """The task id of the ``number``-th copy of ``task`` in a stacked notebook (``02.1``, 3 -> ``02.103``)."""
    exercise, k = task.split(".")
    return f"{exercise}.{int(k) * 100 + number}"


def _without_markers(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True)
                   if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def _save(names: Sequence[str], slot: str) -> str:
    """A cell keeping the bindings of ``names`` as they are now (names not bound yet stay unbound)."""
    return f"{slot} = {{n: globals()[n] for n in {sorted(names)!r} if n in globals()}}"


def _restore(names: Sequence[str], slot: str) -> str:
    """A cell giving ``names`` back the bindings :func:`_save` kept."""
    return (f"for _n in {sorted(names)!r}:\n    globals().pop(_n, None)\n"
            f"globals().update({slot})")


def stacked(solution: nbformat.NotebookNode, files: Sequence[Planted]) -> Tuple[nbformat.NotebookNode, Dict[str, Planted]]:
    """One notebook grading every file of an exercise (see the module's docstring), with no solution
    markers left (it is its own pristine copy), and ``copy task id -> planted file``.

    Each copy starts from the names the task defines as they were before the task's own solution
    cell (a ``class MyAllocator(MyAllocator)`` builds on the earlier task, never on another copy),
    and after the copies the task's reference solution runs again on that same base. A task with
    copies keeps its reference solution as a plain cell, without its checks: the reference's own
    grade is the sync gate's (tests/exercises/test_exercises_gates.py), and checking it again here
    cost exercise 10 two whole capstone runs under Triton's interpreter."""
    from paged_kv_course.grading.splice import _defined_names

    nb = copy.deepcopy(solution)
    tasks = find_tasks(nb)
    by_task: Dict[str, List[Planted]] = {}
    for planted in files:
        by_task.setdefault(planted.task, []).append(planted)
    last = {t.task: max((t.solution_cell, *t.check_cells)) for t in tasks.values()}
    first = {t.solution_cell: t.task for t in tasks.values() if by_task.get(t.task)}
    checked = {at for t in tasks.values() if by_task.get(t.task) for at in t.check_cells}
    cells, copies = [], {}
    for index, cell in enumerate(nb.cells):
        if index in first:
            names = sorted(_defined_names(cell.get("source", "")))
            cells.append(nbformat.v4.new_code_cell(_save(names, f"_planted_base_{index}")))
            cells.append(nbformat.v4.new_code_cell(cell.source))  # the reference, as a plain cell: not graded
        elif index not in checked:
            cells.append(cell)
        for task in (t for t, at in last.items() if at == index and by_task.get(t)):
            spec = tasks[task]
            reference = nb.cells[spec.solution_cell]
            names = sorted(_defined_names(reference.get("source", "")))
            restore = _restore(names, f"_planted_base_{spec.solution_cell}")
            for number, planted in enumerate(by_task[task], start=1):
                ident = copy_id(task, number)
                copies[ident] = planted
                cells.append(nbformat.v4.new_code_cell(restore))
                for at in (spec.solution_cell, *spec.check_cells):
                    twin = copy.deepcopy(nb.cells[at])
                    twin.metadata["paged_kv"]["task"] = ident
                    twin.pop("id", None)
                    if at == spec.solution_cell:
                        twin.source = planted.source
                    cells.append(twin)
            cells.append(nbformat.v4.new_code_cell(restore))  # then the reference again, for what follows
            cells.append(nbformat.v4.new_code_cell(reference.source))
    for number, cell in enumerate(cells):
        cell.source = _without_markers(cell.get("source", ""))
        cell["id"] = f"stacked-{number}"
    nb.cells = cells
    return nb, copies


def spliced(solution: nbformat.NotebookNode, files: Sequence[Planted]) -> nbformat.NotebookNode:
    """A copy of the solution notebook with each file's task's solution cell replaced by the file."""
    nb = copy.deepcopy(solution)
    tasks = find_tasks(nb)
    for planted in files:
        nb.cells[tasks[planted.task].solution_cell].source = planted.source
    return nb


def grade_with_grader(submission: Path, solution: Path, workdir: Path) -> Dict[str, Outcome]:
    """The official grader's verdict per task (a grader error fails every task with that error)."""
    from paged_kv_course.grading import grader

    report = grader.grade_notebook(submission, pristine=solution, cell_timeout=CELL_TIMEOUT_S,
                                   workdir=workdir, sandbox_mode="auto")
    if report.error:
        return {t.task: Outcome(False, f"grader error: {report.error}") for t in report.tasks} or {
            "": Outcome(False, f"grader error: {report.error}")}
    return {t.task: Outcome(t.passed, f"{t.failure}\n{t.detail}") for t in report.tasks}


def verdict(planted: Planted, outcomes: Dict[str, Outcome]) -> Optional[str]:
    """None when the planted task failed showing its expected text; else what happened instead."""
    outcome = outcomes.get(planted.task)
    if outcome is None:
        return f"task {planted.task} is not in the graded notebook"
    if outcome.passed:
        return "passed: the grader gave it full marks"
    if planted.expect not in outcome.text:
        first = outcome.text.strip().splitlines()[0] if outcome.text.strip() else "(no message)"
        return f"failed with {first!r}, not with {planted.expect!r}"
    return None


def run_gate(files: Sequence[Planted], solution: Path, workdir: Path,
             grade: Grade = grade_with_grader) -> Tuple[List[str], int]:
    """Grade ``files`` (one exercise) in one stacked run, each unconfirmed file again alone; (problems, runs)."""
    nb = read_notebook(solution)
    known = set(find_tasks(nb))
    problems = [f"{p.path.name}: task {p.task} has no solution cell in {solution.name}" for p in files
                if p.task not in known]
    files = [p for p in files if p.task in known]
    runs = 0

    def grade_group(group: Sequence[Planted], label: str) -> Dict[str, Outcome]:
        nonlocal runs
        runs += 1
        folder = workdir / label
        submission = folder / "learner" / solution.name
        submission.parent.mkdir(parents=True)
        write_notebook(spliced(nb, group), submission)
        return grade(submission, solution, folder / "work")

    if not files:
        return problems, runs
    runs += 1
    together, copies = stacked(nb, files)
    submission = workdir / "stacked" / "learner" / solution.name
    submission.parent.mkdir(parents=True)
    write_notebook(together, submission)
    outcomes = grade(submission, submission, workdir / "stacked" / "work")  # its own pristine copy
    for ident, planted in copies.items():
        if verdict(replace(planted, task=ident), outcomes) is None:
            continue
        alone = verdict(planted, grade_group([planted], f"alone-{planted.path.stem}"))
        if alone is not None:
            problems.append(f"{planted.path.name} (task {planted.task}): {alone}")
    return problems, runs


def coverage_problems(found: Dict[str, List[Planted]], solutions: Sequence[Path]) -> List[str]:
    """A line for every graded task of ``solutions`` without a planted file."""
    problems = []
    for solution in solutions:
        number = solution.name[:2]
        have = {p.task for p in found.get(number, [])}
        missing = [t for t in find_tasks(read_notebook(solution)) if t not in have]
        if missing:
            problems.append(f"exercise {number}: no planted wrong solution for task(s) {', '.join(missing)} "
                            f"(add tests/exercises/planted/{number}/<NN>_<k>_<slug>.py)")
    return problems


def _gate(folder: Path, number: str, solution: Path, workdir: Path) -> None:
    found, problems = read_planted(folder)
    files = found.get(number, [])
    assert files, f"no planted files for exercise {number} in {folder}"
    start = time.monotonic()
    gate_problems, runs = run_gate(files, solution, workdir)
    print(f"\nexercise {number}: {len(files)} planted file(s), {runs} grading run(s), "
          f"{time.monotonic() - start:.1f} s")
    assert not problems + gate_problems, "\n".join(problems + gate_problems)


# ---------------------------------------------------------------------------------------
# The gate over the exercise authors' planted files


_REAL, _REAL_PROBLEMS = read_planted(PLANTED)


def test_planted_files_are_well_formed():
    assert not _REAL_PROBLEMS, "\n".join(_REAL_PROBLEMS)


def test_every_graded_task_has_a_planted_file():
    solutions = sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))
    assert solutions
    problems = coverage_problems(_REAL, solutions)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("number", sorted(_REAL))
def test_planted_wrong_solutions_fail_through_the_grader(number, tmp_path):
    _gate(PLANTED, number, solution_of(number), tmp_path)


# ---------------------------------------------------------------------------------------
# The gate's own demo: the grader's demo exercise


@pytest.fixture
def demo_checks_importable(monkeypatch):
    """The demo exercise imports ``demo_checks``; its kernels inherit this environment."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


def test_the_demo_covers_its_exercise():
    found, problems = read_planted(DEMO)
    assert not problems, problems
    assert coverage_problems(found, [FIXTURES / "solutions" / "90_demo.ipynb"]) == []
    solution = read_notebook(FIXTURES / "solutions" / "90_demo.ipynb")
    together, copies = stacked(solution, found["90"])
    assert sorted(copies) == ["90.101", "90.102", "90.201", "90.301"], "two files for 90.1: two copies of it"
    tasks, original = find_tasks(together), find_tasks(solution)
    for ident, planted in copies.items():
        spec, twin = original[planted.task], tasks[ident]
        assert together.cells[twin.solution_cell].source == planted.source
        assert len(twin.check_cells) == len(spec.check_cells)
        assert "globals().update(_planted_base_" in together.cells[twin.solution_cell - 1].source
    assert sorted(tasks) == sorted(copies), "the references are plain cells: only the copies are graded"
    reference_90_1 = _without_markers(solution.cells[original["90.1"].solution_cell].source)
    assert [c.source for c in together.cells].count(reference_90_1) == 2, "the reference again after the copies"
    assert not any("### BEGIN SOLUTION" in c.source for c in together.cells), "its own pristine copy"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_exercise_through_the_grader(demo_checks_importable, tmp_path):
    _gate(DEMO, "90", FIXTURES / "solutions" / "90_demo.ipynb", tmp_path)


# ---------------------------------------------------------------------------------------
# The gate's logic, with a stand-in grader


def _files(tmp_path: Path, names: Dict[str, str]) -> List[Planted]:
    folder = tmp_path / "planted" / "90"
    folder.mkdir(parents=True)
    for name, expect in names.items():
        (folder / name).write_text(f"# expect: {expect}\ndef add(a, b):\n    return 0\n")
    found, problems = read_planted(tmp_path / "planted")
    assert not problems
    return found["90"]


def test_a_file_missing_from_its_batch_is_graded_alone_before_it_fails(tmp_path):
    files = _files(tmp_path, {"90_1_a.py": "A", "90_2_b.py": "B", "90_3_c.py": "C"})
    calls: List[int] = []

    def grade(submission: Path, solution: Path, workdir: Path) -> Dict[str, Outcome]:
        nb = read_notebook(submission)
        planted = [t for t, spec in find_tasks(nb).items() if "# expect:" in nb.cells[spec.solution_cell].source]
        calls.append(len(planted))
        if len(planted) > 1:  # in the stacked run, 90.2's planted mistake hides 90.3's line
            return {"90.101": Outcome(False, "A"), "90.201": Outcome(False, "B"), "90.301": Outcome(False, "B")}
        return {"90.1": Outcome(True, ""), "90.2": Outcome(True, ""), "90.3": Outcome(False, "C")}

    problems, runs = run_gate(files, FIXTURES / "solutions" / "90_demo.ipynb", tmp_path / "w", grade)
    assert problems == [] and runs == 2 and calls == [3, 1]


def test_a_planted_file_that_passes_or_names_another_mistake_fails_the_gate(tmp_path):
    files = _files(tmp_path, {"90_1_a.py": "off by one", "90_3_c.py": "round up"})

    def grade(submission: Path, solution: Path, workdir: Path) -> Dict[str, Outcome]:
        return {"90.1": Outcome(False, "hint: restart at 0"), "90.3": Outcome(True, "")}

    problems, runs = run_gate(files, FIXTURES / "solutions" / "90_demo.ipynb", tmp_path / "w", grade)
    assert runs == 3
    assert problems == [
        "90_1_a.py (task 90.1): failed with 'hint: restart at 0', not with 'off by one'",
        "90_3_c.py (task 90.3): passed: the grader gave it full marks",
    ]


def test_ill_formed_planted_files_are_named(tmp_path):
    folder = tmp_path / "planted" / "90"
    folder.mkdir(parents=True)
    (folder / "90_1_no_expect.py").write_text("def add(a, b):\n    return 0\n")
    (folder / "bad name.py").write_text("# expect: x\n")
    (folder / "91_1_elsewhere.py").write_text("# expect: x\n")
    (folder / "90_9_unknown.py").write_text("# expect: x\n")
    found, problems = read_planted(tmp_path / "planted")
    text = "\n".join(problems)
    assert "90_1_no_expect.py: its first line must be '# expect:" in text
    assert "bad name.py: not named" in text and "exercise 91 in folder 90" in text
    problems, runs = run_gate(found["90"], FIXTURES / "solutions" / "90_demo.ipynb", tmp_path / "w",
                              lambda *a: {})
    assert problems == ["90_9_unknown.py: task 90.9 has no solution cell in 90_demo.ipynb"] and runs == 0


def test_coverage_names_the_tasks_without_a_planted_file(tmp_path):
    files = _files(tmp_path, {"90_2_b.py": "B"})
    assert coverage_problems({"90": files}, [FIXTURES / "solutions" / "90_demo.ipynb"]) == [
        "exercise 90: no planted wrong solution for task(s) 90.1, 90.3 "
        "(add tests/exercises/planted/90/<NN>_<k>_<slug>.py)"
    ]
