"""Checks of exercise 02: "your allocator" from the contract, in three capabilities.

* 02.1 a pool and its first sequences: ``MyAllocator(num_blocks, block_size)``, ``num_free_blocks``,
  ``allocate_for_sequence``, ``get_block_mapping``; typed refusals that change nothing;
* 02.2 growing by a block and giving back: ``append_block_to_sequence``, ``free_sequence``;
* 02.3 which block holds a token: ``block_of(seq_id, position)``.

Expected values come from the library's ``PagedKVCacheAllocator`` driven through the same calls,
never from stored answers. Scripted cases name the usual mistakes; the differential check
(:func:`paged_kv_lib.conformance.check_allocator`) then drives the class with random calls.
Identity questions (is this list the allocator's own?) go through :func:`._common.run_probe`, so
the grader asks them where the learner's objects live.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple, Type, Union

from ..allocator import PagedKVCacheAllocator
from . import probes
from ._common import (
    CheckFailure,
    call_learner,
    expect_equal,
    fail,
    is_int,
    not_written,
    passed,
    run_probe,
    show,
)

#: What exercise 02 grades lives in these modules; while it is graded the learner's kernel cannot use them.
FORBIDDEN: Tuple[str, ...] = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.conformance.differential",
    "paged_kv_lib.conformance.engine",
    "paged_kv_lib.conformance.simulation",
    "paged_kv_lib.allocator",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.free_queue",
    "paged_kv_lib.prefix_cache",
    "paged_kv_lib.invariants",
    "paged_kv_lib.seed",
    "paged_kv_lib.block",
    "paged_kv_lib.course.starters",
)

Errors = Union[Type[BaseException], Tuple[Type[BaseException], ...]]
UNKNOWN_ID = "an unknown sequence id is a ValueError (a KeyError from your dict is not)"


def _library(num_blocks: int, block_size: int) -> PagedKVCacheAllocator:
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)


def library_state(alloc: PagedKVCacheAllocator) -> Dict[str, Any]:
    """A library allocator's books under the names "your allocator" uses (plain values)."""
    return {
        "free": list(alloc.free_blocks),
        "ref_counts": [b.ref_count for b in alloc.blocks],
        "tables": {s: alloc.get_block_mapping(s) for s in alloc.seq_ids},
        "lengths": {s: alloc.get_num_tokens(s) for s in alloc.seq_ids},
    }


# --------------------------------------------------------------------------- a scripted run
class Script:
    """Calls on one learner allocator, recorded as code, so that a failure says how to get there."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int, name: str = "MyAllocator") -> None:
        self.lines = [f"a = {name}({num_blocks}, {block_size})"]
        self.obj = call_learner(cls, (num_blocks, block_size), self.lines[0], "an allocator")

    def where(self) -> str:
        return "; ".join(self.lines)

    def call(self, method: str, *args: Any, expected: Any = None, hint: str = "") -> Any:
        self.lines.append(f"a.{method}({', '.join(map(repr, args))})")
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
            raise fail(f"{self.where()}  then a.{name}", f"the attribute or method {name}", "no such attribute",
                       f"keep the state and the method names the contract gives (a.{name}): later exercises "
                       "build on them") from None
        except CheckFailure:
            raise
        except Exception as exc:  # the learner's property raised
            raise fail(f"{self.where()}  then a.{name}", "a value", f"it raised {type(exc).__name__}: {exc}",
                       "reading this attribute must not raise") from None

    def refused(self, method: str, args: Tuple[Any, ...], errors: Errors, *, accepted: str, other: str = "") -> None:
        """The call must raise one of ``errors``; ``accepted`` names the mistake when it returned instead."""
        call = f"{self.where()}; a.{method}({', '.join(map(repr, args))})"
        names = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
        fn = self.attribute(method)
        try:
            got = fn(*args)
        except CheckFailure:
            raise
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except errors:
            self.lines.append(f"a.{method}({', '.join(map(repr, args))})  # refused")
            return
        except Exception as exc:
            raise fail(call, f"a {names}", f"it raised {type(exc).__name__}: {exc}",
                       other or f"{accepted} (you raised {type(exc).__name__}: the contract's error here is a "
                                f"{names})") from None
        raise fail(call, f"a {names}", f"it returned {show(got)}", accepted)

    def free_count(self, want: int, hint: str) -> None:
        got = self.attribute("num_free_blocks")
        where = f"{self.where()}  then a.num_free_blocks"
        if callable(got):
            raise fail(where, want, "a method", "num_free_blocks is read without calling it: make it an attribute "
                                                "or a @property")
        if not is_int(got):
            raise fail(where, want, got, "num_free_blocks is an int")
        expect_equal(where, want, got, hint)

    def mapping(self, seq_id: int, want: List[int], hint: Union[str, Callable[[List[int]], str]]) -> None:
        where = f"{self.where()}  then a.get_block_mapping({seq_id})"
        got = call_learner(self.attribute("get_block_mapping"), (seq_id,), where, want)
        if type(got) is not list or not all(is_int(b) for b in got):
            raise fail(where, want, got, "get_block_mapping returns a list of int block ids")
        if got != want:
            raise fail(where, want, got, hint(got) if callable(hint) else hint)

    def state(self, want: Dict[str, Any], hint: str) -> None:
        """Compare the pinned attributes (``free`` as a deque, head first) with ``want``."""
        for name, value in want.items():
            got = self.attribute(name)
            where = f"{self.where()}  then a.{name}"
            if name == "free":
                if type(got) is not deque:
                    raise fail(f"{self.where()}  then type(a.free)", "collections.deque", type(got).__name__,
                               "keep the free queue in a collections.deque (its head is handed out next)")
                got = list(got)
            expect_equal(where, value, got, hint.format(name=name))

    def snapshot(self) -> Dict[str, Any]:
        out = {}
        for name in ("free", "ref_counts", "tables", "lengths"):
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


# --------------------------------------------------------------------------- 02.1
def _count_hint(tokens: int, block_size: int) -> Callable[[List[int]], str]:
    """Name the usual wrong block count behind a wrong mapping."""
    def hint(got: List[int]) -> str:
        want = -(-tokens // block_size)
        if len(got) == want:
            return "the blocks come from the head of the free queue, in its order"
        if tokens > 2**53:
            return (f"{tokens} is past 2**53, where a float no longer holds every integer: the block count must "
                    "stay exact in integers")
        if len(got) == tokens // block_size + 1 and tokens % block_size == 0:
            return (f"{len(got)} blocks for {tokens} tokens: a spare block whenever the tokens fill their last "
                    "block exactly (and a block for an empty prompt)")
        if len(got) == tokens // block_size and tokens % block_size:
            return f"{len(got)} blocks for {tokens} tokens: the partly filled last block is left out"
        return f"{tokens} tokens in blocks of {block_size} slots need {want} blocks"
    return hint


def check_allocate_02(MyAllocator: Any) -> None:
    """Task 02.1: a pool, allocation from the head of the free queue, the mapping, refusals that change nothing."""
    a = Script(MyAllocator, 8, 4)
    a.free_count(8, "a new pool has every block free")
    a.state({"free": list(range(8)), "ref_counts": [0] * 8, "tables": {}, "lengths": {}},
            "a new pool: every block free in id order, no holders, no sequences (a.{name})")
    ref = _library(8, 4)
    for seq_id, tokens in ((0, 10), (1, 8), (2, 0)):
        a.call("allocate_for_sequence", seq_id, tokens)
        ref.allocate_for_sequence(seq_id, tokens)
        a.mapping(seq_id, ref.get_block_mapping(seq_id), _count_hint(tokens, 4))
        a.free_count(ref.num_free_blocks, "num_free_blocks drops by the blocks handed out"
                     + (" (0 tokens take no block)" if tokens == 0 else ""))
    want = library_state(ref)
    a.state(want, "a.{name} disagrees with what your methods report: keep it up to date")

    # Refusals: the right kind of error, and nothing changed.
    refusals = [
        ((0, 1), ValueError, "sequence 0 already exists: a duplicate id is a ValueError"),
        ((3, 13), RuntimeError, "13 tokens need 4 blocks and only 3 are free: too few blocks is a RuntimeError"),
        ((4, -1), ValueError, "a negative token count is a caller's bug: a ValueError"),
        ((5, 2.5), TypeError, "a token count that is not an int (2.5) is a TypeError"),
        ((6, True), TypeError, "True is a bool, and a bool is an int in Python: refuse it as a token count "
                               "(TypeError), or True would count as 1 token"),
    ]
    for args, error, hint in refusals:
        a.refused("allocate_for_sequence", args, error, accepted=hint)
        a.state(want, "a refused call must change nothing, and a.{name} changed: decide to refuse before you touch "
                      "anything")
        if args[0] != 0:
            a.refused("get_block_mapping", (args[0],), ValueError, other=UNKNOWN_ID,
                      accepted=f"the refused call registered sequence {args[0]} anyway: a refusal changes nothing")

    # The mapping is a list of its own, and unknown ids are refused.
    if run_probe(probes.returned_value_is_held, a.obj, "get_block_mapping", (0,)):
        raise fail(f"{a.where()}; m = a.get_block_mapping(0); m.append(7)  then a.get_block_mapping(0)",
                   want["tables"][0], want["tables"][0] + [7],
                   "get_block_mapping handed out your own list: the caller's edit changed your table")
    a.refused("get_block_mapping", (9,), ValueError, accepted="sequence 9 does not exist: a ValueError",
              other=UNKNOWN_ID)

    # A pool filled exactly, then an empty prompt (it fits in a full pool), then one token too many.
    a.call("allocate_for_sequence", 3, 12)
    ref.allocate_for_sequence(3, 12)
    a.mapping(3, ref.get_block_mapping(3), _count_hint(12, 4))
    a.free_count(0, "12 tokens take the last 3 blocks: the pool is full")
    a.call("allocate_for_sequence", 4, 0, hint="a prompt of 0 tokens needs no block, so it fits even in a full pool")
    a.mapping(4, [], "a sequence of 0 tokens holds no block, even in a full pool")
    a.refused("allocate_for_sequence", (7, 1), RuntimeError,
              accepted="the pool is full: one more token needs a block that is not there")

    # Exact at any size: 2**53 + 1 tokens in blocks of 2**53 slots are 2 blocks.
    big = Script(MyAllocator, 3, 2**53)
    big.call("allocate_for_sequence", 0, 2**53 + 1)
    big.mapping(0, [0, 1], _count_hint(2**53 + 1, 2**53))

    # Other pools: blocks of 1 and of 5 slots, filled exactly.
    for block_size, prompts in ((1, (3, 2, 1)), (5, (5, 20, 1))):
        b = Script(MyAllocator, 6, block_size)
        other = _library(6, block_size)
        for seq_id, tokens in enumerate(prompts):
            b.call("allocate_for_sequence", seq_id, tokens)
            other.allocate_for_sequence(seq_id, tokens)
            b.mapping(seq_id, other.get_block_mapping(seq_id), _count_hint(tokens, block_size))
        b.free_count(other.num_free_blocks, "free blocks = blocks never handed out")

    # Pools that cannot exist.
    for args in ((0, 4), (4, 0), (-2, 4)):
        line = f"MyAllocator{args}"
        try:
            MyAllocator(*args)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except (ValueError, TypeError):
            continue
        except Exception as exc:
            raise fail(line, "a ValueError", f"it raised {type(exc).__name__}: {exc}",
                       "a pool needs at least one block of at least one slot: refuse it with a ValueError") from None
        raise fail(line, "a ValueError", "an allocator", "a pool needs at least one block of at least one slot")
    passed("02.1")


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


def check_allocator_02(MyAllocator: Any) -> None:
    """Task 02.1, second check: random allocations and lookups beside the library's allocator."""
    run_differential(MyAllocator, ("allocate_for_sequence", "get_block_mapping"), "02.1")


# --------------------------------------------------------------------------- 02.2
def check_grow_and_free_02(MyAllocator: Any) -> None:
    """Task 02.2: ``append_block_to_sequence`` reserves a block ahead; ``free_sequence`` gives blocks back."""
    tasks_written(MyAllocator, "02.2", (("append_block_to_sequence", (0,)), ("free_sequence", (0,))))
    a = Script(MyAllocator, 6, 4)
    ref = _library(6, 4)

    def both(method: str, *args: Any) -> Any:
        getattr(ref, method)(*args)
        return a.call(method, *args)

    both("allocate_for_sequence", 0, 8)
    got = a.call("append_block_to_sequence", 0, expected=2)
    want_id = ref.append_block_to_sequence(0)
    if not is_int(got) or got != want_id:
        raise fail(a.where(), want_id, got, "append_block_to_sequence returns the id of the block it added, the "
                                            "head of the free queue")
    a.mapping(0, ref.get_block_mapping(0), "the new block joins the end of the table")
    a.state({"lengths": {0: 8}}, "the new block is reserved ahead, empty: the sequence still holds 8 tokens "
                                 "(a.{name} must not change)")
    a.state(library_state(ref), "a.{name} disagrees after append_block_to_sequence: the block is held now")
    a.refused("append_block_to_sequence", (0,), ValueError,
              accepted="sequence 0's last block is still empty: a second reserved block would sit unused. "
                       "Refuse with a ValueError while the last block has an empty slot")
    both("allocate_for_sequence", 1, 3)
    a.refused("append_block_to_sequence", (1,), ValueError,
              accepted="sequence 1 holds 3 tokens in a block of 4: its last block still has room, so no block "
                       "yet (ValueError)")
    a.state(library_state(ref), "a refused call must change nothing, and a.{name} changed")
    both("allocate_for_sequence", 2, 0)
    got = a.call("append_block_to_sequence", 2, expected=4)
    want_id = ref.append_block_to_sequence(2)
    if got != want_id:
        raise fail(a.where(), want_id, got, "a sequence of 0 tokens has no block, so no room: it may reserve one")
    a.refused("append_block_to_sequence", (9,), ValueError, accepted="sequence 9 does not exist: a ValueError",
              other=UNKNOWN_ID)
    both("allocate_for_sequence", 3, 4)
    a.refused("append_block_to_sequence", (3,), RuntimeError,
              accepted="the free queue is empty: no block to add, a RuntimeError")
    a.state(library_state(ref), "a refused call must change nothing, and a.{name} changed")

    # Giving back: last block first, to the tail.
    both("free_sequence", 0)
    queue = list(a.attribute("free"))
    want = library_state(ref)
    if queue == [0, 1, 2]:
        raise fail(f"{a.where()}  then a.free", want["free"], queue,
                   "the blocks went back in table order; the contract has them join the tail last block first")
    a.state(want, "after free_sequence, a.{name} is wrong: the sequence and its holds are gone, its blocks free")
    a.refused("get_block_mapping", (0,), ValueError, accepted="sequence 0 was freed: it is gone")
    for gone in (0, 42):
        a.lines.append(f"a.free_sequence({gone})")
        try:
            a.attribute("free_sequence")(gone)
        except NotImplementedError as exc:
            raise not_written(exc) from None
        except Exception as exc:
            raise fail(a.where(), "no error", f"it raised {type(exc).__name__}: {exc}",
                       f"sequence {gone} holds nothing (freed already, or never allocated: a request cancelled "
                       "early): freeing it does nothing") from None
        a.state(want, "freeing a sequence that holds nothing must change nothing, and a.{name} changed")
    both("allocate_for_sequence", 4, 5)
    a.mapping(4, ref.get_block_mapping(4), "a new sequence takes the head of the free queue")
    both("free_sequence", 2)
    both("free_sequence", 1)
    a.state(library_state(ref), "a.{name} is wrong after freeing sequences 2 and 1")
    passed("02.2")


def check_allocator_02_free(MyAllocator: Any) -> None:
    """Task 02.2, second check: random allocations, frees and lookups beside the library's allocator."""
    tasks_written(MyAllocator, "02.2", (("free_sequence", (0,)),))
    run_differential(MyAllocator, ("allocate_for_sequence", "get_block_mapping", "free_sequence"), "02.2")


# --------------------------------------------------------------------------- 02.3
def lookup_scenarios() -> Iterator[Tuple[str, PagedKVCacheAllocator]]:
    """Library allocators in varied states: scattered blocks, reserved empty blocks, empty sequences."""
    a = _library(10, 4)
    a.allocate_for_sequence(0, 10)
    a.allocate_for_sequence(1, 5)
    a.allocate_for_sequence(2, 7)
    a.free_sequence(1)
    a.append_tokens(0, 3)
    a.allocate_for_sequence(3, 14)
    yield "scattered blocks", a
    b = _library(12, 4)
    b.allocate_for_sequence(5, 8)
    b.append_block_to_sequence(5)
    b.allocate_for_sequence(6, 0)
    b.allocate_for_sequence(7, 4)
    b.allocate_for_sequence(8, 1)
    b.append_block_to_sequence(6)
    yield "blocks reserved ahead", b
    c = _library(9, 1)
    c.allocate_for_sequence(0, 3)
    c.allocate_for_sequence(1, 2)
    c.free_sequence(0)
    c.allocate_for_sequence(2, 5)
    yield "blocks of one slot", c
    d = _library(8, 16)
    d.allocate_for_sequence(0, 40)
    d.allocate_for_sequence(1, 17)
    d.free_sequence(0)
    d.allocate_for_sequence(2, 33)
    d.append_tokens(1, 15)
    yield "blocks of 16 slots", d


def _lookup_hint(table: List[int], position: int, block_size: int, got: Any) -> str:
    """Name the usual wrong lookup behind a wrong block id."""
    logical, offset = divmod(position, block_size)
    if got == logical and got != table[logical]:
        return (f"{got} is the logical block index of position {position}; the answer is the physical block the "
                "table maps it to")
    if offset < len(table) and got == table[offset] and offset != logical:
        return (f"you returned the entry for logical block {offset}, which is the offset of position {position} "
                f"inside its block; the logical block is a different part of the position")
    for shift in (-1, 1):
        if 0 <= logical + shift < len(table) and got == table[logical + shift]:
            if offset == 0:
                slot = "the first slot"
            elif offset == block_size - 1:
                slot = "the last slot"
            else:
                slot = f"slot {offset}"
            return (f"off by one block: position {position} is {slot} of logical block {logical}, and you returned "
                    f"the block of logical block {logical + shift}")
    return "the physical block id comes from the sequence's table"


def check_block_of_02(MyAllocator: Any) -> None:
    """Task 02.3: ``block_of(seq_id, position)``: the physical block holding a token, or a refusal."""
    tasks_written(MyAllocator, "02.3", (("block_of", (0, 0)),))
    for what, ref in lookup_scenarios():
        bs = ref.block_size
        a = Script(MyAllocator, ref.num_blocks, bs)
        state = library_state(ref)
        for name, value in state.items():
            setattr(a.obj, name, deque(value) if name == "free" else value)
        a.lines.append(f"a.free, a.ref_counts, a.tables, a.lengths = <{what}: {state['tables']}, lengths "
                       f"{state['lengths']}>")
        for seq_id, table in state["tables"].items():
            length = state["lengths"][seq_id]
            for position in range(length):
                want = int(ref.slot_mapping(seq_id, [position])[0]) // bs
                call = f"{a.where()}; a.block_of({seq_id}, {position})"
                got = call_learner(a.attribute("block_of"), (seq_id, position), call, want)
                if not is_int(got):
                    raise fail(call, want, got, "return the physical block id, an int")
                expect_equal(call, want, got, _lookup_hint(table, position, bs, got))
            capacity = len(table) * bs
            invalid = [-1, -bs, -capacity - 1, capacity - 1, length, capacity, capacity + bs]
            for position in dict.fromkeys(p for p in invalid if not 0 <= p < length):
                if position < 0:
                    accepted = (f"position {position} is negative and was accepted: a negative list index quietly "
                                "counts from the end of the table")
                elif position == length:
                    accepted = (f"off by one at the end: sequence {seq_id} holds {length} tokens, so position "
                                f"{position} holds none")
                elif position < capacity:
                    accepted = (f"position {position} is an empty slot (the sequence holds {length} tokens in "
                                f"{len(table)} blocks): the limit is the token count, not the room in the blocks")
                else:
                    accepted = f"position {position} lies past every block of sequence {seq_id}"
                a.refused("block_of", (seq_id, position), ValueError, accepted=accepted,
                          other=(f"position {position} must be refused with a ValueError; an IndexError or "
                                 "KeyError from a list or dict is not the contract's error"))
        a.refused("block_of", (99, 0), ValueError, accepted="sequence 99 does not exist: a ValueError",
                  other=UNKNOWN_ID)
        got_state = a.snapshot()
        if got_state != state:
            raise fail(f"{a.where()}  then the books", state, got_state, "block_of only reads: it changed the books")
    passed("02.3")

