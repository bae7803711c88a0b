"""``paged-kv generate``: run the shipped tiny model on the paged engine and print text and stats."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, List

from ..errors import PagedKVError
from ..memcheck import TooLargeError, ensure_fits
from .loop import Engine
from .requests import RequestOutput
from .scheduler import PREEMPTION_MODES

if TYPE_CHECKING:
    from ..allocator import PagedKVCacheAllocator

# Bytes per cached value (the tiny model's float32) and per block of bookkeeping besides the K/V.
_VALUE_BYTES = 4
_BLOCK_OVERHEAD_BYTES = 256


def register(subparsers) -> None:
    """Add the ``generate`` subcommand to the ``paged-kv`` parser."""
    p = subparsers.add_parser(
        "generate",
        help="generate text with the tiny model on the paged continuous-batching engine",
        description=(
            "Each PROMPT becomes one request; all of them run together on one paged KV cache. "
            "Prints every continuation, then the engine's and the allocator's statistics."
        ),
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--max-new-tokens", type=int, default=120, help="tokens (bytes) to generate per sample")
    p.add_argument("-n", "--num-samples", type=int, default=1, help="samples per prompt (they share it by fork)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=256, help="blocks in the device pool")
    p.add_argument("--cpu-blocks", type=int, default=64, help="blocks in the CPU swap pool")
    p.add_argument("--watermark", type=float, default=0.01)
    p.add_argument("--preemption", choices=PREEMPTION_MODES, default="recompute")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget per step (chunked prefill); default: no limit")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--random-weights", action="store_true", help="an untrained test-sized model instead of the checkpoint")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads; the tiny model's matrices are too small to gain from more",
    )
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """Build model, allocator and engine from ``args``, generate, print; returns the exit status."""
    if args.threads < 1:
        print(f"paged-kv generate: error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    try:
        ensure_fits(kv_cache_bytes(args), "the KV cache (--num-blocks, --cpu-blocks, --block-size)")
    except TooLargeError as exc:
        print(f"paged-kv generate: error: {exc}", file=sys.stderr)
        return 2
    import torch

    from ..model import ModelConfig, TinyTransformer, load_tiny_model

    torch.set_num_threads(args.threads)
    model = TinyTransformer(ModelConfig(), seed=args.seed or 0).eval() if args.random_weights else load_tiny_model()
    try:
        allocator = model.new_allocator(
            args.num_blocks, args.block_size,
            enable_prefix_caching=not args.no_prefix_caching, num_cpu_blocks=args.cpu_blocks,
        )
        engine = Engine(
            model, allocator, max_batch_size=args.max_batch_size,
            watermark=args.watermark, preemption_mode=args.preemption,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
        for prompt in args.prompts:
            engine.add_request(
                prompt, args.max_new_tokens, n=args.num_samples,
                temperature=args.temperature, seed=args.seed,
            )
    except (PagedKVError, ValueError, TypeError) as exc:
        print(f"paged-kv generate: error: {exc}", file=sys.stderr)
        return 2
    outputs = engine.run(progress=not args.no_progress)
    print("\n".join(format_outputs(outputs, args.prompts)))
    print()
    print("\n".join(format_stats(engine, allocator)))
    return 0


def kv_cache_bytes(args: argparse.Namespace) -> int:
    """The bytes the engine's device and CPU pools take for the tiny model (K and V, every layer)."""
    from ..model import ModelConfig

    cfg = ModelConfig()
    blocks = max(0, args.num_blocks) + max(0, args.cpu_blocks)
    per_block = 2 * cfg.num_layers * cfg.num_kv_heads * (cfg.dim // cfg.num_heads) * max(0, args.block_size) * _VALUE_BYTES
    return blocks * (per_block + _BLOCK_OVERHEAD_BYTES)


def format_outputs(outputs: List[RequestOutput], prompts: List[str]) -> List[str]:
    lines = []
    for out, prompt in zip(outputs, prompts):
        for index, text in enumerate(out.texts):
            label = f"[{out.request_id}]" if len(out.texts) == 1 else f"[{out.request_id}.{index}]"
            lines.append(f"{label} {prompt}{text}")
    return lines


def format_stats(engine: Engine, a: PagedKVCacheAllocator) -> List[str]:
    """The run's totals, and the allocator's counters (the library's allocator: the engine asks only the protocol)."""
    t = engine.totals
    s = a.stats()
    return [
        f"steps {t.steps}, generated {t.generated_tokens} tokens in {t.elapsed_s:.2f} s "
        f"({t.tokens_per_s:.1f} tokens/s)",
        f"prompt tokens computed {t.prefill_tokens}, found in the prefix cache {t.cached_tokens}",
        f"peak blocks used {t.peak_blocks_used}/{a.num_blocks} (block size {a.block_size}), "
        f"preemptions {t.preemptions} ({engine.preemption_mode}), copy-on-write copies {s.cow_copies}",
        f"now: {s.free_blocks} free blocks ({s.cached_free_blocks} still cached), "
        f"{s.num_sequences} sequences",
    ]
