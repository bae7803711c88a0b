"""The judge: runs a spliced exercise notebook and decides each check outside the learner's kernel.

The learner's kernel (:mod:`.runner`, in the sandbox) runs every code cell except the check
cells. For each check cell the judge parses its one call ``check_x(name, ...)``, imports the
real check function here and calls it with :class:`.remote.Remote` handles for the learner's
globals, so the verdict is computed in this process by the course's own code, on plain data
(:mod:`.wire`), whatever the learner's code does to its own interpreter. The whole submission
shares one deadline (``timeout``): a cell or check that runs past it fails with one line, and
later cells are not run.

``python -m paged_kv_course.grading.judge`` reads a job (JSON) on stdin and writes events
(JSON lines) on stdout; :mod:`.judge_process` runs one such process per submission.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _common_repair, probes, sandbox, wire
from ._common import TaskNotWrittenError, not_written
from .check_cells import CheckCall, CheckCellError, imported_names, parse_check_cell
from .judge_process import JUDGE_GRACE_S, kernel_cpu_seconds
from .remote import Caller, CellError, JudgeAbort, Refused, Remote, _first_line

INTERRUPT_GRACE_S = 3.0


class Session:
    """The learner's kernel process, one deadline for the whole submission, and the framed conversation."""

    def __init__(self, spec: sandbox.SandboxSpec, deadline: float) -> None:
        self.spec = spec
        self.process = sandbox.start_kernel(spec)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.write_fd, self.read_fd = self.process.stdin.fileno(), self.process.stdout.fileno()
        self.deadline = deadline
        self.dead = ""

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def send(self, document: Dict[str, Any], blobs: List[bytes]) -> None:
        if self.dead:
            raise JudgeAbort(self.dead)
        if self.left() <= 0:
            raise JudgeAbort("timed out")
        document.setdefault("budget", self.left())
        try:
            wire.send(self.write_fd, document, blobs)
        except OSError:
            self._died()

    def receive(self) -> Tuple[Dict[str, Any], List[bytes]]:
        """The kernel's next message, bounded, checked against the schema; the kernel is killed when it
        does not answer within a grace period after the deadline."""
        limit = self.deadline + INTERRUPT_GRACE_S

        def wait() -> None:
            remaining = limit - time.monotonic()
            if remaining <= 0 or not select.select([self.read_fd], [], [], remaining)[0]:
                raise TimeoutError

        try:
            document, blobs = wire.receive(self.read_fd, wait)
            wire.check_reply(document)
            return document, blobs
        except TimeoutError:
            self.close()
            self.dead = "not run: the submission's time ran out"
            raise JudgeAbort("timed out") from None
        except EOFError:
            self._died()
        except wire.WireError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None
        raise AssertionError("unreachable")

    def _died(self) -> None:
        self.close()
        self.dead = "not run: the kernel died in an earlier cell"
        raise JudgeAbort("the kernel died while running this (a crash, or exit()/os._exit() in the code)")

    def close(self) -> None:
        sandbox.stop(self.process, self.spec)


def run_check(check: CheckCall, session: Session) -> Tuple[bool, str, str]:
    """Run one check against the learner's kernel: (passed, first line, detail)."""
    try:
        function = getattr(importlib.import_module(check.module), check.function)
    except (ImportError, AttributeError) as exc:
        return False, f"the grader cannot load {check.module}.{check.function}: {exc}", ""
    caller = Caller(session)
    caller.names = {}  # type: ignore[attr-defined]

    def value(arg: Tuple[str, Any]) -> Any:
        kind, item = arg
        if kind == "value":
            return item
        found = caller.request("global", None, item)
        if type(found) is Remote:
            caller.names[object.__getattribute__(found, "_key")] = item  # type: ignore[attr-defined]
        return found

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, session.left()) + 2 * INTERRUPT_GRACE_S)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args = [value(a) for a in check.args]
            kwargs = {k: value(v) for k, v in check.kwargs}
            function(*args, **kwargs)
    except (JudgeAbort, Refused) as exc:
        return False, _first_line(str(exc)) or type(exc).__name__, ""
    except TaskNotWrittenError as exc:
        return False, str(exc), ""
    except NotImplementedError as exc:
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
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return True, "", ""


def _alarm(signum: int, frame: Any) -> None:
    raise JudgeAbort("timed out")


def jit_names(sources: List[str]) -> set:
    """Functions the solution cells define under a ``@triton.jit`` (or ``@jit``) decorator: the source
    text decides "is this a Triton kernel", never code in the learner's kernel."""
    names = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "jit")
                    for d in node.decorator_list):
                names.add(node.name)
    return names


Emit = Callable[[Dict[str, Any]], None]


def judge(job: Dict[str, Any], emit: Optional[Emit] = None) -> Dict[str, Any]:
    """Run a job: ``cells`` (source, task, role, tags), ``timeout`` (seconds for the whole submission)
    and the sandbox settings. Returns per-cell results; ``emit`` hears ``{"cell": i}`` before each cell
    and ``{"result": entry}`` after it."""
    timeout = float(job["timeout"])
    spec = sandbox.SandboxSpec(
        mode=job.get("mode", "bwrap"), workdir=Path(job["workdir"]), hidden=[Path(p) for p in job.get("hidden", [])],
        cpu_seconds=kernel_cpu_seconds(timeout, float(job.get("grace", JUDGE_GRACE_S))),
        memory_bytes=int(job.get("memory_bytes", sandbox.DEFAULT_MEMORY_BYTES)))
    cells: List[Dict[str, Any]] = job["cells"]
    known = imported_names([c["source"] for c in cells if c.get("role") != "solution"])
    probes.JIT_NAMES = jit_names([c["source"] for c in cells if c.get("role") == "solution"])
    tell: Emit = emit or (lambda event: None)
    tell({"cell": -1})
    session = Session(spec, time.monotonic() + timeout)
    _load_hidden_cases(cells)
    results: List[Dict[str, Any]] = []
    try:
        try:
            Caller(session).request("ping")
        except (JudgeAbort, Refused) as exc:
            why = "the submission's time ran out" if "timed out" in str(exc) else str(exc)
            return {"results": [], "error": f"the learner's kernel did not start: {why}", "limits": spec.applied}
        for index, cell in enumerate(cells):
            tell({"cell": index})
            # A check that reads the solution's text (a repair's line count) reads its own task's cell.
            _common_repair.SOURCE_OF = "\n\n".join(str(c["source"]) for c in cells
                                                     if c.get("role") == "solution" and c.get("task") == cell.get("task"))
            entry = _run_cell(index, cell, session, known, timeout)
            # learner text reaches reports, gradebooks and Gradescope from here: no control characters
            entry["line"], entry["detail"] = wire.escape(entry["line"]), wire.escape(entry["detail"], limit=20000)
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
        return entry
    if session.dead or session.left() <= 0:
        entry.update(outcome="failed", line=session.dead or "not run: the submission's time ran out")
        return entry
    if cell.get("role") == "check":
        try:
            ok, line, detail = run_check(parse_check_cell(cell["source"], known), session)
        except CheckCellError as exc:
            ok, line, detail = False, f"the pristine check cell cannot be judged: {exc}", ""
        if line.startswith("timed out"):
            line = f"timed out: the submission ran past its limit of {timeout:g} s (in this check)"
        if not ok:
            entry.update(outcome="failed", line=line, detail=detail)
        return entry
    try:
        Caller(session).request("exec", None, cell["source"])
    except (JudgeAbort, Refused) as exc:
        line = str(exc)
        if line.startswith("timed out"):
            line = f"timed out: the submission ran past its limit of {timeout:g} s (in this cell: an endless loop?)"
        entry.update(outcome="failed", line=line)
    except CellError as exc:  # the cell's own error, as the kernel reported it
        if "raises-exception" not in tags:
            kind, text = exc.raised[1], wire.escape(exc.raised[2])
            if kind in ("SyntaxError", "IndentationError", "TabError"):
                lines = [line.strip() for line in text.splitlines() if line.strip()]
                last = lines[-1] if lines else ""
                where = _first_line(text)
                text = ("a syntax error: " + (last if last.startswith(kind) else f"{kind}: {last}")
                        + (f" ({where})" if where != last else ""))
            entry.update(outcome="failed", line=_first_line(text) or wire.escape(kind), detail=text)
    return entry


def _load_hidden_cases(cells: List[Dict[str, Any]]) -> None:
    """Load the hidden-case files the job's hidden check cells import; one that does not load fails its cells."""
    from . import hidden

    for cell in cells:
        if cell.get("hidden") and isinstance(cell.get("module"), str) and isinstance(cell.get("path"), str):
            try:
                hidden.load_module(cell["module"], cell["path"])
            except Exception:  # noqa: BLE001 - reported by the case's cell when it runs
                pass


def main() -> int:
    """Read a job on stdin; write one JSON line per event on stdout, the last ``{"done": ...}``."""
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
    from paged_kv_course.grading import judge as _judge  # by its own name, not as __main__

    sys.exit(_judge.main())
