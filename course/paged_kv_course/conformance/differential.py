"""``check_allocator``: a learner's allocator class against the library's, under random call sequences.

Hypothesis draws a small pool (block sizes 1-5, 1-12 blocks) and a sequence of calls
(allocations of 0 or more tokens, appends, forks, frees, lookups of unknown ids) and runs
it on the learner's class and on the library's :class:`~paged_kv_lib.block_manager.BlockManager` with prefix
caching off. After every call it compares what every correct allocator must agree on:

* whether the call failed, and with which kind of error (``ValueError`` / ``RuntimeError``);
* ``num_free_blocks``, and each live sequence's table length;
* which logical blocks of which sequences share a physical block (not the ids themselves);
* what ``append_tokens`` returned: how many new ids, and whether it copied a shared block;
* that a call which failed changed nothing.

The first difference stops the run; hypothesis then shrinks the call sequence, and the
``AssertionError`` raised shows the shortest one it found as code you can paste and run. A method
that raises ``NotImplementedError`` (not written yet) stops the check at once, unshrunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Optional, Sequence, Tuple

from paged_kv_lib.block_manager import BlockManager

__all__ = ["OPERATIONS", "PARTS", "check_allocator"]

#: What ``ops=`` may name: the contract's methods, plus ``"copy_on_write"`` (appending to a
#: sequence whose last block is shared and not full copies that block first).
OPERATIONS: Tuple[str, ...] = (
    "allocate_for_sequence",
    "get_block_mapping",
    "free_sequence",
    "fork",
    "append_tokens",
    "copy_on_write",
)
_REQUIRED = ("allocate_for_sequence", "get_block_mapping")

#: The operations each exercise has built so far (what its check passes as ``ops``).
PARTS: Dict[str, Tuple[str, ...]] = {
    "02": ("allocate_for_sequence", "get_block_mapping"),
    "03": ("allocate_for_sequence", "get_block_mapping", "free_sequence", "fork"),
    "05": ("allocate_for_sequence", "get_block_mapping", "free_sequence", "fork", "append_tokens"),
    "06": OPERATIONS,
}

_SEQ_IDS = 4  # sequence ids 0..3: enough for duplicates, unknown ids and forks to happen often


class _Difference(Exception):
    """The learner's allocator and the library disagreed; carries the readable report."""

    def __init__(self, lines: Sequence[str], what: str, expected: str, got: str, context: str = "") -> None:
        self.report = (lines, what, expected, got, context)
        super().__init__(what)


@dataclass(frozen=True)
class _Call:
    method: str
    args: Tuple[int, ...]

    def code(self) -> str:
        return f"a.{self.method}({', '.join(repr(a) for a in self.args)})"


def _reference(num_blocks: int, block_size: int) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=False)


def _resolve(ops: Optional[Collection[str]]) -> Tuple[str, ...]:
    if ops is None:
        return OPERATIONS
    if isinstance(ops, str):
        raise TypeError(f"ops must be a collection of operation names, not the string {ops!r}")
    chosen = tuple(ops)
    unknown = [op for op in chosen if op not in OPERATIONS]
    if unknown:
        raise ValueError(f"unknown operation(s) {unknown}; choose from {list(OPERATIONS)}")
    missing = [op for op in _REQUIRED if op not in chosen]
    if missing:
        raise ValueError(f"ops must include {list(_REQUIRED)} (missing {missing}): every comparison needs them")
    return tuple(op for op in OPERATIONS if op in chosen)


def _strategy(ops: Tuple[str, ...]) -> Any:
    from hypothesis import strategies as st

    seq = st.integers(0, _SEQ_IDS - 1)

    def calls_for(block_size: int) -> Any:
        allocate = st.builds(
            lambda s, n: _Call("allocate_for_sequence", (s, n)), seq, st.integers(0, 4 * block_size + 1)
        )
        kinds = [allocate, allocate, st.builds(lambda s: _Call("get_block_mapping", (s,)), seq)]
        if "free_sequence" in ops:
            kinds.append(st.builds(lambda s: _Call("free_sequence", (s,)), seq))
        if "fork" in ops:
            kinds.append(st.builds(lambda p, c: _Call("fork", (p, c)), seq, seq))
        if "append_tokens" in ops:
            counts = st.one_of(st.just(1), st.integers(0, 2 * block_size + 1))
            kinds.append(st.builds(lambda s, n: _Call("append_tokens", (s, n)), seq, counts))
        return st.one_of(*kinds)

    # Built once: making strategies inside every draw costs more than running the calls.
    by_block_size = {bs: calls_for(bs) for bs in range(1, 6)}

    @st.composite
    def scenario(draw: Any) -> Tuple[int, int, List[_Call]]:
        block_size = draw(st.integers(1, 5))
        num_blocks = draw(st.integers(1, 12))
        # A drawn length (not st.lists' short default), so sequences get long enough to fork
        # a partly filled sequence and grow it; hypothesis still shrinks the length.
        length = draw(st.integers(0, 24))
        calls = draw(st.lists(by_block_size[block_size], min_size=length, max_size=length))
        return num_blocks, block_size, calls

    return scenario()


# ------------------------------------------------------------------ one run
def _error_kind(exc: BaseException) -> str:
    for kind in (ValueError, RuntimeError):
        if isinstance(exc, kind):
            return kind.__name__
    return type(exc).__name__


def _shape(tables: Dict[int, List[int]]) -> Dict[int, List[str]]:
    """Tables with block ids renamed A, B, C... in order of first use: equal shapes share alike."""
    names: Dict[int, str] = {}
    out = {}
    for seq_id in sorted(tables):
        row = []
        for block_id in tables[seq_id]:
            if block_id not in names:
                names[block_id] = _label(len(names))
            row.append(names[block_id])
        out[seq_id] = row
    return out


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"B{i}"


def _show_shape(shape: Dict[int, List[str]]) -> str:
    return "{" + ", ".join(f"{s}: [{', '.join(row)}]" for s, row in shape.items()) + "}"


class _Run:
    """One call sequence on both allocators, stopping at the first difference."""

    def __init__(self, cls: Any, name: str, num_blocks: int, block_size: int, cow: bool) -> None:
        self.cls, self.name, self.cow = cls, name, cow
        self.num_blocks, self.block_size = num_blocks, block_size
        self.lines = [f"a = {name}(num_blocks={num_blocks}, block_size={block_size})"]
        self.ref = _reference(num_blocks, block_size)

    def differ(self, what: str, expected: str, got: str, context: str = "") -> _Difference:
        return _Difference(self.lines, what, expected, got, context)

    def learner(self, method: str, *args: int) -> Any:
        """Call the learner; an exception other than NotImplementedError is returned, not raised."""
        try:
            return getattr(self.mine, method)(*args)
        except NotImplementedError:
            raise
        except Exception as exc:  # compared with the library's outcome by the caller
            return _Raised(exc)

    def start(self) -> None:
        try:
            self.mine = self.cls(self.num_blocks, self.block_size)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise self.differ("creating the allocator", "an allocator", f"{type(exc).__name__}: {exc}") from None
        self.tables = self.compare_state("after creating it")

    # ----------------------------------------------------------- state
    def free_count(self, when: str) -> int:
        try:
            value = self.mine.num_free_blocks
        except NotImplementedError:
            raise
        except Exception as exc:
            raise self.differ(f"reading a.num_free_blocks {when}", str(self.ref.num_free_blocks),
                              f"{type(exc).__name__}: {exc}") from None
        if callable(value):
            raise self.differ(f"reading a.num_free_blocks {when}", "an int",
                              "a method: make num_free_blocks an attribute or a property")
        if type(value) is not int:
            raise self.differ(f"reading a.num_free_blocks {when}", "an int", f"{type(value).__name__} {value!r}")
        return value

    def mapping(self, seq_id: int, when: str) -> List[int]:
        got = self.learner("get_block_mapping", seq_id)
        if isinstance(got, _Raised):
            want = len(self.ref.get_block_mapping(seq_id))
            raise self.differ(f"a.get_block_mapping({seq_id}) {when}", f"a list of {want} block ids",
                              got.text, f"sequence {seq_id} exists in the library's allocator")
        if type(got) is not list or not all(type(b) is int for b in got):
            raise self.differ(f"a.get_block_mapping({seq_id}) {when}", "a list of int block ids", repr(got))
        bad = [b for b in got if not 0 <= b < self.num_blocks]
        if bad:
            raise self.differ(f"a.get_block_mapping({seq_id}) {when}", f"block ids in 0..{self.num_blocks - 1}",
                              f"{got} (ids {bad} are outside the pool)")
        return got

    def compare_state(self, when: str) -> Dict[int, List[int]]:
        want_free = self.ref.num_free_blocks
        free = self.free_count(when)
        if free != want_free:
            raise self.differ(f"a.num_free_blocks {when}", str(want_free), str(free), self.context())
        tables = {s: self.mapping(s, when) for s in self.ref.seq_ids}
        want = {s: self.ref.get_block_mapping(s) for s in self.ref.seq_ids}
        for seq_id in sorted(want):
            if len(tables[seq_id]) != len(want[seq_id]):
                raise self.differ(
                    f"len(a.get_block_mapping({seq_id})) {when}", str(len(want[seq_id])), str(len(tables[seq_id])),
                    self.context(),
                )
        if _shape(tables) != _shape(want):
            raise self.differ(
                f"which blocks are shared {when} (ids renamed A, B, ... in order of first use; "
                "equal letters = one physical block)",
                _show_shape(_shape(want)), _show_shape(_shape(tables)),
                f"your tables: {tables}",
            )
        return tables

    def context(self) -> str:
        parts = []
        for s in self.ref.seq_ids:
            n = self.ref.get_num_tokens(s)
            ids = self.ref.get_block_mapping(s)
            shared = n < len(ids) * self.block_size and self.ref.blocks[ids[-1]].ref_count > 1
            note = ", its last block shared and not full" if shared else ""
            parts.append(f"sequence {s} holds {n} token{'s' if n != 1 else ''}{note}")
        return "in the library now: " + ("; ".join(parts) if parts else "no sequences")

    # ----------------------------------------------------------- one call
    def would_copy(self, call: _Call) -> bool:
        seq_id, n = call.args
        if seq_id not in self.ref.seq_ids or n == 0:
            return False
        ids = self.ref.get_block_mapping(seq_id)
        blocks = self.ref.blocks
        room = self.ref.get_num_tokens(seq_id) < len(ids) * self.block_size
        return room and blocks[ids[-1]].ref_count > 1

    def accepted_errors(self, call: _Call) -> Tuple[str, ...]:
        """Error kinds a correct allocator may raise here (the contract orders no checks)."""
        if call.method == "allocate_for_sequence":
            seq_id, n = call.args
            kinds = []
            if seq_id in self.ref.seq_ids:
                kinds.append("ValueError")
            if self.ref.blocks_needed(n) > self.ref.num_free_blocks:
                kinds.append("RuntimeError")
            return tuple(kinds)
        return ()

    def step(self, call: _Call) -> None:
        if call.method == "append_tokens" and not self.cow and self.would_copy(call):
            return  # copy-on-write is not part of what is checked: skip the call on both sides
        before = self.tables
        context = self.context()
        copy_expected = call.method == "append_tokens" and self.would_copy(call)
        if copy_expected:
            context += f"; so growing sequence {call.args[0]} first copies that block (copy-on-write)"
        self.lines.append(call.code())
        try:
            ref_out: Any = getattr(self.ref, call.method)(*call.args)
            ref_error: Optional[str] = None
        except (ValueError, RuntimeError) as exc:
            ref_out, ref_error = None, _error_kind(exc)
        got = self.learner(call.method, *call.args)
        what = call.code()
        if ref_error is not None:
            accepted = self.accepted_errors(call) or (ref_error,)
            if not isinstance(got, _Raised):
                raise self.differ(what, f"a {' or '.join(accepted)}", f"it returned {got!r}", context)
            if got.kind not in accepted:
                raise self.differ(what, f"a {' or '.join(accepted)}", got.text, context)
            after = self.compare_state_after_failure(what, before)
            self.tables = after
            return
        if isinstance(got, _Raised):
            expected = "no error" if call.method != "get_block_mapping" else f"{list(ref_out)}, or the same shape"
            if call.method == "free_sequence" and call.args[0] not in before:
                expected = "no error (freeing an unknown id does nothing)"
            raise self.differ(what, expected, got.text, context)
        try:
            tables = self.compare_state(f"after {what}")
        except _Difference as diff:
            d_lines, d_where, d_expected, d_got, d_after = diff.report
            raise _Difference(d_lines, d_where, d_expected, d_got,
                              f"{d_after}; before the call: {context.replace('in the library now: ', '')}".replace(
                                  "in the library now", "in the library after the call")) from None
        if call.method == "append_tokens":
            self.check_returned(call, list(ref_out), got, before, tables, copy_expected, context)
        if call.method == "allocate_for_sequence":
            self.check_copy(call.args[0])
        elif call.method == "fork":
            self.check_copy(call.args[1])
        self.tables = tables

    def compare_state_after_failure(self, what: str, before: Dict[int, List[int]]) -> Dict[int, List[int]]:
        try:
            return self.compare_state(f"after the failed {what}")
        except _Difference as diff:
            lines, where, expected, got, _ = diff.report
            raise _Difference(lines, where, expected, got,
                              "the call failed, as it should, but a failed call must change nothing; "
                              f"your tables before it: {before}") from None

    def check_copy(self, seq_id: int) -> None:
        """The list get_block_mapping returns must be a copy: editing it changes nothing."""
        got = self.mapping(seq_id, "")
        got.append(-1)
        again = self.learner("get_block_mapping", seq_id)
        if isinstance(again, list) and again and again[-1] == -1:
            raise self.differ(
                f"a.get_block_mapping({seq_id}) after appending -1 to the list it returned",
                str(again[:-1]), str(again),
                "get_block_mapping must return a copy: a caller editing it must not change your table",
            )

    def check_returned(self, call: _Call, want: List[int], got: Any, before: Dict[int, List[int]],
                       tables: Dict[int, List[int]], copy_expected: bool, context: str) -> None:
        seq_id = call.args[0]
        old, new = before.get(seq_id, []), tables[seq_id]
        placed = [b for i, b in enumerate(new) if i >= len(old) or b != old[i]]
        copied = any(i < len(old) and b != old[i] for i, b in enumerate(new))
        what = call.code()
        if copy_expected and not copied:
            raise self.differ(what, f"{len(want)} new block id(s), the first a copy of the shared last block",
                              f"{got!r}, no copy", context)
        if copied and not copy_expected:
            raise self.differ(what, f"{len(want)} new block id(s), no block replaced",
                              f"{got!r}, and your table went from {old} to {new}", context)
        if type(got) is not list or not all(type(b) is int for b in got):
            raise self.differ(what, f"a list of {len(want)} int block id(s)", repr(got), context)
        if len(got) != len(want):
            raise self.differ(f"{what} returned", f"{len(want)} new block id(s)", repr(got), context)
        if got != placed:
            raise self.differ(f"{what} returned", f"the ids newly placed in the table, in order: {placed}",
                              repr(got), f"your table went from {old} to {new}")


class _NotWritten(BaseException):
    """A method not written yet (``NotImplementedError``), carried past hypothesis. Hypothesis shrinks only what
    its test raises as ``Exception``; shrinking the call sequence that reaches an unwritten method took seconds
    per check (4 s of 06's 7 s grade, untouched) and changes nothing the learner is told."""

    def __init__(self, error: NotImplementedError) -> None:
        super().__init__()
        self.error = error


class _Raised:
    """A learner exception, kept as data so it can be compared with the library's outcome."""

    def __init__(self, exc: BaseException) -> None:
        self.kind = _error_kind(exc)
        self.text = f"{type(exc).__name__}: {exc}"


def _run(cls: Any, name: str, ops: Tuple[str, ...], scenario: Tuple[int, int, List[_Call]]) -> None:
    num_blocks, block_size, calls = scenario
    run = _Run(cls, name, num_blocks, block_size, cow="copy_on_write" in ops)
    try:
        run.start()
        for call in calls:
            run.step(call)
    except NotImplementedError as exc:
        raise _NotWritten(exc) from None


def _report(name: str, diff: _Difference) -> str:
    lines, what, expected, got, context = diff.report
    code = "\n".join(f"    {line}" for line in lines)
    message = (
        f"{name} differs from the library's allocator on this call sequence "
        f"(the shortest found), the last line is where:\n\n{code}\n\n"
        f"{what}\n  expected: {expected}\n  got:      {got}"
    )
    if context:
        message += f"\n  ({context})"
    return message


def check_allocator(
    cls: Any,
    *,
    max_examples: int = 200,
    ops: Optional[Collection[str]] = None,
    name: Optional[str] = None,
) -> None:
    """Raise ``AssertionError`` unless ``cls`` behaves like the library's allocator (see the module doc).

    Args:
        cls: a class with the contract of :mod:`paged_kv_course.conformance`, built as
            ``cls(num_blocks, block_size)``.
        max_examples: call sequences hypothesis tries (derandomized: the same ones every run).
        ops: the operations to exercise, from :data:`OPERATIONS` (default: all of them). They
            must include ``allocate_for_sequence`` and ``get_block_mapping``. Without
            ``"copy_on_write"``, appends that would copy a shared block are left out, so a
            class that grows sequences but does not copy yet can be checked.
            :data:`PARTS` names the sets each exercise has built.
        name: how the class is called in the report (default: its ``__name__``).

    A ``NotImplementedError`` from the class propagates unchanged (a method not written yet).
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis.errors import Flaky

    chosen = _resolve(ops)
    if type(max_examples) is not int or max_examples < 1:
        raise ValueError(f"max_examples must be an int >= 1, got {max_examples!r}")
    label = name or getattr(cls, "__name__", None) or "MyAllocator"

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate, Phase.shrink),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(_strategy(chosen))
    def differential(scenario: Tuple[int, int, List[_Call]]) -> None:
        _run(cls, label, chosen, scenario)

    try:
        differential()
    except _NotWritten as stop:
        raise stop.error from None
    except _Difference as diff:
        raise AssertionError(_report(label, diff)) from None
    except Flaky:
        raise AssertionError(
            f"{label} gave different results for the same call sequence on two runs: does it keep state "
            "outside the instance (a class attribute, a global, a shared default list)?"
        ) from None
