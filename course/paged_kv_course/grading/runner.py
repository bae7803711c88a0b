"""The learner's side of the judge: runs notebook cells and serves calls on the learner's objects.

The grader starts this program (inside the sandbox when there is one) with two pipes.
It runs code cells in an IPython shell, as a notebook kernel would, and answers
requests: look up a global, call something, read or set an attribute, apply a builtin
(``len``, ``repr``, indexing...), run a probe (:mod:`.probes`) on the learner's objects.
Replies are plain data (JSON and byte blobs, see :mod:`.wire`); objects that are not data
stay here behind numbered handles.

Nothing here is trusted: the learner's code runs in this process and may change any of
it. The grader therefore treats every reply as untrusted data and computes the verdict
itself.

Run as a file (``python runner.py``), not as ``-m``: it loads ``wire.py``, ``stubs.py`` and
``probes.py`` from its own folder by path, so the grading package and its checks are
never imported here (in the sandbox they are stubs).
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import traceback
from typing import Any, Callable, Dict, List, Tuple

_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE = 4


def _drop_root() -> None:
    """Started as root in the sandbox (a root grader): become the kernel's own unprivileged uid, enter a
    user namespace that maps it to 65534 there, and start again (so no capability is left in any namespace)."""
    wanted = os.environ.pop("PAGED_KV_KERNEL_UID", "")
    if not wanted or os.getuid() != 0:
        return
    import ctypes

    uid = int(wanted)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # a uid change made /proc/self root's; the maps below need it ours
    if libc.unshare(_CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "the kernel cannot enter a user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"65534 {uid} 1"), ("gid_map", f"65534 {uid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    os.execv(sys.executable, [sys.executable, "-s", os.path.abspath(__file__)])


_drop_root()
_here = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _here:
    sys.path.pop(0)  # this folder's modules must not shadow the learner's imports


def _load(name: str) -> Any:
    """A module of this folder, loaded by path (the grading package itself is not importable here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"paged_kv_grading_{name}", os.path.join(_here, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


wire = _load("wire")
stubs = _load("stubs")
probes = _load("probes")

MAX_TEXT = 4000


class _Server:
    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.handles: Dict[int, Any] = {}
        self.encoder = wire.Encoder(self.handles)
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance(colors="nocolor")
        self.ns = self.shell.user_ns
        self.fired = False

    # -- replies -----------------------------------------------------------------------

    def reply(self, message: Any) -> None:
        try:
            payload = self.encoder.reply(message)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            payload = self.encoder.reply(["raised", "builtins", "ValueError",
                                          f"the value cannot be sent to the grader ({type(exc).__name__})", []])
        wire.send(self.write_fd, payload)

    def encoded(self, value: Any) -> Any:
        return self.encoder.encode(value)

    # -- requests ----------------------------------------------------------------------

    def serve(self) -> None:
        signal.signal(signal.SIGALRM, self._alarm)
        while True:
            try:
                budget, request = pickle.loads(wire.receive(self.read_fd))
            except KeyboardInterrupt:
                continue  # an interrupt that arrived after its request ended
            except EOFError:
                return
            self.fired = False
            try:
                signal.setitimer(signal.ITIMER_REAL, max(0.001, budget))
                try:
                    answer = self.handle(request)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                answer = ["raised", "builtins", "KeyboardInterrupt", "interrupted", []]
            except RecursionError:
                answer = ["raised", "builtins", "RecursionError", "the value is nested too deeply to send", []]
            except Exception as exc:  # noqa: BLE001 - e.g. an argument that cannot be rebuilt here: the check fails, the kernel lives
                answer = ["raised", type(exc).__module__, type(exc).__qualname__, _text(exc), []]
            if self.fired:
                answer = ["timeout"]
            self.reply(answer)

    def _alarm(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise KeyboardInterrupt

    def handle(self, request: Tuple[Any, ...]) -> Any:
        op = request[0]
        if op == "exec":
            return self.exec_cell(request[1])
        if op == "global":
            name = request[1]
            if name not in self.ns:
                return ["raised", "builtins", "NameError",
                        f"name {name!r} is not defined (run the cell that defines it)", []]
            return ["ok", self.encoded(self.ns[name]), []]
        if op == "ping":
            return ["ok", "pong", []]
        if op == "probe":
            return self.probe(request[1], request[2])
        return self.call(request)

    def probe(self, name: str, arg_blobs: List[bytes]) -> Any:
        """Run a function of probes.py on the learner's objects here; its answer goes back as data."""
        function = getattr(probes, name, None)
        if name.startswith("_") or getattr(function, "__module__", None) != probes.__name__ or not callable(function):
            return ["raised", "builtins", "LookupError", f"no probe named {name!r}", []]
        try:
            value = function(*[self.load(b) for b in arg_blobs])
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the learner's object raised inside the probe
            return ["raised", type(exc).__module__, type(exc).__qualname__, _text(exc), [], self.exc_state(exc)]
        return ["ok", self.encoded(value), []]  # data, as a call's result is (tensors included)

    def exec_cell(self, source: str) -> Any:
        result = self.shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            return ["ok", None, []]
        if type(error).__name__ == stubs.ERROR_NAME:
            text = _text(error)
        else:
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
        return ["raised", type(error).__module__, type(error).__qualname__, text[:MAX_TEXT], []]

    def resolve(self, ref: Any) -> Any:
        if ref[0] == "handle":
            return self.handles[ref[1]]
        raise KeyError(ref)

    def call(self, request: Tuple[Any, ...]) -> Any:
        op, ref, arg_blobs, kwarg_blobs = request[0], request[1], request[2], request[3]
        target = self.resolve(ref)
        args = [self.load(b) for b in arg_blobs]
        kwargs = {k: self.load(b) for k, b in kwarg_blobs.items()}
        try:
            if op == "call":
                value = target(*args, **kwargs)
            elif op == "getattr":
                value = getattr(target, args[0])
            elif op == "setattr":
                setattr(target, args[0], args[1])
                value = None
            elif op == "builtin":
                value = _BUILTINS[args[0]](target, *args[1:])
            else:
                raise ValueError(f"unknown request {op!r}")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - every learner error goes back as data
            return ["raised", type(exc).__module__, type(exc).__qualname__, _text(exc),
                    self.changed(arg_blobs, args, kwarg_blobs, kwargs), self.exc_state(exc)]
        return ["ok", self.encoded(value), self.changed(arg_blobs, args, kwarg_blobs, kwargs)]

    def load(self, blob: bytes) -> Any:
        return _Loader(io.BytesIO(blob), self.handles).load()

    def changed(self, arg_blobs: List[bytes], args: List[Any], kwarg_blobs: Dict[str, bytes], kwargs: Dict[str, Any]) -> List[Any]:
        """Arguments whose state differs after the call, as (position or name, new state)."""
        out = []
        for key, blob, value in [(i, arg_blobs[i], args[i]) for i in range(len(args))] + [
            (k, kwarg_blobs[k], kwargs[k]) for k in kwargs
        ]:
            if not wire.is_mutable_kind(value):
                continue
            try:
                now = _Dumper.dumps(value, self.handles)
            except Exception:  # noqa: BLE001
                now = None
            if now != blob:
                out.append([key, self.encoded(value)])
        return out

    def exc_state(self, exc: BaseException) -> List[Any]:
        return [[k, v] for k, v in getattr(exc, "__dict__", {}).items()
                if type(k) is str and (type(v) in (int, float, bool, type(None)) or (type(v) is str and len(v) < MAX_TEXT))]


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_TEXT]
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__} whose message cannot be shown>"


_BUILTINS: Dict[str, Callable[..., Any]] = {
    "len": len, "repr": repr, "str": str, "bool": bool, "list": list,
    "contains": lambda obj, item: item in obj,
    "getitem": lambda obj, key: obj[key],
    "setitem": lambda obj, key, value: obj.__setitem__(key, value),
    "delitem": lambda obj, key: obj.__delitem__(key),
    "eq": lambda obj, other: obj == other,
}


class _Loader(pickle.Unpickler):
    """Arguments from the grader; proxies of kernel objects come back as the objects themselves."""

    def __init__(self, file: Any, handles: Dict[int, Any]) -> None:
        super().__init__(file)
        self.handles = handles

    def persistent_load(self, pid: Any) -> Any:
        return self.handles[pid[1]]


class _Dumper(pickle.Pickler):
    """Pickles an argument the way the grader did, so a changed state shows as changed bytes."""

    def __init__(self, file: Any, handles: Dict[int, Any]) -> None:
        super().__init__(file, protocol=4)
        self.ids = {id(v): k for k, v in handles.items()}

    def persistent_id(self, obj: Any) -> Any:
        key = self.ids.get(id(obj))
        return None if key is None else ("handle", key)

    @classmethod
    def dumps(cls, value: Any, handles: Dict[int, Any]) -> bytes:
        buffer = io.BytesIO()
        cls(buffer, handles).dump(value)
        return buffer.getvalue()


def main() -> None:
    """Take the two pipes off stdin and stdout, point the standard streams at /dev/null, serve.

    ``PAGED_KV_FORBIDDEN`` (module names, comma-separated) and ``PAGED_KV_EXERCISE`` install the
    stub import hook (``--sandbox none``; in the sandbox the library copy holds the stubs)."""
    forbidden = [m for m in os.environ.pop("PAGED_KV_FORBIDDEN", "").split(",") if m]
    stubs.install_hook(forbidden, os.environ.pop("PAGED_KV_EXERCISE", "??"))
    read_fd = os.dup(0)
    write_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.setrecursionlimit(10_000)
    _Server(read_fd, write_fd).serve()


if __name__ == "__main__":
    main()
