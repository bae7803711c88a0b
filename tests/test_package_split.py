"""The library holds the library: `paged_kv_lib` imports nothing of the course package, and its wheel
ships no grading code, checks or starters (issue 32)."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "paged_kv_lib"
COURSE_PACKAGE = "paged_kv_course"


def imported_names(path: Path) -> list:
    """Every module name an import in ``path`` names: top level, inside functions and under TYPE_CHECKING."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            names += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return names


def test_the_library_imports_nothing_of_the_course():
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(LIBRARY.rglob("*.py"))
        for name in imported_names(path)
        if name == COURSE_PACKAGE or name.startswith(COURSE_PACKAGE + ".")
    ]
    assert not offenders, f"the library imports the course package: {offenders}"


def test_the_import_scan_sees_every_kind_of_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from paged_kv_course.seed import SeedAllocator\n"
        "def f():\n    import paged_kv_course.grading\n    importlib.import_module('paged_kv_course.x')\n"
    )
    assert imported_names(probe).count("paged_kv_course.seed") == 1
    assert "paged_kv_course.grading" in imported_names(probe)
    assert "paged_kv_course.x" in imported_names(probe)


@pytest.mark.slow
def test_the_library_wheel_holds_the_library_only(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("paged_kv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"paged_kv_lib"}, packages
    assert not [n for n in names if any(part in n for part in ("grading", "starters", "conformance", "checks_"))]
    assert any(n.startswith("paged_kv_lib/block_manager") or n.startswith("paged_kv_lib/allocator") for n in names)
