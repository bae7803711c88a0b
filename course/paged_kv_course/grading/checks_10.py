"""Checks for exercise 10, the capstone: the learner's allocator and decode kernel serve the tiny model together.

The engine is the library's; the bookkeeping is the learner's class (exercises 02-06) and decode attention is
the learner's pair of 09.4 kernels. The workload (:mod:`paged_kv_course.capstone`) streams four requests under
chunked prefill with a small token budget and prefix caching on, in a pool small enough to preempt once. The
verdict comes from what is observed: every generated token against the no-cache reference, and the figures.
A wrong run is replayed with one learner part at a time, so the failure names the part that broke.
"""

from __future__ import annotations

import ast
import math
import textwrap
from typing import Any, Optional, Tuple

from ..capstone import Parts, Run, attempt, figures_table, first_difference, serve
from ..stand_in import is_stand_in_class
from ._common import CheckFailure, TaskNotWrittenError, call_learner, fail, not_written, passed, run_probe
from ._common_09 import unwrap
from ._common_repair import solution_source
from .probes import triton_paged_decode


def _launch(kernel: Any, merge: Any, *args: Any) -> Any:
    """09.4's launch of the learner's kernels, asked for where they live (a plain call in a notebook)."""
    report = run_probe(triton_paged_decode, kernel, merge, *args)
    launched = unwrap(report, "paged_decode(paged_decode_kernel, merge_splits_kernel, ...) in the engine",
                      "decode attention of the step's batch", "10.2")
    return launched[0]  # the output; then the split buffers and the reads 09.4's check looks at


def _attempt(parts: Parts) -> Tuple[Optional[Run], Optional[str]]:
    """:func:`~paged_kv_course.capstone.attempt`, with an unwritten task reported in one line."""
    try:
        return attempt(parts)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        raise not_written(exc) from None


def _library() -> Run:
    run = serve()
    if first_difference(run) is not None:  # the course's own parts: never the learner's fault
        raise RuntimeError(f"the library's engine itself differs from the reference: {first_difference(run)}")
    return run


def _allocator_class(my_allocator_class: Any, task: str) -> Any:
    cls = call_learner(my_allocator_class, (), "my_allocator_class()", "your allocator class")
    if not (isinstance(cls, type) or is_stand_in_class(cls)):  # under the grader a class arrives as a stand-in
        raise fail("my_allocator_class()", "your allocator class", cls,
                   "return the class itself (MyAllocator), not an instance")
    return cls


_ALLOCATOR_HINT = ("the allocator is the part that breaks: run exercise 06's checks on this class, then compare the "
                   "blocks it hands out with what the engine asks under chunked prefill, a fork and a preemption")
_KERNEL_HINT = ("the kernel is the part that breaks: run task 09.4's check on these kernels; the engine's batches "
                "have sequences of very different lengths, unused block-table entries, and GROUP = 2")


def check_capstone_allocator(my_allocator_class: Any) -> None:
    """Task 10.1: the engine serves the workload token for token with the learner's allocator doing the books."""
    library = _library()
    run, wrong = _attempt(Parts(allocator_class=_allocator_class(my_allocator_class, "10.1")))
    if wrong is not None or run is None:
        raise fail("the engine with your allocator and the library's attention", "the no-cache tokens", wrong,
                   _ALLOCATOR_HINT)
    if run.prefix_hits == 0:
        raise fail("the engine with enable_prefix_caching=True", f"{library.prefix_hits} prompt tokens found cached",
                   "0", "three prompts share a system prompt: allocate_for_sequence(seq_id, n, token_ids=...) should "
                        "find its full blocks in your prefix cache and return how many tokens it found")
    print(figures_table([library, run]))
    passed("10.1")


def check_capstone_kernels(paged_decode_kernel: Any, merge_splits_kernel: Any) -> None:
    """Task 10.2: the engine serves the workload token for token with the learner's 09.4 kernels on decode steps."""
    kernel, merge = paged_decode_kernel, merge_splits_kernel
    run, wrong = _attempt(Parts(kernel=kernel, merge=merge, launch=_launch))
    if wrong is not None or run is None:
        raise fail("the engine with the library's allocator and your kernels", "the no-cache tokens", wrong,
                   _KERNEL_HINT)
    print(f"your kernels served {run.kernel_calls} decode-attention calls; every token equals the no-cache "
          "reference")
    passed("10.2")


def _glue_cases() -> Any:
    from paged_kv_lib.attention.testing import make_paged_batch

    return [make_paged_batch(seq_lens, num_q_heads=4, num_kv_heads=2, head_dim=24, block_size=4, seed=seed)
            for seq_lens, seed in (([1, 9, 30], 1), ([17], 2), ([5, 0, 12, 3], 3))]


def _check_glue(attend: Any) -> None:
    """The learner's decode attention on batches shaped like the tiny model's (head_dim 24), against plain torch."""
    import torch

    from paged_kv_lib.attention import paged_attention_reference

    for batch in _glue_cases():
        lens = [int(n) for n in batch.seq_lens]
        call = f"decode_attention(q {tuple(batch.q.shape)}, ..., seq_lens={lens})"
        want = paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
        got = call_learner(attend, (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens), call, want)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise fail(call, f"a tensor of shape {tuple(want.shape)}", got if not isinstance(got, torch.Tensor)
                       else f"shape {tuple(got.shape)}", "cut the padded head dimension back to the model's")
        if torch.allclose(got.float(), want.float(), atol=2e-4, rtol=2e-4):
            continue
        head_dim = batch.q.shape[-1]
        padded = 1 << (head_dim - 1).bit_length()
        wrong_scale = paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                                                batch.seq_lens, scale=1 / math.sqrt(padded))
        if torch.allclose(got.float(), wrong_scale.float(), atol=2e-4, rtol=2e-4):
            hint = (f"the scores are scaled by 1/sqrt({padded}), the padded width: the model's heads are {head_dim} "
                    "wide, and the zeros you appended do not change that")
        else:
            hint = "not the model's decode attention: compare with paged_attention_reference on this batch"
        raise fail(call, "softmax attention of each query head over its sequence", "different values", hint)


def _launches_through_the_kernel(make_decode_attention: Any) -> bool:
    """Whether the glue's text calls the course's ``paged_decode`` launcher (read from the solution cell the
    judge holds under official grading, from the function itself in a notebook)."""
    text = solution_source("10.3", make_decode_attention)
    if text is None:
        return True  # no text to read: only the judge's run without its solution cells gets here
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "make_decode_attention":
            return any(isinstance(call, ast.Call) and (getattr(call.func, "id", None) == "paged_decode"
                                                        or getattr(call.func, "attr", None) == "paged_decode")
                       for call in ast.walk(node))
    return False


def check_capstone(my_allocator_class: Any, paged_decode_kernel: Any, merge_splits_kernel: Any,
                   make_decode_attention: Any) -> None:
    """Task 10.3: the engine serves the workload with the learner's allocator, kernels and glue together."""
    kernel, merge = paged_decode_kernel, merge_splits_kernel
    try:
        cls = _allocator_class(my_allocator_class, "10.3")
    except TaskNotWrittenError:  # 10.3 runs on 10.1 and 10.2: say which task is missing, this one first
        try:  # an unwritten glue says so as soon as its function is called; a written one fails on the Nones
            attend = call_learner(make_decode_attention, (None, None), "make_decode_attention(None, None)", "a function")
            call_learner(attend, (None,) * 5, "decode_attention(None, ...)", "an error")
        except TaskNotWrittenError:
            raise
        except CheckFailure:  # written, and it looked at the kernels early: the earlier task is what is missing
            pass
        raise
    attend = call_learner(make_decode_attention, (kernel, merge), "make_decode_attention(kernel, merge)",
                          "a decode-attention function")
    if not _launches_through_the_kernel(make_decode_attention):
        raise fail("make_decode_attention(kernel, merge)", "decode attention launched through paged_decode",
                   "no paged_decode call", "the glue must run your kernels (paged_decode(kernel, merge, ...)), not "
                   "compute attention another way")
    _check_glue(attend)
    library = _library()
    run, wrong = _attempt(Parts(cls, kernel, merge, launch=_launch, adapter=make_decode_attention))
    if wrong is not None or run is None:
        _, alone = _attempt(Parts(allocator_class=cls))
        if alone is not None:
            raise fail("the engine with your allocator and the library's attention", "the no-cache tokens", alone,
                       _ALLOCATOR_HINT)
        _, alone = _attempt(Parts(kernel=kernel, merge=merge, launch=_launch))
        if alone is not None:
            raise fail("the engine with the library's allocator and your kernels", "the no-cache tokens", alone,
                       _KERNEL_HINT)
        raise fail("the engine with your allocator, kernels and glue", "the no-cache tokens", wrong,
                   "each part alone serves the model token for token, together they do not: does the allocator "
                   "hand out a block id past num_blocks, or the glue change its inputs in place?")
    print(figures_table([library, run]))
    print(f"all {run.generated} tokens equal the no-cache reference; your kernels served {run.kernel_calls} "
          "decode-attention calls")
    passed("10.3")


__all__ = ["check_capstone", "check_capstone_allocator", "check_capstone_kernels"]
