"""How long grading takes: one exercise notebook, then a class of copies of it with ``--jobs``.

    .venv/bin/python benchmarks/grading.py [--exercise 03_the_allocator] [--class-size 30] [--jobs 2]

The submission is the exercise's solution notebook (every task passes, so every check
runs to the end: the slowest honest case). Times include starting the judge and the
learner's kernel (and their imports of torch), as a learner or an instructor sees them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", default="03_the_allocator")
    parser.add_argument("--class-size", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "none"))
    args = parser.parse_args()
    solution = REPO / "exercises" / "solutions" / f"{args.exercise}.ipynb"
    command = [sys.executable, "-m", "paged_kv_lib.cli", "grade", "--course", str(REPO), "--sandbox", args.sandbox]
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        root = Path(tmp)
        single = root / "single" / solution.name
        single.parent.mkdir()
        shutil.copy(solution, single)
        start = time.perf_counter()
        done = subprocess.run([*command, str(single)], capture_output=True, text=True)
        one = time.perf_counter() - start
        print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr)
        print(f"one notebook ({args.exercise}): {one:.1f} s (exit {done.returncode})")
        folder = root / "class"
        for index in range(args.class_size):
            target = folder / f"learner{index:02d}" / solution.name
            target.parent.mkdir(parents=True)
            shutil.copy(solution, target)
        start = time.perf_counter()
        done = subprocess.run([*command, "--batch", str(folder), "--csv", str(root / "gradebook.csv"),
                               "--jobs", str(args.jobs), "--no-progress"], capture_output=True, text=True)
        many = time.perf_counter() - start
        full = done.stdout.count(" ") and sum(1 for line in done.stdout.splitlines()
                                              if line.startswith("learner") and "/" in line
                                              and line.split()[2].split("/")[0] == line.split()[2].split("/")[1])
        print(f"{args.class_size} notebooks, --jobs {args.jobs}: {many:.1f} s "
              f"({many / args.class_size:.1f} s each; {full} with full marks; exit {done.returncode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
