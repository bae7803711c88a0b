"""Bookkeeping throughput: the library's block manager against the seed's deque allocator (``paged_kv_course.seed``).

A trace of sequences (prompt, then decoding one token at a time, then free), with a
batch of sequences decoding in turn, is driven through both; every driver walks
the same list of running sequences per decode step (rebuilt only when one finishes). The baseline,
``SeedAllocator`` without tensors, counts no tokens (its driver tracks lengths and applies
the corrected growth rule itself) and checks only ids and counts once per allocation; the
library (``BlockManager``, the bookkeeping without tensors, as the baseline is) validates every
call and keeps the counts. Prints tokens per second for each and the ratio, then the memory a
decode step allocates.

Two library modes: ``single``, one checked ``append_tokens`` call per sequence per decode
step (against the seed's bare deque design), and ``batched``, one ``append_tokens_batch``
call per decode step for the whole batch (against the seed design's per-sequence loop,
the same baseline: it is what a caller of the seed writes for a decode step). A third,
``allocator``, is ``single`` through ``PagedKVCacheAllocator.append_tokens`` (the tensor
facade's delegation to its manager: one Python call more per token), printed for reference.

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
from paged_kv_lib.block_manager import BlockManager
from paged_kv_course.seed import SeedAllocator


def make_trace(num_sequences: int, seed: int) -> List[Tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 512), rng.randint(1, 256)) for _ in range(num_sequences)]


def decode_tokens(trace) -> int:
    return sum(out for _, out in trace)


DECODE_TIME = [0.0]  # CPU seconds the runner now timed spent in its decode steps (its growth calls)


def decode_steps(group: List[Tuple[int, int]], start: int):
    """Each decode step's running sequence ids, oldest first: a sequence leaves the list once its output is done."""
    active = list(range(start, start + len(group)))
    ends = {start + i: out for i, (_, out) in enumerate(group)}
    for step in range(max(out for _, out in group)):
        if any(ends[s] <= step for s in active):
            active = [s for s in active if ends[s] > step]
        yield active


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
        t0 = time.process_time()
        for active in decode_steps(group, start):
            for seq_id in active:
                if lengths[seq_id] % block_size == 0:  # seed.needs_new_block, inlined
                    alloc.append_block_to_sequence(seq_id)
                lengths[seq_id] += 1
            tokens += len(active)
        DECODE_TIME[0] += time.process_time() - t0
        for i in range(len(group)):
            alloc.free_sequence(start + i)
    return tokens


def run_library(trace, batch: int, block_size: int, num_blocks: int, *, facade: bool = False) -> int:
    alloc = PagedKVCacheAllocator(num_blocks, block_size, 1, 1) if facade else BlockManager(num_blocks, block_size)
    append = alloc.append_tokens
    tokens = 0
    for start in range(0, len(trace), batch):
        group = trace[start : start + batch]
        for i, (prompt, _) in enumerate(group):
            alloc.allocate_for_sequence(start + i, prompt)
            tokens += prompt
        t0 = time.process_time()
        for active in decode_steps(group, start):
            for seq_id in active:
                append(seq_id)
            tokens += len(active)
        DECODE_TIME[0] += time.process_time() - t0
        for i in range(len(group)):
            alloc.free_sequence(start + i)
    alloc.check_invariants()
    return tokens


def run_library_facade(trace, batch: int, block_size: int, num_blocks: int) -> int:
    return run_library(trace, batch, block_size, num_blocks, facade=True)


def run_library_batched(trace, batch: int, block_size: int, num_blocks: int) -> int:
    alloc = BlockManager(num_blocks, block_size)
    append_batch = alloc.append_tokens_batch
    tokens = 0
    for start in range(0, len(trace), batch):
        group = trace[start : start + batch]
        for i, (prompt, _) in enumerate(group):
            alloc.allocate_for_sequence(start + i, prompt)
            tokens += prompt
        t0 = time.process_time()
        for active in decode_steps(group, start):
            append_batch(active)
            tokens += len(active)
        DECODE_TIME[0] += time.process_time() - t0
        for i in range(len(group)):
            alloc.free_sequence(start + i)
    alloc.check_invariants()
    return tokens


def decode_step_allocations(steps: int = 10_000) -> Tuple[int, int]:
    """(bytes at peak, blocks still allocated) traced over decode steps that need no new block."""
    alloc = BlockManager(4, steps + 1)
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
    runs = (("deque baseline", run_baseline), ("single", run_library), ("batched", run_library_batched),
            ("allocator", run_library_facade))
    best: dict = {}
    best_decode: dict = {}
    ratios: dict = {"single": [], "batched": [], "allocator": []}
    decode_ratios: dict = {"single": [], "batched": [], "allocator": []}
    tokens = 0
    grown = decode_tokens(trace)
    for _ in range(args.repeats):  # interleaved rounds: every side of a round sees the same machine noise
        rates, decode_rates = {}, {}
        for name, fn in runs:
            DECODE_TIME[0] = 0.0
            t0 = time.process_time()
            tokens = fn(trace, args.batch, args.block_size, num_blocks)
            rates[name] = tokens / (time.process_time() - t0)
            decode_rates[name] = grown / DECODE_TIME[0]
            best[name] = max(best.get(name, 0.0), rates[name])
            best_decode[name] = max(best_decode.get(name, 0.0), decode_rates[name])
        for mode in ratios:
            ratios[mode].append(rates[mode] / rates["deque baseline"])
            decode_ratios[mode].append(decode_rates[mode] / decode_rates["deque baseline"])
    print(f"trace: {args.sequences} sequences, batch {args.batch}, block size {args.block_size}, "
          f"{tokens:,} tokens ({grown:,} of them decode steps); {args.repeats} interleaved rounds, CPU time")
    print("whole trace (allocate prompts, decode, free):")
    for name, rate in best.items():
        print(f"  {name:<15} {rate / 1e6:6.2f} M tokens/s (best)")
    print("decode steps only (the growth calls):")
    for name, rate in best_decode.items():
        print(f"  {name:<15} {rate / 1e6:6.2f} M tokens/s (best)")
    goals = {"single": "goal >= 0.5: one checked call per token", "batched": "goal >= 1.0: one call per decode step",
             "allocator": "single through the tensor facade, for reference"}
    for label, table in (("whole trace", ratios), ("decode steps", decode_ratios)):
        for mode, values in table.items():
            values.sort()
            print(f"  {label:<12} {mode:<8} / baseline: median {statistics.median(values):.2f} of the rounds "
                  f"(range {values[0]:.2f}-{values[-1]:.2f}) ({goals[mode]})")
    peak, kept = decode_step_allocations()
    print(f"decode steps without a new block: traced peak {peak} bytes, retained {kept} bytes "
          f"over 10,000 steps (goal: no per-step allocation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
