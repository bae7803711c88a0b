"""Exercise 06's checks bite: correct solutions pass with the one success line, untouched tasks say so in
one line, every planted wrong solution fails with a message naming its mistake, and ``engine_for``
serves a learner's prefix cache (trusting only what it can check)."""

from __future__ import annotations

import pytest

from paged_kv_course.conformance import AllocatorContractError
from paged_kv_course.starters.after_05 import AllocatorAfter05
from paged_kv_course.starters.after_06 import AllocatorAfter06, content_key
# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_06 import (check_allocator_conforms, check_eviction_order, check_prefix_caching_allocator, check_salted_block_key, check_serves_forked_samples, check_serves_shared_prefix, check_sharing_allocator, check_take_from_free_queue)
from paged_kv_course.grading.checks_06 import (
    CACHE_MISTAKES,
    COPY_MISTAKES,
    eviction_trace,
    library_order,
    lru_order,
    simulate_eviction,
)
from paged_kv_lib.block_manager import FreeBlockQueue
from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden
from paged_kv_course.grading.notebook_tasks import cell_meta, read_notebook

from check_helpers import fails, not_implemented, passes
from planted_harness import ROOT, is_delegation, planted_files, run_planted

NOTEBOOK = "06_sharing.ipynb"


def test_an_untouched_task_says_so_in_one_line():
    class Untouched(AllocatorAfter05):
        def append_tokens(self, seq_id, num_tokens=1):
            raise NotImplementedError("Task 06.1: replace this line with your code")

    class UntouchedCache(AllocatorAfter06):
        def __init__(self, num_blocks, block_size):
            raise NotImplementedError("Task 06.3: replace this line with your code")

    assert fails(check_sharing_allocator, Untouched) == "task 06.1 is not written yet"
    assert fails(check_prefix_caching_allocator, UntouchedCache) == "task 06.3 is not written yet"
    for check in (check_salted_block_key, check_eviction_order, check_take_from_free_queue):
        assert fails(check, not_implemented).startswith("this task is not written yet")


def test_sharing_allocator_correct(capsys):
    passes(check_sharing_allocator, AllocatorAfter06, "06.1", capsys)


def test_allocator_conforms_correct(capsys):
    passes(check_allocator_conforms, AllocatorAfter06, "06.1", capsys)


def test_allocator_conforms_catches_a_fork_without_counts():
    class ForkWithoutCounts(AllocatorAfter06):
        def fork(self, parent_seq_id, child_seq_id):
            super().fork(parent_seq_id, child_seq_id)
            for block_id in self.tables[child_seq_id]:
                self.ref_counts[block_id] -= 1

    assert "no difference from the library's allocator" in fails(check_allocator_conforms, ForkWithoutCounts)


def test_serves_forked_samples_correct(capsys):
    passes(check_serves_forked_samples, AllocatorAfter06, "06.1", capsys)


def test_prefix_cache_and_key_and_eviction_correct(capsys):
    passes(check_prefix_caching_allocator, AllocatorAfter06, "06.3", capsys)
    passes(check_salted_block_key, content_key, "06.2", capsys)

    def reused_near_the_head_kept(candidates):
        return [c["block"] for c in sorted(candidates, key=lambda c: (c["uses"] > 1 and c["position"] < 8,
                                                                       c["last_used"], -c["position"]))]

    passes(check_eviction_order, reused_near_the_head_kept, "06.4", capsys)


def test_a_rule_on_use_counts_alone_does_not_beat_lru():
    def frequency_first(candidates):
        return [c["block"] for c in sorted(candidates, key=lambda c: (c["uses"] > 1, c["last_used"], -c["position"]))]

    assert "a hit rate of at least" in fails(check_eviction_order, frequency_first)


def _take_through_library_queue(prev, next_, block_ids):
    """A correct 06.5 answer built on the library's queue (fine here: the tests may use the library)."""
    queue = FreeBlockQueue(len(next_) - 1)
    queue._prev, queue._next = list(prev), list(next_)
    queue._len = sum(1 for _ in queue)
    if len(set(block_ids)) != len(block_ids) or not all(type(b) is int and b in queue for b in block_ids):
        raise ValueError(f"not distinct queued blocks: {block_ids}")
    for block_id in block_ids:
        queue.remove(block_id)
    for i, (p, n) in enumerate(zip(queue._prev, queue._next)):
        if prev[i] != p:
            prev[i] = p
        if next_[i] != n:
            next_[i] = n


def test_take_from_free_queue_counts_reads(capsys):
    assert "your code walks the queue" in fails(check_take_from_free_queue, _take_through_library_queue)


@pytest.mark.parametrize("make, message", COPY_MISTAKES, ids=[m.__name__ for m, _ in COPY_MISTAKES])
def test_each_known_copy_mistake_is_named(make, message):
    assert message in fails(check_sharing_allocator, make)


@pytest.mark.parametrize("make, message", CACHE_MISTAKES, ids=[m.__name__ for m, _ in CACHE_MISTAKES])
def test_each_known_cache_mistake_is_named(make, message):
    assert message in fails(check_prefix_caching_allocator, make)


def test_the_eviction_trace_separates_lru_from_a_better_order():
    requests = eviction_trace(64)
    lru, lib = simulate_eviction(lru_order, requests), simulate_eviction(library_order, requests)
    assert 0 < lru <= lib < 1
    assert "a hit rate of at least" in fails(check_eviction_order, library_order)
    assert "each once" in fails(check_eviction_order, lambda candidates: [c["block"] for c in candidates][1:])


def test_every_planted_file_says_what_it_expects():
    files = planted_files("06")
    assert {f.name.split("_")[1] for f in files} == {"1", "2", "3", "4", "5"}, "every task has planted mistakes"


@pytest.mark.parametrize("path", [p for p in planted_files("06") if not is_delegation(p)], ids=lambda p: p.stem)
def test_planted_wrong_solution_fails_naming_its_mistake(path):
    expected, message = run_planted(path, NOTEBOOK)
    assert message is not None, f"{path.name} passed every check of its task"
    assert expected in message


def test_forbidden_covers_sharing_caching_and_the_free_queue():
    forbidden = forbidden_modules("06")
    for module in ("paged_kv_lib.prefix_cache", "paged_kv_lib.block_manager", "paged_kv_lib.allocator",
                   "paged_kv_lib.block_manager", "paged_kv_course.starters.after_06",
                   "paged_kv_course.conformance.starter", "paged_kv_course.grading.checks_06"):
        assert is_forbidden(module, forbidden), module
    assert not is_forbidden("paged_kv_course.starters.after_05", forbidden)


def test_no_cell_but_a_check_imports_a_forbidden_module():
    forbidden = forbidden_modules("06")
    nb = read_notebook(ROOT / "exercises" / "solutions" / NOTEBOOK)
    for cell in nb.cells:
        if cell.cell_type != "code" or (cell_meta(cell) or {}).get("role") == "check":
            continue
        for line in cell.source.splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert not is_forbidden(words[1], forbidden), line


# --------------------------------------------------------------- engine_for with a learner's prefix cache
def test_serves_shared_prefix_correct(capsys):
    passes(check_serves_shared_prefix, AllocatorAfter06, "06.3", capsys)


def test_a_class_that_claims_hits_it_does_not_have_gives_other_text():
    class Boasting(AllocatorAfter06):
        def allocate_for_sequence(self, seq_id, num_prompt_tokens, token_ids=None):
            super().allocate_for_sequence(seq_id, num_prompt_tokens)
            return (num_prompt_tokens // self.block_size) * self.block_size if token_ids is not None else 0

    message = fails(check_serves_shared_prefix, Boasting)
    assert "tokens differ" in message or "handed out blocks other sequences still hold" in message


def test_engine_for_checks_the_cached_count():
    from paged_kv_course.conformance import engine_for
    from paged_kv_lib.model import encode, load_tiny_model

    class OddCount(AllocatorAfter06):
        def allocate_for_sequence(self, seq_id, num_prompt_tokens, token_ids=None):
            super().allocate_for_sequence(seq_id, num_prompt_tokens, token_ids)
            return 3

    model = load_tiny_model()
    engine = engine_for(model, OddCount, num_blocks=20, block_size=4, enable_prefix_caching=True)
    with pytest.raises(AllocatorContractError, match="multiple of block_size"):
        engine.generate([encode("a prompt of some length")], 2)
    with pytest.raises(ValueError, match="prefix caching"):
        engine_for(model, AllocatorAfter05, num_blocks=20, block_size=4, enable_prefix_caching=True)
