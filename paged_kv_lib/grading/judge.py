"""The judge: runs a spliced exercise notebook and decides each check outside the learner's kernel.

The learner's kernel (:mod:`.runner`, sandboxed where possible) runs every code cell
except the check cells. For each check cell the judge parses its one call
``check_x(name, ...)``, imports the real check function here, and calls it with proxies
(:class:`Remote`) standing for the learner's globals: a call on a proxy sends its
arguments into the kernel, runs the learner's code there and brings back the result,
the arguments' new state and any exception, as untrusted plain data (:mod:`.wire`). So
the verdict is computed in this process, by the course's own check code and library,
whatever the learner's code does to its own interpreter.

``python -m paged_kv_lib.grading.judge`` reads a job (JSON) on stdin and writes the
result (JSON) on stdout; the grader runs one such process per submission.
"""

from __future__ import annotations

import ast
import builtins
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _common, sandbox, stubs, wire
from ._common import TaskNotWrittenError, not_written

RUNNER = sandbox.RUNNER
INTERRUPT_GRACE_S = 3.0
STARTUP_TIMEOUT_S = 120.0


class JudgeAbort(BaseException):
    """The kernel timed out, died or broke the protocol: the check cannot go on (not an ``Exception``,
    so a check's ``except Exception`` never swallows it)."""


class Refused(BaseException):
    """A reply the judge does not accept (over a bound, not plain data) or a use of a stubbed module:
    the check fails with this one line, and the kernel stays usable (not an ``Exception``, so a
    check's ``except Exception`` never turns it into another message)."""


class CheckCellError(ValueError):
    """A pristine check cell that is not imports plus one call with plain arguments."""


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


# ---------------------------------------------------------------------------------------
# Proxies


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Remote:
            return ("handle", object.__getattribute__(obj, "_key"))
        return None


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=4).dump(value)
    except Exception as exc:  # noqa: BLE001 - a check that passes something unpicklable is a check bug
        raise TypeError(f"the judge cannot send a {type(value).__name__} to the learner's code: {exc}") from exc
    return buffer.getvalue()


_BUILTIN_EXCEPTIONS = {
    name: value for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception)
}


def library_errors() -> Dict[str, type]:
    """The library's error classes by name (those ``paged_kv_lib.errors`` defines)."""
    from .. import errors

    return {name: value for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__}


class Caller:
    """Makes the kernel requests of one check and turns replies into values, errors and argument updates."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def decode(self, data: Any, blobs: List[bytes]) -> Any:
        try:
            return wire.Decoder(lambda key, kind: Remote(self, key, kind), blobs).decode(data)
        except wire.WireError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None

    def request(self, op: str, ref: Any, args: Tuple[Any, ...] = (), kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        message = (op, ref, [_dumps(a) for a in args], {k: _dumps(v) for k, v in kwargs.items()})
        reply, blobs = self.session.request(message)
        error: Optional[BaseException] = None
        try:
            status = reply[0]
            changed = reply[4] if status == "raised" else reply[2]
            for key, state in changed:
                original = args[key] if type(key) is int else kwargs[key]
                restore(original, self.decode(state, blobs))
            if status == "ok":
                return self.decode(reply[1], blobs)
            if status != "raised":
                raise ValueError(f"unknown reply {status!r}")
            error = self.exception(reply)
        except (IndexError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Refused(f"the kernel sent a malformed reply ({type(exc).__name__})") from None
        raise error

    def probe(self, function: Any, args: Tuple[Any, ...]) -> Any:
        """Run a probe of :mod:`.probes` in the kernel, on the learner's objects; its answer, decoded as data."""
        message = ("probe", str(function.__name__), [_dumps(a) for a in args])
        reply, blobs = self.session.request(message)
        if reply[0] == "raised":
            raise self.exception(reply)
        if reply[0] != "ok" or len(reply) < 2:
            raise Refused(f"the probe {function.__name__} sent back a malformed reply")
        return self.decode(reply[1], blobs)  # untrusted data, bounded and class-free like every reply

    def exception(self, reply: List[Any]) -> BaseException:
        """The learner's exception, rebuilt by name: a builtin or a library error, else RuntimeError."""
        module, qualname, message = str(reply[1])[:200], str(reply[2])[:200], str(reply[3])[:4000]
        if qualname == stubs.ERROR_NAME:
            raise Refused(_first_line(message) or message)
        cls: Optional[type] = None
        if module == "builtins":
            cls = _BUILTIN_EXCEPTIONS.get(qualname)
        elif module == "paged_kv_lib" or module.startswith("paged_kv_lib."):
            cls = library_errors().get(qualname)
        if cls is None:
            return RuntimeError(f"{qualname}: {message}")
        created: Any = BaseException.__new__(cls)
        created.args = (message,)
        for pair in (reply[5] if len(reply) > 5 and type(reply[5]) is list else []):
            if type(pair) is list and len(pair) == 2 and type(pair[0]) is str and pair[0].isidentifier() \
                    and not pair[0].startswith("_") and type(pair[1]) in (int, float, bool, str, type(None)):
                setattr(created, pair[0], pair[1])
        return created


def restore(original: Any, new: Any) -> None:
    """Give ``original`` (the check's object) the state ``new`` the learner's call left its copy in."""
    kind = type(original)
    if wire.is_mutable_kind(original) and kind.__name__ == "Tensor":
        if type(new) is kind and new.dtype == original.dtype and new.shape == original.shape:
            original.copy_(new)
        elif type(new) is kind:
            original.data = new
        return
    if kind is list and type(new) is list:
        original[:] = new
    elif kind is dict and type(new) is dict:
        original.clear()
        original.update(new)
    elif kind is set and type(new) is set:
        original.clear()
        original.update(new)
    elif kind.__name__ == "deque" and type(new) is kind:
        original.clear()
        original.extend(new)
    elif kind is type(new) and kind.__module__.startswith("paged_kv_lib"):
        names = set(wire._slot_names(kind)) | set(getattr(original, "__dict__", {}))
        for name in names:
            if hasattr(original, name) and not hasattr(new, name):
                object.__delattr__(original, name)
        for name in set(wire._slot_names(kind)) | set(getattr(new, "__dict__", {})):
            if not hasattr(new, name):
                continue
            value = getattr(new, name)
            old = getattr(original, name, None)
            if old is not None and type(old) is type(value) and (wire.is_mutable_kind(old)):
                restore(old, value)
            else:
                object.__setattr__(original, name, value)


class Remote:
    """A learner's object that stays in the kernel: calls, attribute reads and builtins are forwarded."""

    __slots__ = ("_caller", "_key", "_kind")

    def __init__(self, caller: Caller, key: int, kind: str) -> None:
        object.__setattr__(self, "_caller", caller)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_kind", kind)

    def _ask(self, op: str, *args: Any, **kwargs: Any) -> Any:
        caller = object.__getattribute__(self, "_caller")
        return caller.request(op, ("handle", object.__getattribute__(self, "_key")), args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name, value)

    def _builtin(self, name: str, *args: Any) -> Any:
        return self._ask("builtin", name, *args)

    def __len__(self) -> int:
        value = self._builtin("len")
        if type(value) is not int:
            raise TypeError("len() of the learner's object did not give an int")
        return value

    def __bool__(self) -> bool:
        value = self._builtin("bool")
        if type(value) is not bool:
            raise TypeError("bool() of the learner's object did not give a bool")
        return value

    def __repr__(self) -> str:
        value = self._builtin("repr")
        return value[:2000] if type(value) is str else f"<{object.__getattribute__(self, '_kind')}>"

    def __str__(self) -> str:
        value = self._builtin("str")
        return value[:2000] if type(value) is str else repr(self)

    def __iter__(self) -> Any:
        value = self._builtin("list")
        if type(value) is not list:
            raise TypeError("iterating the learner's object did not give values")
        return iter(value)

    def __contains__(self, item: Any) -> bool:
        return self._builtin("contains", item) is True

    def __getitem__(self, key: Any) -> Any:
        return self._builtin("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._builtin("setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        self._builtin("delitem", key)

    def __eq__(self, other: Any) -> bool:
        # Identity only: an object that stays in the kernel never equals the grader's data, whatever
        # its own __eq__ claims (an "int equal to everything" arrives here as such an object).
        return type(other) is Remote and object.__getattribute__(other, "_key") == object.__getattribute__(self, "_key")

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("remote", object.__getattribute__(self, "_key")))


# ---------------------------------------------------------------------------------------
# Check cells


@dataclass(frozen=True)
class CheckCall:
    """A parsed check cell: the check function's module and name, and its arguments."""

    module: str
    function: str
    args: Tuple[Tuple[str, Any], ...]  # ("name", global) or ("value", literal)
    kwargs: Tuple[Tuple[str, Tuple[str, Any]], ...]


def imported_names(sources: List[str]) -> Dict[str, Tuple[str, str]]:
    """``name -> (module, attribute)`` for every ``from M import a [as b]`` in trusted cells."""
    names: Dict[str, Tuple[str, str]] = {}
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def parse_check_cell(source: str, known: Dict[str, Tuple[str, str]]) -> CheckCall:
    """The one call of a check cell; imports allowed before it. Raises :class:`CheckCellError`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CheckCellError(f"the check cell is not valid Python: {exc}") from None
    known = dict(known)
    known.update(imported_names([source]))
    calls = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    if len(calls) != 1 or not isinstance(calls[0], ast.Expr) or not isinstance(calls[0].value, ast.Call):
        raise CheckCellError("a check cell must be imports plus one call check_x(...)")
    call = calls[0].value
    if not isinstance(call.func, ast.Name) or call.func.id not in known:
        raise CheckCellError("the check cell calls a function that no 'from ... import' names")
    module, function = known[call.func.id]

    def argument(node: ast.AST) -> Tuple[str, Any]:
        if isinstance(node, ast.Name):
            return ("name", node.id)
        try:
            return ("value", ast.literal_eval(node))
        except ValueError:
            raise CheckCellError(f"check argument {ast.unparse(node)!r} is neither a name nor a literal") from None

    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise CheckCellError("check calls take plain arguments")
    return CheckCall(module, function, tuple(argument(a) for a in call.args),
                     tuple((str(k.arg), argument(k.value)) for k in call.keywords))


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


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


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
    # Run the module by its own name, not as __main__, so its classes (Remote above all) carry the module
    # name the checks and the probe recognise them by.
    from paged_kv_lib.grading import judge as _judge

    sys.exit(_judge.main())
