"""The wire between the judge and the learner's kernel: plain data both ways, a schema, bounds.

What these tests hold: values keep their exact types and their aliasing; nothing in a reply
rebuilds a class (a learner's class that names itself a course starter is a handle, a forged
``o``/``e`` value or a pickle is refused); bounds refuse a reply in one line before it costs
the judge; learner text in a report loses its control characters.
"""

from __future__ import annotations

import os
import pickle
import struct

import pytest
import torch

from paged_kv_course.grading import wire
from paged_kv_course.grading.remote import Attrs, Caller, Refused, Remote


class FakeSession:
    """Replies queued in advance, as the kernel would send them."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.sent = []

    def send(self, document, blobs):
        self.sent.append(document)

    def receive(self):
        document, blobs = self.replies.pop(0)
        try:
            wire.check_reply(document)  # as judge.Session.receive does
        except wire.WireError as exc:
            raise Refused(f"refused the learner's reply: {exc}") from None
        return document, blobs


def kernel_encode(value):
    """Encode as the kernel does: anything that is not data becomes a handle."""
    handles = {}

    def other(encoder, v):
        handles[len(handles) + 1] = v
        return {"h": [len(handles), f"{type(v).__module__}.{type(v).__qualname__}"]}

    encoder = wire.Encoder(other)
    return encoder.encode(value), encoder.blobs


def reply(value):
    document, blobs = kernel_encode(value)
    return {"ok": document}, blobs


def test_values_come_back_with_exact_types_and_their_aliasing():
    shared = [1, 2]
    value = {"a": [shared, shared], "t": (1.5, "x", None), "s": {3, 4}, "b": b"raw",
             "T": torch.arange(6, dtype=torch.int16).reshape(2, 3), "dt": torch.float32, "z": torch.Size([2, 3])}
    got = Caller(FakeSession(reply(value))).request("global", None, "x")
    assert got["a"][0] is got["a"][1] and got["a"][0] == [1, 2]
    assert type(got["t"]) is tuple and type(got["s"]) is set and got["b"] == b"raw"
    assert got["T"].dtype is torch.int16 and torch.equal(got["T"], value["T"])
    assert got["dt"] is torch.float32 and got["z"] == torch.Size([2, 3])


class Sneaky(int):
    """The "int equal to everything" shape."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_what_is_not_data_stays_in_the_kernel_behind_a_handle():
    got = Caller(FakeSession(reply([Sneaky(3), os.path, print]))).request("global", None, "x")
    assert all(type(v) is Remote for v in got)
    assert got[0] != 3 and not (got[0] == 3)


def test_a_masquerading_class_is_a_handle_never_the_starter_it_names():
    """Issue 32's masquerade: a learner class whose __module__/__qualname__ name a course starter used to
    be rebuilt by the judge as that starter; now it stays a handle, and a forged class value is refused."""
    class MyAllocator:
        pass

    MyAllocator.__module__, MyAllocator.__qualname__ = "paged_kv_course.starters.after_03", "AllocatorAfter03"
    got = Caller(FakeSession(reply(MyAllocator()))).request("global", None, "a")
    assert type(got) is Remote and "AllocatorAfter03" in object.__getattribute__(got, "_kind")
    for forged in ({"o": ["paged_kv_course.starters.after_03", "AllocatorAfter03", []]},
                   {"e": ["paged_kv_lib.errors", "Color", "RED"]},
                   {"o": ["os", "system", []]}, {"x": 1}):
        with pytest.raises(Refused, match="schema"):
            Caller(FakeSession(({"ok": forged}, []))).request("global", None, "a")


def test_a_reply_outside_the_schema_or_a_pickle_is_refused_in_one_line():
    for document in ({"ok": 1, "extra": 2}, {"raised": ["a", "b"]}, {"callback": {"op": "exec", "target": 0}},
                     ["ok", 1], {"ok": {"T": ["float32", [-1], 0]}}):
        with pytest.raises(wire.WireError):
            wire.check_reply(document)
    read, write = os.pipe()
    payload = pickle.dumps(("ok", print, []))
    os.write(write, struct.pack("!QI", len(payload), len(payload)) + payload)
    with pytest.raises(wire.WireError, match="not plain data"):
        wire.receive(read)
    os.close(read)
    os.close(write)


REPLIES = [
    {"ok": 1}, {"ok": None}, {"ok": "text"}, {"ok": [1, [2.5, None], {"t": [True]}]}, {"ok": {"h": [3, "mod.Cls"]}},
    {"ok": {"d": [[1, {"s": [2]}]]}}, {"ok": {"q": [[1], 4]}}, {"ok": {"T": ["float32", [2], 0]}},
    {"ok": [1], "changed": [[0, [1, 2]], ["k", {"fs": []}]]}, {"raised": ["builtins", "ValueError", "bad"]},
    {"timeout": True}, {"callback": {"op": "call", "target": 0, "args": [1], "kwargs": [["k", 2]]}},
    {"ok": {"a": [["name", 1]]}}, {"ok": [[[[]]]]},
    # refused
    {}, [], "ok", {"ok": 1, "raised": ["a", "b", "c"]}, {"ok": 1, "extra": 2}, {"timeout": False},
    {"timeout": True, "changed": []}, {"ok": {}}, {"ok": {"h": [0, "a"]}}, {"ok": {"h": [1, "a"], "t": []}},
    {"ok": {"t": 1}}, {"ok": {"b": -1}}, {"ok": [1, {"h": [1]}]}, {"ok": {"o": ["mod", "Cls", []]}},
    {"ok": {"T": ["float32", [2]]}}, {"raised": ["a", "b"]}, {"callback": {"op": "exec", "target": 0}},
    {"ok": "x" * (wire.MAX_STR + 1)}, {"ok": {"a": [["1bad", 1]]}}, {"ok": 1, "changed": [[0.5, 1]]},
]


@pytest.mark.parametrize("document", REPLIES, ids=lambda d: str(d)[:40])
def test_the_fast_check_agrees_with_the_schema(document):
    """check_reply picks the ``oneOf`` branch by the reply's key and checks it with a compiled validator; the
    verdict must be the schema's own, as jsonschema reads it."""
    import jsonschema

    expected = jsonschema.Draft7Validator(wire.REPLY_SCHEMA).is_valid(document)
    try:
        wire.check_reply(document)
        accepted = True
    except wire.WireError:
        accepted = False
    assert accepted == expected


def test_a_reply_over_a_bound_is_skipped_and_the_next_one_is_read():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a writer, so a large message cannot fill the pipe and block the test
        os.close(read)
        big = b"x" * (wire.MAX_JSON_BYTES + 10)
        os.write(write, wire.HEADER.pack(len(big), len(big)) + big)
        wire.send(write, {"ok": 7}, [])
        os._exit(0)
    os.close(write)
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.receive(read)
    assert wire.receive(read) == ({"ok": 7}, [])
    os.waitpid(pid, 0)
    os.close(read)


@pytest.mark.parametrize("document", [
    {"ok": {"s": [k * (2 ** 61 - 1) for k in range(1, 2000)]}},
    {"ok": {"d": [[k * (2 ** 61 - 1), 0] for k in range(1, 2000)]}},
])
def test_colliding_keys_are_refused(document):
    with pytest.raises(Refused, match="one hash"):
        Caller(FakeSession((document, []))).request("global", None, "x")


def test_deep_or_wide_replies_are_refused():
    deep = 1
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(Refused):
        Caller(FakeSession(({"ok": deep}, []))).request("global", None, "x")


def test_a_tensor_must_match_its_bytes():
    with pytest.raises(Refused, match="bytes do not fit"):
        Caller(FakeSession(({"ok": {"T": ["float32", [4], 0]}}, [b"abc"]))).request("global", None, "x")


def test_exceptions_arrive_by_name_only():
    from paged_kv_lib.errors import PagedKVError

    caller = Caller(FakeSession(({"raised": ["builtins", "ValueError", "bad"]}, []),
                                ({"raised": ["evil", "Boom", "x"]}, []),
                                ({"raised": ["paged_kv_lib.errors", "PagedKVError", "lib"]}, [])))
    for want in (ValueError, RuntimeError, PagedKVError):
        with pytest.raises(want):
            caller.request("call", 1)


def test_changed_state_is_written_onto_the_judges_own_objects_not_a_rebuilt_class():
    """A call that changed a list, a tensor or a library object sent by value: the new state comes back
    as data (``a``: attributes) and lands on the judge's own objects, whose classes the judge chose."""
    from paged_kv_lib.simulate import StepSnapshot

    values, cache = [1], torch.zeros(2)
    snap = StepSnapshot(1, 2, 3, 4, 5, 6, 7, 8)
    changed = [[0, [1, 99]], [1, {"T": ["float32", [2], 0]}], [2, {"a": [["step", 42]]}]]
    caller = Caller(FakeSession(({"ok": None, "changed": changed}, [torch.ones(2).numpy().tobytes()])))
    caller.request("call", 1, "", (values, cache, snap))
    assert values == [1, 99] and torch.equal(cache, torch.ones(2)) and snap.step == 42
    assert type(snap) is StepSnapshot and Attrs is not StepSnapshot
    sent = caller.session.sent[0]["args"]
    assert sent[2]["o"][:2] == ["paged_kv_lib.simulate.metrics", "StepSnapshot"]  # by value, to the kernel only


def test_learner_text_in_a_report_loses_its_control_characters():
    text = "fine\n\x1b[2K\rPASSED 90.1 \x1b]8;;http://x\x07link\x1b]52;c;ZXZpbA==\x07 \u202egnp.exe\x9b"
    out = wire.escape(text)
    assert "\n" in out and not any(ch in out for ch in "\x1b\x07\r\x9b\u202e")
    assert "\\x1b" in out and "PASSED 90.1" in out
