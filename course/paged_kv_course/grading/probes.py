"""Probes: identity, aliasing and "is this a Triton kernel", decided by the side that holds the answer.

In a notebook a probe is a plain function of the learner's objects. Under official grading
the objects stay in the learner's kernel (:class:`.remote.Remote`) and nothing here runs
there: identity and aliasing become *observations* the judge makes with plain requests
(the kernel gives one handle per object, so two handles are one object exactly when their
numbers are equal; a marker appended to a returned list either shows up in the next answer
or it does not), and whether a function is a Triton kernel is read from the solution cells'
source text, which the judge holds (:data:`JIT_NAMES`). Probes never raise on a learner's
mistake: they report it.
"""

from __future__ import annotations

from typing import Any, Sequence, Set

# Set by the judge: the names its solution cells define with a ``@triton.jit`` decorator.
JIT_NAMES: Set[str] = set()
_MARKER = "paged-kv: a marker the grader appended"


def _remote(value: Any) -> bool:
    return type(value).__dict__.get("__paged_kv_stand_in__") is True


def _ask(value: Any, op: str, name: str = "", *args: Any, keep: bool = False) -> Any:
    return value._ask(op, name, args, None, keep)


def _key(value: Any) -> Any:
    return object.__getattribute__(value, "_key") if _remote(value) else id(value)


def _caller_of(value: Any) -> Any:
    try:
        return object.__getattribute__(value, "_caller")
    except AttributeError:
        return None


def returned_value_is_held(obj: Any, method: str, args: Sequence[Any] = ()) -> bool:
    """Whether ``obj.method(*args)`` hands out a mutable list that ``obj`` itself still holds: a marker
    appended to the first answer shows up in the second (it is removed again either way)."""
    if not _remote(obj):
        first = getattr(obj, method)(*args)
        if not isinstance(first, list):
            return False
        marker = object()
        first.append(marker)
        try:
            return any(item is marker for item in getattr(obj, method)(*args))
        finally:
            if first and first[-1] is marker:
                first.pop()
    bound = _ask(obj, "getattr", method, keep=True)
    first = _ask(bound, "call", "", *args, keep=True)
    if object.__getattribute__(first, "_kind") != "list":
        return False
    _ask(first, "builtin", "append", _MARKER)
    try:
        second = bound(*args)
        return type(second) is list and _MARKER in second
    finally:
        _ask(first, "builtin", "pop")


def entries_alias(mapping: Any, key_a: Any, key_b: Any) -> bool:
    """Whether ``mapping[key_a]`` and ``mapping[key_b]`` are one object (two tables sharing one list)."""
    if not _remote(mapping):
        return mapping[key_a] is mapping[key_b]
    return _key(_ask(mapping, "builtin", "getitem", key_a, keep=True)) == \
        _key(_ask(mapping, "builtin", "getitem", key_b, keep=True))


def attribute_entries_alias(obj: Any, attribute: str, key_a: Any, key_b: Any) -> bool:
    """Whether ``getattr(obj, attribute)[key_a]`` and ``[key_b]`` are one object (observed where ``obj`` lives)."""
    try:
        if not _remote(obj):
            mapping = getattr(obj, attribute)
            return mapping[key_a] is mapping[key_b]
        return entries_alias(_ask(obj, "getattr", attribute, keep=True), key_a, key_b)
    except Exception:  # noqa: BLE001 - a probe reports, it never raises on the learner's state
        return False


def _triton_report(launcher: str, function: Any, *args: Any) -> Any:
    """``("ok", value)`` from ``triton_skeleton.<launcher>(function, *args)``, or ``("raised", type, message)``.

    Under the judge the launch runs in the learner's kernel (only it has the learner's function),
    and whether ``function`` is a Triton kernel is decided from the solution's source text: a
    function the solution cells do not define under ``@triton.jit`` earns nothing, whatever the
    launch returns."""
    if _remote(function):
        caller = _caller_of(function)
        if caller is None:  # a stand-in with no judge behind it: nothing can launch it from here
            return ("raised", "RuntimeError", "the grader cannot launch a Triton kernel from outside the learner's "
                                              "kernel: only the judge can ask the kernel to launch it")
        name = getattr(caller, "names", {}).get(_key(function), "")
        if name not in JIT_NAMES:
            return ("raised", "NotAKernelError", f"{name or 'the function'} is not defined with @triton.jit in your "
                                           "solution cell: this task grades a Triton kernel")
        try:
            return ("ok", caller.request("course", None, launcher, (function, *args)))
        except Exception as exc:  # noqa: BLE001 - the learner's kernel failing is the answer
            return ("raised", type(exc).__name__, str(exc)[:4000])
    try:
        from paged_kv_course import triton_skeleton

        return ("ok", getattr(triton_skeleton, launcher)(function, *args))
    except Exception as exc:  # noqa: BLE001 - every failure of the learner's kernel is the answer
        return ("raised", type(exc).__name__, str(exc)[:4000])


def triton_tile_addresses(tile_addresses: Any, *args: Any) -> Any:
    """Exercise 09.1: run the learner's ``@triton.jit`` ``tile_addresses`` through the course's driver kernel."""
    return _triton_report("tile_addresses_table", tile_addresses, *args)


def triton_fold_tiles(fold_tile: Any, *args: Any) -> Any:
    """Exercise 09.2: run the learner's ``@triton.jit`` ``fold_tile`` through the course's driver kernel."""
    return _triton_report("fold_tiles", fold_tile, *args)


def triton_paged_decode(kernel: Any, merge: Any, *args: Any) -> Any:
    """Exercise 09.4: launch the learner's decode and merge kernels; ``("ok", (out, (max, sum, acc)))``."""
    caller = _caller_of(merge) if _remote(merge) else None
    if caller is not None:
        if getattr(caller, "names", {}).get(_key(merge), "") not in JIT_NAMES:
            return ("raised", "NotAKernelError", "the merge kernel is not defined with @triton.jit in your solution cell")
    return _triton_report("paged_decode_with_partials", kernel, merge, *args)
