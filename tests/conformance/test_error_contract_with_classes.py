"""The error contract of ``simulate_with_classes``, the simulation with a learner's class among the allocators:
every bad input raises a ``PagedKVError`` subclass naming the value and the limit, before the learner's class
is ever built."""

from __future__ import annotations

import pytest

from paged_kv_course.conformance import simulate_with_classes
from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, PagedKVError
from paged_kv_lib.simulate import requests_from_lengths

W = requests_from_lengths([(3, 4), (5, 2), (2, 6)], seed=1)


class Book:
    """A minimal learner-style allocator; only its class is passed, the cases fail before it runs."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        raise AssertionError("a refused call must not build the learner's allocator")


CASES = [
    # the learner's class in the simulation
    ("with classes a lone string", lambda: simulate_with_classes(W, 100, "paged"), InvalidTypeError,
     r"write \['paged'\]"),
    ("with classes not a class", lambda: simulate_with_classes(W, 100, [3]), InvalidTypeError,
     r"allocators holds 3: expected one of .*or an allocator class"),
    ("with classes unknown name", lambda: simulate_with_classes(W, 100, ["pagd", Book]), InvalidArgumentError,
     r"'pagd'.*or pass a class"),
    ("with classes no block size", lambda: simulate_with_classes(W, 100, [Book], []), InvalidArgumentError,
     r"at least 1 value"),
    ("with classes block past capacity", lambda: simulate_with_classes(W, 8, [Book], 16), InvalidArgumentError,
     r"block_size 16 is larger than the capacity of 8"),
    ("with classes not a workload", lambda: simulate_with_classes([(1, 2)], 100, [Book]), InvalidTypeError,
     r"must be a Workload.*list"),
    ("with classes unknown fit", lambda: simulate_with_classes(W, 100, [Book], fit="any"), InvalidArgumentError,
     r"fit must be one of .*got 'any'"),
]


@pytest.mark.parametrize("name, call, error, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_a_typed_error_naming_value_and_limit(name, call, error, pattern):
    with pytest.raises(error, match=pattern) as caught:
        call()
    assert isinstance(caught.value, PagedKVError)
    builtin = TypeError if issubclass(error, InvalidTypeError) else ValueError
    assert isinstance(caught.value, builtin), f"{name}: {type(caught.value).__name__} is not a {builtin.__name__}"


def test_a_refused_run_never_builds_the_learners_allocator():
    # Book raises if it is ever instantiated: every check above runs before the first simulation.
    with pytest.raises(InvalidArgumentError):
        simulate_with_classes(W, 100, [Book, "pagd"])
