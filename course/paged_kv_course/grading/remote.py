"""The judge's side of the conversation with the learner's kernel: requests out, plain data back.

A :class:`Remote` stands for an object that stays in the kernel (an integer handle): a call on
it sends a request made of plain data (:mod:`.wire`), and the reply, checked against
:data:`.wire.REPLY_SCHEMA`, is decoded into plain values, new handles, or the name of an
exception. No class is ever rebuilt from a reply: a learner's class that calls itself a
course starter is a handle like any other. What the check hands to the learner's code goes
as data (tensors included), as a library object by value (its new attributes come back as
data, written onto the judge's own object), or, for anything else (instruments, spies, the
model of 05.3), as an object the judge *serves*: the kernel's uses of it come back here as
requests (``callback``), so its record is kept where the learner's code cannot reach it.
"""

from __future__ import annotations

import builtins
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import wire


class JudgeAbort(BaseException):
    """The kernel timed out, died or broke the protocol: the check cannot go on (not an ``Exception``,
    so a check's ``except Exception`` never swallows it)."""


class Refused(BaseException):
    """A reply the judge does not accept (over a bound, outside the schema): the check fails with this
    one line (not an ``Exception``, so no check turns it into another message)."""


class CellError(Exception):
    """A notebook cell raised in the kernel: ``raised`` is (module, type name, the formatted error)."""

    def __init__(self, raised: List[str]) -> None:
        super().__init__(raised[2])
        self.raised = raised


class Attrs(dict):
    """The attributes a call left on a library object the judge sent by value (the judge's own type)."""


_BUILTIN_EXCEPTIONS = {n: v for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)}


def library_errors() -> Dict[str, type]:
    """The library's error classes by name (those ``paged_kv_lib.errors`` defines)."""
    from paged_kv_lib import errors

    return {n: v for n, v in vars(errors).items()
            if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors.__name__}


_SERVED_BUILTINS: Dict[str, Callable[..., Any]] = {
    "len": len, "repr": repr, "bool": bool, "list": list, "contains": lambda o, i: i in o,
    "getitem": lambda o, k: o[k], "setitem": lambda o, k, v: o.__setitem__(k, v), "eq": lambda o, x: o == x,
}


class Caller:
    """One check's requests to the kernel, and the objects the judge serves to it meanwhile."""

    def __init__(self, session: Any) -> None:  # a judge.Session: send(document, blobs), receive()
        self.session = session
        self.served: Dict[int, Any] = {}
        self.served_keys: Dict[int, int] = {}
        self.methods: Set[Tuple[int, str]] = set()  # (handle, name) whose value was a bound method

    # -- encoding ------------------------------------------------------------------------

    def other(self, encoder: wire.Encoder, value: Any) -> Any:
        if type(value) is Remote:
            return {"h": [object.__getattribute__(value, "_key"), ""]}
        if wire.is_library_object(value):
            kind = type(value)
            return {"o": [kind.__module__, kind.__qualname__, encoder.attrs(value)]}
        key = self.served_keys.get(id(value))
        if key is None:
            key = len(self.served)
            self.served[key], self.served_keys[id(value)] = value, key
        return {"j": key}

    def decode(self, data: Any, blobs: List[bytes]) -> Any:
        def served(decoder: wire.Decoder, key: Any) -> Any:
            if type(key) is not int or key not in self.served:
                raise wire.WireError("a reference to nothing the judge lent")
            return self.served[key]

        tags = {"h": lambda d, body: Remote(self, body[0], body[1]), "j": served,
                "a": lambda d, body: Attrs((name, d.decode(v, 1)) for name, v in body)}
        try:
            return wire.Decoder(blobs, tags).decode(data)
        except wire.WireError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None

    # -- the conversation ----------------------------------------------------------------

    def request(self, op: str, target: Optional[int] = None, name: str = "", args: Tuple[Any, ...] = (),
                kwargs: Optional[Dict[str, Any]] = None, keep: bool = False) -> Any:
        """Send one request; serve the kernel's callbacks until its reply; the value, or the learner's error."""
        kwargs = kwargs or {}
        encoder = wire.Encoder(self.other)
        message = {"op": op, "target": target, "name": name, "keep": keep,
                   "args": [encoder.encode(a) for a in args], "kwargs": [[k, encoder.encode(v)] for k, v in kwargs.items()]}
        self.session.send(message, encoder.blobs)
        while True:
            reply, blobs = self.session.receive()
            if "callback" not in reply:
                break
            self.serve(reply["callback"], blobs)
        if "timeout" in reply:
            raise JudgeAbort("timed out")
        for key, state in reply.get("changed", []):
            original = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
            restore(original, self.decode(state, blobs))
        if "ok" in reply:
            return self.decode(reply["ok"], blobs)
        if op == "exec":
            raise CellError(reply["raised"])
        raise self.exception(reply["raised"])

    def serve(self, call: Dict[str, Any], blobs: List[bytes]) -> None:
        """Do what the learner's code asked of an object the judge lent it, and answer with data."""
        encoder = wire.Encoder(self.other)
        try:
            target = self.served[call["target"]]
            name = call.get("name", "")
            args = [self.decode(a, blobs) for a in call.get("args", [])]
            kwargs = {k: self.decode(v, blobs) for k, v in call.get("kwargs", [])}
            if call["op"] == "getattr":
                private = getattr(type(target), "__paged_kv_private__", ())
                if name.startswith("_") or name in private:
                    raise AttributeError(f"the grader does not lend the attribute {name!r}")
                value = getattr(target, name)
            elif call["op"] == "builtin":
                value = _SERVED_BUILTINS[name](target, *args)
            else:
                value = target(*args, **kwargs)
            answer: Dict[str, Any] = {"op": "answer", "ok": encoder.encode(value)}
        except (JudgeAbort, Refused):
            raise
        except Exception as exc:  # noqa: BLE001 - the learner's misuse of a lent object is their error
            encoder = wire.Encoder(self.other)
            answer = {"op": "answer", "raised": [type(exc).__name__, str(exc)[:2000]]}
        self.session.send(answer, encoder.blobs)

    def exception(self, raised: List[str]) -> BaseException:
        """The learner's exception, by name: a builtin or a library error, else RuntimeError."""
        module, qualname, message = raised
        cls: Optional[type] = None
        if module == "builtins":
            cls = _BUILTIN_EXCEPTIONS.get(qualname)
        elif module.split(".")[0] in ("paged_kv_lib", "paged_kv_course"):
            cls = library_errors().get(qualname)
        if cls is None:
            return RuntimeError(f"{qualname}: {message}")
        created: Any = BaseException.__new__(cls)
        created.args = (message,)
        return created


def restore(original: Any, new: Any) -> None:
    """Give the check's own ``original`` the state the learner's call left its copy in."""
    kind = type(original)
    if kind.__name__ == "Tensor" and type(new) is kind:
        if new.dtype == original.dtype and new.shape == original.shape:
            original.copy_(new)
        else:
            original.data = new
    elif kind in (list, dict, set) and type(new) is kind or kind.__name__ == "deque" and type(new) is kind:
        original.clear()
        original.extend(new) if kind is list or kind.__name__ == "deque" else original.update(new)
    elif type(new) is Attrs and wire.is_library_object(original):
        for name, value in new.items():
            old = getattr(original, name, None)
            if type(value) is Attrs or (type(old) is type(value) and type(old).__name__ in ("list", "dict", "set",
                                                                                             "deque", "Tensor")):
                restore(old, value)
            else:
                object.__setattr__(original, name, value)


class Remote:
    """A learner's object that stays in the kernel: calls, attribute reads and builtins are requests."""

    __slots__ = ("_caller", "_key", "_kind")
    __paged_kv_stand_in__ = True  # read by paged_kv_course.stand_in (on the class: never forwarded)

    def __init__(self, caller: Caller, key: int, kind: str) -> None:
        object.__setattr__(self, "_caller", caller)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_kind", kind)

    def _ask(self, op: str, attr: str = "", args: Tuple[Any, ...] = (), kwargs: Optional[Dict[str, Any]] = None,
             keep: bool = False) -> Any:
        return object.__getattribute__(self, "_caller").request(op, object.__getattribute__(self, "_key"), attr,
                                                                 args, kwargs, keep)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", "", args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        caller, key = object.__getattribute__(self, "_caller"), object.__getattribute__(self, "_key")
        if (key, name) in caller.methods:  # a method: the kernel looks it up when it is called
            return _Method(self, name)
        value = self._ask("getattr", name)
        if type(value) is Remote and object.__getattribute__(value, "_kind") == "builtins.method":
            caller.methods.add((key, name))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name, (value,))

    def _typed(self, name: str, kind: type, *args: Any) -> Any:
        value = self._ask("builtin", name, args)
        if type(value) is not kind:
            raise TypeError(f"{name}() of the learner's object did not give a {kind.__name__}")
        return value

    def __len__(self) -> int:
        return self._typed("len", int)

    def __bool__(self) -> bool:
        return self._typed("bool", bool)

    def __repr__(self) -> str:
        value = self._ask("builtin", "repr")
        return value[:2000] if type(value) is str else f"<{object.__getattribute__(self, '_kind')}>"

    def __str__(self) -> str:
        value = self._ask("builtin", "str")
        return value[:2000] if type(value) is str else repr(self)

    def __iter__(self) -> Any:
        return iter(self._typed("list", list))

    def __contains__(self, item: Any) -> bool:
        return self._ask("builtin", "contains", (item,)) is True

    def __getitem__(self, key: Any) -> Any:
        return self._ask("builtin", "getitem", (key,))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("builtin", "setitem", (key, value))

    def __delitem__(self, key: Any) -> None:
        self._ask("builtin", "delitem", (key,))

    def __eq__(self, other: Any) -> bool:
        # Identity only: an object that stays in the kernel never equals the judge's data, whatever its
        # own __eq__ claims (an "int equal to everything" arrives as such an object).
        return type(other) is Remote and object.__getattribute__(other, "_key") == object.__getattribute__(self, "_key")

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("remote", object.__getattribute__(self, "_key")))


class _Method:
    """A method of a learner's object that an earlier lookup showed to be one: calling it is one request
    (``method``: the kernel looks it up and calls it) instead of two, a lookup and a call. The differential
    checks call methods thousands of times per submission."""

    __slots__ = ("_owner", "_name")
    __paged_kv_stand_in__ = True
    _kind = "builtins.method"  # what paged_kv_course.stand_in reads

    def __init__(self, owner: Remote, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._owner._ask("method", self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<method {self._name} of the learner's object>"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
