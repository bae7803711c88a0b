"""The course's Triton launchers refuse, in one line, what they cannot run: a non-kernel, or an interpreter too old."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from paged_kv_course import triton_skeleton  # noqa: E402


@triton.jit
def _kernel(x_ptr, N: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, N), tl.zeros([N], tl.float32))


def test_an_interpreter_older_than_3_7_is_refused_by_name(monkeypatch):
    if type(_kernel).__name__ != "InterpretedFunction":
        pytest.skip("Triton was first imported without its interpreter: a compiled kernel is not checked")
    triton_skeleton.require_kernel("kernel", _kernel)  # this environment's Triton runs the course
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    with pytest.raises(triton_skeleton.TritonTooOldError, match=r"Triton 3\.6\.0's interpreter .*'triton>=3\.7'"):
        triton_skeleton.require_kernel("kernel", _kernel)


def test_something_else_than_a_kernel_is_refused():
    with pytest.raises(triton_skeleton.NotAKernelError, match="not a @triton.jit function"):
        triton_skeleton.require_kernel("kernel", lambda: None)
