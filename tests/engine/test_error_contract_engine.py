"""The engine's side of the error contract: every bad input raises a typed error and changes nothing.

Each refused call must raise a :class:`PagedKVError` subclass that is also the built-in a
caller expects (``ValueError``, ``TypeError``, ``KeyError``), name the bad value in its
message, and leave the engine (its queue, its running requests, its totals, the ids it hands
out next) and its allocator (every table, count and cache tensor) as they were.
"""

from __future__ import annotations

import dataclasses

import pytest

from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.engine import Engine, RequestTooLargeError, UnknownRequestError
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, PagedKVError
from paged_kv_lib.model import ModelConfig, TinyTransformer

from helpers import assert_same_state, snapshot



@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), seed=5).eval()


def busy(model: TinyTransformer) -> Engine:
    """An engine with a request running (its blocks held) and one queued behind it."""
    engine = Engine(model, model.new_allocator(16, 4, num_cpu_blocks=8), max_batch_size=2,
                    preemption_mode="swap")
    engine.add_request("a running prompt", 6)
    engine.step()
    engine.add_request([1, 2, 3], 4, n=2, temperature=0.5, seed=1)
    return engine


def state(engine: Engine) -> dict:
    """What the engine shows: its queues (ids, states, outputs), totals, settings and the allocator's state."""
    def requests(rs):
        return [(r.request_id, r.status, r.num_preemptions, [list(s.output) for s in r.samples]) for r in rs]

    return {
        "queue": requests(engine.queue),
        "running": requests(engine.running),
        "totals": dataclasses.asdict(engine.totals),
        "settings": (engine.max_batch_size, engine.watermark, engine.preemption_mode, engine.max_num_batched_tokens),
        "allocator": snapshot(engine.allocator),
    }


def assert_unchanged(engine: Engine, before: dict) -> None:
    after = state(engine)
    allocator_before, allocator_after = before.pop("allocator"), after.pop("allocator")
    assert_same_state(allocator_before, allocator_after)
    assert after == before
    # The next request gets the id it would have got: no refused request took one.
    queued = [r.request_id for r in engine.queue] + [r.request_id for r in engine.running]
    assert engine.add_request([1], 1) == max(queued) + 1


# (label, call on a busy engine, typed error, the built-in it must also be, a fragment of the message)
BAD_CALLS = [
    ("prompt bytes", lambda e: e.add_request(b"abc", 4), InvalidTypeError, TypeError, "bytes"),
    ("prompt an int", lambda e: e.add_request(123, 4), InvalidTypeError, TypeError, "123"),
    ("prompt empty", lambda e: e.add_request([], 4), InvalidArgumentError, ValueError, "at least one"),
    ("token id negative", lambda e: e.add_request([1, -1], 4), InvalidArgumentError, ValueError, "-1"),
    ("token id past the vocabulary", lambda e: e.add_request([1, 300], 4), InvalidArgumentError, ValueError, "300"),
    ("token id a str", lambda e: e.add_request([1, "a"], 4), InvalidTypeError, TypeError, "'a'"),
    ("token id a bool", lambda e: e.add_request([True], 4), InvalidTypeError, TypeError, "True"),
    ("max_new_tokens 0", lambda e: e.add_request("hi", 0), InvalidArgumentError, ValueError, "got 0"),
    ("max_new_tokens a float", lambda e: e.add_request("hi", 1.5), InvalidTypeError, TypeError, "1.5"),
    ("n 0", lambda e: e.add_request("hi", 2, n=0), InvalidArgumentError, ValueError, "got 0"),
    ("n past max_batch_size", lambda e: e.add_request("hi", 2, n=3), InvalidArgumentError, ValueError, "max_batch_size is 2"),
    ("n a str", lambda e: e.add_request("hi", 2, n="2"), InvalidTypeError, TypeError, "'2'"),
    ("temperature negative", lambda e: e.add_request("hi", 2, temperature=-1.0), InvalidArgumentError, ValueError, "-1.0"),
    ("temperature nan", lambda e: e.add_request("hi", 2, temperature=float("nan")), InvalidArgumentError, ValueError, "nan"),
    ("temperature a str", lambda e: e.add_request("hi", 2, temperature="hot"), InvalidTypeError, TypeError, "hot"),
    ("seed negative", lambda e: e.add_request("hi", 2, seed=-3), InvalidArgumentError, ValueError, "-3"),
    ("seed a float", lambda e: e.add_request("hi", 2, seed=0.5), InvalidTypeError, TypeError, "0.5"),
    ("request too large", lambda e: e.add_request(list(range(60)), 8), RequestTooLargeError, ValueError, "only 16"),
    ("generate: unknown option", lambda e: e.generate(["hi"], 2, top_k=3), InvalidTypeError, TypeError, "top_k"),
    ("generate: prompts not iterable", lambda e: e.generate(5, 2), InvalidTypeError, TypeError, "5"),
    ("generate: one bad prompt of two", lambda e: e.generate(["fine", b"x"], 2), InvalidTypeError, TypeError, "bytes"),
    ("generate: bad max_new_tokens", lambda e: e.generate(["fine"], -2), InvalidArgumentError, ValueError, "-2"),
    ("stream: unknown option", lambda e: e.stream(["hi"], 2, beam=2), InvalidTypeError, TypeError, "beam"),
    ("stream: one bad prompt of two", lambda e: e.stream(["fine", []], 2), InvalidArgumentError, ValueError, "at least"),
    ("abort: never issued", lambda e: e.abort_request(99), UnknownRequestError, KeyError, "99"),
    ("abort: negative", lambda e: e.abort_request(-1), InvalidArgumentError, ValueError, "-1"),
    ("abort: a str", lambda e: e.abort_request("0"), InvalidTypeError, TypeError, "'0'"),
    ("abort: a bool", lambda e: e.abort_request(True), InvalidTypeError, TypeError, "True"),
]


@pytest.mark.parametrize("label, call, error, builtin, fragment", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_a_bad_call_is_typed_named_and_changes_nothing(model, label, call, error, builtin, fragment) -> None:
    engine = busy(model)
    before = state(engine)
    with pytest.raises(error) as info:
        call(engine)
    assert isinstance(info.value, PagedKVError) and isinstance(info.value, builtin)
    assert fragment in str(info.value), str(info.value)
    assert_unchanged(engine, before)


# (label, options for Engine(model, allocator, ...), typed error, built-in, fragment)
BAD_OPTIONS = [
    ("max_batch_size 0", {"max_batch_size": 0}, InvalidArgumentError, ValueError, "got 0"),
    ("max_batch_size a float", {"max_batch_size": 2.0}, InvalidTypeError, TypeError, "2.0"),
    ("max_batch_size a bool", {"max_batch_size": True}, InvalidTypeError, TypeError, "True"),
    ("watermark negative", {"watermark": -0.1}, InvalidArgumentError, ValueError, "-0.1"),
    ("watermark past 1", {"watermark": 1.5}, InvalidArgumentError, ValueError, "1.5"),
    ("watermark keeping every block", {"watermark": 1.0}, InvalidArgumentError, ValueError, "16 blocks"),
    ("watermark a str", {"watermark": "0.1"}, InvalidTypeError, TypeError, "'0.1'"),
    ("watermark a bool", {"watermark": False}, InvalidTypeError, TypeError, "False"),
    ("preemption_mode unknown", {"preemption_mode": "sometimes"}, InvalidArgumentError, ValueError, "sometimes"),
    ("preemption_mode not a str", {"preemption_mode": 1}, InvalidArgumentError, ValueError, "got 1"),
    ("max_num_batched_tokens 0", {"max_num_batched_tokens": 0}, InvalidArgumentError, ValueError, "got 0"),
    ("max_num_batched_tokens a float", {"max_num_batched_tokens": 8.0}, InvalidTypeError, TypeError, "8.0"),
    ("max_num_batched_tokens a bool", {"max_num_batched_tokens": True}, InvalidTypeError, TypeError, "True"),
]


@pytest.mark.parametrize("label, options, error, builtin, fragment", BAD_OPTIONS, ids=[c[0] for c in BAD_OPTIONS])
def test_bad_engine_options_are_typed_and_leave_the_allocator_alone(model, label, options, error, builtin,
                                                                   fragment) -> None:
    alloc = model.new_allocator(16, 4)
    alloc.allocate_for_sequence(0, 5)
    before = snapshot(alloc)
    with pytest.raises(error) as info:
        Engine(model, alloc, **options)
    assert isinstance(info.value, PagedKVError) and isinstance(info.value, builtin)
    assert fragment in str(info.value), str(info.value)
    assert_same_state(before, snapshot(alloc))


def test_parts_that_are_not_a_model_or_an_engine_allocator_are_refused(model) -> None:
    alloc = model.new_allocator(16, 4)
    with pytest.raises(InvalidTypeError, match="TinyTransformer, got str"):
        Engine("a model", alloc)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="lacks .*'k_caches'"):  # bookkeeping alone: no tensors to read
        Engine(model, BlockManager(16, 4))  # type: ignore[arg-type]
    other = TinyTransformer(ModelConfig(num_layers=3), seed=1)
    with pytest.raises(InvalidArgumentError, match="does not fit this model") as info:
        Engine(other, alloc)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad, error", [(0, InvalidArgumentError), (-4, InvalidArgumentError),
                                        (2.5, InvalidTypeError), ("8", InvalidTypeError), (False, InvalidTypeError)])
def test_a_bad_budget_set_between_steps_is_refused_and_the_old_one_kept(model, bad, error) -> None:
    engine = busy(model)
    engine.max_num_batched_tokens = 7
    before = state(engine)
    with pytest.raises(error, match="max_num_batched_tokens"):
        engine.max_num_batched_tokens = bad
    assert_unchanged(engine, before)
    engine.max_num_batched_tokens = None  # back to no limit
    assert engine.max_num_batched_tokens > 10**9
