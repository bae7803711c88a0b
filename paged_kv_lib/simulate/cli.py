"""``paged-kv simulate``: the memory-waste table (and plot) for a workload, from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

from ..errors import InvalidArgumentError
from ..memcheck import ensure_fits
from .report import format_table, report
from .reservation import FITS
from .runner import ALLOCATORS, DEFAULT_BLOCK_SIZE, DEFAULT_CAPACITY, simulate
from .workloads import DEFAULT_MAX_LEN, DEFAULT_RATE, TRACES, Workload, WorkloadError, load_workload, make_workload

DEFAULT_REQUESTS = 1000
# Measured peaks of the simulation's own state (tracemalloc): a paged allocator's block with its
# bookkeeping, and a request with its samples and scheduler entries, with room to spare.
BYTES_PER_BLOCK = 400
BYTES_PER_REQUEST = 4096
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def register(subparsers) -> None:
    """Add the ``simulate`` subcommand to the ``paged-kv`` parser."""
    parser = subparsers.add_parser(
        "simulate",
        help="memory waste of contiguous vs paged KV caches under a simulated workload",
        description=(
            "Serve a workload under Orca-style contiguous reservations (max, pow2, oracle) and "
            "the paged allocator, and print how the KV-cache capacity is spent (time-averaged "
            "over the steps where requests wait for memory)."
        ),
    )
    parser.add_argument("--workload", default="sharegpt",
                        help=f"{' | '.join(TRACES)} | a .csv/.json trace of prompt_len,output_len[,arrival] (default sharegpt)")
    parser.add_argument("--capacity-tokens", type=int, default=DEFAULT_CAPACITY,
                        help=f"KV-cache token slots (default {DEFAULT_CAPACITY}: a 13B model on a 40 GB GPU)")
    parser.add_argument("--block-size", default=str(DEFAULT_BLOCK_SIZE),
                        help="paged block size, or a comma list for a sweep, e.g. 1,2,4,8,16,32,64,128,256")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"requests to simulate (default {DEFAULT_REQUESTS}; a trace file: all of it)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workload (default 0)")
    parser.add_argument("--rate", type=float, default=None,
                        help="Poisson arrivals per scheduler step (default: saturating, "
                             + ", ".join(f"{k} {v.rate:g}" for k, v in TRACES.items())
                             + f", {DEFAULT_RATE:g} for a trace file without arrivals)")
    parser.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN,
                        help=f"model context length; orca-max reserves this much (default {DEFAULT_MAX_LEN})")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS),
                        help=f"comma list from {', '.join(ALLOCATORS)} (default: all)")
    parser.add_argument("--fit", choices=FITS, default="buddy",
                        help="contiguous allocator of the orca rows (default buddy, as in the paper)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the breakdown and batch sizes to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; returns the exit status (2 for bad arguments or trace files)."""
    try:
        sizes = _int_list(args.block_size, "--block-size")
        allocators = [a.strip() for a in args.allocators.split(",") if a.strip()]
        if not allocators:
            raise InvalidArgumentError(f"--allocators names no allocator; choose from {', '.join(ALLOCATORS)}")
        if args.plot:
            _check_plot_path(args.plot)
        ensure_fits(estimated_bytes(args, sizes, allocators),
                    f"simulating {_requests(args)} requests in {args.capacity_tokens} token slots")
        workload = _workload(args)
        bar = _progress(args, workload, allocators, sizes)
        try:
            results = simulate(workload, args.capacity_tokens, allocators, sizes, fit=args.fit, progress=bar)
        finally:
            if bar is not None:
                bar.close()
    except (ValueError, TypeError) as exc:
        print(f"paged-kv simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report(workload, args.capacity_tokens, results, seed=args.seed, fit=args.fit)))
    else:
        print(f"workload {workload.name}: {len(workload)} requests, mean prompt {workload.mean_prompt():.0f}, "
              f"mean output {workload.mean_output():.0f} tokens; capacity {args.capacity_tokens} token slots; "
              f"contiguous allocator: {args.fit}")
        print(format_table(results))
        for r in results:
            if r.window != "loaded":
                print(f"note: {r.label} never had a request waiting (arrivals too slow to load it); "
                      f"its averages cover every step with a running request")
    if args.plot:
        from ..viz.plots import plot_results

        try:
            plot_results(results, args.plot, title=f"{workload.name}, {args.capacity_tokens} token slots")
        except (OSError, ValueError) as exc:
            print(f"paged-kv simulate: error: --plot {args.plot}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}",
                  file=sys.stderr)
            return 2
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _requests(args: argparse.Namespace) -> int:
    if args.requests is not None:
        return max(0, args.requests)
    return DEFAULT_REQUESTS if args.workload in TRACES else 0


def estimated_bytes(args: argparse.Namespace, sizes: List[int], allocators: List[str]) -> int:
    """The simulation's peak memory, estimated before anything is built: the largest pool it makes
    (one allocator row runs at a time) plus the requests."""
    capacity = max(0, args.capacity_tokens)
    blocks = capacity // max(1, min(sizes)) if "paged" in allocators and sizes else 0
    contiguous = capacity // 8 * 8 if any(a != "paged" for a in allocators) else 0
    trace = 0
    if args.workload not in TRACES and os.path.isfile(args.workload):
        trace = os.path.getsize(args.workload) * 8
    return max(blocks * BYTES_PER_BLOCK, contiguous) + _requests(args) * BYTES_PER_REQUEST + trace


def _check_plot_path(path: str) -> None:
    """Refuse, before simulating, a plot file that cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PLOT_SUFFIXES:
        raise InvalidArgumentError(f"--plot {path}: give a file ending in {', '.join(PLOT_SUFFIXES)}")
    if os.path.isdir(path):
        raise InvalidArgumentError(f"--plot {path}: is a folder")
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"--plot {path}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise InvalidArgumentError(f"--plot {path}: cannot write in {folder}")


def _int_list(text: str, flag: str) -> List[int]:
    values = []
    for part in text.split(","):
        try:
            values.append(int(part))
        except ValueError:
            raise InvalidArgumentError(f"{flag} takes integers separated by commas, got {text!r}") from None
    return values


def _workload(args: argparse.Namespace) -> Workload:
    if args.workload in TRACES:
        count = DEFAULT_REQUESTS if args.requests is None else args.requests
        return make_workload(args.workload, count, args.seed, rate=args.rate, max_len=args.max_len)
    if not os.path.exists(args.workload) and not os.path.splitext(args.workload)[1]:
        raise WorkloadError(f"--workload {args.workload!r} is neither {' nor '.join(TRACES)} nor a file")
    rate = DEFAULT_RATE if args.rate is None else args.rate
    return load_workload(args.workload, num_requests=args.requests, seed=args.seed, rate=rate, max_len=args.max_len)


def _progress(args: argparse.Namespace, workload: Workload, allocators: List[str], sizes: List[int]):
    if args.json or args.no_progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    runs = sum(len(sizes) if name == "paged" else 1 for name in allocators)
    return tqdm(total=runs * len(workload), unit="req", desc="simulating", file=sys.stderr)
