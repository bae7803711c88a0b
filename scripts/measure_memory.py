"""Memory one learner needs: a kernel after a lesson's imports, and the grader while it grades.

    python scripts/measure_memory.py [--notebook exercises/solutions/03_the_allocator.ipynb]

1. Starts a Jupyter kernel, runs the imports of the heaviest lesson setups (torch, matplotlib,
   ipywidgets, the library, its views and attention, Triton under the interpreter) and reads the
   kernel's memory.
   With ``--lesson PATH``, also the kernel after running a whole lesson.
2. Runs ``paged-kv grade NOTEBOOK`` and samples, every 50 ms, the memory of its whole process
   tree (the judge, the sandbox and the kernel it starts), keeping the peak.

Memory is PSS (each shared page split between the processes that map it, so the sum of a tree
is what it costs the machine) and RSS, in MiB. For JupyterHub's ``singleuser.memory`` see
docs/platforms.md: a learner's server holds one or two kernels and, while grading, the grader.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import psutil

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = """
import os
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch, matplotlib.pyplot as plt, ipywidgets
import paged_kv_lib
from paged_kv_lib.viz import Playground, BlockTableView
from paged_kv_lib.attention import paged_attention
from paged_kv_lib.attention.testing import make_paged_batch
import triton
b = make_paged_batch([17, 5], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
_ = paged_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, backend="triton")
"""
MIB = 2**20


def _memory(proc: psutil.Process) -> Dict[str, float]:
    try:
        info = proc.memory_full_info()
        return {"pss": getattr(info, "pss", info.rss) / MIB, "rss": info.rss / MIB}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {"pss": 0.0, "rss": 0.0}


def kernel_after(sources: List[str], cwd: Path = ROOT) -> Dict[str, float]:
    """The memory of a fresh kernel (started in ``cwd``) after it has run ``sources`` in order."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(cwd))
    try:
        for source in sources:
            reply = client.execute_interactive(source, timeout=600, output_hook=lambda msg: None)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"a cell failed in the kernel: {reply['content'].get('evalue')}")
        time.sleep(0.5)
        pid = manager.provisioner.process.pid  # type: ignore[union-attr]
        return _memory(psutil.Process(pid))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def grading_peak(notebook: Path) -> Dict[str, float]:
    command = [str(Path(sys.executable).with_name("paged-kv")), "grade", str(notebook)]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak = {"pss": 0.0, "rss": 0.0, "largest_process_pss": 0.0, "processes": 0.0}
    while proc.poll() is None:
        try:
            tree: List[psutil.Process] = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        sizes = [_memory(p) for p in tree]
        peak["pss"] = max(peak["pss"], sum(s["pss"] for s in sizes))
        peak["rss"] = max(peak["rss"], sum(s["rss"] for s in sizes))
        peak["largest_process_pss"] = max(peak["largest_process_pss"], max(s["pss"] for s in sizes))
        peak["processes"] = max(peak["processes"], float(len(tree)))
        time.sleep(0.05)
    output = proc.stdout.read() if proc.stdout else ""
    peak["seconds"] = time.monotonic() - start
    peak["exit"] = float(proc.returncode)
    print(output.strip().splitlines()[-1] if output.strip() else "(no output)")
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", type=Path, default=ROOT / "exercises" / "solutions" / "03_the_allocator.ipynb")
    parser.add_argument("--lesson", type=Path, action="append", default=[],
                        help="also: the kernel after running every code cell of this lesson (repeatable)")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    kernel = kernel_after([IMPORTS])
    print(f"kernel after imports: PSS {kernel['pss']:.0f} MiB, RSS {kernel['rss']:.0f} MiB")
    for lesson in args.lesson:
        import nbformat

        cells = [c.source for c in nbformat.read(lesson, as_version=4).cells if c.cell_type == "code"]
        after = kernel_after(cells, cwd=lesson.resolve().parent)
        print(f"kernel after all of {lesson.name}: PSS {after['pss']:.0f} MiB, RSS {after['rss']:.0f} MiB")
    peak = grading_peak(args.notebook)
    print(f"paged-kv grade {args.notebook.name}: peak of its process tree PSS {peak['pss']:.0f} MiB, "
          f"RSS {peak['rss']:.0f} MiB (largest process PSS {peak['largest_process_pss']:.0f} MiB, up to "
          f"{peak['processes']:.0f} processes), {peak['seconds']:.0f} s, exit {peak['exit']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
