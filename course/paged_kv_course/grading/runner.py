"""The learner's kernel: runs notebook cells and serves the judge's plain-data requests.

The grader starts this program (inside the sandbox) with two pipes. It runs code cells in
an IPython shell, as a notebook kernel would, and answers requests made of plain data
(:mod:`.wire`): look up a global, call something, call a method by name, read or set an
attribute, apply a builtin (``len``, indexing...). Objects that are not data stay here behind
integer handles (one handle per object, so equal handles are one object: how the judge sees
aliasing).
An object the judge serves (an instrument, a spy, the model of 05.3) is a :class:`_Served`
here: using it asks the judge, which does the work and keeps the record.

Nothing here is trusted: the learner's code runs in this process and may change any of it,
so the judge reads every reply as untrusted data and decides itself. Run as a file; it
loads ``wire.py`` from its own folder by path and imports nothing of the grader.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional

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
    sys.path.pop(0)  # this folder's files must not shadow the learner's imports


def _load_wire() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("paged_kv_wire", os.path.join(_here, "wire.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wire = _load_wire()
MAX_TEXT = 4000
BUILTINS: Dict[str, Callable[..., Any]] = {
    "len": len, "repr": repr, "str": str, "bool": bool, "list": list, "id": id,
    "contains": lambda obj, item: item in obj, "getitem": lambda obj, key: obj[key],
    "setitem": lambda obj, key, value: obj.__setitem__(key, value), "delitem": lambda obj, key: obj.__delitem__(key),
    "eq": lambda obj, other: obj == other, "append": lambda obj, item: obj.append(item),
    "pop": lambda obj: obj.pop(),
}
SERVER: Any = None


class _Served:
    """An object the judge serves: every use is a request to the judge, answered with plain data."""

    __slots__ = ("_key",)

    def __init__(self, key: int) -> None:
        object.__setattr__(self, "_key", key)

    def _ask(self, op: str, name: str = "", *args: Any, **kwargs: Any) -> Any:
        return SERVER.callback(op, object.__getattribute__(self, "_key"), name, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("an object the grader lends cannot be changed this way")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", "", *args, **kwargs)

    def __len__(self) -> int:
        return self._ask("builtin", "len")

    def __getitem__(self, key: Any) -> Any:
        return self._ask("builtin", "getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("builtin", "setitem", key, value)

    def __iter__(self) -> Any:
        return iter(self._ask("builtin", "list"))

    def __contains__(self, item: Any) -> bool:
        return self._ask("builtin", "contains", item)

    def __repr__(self) -> str:
        return self._ask("builtin", "repr")

    def __bool__(self) -> bool:
        return self._ask("builtin", "bool")

    def __eq__(self, other: Any) -> bool:
        return self._ask("builtin", "eq", other)

    __hash__ = object.__hash__


class _Server:
    def __init__(self, read_fd: int, write_fd: int) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        self.read_fd, self.write_fd = read_fd, write_fd
        self.handles: Dict[int, Any] = {}
        self.keys: Dict[int, int] = {}
        self.by_value: Dict[int, Any] = {}
        self.shell = InteractiveShell.instance(colors="nocolor")
        self.ns = self.shell.user_ns
        self.fired = False

    # -- values ------------------------------------------------------------------------

    def handle(self, value: Any) -> int:
        key = self.keys.get(id(value))
        if key is None or self.handles.get(key) is not value:
            key = len(self.handles) + 1
            self.handles[key], self.keys[id(value)] = value, key
        return key

    def other(self, encoder: Any, value: Any) -> Any:
        if type(value) is _Served:
            return {"j": object.__getattribute__(value, "_key")}
        if self.by_value.get(id(value)) is value:
            return {"a": encoder.attrs(value)}
        kind = type(value)
        return {"h": [self.handle(value), f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}"[:200]]}

    def send(self, document: Any, encoder: Any = None) -> None:
        wire.send(self.write_fd, document, encoder.blobs if encoder is not None else [])

    def encoder(self) -> Any:
        return wire.Encoder(self.other)

    def decode(self, value: Any, blobs: List[bytes]) -> Any:
        tags = {"h": lambda d, body: self.handles[body[0]], "j": lambda d, body: _Served(int(body)),
                "o": self.rebuild}
        return wire.Decoder(blobs, tags).decode(value)

    def rebuild(self, decoder: Any, body: Any) -> Any:
        """A library object the judge sent by value (the kernel may rebuild classes; the judge never does)."""
        module, qualname, state = body
        if not module.startswith(wire.LIBRARY):
            raise ValueError(f"not a library class: {module}")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        obj = cls.__new__(cls)
        for name, value in state:
            object.__setattr__(obj, name, decoder.decode(value, 1))
        self.by_value[id(obj)] = obj
        return obj

    # -- the conversation --------------------------------------------------------------

    def serve(self) -> None:
        signal.signal(signal.SIGALRM, self._alarm)
        while True:
            try:
                request, blobs = wire.receive(self.read_fd)
            except KeyboardInterrupt:
                continue
            except EOFError:
                return
            self.fired = False
            encoder = self.encoder()
            try:
                signal.setitimer(signal.ITIMER_REAL, max(0.001, float(request.get("budget", 60))))
                try:
                    answer = self.answer(request, blobs, encoder)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                answer = {"raised": ["builtins", "KeyboardInterrupt", "interrupted"]}
            except Exception as exc:  # noqa: BLE001 - the value cannot be sent: the check fails, the kernel lives
                encoder = self.encoder()
                answer = {"raised": ["builtins", "ValueError", f"the value cannot be sent to the grader "
                                                               f"({type(exc).__name__})"]}
            self.send({"timeout": True} if self.fired else answer, encoder)

    def _alarm(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise KeyboardInterrupt

    def callback(self, op: str, key: int, name: str, args: Any, kwargs: Dict[str, Any]) -> Any:
        """Ask the judge to use an object it serves; requests it makes meanwhile are answered here."""
        encoder = self.encoder()
        body = {"op": op, "target": key, "name": name, "args": [encoder.encode(a) for a in args],
                "kwargs": [[k, encoder.encode(v)] for k, v in kwargs.items()]}
        self.send({"callback": body}, encoder)
        while True:
            message, blobs = wire.receive(self.read_fd)
            if message.get("op") == "answer":
                if "raised" in message:  # the judge's error, by name: a builtin or a library error
                    name, text = message["raised"]
                    cls = getattr(__import__("builtins"), name, None)
                    if not (isinstance(cls, type) and issubclass(cls, Exception)):
                        cls = getattr(importlib.import_module("paged_kv_lib.errors"), name, None)
                    if not (isinstance(cls, type) and issubclass(cls, Exception)):
                        cls = RuntimeError
                    error = cls.__new__(cls)
                    error.args = (text,)
                    raise error
                return self.decode(message["ok"], blobs)
            inner = self.encoder()
            self.send(self.answer(message, blobs, inner), inner)

    def answer(self, request: Dict[str, Any], blobs: List[bytes], encoder: Any) -> Dict[str, Any]:
        op = request["op"]
        if op == "ping":
            return {"ok": "pong"}
        if op == "exec":
            return self.exec_cell(request["name"])
        if op == "global":
            name = request["name"]
            if name not in self.ns:
                return {"raised": ["builtins", "NameError", f"name {name!r} is not defined (run the cell that "
                                                             "defines it)"]}
            return {"ok": encoder.encode(self.ns[name])}
        if op == "course":  # a course launcher (09's Triton drivers), run where the learner's kernel is
            from paged_kv_course import triton_skeleton

            target: Any = getattr(triton_skeleton, request["name"])
        else:
            target = self.handles[int(request["target"])]
        args = [self.decode(a, blobs) for a in request.get("args", [])]
        kwargs = {k: self.decode(v, blobs) for k, v in request.get("kwargs", [])}
        watched = [(i, v) for i, v in enumerate(args)] + list(kwargs.items())
        before = {key: self.state(v) for key, v in watched}
        try:
            if op == "getattr":
                value = getattr(target, request["name"])
            elif op == "setattr":
                setattr(target, request["name"], args[0])
                value = None
            elif op == "builtin":
                value = BUILTINS[request["name"]](target, *args)
            elif op == "method":
                value = getattr(target, request["name"])(*args, **kwargs)
            else:
                value = target(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - every learner error goes back as data
            return {"raised": [str(type(exc).__module__)[:200], str(type(exc).__qualname__)[:200], _text(exc)],
                    "changed": self.changed(watched, before, encoder)}
        out = {"h": [self.handle(value), type(value).__name__[:200]]} if request.get("keep") else encoder.encode(value)
        return {"ok": out, "changed": self.changed(watched, before, encoder)}

    def state(self, value: Any) -> Optional[str]:
        """What a call could change in place (mutable data, a library object sent by value), as text."""
        kind = type(value)
        if kind.__name__ not in ("list", "dict", "set", "deque", "bytearray", "Tensor", "OrderedDict") \
                and self.by_value.get(id(value)) is not value:
            return None
        encoder = self.encoder()
        try:
            return repr(encoder.encode(value)) + repr(encoder.blobs)
        except Exception:  # noqa: BLE001
            return None

    def changed(self, watched: List[Any], before: Dict[Any, Optional[str]], encoder: Any) -> List[Any]:
        return [[key, encoder.encode(value)] for key, value in watched
                if before[key] is not None and self.state(value) != before[key]]

    def exec_cell(self, source: str) -> Dict[str, Any]:
        result = self.shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            return {"ok": None}
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        return {"raised": [str(type(error).__module__)[:200], str(type(error).__qualname__)[:200], text[:MAX_TEXT]]}


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_TEXT]
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__} whose message cannot be shown>"


def main() -> None:
    """Take the two pipes off stdin and stdout, point the standard streams at /dev/null, serve."""
    global SERVER
    read_fd, write_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.setrecursionlimit(10_000)
    SERVER = _Server(read_fd, write_fd)
    SERVER.serve()


if __name__ == "__main__":
    main()
