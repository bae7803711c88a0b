"""Instruments the exercise checks hand to a learner's code: plain library objects that keep a record.

A check that must see *how* learner code used something (which chunks reached the model, how
many list entries a function read) passes one of these in place of the plain object. Under
official grading the judge *serves* them: they stay in the judge's process, every use the
learner's code makes of one is a request the judge answers (:mod:`.grading.remote`), so the
record is kept where the learner's code cannot rewrite it, and the attributes named in
``__paged_kv_private__`` (the record itself) are not lent at all. They implement nothing an
exercise asks for.
"""

from __future__ import annotations

from typing import Any, List


class CountingList:
    """A list of ints that counts how many entries a function reads (to tell O(1) from a walk).

    Indexing, assignment, ``len``, iteration, ``in``, ``index`` and ``count`` behave as on a
    list; reads are counted (a slice, a scan or an iteration counts every entry). ``values``
    (the list itself) is the check's, not lent to the learner's code: reading it would be uncounted.
    """

    __paged_kv_private__ = ("values", "reads")

    def __init__(self, values: List[int]) -> None:
        self.values = list(values)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        got = self.values[index]
        self.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __setitem__(self, index: Any, value: Any) -> None:
        self.values[index] = value

    def __iter__(self) -> Any:
        self.reads += len(self.values)
        return iter(list(self.values))

    def __contains__(self, value: object) -> bool:
        self.reads += len(self.values)
        return value in self.values

    def index(self, *args: Any) -> int:
        self.reads += len(self.values)
        return self.values.index(*args)

    def count(self, value: Any) -> int:
        self.reads += len(self.values)
        return self.values.count(value)

    def copy(self) -> List[int]:
        self.reads += len(self.values)
        return list(self.values)

    def __eq__(self, other: object) -> bool:
        self.reads += len(self.values)
        return self.values == (other.values if isinstance(other, CountingList) else other)

    def __repr__(self) -> str:
        return repr(self.values)
