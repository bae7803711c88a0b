"""Drive the learner's allocator class and the library's allocator through the same calls, and
name the mistake behind a difference by replaying the calls on known wrong allocators.

Exercises 05 and 06 grade "your allocator" this way: every call goes to both; after each one
the learner's mappings, free count and return value must equal the library's. On a difference
the failure shows the calls so far as code, what the library answered and what the learner's
did; its hint names the first known mistake (a small wrong allocator here, replayed on the
same calls) that answers exactly as the learner's did, and otherwise the step's own hint.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from paged_kv_lib.block_manager import BlockManager
from ._common import call_learner, expect_raises, fail, is_int

NAME = "MyAllocator"
_SHOWN_LINES = 14

Call = Tuple[str, Tuple[Any, ...], Dict[str, Any]]
# (a class behaving like one known mistake, what to tell a learner whose class answers like it)
Mistake = Tuple[Callable[[int, int], Any], str]


def _text(call: Call) -> str:
    method, args, kwargs = call
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"a.{method}({', '.join(shown)})"


def _answers(obj: Any, seq_ids: Sequence[int], result: Any) -> Tuple[Any, ...]:
    """What a check looks at after a call: the mappings of ``seq_ids``, the free count, the result."""
    maps: List[Optional[List[int]]] = []
    for seq_id in seq_ids:
        try:
            maps.append(list(obj.get_block_mapping(seq_id)))
        except Exception:  # noqa: BLE001 - a replayed wrong class may have lost the sequence
            maps.append(None)
    try:
        free = obj.num_free_blocks
    except Exception:  # noqa: BLE001
        free = None
    return tuple(maps), free, list(result) if isinstance(result, (list, tuple)) else result


class Steps:
    """One scenario: a fresh learner object and a fresh library allocator, the same calls to both."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 mistakes: Sequence[Mistake] = ()) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.mistakes = list(mistakes)
        self.calls: List[Call] = []
        self.ref = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.mine = call_learner(cls, (num_blocks, block_size), self.program(), "an allocator object")
        self.compare("the pool starts with every block free", None)

    def program(self, extra: str = "") -> str:
        lines = [f"a = {NAME}({self.num_blocks}, {self.block_size})"] + [_text(c) for c in self.calls]
        if len(lines) > _SHOWN_LINES:
            lines = lines[:1] + ["..."] + lines[-_SHOWN_LINES + 2:]
        return "\n".join(lines + ([extra] if extra else []))

    def named_mistake(self, result: Any, fallback: str, *, raised: bool = False) -> str:
        """The message of the first known mistake that answers the calls so far exactly as the learner's did
        (``raised``: the last call raised, as it should have; then only the state afterwards is compared)."""
        seq_ids = self.ref.seq_ids
        mine = _answers(self.mine, seq_ids, result)
        for make, message in self.mistakes:
            wrong = make(self.num_blocks, self.block_size)
            got: Any = None
            for method, args, kwargs in self.calls:
                try:
                    got = getattr(wrong, method)(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a known mistake may fail in its own way
                    got = exc
            if raised and isinstance(got, BaseException):
                got = None
            if not isinstance(got, BaseException) and _answers(wrong, seq_ids, got) == mine:
                return message
        return fallback

    def compare(self, hint: str, result: Any, *, raised: bool = False) -> None:
        """The learner's mappings and free count must equal the library's right now."""
        for seq_id in self.ref.seq_ids:
            want = self.ref.get_block_mapping(seq_id)
            call = self.program(f"a.get_block_mapping({seq_id})")
            got = call_learner(self.mine.get_block_mapping, (seq_id,), call, want)
            if type(got) is not list or not all(is_int(b) for b in got):
                raise fail(call, want, got, "get_block_mapping returns a new list of ints (block ids in logical order)")
            if got != want:
                raise fail(call, want, got, self.named_mistake(result, hint or _SAME_IDS, raised=raised))
        call = self.program("a.num_free_blocks")
        want_free = self.ref.num_free_blocks
        free = call_learner(lambda: self.mine.num_free_blocks, (), call, want_free)
        if not is_int(free):
            raise fail(call, want_free, free, "num_free_blocks must be an int: an attribute, or a method decorated with @property")
        if free != want_free:
            raise fail(call, want_free, free, self.named_mistake(result, hint or "count every block no sequence holds",
                                                            raised=raised))

    def step(self, method: str, *args: Any, hint: str = "", **kwargs: Any) -> Any:
        """Make the call on both; compare what came back (when it means something) and the state afterwards."""
        ref_error: Optional[BaseException] = None
        want: Any = None
        try:
            want = getattr(self.ref, method)(*args, **kwargs)
        except (ValueError, RuntimeError) as exc:
            ref_error = exc
        self.calls.append((method, args, kwargs))
        call = self.program()
        fn = getattr(self.mine, method)
        if ref_error is not None:
            kind = ValueError if isinstance(ref_error, ValueError) else RuntimeError
            expect_raises(lambda *a: fn(*a, **kwargs), args, call, kind, hint or _ERROR_HINT[kind])
            self.compare(_UNCHANGED, None, raised=True)
            return None
        if method == "append_tokens":
            want = list(want)
        elif method not in _RESULTS or (method == "allocate_for_sequence" and "token_ids" not in kwargs):
            want = None
        shown = want if method in _RESULTS else "None"
        got: Any = call_learner(fn, args, call, shown, **kwargs)
        self.compare(hint, got)
        if method in _RESULTS and (method != "allocate_for_sequence" or "token_ids" in kwargs):
            result_type = _RESULTS[method]
            wrong_type = type(got) is not result_type
            if isinstance(got, list) and not wrong_type:
                wrong_type = not all(is_int(b) for b in got)
            if wrong_type:
                raise fail(call, want, got, _RESULT_HINT[method])
            if got != want:
                raise fail(call, want, got, self.named_mistake(got, hint or _RESULT_HINT[method]))
        return got


_RESULTS: Dict[str, type] = {"append_tokens": list, "can_append": bool, "allocate_for_sequence": int}
_RESULT_HINT = {
    "append_tokens": "append_tokens returns a list of the block ids it newly took, in order ([] when none)",
    "can_append": "can_append answers True or False (a bool) and changes nothing",
    "allocate_for_sequence": "with token_ids, allocate_for_sequence returns how many prompt tokens it found cached (an int)",
}
_SAME_IDS = ("different block ids: blocks are handed out from the head of the free queue, and freed blocks "
             "join its tail, last logical block first")
_UNCHANGED = "a call that fails must change nothing: find out whether it can succeed before changing anything"
_ERROR_HINT = {
    ValueError: "an unknown sequence id, one that already exists, or a bad argument raises ValueError",
    RuntimeError: "too few free blocks raises RuntimeError, and changes nothing",
}
