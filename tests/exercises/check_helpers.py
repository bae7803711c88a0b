"""What every planted-wrong-solution test needs: run a check and see it pass or bite."""

from __future__ import annotations

import pytest


def passes(check, fn, task, capsys) -> None:
    """The check accepts ``fn`` and prints its success line last (after any figures it shows)."""
    check(fn)
    out = capsys.readouterr().out
    assert out.endswith(f"PASSED {task}\n") and out.count("PASSED") == 1, out


def fails(check, fn) -> str:
    """The check rejects ``fn`` with an AssertionError; returns its message."""
    with pytest.raises(AssertionError) as info:
        check(fn)
    return str(info.value)


def not_implemented(*args, **kwargs):
    """What a learner's untouched task does."""
    raise NotImplementedError("Task: replace this line with your code")


def refused(check, value, module: str) -> str:
    """The check, fetched from ``paged_kv_course.grading``, refuses ``value`` for using ``module`` (the in-notebook
    probe, with the line the grade gives); returns that line. ``module`` must be in the exercise's FORBIDDEN."""
    from paged_kv_course.grading._common import CheckFailure

    with pytest.raises(CheckFailure) as info:
        check(value)
    line = str(info.value)
    assert line.startswith(f"uses {module}: library code that implements what exercise "), line
    return line


def compiled(source: str, filename: str):
    """``compile`` as a notebook kernel does it: the cell's text is kept in ``linecache`` under ``filename``,
    so ``inspect.getsource`` finds it (the debug tasks' checks read a repair's text that way)."""
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return compile(source, filename, "exec")
