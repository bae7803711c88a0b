"""The judge's wire (issue 23): replies are data only, bounded before they are decoded.

Each test builds a reply the way a hostile kernel could (the kernel runs the learner's
code, so it can send any bytes) and checks that the judge either rebuilds plain values
with exact types or refuses the reply with one line, cheaply.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from collections import deque
from typing import Any, Callable, List

import pytest
import torch

from paged_kv_lib.errors import OutOfBlocksError
from paged_kv_course.grading import judge, stubs, wire, wire_decode

MIB = 1024 * 1024
LOAD_SLACK = 2  # the target is 2 s; this machine is shared, so the test allows twice that


def roundtrip(value: Any) -> Any:
    encoder = wire.Encoder({})
    payload = encoder.reply(encoder.encode(value))
    return wire_decode.decode_reply(payload, lambda key, kind: ("handle", key, kind))


def reply_of(document: Any, blobs: List[bytes] = ()) -> bytes:  # type: ignore[assignment]
    return wire.pack_reply(document, list(blobs))


def test_values_come_back_with_exact_types_and_their_aliasing():
    shared = [1, 2]
    value = {"a": [1, (2.5, "x", None, True)], "b": torch.arange(6, dtype=torch.int16).reshape(2, 3),
             "t": {0: shared, 1: shared}, "q": deque([3, 4], maxlen=5), "s": {1, 2}, "f": frozenset({"z"}),
             "raw": b"\x00\xff", "dt": torch.float16, "size": torch.Size([2, 3])}
    got = roundtrip(value)
    assert got["a"] == [1, (2.5, "x", None, True)] and type(got["a"][1]) is tuple
    assert type(got["b"]) is torch.Tensor and got["b"].dtype is torch.int16 and torch.equal(got["b"], value["b"])
    assert got["t"][0] == [1, 2] and got["t"][0] is got["t"][1]  # one list in the kernel is one list here
    assert type(got["q"]) is deque and got["q"].maxlen == 5 and list(got["q"]) == [3, 4]
    assert got["s"] == {1, 2} and type(got["f"]) is frozenset and got["raw"] == b"\x00\xff"
    assert got["dt"] is torch.float16 and got["size"] == torch.Size([2, 3])


def test_what_is_not_data_stays_in_the_kernel_behind_a_handle():
    class Anything(int):
        pass

    loop: List[Any] = []
    loop.append(loop)
    got = roundtrip([Anything(3), print, loop])
    assert got[0][0] == "handle" and got[0][2].endswith("Anything")
    assert got[1][0] == "handle"
    assert got[2][0][0] == "handle"  # a list that holds itself: the inner one stays behind


@pytest.mark.parametrize("document", [
    {"o": ["paged_kv_lib.allocator", "Block", []]},          # imported there, defined in paged_kv_lib.block
    {"o": ["paged_kv_lib.allocator", "torch.Tensor", []]},   # reached through a module the library imported
    {"o": ["paged_kv_course.grading.wire", "Decoder", []]},      # the grading package is never rebuilt
    {"o": ["paged_kv_lib.errors", "OutOfBlocksError", []]},  # exceptions travel as names, not values
    {"o": ["tempfile", "_TemporaryFileCloser", []]},
    {"o": ["paged_kv_lib.block", "Block", [["__class__", 1]]]},
    {"e": ["os", "environ", "x"]},
    {"dt": "__builtins__"},
    {"x": 1},
    {"h": ["1", "x"]},
])
def test_a_reply_that_names_a_class_it_may_not_is_refused(document):
    with pytest.raises(wire.WireError):
        wire_decode.decode_reply(reply_of(document), lambda key, kind: None)


def test_an_old_style_pickle_is_not_read_at_all():
    import pickle

    payload = pickle.dumps(("ok", "x", []))
    with pytest.raises(wire.WireError) as caught:
        wire.unpack_reply(payload)
    assert "\n" not in str(caught.value)


def _big(kind: str) -> bytes:
    """About 1 MiB of reply data of one shape (or the most a bound lets through)."""
    n = MIB
    if kind == "ints":
        return json.dumps(list(range(n // 8))).encode()
    if kind == "empty lists":
        return ("[" + ",".join(["[]"] * (n // 3)) + "]").encode()
    if kind == "empty dicts":
        return ("[" + ",".join(['{"d":[]}'] * (n // 9)) + "]").encode()
    if kind == "strings":
        return json.dumps(["x" * 100] * (n // 104)).encode()
    if kind == "one string":
        return json.dumps("y" * n).encode()
    if kind == "deep":
        return b"[" * (n // 2) + b"]" * (n // 2)
    if kind == "long int":
        return b"1" * n
    if kind == "colliding set":
        p = 2 ** 61 - 1
        return json.dumps({"s": [k * p for k in range(1, n // 22)]}).encode()
    if kind == "references":
        return json.dumps([[0] * 1000] + [{"r": 1}] * (n // 8)).encode()  # each one counts as 1000
    if kind == "lists at the value bound":
        count = wire.MAX_NODES // 2 - 10
        return ("[" + ",".join(["[]"] * count) + "]").encode()
    if kind == "nested 300 deep":
        return b"[" * 300 + b"]" * 300
    if kind == "floats":
        return json.dumps([1.5e300] * (n // 9)).encode()
    raise ValueError(kind)


SHAPES = ["ints", "empty lists", "empty dicts", "strings", "one string", "deep", "long int", "colliding set",
          "references", "floats", "lists at the value bound", "nested 300 deep"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_one_mib_reply_of_any_shape_is_cheap_or_refused_in_one_line(shape):
    text = _big(shape)
    head = b'{"v":' + text + b',"blobs":[]}'
    payload = wire.JSON_HEADER.pack(len(head)) + head

    def decode() -> str:
        try:
            wire_decode.decode_reply(payload, lambda key, kind: None)
            return "decoded"
        except wire.WireError as exc:
            return str(exc)

    start = time.perf_counter()
    outcome = decode()
    seconds = time.perf_counter() - start
    assert "\n" not in outcome and len(outcome) < 300
    tracemalloc.start()  # (slows allocation down a lot: measured apart from the time)
    decode()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{shape}: {outcome[:80]}: {seconds:.2f} s, peak {peak / MIB:.1f} MiB")
    assert peak < 100 * MIB, (shape, peak)
    assert seconds < 2 * LOAD_SLACK, (shape, seconds)


def test_a_tensor_must_match_its_bytes_and_is_read_without_a_copy():
    good = reply_of({"T": ["float32", [2, 2], 0]}, [torch.arange(4, dtype=torch.float32).numpy().tobytes()])
    got = wire_decode.decode_reply(good, lambda key, kind: None)
    assert got.tolist() == [[0, 1], [2, 3]]
    for bad in ({"T": ["float32", [3], 0]}, {"T": ["float32", [-1], 0]}, {"T": ["float32", [1], 5]},
                {"T": ["Tensor", [1], 0]}, {"T": ["float32", [2 ** 40, 2 ** 40], 0]}):
        with pytest.raises(wire.WireError):
            wire_decode.decode_reply(reply_of(bad, [b"\x00" * 8]), lambda key, kind: None)


def test_a_reply_over_the_size_limit_is_skipped_and_the_next_one_is_read():
    read_fd, write_fd = os.pipe()
    try:
        wire.send(write_fd, b"z" * 3000)
        wire.send(write_fd, reply_of("next"))
        with pytest.raises(wire.OversizeError) as caught:
            wire.receive(read_fd, limit=1000)
        assert "3000 bytes" in str(caught.value) and "\n" not in str(caught.value)
        assert wire_decode.decode_reply(wire.receive(read_fd, limit=1000), lambda k, n: None) == "next"
    finally:
        os.close(read_fd)
        os.close(write_fd)


class _FakeSession:
    def __init__(self, reply: list) -> None:
        self.reply = reply

    def request(self, message: Any, timeout: Any = None) -> Any:
        return self.reply, []


@pytest.mark.parametrize("reply, check", [
    (["raised", "builtins", "ValueError", "bad", [], []], lambda e: type(e) is ValueError and str(e) == "bad"),
    (["raised", "paged_kv_lib.errors", "OutOfBlocksError", "full", [], [["needed", 3], ["free", 1]]],
     lambda e: type(e) is OutOfBlocksError and e.needed == 3 and e.free == 1),
    (["raised", "__main__", "ValueError", "mine", [], []], lambda e: type(e) is RuntimeError),
    (["raised", "paged_kv_lib.errors", "Popen", "x", [], []], lambda e: type(e) is RuntimeError),
    (["raised", "builtins", "SystemExit", "x", [], []], lambda e: type(e) is RuntimeError),
])
def test_exceptions_are_rebuilt_by_name_only(reply, check: Callable[[BaseException], bool]):
    caller = judge.Caller(_FakeSession(reply))  # type: ignore[arg-type]
    with pytest.raises(BaseException) as caught:
        caller.request("call", ("handle", 1))
    assert check(caught.value), caught.value


def test_a_use_of_a_stubbed_module_fails_the_check_with_its_own_line():
    line = stubs.message("paged_kv_lib.allocator", "03")
    caller = judge.Caller(_FakeSession(["raised", "paged_kv_lib.allocator", stubs.ERROR_NAME, line, [], []]))  # type: ignore[arg-type]
    with pytest.raises(judge.Refused) as caught:
        caller.request("call", ("handle", 1))
    assert str(caught.value) == line


def test_a_check_modules_own_spy_comes_back_but_no_grader_machinery():
    got = wire_decode.decode_reply(reply_of({"o": ["paged_kv_course.instruments", "CountingList", []]}), lambda k, n: None)
    assert type(got).__name__ == "CountingList"
    for module, name in (("paged_kv_course.grading.judge", "Remote"), ("paged_kv_course.grading.sandbox", "SandboxSpec"),
                         ("paged_kv_course.grading.checks_06", "torch.Tensor")):
        with pytest.raises(wire.WireError):
            wire_decode.decode_reply(reply_of({"o": [module, name, []]}), lambda k, n: None)
