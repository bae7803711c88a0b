"""Simulated serving benchmark: wall time for N requests per allocator, and the memory figures.

Run: python benchmarks/simulate.py [--requests 10000] [--seed 0] [--sweep-requests 2000]

Every allocator serves the same ShareGPT-like workload in this one process, so the
times and the figures compare side by side. Figures are time-averaged over the steps
where requests wait for memory (see paged_kv_lib/simulate/metrics.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from paged_kv_lib.simulate import ALLOCATORS, make_workload, simulate

PAPER = {"orca-max": 20.4, "orca-pow2": 26.8, "orca-oracle": 38.2, "paged": 96.3}
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity-tokens", type=int, default=15728)
    parser.add_argument("--sweep-requests", type=int, default=2000, help="0 skips the block-size sweep")
    args = parser.parse_args()

    start = time.perf_counter()
    workload = make_workload("sharegpt", args.requests, args.seed)
    made = time.perf_counter() - start
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; workload sharegpt seed {args.seed}: "
          f"{len(workload)} requests (mean prompt {workload.mean_prompt():.1f}, mean output "
          f"{workload.mean_output():.1f}) generated in {made:.2f} s; capacity {args.capacity_tokens} slots, "
          f"block size 16, buddy allocator for the orca rows")
    print(f"{'allocator':<12} {'time s':>7} {'steps':>8} {'tokens':>7} {'paper':>6} {'reserved':>8} "
          f"{'internal':>8} {'external':>8} {'free':>6} {'batch':>6} {'preempt':>8}")
    results = {}
    total = 0.0
    for name in ALLOCATORS:
        start = time.perf_counter()
        (result,) = simulate(workload, args.capacity_tokens, [name], 16)
        took = time.perf_counter() - start
        total += took
        results[name] = result
        print(f"{name:<12} {took:7.2f} {result.steps:8d} {100 * result.token_states:6.1f}% {PAPER[name]:5.1f}% "
              f"{100 * result.reserved:7.1f}% {100 * result.internal:7.1f}% {100 * result.external:7.1f}% "
              f"{100 * result.free:5.1f}% {result.mean_batch:6.1f} {result.preemptions:8d}")
    paged = results["paged"].mean_batch
    print(f"all four: {total:.2f} s; paged batch / oracle = {paged / results['orca-oracle'].mean_batch:.2f}x "
          f"(paper 2.2x), / max = {paged / results['orca-max'].mean_batch:.2f}x (paper 4.3x)")

    if args.sweep_requests:
        sweep_workload = make_workload("sharegpt", args.sweep_requests, args.seed)
        print(f"\nblock-size sweep, paged, {args.sweep_requests} requests:")
        print(f"{'block':>5} {'time s':>7} {'tokens':>7} {'reserved':>8} {'internal':>8} {'free':>6} "
              f"{'batch':>6} {'preempt':>8}")
        for size in SWEEP:
            start = time.perf_counter()
            (r,) = simulate(sweep_workload, args.capacity_tokens, ["paged"], size)
            took = time.perf_counter() - start
            print(f"{size:5d} {took:7.2f} {100 * r.token_states:6.1f}% {100 * r.reserved:7.1f}% "
                  f"{100 * r.internal:7.1f}% {100 * r.free:5.1f}% {r.mean_batch:6.1f} {r.preemptions:8d}")


if __name__ == "__main__":
    main()
