"""Exercise 10's checks bite: the reference allocator passes, a planted allocator or kernel fails with a message
naming that part, planted glue fails with the mistake it makes, and a wrong run stops at its first wrong token.
That the reference kernels and glue pass 10.2 and 10.3 is the sync gate's test, through the grader
(tests/exercises/test_exercises_gates.py): each is a whole capstone run under Triton's interpreter."""

from __future__ import annotations

import linecache
import math
import os
from pathlib import Path

import pytest
from check_helpers import fails, not_implemented

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from paged_kv_course import capstone  # noqa: E402
from paged_kv_course.grading.checks_10 import (  # noqa: E402
    check_capstone,
    check_capstone_allocator,
    check_capstone_kernels,
)
from paged_kv_course.grading.delegation import forbidden_modules  # noqa: E402
from paged_kv_course.grading.notebook_tasks import cell_meta, read_notebook  # noqa: E402
from paged_kv_course.triton_skeleton import paged_decode  # noqa: E402
from paged_kv_lib.errors import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).parent / "planted" / "10"
# What the exercise's setup cell defines for its solution cells.
SETUP = {"math": math, "torch": torch, "triton": triton, "tl": tl, "F": F, "paged_decode": paged_decode,
         "OutOfBlocksError": OutOfBlocksError, "DuplicateSequenceError": DuplicateSequenceError,
         "UnknownSequenceError": UnknownSequenceError}
TASKS = {"10.1": "my_allocator_class", "10.2": "paged_decode_kernel", "10.3": "make_decode_attention"}


def defined(source: str, name: str):
    """Run a cell's source as a notebook does, its text kept where ``inspect.getsource`` finds it (IPython does so)."""
    filename = f"<cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = dict(SETUP)
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def reference():
    """The reference solution's three functions, from the solution notebook's cells."""
    namespace = dict(SETUP)
    for index, cell in enumerate(read_notebook(ROOT / "exercises" / "solutions" / "10_the_whole_engine.ipynb").cells):
        if (cell_meta(cell) or {}).get("role") == "solution":
            namespace.update(defined(cell.source, f"solution {index}"))
    return namespace


def kernels(namespace):
    """Task 09.4's two kernels as a namespace defines them (the 10.2 cell, or a planted one)."""
    return namespace["paged_decode_kernel"], namespace["merge_splits_kernel"]


def fails_all(check, *args) -> str:
    """The check rejects the learner's functions ``args`` with an AssertionError; returns its message."""
    return fails(lambda _: check(*args), None)


def planted(stem: str):
    path = PLANTED / f"{stem}.py"
    source = path.read_text(encoding="utf-8")
    return source.splitlines()[0].removeprefix("# expect: "), defined(source, path.name)


def test_an_untouched_allocator_task_raises_not_implemented():
    with pytest.raises(NotImplementedError):
        check_capstone_allocator(not_implemented)


def test_untouched_glue_raises_not_implemented(reference):
    with pytest.raises(NotImplementedError):
        check_capstone(reference["my_allocator_class"], *kernels(reference), not_implemented)


def test_an_instance_instead_of_the_class_is_named(reference):
    instance = reference["my_allocator_class"]()(8, 4)
    assert "return the class itself" in fails(check_capstone_allocator, lambda: instance)


def test_the_reference_allocator_passes_and_prints_the_figures(reference, capsys):
    check_capstone_allocator(reference["my_allocator_class"])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("PASSED 10.1")
    assert "prefix-cache hits" in out and "preemptions" in out and "tokens/s" in out


def test_a_planted_allocator_is_named_as_the_part_that_breaks():
    expect, namespace = planted("10_1_fork_uncounted")
    assert expect in fails(check_capstone_allocator, namespace["my_allocator_class"])


def test_an_allocator_without_prefix_caching_is_refused(reference):
    cls = reference["my_allocator_class"]()

    class NoCache(cls):
        def allocate_for_sequence(self, seq_id, num_prompt_tokens, token_ids=None):
            return super().allocate_for_sequence(seq_id, num_prompt_tokens)

    assert "prefix" in fails(check_capstone_allocator, lambda: NoCache)


def test_every_task_has_a_planted_mistake():
    assert {f"10.{p.stem.split('_')[1]}" for p in PLANTED.glob("10_*.py")} == set(TASKS)


@pytest.mark.slow
def test_a_planted_kernel_is_named_as_the_part_that_breaks():
    expect, namespace = planted("10_2_no_acc_rescale")
    assert expect in fails_all(check_capstone_kernels, *kernels(namespace))


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["10_3_padded_scale", "10_3_torch_attention"])
def test_planted_glue_is_named(reference, stem):
    expect, namespace = planted(stem)
    message = fails_all(check_capstone, reference["my_allocator_class"], *kernels(reference),
                        namespace["make_decode_attention"])
    assert expect in message


@pytest.mark.slow
@pytest.mark.parametrize("part, stem", [("allocator", "10_1_fork_uncounted"), ("kernel", "10_2_no_acc_rescale")])
def test_the_whole_run_names_the_broken_part(reference, part, stem):
    expect, namespace = planted(stem)
    allocator = namespace.get("my_allocator_class", reference["my_allocator_class"])
    pair = kernels(namespace if "paged_decode_kernel" in namespace else reference)
    message = fails_all(check_capstone, allocator, *pair, reference["make_decode_attention"])
    assert f"the {part} is the part that breaks" in message


def test_the_engine_counts_what_it_serves():
    run = capstone.serve()
    assert capstone.first_difference(run) is None
    assert run.generated == sum(len(t) for t in capstone.reference_tokens()) == 60
    assert run.prefix_hits > 0 and run.preemptions > 0  # the workload exercises both, or the check tests less


def test_a_wrong_token_is_reported_where_it_is():
    run = capstone.serve()
    run.tokens[4][3] += 1
    assert capstone.first_difference(run).startswith("sample 0 of the forked request, token 3")


def test_a_wrong_part_stops_the_run_at_its_first_wrong_token():
    zeros = capstone.Parts(kernel="k", merge="m", launch=lambda kernel, merge, q, *rest: torch.zeros_like(q))
    run, wrong = capstone.attempt(zeros)
    assert run is not None and wrong == run.stopped == capstone.first_difference(run)
    assert wrong.startswith("request ") and "the no-cache reference has" in wrong, wrong
    assert run.generated < 60, "the workload was served to the end"


def test_the_library_that_answers_is_forbidden():
    forbidden = forbidden_modules("10")
    for name in ("paged_kv_lib.allocator", "paged_kv_lib.block_manager", "paged_kv_lib.attention",
                 "paged_kv_course.starters", "paged_kv_course.capstone"):
        assert name in forbidden


# The conformance check's planted allocators (the course's answer after 06 with one method wrong). Those whose bug
# changes what the engine is served are named as the broken part; the other three break only contract details the
# engine never exercises (a mapping handed out by reference, KeyError for an unknown id, state kept on the class),
# which exercise 06's differential check catches.
SERVING_BUGS = ["SeedGrowth", "NotAtomic", "RoundsUp", "ForkWithoutRefCounts", "FreeMethod"]


@pytest.mark.parametrize("name", SERVING_BUGS)
def test_the_conformance_checks_planted_allocators_are_named(name):
    from tests.conformance import test_conformance_check as planted_classes

    cls = getattr(planted_classes, name)
    assert "the allocator is the part that breaks" in fails(check_capstone_allocator, lambda: cls)


def test_untouched_earlier_tasks_are_named_when_the_glue_is_written(reference):
    with pytest.raises(NotImplementedError, match="task 10.1 is not written yet"):
        check_capstone(_untouched("10.1"), *kernels(reference), reference["make_decode_attention"])


def test_an_untouched_capstone_names_its_own_task():
    with pytest.raises(NotImplementedError, match="10.3"):
        check_capstone(_untouched("10.1"), _untouched("10.2"), _untouched("10.2"), _untouched_glue)


def _untouched_glue(kernel, merge):
    """10.3 as the learner version hands it out: the glue's inner function holds the NotImplementedError."""
    return _untouched("10.3")


def _untouched(task):
    """A solution function as the learner version hands it out."""
    def untouched(*args):
        raise NotImplementedError(f"Task {task}: replace this line with your code")
    return untouched
