"""A pytest plugin for the grader: records what nbval saw in each notebook cell, as JSON.

The grader copies this file as ``conftest.py`` next to the notebook it grades (so the
pytest process does not import the library or torch) and runs
``pytest --nbval ... --paged-kv-report=FILE``. For every cell it writes the outcome
(passed / failed / skipped), one readable failure line and the full detail. A check cell
(``paged_kv`` role ``check``) passes only if it raised nothing *and* printed its
``PASSED <task>`` line. The file is rewritten after every cell, so a run killed from
outside still leaves the results so far.

It also makes nbval notice a dead kernel (a crash, or ``os._exit`` in learner code) within
a second instead of waiting for the whole cell timeout.

Only the standard library, pytest and nbval are imported here.
"""

from __future__ import annotations

import json
import os
import re
import time
from queue import Empty
from typing import Any, Dict, Optional

import pytest

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RESULTS: Dict[int, Dict[str, Any]] = {}
_STATE: Dict[str, Any] = {"path": None, "collect_errors": []}
_POLL_S = 0.5


class KernelDiedError(RuntimeError):
    """The kernel process ended while a cell ran."""


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--paged-kv-report", default=None, help="write per-cell grading results here (JSON)")


def pytest_configure(config: Any) -> None:
    _STATE["path"] = config.getoption("--paged-kv-report")
    _STATE["timeout"] = config.getoption("--nbval-cell-timeout", default=None)
    _patch_await_reply()
    _dump()


def _patch_await_reply() -> None:
    """Wait for a cell's reply in short slices, checking between them that the kernel lives."""
    try:
        from nbval.kernel import RunningKernel
    except ImportError:  # pragma: no cover - nbval is a dependency of the grader
        return
    original = RunningKernel.await_reply
    if getattr(original, "_paged_kv", False):
        return

    def await_reply(self: Any, msg_id: str, timeout: Optional[float] = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                return original(self, msg_id, timeout=remaining)
            except Empty:
                if not self.is_alive():
                    raise KernelDiedError(
                        "the kernel died while running this cell (a crash, or exit()/os._exit() in the code)"
                    ) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    await_reply._paged_kv = True  # type: ignore[attr-defined]
    RunningKernel.await_reply = await_reply


def _clean(text: str) -> str:
    return _ANSI.sub("", text or "").strip()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _error_output(item: Any) -> Optional[Dict[str, str]]:
    for out in getattr(item, "test_outputs", None) or []:
        if out.get("output_type") == "error":
            return {"ename": out.get("ename", ""), "evalue": _clean(out.get("evalue", ""))}
    return None


def _stdout(item: Any) -> str:
    return "".join(
        out.get("text", "") for out in getattr(item, "test_outputs", None) or []
        if out.get("output_type") == "stream" and out.get("name") == "stdout"
    )


def _describe(item: Any, excinfo: Any) -> Dict[str, str]:
    """A failure line and a detail text for an exception raised while running a cell."""
    exc = excinfo.value
    message = _clean(str(exc))
    timeout = _STATE.get("timeout")
    if isinstance(exc, KernelDiedError):
        return {"kind": "kernel-died", "line": message, "detail": ""}
    if message.startswith("Timeout of"):
        line = f"timed out: the cell ran longer than {timeout:g} s (an endless loop?)" if timeout else message
        if "Failed to interrupt" in message:
            line += "; the kernel could not be interrupted, later cells cannot run"
        return {"kind": "timeout", "line": line, "detail": ""}
    if "Kernel dead on test start" in message:
        line = "not run: the kernel died or was stopped in an earlier cell"
        return {"kind": "kernel-dead", "line": line, "detail": ""}
    error = _error_output(item)
    if error is not None:
        detail = f"{error['ename']}: {error['evalue']}" if error["evalue"] else error["ename"]
        return {"kind": "error", "line": _first_line(detail), "detail": detail}
    detail = _clean(str(item.repr_failure(excinfo))) if hasattr(item, "repr_failure") else message
    return {"kind": "error", "line": _first_line(message) or type(exc).__name__, "detail": detail}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    cell_num = getattr(item, "cell_num", None)
    if cell_num is None:
        return
    entry = _RESULTS.setdefault(cell_num, {"cell": cell_num, "outcome": "passed", "line": "", "detail": ""})
    if call.when == "teardown" or entry["outcome"] != "passed":
        return
    report = outcome.get_result()
    excinfo = call.excinfo
    if excinfo is not None:
        if excinfo.errisinstance(pytest.skip.Exception):
            entry.update(outcome="skipped", line="skipped", detail=_clean(str(excinfo.value)))
        else:
            entry.update(outcome="failed", **_describe(item, excinfo))
    elif call.when == "call":
        meta = (getattr(item, "cell", None) or {}).get("metadata", {}).get("paged_kv") or {}
        task = meta.get("task") if isinstance(meta, dict) else None
        if isinstance(meta, dict) and meta.get("role") == "check" and isinstance(task, str):
            line = f"PASSED {task}"
            if line not in [text.strip() for text in _stdout(item).splitlines()]:
                got = _first_line(_stdout(item))
                entry.update(
                    outcome="failed", kind="no-pass-line",
                    line=f"the check did not print '{line}'" + (f" (printed: {got!r})" if got else ""),
                    detail=_stdout(item),
                )
                report.outcome = "failed"
                report.longrepr = entry["line"]
    _dump()


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _STATE["collect_errors"].append(_clean(str(report.longrepr)))
        _dump()


def _dump() -> None:
    path = _STATE.get("path")
    if not path:
        return
    data = {"cells": [_RESULTS[k] for k in sorted(_RESULTS)], "collect_errors": _STATE["collect_errors"]}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
