"""The O(1) free queue against a plain list model, operation by operation."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv_lib import FreeBlockQueue

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

    @rule(blocks=st.lists(st.integers(0, N - 1), max_size=4, unique=True))
    def extend(self, blocks):
        if any(b in self.model for b in blocks):
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
    with pytest.raises(ValueError, match="block 5 is already"):
        q.extend([1, 5])
    assert list(q) == [4, 5, 2, 0, 1] and len(q) == 5  # what came before the bad id is linked
    assert q.pop_many(5) == [4, 5, 2, 0, 1] and len(q) == 0
    q.extend([])
    q.check()
