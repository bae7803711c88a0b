"""Drive a learner's allocator class and the library's allocator through the same calls, step by step.

Exercises 05 and 06 grade "your allocator" (the contract in :mod:`paged_kv_lib.conformance`)
this way: every call goes to both, and after each one the learner's mappings and free
count must equal the library's (prefix caching off, blocks handed out from the head of
a free queue that starts 0, 1, 2, ...). A failure prints the calls so far as code, what
the library's allocator answered, what the learner's did, and a hint naming the likely
mistake.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ..allocator import PagedKVCacheAllocator
from ._common import call_learner, expect_raises, fail, is_int

NAME = "MyAllocator"
_SHOWN_LINES = 14


class AllocatorSteps:
    """One scenario: a fresh learner object and a fresh library allocator, the same calls to both."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.lines: List[str] = [f"a = {NAME}({num_blocks}, {block_size})"]
        self.ref = PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)
        self.mine = call_learner(cls, (num_blocks, block_size), self.program(), "an allocator object")
        self.compare("the pool starts with every block free")

    # ------------------------------------------------------------------ reading
    def program(self, extra: str = "") -> str:
        lines = self.lines if len(self.lines) <= _SHOWN_LINES else ["..."] + self.lines[-_SHOWN_LINES + 1:]
        return "\n".join(lines + ([extra] if extra else []))

    def free_count(self, hint: str) -> int:
        call = self.program("a.num_free_blocks")
        got = call_learner(lambda: self.mine.num_free_blocks, (), call, self.ref.num_free_blocks)
        if not is_int(got):
            raise fail(call, self.ref.num_free_blocks, got,
                       "num_free_blocks must be an int: an attribute, or a method decorated with @property")
        return got

    def mapping(self, seq_id: int) -> Any:
        call = self.program(f"a.get_block_mapping({seq_id})")
        want = self.ref.get_block_mapping(seq_id)
        return call_learner(self.mine.get_block_mapping, (seq_id,), call, want)

    def compare(self, hint: str, *, after: Optional[str] = None, before: Optional[dict] = None) -> None:
        """The learner's mappings and free count must equal the library's right now."""
        for seq_id in self.ref.seq_ids:
            want = self.ref.get_block_mapping(seq_id)
            got = self.mapping(seq_id)
            if type(got) is not list or not all(is_int(b) for b in got):
                raise fail(self.program(f"a.get_block_mapping({seq_id})"), want, got,
                           "get_block_mapping returns a new list of ints (block ids in logical order)")
            if got != want:
                why = self.diagnose(after, seq_id, want, got, before) or hint
                raise fail(self.program(f"a.get_block_mapping({seq_id})"), want, got, why)
        free = self.free_count(hint)
        if free != self.ref.num_free_blocks:
            raise fail(self.program("a.num_free_blocks"), self.ref.num_free_blocks, free, hint)

    # ------------------------------------------------------------------ calling
    def step(self, method: str, *args: Any, hint: str = "") -> Any:
        """Make the call on both; compare what came back and the state afterwards."""
        before = {s: (self.ref.get_block_mapping(s), self.ref.get_num_tokens(s)) for s in self.ref.seq_ids}
        ref_error: Optional[BaseException] = None
        ref_result: Any = None
        try:
            ref_result = getattr(self.ref, method)(*args)
        except (ValueError, RuntimeError) as exc:
            ref_error = exc
        self.lines.append(f"a.{method}({', '.join(repr(a) for a in args)})")
        call = self.program()
        fn = getattr(self.mine, method)
        if ref_error is not None:
            kind = ValueError if isinstance(ref_error, ValueError) else RuntimeError
            expect_raises(fn, args, call, kind, hint or _ERROR_HINT[kind])
            self.compare("a call that fails must change nothing: check everything before you change anything",
                         after=None)
            return None
        want = list(ref_result) if method == "append_tokens" else None
        got = call_learner(fn, args, call, want if method == "append_tokens" else "None")
        if method == "append_tokens":
            self.compare(hint, after=call, before=before)
            if type(got) is not list or not all(is_int(b) for b in got):
                raise fail(call, want, got, "append_tokens returns a list of the block ids it newly took (an empty list when none)")
            if got != want:
                raise fail(call, want, got, hint or "return the ids newly placed in the table, in the order taken "
                           "(a copy-on-write block first); they must match the mapping's change")
        else:
            self.compare(hint, after=call, before=before)
        return got

    def diagnose(self, call: Optional[str], seq_id: int, want: Sequence[int], got: Sequence[int],
                 before: Optional[dict]) -> str:
        """Name the likely mistake behind a wrong mapping right after ``call``."""
        if not call:
            return ""
        last = call.splitlines()[-1]
        bs = self.block_size
        if last.startswith("a.allocate_for_sequence(") and len(got) != len(want):
            n = self.ref.get_num_tokens(seq_id)
            if n % bs == 0 and len(got) == n // bs + 1:
                return (f"a prompt of {n} tokens got {len(got)} blocks: n // block_size + 1 is one block too many "
                        "when n is a multiple of block_size (and 0 tokens need no block at all)")
            if len(got) == n // bs:
                return f"a prompt of {n} tokens needs a block for its partial last block too: {len(want)} blocks"
            return f"a prompt of {n} tokens needs exactly {len(want)} blocks of {bs}"
        if last.startswith("a.append_tokens(") and before and seq_id in before:
            old_table, length = before[seq_id]
            grown = self.ref.get_num_tokens(seq_id) - length
            if len(got) != len(want):
                seed = len(old_table) + sum((length + i + 1) % bs == 0 for i in range(grown))
                if len(got) == seed:
                    return ("off by one at a block boundary: a sequence needs a new block when a new token's "
                            "position (the length before it) is a multiple of block_size; "
                            "(length + 1) % block_size == 0 fires one token early")
                if len(got) > len(want):
                    return (f"growing {length} tokens by {grown} needs {len(want)} blocks in all; "
                            "a block taken before a token needs it sits empty")
                return (f"growing {length} tokens by {grown} needs {len(want)} blocks of {bs} in all: "
                        "some new token has no slot")
            tail = len(old_table) - 1
            copied = bool(old_table) and want[tail] != old_table[-1]
            learner_copied = bool(old_table) and got[tail] != old_table[-1]
            if copied and not learner_copied:
                return (f"no copy-on-write: block {old_table[-1]} is shared and not full, so the new token "
                        "would be written into a block other sequences read")
            if copied and learner_copied:
                return ("the copy-on-write block is taken from the free queue first, before any new block, "
                        "and it takes the old block's place in the mapping")
            if learner_copied and length % bs == 0:
                return (f"block {old_table[-1]} is full: the new token starts a new block, so nothing "
                        "needs a copy")
            if learner_copied:
                return (f"block {old_table[-1]} has no other holder now (the others copied it away or were "
                        "freed), so this sequence writes in place; a copy here means a count is too high: "
                        "a copy-on-write that keeps the old reference, or a free that drops none")
        if len(got) == len(want):
            return ("same number of blocks, different ids: blocks are handed out from the head of the free queue, "
                    "and freed blocks join its tail, last logical block first")
        return ""


_ERROR_HINT = {
    ValueError: "an unknown sequence id, or one that already exists, raises ValueError",
    RuntimeError: "too few free blocks raises RuntimeError, and changes nothing",
}


def allocator_steps(cls: Any, num_blocks: int, block_size: int) -> AllocatorSteps:
    """A new scenario on a fresh learner object (built with ``cls(num_blocks, block_size)``)."""
    return AllocatorSteps(cls, num_blocks, block_size)
