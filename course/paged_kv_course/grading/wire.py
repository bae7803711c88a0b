"""Plain data between the judge and the learner's kernel: framing, values and their schema.

Both directions carry the same thing: a JSON document and raw byte blobs, length-prefixed.
No pickle, no code, and no class name the judge acts on. A value is a JSON scalar, a list,
or an object with one key naming its kind: ``t`` tuple, ``s``/``fs`` set, ``d`` dict (pairs),
``q`` deque, ``b`` bytes (a blob), ``T`` tensor (dtype, shape, blob), ``dt`` dtype, ``z``
torch.Size, ``r`` the same container as an earlier one of this message (aliasing), ``h`` a
handle to an object that stays in the kernel, ``j`` a handle to an object the judge serves,
``o`` a library object sent *to* the kernel by value (module, qualname, attributes; the
kernel rebuilds it, the judge never does) and ``a`` the attributes of such an object after a
call (the judge writes them onto its own object). :data:`REPLY_SCHEMA` is what the judge
accepts from the kernel; it is checked with :mod:`jsonschema` after the size bounds.

The kernel loads this file by its path: it imports nothing of the course, nor torch at import.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, Callable, Dict, List, Tuple

HEADER = struct.Struct("!QI")  # whole message, JSON part
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_NODES = 250_000
MAX_DEPTH = 200
MAX_STR = 1_000_000
MAX_COLLISIONS = 64
_PLAIN = (type(None), bool, int, float, str)
LIBRARY = ("paged_kv_lib.", "paged_kv_lib")


class WireError(RuntimeError):
    """A message that is malformed, over a bound, or outside the schema: one line."""


def send(fd: int, document: Any, blobs: List[bytes]) -> None:
    """Write one message: its JSON document and its blobs."""
    head = json.dumps({"v": document, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    view = memoryview(HEADER.pack(len(head) + sum(map(len, blobs)), len(head)) + head + b"".join(blobs))
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, size: int, wait: Callable[[], None]) -> bytes:
    chunks, remaining = [], size
    while remaining:
        wait()
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, wait: Callable[[], None] = lambda: None) -> Tuple[Any, List[bytes]]:
    """Read one message; every bound is checked before ``json.loads`` (a message over a bound is read
    and dropped, so the conversation goes on, and :class:`WireError` says why)."""
    total, size = HEADER.unpack(_read(fd, HEADER.size, wait))
    if total > MAX_MESSAGE_BYTES or size > min(total, MAX_JSON_BYTES):
        left = total
        while left:
            _read(fd, min(left, 1 << 20), wait)
            left -= min(left, 1 << 20)
        raise WireError(f"a message of {total} bytes ({size} of data), over the limit")
    payload = _read(fd, total, wait)
    text = payload[:size]
    nodes = text.count(b",") + text.count(b"[") + text.count(b"{")
    if nodes > MAX_NODES:
        raise WireError(f"a message of up to {nodes} values, over the limit of {MAX_NODES}")
    try:
        head = json.loads(text)
    except RecursionError:
        raise WireError(f"a message nested deeper than {MAX_DEPTH}") from None
    except ValueError as exc:
        raise WireError(f"a message that is not plain data ({str(exc)[:120]})") from None
    if type(head) is not dict or set(head) != {"v", "blobs"} or type(head["blobs"]) is not list \
            or any(type(n) is not int or n < 0 for n in head["blobs"]) or size + sum(head["blobs"]) != total:
        raise WireError("a message whose blob table does not add up")
    blobs, start = [], size
    for n in head["blobs"]:
        blobs.append(payload[start:start + n])
        start += n
    return head["v"], blobs


# ---------------------------------------------------------------------------------------
# The schema of the kernel's messages to the judge

# One schema for every kind of value, no ``anyOf``: a keyword applies only to its own JSON type (``maxLength`` to
# strings, ``items`` to arrays, the properties to objects), so a valid reply never tries a branch that fails
# (fastjsonschema builds an exception for each failed try; docs/benchmarks.md has the cost).
_VALUE = {
    "type": ["null", "boolean", "number", "string", "array", "object"],
    "maxLength": MAX_STR,
    "items": {"$ref": "#/$defs/value"},
    "minProperties": 1, "maxProperties": 1, "additionalProperties": False, "properties": {
        **{tag: {"type": "array", "items": {"$ref": "#/$defs/value"}} for tag in ("t", "s", "fs")},
        "d": {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                         "items": {"$ref": "#/$defs/value"}}},
        "q": {"type": "array", "items": [{"type": "array", "items": {"$ref": "#/$defs/value"}},
                                               {"type": ["integer", "null"], "minimum": 0}],
              "minItems": 2, "maxItems": 2},
        "b": {"type": "integer", "minimum": 0}, "r": {"type": "integer", "minimum": 0},
        "j": {"type": "integer", "minimum": 0},
        "T": {"type": "array", "items": [{"type": "string", "pattern": "^[a-z0-9_]{1,24}$"},
                                               {"type": "array", "maxItems": 64,
                                                "items": {"type": "integer", "minimum": 0}},
                                               {"type": "integer", "minimum": 0}],
              "minItems": 3, "maxItems": 3},
        "dt": {"type": "string", "pattern": "^[a-z0-9_]{1,24}$"},
        "z": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "h": {"type": "array", "items": [{"type": "integer", "minimum": 1},
                                               {"type": "string", "maxLength": 200}],
              "minItems": 2, "maxItems": 2},
        "a": {"$ref": "#/$defs/attrs"},
    },
}
_ATTRS = {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": [
    {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,99}$"}, {"$ref": "#/$defs/value"}]}}
_CHANGED = {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": [
    {"type": ["integer", "string"]}, {"$ref": "#/$defs/value"}]}}
_CALLBACK = {"type": "object", "required": ["op", "target"], "additionalProperties": False, "properties": {
    "op": {"enum": ["call", "getattr", "builtin"]}, "target": {"type": "integer", "minimum": 0},
    "name": {"type": "string", "maxLength": 100}, "args": {"type": "array", "items": {"$ref": "#/$defs/value"}},
    "kwargs": {"$ref": "#/$defs/attrs"}}}
REPLY_SCHEMA: Dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$defs": {"value": _VALUE, "attrs": _ATTRS},
    "oneOf": [
        {"type": "object", "required": ["ok"], "additionalProperties": False,
         "properties": {"ok": {"$ref": "#/$defs/value"}, "changed": _CHANGED}},
        {"type": "object", "required": ["raised"], "additionalProperties": False, "properties": {
            "raised": {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "string", "maxLength": 4000}},
            "changed": _CHANGED}},
        {"type": "object", "required": ["timeout"], "additionalProperties": False,
         "properties": {"timeout": {"const": True}}},
        {"type": "object", "required": ["callback"], "additionalProperties": False,
         "properties": {"callback": _CALLBACK}},
    ],
}


def check_reply(document: Any) -> None:
    """Validate a kernel message against :data:`REPLY_SCHEMA`; :class:`WireError` if not. The verdict comes
    from fastjsonschema's compiled validators (a judge checks thousands of replies per submission: 7x faster
    than jsonschema's, measured in docs/benchmarks.md), one per branch of the ``oneOf``, picked by the reply's
    key: the branches require different keys and allow no other, so at most one can match, and the others need
    no try. jsonschema only words a refusal (where it failed)."""
    import fastjsonschema

    if not _VALIDATORS:
        for branch in REPLY_SCHEMA["oneOf"]:
            whole = {"$schema": REPLY_SCHEMA["$schema"], "$defs": REPLY_SCHEMA["$defs"], **branch}
            _VALIDATORS[branch["required"][0]] = fastjsonschema.compile(whole)
    kind = next((key for key in _VALIDATORS if key in document), None) if type(document) is dict else None
    try:
        if kind is not None:
            _VALIDATORS[kind](document)
            return
    except RecursionError:
        raise WireError(f"a message nested deeper than {MAX_DEPTH}") from None
    except fastjsonschema.JsonSchemaException:
        pass
    import jsonschema

    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(REPLY_SCHEMA).iter_errors(document))
    except RecursionError:
        raise WireError(f"a message nested deeper than {MAX_DEPTH}") from None
    where = "/".join(map(str, error.absolute_path))[:80] if error is not None else ""
    raise WireError(f"a message outside the wire's schema (at {where})")


_VALIDATORS: Dict[str, Any] = {}  # the reply's key -> the compiled validator of its branch


# ---------------------------------------------------------------------------------------
# Values to plain data (both sides)


class Encoder:
    """Turns values into plain data for one message. ``other(value)`` encodes what is not data
    (the kernel: a handle; the judge: a served handle or a library object by value)."""

    def __init__(self, other: Callable[["Encoder", Any], Any]) -> None:
        self.other = other
        self.blobs: List[bytes] = []
        self.seen: Dict[int, int] = {}
        self.keep: List[Any] = []
        self.depth = 0

    def encode(self, value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN:
            return value
        if kind is bytes:
            self.blobs.append(value)
            return {"b": len(self.blobs) - 1}
        module, name = getattr(kind, "__module__", ""), kind.__name__
        if kind in (list, dict, set) or (module == "collections" and name in ("deque", "OrderedDict", "defaultdict")):
            if id(value) in self.seen:
                if self.seen[id(value)] < 0:
                    return self.other(self, value)  # a cycle: the container stays where it is
                return {"r": self.seen[id(value)]}
            slot = len(self.seen)
            self.seen[id(value)] = -1
            self.keep.append(value)
            out = self._container(value, kind, module, name)
            self.seen[id(value)] = slot
            return out
        if kind in (tuple, frozenset):
            return {"t" if kind is tuple else "fs": self._items(value)}
        if module == "torch" and name == "Tensor":
            t = value.detach().to("cpu").contiguous()
            if t.is_complex() or t.is_quantized or t.is_sparse:
                return self.other(self, value)
            torch = sys.modules["torch"]
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            self.blobs.append(raw)
            return {"T": [str(t.dtype)[6:], [int(s) for s in t.shape], len(self.blobs) - 1]}
        if module == "torch" and name == "dtype":
            return {"dt": str(value)[6:]}
        if module == "torch" and name == "Size":
            return {"z": [int(v) for v in value]}
        return self.other(self, value)

    def _items(self, values: Any) -> List[Any]:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
        try:
            return [self.encode(v) for v in values]
        finally:
            self.depth -= 1

    def _container(self, value: Any, kind: type, module: str, name: str) -> Any:
        if kind is list:
            return self._items(value)
        if kind is set:
            return {"s": self._items(value)}
        if name == "deque":
            return {"q": [self._items(value), value.maxlen]}
        return {"d": [self._items(pair) for pair in value.items()]}

    def attrs(self, value: Any) -> List[List[Any]]:
        """An object's attributes (slots and ``__dict__``) as name/value pairs."""
        names: List[str] = []
        for klass in type(value).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            names += [n for n in ([slots] if isinstance(slots, str) else slots)
                      if n not in ("__dict__", "__weakref__") and hasattr(value, n)]
        names += list(getattr(value, "__dict__", {}))
        return [[n, self.encode(getattr(value, n))] for n in dict.fromkeys(names)]


class Decoder:
    """Plain data back into values. ``tags`` maps the extra kinds this side accepts (``h``, ``j``, ``o``,
    ``a``) to functions of (decoder, body); any other tag is refused."""

    def __init__(self, blobs: List[bytes], tags: Dict[str, Callable[["Decoder", Any], Any]]) -> None:
        self.blobs = blobs
        self.tags = tags
        self.containers: List[Any] = []
        self.nodes = 0

    def decode(self, data: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise WireError("a message nested too deeply or holding too many values")
        kind = type(data)
        if kind is str and len(data) > MAX_STR:
            raise WireError(f"a string over {MAX_STR} characters")
        if kind in _PLAIN:
            return data
        if kind is list:
            out: List[Any] = []
            self.containers.append(out)
            out.extend(self.decode(v, depth + 1) for v in data)
            return out
        if kind is not dict or len(data) != 1:
            raise WireError("a value outside the wire format")
        ((tag, body),) = data.items()
        try:
            return self._tagged(tag, body, depth)
        except WireError:
            raise
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - whatever a malformed body trips
            raise WireError(f"a malformed {str(tag)[:8]!r} value ({type(exc).__name__})") from None

    def items(self, body: Any, depth: int) -> List[Any]:
        if type(body) is not list:
            raise WireError("expected a list")
        return [self.decode(v, depth + 1) for v in body]

    def _tagged(self, tag: str, body: Any, depth: int) -> Any:
        if tag in self.tags:
            return self.tags[tag](self, body)
        if tag == "t":
            return tuple(self.items(body, depth))
        if tag == "fs":
            return frozenset(_hashable(self.items(body, depth)))
        if tag == "s":
            made: set = set()
            self.containers.append(made)
            made.update(_hashable(self.items(body, depth)))
            return made
        if tag == "d":
            made_d: Dict[Any, Any] = {}
            self.containers.append(made_d)
            pairs = [self.items(p, depth) for p in body]
            _hashable([k for k, _ in pairs])
            made_d.update((k, v) for k, v in pairs)
            return made_d
        if tag == "q":
            from collections import deque

            made_q: Any = deque((), body[1])
            self.containers.append(made_q)
            made_q.extend(self.items(body[0], depth))
            return made_q
        if tag == "r":
            if type(body) is not int or not 0 <= body < len(self.containers):
                raise WireError("a reference to no container")
            return self.containers[body]
        if tag == "b":
            return self.blobs[body]
        if tag == "T":
            dtype_name, shape, blob = body
            return _tensor(dtype_name, shape, blob, self.blobs)
        if tag == "dt":
            return _dtype(body)
        if tag == "z":
            return sys.modules["torch"].Size([int(v) for v in body])
        raise WireError(f"a value of kind {str(tag)[:8]!r}, which this side does not accept")


def _hashable(items: List[Any]) -> List[Any]:
    """Refuse keys that cannot be hashed, or too many of one hash (quadratic to insert)."""
    if len(items) > MAX_COLLISIONS:
        counts: Dict[int, int] = {}
        for item in items:
            counts[hash(item)] = counts.get(hash(item), 0) + 1
        if max(counts.values()) > MAX_COLLISIONS:
            raise WireError(f"a set or dict with more than {MAX_COLLISIONS} keys of one hash")
    return items


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None) if type(name) is str and name.isidentifier() else None
    if type(dtype) is not torch.dtype:
        raise WireError(f"unknown dtype {str(name)[:24]!r}")
    return dtype


def _tensor(dtype_name: str, shape: List[int], blob: int, blobs: List[bytes]) -> Any:
    import torch

    dtype = _dtype(dtype_name)
    raw = blobs[blob]
    numel = 1
    for s in shape:
        numel *= int(s)
    if len(raw) != numel * torch.empty((), dtype=dtype).element_size():
        raise WireError(f"a tensor of shape {shape[:8]} whose bytes do not fit it")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def is_library_object(value: Any) -> bool:
    """A plain object of a library class (sent to the kernel by value): not a module, class or exception."""
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    return module.startswith(LIBRARY) and not isinstance(value, (type, BaseException)) \
        and not any(c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in kind.__mro__) \
        and not callable(value)


def escape(text: Any, limit: int = 4000) -> str:
    """Learner text made safe for a terminal or a file: control characters and escape sequences shown
    as ``\\xNN`` (newlines and tabs kept), cut to ``limit`` characters."""
    out = []
    for ch in str(text)[:limit]:
        out.append(ch if ch in "\n\t" or (ch.isprintable() and ch not in "\x1b\x9b") else
                   ascii(ch)[1:-1] if ord(ch) > 255 else f"\\x{ord(ch):02x}")
    return "".join(out)

