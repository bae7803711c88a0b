"""What exercise 09's checks share: describing a batch, closeness at a dtype's tolerance, probe replies.

The Triton checks never call the learner's ``@triton.jit`` code themselves: they hand it to a
probe (:mod:`.probes`), which launches it through :mod:`paged_kv_course.triton_skeleton`
where the learner's objects live and answers ``("ok", value)`` or ``("raised", type, message)``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from paged_kv_lib.attention.testing import TOLERANCES, PagedAttentionCase
from ._common import TaskNotWrittenError, fail

_UNWRITTEN = re.compile(r"Task (09\.[0-9]+)")


def describe(b: PagedAttentionCase) -> str:
    """One line naming a batch's shapes, block tables and lengths (the call a failure shows)."""
    return (f"q {tuple(b.q.shape)} {str(b.q.dtype).replace('torch.', '')}, caches {tuple(b.k_cache.shape)} "
            f"(num_blocks, kv_heads, block_size, head_dim), block_tables={b.block_tables.tolist()}, "
            f"seq_lens={b.seq_lens.tolist()}")


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-element closeness at the dtype's tolerance (NaN is never close; equal infinities are)."""
    tol = TOLERANCES[dtype]
    g, w = got.float(), want.float()
    return torch.isclose(g, w, atol=tol["atol"], rtol=tol["rtol"]) | (torch.isinf(w) & (g == w))


def matches(got: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``got`` is ``other`` at the dtype's tolerance, NaN where it has NaN."""
    both_nan = torch.isnan(got.float()) & torch.isnan(other.float())
    return bool((both_nan | close(got, other, dtype)).all())


def unwrap(report: Any, call: str, expected: Any, task: str) -> Any:
    """The value of a probe's ``("ok", value)``; an untouched task or a raising kernel fails the check."""
    if type(report) is tuple and len(report) == 2 and report[0] == "ok":
        return report[1]
    if type(report) is tuple and len(report) == 3 and report[0] == "raised":
        kind, message = str(report[1]), str(report[2])
        if kind == "NotImplementedError" or "NotImplementedError" in message:
            found = _UNWRITTEN.search(message)
            raise TaskNotWrittenError(found.group(1) if found else task)
        first = message.strip().splitlines()[-1] if message.strip() else ""
        if kind == "NotAKernelError":  # the launcher's type check: no kernel, no points
            raise fail(call, expected, f"it was not launched: {first[:600]}",
                       "not a Triton kernel: the task's point is the @triton.jit function itself, and nothing "
                       "else is launched in its place (a function or an object answering kernel[grid] earns 0)")
        if "fold_tile returned a state of other shapes" in message:
            raise fail(call, expected, f"it raised {kind}", "the state's shapes were not kept: m and l are [1] and "
                       "acc is [D], as fold_tile was given them; a value reduced over the whole tile is 0-d")
        hint = ("a store must be masked to the rows that exist" if "wrote past the end" in message else
                "the kernel did not run: read the error (a shape, a dtype, a name the kernel does not know)")
        raise fail(call, expected, f"it raised {kind}: {first[:600]}", hint)
    raise fail(call, expected, report, "the probe gave no answer: did the cell replace the course's launcher?")
