"""The judge's wire format: length-prefixed messages, and values the learner's kernel may send back.

Messages to the kernel are ordinary pickles (the grader is trusted). Messages *from*
the kernel are untrusted: they are pickles that may hold only built-in data (``None``,
bool, int, float, str, bytes, list, tuple, dict, set, frozenset) and are read by an
unpickler that refuses every global, so no class of the kernel's choosing is ever
built. Tensors, paged_kv_lib objects and opaque learner objects travel inside that
plain data as tagged tuples (see :func:`encode` on the kernel side and :func:`decode`
here), which the grader rebuilds itself with exact types: an ``int`` subclass cannot
arrive as an ``int``.

This module imports neither torch nor IPython at import time.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import struct
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

TAG = "__paged_kv_wire__"
HEADER = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
MAX_NODES = 5_000_000
_PLAIN = (type(None), bool, int, float, str, bytes)
_MUTABLE_KINDS = ("list", "dict", "set", "deque", "bytearray", "Tensor")


class WireError(RuntimeError):
    """A message that is malformed, too large, or holds something the grader does not accept."""


# ---------------------------------------------------------------------------------------
# Framing


def send(fd: int, payload: bytes) -> None:
    """Write one length-prefixed message to a file descriptor."""
    data = HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_exact(fd: int, size: int, wait: Callable[[], None] = lambda: None) -> bytes:
    """Read exactly ``size`` bytes; ``wait`` is called before each read (it may raise on a deadline)."""
    chunks: List[bytes] = []
    remaining = size
    while remaining:
        wait()
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, wait: Callable[[], None] = lambda: None) -> bytes:
    """Read one length-prefixed message (at most :data:`MAX_MESSAGE_BYTES`)."""
    (size,) = HEADER.unpack(read_exact(fd, HEADER.size, wait))
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"a message of {size} bytes is over the limit of {MAX_MESSAGE_BYTES}")
    return read_exact(fd, size, wait)


# ---------------------------------------------------------------------------------------
# Untrusted data: the no-globals unpickler


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise WireError(f"the kernel sent a reference to {module}.{name}; only plain data is accepted")

    def persistent_load(self, pid: Any) -> Any:
        raise WireError("the kernel sent a persistent reference; only plain data is accepted")


def loads_plain(payload: bytes) -> Any:
    """Unpickle bytes that may contain only built-in data (no class, no function is ever looked up)."""
    try:
        return _PlainUnpickler(io.BytesIO(payload)).load()
    except WireError:
        raise
    except (Exception, RecursionError) as exc:  # noqa: BLE001 - any malformed input is the same failure
        raise WireError(f"the kernel sent a message the grader cannot read ({type(exc).__name__})") from None


# ---------------------------------------------------------------------------------------
# Kernel side: values to plain data


class Encoder:
    """Turns the learner's values into plain data; whatever is not data becomes a handle.

    ``handles`` keeps the objects behind handles alive so that later calls can name them.
    """

    def __init__(self, handles: Dict[int, Any]) -> None:
        self.handles = handles

    def handle(self, value: Any) -> tuple:
        key = len(self.handles) + 1
        self.handles[key] = value
        kind = type(value)
        return (TAG, "handle", key, f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}")

    def encode(self, value: Any, _active: Optional[set] = None) -> Any:
        active = set() if _active is None else _active
        kind = type(value)
        if kind in _PLAIN:
            return value
        if id(value) in active:
            return self.handle(value)  # a cycle: the rest stays in the kernel
        active.add(id(value))
        try:
            return self._encode(value, kind, active)
        finally:
            active.discard(id(value))

    def _encode(self, value: Any, kind: type, active: set) -> Any:
        if kind in (list, tuple, set, frozenset):
            items = [self.encode(v, active) for v in value]
            if kind is tuple:
                return (TAG, "tuple", items) if items and items[0] == TAG else tuple(items)
            return items if kind is list else (TAG, kind.__name__, items)
        if kind is dict:
            return (TAG, "dict", [(self.encode(k, active), self.encode(v, active)) for k, v in value.items()])
        module = getattr(kind, "__module__", "") or ""
        if kind.__name__ in ("deque", "OrderedDict", "defaultdict") and module == "collections":
            if kind.__name__ == "deque":
                return (TAG, "deque", [self.encode(v, active) for v in value], value.maxlen)
            return (TAG, "dict", [(self.encode(k, active), self.encode(v, active)) for k, v in value.items()])
        if module == "torch" and kind.__name__ == "Tensor":
            return self._tensor(value)
        if module == "torch" and kind.__name__ == "dtype":
            return (TAG, "dtype", str(value).replace("torch.", ""))
        if module == "torch" and kind.__name__ == "Size":
            return (TAG, "size", [int(v) for v in value])
        if module.startswith("paged_kv_lib.") and not isinstance(value, BaseException) and not _is_module(value):
            return self._object(value, kind, active)
        return self.handle(value)

    def _tensor(self, value: Any) -> tuple:
        torch = sys.modules["torch"]
        t = value.detach().to("cpu").contiguous()
        if t.is_complex() or t.is_quantized or t.is_sparse:
            return self.handle(value)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return (TAG, "tensor", str(t.dtype).replace("torch.", ""), [int(s) for s in t.shape], raw)

    def _object(self, value: Any, kind: type, active: set) -> Any:
        import enum

        if isinstance(value, enum.Enum):
            return (TAG, "enum", kind.__module__, kind.__qualname__, value.name)
        state: List[Tuple[str, Any]] = []
        for name in _slot_names(kind):
            if hasattr(value, name):
                state.append((name, self.encode(getattr(value, name), active)))
        for name, item in getattr(value, "__dict__", {}).items():
            state.append((name, self.encode(item, active)))
        return (TAG, "obj", kind.__module__, kind.__qualname__, state)


def _is_module(value: Any) -> bool:
    return any(c.__module__ == "torch.nn.modules.module" and c.__name__ == "Module" for c in type(value).__mro__)


def _slot_names(kind: type) -> List[str]:
    names: List[str] = []
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in ([slots] if isinstance(slots, str) else slots):
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


# ---------------------------------------------------------------------------------------
# Grader side: plain data back to values, with exact types


class Opaque:
    """An object that stays in the kernel; the judge's proxy for it is made by ``make_handle``."""


def library_class(module: str, qualname: str) -> type:
    """A class of paged_kv_lib named by the kernel, or :class:`WireError` (nothing else is ever looked up)."""
    if not (module == "paged_kv_lib" or module.startswith("paged_kv_lib.")):
        raise WireError(f"{module}.{qualname} is not a paged_kv_lib class")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001
        raise WireError(f"no class {module}.{qualname}") from None
    if not isinstance(found, type):
        raise WireError(f"{module}.{qualname} is not a class")
    return found


class Decoder:
    """Rebuilds plain data from the kernel into values; ``make_handle(key, type_name)`` makes proxies."""

    def __init__(self, make_handle: Callable[[int, str], Any]) -> None:
        self.make_handle = make_handle
        self.nodes = 0

    def decode(self, data: Any) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise WireError(f"the kernel sent more than {MAX_NODES} values in one reply")
        kind = type(data)
        if kind in _PLAIN:
            return data
        if kind is list:
            return [self.decode(v) for v in data]
        if kind is tuple:
            if len(data) >= 2 and data[0] == TAG and type(data[1]) is str:
                return self._tagged(data)
            return tuple(self.decode(v) for v in data)
        raise WireError(f"the kernel sent a {kind.__name__} outside the wire format")

    def _tagged(self, data: tuple) -> Any:
        what = data[1]
        try:
            if what == "tuple":
                return tuple(self.decode(v) for v in _list(data[2]))
            if what in ("set", "frozenset"):
                items = [self.decode(v) for v in _list(data[2])]
                return set(items) if what == "set" else frozenset(items)
            if what == "dict":
                return {self.decode(k): self.decode(v) for k, v in _list(data[2])}
            if what == "deque":
                from collections import deque

                maxlen = data[3]
                if maxlen is not None and type(maxlen) is not int:
                    raise WireError("bad deque")
                return deque((self.decode(v) for v in _list(data[2])), maxlen)
            if what == "tensor":
                return _tensor(data)
            if what == "dtype":
                return _dtype(data[2])
            if what == "size":
                torch = importlib.import_module("torch")
                return torch.Size([_int(v) for v in _list(data[2])])
            if what == "handle":
                return self.make_handle(_int(data[2]), str(data[3])[:200])
            if what == "enum":
                import enum

                members: Any = library_class(_str(data[2]), _str(data[3]))
                if not issubclass(members, enum.Enum):
                    raise WireError("not an enum")
                return members[_str(data[4])]
            if what == "obj":
                return self._object(data)
        except WireError:
            raise
        except (Exception, RecursionError) as exc:  # noqa: BLE001
            raise WireError(f"the kernel sent a malformed {what!r} value ({type(exc).__name__}: {exc})") from None
        raise WireError(f"unknown wire tag {what!r}")

    def _object(self, data: tuple) -> Any:
        cls = library_class(_str(data[2]), _str(data[3]))
        if issubclass(cls, BaseException):
            raise WireError("exceptions do not travel as values")
        obj = cls.__new__(cls)
        for name, value in _list(data[4]):
            object.__setattr__(obj, _str(name), self.decode(value))
        return obj


def _list(value: Any) -> list:
    if type(value) is not list:
        raise WireError("expected a list in the wire format")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise WireError("expected an int in the wire format")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise WireError("expected a str in the wire format")
    return value


def _dtype(name: Any) -> Any:
    torch = importlib.import_module("torch")
    dtype = getattr(torch, _str(name), None)
    if type(dtype) is not torch.dtype:
        raise WireError(f"unknown dtype {name!r}")
    return dtype


def _tensor(data: tuple) -> Any:
    torch = importlib.import_module("torch")
    dtype = _dtype(data[2])
    shape = [_int(v) for v in _list(data[3])]
    raw = data[4]
    if type(raw) is not bytes or any(s < 0 for s in shape):
        raise WireError("malformed tensor")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise WireError(f"a tensor of shape {shape} and dtype {dtype} needs {numel * itemsize} bytes, got {len(raw)}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()


def is_mutable_kind(value: Any) -> bool:
    """Whether a call may change this argument in place (so the kernel reports its state afterwards)."""
    kind = type(value)
    return kind.__name__ in _MUTABLE_KINDS or (getattr(kind, "__module__", "") or "").startswith("paged_kv_lib")
