"""The judge's stand-ins for a learner's objects, and the calls that go through them.

A :class:`Remote` stands for an object that stays in the learner's kernel: a call on it
sends its arguments into the kernel (pickled by :class:`Caller`), runs the learner's code
there and brings back the result, the arguments' new state and any exception, as
untrusted plain data (:mod:`.wire`); :func:`restore` gives the check's own arguments the
state the learner's call left their copies in. :func:`paged_kv_course.stand_in.is_stand_in`
is how other code asks whether a value is one of these.
"""

from __future__ import annotations

import builtins
import io
import pickle
from typing import Any, Dict, List, Optional, Tuple

from . import stubs, wire, wire_decode


class JudgeAbort(BaseException):
    """The kernel timed out, died or broke the protocol: the check cannot go on (not an ``Exception``,
    so a check's ``except Exception`` never swallows it)."""


class Refused(BaseException):
    """A reply the judge does not accept (over a bound, not plain data) or a use of a stubbed module:
    the check fails with this one line, and the kernel stays usable (not an ``Exception``, so a
    check's ``except Exception`` never turns it into another message)."""



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
    from paged_kv_lib import errors

    return {name: value for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__}


class Caller:
    """Makes the kernel requests of one check and turns replies into values, errors and argument updates."""

    def __init__(self, session: Any) -> None:  # a judge.Session
        self.session = session

    def decode(self, data: Any, blobs: List[bytes]) -> Any:
        try:
            return wire_decode.Decoder(lambda key, kind: Remote(self, key, kind), blobs).decode(data)
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
        elif module.split(".")[0] in ("paged_kv_lib", "paged_kv_course"):
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
    elif kind is type(new) and kind.__module__.startswith(("paged_kv_lib", "paged_kv_course")):
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
    __paged_kv_stand_in__ = True  # read by paged_kv_course.stand_in (on the class: never forwarded)

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


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
