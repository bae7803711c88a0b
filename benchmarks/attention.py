"""Paged decode attention against SDPA on the same K/V laid out contiguously.

For an equal-length and a ragged batch, times ``paged_attention`` (K/V read through a
block table) and ``scaled_dot_product_attention`` on a contiguous ``[seqs, heads, len,
dim]`` copy (a ragged batch padded to its longest sequence, with a mask), and prints
the speed ratio. On CUDA it also prints the kernel's achieved bandwidth (bytes of K and
V read / time) against the device's measured copy bandwidth.

    python benchmarks/attention.py [--device cpu|cuda] [--sizes small|large] [--tune] [--json FILE]

CPU defaults: small sizes, torch backend, one thread (well under a minute). CUDA
defaults: large sizes (1 GiB of K/V and more per call), Triton backend, bf16, block 16.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv_lib.attention import paged_attention  # noqa: E402


@dataclass
class Case:
    """One benchmark batch: sequence lengths and the model's attention shape."""

    name: str
    seq_lens: List[int]
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: str = "bfloat16"
    note: str = ""


@dataclass
class Result:
    case: str
    backend: str
    num_seqs: int
    total_tokens: int
    max_len: int
    kv_bytes: int
    paged_ms: float
    sdpa_ms: float
    speed_vs_sdpa: float  # sdpa_ms / paged_ms: above 1 means paged attention is faster
    paged_gbps: Optional[float] = None
    fraction_of_copy_bw: Optional[float] = None
    extra: Dict[str, float] = field(default_factory=dict)


def ragged_lengths(n: int, low: int, high: int, seed: int) -> List[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


def small_cases() -> List[Case]:
    common = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype="float32")
    return [
        Case("equal 8x512", [512] * 8, **common),
        Case("ragged 8 in [16,1024]", ragged_lengths(8, 16, 1024, seed=0), **common),
    ]


def large_cases() -> List[Case]:
    return [
        Case("equal 64x4096", [4096] * 64, note="1 GiB of K/V"),
        Case("ragged 128 in [64,8192]", ragged_lengths(128, 64, 8192, seed=0), note="about 2 GiB of K/V"),
        Case("equal 256x1024", [1024] * 256, note="1 GiB, short contexts"),
        Case("few long 4x32768", [32768] * 4, note="split-K territory"),
    ]


# ------------------------------------------------------------------------ batches
def build(case: Case, device: torch.device) -> dict:
    """The paged cache (shuffled blocks) and the padded contiguous K/V SDPA reads."""
    dtype = getattr(torch, case.dtype)
    torch.manual_seed(0)
    lens = case.seq_lens
    num_seqs, max_len = len(lens), max(lens)
    bs, hk, d = case.block_size, case.num_kv_heads, case.head_dim
    max_blocks = -(-max_len // bs)

    k = torch.randn(num_seqs, hk, max_blocks * bs, d, device=device, dtype=dtype)
    v = torch.randn_like(k)
    blocks_per_seq = [-(-n // bs) for n in lens]
    num_blocks = sum(blocks_per_seq)
    order = torch.randperm(num_blocks, device=device).to(torch.int32)
    block_tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32, device=device)
    k_cache = torch.empty(num_blocks, hk, bs, d, device=device, dtype=dtype)
    v_cache = torch.empty_like(k_cache)
    first = 0
    for i, nb in enumerate(blocks_per_seq):
        ids = order[first : first + nb]
        first += nb
        block_tables[i, :nb] = ids
        # [hk, nb*bs, d] -> [nb, hk, bs, d]: block j holds tokens j*bs .. j*bs+bs-1.
        k_cache[ids.long()] = k[i, :, : nb * bs].reshape(hk, nb, bs, d).transpose(0, 1)
        v_cache[ids.long()] = v[i, :, : nb * bs].reshape(hk, nb, bs, d).transpose(0, 1)

    k, v = k[:, :, :max_len], v[:, :, :max_len]
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    mask = None
    if min(lens) != max_len:
        mask = (torch.arange(max_len, device=device)[None, :] < seq_lens[:, None].long())[:, None, None, :]
    q = torch.randn(num_seqs, case.num_q_heads, d, device=device, dtype=dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens, k=k, v=v, mask=mask)


# ------------------------------------------------------------------------ timing
def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds per call: do_bench's median (L2 flushed between calls) on CUDA; on CPU
    the best wall-clock time of repeated calls (other work on the machine only adds time)."""
    if device.type == "cuda":
        try:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
        except ImportError:
            return _cuda_events_ms(fn)
    fn()
    samples = []
    deadline = time.perf_counter() + 1.0
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 50):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples)


def _cuda_events_ms(fn: Callable[[], object], reps: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth: (bytes read + bytes written) / time."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------ running
def run_case(case: Case, device: torch.device, backend: str, copy_gbps: Optional[float]) -> Result:
    t = build(case, device)
    paged = lambda: paged_attention(  # noqa: E731
        t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], backend=backend, check_values=False
    )
    q4 = t["q"][:, :, None, :]  # [seqs, q_heads, 1, d]
    sdpa = lambda: F.scaled_dot_product_attention(q4, t["k"], t["v"], attn_mask=t["mask"], enable_gqa=True)  # noqa: E731

    # Same answer first: a fast wrong kernel is no result.
    got, want = paged().float(), sdpa()[:, :, 0].float()
    tol = 1e-4 if case.dtype == "float32" else 3e-2
    if not torch.allclose(got, want, atol=tol, rtol=tol):
        raise AssertionError(f"{case.name}: paged attention differs from SDPA by {(got - want).abs().max():.3g}")

    paged_ms = time_ms(paged, device)
    sdpa_ms = time_ms(sdpa, device)
    elem = t["k_cache"].element_size()
    total = sum(case.seq_lens)
    kv_bytes = 2 * total * case.num_kv_heads * case.head_dim * elem
    result = Result(
        case=case.name, backend=backend, num_seqs=len(case.seq_lens), total_tokens=total,
        max_len=max(case.seq_lens), kv_bytes=kv_bytes, paged_ms=paged_ms, sdpa_ms=sdpa_ms,
        speed_vs_sdpa=sdpa_ms / paged_ms,
    )
    if device.type == "cuda":
        result.paged_gbps = kv_bytes / (paged_ms * 1e-3) / 1e9
        result.extra["sdpa_gbps_on_real_tokens"] = kv_bytes / (sdpa_ms * 1e-3) / 1e9
        if copy_gbps:
            result.fraction_of_copy_bw = result.paged_gbps / copy_gbps
        if backend == "triton":
            result.extra.update(_split_comparison(t, device))
    del t
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _split_comparison(t: dict, device: torch.device) -> Dict[str, float]:
    """Time the kernel with split-K off and forced to 8, beside the heuristic's choice."""
    from paged_kv_lib.attention.triton_kernel import paged_attention_triton

    args = (t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], 1 / math.sqrt(t["q"].shape[-1]))
    return {
        f"ms_num_splits_{n}": time_ms(lambda n=n: paged_attention_triton(*args, num_splits=n), device)
        for n in (1, 8)
    }


def tune(case: Case, device: torch.device) -> List[dict]:
    """Sweep the kernel's launch settings on one case; fastest first."""
    from paged_kv_lib.attention.triton_kernel import paged_attention_triton

    t = build(case, device)
    args = (t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], 1 / math.sqrt(case.head_dim))
    kv_bytes = 2 * sum(case.seq_lens) * case.num_kv_heads * case.head_dim * t["k_cache"].element_size()
    rows = []
    for block_n in (32, 64, 128):
        for num_warps in (4, 8):
            for num_stages in (1, 2, 3):
                kwargs = dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages, num_splits=1)
                try:
                    ms = time_ms(lambda: paged_attention_triton(*args, **kwargs), device)
                except Exception as exc:  # a setting can fail to compile (shared memory)
                    rows.append(dict(kwargs, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
                    continue
                rows.append(dict(kwargs, ms=ms, gbps=kv_bytes / (ms * 1e-3) / 1e9))
    del t
    return sorted(rows, key=lambda r: r.get("ms", math.inf))


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", choices=["small", "large"], default=None, help="default: large on CUDA, small on CPU")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--tune", action="store_true", help="CUDA: also sweep block_n / num_warps / num_stages")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads (default 1, steadier)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    sizes = args.sizes or ("large" if device.type == "cuda" else "small")
    cases = large_cases() if sizes == "large" else small_cases()
    backend = args.backend
    if backend == "auto":
        from paged_kv_lib.attention import resolve_backend

        backend = resolve_backend("auto", device)

    copy_gbps = copy_bandwidth_gbps(device) if device.type == "cuda" else None
    print(f"device: {describe(device)}; torch {torch.__version__}; backend {backend}; sizes {sizes}")
    if copy_gbps:
        print(f"device-to-device copy bandwidth: {copy_gbps:.0f} GB/s (read + write)")
    header = f"{'case':<26} {'paged ms':>9} {'SDPA ms':>9} {'SDPA/paged':>10}"
    if device.type == "cuda":
        header += f" {'GB/s':>7} {'% copy':>7}"
    print(header)

    results = []
    for case in cases:
        r = run_case(case, device, backend, copy_gbps)
        results.append(r)
        line = f"{r.case:<26} {r.paged_ms:9.3f} {r.sdpa_ms:9.3f} {r.speed_vs_sdpa:9.2f}x"
        if r.paged_gbps is not None:
            pct = f"{100 * r.fraction_of_copy_bw:6.1f}%" if r.fraction_of_copy_bw else "     -"
            line += f" {r.paged_gbps:7.0f} {pct}"
        print(line, flush=True)
        if r.extra:
            print("    " + ", ".join(f"{k}={v:.3f}" for k, v in r.extra.items()))

    tuning = None
    if args.tune and device.type == "cuda" and backend == "triton":
        tuning = tune(large_cases()[0], device)
        print("tuning on", large_cases()[0].name, "(fastest first):")
        for row in tuning[:6]:
            print("   ", row)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = dict(
            device=describe(device), torch=torch.__version__, backend=backend, sizes=sizes,
            copy_gbps=copy_gbps, results=[asdict(r) for r in results], tuning=tuning,
            cases={c.name: dict(asdict(c), seq_lens=None, num_seqs=len(c.seq_lens)) for c in cases},
        )
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
