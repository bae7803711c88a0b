"""Decoding the learner kernel's replies in the judge: untrusted plain data back into values.

The format is :mod:`.wire`'s (read its docstring); this half runs only in the judge, so
the kernel, which loads :mod:`.wire` by its path, never imports it. Nothing here
unpickles: a value is rebuilt from its JSON tag, and an object only as a plain class that
a library module defines under that name (:func:`library_class`).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import Counter
from typing import Any, Callable, Dict, List, Optional

from .wire import (
    _PLAIN, _TAGS, MAX_COLLISIONS, MAX_DEPTH, MAX_NODES, MAX_STR, WireError, unpack_reply,
)



def rebuildable_module(module: str) -> bool:
    """A library module whose plain classes the judge rebuilds: any outside the grading package, and
    the check modules ``checks_NN`` (their spies travel into the learner's calls and back); never the
    grader's own machinery (wire, judge, sandbox...)."""
    if not re.fullmatch(r"paged_kv_(lib|course)(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        return False
    if module == "paged_kv_course.grading" or module.startswith("paged_kv_course.grading."):
        return re.fullmatch(r"paged_kv_course\.grading\.checks_\d\d", module) is not None
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
