"""Exercise 02's checks bite: the reference and the starter pass with the one success line, an untouched
task is "not written yet", and every planted wrong solution in ``planted/02/`` fails with the message its
first line expects (run in process here; through the official grader in ``test_planted_through_grader``)."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path
from typing import List

import pytest

from paged_kv_course.starters.after_02 import AllocatorAfter02
# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_02 import (check_allocate_02, check_allocator_02, check_allocator_02_free, check_batch_02, check_grow_and_free_02)
from paged_kv_course.grading._common import TaskNotWrittenError
from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden
from paged_kv_course.grading.notebook_tasks import cell_task, find_tasks, read_notebook

from check_helpers import compiled, passes

# --------------------------------------------------------------------------- planted wrong solutions, in process
# The official gate (tests/test_planted_through_grader.py, exercise infrastructure) grades every file of
# tests/exercises/planted/NN/ through `paged-kv grade`. This is its fast in-process twin: the file's source
# replaces its task's solution cell in the reference notebook, the cells run in order in one namespace, and
# the task's check cells must fail with the file's `# expect:` line. Files that reach for a module the
# exercise forbids earn 0 only under official grading (the stubs): here they must import a FORBIDDEN module.
REPO = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).resolve().parent / "planted"


def planted_files(number: str) -> List[Path]:
    return sorted((PLANTED / number).glob(f"{number}_*.py"))


def expected_line(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <substring>'"
    return first[len("# expect: "):].strip()


def planted_task(path: Path) -> str:
    number, k = path.stem.split("_")[:2]
    return f"{number}.{k}"


def forbidden_imports(source: str, number: str) -> List[str]:
    tree = ast.parse(source)
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    return [name for name in names if is_forbidden(name, forbidden_modules(number))]


def planted_failure(path: Path) -> str:
    """Run the reference notebook with ``path`` in its task's solution cell; the task's first check failure."""
    number = path.name[:2]
    task = planted_task(path)
    (solution,) = (REPO / "exercises" / "solutions").glob(f"{number}_*.ipynb")
    nb = read_notebook(solution)
    namespace: dict = {"__name__": "__main__"}
    reached = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found = cell_task(cell)
        if found and found[1] == "check":
            if found[0] != task:
                continue  # the reference solutions of the other tasks pass their checks
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(cell.source, f"<check {found[0]}>", "exec"), namespace)
            except AssertionError as exc:
                return str(exc)
            continue
        if reached:
            break  # the first code cell after the task's checks
        source = path.read_text(encoding="utf-8") if found == (task, "solution") else cell.source
        reached = found == (task, "solution")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compiled(source, f"<cell {found} {path.stem}>"), namespace)
    return ""


CHECKS = [(check_allocate_02, "02.1"), (check_allocator_02, "02.1"), (check_grow_and_free_02, "02.2"),
          (check_allocator_02_free, "02.2"), (check_batch_02, "02.3")]


@pytest.mark.parametrize("check, task", CHECKS, ids=[c.__name__ for c, _ in CHECKS])
def test_exercise_02s_starter_passes_every_check(check, task, capsys):
    passes(check, AllocatorAfter02, task, capsys)


class Untouched:
    """What the learner version holds before any work: every method of every task raises."""

    def __init__(self, num_blocks, block_size):
        raise NotImplementedError("Task 02.1: replace this line with your code")

    def append_block_to_sequence(self, seq_id):
        raise NotImplementedError("Task 02.2: replace this line with your code")

    def free_sequence(self, seq_id):
        raise NotImplementedError("Task 02.2: replace this line with your code")

    def allocate_batch(self, requests):
        raise NotImplementedError("Task 02.3: replace this line with your code")


@pytest.mark.parametrize("check, task", CHECKS, ids=[c.__name__ for c, _ in CHECKS])
def test_an_untouched_task_is_named_by_its_own_check(check, task):
    with pytest.raises(TaskNotWrittenError, match=f"task {task} is not written yet"):
        check(Untouched)


def test_a_written_task_on_an_unwritten_one_names_the_unwritten_one():
    class OnlyGrowth(Untouched):
        def append_block_to_sequence(self, seq_id):
            return self.tables[seq_id]

        def free_sequence(self, seq_id):
            self.tables.pop(seq_id, None)

    with pytest.raises(TaskNotWrittenError, match="task 02.1 is not written yet"):
        check_grow_and_free_02(OnlyGrowth)


def test_forbidden_covers_the_answers_of_exercise_02():
    forbidden = forbidden_modules("02")
    for module in ("paged_kv_lib.allocator", "paged_kv_lib.block_manager", "paged_kv_course.seed", "paged_kv_lib.block",
                   "paged_kv_course.conformance.starter", "paged_kv_course.starters.after_02",
                   "paged_kv_course.starters.after_03", "paged_kv_course.grading.checks_02"):
        assert is_forbidden(module, forbidden), module
    for module in ("paged_kv_lib.errors",):
        assert not is_forbidden(module, forbidden), module


def test_the_notebook_imports_nothing_forbidden_outside_its_check_cells():
    for number in ("02", "03"):
        (solution,) = (REPO / "exercises" / "solutions").glob(f"{number}_*.ipynb")
        for cell in read_notebook(solution).cells:
            found = cell_task(cell)
            if cell.cell_type == "code" and not (found and found[1] == "check"):
                assert not forbidden_imports(cell.source, number), (solution.name, cell.source[:200])


def test_every_task_has_planted_wrong_solutions():
    (solution,) = (REPO / "exercises" / "solutions").glob("02_*.ipynb")
    tasks = set(find_tasks(read_notebook(solution)))
    planted = {planted_task(p) for p in planted_files("02")}
    assert tasks <= planted, f"tasks without a planted wrong solution: {sorted(tasks - planted)}"


@pytest.mark.parametrize("path", planted_files("02"), ids=lambda p: p.stem)
def test_a_planted_wrong_solution_fails_with_its_named_mistake(path):
    expect = expected_line(path)
    source = path.read_text(encoding="utf-8")
    reached = forbidden_imports(source, "02")
    if reached:  # a delegation: official grading stubs the module; its name is the line the learner sees
        assert any(expect in name or name.startswith(expect) for name in reached), (reached, expect)
        return
    message = planted_failure(path)
    assert message, f"{path.name} passed its task's checks"
    assert expect in message, message
