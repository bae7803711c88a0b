"""A scripted run of the learner's allocator, for the checks of exercises 02 and 03.

:class:`Script` makes calls on one learner allocator and records them as code, one call per
line, so that a failure prints the calls that led there in a form the learner can paste into a
cell. The expected values come from the library's ``BlockManager`` driven through the
same calls (:func:`library`, :func:`library_state`), never from stored answers.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from paged_kv_lib.block_manager import BlockManager
from ._common import CheckFailure, call_learner, expect_equal, fail, is_int, not_written, passed, show

Errors = Union[Type[BaseException], Tuple[Type[BaseException], ...]]
UNKNOWN_ID = "an unknown sequence id is a ValueError (a KeyError from your dict is not)"
STATE = ("free", "ref_counts", "tables", "lengths")


def library(num_blocks: int, block_size: int) -> BlockManager:
    """The library's allocator without tensors or prefix caching: the books the learner's class keeps."""
    return BlockManager(num_blocks, block_size, enable_prefix_caching=False)


def library_state(alloc: BlockManager) -> Dict[str, Any]:
    """A library allocator's books under the names "your allocator" uses (plain values)."""
    return {
        "free": list(alloc.free_blocks),
        "ref_counts": [b.ref_count for b in alloc.blocks],
        "tables": {s: alloc.get_block_mapping(s) for s in alloc.seq_ids},
        "lengths": {s: alloc.get_num_tokens(s) for s in alloc.seq_ids},
    }


def _code(method: str, args: Sequence[Any]) -> str:
    return f"a.{method}({', '.join(map(repr, args))})"


class Script:
    """Calls on one learner allocator, recorded as code, so that a failure says how to get there."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int, name: str = "MyAllocator") -> None:
        self.lines = [f"a = {name}({num_blocks}, {block_size})"]
        self.obj = call_learner(cls, (num_blocks, block_size), self.lines[0], "an allocator")

    def where(self, then: Optional[str] = None) -> str:
        """The last call (or ``then``, what is read after the calls) and, below it, every call as code."""
        lines = self.lines + ([then] if then else [])
        if len(lines) == 1:
            return lines[0]
        return f"{lines[-1]}   (the calls that led here, one per line; those marked refused raise:)\n    " + "\n    ".join(lines)

    def call(self, method: str, *args: Any, expected: Any = None, hint: str = "") -> Any:
        self.lines.append(_code(method, args))
        fn = self.attribute(method)
        if not hint:
            return call_learner(fn, args, self.where(), expected)
        try:
            return fn(*args)
        except CheckFailure:
            raise
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except Exception as exc:
            raise fail(self.where(), "no error" if expected is None else expected,
                       f"it raised {type(exc).__name__}: {exc}", hint) from None

    def attribute(self, name: str) -> Any:
        try:
            return getattr(self.obj, name)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except AttributeError:
            raise fail(self.where(f"a.{name}"), f"the attribute or method {name}", "no such attribute",
                       f"keep the state and the method names the contract gives (a.{name}): later exercises "
                       "build on them") from None
        except CheckFailure:
            raise
        except Exception as exc:  # the learner's property raised
            raise fail(self.where(f"a.{name}"), "a value", f"it raised {type(exc).__name__}: {exc}",
                       "reading this attribute must not raise") from None

    def refused(self, method: str, args: Tuple[Any, ...], errors: Errors, *, accepted: str, other: str = "") -> None:
        """The call must raise one of ``errors``; ``accepted`` names the mistake when it returned instead."""
        call = self.where(_code(method, args))
        names = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
        fn = self.attribute(method)
        try:
            got = fn(*args)
        except CheckFailure:
            raise
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except errors:
            self.lines.append(f"{_code(method, args)}  # refused")
            return
        except Exception as exc:
            raise fail(call, f"a {names}", f"it raised {type(exc).__name__}: {exc}",
                       other or f"{accepted} (you raised {type(exc).__name__}: the contract's error here is a "
                                f"{names})") from None
        raise fail(call, f"a {names}", f"it returned {show(got)}", accepted)

    def free_count(self, want: int, hint: str) -> None:
        got = self.attribute("num_free_blocks")
        where = self.where("a.num_free_blocks")
        if callable(got):
            raise fail(where, want, "a method", "num_free_blocks is read without calling it: make it an attribute "
                                                "or a @property")
        if not is_int(got):
            raise fail(where, want, got, "num_free_blocks is an int")
        expect_equal(where, want, got, hint)

    def mapping(self, seq_id: int, want: List[int], hint: Union[str, Callable[[List[int]], str]]) -> None:
        where = self.where(f"a.get_block_mapping({seq_id})")
        got = call_learner(self.attribute("get_block_mapping"), (seq_id,), where, want)
        if type(got) is not list or not all(is_int(b) for b in got):
            raise fail(where, want, got, "get_block_mapping returns a list of int block ids")
        if got != want:
            raise fail(where, want, got, hint(got) if callable(hint) else hint)

    def state(self, want: Dict[str, Any], hint: str) -> None:
        """Compare the pinned attributes (``free`` as a deque, head first) with ``want``."""
        for name, value in want.items():
            got = self.attribute(name)
            if name == "free":
                if type(got) is not deque:
                    raise fail(self.where("type(a.free)"), "collections.deque", type(got).__name__,
                               "keep the free queue in a collections.deque (its head is handed out next)")
                got = list(got)
            expect_equal(self.where(f"a.{name}"), value, got, hint.format(name=name))

    def snapshot(self) -> Dict[str, Any]:
        out = {}
        for name in STATE:
            value = self.attribute(name)
            out[name] = list(value) if type(value) is deque else value
        return out


def tasks_written(cls: Any, task: str, calls: Sequence[Tuple[str, Tuple[Any, ...]]]) -> None:
    """Raise "task NN.k is not written yet" when a method of ``task`` still raises NotImplementedError.

    Each method is called unbound with ``self=None``: an unwritten one raises at once, a written
    one fails on ``None`` (ignored). So a task is reported as unwritten by its own check even when
    an earlier task, which the check also needs, is unwritten too.
    """
    for method, args in calls:
        try:
            fn = getattr(cls, method)
        except Exception:  # noqa: BLE001 - a missing method is reported when it is used
            continue
        try:
            fn(None, *args)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except Exception:  # noqa: BLE001 - written code failing on self=None: expected
            pass


def run_differential(cls: Any, ops: Sequence[str], task: str, max_examples: int = 50, announce: bool = True) -> None:
    """Run ``check_allocator`` on the operations built so far and turn its report into a check failure;
    print the task's success line unless ``announce`` is false (a check with more to do after it)."""
    from ..conformance.differential import check_allocator

    try:
        check_allocator(cls, ops=ops, max_examples=max_examples, name="MyAllocator")
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except AssertionError as exc:
        raise CheckFailure(str(exc)) from None
    if announce:
        passed(task)
