"""Exercise 03's checks bite: the starter and the reference pass with the one success line, an untouched
task is "not written yet", and every planted wrong solution in ``planted/03/`` fails with the message its
first line expects (in process here; through the official grader in ``test_planted_through_grader``)."""

from __future__ import annotations

import pytest

from paged_kv_course.starters.after_02 import AllocatorAfter02
from paged_kv_course.starters.after_03 import AllocatorAfter03
# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_03 import (check_allocator_03, check_invariants_03, check_repaired_03, check_sharing_03)
from paged_kv_course.grading._common import TaskNotWrittenError
from paged_kv_course.grading.checks_03 import _corruptions
from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden
from paged_kv_course.grading.notebook_tasks import find_tasks, read_notebook

from check_helpers import passes
from test_checks_02 import REPO, expected_line, forbidden_imports, planted_failure, planted_files, planted_task


@pytest.mark.parametrize("check, task", [(check_sharing_03, "03.1"), (check_allocator_03, "03.1"),
                                         (check_invariants_03, "03.2")])
def test_exercise_03s_starter_passes(check, task, capsys):
    passes(check, AllocatorAfter03, task, capsys)


def test_exercise_02s_starter_is_not_yet_sharing():
    with pytest.raises(TaskNotWrittenError, match="task 03.1 is not written yet"):
        check_sharing_03(AllocatorAfter02)


def test_untouched_tasks_are_named_by_their_own_checks():
    class Untouched(AllocatorAfter02):
        def fork(self, parent_seq_id, child_seq_id):
            raise NotImplementedError("Task 03.1: replace this line with your code")

        def free_sequence(self, seq_id):
            raise NotImplementedError("Task 03.1: replace this line with your code")

        def check_invariants(self):
            raise NotImplementedError("Task 03.2: replace this line with your code")

    def repaired_allocator():
        raise NotImplementedError("Task 03.3: replace this line with your code")

    for check, task in ((check_sharing_03, "03.1"), (check_allocator_03, "03.1"), (check_invariants_03, "03.2")):
        with pytest.raises(TaskNotWrittenError, match=f"task {task} is not written yet"):
            check(Untouched)
    with pytest.raises(TaskNotWrittenError, match="task 03.3 is not written yet"):
        check_repaired_03(repaired_allocator)


def test_every_corruption_is_caught_by_the_starters_checker_and_none_is_a_false_alarm(capsys):
    """The corruptions are real: the reference checker raises on each (else a check would demand the impossible)."""
    passes(check_invariants_03, AllocatorAfter03, "03.2", capsys)
    assert len(_corruptions()) >= 15


def test_forbidden_covers_the_answers_of_exercise_03_and_keeps_exercise_02s_starter():
    forbidden = forbidden_modules("03")
    for module in ("paged_kv_lib.allocator", "paged_kv_lib.block_manager", "paged_kv_course.seed",
                   "paged_kv_course.conformance.starter", "paged_kv_course.starters.after_03",
                   "paged_kv_course.starters.after_05", "paged_kv_course.grading.checks_03"):
        assert is_forbidden(module, forbidden), module
    for module in ("paged_kv_course.starters.after_02", "paged_kv_lib.errors", "paged_kv_lib.block"):
        assert not is_forbidden(module, forbidden), module


def test_every_task_has_planted_wrong_solutions_and_the_debug_task_one_per_bug():
    (solution,) = (REPO / "exercises" / "solutions").glob("03_*.ipynb")
    tasks = set(find_tasks(read_notebook(solution)))
    planted = {planted_task(p) for p in planted_files("03")}
    assert tasks <= planted, f"tasks without a planted wrong solution: {sorted(tasks - planted)}"
    one_bug_left = [p for p in planted_files("03") if p.stem in (
        "03_3_refusal_leaves_a_length", "03_3_fork_onto_live_child", "03_3_frees_a_shared_block")]
    assert len(one_bug_left) == 3, "one planted file per bug of ShakyAllocator, with the other two fixed"


@pytest.mark.parametrize("path", planted_files("03"), ids=lambda p: p.stem)
def test_a_planted_wrong_solution_fails_with_its_named_mistake(path):
    expect = expected_line(path)
    source = path.read_text(encoding="utf-8")
    reached = forbidden_imports(source, "03")
    if reached:  # a delegation: official grading stubs the module; its name is the line the learner sees
        assert any(expect in name or name.startswith(expect) for name in reached), (reached, expect)
        return
    message = planted_failure(path)
    assert message, f"{path.name} passed its task's checks"
    assert expect in message, message
