"""paged_kv_course.stand_in: the one way to tell the judge's proxy for a learner object from anything else."""

from __future__ import annotations

from paged_kv_course import stand_in
from paged_kv_course.grading import _common
from paged_kv_course.grading.remote import Remote


def proxy(kind: str) -> Remote:
    return Remote(None, 7, kind)  # type: ignore[arg-type] - no kernel behind it: nothing is asked of it


def test_the_judges_proxy_is_a_stand_in_and_says_what_it_stands_for():
    cls, obj = proxy("builtins.type"), proxy("__main__.MyAllocator")
    assert stand_in.is_stand_in(cls) and stand_in.is_stand_in(obj)
    assert stand_in.stand_in_kind(cls) == "builtins.type" and stand_in.is_stand_in_class(cls)
    assert not stand_in.is_stand_in_class(obj)
    assert _common.under_judge(obj), "the checks' question is the same question"


def test_nothing_else_is_a_stand_in_whatever_its_module_or_attributes_claim():
    class Remote:  # a learner's look-alike: the module name and a forwarded attribute are not the mark
        _kind = "builtins.type"

        def __getattr__(self, name):
            return True

    Remote.__module__ = "paged_kv_course.grading.remote"
    for value in (Remote(), Remote, 3, None, type, proxy):
        assert not stand_in.is_stand_in(value) and stand_in.stand_in_kind(value) is None
        assert not _common.under_judge(value)
