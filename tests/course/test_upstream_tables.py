"""Every lesson 02-09 ends its "In real systems" section with a "Where this lives upstream" table.

The table names the vLLM release and the nano-vllm commit it was checked against, and its first
column names the course's pieces. Those names must exist here: a path (``paged_kv_lib/...``) must
be a file of the repository, and any other name is looked up from ``paged_kv_lib`` as a dotted
attribute (``BlockManager.fork``, ``engine.Scheduler.preempt_newest``), so that renaming a
bookkeeping file does not break the table but renaming a class or method does.

The upstream columns are checked only when the upstream sources are at hand: set
``UPSTREAM_VLLM_SRC`` (an unpacked vLLM source tree of the version the tables name) and
``UPSTREAM_NANO_VLLM_SRC`` (a nano-vllm checkout at the named commit); see docs/exercises.md,
"How the upstream tables were checked".
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Tuple

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p for p in (ROOT / "lessons").glob("0[2-9]_*.ipynb"))
HEADING = "### Where this lives upstream"
HEADER = ["Course piece (`paged_kv_lib`)", "vLLM v1", "nano-vllm", "What upstream does that the course does not"]
STAMP = re.compile(
    r"Checked against vLLM v(?P<vllm>\d+\.\d+\.\d+) \(commit (?P<vllm_commit>[0-9a-f]{7,40})\) "
    r"and nano-vllm \(commit (?P<nano_commit>[0-9a-f]{7,40})\)"
)
TICKED = re.compile(r"`([^`]+)`")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def cells(path: Path) -> List[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def table_cell(path: Path) -> Tuple[int, str]:
    """The markdown cell holding the upstream table, and its index among the markdown cells."""
    sources = cells(path)
    real = [i for i, s in enumerate(sources) if "## In real systems" in s]
    assert len(real) == 1, f"{path.name}: expected one '## In real systems' cell, found {len(real)}"
    for i in (real[0], real[0] + 1):  # the table sits in that cell or in the one right after it
        if i < len(sources) and HEADING in sources[i]:
            return real[0], sources[i]
    raise AssertionError(f"{path.name}: no '{HEADING}' at the 'In real systems' cell or right after it")


def split_row(line: str) -> List[str]:
    return [part.strip() for part in line.strip().strip("|").split("|")]


def parse_table(text: str) -> Tuple[List[str], List[List[str]]]:
    lines = [line for line in text[text.index(HEADING):].splitlines() if line.strip().startswith("|")]
    assert len(lines) >= 3, "the table needs a header row, a separator row and at least one row"
    header, sep, *rows = lines
    assert set(sep.replace("|", "").strip()) <= set("-: "), f"second line is not a separator: {sep!r}"
    return split_row(header), [split_row(r) for r in rows]


def resolve(name: str) -> object:
    """``paged_kv_lib``'s attribute (or submodule) at this dotted path; raises LookupError when it has none."""
    obj: object = importlib.import_module("paged_kv_lib")
    for part in name.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, ModuleType):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except ModuleNotFoundError as exc:
                raise LookupError(f"paged_kv_lib has no {name!r}: {exc}") from None
        elif part in getattr(obj, "__dataclass_fields__", {}) or part in getattr(obj, "__annotations__", {}):
            return obj  # a dataclass field without a default: declared on the class, not an attribute of it
        else:
            raise LookupError(f"paged_kv_lib has no {name!r} (no {part!r} on {obj!r})")
    return obj


def course_names(first_column: str) -> List[str]:
    return TICKED.findall(first_column)


def check_course_name(name: str) -> Optional[str]:
    """None when the course-side name exists, else why not."""
    if "/" in name:
        if not name.startswith("paged_kv_lib/"):
            return f"{name!r}: a course path must be under paged_kv_lib/"
        return None if (ROOT / name).is_file() else f"{name!r}: no such file in the repository"
    if not NAME.match(name):
        return f"{name!r}: neither a paged_kv_lib/ path nor a dotted name"
    try:
        resolve(name)
    except LookupError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def load(path: Path) -> Tuple[str, List[str], List[List[str]]]:
    """The lesson's table cell, header row and rows (each lesson on its own, so one broken lesson fails alone)."""
    _, text = table_cell(path)
    header, rows = parse_table(text)
    return text, header, rows


def test_every_lesson_02_to_09_is_covered():
    assert [p.name[:2] for p in LESSONS] == ["02", "03", "04", "05", "06", "07", "08", "09"]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_table_has_the_columns_and_names_its_versions(path):
    text, header, rows = load(path)
    assert header == HEADER, f"{path.name}: header row is {header}"
    stamp = STAMP.search(text)
    assert stamp, f"{path.name}: no 'Checked against vLLM vX.Y.Z (commit ...) and nano-vllm (commit ...)' line"
    assert text.index(stamp.group(0)) < text.index("| Course piece"), f"{path.name}: the versions go above the table"
    for row in rows:
        assert len(row) == len(HEADER), f"{path.name}: row has {len(row)} cells: {row}"
        assert all(cell for cell in row), f"{path.name}: empty cell in {row}"
        assert course_names(row[0]), f"{path.name}: the first column names no course piece: {row[0]!r}"


def test_every_table_names_the_same_versions():
    stamps = {stamp.group(0) for path in LESSONS if (stamp := STAMP.search(load(path)[0]))}
    assert len(stamps) == 1, f"the lessons were checked against different versions: {sorted(stamps)}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_course_side_names_exist(path):
    _, _, rows = load(path)
    problems = [why for row in rows for name in course_names(row[0]) if (why := check_course_name(name))]
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_the_checks_can_fail():
    """The checks above reject a broken table: a missing name, a missing path, a wrong header, no stamp."""
    assert check_course_name("BlockManager.fork") is None
    assert check_course_name("paged_kv_lib/attention/triton_kernel/decode.py") is None
    assert check_course_name("BlockManager.no_such_method")
    assert check_course_name("NoSuchClass")
    assert check_course_name("paged_kv_lib/no_such_file.py")
    assert check_course_name("vllm/v1/core/block_pool.py")
    broken = f"{HEADING}\n\n| Piece | vLLM |\n|---|---|\n| `Block` | `KVCacheBlock` |\n"
    header, _ = parse_table(broken)
    assert header != HEADER and not STAMP.search(broken)


# --- The upstream columns, when the sources are at hand -------------------------------------

def upstream_refs(cell: str) -> List[Tuple[str, str]]:
    """(file, name) pairs of one upstream cell: each ticked path, then the ticked names after it."""
    refs, current = [], None
    for token in TICKED.findall(cell):
        if "/" in token or re.search(r"\.(py|cu|cuh|cpp|h)$", token):
            current = token
            refs.append((current, ""))
        elif current is not None:
            refs.append((current, token))
    return refs


def defined(source: str, name: str) -> bool:
    if not NAME.match(name):  # a metric name, a string: it must appear as written
        return name in source
    first, *rest = name.split(".")
    if not re.search(rf"(^|\n)\s*(async\s+def|def|class)\s+{first}\b|(^|\n)\s*{first}\s*:|\b{first}\s*=|\b{first}\s*\(", source):
        return False
    return all(re.search(rf"\b{part}\b", source) for part in rest)


@pytest.mark.parametrize("column,env", [(1, "UPSTREAM_VLLM_SRC"), (2, "UPSTREAM_NANO_VLLM_SRC")])
def test_upstream_names_exist_in_the_named_version(column, env):
    root = os.environ.get(env)
    if not root:
        pytest.skip(f"set {env} to the upstream source tree to check these names")
    problems = []
    for path in LESSONS:
        lesson = path.name
        for row in load(path)[2]:
            for path, name in upstream_refs(row[column]):
                file = Path(root) / path
                if not file.is_file():
                    problems.append(f"{lesson}: no file {path}")
                elif name and not defined(file.read_text(errors="replace"), name):
                    problems.append(f"{lesson}: {path} has no {name}")
    assert not problems, "\n".join(problems)
