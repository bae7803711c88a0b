"""The O(1) free queue against a plain list model, operation by operation."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv_lib import EmptyFreeQueueError, FreeBlockQueue, InvalidArgumentError, InvalidTypeError, PagedKVError

N = 12


def test_basic_order_and_removal():
    q = FreeBlockQueue(5, range(5))
    assert list(q) == [0, 1, 2, 3, 4] and len(q) == 5
    q.remove(2)
    assert list(q) == [0, 1, 3, 4] and 2 not in q and 3 in q
    assert q.popleft() == 0
    q.append(2)
    q.appendleft(0)
    assert list(q) == [0, 1, 3, 4, 2]
    assert q.peek() == 0
    q.check()


def test_errors():
    q = FreeBlockQueue(3)
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(1)
    q.append(1)
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(1)
    assert "x" not in q and -1 not in q and 7 not in q


class QueueMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.q = FreeBlockQueue(N)
        self.model: list = []

    @rule(block=st.integers(0, N - 1))
    def append(self, block):
        if block in self.model:
            with pytest.raises(ValueError):
                self.q.append(block)
        else:
            self.q.append(block)
            self.model.append(block)

    @rule(block=st.integers(0, N - 1))
    def appendleft(self, block):
        if block not in self.model:
            self.q.appendleft(block)
            self.model.insert(0, block)

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self):
        assert self.q.popleft() == self.model.pop(0)

    @rule(block=st.integers(0, N - 1))
    def remove(self, block):
        if block in self.model:
            self.q.remove(block)
            self.model.remove(block)
        else:
            with pytest.raises(ValueError):
                self.q.remove(block)

    @rule(n=st.integers(0, 4))
    def pop_many(self, n):
        if n > len(self.model):
            with pytest.raises(IndexError):
                self.q.pop_many(n)
        else:
            assert self.q.pop_many(n) == self.model[:n]
            del self.model[:n]

    @rule(blocks=st.lists(st.integers(0, N - 1), max_size=4))
    def extend(self, blocks):
        if any(b in self.model for b in blocks) or len(set(blocks)) < len(blocks):
            with pytest.raises(InvalidArgumentError):
                self.q.extend(blocks)  # refused whole: the invariant below checks nothing was linked
            return
        self.q.extend(blocks)
        self.model.extend(blocks)

    @invariant()
    def matches_model(self):
        assert list(self.q) == self.model
        assert len(self.q) == len(self.model)
        assert all((b in self.q) == (b in self.model) for b in range(N))
        self.q.check()


TestQueueMachine = QueueMachine.TestCase


def test_pop_many_and_extend():
    q = FreeBlockQueue(6, range(6))
    assert q.pop_many(0) == [] and len(q) == 6
    assert q.pop_many(4) == [0, 1, 2, 3] and list(q) == [4, 5]
    q.extend([2, 0])
    assert list(q) == [4, 5, 2, 0] and len(q) == 4
    with pytest.raises(IndexError):
        q.pop_many(5)
    with pytest.raises(InvalidArgumentError, match="block 5 is already"):
        q.extend([1, 5])
    assert list(q) == [4, 5, 2, 0] and len(q) == 4, "a refused extend links nothing"
    q.check()
    with pytest.raises(InvalidArgumentError, match="block 1 appears twice"):
        q.extend([1, 3, 1])
    assert list(q) == [4, 5, 2, 0] and 1 not in q and 3 not in q
    q.extend([1])
    assert q.pop_many(5) == [4, 5, 2, 0, 1] and len(q) == 0
    q.extend([])
    q.check()


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda q: q.append(True), InvalidTypeError, "must be an int, got bool"),
        (lambda q: q.appendleft(1.0), InvalidTypeError, "must be an int"),
        (lambda q: q.append(-1), InvalidArgumentError, "block -1 is out of range"),
        (lambda q: q.append(4), InvalidArgumentError, "block 4 is out of range: the queue holds ids 0..3"),
        (lambda q: q.remove(4), InvalidArgumentError, "out of range"),
        (lambda q: q.remove(-1), InvalidArgumentError, "out of range"),
        (lambda q: q.remove(3), InvalidArgumentError, "block 3 is not in the free queue"),
        (lambda q: q.extend([3, 9]), InvalidArgumentError, "block 9 is out of range"),
        (lambda q: q.extend([3, False]), InvalidTypeError, "bool"),
        (lambda q: q.extend([3, 0]), InvalidArgumentError, "block 0 is already"),
        (lambda q: q.pop_many(-1), InvalidArgumentError, "n must be >= 0, got -1"),
        (lambda q: q.pop_many(4), EmptyFreeQueueError, "pop 4 from a free queue of 3"),
        (lambda q: q.pop_many(1.0), InvalidTypeError, "n must be an int"),
    ],
)
def test_bad_ids_are_refused_with_typed_errors_and_change_nothing(call, exc, msg):
    q = FreeBlockQueue(4, [2, 0, 1])
    with pytest.raises(exc, match=msg):
        call(q)
    assert issubclass(exc, PagedKVError)
    assert list(q) == [2, 0, 1] and len(q) == 3
    q.check()


def test_empty_pops_are_index_errors():
    q = FreeBlockQueue(2)
    for call in (q.popleft, q.peek, lambda: q.pop_many(1)):
        with pytest.raises(EmptyFreeQueueError) as info:
            call()
        assert isinstance(info.value, IndexError)
    with pytest.raises(InvalidTypeError):
        FreeBlockQueue(True)
