"""docs/library.md matches the code, and the library's imports keep their contracts.

* Every module of ``paged_kv_lib`` is on the map, every row names a module that exists (rows marked
  *planned* or *leaving* may be absent while a round's branches merge). The map's layers are its
  ``## N. Name`` headings, in order; its modules are the backticked paths in the first column of the
  table rows under them.
* "Reading the core" says true things: its line counts are ``wc -l`` of the files (the bookkeeping at
  most six files and 1,600 lines), and every step of its decode trace names the function defined at the
  cited line, in at most four files.
* import-linter's contracts (``[tool.importlinter]`` in ``pyproject.toml``: layers, independence,
  acyclic siblings, no course) hold; grimp counts lazy and ``TYPE_CHECKING`` imports too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "paged_kv_lib"
MAP = ROOT / "docs" / "library.md"

HEADING = re.compile(r"^## (\d+)\. (.+)$")
ROW = re.compile(r"^\|\s*`([^`]+\.py)`\s*\|(.*)\|\s*$")
MARK = re.compile(r"\*(planned|leaving)\b", re.IGNORECASE)



@dataclass(frozen=True)
class Row:
    path: str  # relative to paged_kv_lib/, e.g. "viz/svg.py"
    layer: int
    layer_name: str
    mark: Optional[str]  # "planned", "leaving" or None


def read_map(text: str) -> List[Row]:
    """The map's module rows, each with its layer (the position of its ``## N.`` heading)."""
    rows: List[Row] = []
    layer, name, numbers = -1, "", []
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            numbers.append(int(heading.group(1)))
            layer, name = int(heading.group(1)), heading.group(2).strip()
            continue
        row = ROW.match(line)
        if row:
            if layer < 0:
                raise AssertionError(f"docs/library.md: row {row.group(1)} comes before the first layer heading")
            mark = MARK.search(row.group(2))
            rows.append(Row(row.group(1), layer, name, mark.group(1).lower() if mark else None))
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), \
        f"docs/library.md: layer numbers must increase down the page, got {numbers}"
    return rows


def module_name(path: str) -> str:
    """``viz/svg.py`` -> ``paged_kv_lib.viz.svg``; ``__init__.py`` files name their package."""
    parts = ["paged_kv_lib", *path[:-3].split("/")]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_files() -> List[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


@pytest.fixture(scope="module")
def rows() -> List[Row]:
    return read_map(MAP.read_text(encoding="utf-8"))


def test_every_module_is_on_the_map(rows):
    mapped = {r.path for r in rows}
    missing = [p for p in library_files() if p not in mapped]
    assert not missing, f"modules missing from docs/library.md (add a row in their layer): {missing}"


def test_every_row_names_a_module_that_exists(rows):
    files = set(library_files())
    ghosts = [r.path for r in rows if r.path not in files and r.mark is None]
    assert not ghosts, f"docs/library.md names modules that do not exist (remove or mark them): {ghosts}"


def test_each_module_appears_once(rows):
    seen: Dict[str, int] = {}
    for r in rows:
        seen[r.path] = seen.get(r.path, 0) + 1
    assert not [p for p, n in seen.items() if n > 1], f"listed twice: {[p for p, n in seen.items() if n > 1]}"


READING = re.compile(r"^\|\s*(\d+)\s*\|\s*`([^`]+\.py)`\s*\|\s*(\d+)\s*\|")
TRACE = re.compile(r"^\d+\. `([^`:]+\.py):(\d+)` `(\w+)`")


def read_core(text: str) -> Tuple[List[Tuple[str, int]], List[Tuple[str, int, str]]]:
    """The reading order's ``(module, lines)`` rows and the decode trace's ``(file, line, function)`` steps."""
    reading = [(m.group(2), int(m.group(3))) for m in map(READING.match, text.splitlines()) if m]
    trace = [(m.group(1), int(m.group(2)), m.group(3)) for m in map(TRACE.match, text.splitlines()) if m]
    return reading, trace


def test_the_reading_order_counts_lines_as_wc_does():
    reading, _ = read_core(MAP.read_text(encoding="utf-8"))
    assert [m for m, _ in reading] == ["block.py", "prefix_cache.py", "block_manager.py", "kv_cache.py",
                                       "allocator.py", "protocols.py"]
    for module, lines in reading:
        actual = (PACKAGE / module).read_text(encoding="utf-8").count("\n")
        assert lines == actual, f"docs/library.md says {module} has {lines} lines, wc -l says {actual}"
    assert sum(lines for _, lines in reading) <= 1600, "the bookkeeping no longer reads in one sitting"


def test_the_decode_trace_names_the_functions_at_its_lines():
    _, trace = read_core(MAP.read_text(encoding="utf-8"))
    assert trace[0][2] == "schedule_decodes" and trace[-1][2] in ("popleft", "pop_many")
    assert len({path for path, _, _ in trace}) <= 4
    for path, line, name in trace:
        text = (PACKAGE / path).read_text(encoding="utf-8").splitlines()
        assert f"def {name}(" in text[line - 1], f"{path}:{line} is not where {name} is defined: {text[line - 1]!r}"
    path, line, _ = trace[0]
    body = "\n".join((PACKAGE / path).read_text(encoding="utf-8").splitlines()[line:]).split("\n    def ")[0]
    assert "allocate_slots(" in body, "schedule_decodes no longer grows the step with one allocate_slots call"


def test_the_import_contracts_hold():
    from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert status == EXIT_STATUS_SUCCESS, "lint-imports: a contract is broken (its report is printed above)"


def test_the_contracts_cover_the_whole_library_and_type_checking_imports():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    assert "paged_kv_lib" in config["root_packages"] and not config.get("exclude_type_checking_imports", False)
    kinds = {c["type"]: c for c in config["contracts"]}
    assert {"layers", "independence", "acyclic_siblings"} <= set(kinds)
    assert kinds["acyclic_siblings"]["ancestors"] == ["paged_kv_lib"]


# --------------------------------------------------------------------------- the checker itself
SAMPLE = """
## 0. Base
| module | idea |
|---|---|
| `errors.py` | errors |
## 2. Top
| `viz/svg.py` | pictures |
| `model/batch.py` | *planned:* one batch |
"""


def test_the_map_reader_reads_layers_and_marks():
    got = read_map(SAMPLE)
    assert [(r.path, r.layer, r.mark) for r in got] == [
        ("errors.py", 0, None), ("viz/svg.py", 2, None), ("model/batch.py", 2, "planned")]
    with pytest.raises(AssertionError, match="must increase"):
        read_map("## 3. A\n## 1. B\n")
