"""docs/library.md matches the code: every module of ``paged_kv_lib`` is on the map, every row names a
module that exists (rows marked *planned* or *leaving* may be absent while a round's branches merge),
and no import reaches down to a later layer than the importing module's own.

The map's layers are its ``## N. Name`` headings, in order; its modules are the backticked paths in
the first column of the table rows under them. Imports are read with ``ast`` from every module,
including lazy ones inside functions; ``importlib.import_module("...")`` by name is not followed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "paged_kv_lib"
MAP = ROOT / "docs" / "library.md"

HEADING = re.compile(r"^## (\d+)\. (.+)$")
ROW = re.compile(r"^\|\s*`([^`]+\.py)`\s*\|(.*)\|\s*$")
MARK = re.compile(r"\*(planned|leaving)\b", re.IGNORECASE)

# Imports that break the layer rule on purpose: (importer, imported) -> why. Keep it short.
ALLOWED: Dict[Tuple[str, str], str] = {}


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


def imported_modules(path: str, known: Set[str]) -> Set[str]:
    """The library modules ``path`` imports (resolved to the longest name in ``known``)."""
    source = (PACKAGE / path).read_text(encoding="utf-8")
    here = module_name(path)
    package = here if path.endswith("__init__.py") else here.rsplit(".", 1)[0]
    targets: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known and name != here:
                targets.add(name)
    # "from . import x" names the package and the module x: keep the module only when x is one.
    return targets


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


def test_no_import_reaches_a_later_layer(rows):
    files = set(library_files())
    layer = {module_name(r.path): r for r in rows if r.path in files}
    known = set(layer)
    broken = []
    for path in sorted(files):
        importer = module_name(path)
        if importer not in layer:
            continue  # reported by test_every_module_is_on_the_map
        for target in sorted(imported_modules(path, known)):
            if layer[target].layer > layer[importer].layer and (importer, target) not in ALLOWED:
                broken.append(f"{importer} (layer {layer[importer].layer}, {layer[importer].layer_name}) imports "
                              f"{target} (layer {layer[target].layer}, {layer[target].layer_name})")
    assert not broken, "imports against the layers of docs/library.md:\n" + "\n".join(broken)


def test_every_allowed_exception_is_still_needed_and_says_why(rows):
    files = set(library_files())
    known = {module_name(p) for p in files}
    for (importer, target), why in ALLOWED.items():
        assert len(why) > 20, f"say why {importer} may import {target}"
        path = next(p for p in files if module_name(p) == importer)
        assert target in imported_modules(path, known), f"{importer} no longer imports {target}: drop the exception"


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


def test_the_import_reader_resolves_relative_and_lazy_imports():
    known = {module_name(p) for p in library_files()}
    got = imported_modules("viz/svg_translation.py", known)
    assert {"paged_kv_lib.viz.colors", "paged_kv_lib.viz.svg"} <= got
    got = imported_modules("simulate/cli.py", known)  # plot_results is imported inside run()
    assert "paged_kv_lib.viz.plots" in got and "paged_kv_lib.simulate.cli" not in got
    assert module_name("viz/__init__.py") == "paged_kv_lib.viz"
