"""The judge: runs a spliced exercise notebook and decides each check outside the learner's kernel.

The learner's kernel (:mod:`.runner`, sandboxed where possible) runs every code cell
except the check cells. For each check cell the judge parses its one call
``check_x(name, ...)``, imports the real check function here, and calls it with proxies
(:class:`Remote`) standing for the learner's globals: a call on a proxy sends its
arguments into the kernel, runs the learner's code there and brings back the result,
the arguments' new state and any exception, as untrusted plain data (:mod:`.wire`). So
the verdict is computed in this process, by the course's own check code and library,
whatever the learner's code does to its own interpreter.

``python -m paged_kv_course.grading.judge`` reads a job (JSON) on stdin and writes the
result (JSON) on stdout; the grader runs one such process per submission.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _common, sandbox, wire
from .check_cells import CheckCall, CheckCellError, imported_names, parse_check_cell
from .remote import Caller, JudgeAbort, Refused, Remote, _first_line, library_errors, restore
from ._common import TaskNotWrittenError, not_written

__all__ = ["Caller", "CheckCall", "CheckCellError", "JudgeAbort", "Refused", "Remote", "Session", "imported_names",
           "judge", "library_errors", "main", "parse_check_cell", "restore", "run_check"]

RUNNER = sandbox.RUNNER
INTERRUPT_GRACE_S = 3.0
STARTUP_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------
# The connection to the learner's kernel


class Session:
    """The learner's kernel process and the request/reply conversation with it."""

    def __init__(self, spec: sandbox.SandboxSpec, mode: str) -> None:
        self.spec = spec
        self.mode = mode
        self.process = sandbox.start_kernel(spec, mode)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.write_fd = self.process.stdin.fileno()
        self.read_fd = self.process.stdout.fileno()
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.dead = ""

    def request(self, message: Any, timeout: Optional[float] = None) -> Tuple[Any, List[bytes]]:
        """Send a request and wait for its reply (JSON document, blobs); the kernel interrupts itself when
        its budget runs out (and says so), and a kernel that does not answer within a grace period is killed.
        A reply over a size bound raises :class:`Refused` (the conversation goes on)."""
        if self.dead:
            raise JudgeAbort(self.dead)
        budget = (self.deadline - time.monotonic()) if timeout is None else timeout
        if budget <= 0:
            raise JudgeAbort("timed out")
        try:
            wire.send(self.write_fd, pickle.dumps((budget, message), protocol=4))
        except OSError:
            self._died()
        try:
            document, blobs = self._receive(time.monotonic() + budget + INTERRUPT_GRACE_S)
        except TimeoutError:
            self.close()
            self.dead = "not run: the kernel could not be interrupted after a timeout"
            raise JudgeAbort("timed out; the kernel could not be interrupted, later cells cannot run") from None
        if type(document) is not list or not document or type(document[0]) is not str:
            raise Refused("the kernel sent a malformed reply")
        if document[0] == "timeout":
            raise JudgeAbort("timed out")
        return document, blobs

    def _receive(self, deadline: float) -> Tuple[Any, List[bytes]]:
        def wait() -> None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.read_fd], [], [], remaining)
            if not ready:
                raise TimeoutError

        try:
            payload = wire.receive(self.read_fd, wait)
        except EOFError:
            self._died()
        except wire.OversizeError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None
        try:
            return wire.unpack_reply(payload)
        except wire.WireError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None

    def _died(self) -> Any:
        self.close()
        self.dead = "not run: the kernel died in an earlier cell"
        raise JudgeAbort("the kernel died while running this (a crash, or exit()/os._exit() in the code)")

    def close(self) -> None:
        sandbox.stop(self.process, self.spec)


def run_check(check: CheckCall, session: Session, timeout: float) -> Tuple[bool, str, str]:
    """Run one check against the learner's kernel: (passed, first line, detail)."""
    try:
        function = getattr(importlib.import_module(check.module), check.function)
    except (ImportError, AttributeError) as exc:
        return False, f"the grader cannot load {check.module}.{check.function}: {exc}", ""
    caller = Caller(session)

    def value(arg: Tuple[str, Any]) -> Any:
        kind, item = arg
        if kind == "value":
            return item
        return _global(session, caller, item)

    def probe(fn: Any, *args: Any) -> Any:
        if any(type(a) is Remote for a in args):
            return caller.probe(fn, args)
        return fn(*args)

    session.deadline = time.monotonic() + timeout
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout + 2 * INTERRUPT_GRACE_S + 5)
    output = io.StringIO()
    _common.PROBE_RUNNER = probe
    try:
        with contextlib.redirect_stdout(output):
            args = [value(a) for a in check.args]
            kwargs = {k: value(v) for k, v in check.kwargs}
            function(*args, **kwargs)
    except (JudgeAbort, Refused) as exc:
        return False, _first_line(str(exc)) or type(exc).__name__, ""
    except TaskNotWrittenError as exc:
        return False, str(exc), ""
    except NotImplementedError as exc:  # a check that calls learner code directly
        return False, str(not_written(exc)), ""
    except AssertionError as exc:
        text = str(exc).strip() or "the check failed"
        return False, _first_line(text), text
    except RecursionError:
        return False, "the learner's value is nested too deeply (or contains itself) to be checked", ""
    except Exception as exc:  # noqa: BLE001 - e.g. the learner's name is missing: a failed check
        text = f"{type(exc).__name__}: {exc}"
        return False, _first_line(text), text
    finally:
        _common.PROBE_RUNNER = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return True, "", ""


def _global(session: Session, caller: Caller, name: str) -> Any:
    reply, blobs = session.request(("global", name))
    if reply[0] == "ok" and len(reply) > 1:
        return caller.decode(reply[1], blobs)
    if reply[0] == "raised" and len(reply) > 3:
        raise NameError(str(reply[3])[:300])
    raise Refused("the kernel sent a malformed reply")


def _alarm(signum: int, frame: Any) -> None:
    raise JudgeAbort("timed out (the check itself ran too long)")


# ---------------------------------------------------------------------------------------
# A whole notebook


Emit = Callable[[Dict[str, Any]], None]


def judge(job: Dict[str, Any], emit: Optional[Emit] = None) -> Dict[str, Any]:
    """Run a job: ``cells`` (source, task, role, tags), ``timeout``, sandbox settings, ``exercise`` and
    ``forbidden`` (the modules the kernel sees as stubs). Returns per-cell results; ``emit``, when given,
    hears ``{"cell": i, "limit": s}`` before each cell and ``{"result": entry}`` after it (the grader
    stops a judge whose cell runs past its limit)."""
    mode = job.get("resolved_mode", "none")
    spec = sandbox.SandboxSpec(
        mode=mode, workdir=Path(job["workdir"]), hidden=[Path(p) for p in job.get("hidden", [])],
        cpu_seconds=int(job.get("cpu_seconds", 600)), memory_bytes=int(job.get("memory_bytes", sandbox.DEFAULT_MEMORY_BYTES)),
        exercise=str(job.get("exercise", "")), forbidden=tuple(str(m) for m in job.get("forbidden", ())),
    )
    timeout = float(job["timeout"])
    cells: List[Dict[str, Any]] = job["cells"]
    trusted = [c["source"] for c in cells if c.get("role") != "solution"]
    known = imported_names(trusted)
    results: List[Dict[str, Any]] = []
    tell: Emit = emit or (lambda event: None)
    tell({"cell": -1, "limit": STARTUP_TIMEOUT_S + 60})
    session = Session(spec, mode)
    _preload_checks(cells, known)
    _load_hidden_cases(cells)
    try:
        try:
            session.request(("ping",), timeout=STARTUP_TIMEOUT_S)
        except (JudgeAbort, Refused) as exc:
            return {"results": [], "error": f"the learner's kernel did not start: {exc}", "limits": spec.applied}
        for index, cell in enumerate(cells):
            tell({"cell": index, "limit": timeout + 2 * INTERRUPT_GRACE_S + 10})
            entry = _run_cell(index, cell, session, known, timeout)
            results.append(entry)
            tell({"result": entry})
    finally:
        session.close()
    return {"results": results, "error": "", "limits": spec.applied}


def _run_cell(index: int, cell: Dict[str, Any], session: Session, known: Dict[str, Tuple[str, str]],
              timeout: float) -> Dict[str, Any]:
    tags = cell.get("tags", [])
    entry: Dict[str, Any] = {"index": index, "outcome": "passed", "line": "", "detail": ""}
    if "nbval-skip" in tags:
        entry["outcome"] = "skipped"
    elif cell.get("role") == "check":
        if session.dead:
            entry.update(outcome="failed", line=session.dead)
        else:
            try:
                ok, line, detail = run_check(parse_check_cell(cell["source"], known), session, timeout)
            except CheckCellError as exc:
                ok, line, detail = False, f"the pristine check cell cannot be judged: {exc}", ""
            if not ok:
                entry.update(outcome="failed", line=line, detail=detail)
    elif session.dead:
        entry.update(outcome="failed", line=session.dead)
    else:
        try:
            reply, _ = session.request(("exec", cell["source"]), timeout=timeout)
            if reply[0] != "ok" and "raises-exception" not in tags:
                text = _clean(str(reply[3]))
                entry.update(outcome="failed", line=_first_line(text) or str(reply[2]), detail=text)
        except (JudgeAbort, Refused) as exc:
            line = str(exc)
            if line.startswith("timed out"):
                line = f"timed out: the cell ran longer than {timeout:g} s (an endless loop?)" + (
                    "; the kernel could not be interrupted, later cells cannot run" if session.dead else "")
            entry.update(outcome="failed", line=line)
        except (IndexError, TypeError):
            entry.update(outcome="failed", line="the kernel sent a malformed reply")
    return entry


def _preload_checks(cells: List[Dict[str, Any]], known: Dict[str, Tuple[str, str]]) -> None:
    """Import the check modules in a background thread while the kernel starts and runs the first
    cells (both import torch: done at once, not one after the other)."""
    import threading

    modules = set()
    for cell in cells:
        if cell.get("role") == "check":
            try:
                check = parse_check_cell(cell["source"], known)
            except CheckCellError:
                continue
            modules.add((check.module, check.function))

    def load() -> None:
        for module, function in sorted(modules):
            try:
                getattr(importlib.import_module(module), function)
            except Exception:  # noqa: BLE001 - the check cell reports it when it runs
                pass

    threading.Thread(target=load, name="preload-checks", daemon=True).start()


def _load_hidden_cases(cells: List[Dict[str, Any]]) -> None:
    """Load the hidden-case files the job's hidden check cells import (while the kernel starts); a file
    that does not load fails its cases' cells with the import error."""
    from . import hidden

    for cell in cells:
        if cell.get("hidden") and isinstance(cell.get("module"), str) and isinstance(cell.get("path"), str):
            try:
                hidden.load_module(cell["module"], cell["path"])
            except Exception:  # noqa: BLE001 - reported by the case's cell when it runs
                pass


def _clean(text: str) -> str:
    return "".join(ch for ch in text if ch == "\n" or ch == "\t" or ch.isprintable())[:4000]


def main() -> int:
    """Read a job on stdin; write one JSON line per event on stdout (the only thing written there),
    the last one ``{"done": ...}`` with the whole result."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stdout = open(os.devnull, "w")
    sys.setrecursionlimit(10_000)
    job = json.loads(sys.stdin.read())

    def emit(event: Dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    try:
        result = judge(job, emit)
    except sandbox.SandboxUnavailableError as exc:
        result = {"results": [], "error": str(exc)}
    emit({"done": result})
    return 0


if __name__ == "__main__":
    # Run the module by its own name, not as __main__, so its classes carry their module's name.
    from paged_kv_course.grading import judge as _judge

    sys.exit(_judge.main())
