"""Allocator throughput: the library's allocator against the seed's deque allocator (``paged_kv_lib.seed``).

A trace of sequences (prompt, then decoding one token at a time, then free), with a
batch of sequences decoding in turn, is driven through both allocators. The baseline,
``SeedAllocator`` without tensors, counts no tokens (its driver tracks lengths and applies
the corrected growth rule itself) and checks only ids and counts once per allocation; the
library validates every call and keeps the counts. Prints
tokens per second for each and the ratio, then the memory a decode step allocates.

    python benchmarks/allocator_ops.py [--sequences 4000] [--batch 64] [--repeats 9]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from typing import List, Tuple

from paged_kv_lib import PagedKVCacheAllocator
from paged_kv_lib.seed import SeedAllocator


def make_trace(num_sequences: int, seed: int) -> List[Tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 512), rng.randint(1, 256)) for _ in range(num_sequences)]


def run_baseline(trace, batch: int, block_size: int, num_blocks: int) -> int:
    alloc = SeedAllocator(num_blocks, block_size)  # the seed's design, bookkeeping only
    tokens = 0
    for start in range(0, len(trace), batch):
        group = trace[start : start + batch]
        lengths = {}
        for i, (prompt, _) in enumerate(group):
            alloc.allocate_for_sequence(start + i, prompt)
            lengths[start + i] = prompt
            tokens += prompt
        for step in range(max(out for _, out in group)):
            for i, (_, out) in enumerate(group):
                if step < out:
                    seq_id = start + i
                    if lengths[seq_id] % block_size == 0:  # seed.needs_new_block, inlined
                        alloc.append_block_to_sequence(seq_id)
                    lengths[seq_id] += 1
                    tokens += 1
        for i in range(len(group)):
            alloc.free_sequence(start + i)
    return tokens


def run_library(trace, batch: int, block_size: int, num_blocks: int) -> int:
    alloc = PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False)
    append = alloc.append_tokens
    tokens = 0
    for start in range(0, len(trace), batch):
        group = trace[start : start + batch]
        for i, (prompt, _) in enumerate(group):
            alloc.allocate_for_sequence(start + i, prompt)
            tokens += prompt
        for step in range(max(out for _, out in group)):
            for i, (_, out) in enumerate(group):
                if step < out:
                    append(start + i)
                    tokens += 1
        for i in range(len(group)):
            alloc.free_sequence(start + i)
    alloc.check_invariants()
    return tokens


def decode_step_allocations(steps: int = 10_000) -> Tuple[int, int]:
    """(bytes at peak, blocks still allocated) traced over decode steps that need no new block."""
    alloc = PagedKVCacheAllocator(4, steps + 1, 1, 1, allocate_cache=False)
    alloc.allocate_for_sequence(0, 1)
    append = alloc.append_tokens
    append(0)  # warm up any lazily created state
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(steps - 1):
        append(0)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - before, current - before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    trace = make_trace(args.sequences, args.seed)
    num_blocks = args.batch * ((512 + 256) // args.block_size + 2)
    best = {}
    ratios = []
    for _ in range(args.repeats):  # interleaved pairs: both sides of a pair see the same machine noise
        rates = {}
        for name, fn in (("deque baseline", run_baseline), ("paged_kv_lib", run_library)):
            t0 = time.perf_counter()
            tokens = fn(trace, args.batch, args.block_size, num_blocks)
            rates[name] = tokens / (time.perf_counter() - t0)
            best[name] = max(best.get(name, 0.0), rates[name])
        ratios.append(rates["paged_kv_lib"] / rates["deque baseline"])
    print(f"trace: {args.sequences} sequences, batch {args.batch}, block size {args.block_size}, "
          f"{tokens:,} tokens; {args.repeats} interleaved pairs")
    for name, rate in best.items():
        print(f"  {name:<15} {rate / 1e6:6.2f} M tokens/s (best)")
    ratios.sort()
    print(f"  ratio library / baseline: median {statistics.median(ratios):.2f} of the pairs "
          f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}), of the bests {best['paged_kv_lib'] / best['deque baseline']:.2f} "
          f"(goal >= 0.5)")
    peak, kept = decode_step_allocations()
    print(f"decode steps without a new block: traced peak {peak} bytes, retained {kept} bytes "
          f"over 10,000 steps (goal: no per-step allocation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
