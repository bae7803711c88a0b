"""The in-notebook probe (delegation.guarded): a check cell fails on forbidden library code as the grade does.

Learner code is built the way a notebook builds it (cells run in a ``__main__``
namespace), then handed to a guarded check. Each delegation issue 22 names must fail with
the one line the static scan gives; the learner's own code (using allowed imports and an
earlier starter) must reach the check untouched; the wrapper must look like the check.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict

import pytest

import paged_kv_lib.grading as grading
from paged_kv_lib import stand_in
from paged_kv_lib.grading import delegation, scan
from paged_kv_lib.grading._common import CheckFailure

FORBIDDEN = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.allocator",
    "paged_kv_lib.prefix_cache",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.attention.triton_kernel",
    "paged_kv_lib.course.starters.after_06",
)


def cell(source: str) -> Dict[str, Any]:
    """Run ``source`` as a notebook cell runs: in a ``__main__`` namespace."""
    namespace: Dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - test input, written here
    return namespace


def a_check(value, *more, label="x"):
    """Accept anything (the probe runs first)."""
    return ("checked", value)


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: FORBIDDEN)
    return delegation.guarded(a_check, "checks_06")


DELEGATIONS = {
    "subclassing a starter": (
        "from paged_kv_lib.course.starters.after_06 import AllocatorAfter06\n"
        "class MyAllocator(AllocatorAfter06):\n    pass\n", "MyAllocator"),
    "aliasing a starter": (
        "from paged_kv_lib.course.starters.after_06 import AllocatorAfter06 as MyAllocator\n", "MyAllocator"),
    "a wrapper holding the library allocator": (
        "from paged_kv_lib.allocator import PagedKVCacheAllocator\n"
        "class MyAllocator:\n"
        "    def __init__(self, num_blocks, block_size):\n"
        "        self._inner = PagedKVCacheAllocator(num_blocks, block_size, 1, 1)\n"
        "    def fork(self, parent, child):\n"
        "        return self._inner.fork(parent, child)\n", "MyAllocator"),
    "an instance holding the library allocator": (
        "from paged_kv_lib import PagedKVCacheAllocator as P\n"
        "class Box:\n    pass\n"
        "box = Box()\nbox.inner = P.__new__(P)\n", "box"),
    "a wrapper through a global": (
        "from paged_kv_lib.allocator import PagedKVCacheAllocator\n"
        "INNER = PagedKVCacheAllocator.__new__(PagedKVCacheAllocator)\n"
        "class MyAllocator:\n"
        "    def num_free_blocks(self):\n"
        "        return INNER.num_free_blocks()\n", "MyAllocator"),
    "a library method bound onto the class": (
        "from paged_kv_lib.course.starters.after_06 import AllocatorAfter06 as S\n"
        "class MyAllocator:\n    append_tokens = S.append_tokens\n", "MyAllocator"),
    "the reference function itself": (
        "from paged_kv_lib.attention.triton_kernel import tiles\n"
        "tile_addresses = tiles._kv_tile_offsets\n", "tile_addresses"),
    "a function calling the reference": (
        "from paged_kv_lib.attention.triton_kernel import _kv_tile_offsets as reference_addresses\n"
        "def tile_addresses(*args):\n    return reference_addresses(*args)\n", "tile_addresses"),
    "block_key called from a solution": (
        "import paged_kv_lib\n"
        "class MyAllocator:\n"
        "    def key(self, parent, tokens):\n"
        "        return paged_kv_lib.prefix_cache.block_key(parent, tokens)\n", "MyAllocator"),
    "a FreeBlockQueue built inside": (
        "def make_queue(prev, nxt):\n"
        "    from paged_kv_lib.block_manager import FreeBlockQueue\n"
        "    return FreeBlockQueue(len(prev))\n", "make_queue"),
    "a closure over the library": (
        "from paged_kv_lib.prefix_cache import block_key\n"
        "def outer(k=None):\n"
        "    key = block_key\n"
        "    def inner(p, t):\n        return key(p, t)\n"
        "    return inner\n"
        "fn = outer()\n", "fn"),
    "a bound method of a wrapper": (
        "from paged_kv_lib.allocator import PagedKVCacheAllocator as P\n"
        "class W:\n"
        "    def __init__(self):\n        self.inner = P.__new__(P)\n"
        "    def fork(self, a, b):\n        return None\n"
        "w = W()\nfork = w.fork\n", "fork"),
}


@pytest.mark.parametrize("name", sorted(DELEGATIONS))
def test_each_delegation_fails_the_check_with_one_line(guarded, name):
    source, value = DELEGATIONS[name]
    learner = cell(source)[value]
    with pytest.raises(CheckFailure) as info:
        guarded(learner)
    line = str(info.value)
    assert "\n" not in line and line.startswith("uses paged_kv_lib.")
    assert "implements what exercise 06 grades" in line
    assert info.value._render_traceback_() == [line], "a notebook shows the line, not a traceback"


@pytest.mark.parametrize("name", sorted(DELEGATIONS))
def test_the_probe_and_the_scan_say_the_same_line(guarded, name):
    source, value = DELEGATIONS[name]
    with pytest.raises(CheckFailure) as info:
        guarded(cell(source)[value])
    assert scan.scan_source(source, FORBIDDEN, "06")[0] == str(info.value)


def test_the_learners_own_code_reaches_the_check(guarded):
    source = (
        "import collections, torch\n"
        "from paged_kv_lib.errors import OutOfBlocksError\n"
        "from paged_kv_lib.block import cdiv\n"
        "from paged_kv_lib.course.starters import __name__ as starters\n"
        "class Base:\n    block_size = 4\n"
        "class MyAllocator(Base):\n"
        "    def __init__(self, n, b):\n"
        "        self.free = collections.deque(range(n))\n"
        "        self.ref_counts = [0] * n\n"
        "        self.tables = {}\n"
        "    def need(self, tokens):\n"
        "        if tokens < 0:\n            raise OutOfBlocksError('x')\n"
        "        return cdiv(tokens, self.block_size) + int(torch.zeros(1).sum())\n"
        "    @staticmethod\n    def helper():\n        return MyAllocator\n"
        "    @property\n    def size(self):\n        return len(self.free)\n"
        "a = MyAllocator(4, 2)\n"
    )
    namespace = cell(source)
    assert guarded(namespace["MyAllocator"], namespace["a"], label=3) == ("checked", namespace["MyAllocator"])
    assert guarded(5, [1, 2], {"x": b"y"}) == ("checked", 5)


def test_an_earlier_starter_is_allowed(monkeypatch):
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: ("paged_kv_lib.course.starters.after_05",))
    check = delegation.guarded(a_check, "checks_05")
    learner = cell("from paged_kv_lib.block import BlockTable\nclass MyAllocator(BlockTable):\n    pass\n")
    assert check(learner["MyAllocator"])[0] == "checked"


def test_the_judges_stand_ins_are_never_touched(guarded):
    class Remote:
        """Like the judge's proxy for a learner object: every attribute is a request to the kernel."""

        def __getattribute__(self, name):
            raise AssertionError(f"the probe read {name!r} of a remote object")

    setattr(Remote, stand_in.MARK, True)  # what marks the judge's own proxy class (paged_kv_lib.stand_in)
    assert guarded(Remote())[0] == "checked"


def test_the_wrapper_looks_like_the_check(guarded):
    assert guarded.__name__ == "a_check" and guarded.__doc__ == a_check.__doc__
    assert inspect.signature(guarded) == inspect.signature(a_check)
    assert guarded.__wrapped__ is a_check


def test_an_exercise_without_forbidden_modules_gets_the_check_itself(monkeypatch):
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: ())
    assert delegation.guarded(a_check, "checks_02") is a_check


def test_checks_fetched_from_the_package_are_guarded(monkeypatch):
    name = next(n for n in grading._CHECKS if grading._CHECKS[n] == "checks_02")
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: FORBIDDEN)
    monkeypatch.delitem(vars(grading), name, raising=False)
    check = getattr(grading, name)
    original = getattr(__import__(f"paged_kv_lib.grading.{grading._CHECKS[name]}", fromlist=[name]), name)
    assert check is not original and check.__wrapped__ is original
    assert inspect.signature(check) == inspect.signature(original) and check.__doc__ == original.__doc__
    learner = cell("from paged_kv_lib.course.starters.after_06 import AllocatorAfter06 as MyAllocator\n")
    with pytest.raises(CheckFailure, match="^uses paged_kv_lib.course.starters.after_06: "):
        check(learner["MyAllocator"])
    monkeypatch.delitem(vars(grading), name)


@pytest.mark.parametrize("name, number", [("06_sharing", "06"), ("checks_09", "09"), ("03.1", "03"),
                                          ("paged_kv_lib.grading.checks_04", "04")])
def test_exercise_numbers(name, number):
    assert delegation.exercise_number(name) == number


def test_a_name_without_a_number_is_refused():
    with pytest.raises(ValueError, match="names no exercise"):
        delegation.exercise_number("sharing")


def test_the_exercise_authors_helper_sees_the_refusal(guarded):
    from tests.exercises.check_helpers import refused

    learner = cell(DELEGATIONS["aliasing a starter"][0])["MyAllocator"]
    assert refused(guarded, learner, "paged_kv_lib.course.starters.after_06").endswith("are allowed)")
