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

import importlib
import json
import os
import re
import struct
import sys
from collections import Counter
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
        if module.startswith("paged_kv_lib.") and not isinstance(value, BaseException) and not _is_module(value):
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


# ---------------------------------------------------------------------------------------
# Grader side: plain data back to values, with exact types


def rebuildable_module(module: str) -> bool:
    """A library module whose plain classes the judge rebuilds: any outside the grading package, and
    the check modules ``checks_NN`` (their spies travel into the learner's calls and back); never the
    grader's own machinery (wire, judge, sandbox...)."""
    if not re.fullmatch(r"paged_kv_lib(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        return False
    if module == "paged_kv_lib.grading" or module.startswith("paged_kv_lib.grading."):
        return re.fullmatch(r"paged_kv_lib\.grading\.checks_\d\d", module) is not None
    return True


def library_class(module: str, qualname: str) -> type:
    """A plain class that ``module`` (see :func:`rebuildable_module`) defines as ``qualname``; nothing a
    module merely imported, no exception, nothing with ``__del__``."""
    if not rebuildable_module(module) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                                                          qualname):
        raise WireError(f"{module}.{qualname} is not a class the grader rebuilds")
    found: Any = sys.modules.get(module)
    try:
        if found is None:
            found = importlib.import_module(module)
        for part in qualname.split("."):
            found = found.__dict__[part] if isinstance(found, type) else vars(found)[part]
    except Exception:  # noqa: BLE001
        raise WireError(f"no class {module}.{qualname}") from None
    if not isinstance(found, type) or found.__module__ != module or found.__qualname__ != qualname:
        raise WireError(f"{module}.{qualname} is not a class defined there")
    if issubclass(found, BaseException) or any("__del__" in k.__dict__ for k in found.__mro__):
        raise WireError(f"{module}.{qualname} is not a class the grader rebuilds")
    return found


class Decoder:
    """Rebuilds plain data from the kernel into values; ``make_handle(key, type_name)`` makes proxies."""

    def __init__(self, make_handle: Callable[[int, str], Any], blobs: Optional[List[bytes]] = None,
                 references: Optional[bool] = None) -> None:
        self.make_handle = make_handle
        self.blobs = blobs or []
        self.nodes = 0
        self.containers: List[Any] = []
        self.sizes: List[int] = []
        # Containers are numbered (and values counted) only when the reply may refer back to one:
        # without references its values were already bounded by counting its separators.
        self.track = getattr(blobs, "references", True) if references is None else references

    def decode(self, data: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"a reply nested deeper than {MAX_DEPTH}")
        kind = type(data)
        if kind is list:
            if not self.track:  # fresh from json.loads: decoded in place, plain items left as they are
                for index, item in enumerate(data):
                    inner = type(item)
                    if inner is list or inner is dict:
                        data[index] = self.decode(item, depth + 1)
                    elif inner is str and len(item) > MAX_STR:
                        raise WireError(f"a string of {len(item)} characters, over the limit of {MAX_STR}")
                return data
            self._count(1)
            out: List[Any] = []
            slot = self._register(out)
            start = self.nodes
            out.extend([self.decode(v, depth + 1) for v in data])
            self.sizes[slot] = self.nodes - start
            return out
        if self.track:
            self._count(1)
        if kind is str:
            if len(data) > MAX_STR:
                raise WireError(f"a string of {len(data)} characters, over the limit of {MAX_STR}")
            return data
        if kind in _PLAIN:
            return data
        if kind is dict and len(data) == 1:
            ((tag, body),) = data.items()
            if tag in _TAGS:
                try:
                    return self._tagged(tag, body, depth)
                except WireError:
                    raise
                except (Exception, RecursionError) as exc:  # noqa: BLE001
                    raise WireError(f"the kernel sent a malformed {tag!r} value ({type(exc).__name__})") from None
        raise WireError("the kernel sent a value outside the wire format")

    def _count(self, n: int) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise WireError(f"a reply of more than {MAX_NODES} values")

    def _register(self, container: Any) -> int:
        if not self.track:
            return 0
        self.containers.append(container)
        self.sizes.append(-1)  # not finished: a reference to it would be a cycle
        return len(self.containers) - 1

    def _items(self, body: Any, depth: int) -> List[Any]:
        return [self.decode(v, depth + 1) for v in _list(body)]

    def _tagged(self, tag: str, body: Any, depth: int) -> Any:
        if tag == "t":
            return tuple(self._items(body, depth))
        if tag in ("s", "fs"):
            if tag == "s":
                slot = self._register(None)
                start = self.nodes
            items = self._items(body, depth)
            _no_collisions(items)
            if tag == "fs":
                return frozenset(items)
            made = set(items)
            if self.track:
                self.containers[slot], self.sizes[slot] = made, self.nodes - start
            return made
        if tag == "d":
            made_dict: Dict[Any, Any] = {}
            slot = self._register(made_dict)
            start = self.nodes
            pairs = [(self.decode(k, depth + 1), self.decode(v, depth + 1)) for k, v in
                     (_pair(p) for p in _list(body))]
            _no_collisions([k for k, _ in pairs])
            made_dict.update(pairs)
            if self.track:
                self.sizes[slot] = self.nodes - start
            return made_dict
        if tag == "q":
            from collections import deque

            items_body, maxlen = _pair(body)
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise WireError("a deque with a bad maxlen")
            made_q: Any = deque((), maxlen)
            slot = self._register(made_q)
            start = self.nodes
            made_q.extend(self._items(items_body, depth))
            if self.track:
                self.sizes[slot] = self.nodes - start
            return made_q
        if tag == "r":
            index = _int(body)
            if not self.track or not 0 <= index < len(self.containers) or self.sizes[index] < 0:
                raise WireError("a reference to a container that is not (yet) complete")
            self._count(self.sizes[index])
            return self.containers[index]
        if tag == "b":
            return self._blob(body)
        if tag == "T":
            dtype, shape, blob = _list(body)
            return _tensor(dtype, shape, self._blob(blob))
        if tag == "dt":
            return _dtype(body)
        if tag == "z":
            torch = importlib.import_module("torch")
            return torch.Size([_int(v) for v in _list(body)])
        if tag == "h":
            key, name = _pair(body)
            return self.make_handle(_int(key), _str(name)[:200])
        if tag == "e":
            import enum

            module, qualname, member = _list(body)
            members: Any = library_class(_str(module), _str(qualname))
            if not issubclass(members, enum.Enum):
                raise WireError("not an enum")
            return members[_str(member)]
        return self._object(body, depth)

    def _blob(self, index: Any) -> bytes:
        index = _int(index)
        if not 0 <= index < len(self.blobs):
            raise WireError("a reference to a blob the reply does not hold")
        return self.blobs[index]

    def _object(self, body: Any, depth: int) -> Any:
        module, qualname, state = _list(body)
        cls: Any = library_class(_str(module), _str(qualname))
        obj = cls.__new__(cls)
        for pair in _list(state):
            name, value = _pair(pair)
            if not _str(name).isidentifier() or name.startswith("__"):
                raise WireError(f"an attribute named {name[:40]!r}")
            object.__setattr__(obj, name, self.decode(value, depth + 1))
        return obj


def decode_reply(payload: bytes, make_handle: Callable[[int, str], Any]) -> Any:
    """A whole reply from the kernel, decoded (its values rebuilt), or :class:`WireError`."""
    document, blobs = unpack_reply(payload)
    return Decoder(make_handle, blobs).decode(document)


def _no_collisions(items: List[Any]) -> None:
    """Refuse set items or dict keys whose hashes collide (built one by one they would take quadratic time)."""
    if len(items) <= MAX_COLLISIONS:
        return
    try:
        worst = Counter(hash(v) for v in items).most_common(1)[0][1]
    except TypeError:
        raise WireError("a set item or dict key that cannot be hashed") from None
    if worst > MAX_COLLISIONS:
        raise WireError(f"a set or dict with {worst} keys of one hash (over the limit of {MAX_COLLISIONS})")


def _list(value: Any) -> list:
    if type(value) is not list:
        raise WireError("expected a list in the wire format")
    return value


def _pair(value: Any) -> list:
    if type(value) is not list or len(value) != 2:
        raise WireError("expected a pair in the wire format")
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
    dtype = getattr(torch, _str(name), None) if _str(name).isidentifier() else None
    if type(dtype) is not torch.dtype:
        raise WireError(f"unknown dtype {str(name)[:40]!r}")
    return dtype


def _tensor(dtype_name: Any, shape_data: Any, raw: bytes) -> Any:
    torch = importlib.import_module("torch")
    dtype = _dtype(dtype_name)
    shape = [_int(v) for v in _list(shape_data)]
    if any(s < 0 for s in shape) or len(shape) > 64:
        raise WireError("malformed tensor shape")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise WireError(f"a tensor of shape {shape[:8]} and dtype {dtype} needs {numel * itemsize} bytes, got {len(raw)}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def is_mutable_kind(value: Any) -> bool:
    """Whether a call may change this argument in place (so the kernel reports its state afterwards)."""
    kind = type(value)
    return kind.__name__ in _MUTABLE_KINDS or (getattr(kind, "__module__", "") or "").startswith("paged_kv_lib")
