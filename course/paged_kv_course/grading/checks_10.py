"""Checks for exercise 10, the capstone: the learner's allocator and decode kernel serve the tiny model together.

The engine is the library's; the bookkeeping is the learner's class (exercises 02-06) and decode attention is
the learner's pair of 09.4 kernels. The workload (:mod:`paged_kv_course.capstone`) streams four requests under
chunked prefill with a small token budget and prefix caching on, in a pool small enough to preempt once. The
verdict comes from what is observed: every generated token against the no-cache reference, and the figures.
A wrong run is replayed with one learner part at a time, so the failure names the part that broke.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from ..capstone import Parts, Run, figures_table, first_difference, serve
from ._common import CheckFailure, fail, not_written, passed, run_probe
from ._common_09 import unwrap
from .probes import triton_paged_decode

# What a solution of exercise 10 may not lean on: the two graded pieces are the learner's own, so neither the
# library's bookkeeping nor its attention kernels (nor the course's answers for them) may stand in for them.
FORBIDDEN: tuple[str, ...] = (
    "paged_kv_course.grading",
    "paged_kv_course.conformance.differential",
    "paged_kv_course.conformance.simulation",
    "paged_kv_course.capstone",
    "paged_kv_course.starters",
    "paged_kv_course.seed",
    "paged_kv_lib.allocator",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.block_pool", "paged_kv_lib.block_questions", "paged_kv_lib.block_rules",
    "paged_kv_lib.growth", "paged_kv_lib.swap_space", "paged_kv_lib.pool_stats",
    "paged_kv_lib.free_queue",
    "paged_kv_lib.prefix_cache",
    "paged_kv_lib.invariants",
    "paged_kv_lib.attention",
)

TASK = "10.1"


def _launch(kernel: Any, merge: Any, *args: Any) -> Any:
    """09.4's launch of the learner's kernels, asked for where they live (a plain call in a notebook)."""
    report = run_probe(triton_paged_decode, kernel, merge, *args)
    out, _partials = unwrap(report, "paged_decode(paged_decode_kernel, merge_splits_kernel, ...) in the engine",
                            "decode attention of the step's batch", TASK)
    return out


def _attempt(parts: Parts) -> Tuple[Optional[Run], Optional[str]]:
    """Serve the workload with ``parts``: the run and its first wrong token, or no run and what it raised."""
    try:
        run = serve(parts)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except Exception as exc:  # noqa: BLE001 - the learner's part failed: reported as a failed check
        return None, f"it raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    return run, first_difference(run)


def _blame(MyAllocator: Any, kernel: Any, merge: Any, together: str) -> CheckFailure:
    """The failure of the combined run, named after the part that breaks on its own."""
    _, alone = _attempt(Parts(allocator_class=MyAllocator))
    if alone is not None:
        return fail("the engine with your allocator and the library's attention", "the no-cache tokens", alone,
                    "the allocator is the part that breaks (the library's attention with it fails too): run "
                    "exercise 06's checks again, then compare the blocks your class hands out with the engine's "
                    "needs under chunked prefill and preemption")
    _, alone = _attempt(Parts(kernel=kernel, merge=merge, launch=_launch))
    if alone is not None:
        return fail("the engine with the library's allocator and your kernel", "the no-cache tokens", alone,
                    "the kernel is the part that breaks (the library's allocator with it fails too): run task "
                    "09.4's check again; the engine's batches have sequences of very different lengths, "
                    "block tables with unused entries, and GROUP = 2")
    return fail("the engine with your allocator and your kernel", "the no-cache tokens", together,
                "each part alone serves the model token for token, together they do not: does your allocator "
                "hand out block ids at or past num_blocks, or reuse a block another sequence still reads?")


def check_capstone(MyAllocator: Any, paged_decode_kernel: Any, merge_splits_kernel: Any) -> None:
    """Task 10.1: the engine serves the workload with the learner's allocator and kernel, token for token."""
    library = serve()
    if first_difference(library) is not None:  # the course's own parts: never the learner's fault
        raise RuntimeError(f"the library's engine itself differs from the reference: {first_difference(library)}")
    parts = Parts(allocator_class=MyAllocator, kernel=paged_decode_kernel, merge=merge_splits_kernel, launch=_launch)
    run, wrong = _attempt(parts)
    if wrong is not None or run is None:
        raise _blame(MyAllocator, paged_decode_kernel, merge_splits_kernel, wrong or "no run")
    if run.kernel_calls == 0:
        raise fail("the engine with your kernel", "decode steps through paged_decode_kernel", "no decode step",
                   "the engine never launched your kernel: pass it as the check cell does")
    if run.prefix_hits == 0:
        raise fail("the engine with enable_prefix_caching=True", f"{library.prefix_hits} prompt tokens found cached",
                   "0", "three prompts share a system prompt: your allocate_for_sequence(seq_id, n, token_ids=...) "
                        "should find its full blocks in the prefix cache and return how many tokens it found")
    print(figures_table([library, run]))
    print(f"every one of the {run.generated} tokens equals the no-cache reference; your kernel served "
          f"{run.kernel_calls} decode-attention calls")
    passed(TASK)


__all__ = ["check_capstone"]
