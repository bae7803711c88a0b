"""The engine of two library trees side by side: is this tree's engine slower than an earlier one's?

Only the library differs between the two sides: each round runs each tree's own ``benchmarks/engine.py``
engine side (its ``run_engine``, which speaks that tree's API) in a fresh process, the earlier tree
first, then this one, alternating, so both sides see the same machine load; one torch thread, CPU
time of ``Engine.generate``. The run stops unless both trees build the same workloads (prompts and
new tokens, compared by digest) and the engines return the same tokens.
Prints each side's engine tokens/s per round and the paired ratio (this tree / the earlier one).

    git archive COMMIT | tar -x -C /tmp/before
    python benchmarks/engine_versions.py /tmp/before [--rounds 5] [--only 0 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parents[1]


def one_side(tree: str, workloads: List[int]) -> Tuple[Dict[int, float], str]:
    """Engine tokens/s per workload, measured in a child process that imports the library from ``tree``,
    and a digest of the workloads and the tokens generated."""
    script = f"""
import hashlib, json, sys
sys.path[:0] = [{tree!r}, {tree + '/benchmarks'!r}]
import torch
torch.set_num_threads(1)
import paged_kv_lib, engine
assert paged_kv_lib.__file__.startswith({tree!r}), paged_kv_lib.__file__
model = engine.load_tiny_model()
loads = engine.workloads()
rates, digest = {{}}, hashlib.sha256()
for w in {workloads!r}:
    _, prompts, new, caching = loads[w]
    run = engine.run_engine(model, prompts, new, caching)
    rates[w] = len(prompts) * new / run["cpu_seconds"]
    digest.update(repr((prompts, new, caching, run["tokens"])).encode())
print(json.dumps({{"rates": rates, "digest": digest.hexdigest()}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the engine of {tree} failed:\n{done.stderr[-2000:]}")
    answer = json.loads(done.stdout.splitlines()[-1])
    return {int(k): v for k, v in answer["rates"].items()}, answer["digest"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a copy of the earlier tree (its paged_kv_lib is imported from there)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", type=int, nargs="*", default=[0, 3], help="workloads of benchmarks/engine.py")
    args = parser.parse_args(argv)
    before_tree, after_tree = str(Path(args.before).resolve()), str(HERE)
    ratios: Dict[int, List[float]] = {w: [] for w in args.only}
    for round_ in range(args.rounds):
        (before, seen), (after, digest) = one_side(before_tree, args.only), one_side(after_tree, args.only)
        if seen != digest:
            raise SystemExit("the two trees differ in their workloads or in the tokens their engines generate")
        cells = "  ".join(f"workload {w}: {before[w]:,.0f} -> {after[w]:,.0f} tok/s" for w in args.only)
        print(f"round {round_ + 1}: {cells}", flush=True)
        for w in args.only:
            ratios[w].append(after[w] / before[w])
    for w, values in ratios.items():
        values.sort()
        print(f"workload {w}: this tree / the earlier one, median {statistics.median(values):.2f} "
              f"(range {values[0]:.2f}-{values[-1]:.2f}) of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
