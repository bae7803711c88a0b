"""Run a planted wrong solution in-process: the reference notebook up to its task, the planted cell in place
of the task's solution cell, then the task's check cells. Fast feedback beside the official-grader gate.

A planted file is ``tests/exercises/planted/NN/NN_k_slug.py``; its first line is ``# expect: <text>``,
a substring of the failure message it must produce. Files whose expected text is a delegation line
(``uses paged_kv_lib...``) are only judged by the official grader, where the forbidden modules are stubs.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import List, Optional, Tuple

from paged_kv_course.grading.notebook_tasks import cell_meta, read_notebook

from check_helpers import compiled

ROOT = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).resolve().parent / "planted"


def planted_files(exercise: str) -> List[Path]:
    return sorted((PLANTED / exercise).glob(f"{exercise}_*.py"))


def expectation(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <text>'"
    return first[len("# expect: "):].strip()


def is_delegation(path: Path) -> bool:
    return expectation(path).startswith(("uses paged_kv_lib", "uses paged_kv_course"))


def task_of(path: Path) -> str:
    number, k = path.stem.split("_")[:2]
    return f"{number}.{k}"


def run_planted(path: Path, notebook: str) -> Tuple[str, Optional[str]]:
    """(expected text, the first failure message of the task's checks, or None when they all passed)."""
    task = task_of(path)
    nb = read_notebook(ROOT / "exercises" / "solutions" / notebook)
    namespace: dict = {"__name__": "__main__"}
    seen_task = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell_meta(cell) or {}
        role, cell_task = meta.get("role"), meta.get("task")
        if seen_task and role == "solution" and cell_task != task:
            break  # the task's checks are done
        if role == "solution" and cell_task == task:
            seen_task = True
            source = path.read_text(encoding="utf-8")
        elif role == "check" and cell_task != task:
            continue
        else:
            source = cell.source
        if role == "check":
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(source, f"<check {task}>", "exec"), namespace)
            except AssertionError as exc:
                return expectation(path), str(exc)
        else:
            exec(compiled(source, f"<{path.name if role == 'solution' and cell_task == task else 'cell'}>"),
                 namespace)
    return expectation(path), None
