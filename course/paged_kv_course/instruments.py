"""Instruments the exercise checks hand to a learner's code: plain library objects that keep a record.

A check that must see *how* learner code used something (which chunks reached the model, how
many list entries a function read) passes one of these in place of the plain object. They live
outside :mod:`paged_kv_course.grading` because, under official grading, the learner's code runs in
a kernel where the grading package is not importable: there these classes are rebuilt from the
values the check sent, and the record they keep comes back to the check with the call's result.
They implement nothing an exercise asks for.
"""

from __future__ import annotations

from typing import Any, List


class CountingList:
    """A list of ints that counts how many entries a function reads (to tell O(1) from a walk).

    Indexing, assignment, ``len``, iteration, ``in``, ``index`` and ``count`` behave as on a
    list; reads are counted (a slice, a scan or an iteration counts every entry). A plain
    object holding a list, so its state comes back to the check after a judged call too.
    """

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
