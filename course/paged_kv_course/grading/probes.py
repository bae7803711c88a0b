"""Probes: questions about identity and aliasing, asked where the learner's objects live.

Whether a returned list *is* the allocator's own list cannot be decided from a copy of
it, and under official grading the checks see copies (replies are plain data). So a
check asks such a question through :func:`paged_kv_course.grading._common.run_probe` with
one of these functions: in a notebook it runs right here; under the grader it runs in
the learner's kernel and only its plain answer (bool, int, str) comes back. Probes take
and return nothing but the learner's objects, names and plain data, and never raise on
a learner's mistake: they report it.
"""

from __future__ import annotations

from typing import Any, Sequence


def returned_value_is_held(obj: Any, method: str, args: Sequence[Any] = ()) -> bool:
    """Whether ``obj.method(*args)`` hands out a mutable value that ``obj`` itself still holds.

    It calls the method, appends a marker to what came back when that is a list, calls the
    method again and reports whether the marker shows up in the second answer (it is
    removed again either way).
    """
    first = getattr(obj, method)(*args)
    if not isinstance(first, list):
        return False
    marker = object()
    first.append(marker)
    try:
        second = getattr(obj, method)(*args)
        return isinstance(second, list) and any(item is marker for item in second)
    finally:
        if first and first[-1] is marker:
            first.pop()


def entries_alias(mapping: Any, key_a: Any, key_b: Any) -> bool:
    """Whether ``mapping[key_a]`` and ``mapping[key_b]`` are one object (two tables sharing one list)."""
    return mapping[key_a] is mapping[key_b]


def attribute_entries_alias(obj: Any, attribute: str, key_a: Any, key_b: Any) -> bool:
    """Whether ``getattr(obj, attribute)[key_a]`` and ``[key_b]`` are one object (read where ``obj`` lives).

    For a check that holds only a handle to the learner's allocator: ``obj.tables`` fetched into the
    judge would be a copy, in which the question has no answer.
    """
    try:
        mapping = getattr(obj, attribute)
        return mapping[key_a] is mapping[key_b]
    except Exception:  # noqa: BLE001 - a probe reports, it never raises on the learner's state
        return False


def _triton_report(launcher: str, *args: Any) -> Any:
    """``("ok", value)`` from ``triton_skeleton.<launcher>(*args)``, or ``("raised", type name, message)``:
    a learner's Triton code that raises (an untouched task, a compile error) is reported, never raised."""
    from paged_kv_course.stand_in import is_stand_in  # absolute: the kernel loads this file by its path

    if any(is_stand_in(a) for a in args):
        # A proxy of a kernel object reached this process: the judge ran the probe here, not in the kernel.
        return ("raised", "RuntimeError", "the grader cannot launch a Triton kernel from outside the learner's "
                "kernel: this check needs the judge to run its probe there")
    try:
        from paged_kv_course import triton_skeleton  # absolute: the kernel loads this file by its path

        return ("ok", getattr(triton_skeleton, launcher)(*args))
    except Exception as exc:  # noqa: BLE001 - every failure of the learner's kernel is the answer
        return ("raised", type(exc).__name__, str(exc)[:4000])


def triton_tile_addresses(tile_addresses: Any, *args: Any) -> Any:
    """Exercise 09.1: run the learner's ``@triton.jit`` ``tile_addresses`` through the course's driver
    kernel (:func:`paged_kv_course.triton_skeleton.tile_addresses_table`)."""
    return _triton_report("tile_addresses_table", tile_addresses, *args)


def triton_fold_tiles(fold_tile: Any, *args: Any) -> Any:
    """Exercise 09.2: run the learner's ``@triton.jit`` ``fold_tile`` through the course's driver kernel."""
    return _triton_report("fold_tiles", fold_tile, *args)


def triton_paged_decode(kernel: Any, merge: Any, *args: Any) -> Any:
    """Exercise 09.4: launch the learner's decode and merge kernels; ``("ok", (out, (max, sum, acc)))``."""
    return _triton_report("paged_decode_with_partials", kernel, merge, *args)
