"""Checks of exercise 03: "your allocator" learns to share, checks its own books, and a colleague's
allocator gets debugged.

* 03.1 sharing: ``fork`` and a ``free_sequence`` that counts references;
* 03.2 ``check_invariants``: the learner's own checker, run on valid and corrupted books;
* 03.3 debug: ``ShakyAllocator`` (given in the notebook, three planted bugs) repaired.

Expected states come from the library's ``BlockManager`` driven through the same calls. The
corrupted books of 03.2 are a library state with one realistic bug applied, described in plain words.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..block_manager import BlockManager
from . import probes
from ._common import call_learner, fail, not_written, passed, run_probe
from ._checks_02_script import UNKNOWN_ID, Script, library, library_state, run_differential, tasks_written

#: What exercise 03 grades lives in these modules; while it is graded the learner's kernel cannot use them.
#: Exercise 02's starter (``paged_kv_lib.course.starters.after_02``) stays usable: exercise 03 starts there.
FORBIDDEN: Tuple[str, ...] = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.conformance.differential",
    "paged_kv_lib.conformance.simulation",
    "paged_kv_lib.allocator",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.prefix_cache",
    "paged_kv_lib.seed",
    "paged_kv_lib.course.starters.after_03",
    "paged_kv_lib.course.starters.after_05",
    "paged_kv_lib.course.starters.after_06",
)

SHARING_OPS = ("allocate_for_sequence", "get_block_mapping", "free_sequence", "fork")
Op = Tuple[Any, ...]


def _replay(num_blocks: int, block_size: int, trace: Sequence[Op]) -> BlockManager:
    alloc = library(num_blocks, block_size)
    for method, *args in trace:
        getattr(alloc, method)(*args)
    return alloc


# --------------------------------------------------------------------------- 03.1
def check_sharing_03(MyAllocator: Any) -> None:
    """Task 03.1: ``fork`` shares every block; ``free_sequence`` gives a block back when its last holder leaves."""
    tasks_written(MyAllocator, "03.1", (("fork", (0, 1)), ("free_sequence", (0,))))
    a = Script(MyAllocator, 8, 4)
    ref = library(8, 4)

    def both(method: str, *args: Any) -> None:
        getattr(ref, method)(*args)
        a.call(method, *args)

    both("allocate_for_sequence", 0, 10)
    both("fork", 0, 1)
    a.free_count(ref.num_free_blocks, "fork took blocks from the free queue: the child shares the parent's "
                                      "blocks, nothing is copied")
    a.mapping(1, ref.get_block_mapping(1), "the child's table lists the parent's blocks, in the same order")
    a.state({"ref_counts": library_state(ref)["ref_counts"]},
            "each shared block is held by two tables now, and a.{name} must say so")
    a.state({"lengths": library_state(ref)["lengths"]}, "the child holds as many tokens as its parent (a.{name})")
    a.state(library_state(ref), "a.{name} is wrong after the fork")
    if run_probe(probes.attribute_entries_alias, a.obj, "tables", 0, 1):
        raise fail(a.where("a.tables[1] is a.tables[0]"), False, True,
                   "the child got the parent's own list object: when one of them grows, the other grows with it")
    both("fork", 1, 2)
    a.state(library_state(ref), "forking a fork adds one more holder to each block (a.{name})")
    both("allocate_for_sequence", 3, 0)
    both("fork", 3, 4)
    a.mapping(4, [], "forking an empty sequence gives an empty table")

    for args, hint in (((9, 5), "sequence 9 does not exist: forking it is a ValueError"),
                       ((0, 1), "sequence 1 is live: forking onto it is a ValueError (it would lose its blocks)"),
                       ((0, 0), "a sequence cannot be forked onto itself (its id is taken): a ValueError")):
        a.refused("fork", args, ValueError, accepted=hint)
        a.state(library_state(ref), "a refused fork must change nothing, and a.{name} changed")
    a.refused("get_block_mapping", (5,), ValueError, other=UNKNOWN_ID,
              accepted="the refused fork registered sequence 5 anyway")

    # A shared, full table grows by a block: only the child gets it.
    both("allocate_for_sequence", 5, 8)
    both("fork", 5, 6)
    both("append_block_to_sequence", 6)
    a.mapping(5, ref.get_block_mapping(5), "sequence 5 grew when its child did: the two tables are one list object")
    a.state(library_state(ref), "after the child reserved a block of its own, a.{name} is wrong")

    # Freeing: a shared block stays until its last holder lets go.
    both("free_sequence", 0)
    a.free_count(ref.num_free_blocks, "blocks 0, 1 and 2 are still held by sequences 1 and 2: a block is free only "
                                      "when no table holds it")
    a.state(library_state(ref), "freeing a sequence drops its hold on each block, and a.{name} disagrees")
    both("free_sequence", 0)
    a.state(library_state(ref), "sequence 0 is gone already: freeing it again changes nothing, and a.{name} changed")
    both("free_sequence", 1)
    both("free_sequence", 2)
    want = library_state(ref)
    a.free_count(ref.num_free_blocks, "now no table holds blocks 0, 1 and 2: they are free")
    a.state(want, "blocks that nobody holds join the tail of the free queue, the table's last block first (a.{name})")
    both("free_sequence", 6)
    both("free_sequence", 5)
    a.state(library_state(ref), "a.{name} is wrong after freeing the child, then the parent")
    passed("03.1")


def check_allocator_03(MyAllocator: Any) -> None:
    """Task 03.1, second check: random allocations, forks, frees and lookups beside the library's allocator."""
    tasks_written(MyAllocator, "03.1", (("fork", (0, 1)), ("free_sequence", (0,))))
    run_differential(MyAllocator, SHARING_OPS, "03.1")


# --------------------------------------------------------------------------- 03.2
Books = Dict[str, Any]

# Library traces whose states are valid books: shared blocks, empty tables, blocks reserved ahead, a full
# pool, a pool after everything was freed.
VALID_TRACES: List[Tuple[str, int, int, List[Op]]] = [
    ("an empty pool", 4, 2, []),
    ("three sequences share blocks", 8, 4, [("allocate_for_sequence", 0, 10), ("fork", 0, 1), ("fork", 1, 2)]),
    ("an empty sequence and a reserved empty block", 6, 4,
     [("allocate_for_sequence", 0, 0), ("allocate_for_sequence", 1, 8), ("append_block_to_sequence", 1),
      ("append_block_to_sequence", 0)]),
    ("a full pool", 3, 2, [("allocate_for_sequence", 0, 6)]),
    ("everything freed, the queue out of id order", 8, 4,
     [("allocate_for_sequence", 0, 10), ("allocate_for_sequence", 1, 3), ("fork", 1, 2),
      ("allocate_for_sequence", 3, 9), ("free_sequence", 0), ("free_sequence", 1), ("free_sequence", 2),
      ("free_sequence", 3)]),
    ("blocks of one slot, shared and scattered", 12, 1,
     [("allocate_for_sequence", 0, 3), ("allocate_for_sequence", 1, 2), ("fork", 0, 2), ("free_sequence", 0),
      ("allocate_for_sequence", 3, 5), ("fork", 2, 5)]),
]

# The base of every corruption: 10 blocks of 4 slots; sequences 1 and 2 share block 3, sequence 3 holds
# blocks 4 and 5; the free queue is [6, 7, 8, 9, 2, 1, 0].
BASE_TRACE: List[Op] = [("allocate_for_sequence", 0, 10), ("allocate_for_sequence", 1, 3), ("fork", 1, 2),
                        ("allocate_for_sequence", 3, 5), ("free_sequence", 0)]


def _corruptions() -> List[Tuple[str, Callable[[Books], None]]]:
    """(what is wrong, how to break the base books): one realistic bug each."""

    def drop_free(block: int) -> Callable[[Books], None]:
        return lambda b: b["free"].remove(block)

    def set_count(block: int, count: int) -> Callable[[Books], None]:
        return lambda b: b["ref_counts"].__setitem__(block, count)

    def both(*steps: Callable[[Books], None]) -> Callable[[Books], None]:
        def run(b: Books) -> None:
            for step in steps:
                step(b)
        return run

    return [
        ("block 9 is free (count 0) but missing from the free queue: it leaked", drop_free(9)),
        ("block 6 is in the free queue twice", lambda b: b["free"].append(6)),
        ("block 4 is held by sequence 3 and also waits in the free queue", lambda b: b["free"].append(4)),
        ("block 4 waits in the free queue while sequence 3 holds it, and free block 9 is missing from the queue "
         "(the number of free blocks still adds up)", both(lambda b: b["free"].append(4), drop_free(9))),
        ("block 4 counts 2 holders but one table holds it", set_count(4, 2)),
        ("block 3 is held by sequences 1 and 2 but counts 1 holder", set_count(3, 1)),
        ("block 9 counts -1 holders", set_count(9, -1)),
        ("block 3 counts 0 holders while two tables hold it, and it waits in the free queue",
         both(set_count(3, 0), lambda b: b["free"].append(3))),
        ("sequence 3's table lists block 10, outside a pool of 10 blocks",
         both(lambda b: b["tables"][3].append(10), lambda b: b["lengths"].__setitem__(3, 9))),
        ("the free queue holds block id 10, outside a pool of 10 blocks", lambda b: b["free"].append(10)),
        ("sequence 3's table lists block -1 (and block 9 counts one holder, out of the queue): a negative id "
         "is no block", both(lambda b: b["tables"][3].append(-1), set_count(9, 1), drop_free(9),
                             lambda b: b["lengths"].__setitem__(3, 9))),
        ("the free queue holds block id -1 in place of block 9", lambda b: b["free"].__setitem__(
            b["free"].index(9), -1)),
        ("the free queue holds 9.0, a float, in place of block 9: a block id is an int", lambda b: b["free"].__setitem__(
            b["free"].index(9), 9.0)),
        ("the free queue holds True in place of block 1: a bool equals 1, yet it is no block id",
         lambda b: b["free"].__setitem__(b["free"].index(1), True)),
        ("sequence 3's table lists 5.0, a float, in place of block 5: a block id is an int",
         lambda b: b["tables"][3].__setitem__(1, 5.0)),
        ("sequence 3's table lists block 5 twice (and block 5 counts 2 holders)",
         both(lambda b: b["tables"][3].append(5), set_count(5, 2), lambda b: b["lengths"].__setitem__(3, 9))),
        ("sequence 3's table lists block 4 twice (block 4 counts 1 holder: one table)",
         both(lambda b: b["tables"][3].append(4), lambda b: b["lengths"].__setitem__(3, 9))),
        ("sequence 0 was freed but its length stayed behind", lambda b: b["lengths"].__setitem__(0, 10)),
        ("sequence 3 holds 9 tokens in 2 blocks of 4 slots: they do not fit",
         lambda b: b["lengths"].__setitem__(3, 9)),
        ("sequence 3 holds 1 token in 2 blocks of 4 slots: a whole block too many",
         lambda b: b["lengths"].__setitem__(3, 1)),
    ]


def _books(alloc: BlockManager) -> Books:
    return library_state(alloc)


def _install(a: Script, books: Books, what: str) -> None:
    """Put ``books`` into the learner's allocator, attribute by attribute (``free`` as a deque)."""
    from collections import deque

    for name, value in books.items():
        value = copy.deepcopy(value)
        setattr(a.obj, name, deque(value) if name == "free" else value)
    a.lines.append(f"a.free, a.ref_counts, a.tables, a.lengths = <{what}>")


def _checker_outcome(a: Script) -> Optional[BaseException]:
    """Run the learner's ``check_invariants``: the exception it raised, or None."""
    try:
        a.attribute("check_invariants")()
    except NotImplementedError as exc:
        raise not_written(exc) from None
    except Exception as exc:  # noqa: BLE001 - AssertionError is the contract; anything else is reported
        return exc
    return None


def _show_books(books: Books) -> str:
    return (f"free={books['free']}, ref_counts={books['ref_counts']}, tables={books['tables']}, "
            f"lengths={books['lengths']}")


def check_invariants_03(MyAllocator: Any) -> None:
    """Task 03.2: ``check_invariants()`` is silent on valid books and raises AssertionError on each corruption."""
    tasks_written(MyAllocator, "03.2", (("check_invariants", ()),))
    for what, num_blocks, block_size, trace in VALID_TRACES:
        books = _books(_replay(num_blocks, block_size, trace))
        a = Script(MyAllocator, num_blocks, block_size)
        _install(a, books, f"{what}: {_show_books(books)}")
        got = _checker_outcome(a)
        call = a.where("a.check_invariants()")
        if got is not None:
            raise fail(call, "no error (these books are consistent)", f"{type(got).__name__}: {got}",
                       f"a false alarm on valid books ({what}): shared blocks, empty tables and a block reserved "
                       "ahead are all fine")
        after = a.snapshot()
        if after != books:
            raise fail(f"{call}\n    then the books", _show_books(books), _show_books(after),
                       "check_invariants only reads: it changed the books")
    base = _books(_replay(10, 4, BASE_TRACE))
    for what, corrupt in _corruptions():
        books = copy.deepcopy(base)
        corrupt(books)
        a = Script(MyAllocator, 10, 4)
        _install(a, books, _show_books(books))
        got = _checker_outcome(a)
        call = a.where(f"a.check_invariants()  # {what}")
        if got is None:
            raise fail(call, "an AssertionError", "no error", f"your checker missed it: {what}")
        if not isinstance(got, AssertionError):
            raise fail(call, "an AssertionError", f"{type(got).__name__}: {got}",
                       "report every broken rule with an AssertionError, even for block ids a list cannot index")
        after = a.snapshot()
        if after != books:
            raise fail(f"{call}\n    then the books", _show_books(books), _show_books(after),
                       "check_invariants only reads: it changed the books")
    passed("03.2")


# --------------------------------------------------------------------------- 03.3
def _design_state(a: Script, spare: List[int], refs: Dict[int, int], lengths: Dict[int, int], hint: str) -> None:
    """The repaired class keeps ShakyAllocator's own books: the ``spare`` stack and the ``refs`` dict."""
    for name, want in (("spare", spare), ("refs", refs), ("lengths", lengths)):
        try:
            got = getattr(a.obj, name)
        except AttributeError:
            raise fail(a.where(f"a.{name}"), want, "no such attribute",
                       "keep ShakyAllocator's design (its spare stack and refs dict): the task is to repair it, "
                       "not to replace it") from None
        if got != want:
            raise fail(a.where(f"a.{name}"), want, got, hint)


# Short call sequences a reviewer tries first: sharing then freeing, a refusal then a retry, forks onto
# live ids. The random differential after them explores the rest.
REVIEW_TRACES: List[Tuple[int, int, List[Op]]] = [
    (4, 2, [("allocate_for_sequence", 0, 3), ("fork", 0, 1), ("free_sequence", 0), ("allocate_for_sequence", 2, 8),
            ("free_sequence", 1), ("allocate_for_sequence", 3, 4)]),
    (2, 2, [("allocate_for_sequence", 0, 9), ("allocate_for_sequence", 0, 2), ("free_sequence", 0)]),
    (6, 2, [("allocate_for_sequence", 0, 2), ("allocate_for_sequence", 1, 2), ("fork", 0, 1), ("fork", 0, 0),
            ("free_sequence", 1), ("free_sequence", 0), ("allocate_for_sequence", 2, 12)]),
]


def _outcome(fn: Callable[..., Any], args: Tuple[Any, ...]) -> str:
    try:
        fn(*args)
    except NotImplementedError:
        raise
    except RuntimeError:
        return "a RuntimeError"
    except ValueError:
        return "a ValueError"
    except Exception as exc:  # noqa: BLE001 - reported as what it is
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _compare_on(cls: Any, num_blocks: int, block_size: int, trace: Sequence[Op]) -> None:
    """Replay ``trace`` on the learner's class and the library; the first difference in outcome or free count."""
    ref = library(num_blocks, block_size)
    lines = [f"a = Repaired({num_blocks}, {block_size})"]
    mine = call_learner(cls, (num_blocks, block_size), lines[0], "an allocator")
    for method, *args in trace:
        lines.append(f"a.{method}({', '.join(map(repr, args))})")
        want = _outcome(getattr(ref, method), tuple(args))
        try:
            got = _outcome(getattr(mine, method), tuple(args))
        except NotImplementedError as exc:
            raise not_written(exc) from None
        code = "\n    ".join(lines)
        head = f"Repaired differs from the library's allocator on this call sequence:\n    {code}\n"
        if got != want:
            raise fail(head, want, got, "the last line is where: find the code that decides this call")
        free = getattr(mine, "num_free_blocks", None)
        if free != ref.num_free_blocks:
            raise fail(head + "  then a.num_free_blocks", ref.num_free_blocks, free,
                       "the last line is where: which blocks should be free now?")


def check_repaired_03(repaired_allocator: Any) -> None:
    """Task 03.3: the class ``repaired_allocator()`` returns is ShakyAllocator with its three bugs fixed."""
    cls = call_learner(repaired_allocator, (), "repaired_allocator()", "a class")
    if not callable(cls):
        raise fail("repaired_allocator()", "a class", cls, "return the repaired class itself")
    for num_blocks, block_size, trace in REVIEW_TRACES:
        _compare_on(cls, num_blocks, block_size, trace)
    run_differential(cls, SHARING_OPS, "03.3", max_examples=80, announce=False)
    # The differential passed; the repair must also keep the design's own books right.
    a = Script(cls, 6, 2, name="Repaired")
    a.call("allocate_for_sequence", 0, 3)
    a.call("fork", 0, 1)
    _design_state(a, [5, 4, 3, 2], {0: 2, 1: 2}, {0: 3, 1: 3}, "the design's books disagree with its behaviour")
    a.refused("allocate_for_sequence", (2, 20), RuntimeError, accepted="20 tokens need 10 blocks, 4 are free")
    _design_state(a, [5, 4, 3, 2], {0: 2, 1: 2}, {0: 3, 1: 3},
                  "a refused call must change nothing, and it left something behind")
    a.call("free_sequence", 0)
    _design_state(a, [5, 4, 3, 2], {0: 1, 1: 1}, {1: 3}, "blocks 0 and 1 are still held by sequence 1")
    a.call("free_sequence", 1)
    _design_state(a, [5, 4, 3, 2, 1, 0], {}, {}, "nobody holds blocks 0 and 1 any more: they are spare again")
    passed("03.3")
