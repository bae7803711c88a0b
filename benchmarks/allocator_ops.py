"""Bookkeeping speed of a decode step: the library's block manager against plain loops over the seed's design.

One continuous-batching trace (sequences with a prompt and an output length; up to ``--batch`` decode at
once; when one finishes it is freed and the next one of the trace joins) is driven through every side,
and only the decode steps are timed (admissions and frees run between them, untimed): each side records
the step's sampled token in its sequence's output (the token values are drawn before the clock starts)
and grows its bookkeeping, as a decode loop does around its model.

Three comparisons, side by side in one run, each the median of interleaved rounds (every side of a round
sees the same machine noise):

* ``prefix caching, per step``: ``BlockManager.allocate_slots(running, 1, token_ids=...)``, prefix caching
  on (the engine's default), against a plain loop over the seed's deque design that also keeps each
  sequence's tokens and keys a block by SHA-256 of its parent's key and its tokens once it fills (what
  nano-vllm and vLLM do). Goal >= 0.5.
* ``no prefix caching, per step``: ``allocate_slots(running)`` against the seed's loop (a deque free list,
  ref counts, table lists; a new block at each boundary). Goal >= 0.5.
* ``no prefix caching, per call``: one ``append_tokens(seq_id)`` per sequence against the same loop.
  Goal >= 0.5.

The baselines check nothing and count no blocks ahead; the library validates every call and is atomic.

    python benchmarks/allocator_ops.py [--sequences 3000] [--batch 64] [--block-size 16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from array import array
from collections import deque
from typing import Callable, Dict, List, Tuple

from paged_kv_lib.block_manager import BlockManager

Trace = List[Tuple[int, int]]  # (prompt tokens, output tokens) per sequence, in arrival order
Step = Tuple[List[int], List[List[int]]]  # running ids, and each one's new token


def make_trace(num_sequences: int, seed: int) -> Trace:
    rng = random.Random(seed)
    return [(rng.randint(1, 512), rng.randint(1, 256)) for _ in range(num_sequences)]


def schedule(trace: Trace, batch: int) -> List[Tuple[List[int], Step, List[int]]]:
    """Each decode step as ``(admitted before it, (running ids, new tokens), finished after it)``."""
    left = {s: out for s, (_, out) in enumerate(trace)}
    waiting = deque(range(len(trace)))
    running: List[int] = []
    steps = []
    clock = 0
    while waiting or running:
        admitted = []
        while waiting and len(running) < batch:
            running.append(waiting.popleft())
            admitted.append(running[-1])
        clock += 1
        step = (list(running), [[(s * 7919 + clock) % 50_000] for s in running])
        finished = []
        for s in running:
            left[s] -= 1
            if left[s] == 0:
                finished.append(s)
        running = [s for s in running if left[s]]
        steps.append((admitted, step, finished))
    return steps


def prompt_tokens(seq_id: int, length: int) -> List[int]:
    return [(seq_id * 31 + i) % 50_000 for i in range(length)]


# ------------------------------------------------------------------ the library
def library_per_step(trace: Trace, steps, block_size: int, num_blocks: int, caching: bool) -> float:
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    grow = manager.allocate_slots
    outputs: Dict[int, List[int]] = {}
    elapsed = 0.0
    for admitted, (ids, tokens), finished in steps:
        for s in admitted:
            manager.allocate_for_sequence(s, trace[s][0], token_ids=prompt_tokens(s, trace[s][0]) if caching else None)
            outputs[s] = []
        t0 = time.perf_counter()
        for s, (token,) in zip(ids, tokens):  # the step's sampled tokens join their sequences
            outputs[s].append(token)
        if caching:
            placed = grow(ids, 1, token_ids=[outputs[s][-1] for s in ids])
        else:
            placed = grow(ids)
        elapsed += time.perf_counter() - t0
        assert placed is not None
        for s in finished:
            manager.free_sequence(s)
            del outputs[s]
    manager.check_invariants()
    return elapsed


def library_per_call(trace: Trace, steps, block_size: int, num_blocks: int) -> float:
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
    append = manager.append_tokens
    outputs: Dict[int, List[int]] = {}
    elapsed = 0.0
    for admitted, (ids, tokens), finished in steps:
        for s in admitted:
            manager.allocate_for_sequence(s, trace[s][0])
            outputs[s] = []
        t0 = time.perf_counter()
        for s, (token,) in zip(ids, tokens):
            outputs[s].append(token)
            append(s)
        elapsed += time.perf_counter() - t0
        for s in finished:
            manager.free_sequence(s)
            del outputs[s]
    manager.check_invariants()
    return elapsed


# ------------------------------------------------------------------ the seed's design, as plain loops
class SeedBooks:
    """The seed lesson's state: a deque free list, ref counts, a list of block ids per sequence, lengths."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        table = self.tables[seq_id] = [self.free.popleft() for _ in range(-(-num_tokens // self.block_size))]
        for b in table:
            self.ref_count[b] = 1
        self.lengths[seq_id] = num_tokens

    def free_sequence(self, seq_id: int) -> None:
        for b in self.tables.pop(seq_id):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free.append(b)
        del self.lengths[seq_id]


def seed_loop(trace: Trace, steps, block_size: int, num_blocks: int) -> float:
    books = SeedBooks(num_blocks, block_size)
    free, ref_count, tables, lengths = books.free, books.ref_count, books.tables, books.lengths
    outputs: Dict[int, List[int]] = {}
    elapsed = 0.0
    for admitted, (ids, tokens), finished in steps:
        for s in admitted:
            books.allocate(s, trace[s][0])
            outputs[s] = []
        t0 = time.perf_counter()
        for s, (token,) in zip(ids, tokens):
            outputs[s].append(token)
            n = lengths[s]
            if n % block_size == 0:  # the next token starts a block
                b = free.popleft()
                ref_count[b] = 1
                tables[s].append(b)
            lengths[s] = n + 1
        elapsed += time.perf_counter() - t0
        for s in finished:
            books.free_sequence(s)
            del outputs[s]
    return elapsed


def seed_loop_sha256(trace: Trace, steps, block_size: int, num_blocks: int) -> float:
    """The seed's loop, plus each sequence's tokens and a SHA-256 key per block once it fills, found in a map."""
    books = SeedBooks(num_blocks, block_size)
    free, ref_count, tables, lengths = books.free, books.ref_count, books.tables, books.lengths
    tokens: Dict[int, List[int]] = {}
    keys: Dict[int, List[bytes]] = {}
    cached: Dict[bytes, int] = {}
    root = bytes(32)
    elapsed = 0.0
    for admitted, (ids, new), finished in steps:
        for s in admitted:
            books.allocate(s, trace[s][0])
            tokens[s] = prompt_tokens(s, trace[s][0])
            keys[s] = []
            for i in range(len(tokens[s]) // block_size):
                parent = keys[s][-1] if keys[s] else root
                key = hashlib.sha256(parent + array("q", tokens[s][i * block_size:(i + 1) * block_size]).tobytes())
                keys[s].append(key.digest())
                cached[keys[s][-1]] = tables[s][i]
        t0 = time.perf_counter()
        for s, (token,) in zip(ids, new):
            n = lengths[s]
            if n % block_size == 0:
                b = free.popleft()
                ref_count[b] = 1
                tables[s].append(b)
            seq_tokens = tokens[s]
            seq_tokens.append(token)
            n += 1
            lengths[s] = n
            if n % block_size == 0:  # the block filled: its key, once
                seq_keys = keys[s]
                parent = seq_keys[-1] if seq_keys else root
                key = hashlib.sha256(parent + array("q", seq_tokens[n - block_size:]).tobytes()).digest()
                seq_keys.append(key)
                cached[key] = tables[s][-1]
        elapsed += time.perf_counter() - t0
        for s in finished:
            books.free_sequence(s)
            del tokens[s], keys[s]
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    trace = make_trace(args.sequences, args.seed)
    steps = schedule(trace, args.batch)
    bs = args.block_size
    num_blocks = args.batch * ((512 + 256) // bs + 2)
    grown = sum(len(ids) for _, (ids, _), _ in steps)
    sides: Dict[str, Callable[[], float]] = {
        "library, prefix caching, per step": lambda: library_per_step(trace, steps, bs, num_blocks, True),
        "seed loop + SHA-256 keys": lambda: seed_loop_sha256(trace, steps, bs, num_blocks),
        "library, no caching, per step": lambda: library_per_step(trace, steps, bs, num_blocks, False),
        "library, no caching, per call": lambda: library_per_call(trace, steps, bs, num_blocks),
        "seed loop": lambda: seed_loop(trace, steps, bs, num_blocks),
    }
    pairs = [("prefix caching, per step", "library, prefix caching, per step", "seed loop + SHA-256 keys"),
             ("no prefix caching, per step", "library, no caching, per step", "seed loop"),
             ("no prefix caching, per call", "library, no caching, per call", "seed loop")]
    times: Dict[str, List[float]] = {name: [] for name in sides}
    ratios: Dict[str, List[float]] = {label: [] for label, _, _ in pairs}
    for _ in range(args.repeats):  # interleaved rounds
        now = {name: run() for name, run in sides.items()}
        for name, t in now.items():
            times[name].append(t)
        for label, mine, base in pairs:
            ratios[label].append(now[base] / now[mine])  # speed ratio: the library's tokens/s over the baseline's
    print(f"trace: {args.sequences} sequences (prompts 1-512, outputs 1-256 tokens), up to {args.batch} decoding at "
          f"once, joining as others finish; block size {bs}; {len(steps):,} decode steps, {grown:,} tokens grown; "
          f"{args.repeats} interleaved rounds, decode steps timed")
    for name, values in times.items():
        print(f"  {name:<36} {grown / statistics.median(values) / 1e6:6.2f} M tokens/s (median)")
    print("ratio to the baseline (median of the rounds, range; goal >= 0.5 each):")
    for label, mine, base in pairs:
        values = sorted(ratios[label])
        print(f"  {label:<28} {statistics.median(values):.2f}x  ({values[0]:.2f}-{values[-1]:.2f})  "
              f"[{mine} / {base}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
