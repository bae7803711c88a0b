"""Cost of a prefix-cache hit on a free block as the pool grows: linked list vs ``deque.remove``.

A hit on a cached block that sits in the free queue must take it out of the middle of
the queue. ``collections.deque.remove`` scans for it (O(n)); ``FreeBlockQueue.remove``
unlinks it (O(1)). For each pool size this prints the mean time of one such removal
(followed by re-appending the block, so the queue keeps its size) for both, and the
time of a whole cache-hit allocation through ``PagedKVCacheAllocator``.

    python benchmarks/free_queue.py [--sizes 1000,10000,100000,1000000] [--plot out.png]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from typing import Dict, List

from paged_kv_lib import BlockManager, FreeBlockQueue


def time_removals(queue, picks: List[int]) -> float:
    """Mean seconds per remove-then-append of each picked block id."""
    start = time.perf_counter()
    for block_id in picks:
        queue.remove(block_id)
        queue.append(block_id)
    return (time.perf_counter() - start) / len(picks)


def time_allocator_hits(num_blocks: int, hits: int, seed: int = 0) -> float:
    """Mean seconds per allocation of a one-block prompt whose block is cached and free."""
    alloc = BlockManager(num_blocks, 4)
    prompts = [[i, i + 1, i + 2, i + 3] for i in range(0, 4 * hits, 4)]
    for seq_id, prompt in enumerate(prompts):  # cache them, then free: they sit in the free queue
        alloc.allocate_for_sequence(seq_id, 4, token_ids=prompt)
    for seq_id in range(len(prompts)):
        alloc.free_sequence(seq_id)
    random.Random(seed).shuffle(prompts)
    start = time.perf_counter()
    for seq_id, prompt in enumerate(prompts, start=len(prompts)):
        alloc.allocate_for_sequence(seq_id, 4, token_ids=prompt)
    elapsed = (time.perf_counter() - start) / len(prompts)
    assert alloc.stats().prefix_hits == len(prompts)
    return elapsed


def measure(sizes: List[int], seed: int = 0) -> List[Dict[str, float]]:
    rows = []
    rng = random.Random(seed)
    for n in sizes:
        linked = FreeBlockQueue(n, range(n))
        plain = deque(range(n))
        # deque.remove is O(n): fewer samples for big pools keep the run short.
        deque_ops = max(5, min(2000, 20_000_000 // (n * 20)))
        picks = [rng.randrange(n // 4, n) for _ in range(2000)]
        rows.append(
            {
                "pool_blocks": n,
                "linked_list_us": time_removals(linked, picks) * 1e6,
                "deque_us": time_removals(plain, picks[:deque_ops]) * 1e6,
                "allocator_hit_us": time_allocator_hits(n, min(2000, n // 2), seed) * 1e6,
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--plot", help="write a log-log plot to this PNG file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = measure(sizes)
    print(f"{'pool blocks':>12} {'linked list':>14} {'deque.remove':>14} {'ratio':>8} {'allocator hit':>14}")
    for r in rows:
        ratio = r["deque_us"] / r["linked_list_us"]
        print(
            f"{r['pool_blocks']:>12,} {r['linked_list_us']:>11.3f} us {r['deque_us']:>11.3f} us "
            f"{ratio:>7.0f}x {r['allocator_hit_us']:>11.3f} us"
        )
    first, last = rows[0], rows[-1]
    print(
        f"growth from {first['pool_blocks']:,} to {last['pool_blocks']:,} blocks: linked list "
        f"x{last['linked_list_us'] / first['linked_list_us']:.2f}, deque x{last['deque_us'] / first['deque_us']:.0f}, "
        f"allocator hit x{last['allocator_hit_us'] / first['allocator_hit_us']:.2f}"
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["pool_blocks"] for r in rows]
        ax.loglog(xs, [r["deque_us"] for r in rows], "o-", label="deque.remove (O(n))")
        ax.loglog(xs, [r["linked_list_us"] for r in rows], "s-", label="linked list remove (O(1))")
        ax.set_xlabel("blocks in the free queue")
        ax.set_ylabel("microseconds per cache hit")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
