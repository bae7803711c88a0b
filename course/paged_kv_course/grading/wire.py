"""The judge's wire format: length-prefixed messages, and the plain data the learner's kernel sends back.

Messages to the kernel are pickles of the judge's own values (the judge writes pickles,
it never reads one). Messages *from* the kernel are untrusted and are data only: a JSON
document (which cannot name a class) followed by raw byte blobs. Its size is checked
before anything is decoded: bytes per reply, bytes of JSON, an upper bound on its values
(counted from its separators), its depth, and the hashes in every set or dict key (so
colliding keys cannot make decoding quadratic); a reply over a bound is a
:class:`WireError` with one line.

Inside the JSON a value is a JSON scalar, a list, or an object with one key naming its
kind: ``t`` tuple, ``s``/``fs`` set, ``d`` dict (a list of pairs), ``q`` deque, ``b`` bytes
(a blob), ``T`` tensor (dtype, shape, blob; read with ``torch.frombuffer``), ``dt`` dtype,
``z`` torch.Size, ``h`` a handle (an object that stays in the kernel), ``r`` the same
container as an earlier one in this reply (aliasing survives; the copy counts in full
against the value bound), ``e`` an enum member and ``o`` a plain paged_kv_lib object
(only a class defined, under that name, in a library module outside the grading
package or in a check module ``checks_NN``, with no ``__del__``; its attributes are data
again). Exceptions travel as a
type name and a message (see :mod:`.judge`).

This module imports neither torch nor IPython at import time.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

HEADER = struct.Struct("!Q")
JSON_HEADER = struct.Struct("!I")
# A reply's bounds. Tensors travel as blobs, so a reply may be large; its JSON part may not.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_NODES = 250_000
MAX_DEPTH = 200
MAX_BLOBS = 100_000
MAX_COLLISIONS = 64
MAX_STR = 1_000_000
_PLAIN = (type(None), bool, int, float, str)
_MUTABLE_KINDS = ("list", "dict", "set", "deque", "bytearray", "Tensor")
_TAGS = ("t", "s", "fs", "d", "q", "b", "T", "dt", "z", "h", "r", "e", "o")


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


class OversizeError(WireError):
    """A message over :data:`MAX_MESSAGE_BYTES`; it was read and dropped, so the conversation goes on."""


def receive(fd: int, wait: Callable[[], None] = lambda: None, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """Read one length-prefixed message; one over ``limit`` is skipped in 1 MiB pieces and refused."""
    (size,) = HEADER.unpack(read_exact(fd, HEADER.size, wait))
    if size > limit:
        remaining = size
        while remaining:
            step = min(remaining, 1 << 20)
            read_exact(fd, step, wait)
            remaining -= step
        raise OversizeError(f"a reply of {size} bytes is over the limit of {limit} bytes")
    return read_exact(fd, size, wait)


def pack_reply(document: Any, blobs: List[bytes]) -> bytes:
    """The kernel's reply: a JSON header naming the blob sizes, then the blobs."""
    head = json.dumps({"v": document, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    return JSON_HEADER.pack(len(head)) + head + b"".join(blobs)


class Blobs(List[bytes]):
    """A reply's blobs, and whether its data may hold back references (``{"r": n}``)."""

    references = True


def unpack_reply(payload: bytes) -> Tuple[Any, "Blobs"]:
    """The JSON document and the blobs of a reply, with every bound checked before ``json.loads``."""
    if len(payload) < JSON_HEADER.size:
        raise WireError("a reply too short to hold its header")
    (size,) = JSON_HEADER.unpack_from(payload)
    if size > MAX_JSON_BYTES:
        raise WireError(f"a reply whose data part is {size} bytes, over the limit of {MAX_JSON_BYTES}")
    text = payload[JSON_HEADER.size:JSON_HEADER.size + size]
    if len(text) != size:
        raise WireError("a reply shorter than its header says")
    nodes = text.count(b",") + text.count(b"[") + text.count(b"{") + 1
    if nodes > MAX_NODES:
        raise WireError(f"a reply of up to {nodes} values, over the limit of {MAX_NODES}")
    try:
        head = json.loads(text)
    except RecursionError:
        raise WireError(f"a reply nested deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # includes ints over Python's digit limit
        raise WireError(f"a reply that is not plain data ({str(exc)[:120]})") from None
    if type(head) is not dict or set(head) != {"v", "blobs"} or type(head["blobs"]) is not list:
        raise WireError("a reply without its data and blob table")
    sizes = head["blobs"]
    if len(sizes) > MAX_BLOBS or any(type(n) is not int or n < 0 for n in sizes):
        raise WireError("a reply with a malformed blob table")
    start = JSON_HEADER.size + size
    if start + sum(sizes) != len(payload):
        raise WireError("a reply whose blobs do not add up to its size")
    blobs = Blobs()
    blobs.references = b'{"r":' in text
    for n in sizes:
        blobs.append(payload[start:start + n])
        start += n
    return head["v"], blobs


# ---------------------------------------------------------------------------------------
# Kernel side: values to plain data


class Encoder:
    """Turns the learner's values into plain data; whatever is not data becomes a handle.

    ``handles`` keeps the objects behind handles alive so that later calls can name them.
    One :meth:`reply` encodes one message (its blobs and aliasing are per message).
    """

    def __init__(self, handles: Dict[int, Any]) -> None:
        self.handles = handles
        self.blobs: List[bytes] = []
        self.seen: Dict[int, int] = {}
        self.keep: List[Any] = []

    def reply(self, document: Any) -> bytes:
        """Pack a reply whose values were encoded with :meth:`encode` since the last reply."""
        try:
            return pack_reply(document, self.blobs)
        finally:
            self.blobs, self.seen, self.keep = [], {}, []

    def handle(self, value: Any) -> dict:
        key = len(self.handles) + 1
        self.handles[key] = value
        kind = type(value)
        return {"h": [key, f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}"[:200]]}

    def blob(self, data: bytes) -> int:
        self.blobs.append(data)
        return len(self.blobs) - 1

    def encode(self, value: Any, _active: Optional[set] = None) -> Any:
        active = set() if _active is None else _active
        kind = type(value)
        if kind in _PLAIN:
            return value
        if kind is bytes:
            return {"b": self.blob(value)}
        if id(value) in active:
            return self.handle(value)  # a cycle: the rest stays in the kernel
        mutable = kind in (list, dict, set) or (
            kind.__module__ == "collections" and kind.__name__ in ("deque", "OrderedDict", "defaultdict"))
        if mutable:
            if id(value) in self.seen:
                return {"r": self.seen[id(value)]}
            self.seen[id(value)] = len(self.seen)
            self.keep.append(value)
        active.add(id(value))
        try:
            return self._encode(value, kind, active)
        finally:
            active.discard(id(value))

    def _encode(self, value: Any, kind: type, active: set) -> Any:
        if kind is list:
            return [self.encode(v, active) for v in value]
        if kind in (tuple, set, frozenset):
            tag = {tuple: "t", set: "s", frozenset: "fs"}[kind]
            return {tag: [self.encode(v, active) for v in value]}
        if kind is dict:
            return {"d": [[self.encode(k, active), self.encode(v, active)] for k, v in value.items()]}
        module = getattr(kind, "__module__", "") or ""
        if module == "collections" and kind.__name__ == "deque":
            return {"q": [[self.encode(v, active) for v in value], value.maxlen]}
        if module == "collections" and kind.__name__ in ("OrderedDict", "defaultdict"):
            return {"d": [[self.encode(k, active), self.encode(v, active)] for k, v in value.items()]}
        if module == "torch" and kind.__name__ == "Tensor":
            return self._tensor(value)
        if module == "torch" and kind.__name__ == "dtype":
            return {"dt": str(value).replace("torch.", "")}
        if module == "torch" and kind.__name__ == "Size":
            return {"z": [int(v) for v in value]}
        if module.startswith(("paged_kv_lib.", "paged_kv_course.")) and not isinstance(value, BaseException) and not _is_module(value):
            return self._object(value, kind, active)
        return self.handle(value)

    def _tensor(self, value: Any) -> Any:
        torch = sys.modules["torch"]
        t = value.detach().to("cpu").contiguous()
        if t.is_complex() or t.is_quantized or t.is_sparse:
            return self.handle(value)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"T": [str(t.dtype).replace("torch.", ""), [int(s) for s in t.shape], self.blob(raw)]}

    def _object(self, value: Any, kind: type, active: set) -> Any:
        import enum

        if isinstance(value, enum.Enum):
            return {"e": [kind.__module__, kind.__qualname__, value.name]}
        state: List[List[Any]] = []
        for name in _slot_names(kind):
            if hasattr(value, name):
                state.append([name, self.encode(getattr(value, name), active)])
        for name, item in getattr(value, "__dict__", {}).items():
            state.append([name, self.encode(item, active)])
        return {"o": [kind.__module__, kind.__qualname__, state]}


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


def is_mutable_kind(value: Any) -> bool:
    """Whether a call may change this argument in place (so the kernel reports its state afterwards)."""
    kind = type(value)
    return kind.__name__ in _MUTABLE_KINDS or (getattr(kind, "__module__", "") or "").startswith(("paged_kv_lib", "paged_kv_course"))
