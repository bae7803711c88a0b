"""How a simulation's results are printed: an aligned text table and the ``--json`` object.

The CLI prints them, and lessons and exercise checks print the same table, so it lives here
rather than in the CLI (``paged_kv_lib.simulate.cli`` re-exports both).
"""

from __future__ import annotations

from typing import List, Tuple

from .metrics import SimResult
from .workloads import Workload

__all__ = ["format_table", "report"]


def report(workload: Workload, capacity_tokens: int, results: List[SimResult], **extra) -> dict:
    """The ``--json`` object: the run's settings and one entry per allocator row."""
    rows = []
    for r in results:
        row = r.as_dict()
        row.pop("capacity_tokens")
        rows.append(row)
    return {"workload": workload.name, "capacity_tokens": capacity_tokens, "requests": len(workload),
            "max_len": workload.max_len, **extra, "results": rows}


def format_table(results: List[SimResult]) -> str:
    """One aligned text row per result: the five parts in percent, batch, preemptions, finished."""
    header = ("allocator", "tokens", "reserved", "internal", "external", "free", "batch", "preempt", "finished")
    rows: List[Tuple[str, ...]] = [header]
    for r in results:
        rows.append((r.label, *(f"{100 * getattr(r, p):.1f}%" for p in
                                 ("token_states", "reserved", "internal", "external", "free")),
                     f"{r.mean_batch:.1f}", str(r.preemptions), str(r.finished)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join(lines)
