"""Execute notebooks in place from a fresh kernel and store their outputs, deterministically.

Authors run this after editing a lesson or an exercise solution so that the stored
outputs (what nbval compares) are current:

    python scripts/run_notebooks.py lessons/03_allocator.ipynb [more.ipynb ...]

No timing metadata is recorded, so re-running an unchanged notebook gives the same file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None) if not _has_widget_outputs(nb) else None
    nbformat.write(nb, path)
    return elapsed


def _has_widget_outputs(nb) -> bool:
    return any(
        "application/vnd.jupyter.widget-view+json" in out.get("data", {})
        for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )


def main(argv: list) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        elapsed = run(Path(name))
        print(f"{name}: executed in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
