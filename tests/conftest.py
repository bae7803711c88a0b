"""Shared test setup: one torch thread, Triton's CPU interpreter unless a GPU is present, hypothesis profiles."""

import os
import sys

# jsonschema (under nbformat) imports the optional rfc3987_syntax, which builds a parser at
# import time: about 3-8 s per process, once per xdist worker. Nothing here validates IRIs,
# so tests run as they would without that optional package. (Under `make test`, nbval's
# plugin has imported it before this file runs; `make test-fast` passes -p no:nbval.)
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

# Tests run tiny tensors, two workers on few cores: one torch thread each, in this process and in the
# kernels and graders it starts (threads that spin on a busy machine made the grader's checks 3x slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Must happen before anything imports triton (the interpreter is chosen at import time).
try:
    import torch

    torch.set_num_threads(1)
    _has_cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _has_cuda = False
if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Let test modules import tests/helpers.py.
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


# ---------------------------------------------------------------------------- slow tests
# `make test-fast` runs `pytest -m "not slow"`. Tests are marked slow here, by name, so the
# list lives in one place and no test file needs editing. Whole files (a path relative to
# tests/, or a folder ending in "/"):
SLOW_FILES = {
    "browser/",  # a real Chromium driving JupyterLab
    "test_exercises_gates.py",  # executes every exercise notebook, solved and unsolved
    "grading/test_grader.py",  # the grader runs notebooks in fresh kernels
    "grading/test_grader_attacks.py",
    "attention/test_attention_triton.py",  # every kernel through the Triton interpreter
    "attention/test_attention_cuda.py",  # GPU shapes (skipped without CUDA anyway)
    "attention/test_bench_attention_smoke.py",  # benchmarks in subprocesses
    "attention/test_kernel_compile_sm90.py",
    "test_gpu_check.py",
    "test_cli_commands.py",  # the installed command in subprocesses
    "model/test_hf_peer.py",  # imports transformers and builds a Llama
    "simulate/test_simulate_paper.py",  # paper-sized simulations
    "kv/test_allocator_stateful.py",  # hypothesis state machines with many steps
}
# Single tests (every parametrization), by file and name; each took seconds in a timed run:
SLOW_TESTS = {
    "test_free_queue.py::TestQueueMachine::runTest",  # state machines
    "test_simulate_contiguous.py::TestAllocatorMachine::runTest",
    "attention/test_attention.py::test_batched_extend_equals_the_reference",  # many shapes through the reference
    "attention/test_attention.py::test_batched_decode_equals_the_reference",
    "attention/test_attention.py::test_torch_decode_matches_sdpa",
    "attention/test_attention.py::test_torch_extend_matches_causal_sdpa",
    "attention/test_attention.py::test_library_imports_without_triton",  # a fresh interpreter
    "test_conformance_check.py::test_an_allocator_without_copy_on_write_fails_and_is_named",  # hypothesis searches
    "test_conformance_check.py::test_planted_bugs_are_named",
    "test_conformance_check.py::test_the_seeds_growth_rule_fails_with_a_short_sequence",
    "test_conformance_check.py::test_a_correct_class_passes_quickly",
    "test_conformance_check.py::test_a_non_atomic_failure_is_reported_as_a_change",
    "test_conformance_check.py::test_without_copy_on_write_in_ops_the_same_class_passes",
    "exercises/test_checks_06.py::test_allocator_conforms_catches_a_fork_without_counts",
    "exercises/test_checks_06.py::test_allocator_conforms_correct",
    "exercises/test_checks_08.py::test_memory_parts_correct",
    "test_simulate_cli.py::test_plot_is_written",
    "blocks/test_growth.py::TestBatchTwinMachine::runTest",  # a state machine, 150 runs of 40 steps
    "benchmarks/test_engine_versions.py::test_a_tree_against_itself_prints_rounds_and_a_paired_median",  # a subprocess
}


def _slow(path, is_dir: bool = False) -> bool:
    rel = os.path.relpath(str(path), os.path.dirname(__file__)).replace(os.sep, "/") + ("/" if is_dir else "")
    return any(rel == f or rel.endswith("/" + f) or (f.endswith("/") and rel.startswith(f)) for f in SLOW_FILES)


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not slow"``, do not even import a file whose every test is slow: collection
    (torch, triton, the notebook tooling, once per xdist worker) is much of a fast run."""
    if (config.getoption("markexpr", "") or "").replace(" ", "") != "notslow":
        return None
    return True if _slow(collection_path, collection_path.is_dir()) else None


# The longest tests (30 s to 3.5 min each on 2 cores, `--durations`), longest first, then the other slow ones:
# `make test-course` deals tests to its workers one at a time in this order, so no long test starts near the
# end and keeps one worker busy while the others wait.
LONGEST = (
    "grading/test_gradescope.py::test_the_zip_installs_with_its_own_setup_sh_and_grades_exercise_03",
    "grading/test_planted_through_grader.py::test_planted_wrong_solutions_fail_through_the_grader",
    "exercises/test_exercises_gates.py::test_the_grader_gives_the_solution_full_marks_and_the_untouched_version_nothing",
    "grading/test_grader_attacks.py::test_a_class_with_every_attack_grades_the_honest_learners_unchanged",
    "grading/test_grader_attacks.py::test_attacks_stopped_by_the_judge_earn_nothing_alone",
)


def _place(node: str, names) -> "int | None":
    """Where a test (its id without parameters) stands among ``names`` (``file::test``, the file by its path
    under tests/ or the end of that path), or None."""
    return next((i for i, name in enumerate(names) if node.endswith("/" + name) or node == "tests/" + name), None)


def pytest_collection_modifyitems(config, items):
    rank = {}
    for item in items:
        node = item.nodeid.replace(os.sep, "/").split("[")[0]
        if _slow(item.path) or _place(node, SLOW_TESTS) is not None:
            item.add_marker(pytest.mark.slow)
        longest = _place(node, LONGEST)
        rank[item.nodeid] = (0, longest) if longest is not None else (1 if item.get_closest_marker("slow") else 2, 0)
    items.sort(key=lambda item: rank[item.nodeid])  # stable: collection order within each rank
