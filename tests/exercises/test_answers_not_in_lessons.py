"""CI gate: no graded answer is printed in a lesson (issue 13, section 1).

A lesson teaches the idea; the exercise asks for what the lesson did not print. This gate
tokenizes, with Python's :mod:`tokenize`, the solution region of every task (the lines
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` in ``exercises/solutions/*.ipynb``,
all regions of a task together, grouped by the cell metadata ``paged_kv.task``) and every
code cell of every lesson, and fails a task when 60% or more of its solution tokens lie in
a run shared with one lesson code cell that is either

* at least 6 tokens long, token for token identical (same kind, same text), or
* at least 12 tokens long and of the same *shape*: every identifier (keywords stay),
  number and string replaced by a placeholder, so renaming variables or changing the
  text of an error message does not hide a copy.

What counts as a token: comments, docstrings (a string that is a statement on its own),
and the layout tokens NEWLINE, NL, INDENT, DEDENT, ENCODING and ENDMARKER are dropped, so
a run can cross a line break but re-indenting or commenting does not break it. Lesson
lines that start with an IPython magic (``%``, ``!``) are blanked first. A run never
crosses the border between two solution regions or two lesson cells.

Coverage is a union over all lesson code: a solution token counts when some common run
with any lesson cell contains it (an answer printed in pieces across cells or lessons is
still caught). The failure message names the lesson cell that covers the most tokens
and quotes its first lines.

The same measure runs against the library code importable while a task's exercise is
graded (every module of ``paged_kv_lib`` except the exercise's ``FORBIDDEN``; issue 22):
a reference solution that the library already holds is an answer one import away.

Run it alone: ``.venv/bin/python -m pytest tests/exercises/test_answers_not_in_lessons.py -q -s``
(``-s`` shows the five largest library shares); or
``.venv/bin/python tests/exercises/test_answers_not_in_lessons.py`` prints every task's two shares
(lessons, then library).
"""

from __future__ import annotations

import json
import re
import textwrap
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
SOLUTIONS = ROOT / "exercises" / "solutions"

EXACT_RUN = 6
SHAPE_RUN = 12
MAX_SHARE = 0.60

_BEGIN = re.compile(r"^[ \t]*### BEGIN SOLUTION[ \t]*$")
_END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
# The token measure is the grader's own (paged_kv_course.grading.delegation), shared by this gate.
from paged_kv_course.grading.delegation import Token, shape_of, tokens_of  # noqa: E402


@dataclass(frozen=True)
class LessonCell:
    """One lesson code cell, tokenized."""

    where: str  # "lessons/04_address_translation.ipynb cell 12"
    source: str
    tokens: tuple[Token, ...]


@dataclass(frozen=True)
class Match:
    """How much of one task's solution the lessons print, and where most of it comes from."""

    task: str
    total: int
    covered: int
    best_cell: LessonCell | None
    best_covered: int

    @property
    def share(self) -> float:
        return self.covered / self.total if self.total else 0.0


class LessonIndex:
    """All K-grams (exact and shape) of a set of lesson cells, with the cells holding each."""

    def __init__(self, cells: Iterable[LessonCell], exact_run: int = EXACT_RUN, shape_run: int = SHAPE_RUN):
        self.cells = list(cells)
        self.exact_run, self.shape_run = exact_run, shape_run
        self.exact: dict[tuple[Token, ...], set[int]] = {}
        self.shape: dict[tuple[Token, ...], set[int]] = {}
        for number, cell in enumerate(self.cells):
            _add_grams(self.exact, cell.tokens, exact_run, number)
            _add_grams(self.shape, tuple(shape_of(t) for t in cell.tokens), shape_run, number)

    def match(self, task: str, regions: Sequence[Sequence[Token]], allowed: set[int] | None = None) -> Match:
        """Which tokens of ``regions`` lie in a run shared with a lesson cell (one of ``allowed``, when given)."""
        total = covered = 0
        per_cell: dict[int, int] = {}
        for region in regions:
            hits: list[set[int]] = [set() for _ in region]
            for grams, run, seq in (
                (self.exact, self.exact_run, tuple(region)),
                (self.shape, self.shape_run, tuple(shape_of(t) for t in region)),
            ):
                for start in range(len(seq) - run + 1):
                    found = grams.get(seq[start:start + run])
                    if found and allowed is not None:
                        found = found & allowed
                    if found:
                        for i in range(start, start + run):
                            hits[i] |= found
            total += len(region)
            covered += sum(1 for h in hits if h)
            for h in hits:
                for number in h:
                    per_cell[number] = per_cell.get(number, 0) + 1
        if not per_cell:
            return Match(task, total, covered, None, 0)
        best = max(per_cell, key=lambda n: (per_cell[n], -n))
        return Match(task, total, covered, self.cells[best], per_cell[best])


def _add_grams(index: dict[tuple[Token, ...], set[int]], seq: Sequence[Token], run: int, number: int) -> None:
    seq = tuple(seq)
    for start in range(len(seq) - run + 1):
        index.setdefault(seq[start:start + run], set()).add(number)


def solution_regions(source: str) -> list[str]:
    """The text between each BEGIN/END SOLUTION marker pair of one cell."""
    regions, current = [], None
    for line in source.splitlines():
        if _BEGIN.match(line):
            current = []
        elif _END.match(line):
            if current is not None:
                regions.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return regions


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def lesson_cells(lessons: Path = LESSONS) -> list[LessonCell]:
    """Every code cell of every lesson notebook, tokenized."""
    out = []
    for path in sorted(lessons.glob("*.ipynb")):
        for index, cell in enumerate(_cells(path)):
            if cell.get("cell_type") == "code":
                source = _source(cell)
                out.append(LessonCell(f"{path.relative_to(ROOT)} cell {index}", source, tuple(tokens_of(source))))
    return out


def task_regions(solutions: Path = SOLUTIONS) -> dict[str, list[list[Token]]]:
    """Tokenized solution regions of every task of every solution notebook, by task id."""
    tasks: dict[str, list[list[Token]]] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        for cell in _cells(path):
            task = (cell.get("metadata", {}).get("paged_kv") or {}).get("task")
            if cell.get("cell_type") != "code" or not isinstance(task, str):
                continue
            for region in solution_regions(_source(cell)):
                tasks.setdefault(task, []).append(tokens_of(region))
    return tasks


def describe(match: Match) -> str:
    """One readable paragraph: the task, its share, and the lesson cell it matches most."""
    text = (f"task {match.task}: {match.covered}/{match.total} solution tokens "
            f"({match.share:.0%}) lie in runs a lesson prints")
    if match.best_cell is not None:
        first = "\n".join("      " + line for line in match.best_cell.source.strip().splitlines()[:6])
        text += (f"; most from {match.best_cell.where} ({match.best_covered} tokens):\n{first}")
    return text


_INDEX: LessonIndex | None = None


def _index() -> LessonIndex:
    global _INDEX
    if _INDEX is None:
        _INDEX = LessonIndex(lesson_cells())
    return _INDEX


_TASKS = task_regions()


@pytest.mark.parametrize("task", sorted(_TASKS))
def test_solution_is_not_printed_in_a_lesson(task: str) -> None:
    match = _index().match(task, _TASKS[task])
    assert match.total > 0, f"task {task}: its solution region has no code"
    if match.share >= MAX_SHARE:
        pytest.fail(
            describe(match) + f"\n  -> the lesson prints the answer; move that build into the exercise "
            f"or make the task go further (the gate fails at {MAX_SHARE:.0%})",
            pytrace=False,
        )


# --- the same gate against the library code a solution may import while its exercise is graded ---
#
# Official grading hides from the learner's kernel the modules an exercise forbids
# (``FORBIDDEN`` in checks_NN.py, read by paged_kv_course.grading.delegation); everything
# else in paged_kv_lib is one import away. A reference solution that stands, at 60% or
# more of its tokens, in that code is an answer the learner can import. Each library
# module is one "cell" (runs do not cross files); comments and docstrings do not count.

LIBRARY = ROOT / "paged_kv_lib"
COURSE_PACKAGE = ROOT / "course" / "paged_kv_course"


def library_cells(library: Path = LIBRARY) -> list[LessonCell]:
    """Every module of the library, tokenized; ``where`` is its dotted module name."""
    out = []
    for path in sorted(library.rglob("*.py")):
        parts = path.relative_to(library.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source = path.read_text(encoding="utf-8")
        out.append(LessonCell(module, source, tuple(tokens_of(source))))
    return out


def importable(cells: Sequence[LessonCell], exercise: str) -> set[int]:
    """The cells (modules) a solution of ``exercise`` may import: all but its forbidden modules, and
    but the starters of earlier exercises (they hold the learner's own earlier answers, which a later
    exercise builds on: sharing them is continuity, not a copied answer)."""
    from paged_kv_course.grading.delegation import forbidden_modules, is_forbidden

    forbidden = forbidden_modules(exercise) + ("paged_kv_course.starters",)
    return {n for n, cell in enumerate(cells) if not is_forbidden(cell.where, forbidden)}


_LIBRARY_INDEX: LessonIndex | None = None


def _library_index() -> LessonIndex:
    global _LIBRARY_INDEX
    if _LIBRARY_INDEX is None:
        # Exact runs only, as the grader's delegation rule reads a paste: same-shape runs of library code
        # match the idioms any short glue shares with it (an argument list, a padding to a power of two).
        no_shape_runs = 10**9
        _LIBRARY_INDEX = LessonIndex(library_cells() + library_cells(COURSE_PACKAGE), shape_run=no_shape_runs)
    return _LIBRARY_INDEX


def library_match(task: str) -> Match:
    index = _library_index()
    return index.match(task, _TASKS[task], importable(index.cells, task[:2]))


def describe_library(match: Match) -> str:
    text = (f"task {match.task}: {match.covered}/{match.total} solution tokens ({match.share:.0%}) lie in runs "
            "shared with library code importable while its exercise is graded")
    if match.best_cell is not None:
        text += (f"; most from {match.best_cell.where} ({match.best_covered} tokens): add it to FORBIDDEN in "
                 f"checks_{match.task[:2]}.py, or make the task ask for more than that module does")
    return text


def test_print_the_largest_library_shares() -> None:
    """Not a gate: prints the five largest shares so the margin below 60% is visible (pytest -s)."""
    matches = sorted((library_match(t) for t in _TASKS), key=lambda m: -m.share)
    for m in matches[:5]:
        print(f"{m.task:6} {m.share:4.0%} {m.covered:4}/{m.total:<4} {m.best_cell.where if m.best_cell else '-'}")
    assert matches


@pytest.mark.parametrize("task", sorted(_TASKS))
def test_solution_is_not_importable_library_code(task: str) -> None:
    match = library_match(task)
    assert match.total > 0, f"task {task}: its solution region has no code"
    if match.share >= MAX_SHARE:
        pytest.fail(describe_library(match) + f" (the gate fails at {MAX_SHARE:.0%})", pytrace=False)


def test_forbidden_modules_do_not_count(monkeypatch) -> None:
    from paged_kv_course.grading import delegation

    cells = [LessonCell("paged_kv_lib.allocator", _LESSON_BUILD, tuple(tokens_of(_LESSON_BUILD))),
             LessonCell("paged_kv_lib.errors", _UNRELATED, tuple(tokens_of(_UNRELATED)))]
    index = LessonIndex(cells)
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: ())
    assert index.match("toy.1", [tokens_of(_RENAMED_COPY)], importable(cells, "06")).share >= MAX_SHARE
    monkeypatch.setattr(delegation, "forbidden_modules", lambda exercise: ("paged_kv_lib.allocator",))
    assert index.match("toy.1", [tokens_of(_RENAMED_COPY)], importable(cells, "06")).covered == 0


def test_library_modules_are_named_as_imported() -> None:
    names = {cell.where for cell in library_cells() + library_cells(COURSE_PACKAGE)}
    assert {"paged_kv_lib", "paged_kv_lib.allocator", "paged_kv_course.grading.checks_02"} <= names


# --- the matcher itself -------------------------------------------------------------

_LESSON_BUILD = '''
def blocks_needed(num_tokens, block_size):
    """How many blocks hold num_tokens tokens."""
    if num_tokens < 0:
        raise ValueError(f"negative: {num_tokens}")
    full, rest = divmod(num_tokens, block_size)
    return full + (1 if rest else 0)

def take(pool, seq_id, count):
    table = [pool.free.popleft() for _ in range(count)]   # oldest first
    pool.tables[seq_id] = table
    return list(table)
'''

_RENAMED_COPY = '''
    # my own version, honest
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    whole, extra = divmod(n, bs)
    return whole + (1 if extra else 0)
'''

_UNRELATED = '''
    heads = q.shape[1]
    scores = torch.einsum("hd,thd->ht", q, keys) / math.sqrt(q.shape[-1])
    weights = scores.softmax(dim=-1)
    return torch.einsum("ht,thd->hd", weights, values)
'''


def _toy_index() -> LessonIndex:
    return LessonIndex([LessonCell("toy lesson cell 0", _LESSON_BUILD, tuple(tokens_of(_LESSON_BUILD)))])


def test_matcher_catches_a_renamed_copy() -> None:
    match = _toy_index().match("toy.1", [tokens_of(_RENAMED_COPY)])
    assert match.share >= MAX_SHARE, describe(match)
    assert match.best_cell is not None and match.best_cell.where == "toy lesson cell 0"


def test_matcher_catches_a_verbatim_copy_split_in_two_regions() -> None:
    body = textwrap.dedent(_LESSON_BUILD).split("def take")[1]
    first, second = body.splitlines()[1:3], body.splitlines()[3:]
    match = _toy_index().match("toy.2", [tokens_of("\n".join(first)), tokens_of("\n".join(second))])
    assert match.share >= MAX_SHARE, describe(match)


def test_matcher_passes_unrelated_code() -> None:
    match = _toy_index().match("toy.3", [tokens_of(_UNRELATED)])
    assert match.covered == 0, describe(match)


def test_comments_docstrings_and_layout_do_not_count() -> None:
    plain = tokens_of("x = f(a)\nreturn x\n")
    dressed = tokens_of('"""Doc."""\n# note\nx = f(  # why\n    a)\n\n\nreturn x  # done\n')
    assert plain == dressed
    assert tokens_of("%timeit f()\ny = 1\n") == tokens_of("y = 1\n")
    assert (tokenize.STRING, "'kept'") in tokens_of("x = 'kept'\n")


def test_solution_regions_are_read_between_the_markers() -> None:
    source = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\nprint(2)\n"
    assert solution_regions(source) == ["    return 1"]


if __name__ == "__main__":
    index = _index()
    for task in sorted(_TASKS, key=lambda t: tuple(int(p) for p in t.split("."))):
        for m in (index.match(task, _TASKS[task]), library_match(task)):
            flag = "FAIL" if m.share >= MAX_SHARE else "ok  "
            where = m.best_cell.where if m.best_cell else "-"
            print(f"{flag} {task:6} {m.share:4.0%} {m.covered:4}/{m.total:<4} {where}")


def test_a_verbatim_paste_of_library_code_trips_the_library_gate() -> None:
    import inspect

    from paged_kv_lib.simulate.buddy import BuddyAllocator

    pasted = tokens_of(inspect.getsource(BuddyAllocator))
    assert _library_index().match("paste", [pasted]).share >= MAX_SHARE
