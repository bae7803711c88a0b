"""The static scan of solution cells (paged_kv_lib/grading/scan.py): what it reports, what it lets through.

A table of learner cells, each with the line it must earn (or none), scanned against a
FORBIDDEN like an allocator exercise's; the reference solutions of the real notebooks
must scan clean under their own exercise's FORBIDDEN; and one grade of the demo exercise
shows the grader giving a reported task 0 with the scan's line (slow: it starts a kernel).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from paged_kv_lib.grading import delegation, generate, scan
from paged_kv_lib.grading.notebook_tasks import cell_task, find_tasks, read_notebook

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "grading"

FORBIDDEN = (
    "paged_kv_lib.grading",
    "paged_kv_lib.conformance",
    "paged_kv_lib.allocator",
    "paged_kv_lib.prefix_cache",
    "paged_kv_lib.block_manager",
    "paged_kv_lib.attention.triton_kernel",
    "paged_kv_lib.course.starters.after_06",
)
WHY = ": library code that implements what exercise 06 grades"

REPORTED = [
    ("from paged_kv_lib.allocator import PagedKVCacheAllocator", "uses paged_kv_lib.allocator"),
    ("from paged_kv_lib import PagedKVCacheAllocator as P", "uses paged_kv_lib.allocator"),
    ("from paged_kv_lib import block_key", "uses paged_kv_lib.prefix_cache"),
    ("from paged_kv_lib import FreeBlockQueue\nq = FreeBlockQueue", "uses paged_kv_lib.block_manager"),
    ("import paged_kv_lib.allocator", "uses paged_kv_lib.allocator"),
    ("from paged_kv_lib import allocator", "uses paged_kv_lib.allocator"),
    ("from paged_kv_lib.course.starters.after_06 import AllocatorAfter06 as MyAllocator",
     "uses paged_kv_lib.course.starters.after_06"),
    ("from paged_kv_lib.course.starters import after_06\nclass A:\n    fork = after_06.AllocatorAfter06.fork",
     "uses paged_kv_lib.course.starters.after_06"),
    ("import paged_kv_lib as pk\ndef key(p, t):\n    return pk.prefix_cache.block_key(p, t)",
     "uses paged_kv_lib.prefix_cache"),
    ("def f():\n    from paged_kv_lib.block_manager import FreeBlockQueue\n    return FreeBlockQueue",
     "uses paged_kv_lib.block_manager"),
    ("from paged_kv_lib.attention import triton_kernel\ntile_addresses = triton_kernel._kv_tile_offsets",
     "uses paged_kv_lib.attention.triton_kernel"),
    ("from paged_kv_lib.grading.checks_06 import *", "uses paged_kv_lib.grading.checks_06"),
    ("from paged_kv_lib.course.starters.after_06 import AllocatorAfter06",
     "uses paged_kv_lib.course.starters.after_06"),
    ("m = __import__('paged_kv_lib.allocator')", "uses paged_kv_lib.allocator"),
    ("from paged_kv_lib import *\nq = FreeBlockQueue(4)", "uses paged_kv_lib.block_manager"),
    ("import importlib\nm = importlib.import_module('paged_kv_lib.prefix_cache')", "uses paged_kv_lib.prefix_cache"),
    ("import paged_kv_lib\nq = getattr(paged_kv_lib, 'block_manager')", "uses paged_kv_lib.block_manager"),
]

DYNAMIC = [
    ("m = __import__(name)", "uses __import__ with a computed name"),
    ("import importlib\nm = importlib.import_module('paged_kv_lib.' + 'allocator')",
     "uses importlib.import_module with a computed name"),
    ("from importlib import import_module as im\nm = im(n)", "uses importlib.import_module with a computed name"),
    ("import importlib.util\ns = importlib.util.find_spec('x')", "uses importlib.util"),
    ("import sys\nm = sys.modules['paged_kv_lib.allocator']", "uses sys.modules"),
    ("from sys import modules\nm = modules", "uses sys.modules"),
    ("import paged_kv_lib\nv = getattr(paged_kv_lib, name)", "uses getattr(paged_kv_lib, ...) with a computed name"),
    ("import paged_kv_lib\nv = vars(paged_kv_lib)", "uses vars(paged_kv_lib)"),
    ("import paged_kv_lib\nv = paged_kv_lib.__dict__", "uses paged_kv_lib.__dict__"),
    ("x = globals()['MyAllocator']", "uses globals()"),
    ("exec('from paged_kv_lib import allocator')", "uses exec()"),
    ("f = eval('lambda: 1')", "uses eval()"),
    ("c = compile('1', 'x', 'eval')", "uses compile()"),
    ("b = __builtins__", "uses __builtins__"),
]

CLEAN = [
    "import torch\nimport collections\nfrom collections import deque\nimport math, itertools",
    "from paged_kv_lib.errors import OutOfBlocksError, PagedKVError\nfrom paged_kv_lib import InvalidArgumentError",
    "from paged_kv_lib.block import cdiv\nfrom paged_kv_lib import cdiv as ceil_div",
    "from paged_kv_lib.course.starters.after_03 import AllocatorAfter03\nclass MyAllocator(AllocatorAfter03):\n    pass",
    "class MyAllocator:\n    def get(self, name):\n        return getattr(self, name)\n    def key(self):\n        return self.free",
    "import re\npattern = re.compile(r'x+')",
    "from paged_kv_lib import *\nfrom paged_kv_lib.errors import *\nraise OutOfBlocksError(cdiv(3, 2))",
    "%timeit sum(range(10))\nx = 1",
    "def broken(:\n    pass",  # does not parse: the kernel reports it
]


@pytest.mark.parametrize("source, expected", REPORTED, ids=[e for _, e in REPORTED])
def test_forbidden_imports_and_names_are_reported_with_the_reason(source, expected):
    lines = scan.scan_source(source, FORBIDDEN, "06_sharing")
    assert lines, f"nothing reported for:\n{source}"
    assert lines[0].startswith(expected + ":"), lines
    assert WHY in lines[0] and "\n" not in lines[0]


@pytest.mark.parametrize("source, expected", DYNAMIC, ids=[e for _, e in DYNAMIC])
def test_dynamic_reach_is_reported(source, expected):
    lines = scan.scan_source(source, FORBIDDEN, "06_sharing")
    assert any(line.startswith(expected + ":") for line in lines), lines


@pytest.mark.parametrize("source", CLEAN)
def test_allowed_code_is_not_reported(source):
    assert scan.scan_source(source, FORBIDDEN, "06_sharing") == []


def test_one_use_is_one_line_and_an_import_after_its_use_still_counts():
    source = "def f():\n    return pk.prefix_cache.block_key(None, [1])\n\nimport paged_kv_lib as pk\n"
    assert scan.scan_source(source, FORBIDDEN, "06") == [delegation.forbidden_line("paged_kv_lib.prefix_cache", "06")]


def test_without_forbidden_modules_only_dynamic_reach_is_reported():
    assert scan.scan_source("from paged_kv_lib.allocator import PagedKVCacheAllocator", (), "02") == []
    assert scan.scan_source("import sys\nsys.modules", (), "02") == [delegation.dynamic_line("sys.modules")]


def test_delegation_lines_reads_the_exercise_and_leaves_clean_tasks_out(monkeypatch):
    monkeypatch.setattr(scan, "forbidden_modules", lambda exercise: FORBIDDEN if exercise == "06_sharing" else ())
    got = scan.delegation_lines("06_sharing", {"06.1": "x = 1", "06.2": "from paged_kv_lib import block_key"})
    assert list(got) == ["06.2"] and got["06.2"][0].startswith("uses paged_kv_lib.prefix_cache:")


def _real_solution_cells():
    for path in generate.solution_paths(ROOT / "exercises" / "solutions"):
        nb = read_notebook(path)
        for task in find_tasks(nb).values():
            yield pytest.param(path.stem, nb.cells[task.solution_cell].source, id=task.task)


@pytest.mark.parametrize("exercise, source", list(_real_solution_cells()))
def test_reference_solutions_scan_clean(exercise, source):
    assert scan.scan_source(source, delegation.forbidden_modules(exercise), exercise) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_grader_gives_a_reported_task_0_with_the_scan_line(monkeypatch, tmp_path):
    from paged_kv_lib.grading import grader

    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    monkeypatch.setattr(scan, "forbidden_modules", lambda exercise: ("paged_kv_lib.block",))
    nb = read_notebook(FIXTURES / "solutions" / "90_demo.ipynb")
    for cell in nb.cells:
        if cell_task(cell) == ("90.3", "solution"):
            cell.source = "from paged_kv_lib.block import blocks_needed\n"  # right answers, by the library
    path = tmp_path / "learner" / "90_demo.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    report = grader.grade_notebook(path, pristine=FIXTURES / "solutions" / "90_demo.ipynb", cell_timeout=30)
    assert not report.error, report.error
    results = {t.task: t for t in report.tasks}
    assert results["90.1"].passed and results["90.2"].passed
    assert not results["90.3"].passed
    assert results["90.3"].failure == delegation.forbidden_line("paged_kv_lib.block", "90")


def _provided_cells():
    for path in generate.solution_paths(ROOT / "exercises" / "solutions"):
        nb = read_notebook(path)
        for index, nb_cell in enumerate(nb.cells):
            found = cell_task(nb_cell)
            if nb_cell.cell_type == "code" and (found is None or found[1] != "check"):
                yield pytest.param(path.stem, nb_cell.source, id=f"{path.stem[:2]}-cell{index}")


@pytest.mark.parametrize("exercise, source", list(_provided_cells()))
def test_cells_that_run_in_the_learners_kernel_use_nothing_forbidden(exercise, source):
    """Setup, provided and demo cells run in the kernel during official grading, where forbidden modules are
    stubs (interfaces.md item 1): they may import nothing the exercise forbids. Check cells run in the judge.
    The Colab block on top of the setup cell is the course's (it looks for ``google.colab`` in ``sys.modules``)."""
    from paged_kv_lib.course.setup_cell import split_block

    _, own = split_block(source)
    assert scan.scan_source(own, delegation.forbidden_modules(exercise), exercise) == []
