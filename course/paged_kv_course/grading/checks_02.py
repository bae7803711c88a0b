"""Checks of exercise 02: "your allocator" from the contract, in three capabilities.

* 02.1 a pool and its first sequences: ``MyAllocator(num_blocks, block_size)``, ``num_free_blocks``,
  ``allocate_for_sequence``, ``get_block_mapping``; typed refusals that change nothing;
* 02.2 growing by a block and giving back: ``append_block_to_sequence``, ``free_sequence``;
* 02.3 a batch admitted whole or not at all: ``allocate_batch(requests)``.

Expected values come from the library's ``BlockManager`` driven through the same calls,
never from stored answers. Scripted cases (:mod:`._checks_02_script`) name the usual mistakes; the
differential check (:func:`paged_kv_course.conformance.check_allocator`) then drives the class with
random calls. Identity questions (is this list the allocator's own?) go through
:func:`._common.run_probe`, so the grader asks them where the learner's objects live.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional, Sequence, Tuple

from paged_kv_lib.block_manager import BlockManager
from paged_kv_lib.block import cdiv
from . import probes
from ._checks_02_script import UNKNOWN_ID, Script, library, library_state, run_differential, tasks_written
from ._common import fail, is_int, not_written, passed, run_probe


# --------------------------------------------------------------------------- 02.1
def _count_hint(tokens: int, block_size: int) -> Callable[[List[int]], str]:
    """Name the usual wrong block count behind a wrong mapping."""
    def hint(got: List[int]) -> str:
        want = cdiv(tokens, block_size)
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
    ref = library(8, 4)
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
        raise fail(a.where("m = a.get_block_mapping(0)\n    m.append(7)\n    a.get_block_mapping(0)"),
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
        other = library(6, block_size)
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
    _check_take_blocks(MyAllocator)
    passed("02.1")


def _check_take_blocks(MyAllocator: Any) -> None:
    """``take_blocks``: the one place blocks leave the free queue (exercise 06 overrides it alone)."""
    a = Script(MyAllocator, 6, 2)
    a.call("allocate_for_sequence", 0, 3)
    want = {"free": [2, 3, 4, 5], "ref_counts": [1, 1, 0, 0, 0, 0]}
    for count, taken in ((2, [2, 3]), (0, [])):
        got = a.call("take_blocks", count, expected=taken, hint="take_blocks hands out blocks like an allocation")
        where = a.where()
        if type(got) is not list or got != taken:
            raise fail(where, taken, got, "take_blocks(count) pops count ids off the head of the free queue and "
                                          "returns them in that order ([] for 0)")
        want = {"free": [b for b in want["free"] if b not in taken],
                "ref_counts": [r + (i in taken) for i, r in enumerate(want["ref_counts"])]}
        a.state(want, "after take_blocks, a.{name} is off: each block taken leaves the free queue, held once")
    for count, error, why in ((3, RuntimeError, "3 blocks asked, 2 are free: too few blocks is a RuntimeError"),
                              (-1, ValueError, "a negative count is a caller's bug: a ValueError")):
        a.refused("take_blocks", (count,), error, accepted=why)
        a.state(want, "a refused take_blocks must change nothing, and a.{name} changed")
    a.call("allocate_for_sequence", 1, 4)
    a.mapping(1, [4, 5], "after take_blocks, an allocation goes on from the head of the free queue")


def check_allocator_02(MyAllocator: Any) -> None:
    """Task 02.1, second check: random allocations and lookups beside the library's allocator."""
    run_differential(MyAllocator, ("allocate_for_sequence", "get_block_mapping"), "02.1")


# --------------------------------------------------------------------------- 02.2
def check_grow_and_free_02(MyAllocator: Any) -> None:
    """Task 02.2: ``append_block_to_sequence`` reserves a block ahead; ``free_sequence`` gives blocks back."""
    tasks_written(MyAllocator, "02.2", (("append_block_to_sequence", (0,)), ("free_sequence", (0,))))
    a = Script(MyAllocator, 6, 4)
    ref = library(6, 4)

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
        raise fail(a.where("a.free"), want["free"], queue,
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
Request = Tuple[Any, Any]


def _builtin(exc: BaseException) -> type:
    """The built-in error class the contract names for a library refusal."""
    for kind in (TypeError, ValueError, RuntimeError):
        if isinstance(exc, kind):
            return kind
    return type(exc)


def _first_refusal(ref: BlockManager, requests: Sequence[Request]) -> Optional[Tuple[int, BaseException]]:
    """Make the requests one after another on a copy of ``ref``: the index and error of the first refused one.

    When none is refused, ``ref`` itself admits them all (in order) and the answer is ``None``.
    """
    trial = copy.deepcopy(ref)
    for index, (seq_id, tokens) in enumerate(requests):
        try:
            trial.allocate_for_sequence(seq_id, tokens)
        except Exception as exc:  # noqa: BLE001 - every library refusal is a PagedKVError
            return index, exc
    for seq_id, tokens in requests:
        ref.allocate_for_sequence(seq_id, tokens)
    return None


def _batch_unchanged(a: Script, want: dict, requests: Sequence[Request]) -> None:
    """After a refused batch every attribute is as before; name the two usual ways it is not."""
    got = a.snapshot()
    if got == want:
        return
    where = a.where("a.free, a.ref_counts, a.tables, a.lengths")
    left = [s for s in got["tables"] if s not in want["tables"]]
    ids = [seq_id for seq_id, _ in requests]
    if left:
        twice = [s for s in left if ids.count(s) > 1]
        why = (f" (sequence {twice[0]} appears twice in the batch, and the second request is a duplicate id)"
               if twice else "")
        raise fail(where, want, got, f"the refused batch left sequence(s) {left} admitted{why}: a batch is admitted "
                                     "whole or not at all")
    if got["tables"] == want["tables"] and sorted(got["free"]) == sorted(want["free"]):
        raise fail(where, want, got, "the refused batch gave back every block it took, but the free queue is not in "
                                     "the order it had: giving blocks back is not undoing, and a refused call changes "
                                     "nothing, the order of a.free included")
    raise fail(where, want, got, "a refused batch must change nothing, and the books changed")


def _refusals(free: int) -> List[Tuple[List[Request], str]]:
    """Batches that must be refused in a pool with ``free`` free blocks of 4 slots (sequence 0 live)."""
    return [
        ([(4, 8), (5, 4 * free - 8), (6, 1)],
         f"each request fits alone, but together they need {free + 1} blocks and {free} are free"),
        ([(7, 1), (7, 2)], "sequence 7 appears twice in the batch: the second request is a duplicate id"),
        ([(8, 1), (0, 1)], "sequence 0 is live already: a duplicate id is a ValueError"),
        ([(9, 4), (10, 2.5)], "a token count that is not an int (2.5) is a TypeError"),
        ([(11, 4), (12, -3)], "a negative token count is a ValueError"),
        ([(13, 4), (14, True)], "True is a bool, not a token count: a TypeError"),
        ([(15, 4 * free + 1), (16, 2.5)], f"the first request needs {free + 1} blocks and {free} are free"),
    ]


def check_batch_02(MyAllocator: Any) -> None:
    """Task 02.3: ``allocate_batch(requests)`` admits every request, in order, or none of them."""
    tasks_written(MyAllocator, "02.3", (("allocate_batch", ([],)),))
    a = Script(MyAllocator, 12, 4)
    ref = library(12, 4)

    def admit(requests: List[Request], hint: str) -> None:
        given = list(requests)
        a.call("allocate_batch", given)
        assert _first_refusal(ref, requests) is None
        want = library_state(ref)
        if given != requests:
            raise fail(a.where("requests"), requests, given, "allocate_batch only reads its argument")
        a.state(want, hint)

    a.call("allocate_for_sequence", 0, 6)
    ref.allocate_for_sequence(0, 6)
    admit([(1, 9), (2, 0), (3, 4)], "after the batch, a.{name} differs from what the same requests give when made "
                                    "one after another: the batch admits them in the order given")
    admit([], "an empty batch admits nothing and changes nothing (a.{name} changed)")
    for requests, why in _refusals(ref.num_free_blocks):
        want = library_state(ref)
        first = _first_refusal(ref, requests)
        assert first is not None
        index, exc = first
        kind = _builtin(exc)
        a.refused("allocate_batch", (list(requests),), kind, accepted=f"{why}, so the batch is refused",
                  other=(f"made one after another, the first request refused would be {requests[index]!r} ({why}), "
                         f"with a {kind.__name__}: the batch raises the error of its first refused request"))
        _batch_unchanged(a, want, requests)
    free = ref.num_free_blocks
    admit([(20, 0), (21, 4 * free), (22, 0)], "a batch that fills the pool exactly, with two empty prompts, is "
                                              "admitted; after it a.{name} is wrong")
    want = library_state(ref)
    a.refused("allocate_batch", ([(23, 0), (24, 1)],), RuntimeError,
              accepted="the pool is full: the request for 1 token needs a block that is not there")
    _batch_unchanged(a, want, [(23, 0), (24, 1)])
    a.call("free_sequence", 21)
    ref.free_sequence(21)
    admit([(25, 5), (26, 3)], "after freeing sequence 21, the batch takes blocks from the head of the free queue, in "
                              "its order; a.{name} is wrong")
    passed("02.3")
