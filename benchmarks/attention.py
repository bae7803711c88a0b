"""Paged decode attention against what a PyTorch user would run instead.

For each batch this times ``paged_attention`` (K/V read through a block table) and, on
the same K/V laid out contiguously, every fused SDPA backend that accepts the case
(``torch.nn.attention.sdpa_kernel``), naming each and comparing with the fastest. A
ragged batch is also compared with the other things one would really do: SDPA on K/V
padded to the longest sequence with a mask (each fused backend that takes the mask), a
per-sequence SDPA loop over unpadded K/V, and FlexAttention with a block mask. Each
result states the bytes each layout holds, the paged kernel's bandwidth (bytes of K and
V read / time) and, given the device's measured copy bandwidth, the fraction of it.

    python benchmarks/attention.py [--device cpu|cuda] [--sizes small|large] [--tune] [--json FILE]
    python benchmarks/attention.py --smoke --json FILE     (tiny cases, Triton interpreter, CPU)

CPU defaults: small sizes, torch backend, one thread. CUDA defaults: large sizes (1 GiB
of K/V and more per call), the backend ``"auto"`` picks (Triton from compute capability
8.0), bf16 (fp16 on a GPU without bf16), block 16. A case that does not fit in the GPU's
free memory is skipped with a line saying so. ``--smoke`` runs the Triton kernel under the
CPU interpreter on tiny batches and writes the same JSON schema as a GPU run; its times say
nothing about speed. ``--record`` (with a CUDA run) also writes the figures to
``benchmarks/measured/attention_gpu.json``, which lesson 09 shows on machines without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv_lib.attention import paged_attention  # noqa: E402
from paged_kv_lib.block import cdiv  # noqa: E402

# Where a CUDA run with --record leaves its figures (committed after a GPU run; lesson 09 reads it).
MEASURED = Path(__file__).resolve().parent / "measured" / "attention_gpu.json"
# Of the GPU's free memory, what a case may plan to use (the allocator and SDPA workspaces need the rest).
FREE_MEMORY_SHARE = 0.85

# The fused SDPA kernels; MATH (unfused, materialises the scores) is no baseline.
FUSED_SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
PER_SEQUENCE_LOOP = "per-sequence SDPA loop"
FLEX = "FlexAttention block mask"


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

    @property
    def ragged(self) -> bool:
        return min(self.seq_lens) != max(self.seq_lens)


@dataclass
class Result:
    """One case's timings; every time is milliseconds per call."""

    case: str
    backend: str
    num_seqs: int
    total_tokens: int
    max_len: int
    kv_bytes: int  # bytes of K and V the sequences really hold (what the kernel reads)
    paged_ms: float
    sdpa_ms: Optional[float]  # the fastest fused SDPA backend (None if none accepts the case)
    speed_vs_sdpa: Optional[float]  # sdpa_ms / paged_ms: above 1 means paged attention is faster
    sdpa_backend: Optional[str] = None  # which backend that was
    sdpa_backends: Dict[str, float] = field(default_factory=dict)  # every fused backend timed
    # Every alternative timed (ragged: padded backends, the loop, FlexAttention), its best,
    # and how the paged kernel compares with that best.
    alternatives: Dict[str, float] = field(default_factory=dict)
    best_alternative: Optional[str] = None
    best_alternative_ms: Optional[float] = None
    speed_vs_best_alternative: Optional[float] = None
    paged_gbps: Optional[float] = None
    fraction_of_copy_bw: Optional[float] = None
    memory: Dict[str, int] = field(default_factory=dict)  # bytes, see run_case
    skipped: Dict[str, str] = field(default_factory=dict)  # alternative -> why it did not run
    extra: Dict[str, float] = field(default_factory=dict)


def ragged_lengths(n: int, low: int, high: int, seed: int) -> List[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


def smoke_cases() -> List[Case]:
    common = dict(num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32")
    return [
        Case("smoke equal 2x48", [48, 48], **common),
        Case("smoke ragged 3 in [5,40]", [5, 40, 23], **common),
    ]


def small_cases() -> List[Case]:
    common = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype="float32")
    return [
        Case("equal 8x512", [512] * 8, **common),
        Case("ragged 8 in [16,1024]", ragged_lengths(8, 16, 1024, seed=0), **common),
    ]


def large_cases(dtype: str = "bfloat16") -> List[Case]:
    """The GPU batches; the sizes in the notes are K and V together, in a 2-byte dtype."""
    return [
        Case("equal 64x4096", [4096] * 64, dtype=dtype, note="1 GiB of K/V"),
        Case("ragged 128 in [64,8192]", ragged_lengths(128, 64, 8192, seed=0), dtype=dtype,
             note="about 2 GiB of K/V, 4 GiB padded"),
        Case("equal 256x1024", [1024] * 256, dtype=dtype, note="1 GiB, short contexts"),
        Case("few long 4x32768", [32768] * 4, dtype=dtype, note="split-K territory"),
    ]


def bytes_needed(case: Case) -> int:
    """What ``build`` allocates for ``case``: the paged cache, the padded contiguous K/V and the
    per-sequence copies (K and V each). Repeated heads for a backend without GQA come on top,
    and are checked against the free memory when they are made."""
    elem = getattr(torch, case.dtype).itemsize
    row = case.num_kv_heads * case.head_dim * elem  # one token's K (or V) over all K/V heads
    bs = case.block_size
    paged = sum(cdiv(n, bs) for n in case.seq_lens) * bs * row
    padded = len(case.seq_lens) * cdiv(max(case.seq_lens), bs) * bs * row
    per_seq = sum(case.seq_lens) * row
    return 2 * (paged + padded + per_seq)


def free_bytes(device: torch.device) -> Optional[int]:
    """CUDA: bytes free on the device now (what torch caches counts as free). None on a CPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def release(device: torch.device) -> None:
    """Give back what a finished or failed case held, so the next one starts from a clean GPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# ------------------------------------------------------------------------ batches
def build(case: Case, device: torch.device) -> dict:
    """The paged cache (shuffled blocks), the padded contiguous K/V and per-sequence views."""
    dtype = getattr(torch, case.dtype)
    torch.manual_seed(0)
    lens = case.seq_lens
    num_seqs, max_len = len(lens), max(lens)
    bs, hk, d = case.block_size, case.num_kv_heads, case.head_dim
    max_blocks = cdiv(max_len, bs)

    k = torch.randn(num_seqs, hk, max_blocks * bs, d, device=device, dtype=dtype)
    v = torch.randn_like(k)
    blocks_per_seq = [cdiv(n, bs) for n in lens]
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
    if case.ragged:
        mask = (torch.arange(max_len, device=device)[None, :] < seq_lens[:, None].long())[:, None, None, :]
    q = torch.randn(num_seqs, case.num_q_heads, d, device=device, dtype=dtype)
    # What a per-sequence loop keeps: each sequence's own K/V, unpadded and contiguous.
    per_seq = [(k[i, :, :n].contiguous(), v[i, :, :n].contiguous()) for i, n in enumerate(lens)]
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                k=k, v=v, mask=mask, per_seq=per_seq)


# ------------------------------------------------------------------------ timing
def time_ms(fn: Callable[[], object], device: torch.device, budget_s: float = 1.0) -> float:
    """Milliseconds per call: do_bench's median (L2 flushed between calls) on CUDA; on CPU
    the best wall-clock time of repeated calls (other work on the machine only adds time)."""
    if device.type == "cuda":
        try:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
        except ImportError:
            return _cuda_events_ms(fn)
    fn()
    samples: List[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 50):
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


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """CUDA: memory one call allocates beyond what was already held (workspace, outputs)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Copy bandwidth: (bytes read + bytes written) / time."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------ baselines
def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, name, None)


def sdpa_candidates(t: dict) -> Dict[str, Callable[[], torch.Tensor]]:
    """One callable per fused SDPA backend, on the padded contiguous K/V (masked if ragged).

    Each runs under ``sdpa_kernel([backend])``, so it is that backend or an error. A
    backend that refuses ``enable_gqa`` is offered K/V with the heads repeated instead
    (the repeat done once, outside the timing) and named ``<backend>+repeated_kv``.
    """
    from torch.nn.attention import sdpa_kernel

    q4 = t["q"][:, :, None, :]  # [seqs, q_heads, 1, d]
    group = t["q"].shape[1] // t["k"].shape[1]
    out: Dict[str, Callable[[], torch.Tensor]] = {}
    for name in FUSED_SDPA_BACKENDS:
        backend = _sdpa_backend(name)
        if backend is None:
            continue

        def gqa(backend=backend) -> torch.Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q4, t["k"], t["v"], attn_mask=t["mask"], enable_gqa=True)

        out[name] = gqa
        if group > 1:
            def repeated(backend=backend) -> torch.Tensor:
                if "k_rep" not in t:
                    need = 2 * group * t["k"].numel() * t["k"].element_size()
                    free = free_bytes(t["k"].device)
                    if free is not None and need > FREE_MEMORY_SHARE * free:
                        raise RuntimeError(f"not run. Repeating the K/V heads needs {_gib(need)}, {_gib(free)} free")
                    t["k_rep"] = t["k"].repeat_interleave(group, dim=1)
                    t["v_rep"] = t["v"].repeat_interleave(group, dim=1)
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q4, t["k_rep"], t["v_rep"], attn_mask=t["mask"])

            out[f"{name}+repeated_kv"] = repeated
    return out


def per_sequence_loop(t: dict) -> torch.Tensor:
    """SDPA once per sequence on its own unpadded K/V (the dispatcher picks the backend)."""
    outs = [
        F.scaled_dot_product_attention(t["q"][i][None, :, None, :], k[None], v[None], enable_gqa=True)[0, :, 0]
        for i, (k, v) in enumerate(t["per_seq"])
    ]
    return torch.stack(outs)


def flex_attention_call(t: dict, device: torch.device) -> Callable[[], torch.Tensor]:
    """FlexAttention over the padded K/V with a block mask that skips each sequence's padding.

    Compiled on CUDA (its fast path); eager on the CPU, where it is only a correctness
    stand-in. Raises if this torch has no FlexAttention.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lens = t["seq_lens"].long()

    def inside(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    num_seqs, max_len = t["k"].shape[0], t["k"].shape[2]
    block_mask = create_block_mask(inside, num_seqs, None, 1, max_len, device=device)
    q4 = t["q"][:, :, None, :]
    if device.type == "cuda":
        attend = torch.compile(flex_attention, dynamic=False)
        return lambda: attend(q4, t["k"], t["v"], block_mask=block_mask, enable_gqa=True)

    def eager() -> torch.Tensor:
        with warnings.catch_warnings():  # "called without torch.compile": known, and fine here
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(q4, t["k"], t["v"], block_mask=block_mask, enable_gqa=True)

    return eager


# ------------------------------------------------------------------------ running
def _tolerance(case: Case) -> float:
    return 1e-4 if case.dtype == "float32" else 3e-2


def check_case(case: Case, device: torch.device, backend: str) -> float:
    """Run the paged kernel once on ``case`` and return its largest difference from SDPA run
    per sequence on the contiguous K/V; raise ``AssertionError`` beyond the dtype's tolerance."""
    t = build(case, device)
    got = paged_attention(t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], backend=backend)
    diff = float((got.float() - per_sequence_loop(t).float()).abs().max())
    t.clear()
    if not diff <= _tolerance(case):
        raise AssertionError(f"{case.name}: paged attention differs from SDPA by {diff:.3g}")
    return diff


def run_case_if_fits(case: Case, device: torch.device, backend: str, copy_gbps: Optional[float],
                     **kwargs: object) -> Union[Result, str]:
    """``run_case`` when ``case`` fits in the GPU's free memory, else one line saying why it was
    skipped; running out of memory midway is reported the same way, after freeing what it held."""
    free = free_bytes(device)
    need = bytes_needed(case)
    if free is not None and need > FREE_MEMORY_SHARE * free:
        return f"{case.name}: skipped, it needs {_gib(need)} of K/V copies and {_gib(free)} is free"
    try:
        return run_case(case, device, backend, copy_gbps, **kwargs)  # type: ignore[arg-type]
    except torch.cuda.OutOfMemoryError:
        pass  # leave the except block first, so the traceback (and the tensors it holds) is gone
    release(device)
    return f"{case.name}: skipped, it ran out of GPU memory ({_gib(free or 0)} was free); its tensors are freed"


def run_case(
    case: Case, device: torch.device, backend: str, copy_gbps: Optional[float], budget_s: float = 1.0,
    with_flex: bool = True, split_comparison: bool = True,
) -> Result:
    """Time the paged kernel and every alternative that runs; check all agree first.

    ``budget_s`` bounds each CPU measurement; ``with_flex=False`` leaves FlexAttention out
    (importing it loads torch's compiler stack, several seconds on a small machine; compiling
    it on a GPU takes longer); ``split_comparison=False`` skips timing split-K off and at 8
    (two more kernel compiles).
    """
    t = build(case, device)
    paged = lambda: paged_attention(  # noqa: E731
        t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], backend=backend, check_values=False
    )
    tol = _tolerance(case)
    reference = per_sequence_loop(t).float()

    def agrees(out: torch.Tensor) -> bool:
        return bool(torch.allclose(out.float(), reference, atol=tol, rtol=tol))

    # Same answer first: a fast wrong kernel is no result.
    got = paged()
    if not agrees(got):
        raise AssertionError(f"{case.name}: paged attention differs from SDPA by {(got.float() - reference).abs().max():.3g}")

    skipped: Dict[str, str] = {}
    memory: Dict[str, int] = {}
    sdpa_backends: Dict[str, float] = {}
    for name, fn in sdpa_candidates(t).items():
        if name.endswith("+repeated_kv") and name.split("+")[0] in sdpa_backends:
            continue  # the backend took enable_gqa itself; no need for repeated heads
        try:
            out = fn()[:, :, 0]
        except RuntimeError as exc:  # this backend does not accept the case
            skipped[name] = "refused: " + str(exc).split(". ")[0][:120]
            continue
        if not agrees(out):
            skipped[name] = f"wrong answer (max diff {(out.float() - reference).abs().max():.3g})"
            continue
        sdpa_backends[name] = time_ms(fn, device, budget_s)
        extra = peak_extra_bytes(fn, device)
        if extra is not None:
            memory[f"peak_extra_bytes {name}"] = extra
    t.pop("k_rep", None)
    t.pop("v_rep", None)

    alternatives: Dict[str, float] = {}
    if case.ragged:
        alternatives.update({f"padded {name}": ms for name, ms in sdpa_backends.items()})
        loop = lambda: per_sequence_loop(t)  # noqa: E731
        alternatives[PER_SEQUENCE_LOOP] = time_ms(loop, device, budget_s)
        extra = peak_extra_bytes(loop, device)
        if extra is not None:
            memory[f"peak_extra_bytes {PER_SEQUENCE_LOOP}"] = extra
        try:
            if not with_flex:
                raise RuntimeError("left out (with_flex=False)")
            flex = flex_attention_call(t, device)
            out = flex()[:, :, 0]
            if not agrees(out):
                raise ValueError(f"wrong answer (max diff {(out.float() - reference).abs().max():.3g})")
            alternatives[FLEX] = time_ms(flex, device, budget_s)
            extra = peak_extra_bytes(flex, device)
            if extra is not None:
                memory[f"peak_extra_bytes {FLEX}"] = extra
        except Exception as exc:  # no FlexAttention here, or it failed to compile
            skipped[FLEX] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    else:
        alternatives.update(sdpa_backends)

    paged_ms = time_ms(paged, device, budget_s)
    extra = peak_extra_bytes(paged, device)
    if extra is not None:
        memory["peak_extra_bytes paged"] = extra
    elem = t["k_cache"].element_size()
    total = sum(case.seq_lens)
    kv_bytes = 2 * total * case.num_kv_heads * case.head_dim * elem
    memory["paged_cache_bytes"] = 2 * t["k_cache"].numel() * elem  # whole blocks: the last one partly filled
    memory["padded_kv_bytes"] = 2 * t["k"].numel() * elem  # what padded SDPA and FlexAttention read
    memory["per_sequence_kv_bytes"] = kv_bytes

    sdpa_name = min(sdpa_backends, key=sdpa_backends.get) if sdpa_backends else None
    sdpa_ms = sdpa_backends[sdpa_name] if sdpa_name else None
    best = min(alternatives, key=alternatives.get) if alternatives else None
    paged_gbps = kv_bytes / (paged_ms * 1e-3) / 1e9
    result = Result(
        case=case.name, backend=backend, num_seqs=len(case.seq_lens), total_tokens=total,
        max_len=max(case.seq_lens), kv_bytes=kv_bytes, paged_ms=paged_ms,
        sdpa_ms=sdpa_ms, speed_vs_sdpa=sdpa_ms / paged_ms if sdpa_ms else None, sdpa_backend=sdpa_name,
        sdpa_backends=sdpa_backends, alternatives=alternatives, best_alternative=best,
        best_alternative_ms=alternatives[best] if best else None,
        speed_vs_best_alternative=alternatives[best] / paged_ms if best else None,
        paged_gbps=paged_gbps, fraction_of_copy_bw=paged_gbps / copy_gbps if copy_gbps else None,
        memory=memory, skipped=skipped,
    )
    if device.type == "cuda" and backend == "triton" and split_comparison:
        result.extra.update(_split_comparison(t, device))
    t.clear()  # the timed closures still hold t; free its tensors before the next case
    release(device)
    return result


def measured_figures(path: Path = MEASURED) -> Optional[dict]:
    """The figures a CUDA run recorded with ``--record`` (None until one has)."""
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _split_comparison(t: dict, device: torch.device) -> Dict[str, float]:
    """Time the kernel with split-K off and forced to 8, beside the heuristic's choice."""
    from paged_kv_lib.attention.triton_kernel import paged_attention_triton

    args = (t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], 1 / math.sqrt(t["q"].shape[-1]))
    return {
        f"ms_num_splits_{n}": time_ms(lambda n=n: paged_attention_triton(*args, num_splits=n), device)
        for n in (1, 8)
    }


def _sweep(fn: Callable[..., object], settings: List[dict], device: torch.device, kv_bytes: int) -> List[dict]:
    rows = []
    for kwargs in settings:
        try:
            ms = time_ms(lambda: fn(**kwargs), device)
        except Exception as exc:  # a setting can fail to compile (shared memory, registers)
            rows.append(dict(kwargs, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
            continue
        rows.append(dict(kwargs, ms=ms, gbps=kv_bytes / (ms * 1e-3) / 1e9))
    return sorted(rows, key=lambda r: r.get("ms", math.inf))


def tune(device: torch.device) -> dict:
    """Sweep the decode kernel's launch settings (block_n, num_warps, num_stages 2/3) on the
    equal-length case with one split, then split counts on the few-long-sequences case with
    the default tile; fastest first, beside the defaults ``decode_config`` gives."""
    from paged_kv_lib.attention.triton_kernel import decode_config, paged_attention_triton

    equal, few_long = large_cases()[0], large_cases()[3]
    report: dict = {}
    for label, case, settings in (
        ("launch", equal, [dict(block_n=b, num_warps=w, num_stages=s, num_splits=1)
                           for b in (32, 64, 128) for w in (4, 8) for s in (2, 3)]),
        ("splits", few_long, [dict(num_splits=n) for n in (1, 2, 4, 8, 16, 32, 64)]),
    ):
        t = build(case, device)
        args = (t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["seq_lens"], 1 / math.sqrt(case.head_dim))
        kv_bytes = 2 * sum(case.seq_lens) * case.num_kv_heads * case.head_dim * t["k_cache"].element_size()
        rows = _sweep(lambda **kw: paged_attention_triton(*args, **kw), settings, device, kv_bytes)
        default_ms = time_ms(lambda: paged_attention_triton(*args, **({"num_splits": 1} if label == "launch" else {})), device)
        report[label] = dict(case=case.name, rows=rows, default_ms=default_ms,
                             default=decode_config(t["q"].dtype, case.head_dim))
        t.clear()  # the timed closures still hold t; free its tensors before the next case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _fmt(ms: Optional[float]) -> str:
    return f"{ms:9.3f}" if ms is not None else f"{'-':>9}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--sizes", choices=["small", "large"], default=None, help="default: large on CUDA, small on CPU")
    parser.add_argument("--smoke", action="store_true", help="tiny cases on the CPU through the Triton interpreter")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--tune", action="store_true", help="CUDA: also sweep launch settings and split counts")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads (default 1, steadier)")
    parser.add_argument("--record", action="store_true", help=f"CUDA: also write the figures to {MEASURED.name}")
    args = parser.parse_args(argv)

    if args.smoke:
        if args.device not in (None, "cpu"):
            parser.error("--smoke runs on the CPU")
        # The interpreter is chosen when Triton is first imported, which has not happened yet.
        os.environ["TRITON_INTERPRET"] = "1"
        device, sizes, cases, backend, budget_s = torch.device("cpu"), "smoke", smoke_cases(), "triton", 0.2
    else:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            print("error: --device cuda but CUDA is not available", file=sys.stderr)
            return 2
        sizes = args.sizes or ("large" if device.type == "cuda" else "small")
        if sizes == "large":
            from paged_kv_lib.attention import preferred_dtype

            half = preferred_dtype(device) if device.type == "cuda" else torch.bfloat16
            cases = large_cases(str(half).removeprefix("torch."))
        else:
            cases = small_cases()
        backend, budget_s = args.backend, 1.0
        if backend == "auto":
            from paged_kv_lib.attention import resolve_backend

            backend = resolve_backend("auto", device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)

    copy_gbps = copy_bandwidth_gbps(device, nbytes=(2 << 30) if device.type == "cuda" else (64 << 20))
    triton_version = None
    if backend == "triton":
        import triton

        triton_version = triton.__version__
    print(f"device: {describe(device)}; torch {torch.__version__}; backend {backend}; sizes {sizes}")
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s (read + write)")
    print(f"{'case':<26} {'paged ms':>9} {'SDPA ms':>9} {'SDPA/paged':>10} {'best alt':>9} {'alt/paged':>9} {'GB/s':>7} {'% copy':>7}")

    results = []
    for case in cases:
        r = run_case_if_fits(case, device, backend, copy_gbps, budget_s=budget_s)
        if isinstance(r, str):
            print(r, flush=True)
            continue
        results.append(r)
        ratio = f"{r.speed_vs_sdpa:9.2f}x" if r.speed_vs_sdpa else f"{'-':>10}"
        alt = f"{r.speed_vs_best_alternative:8.2f}x" if r.speed_vs_best_alternative else f"{'-':>9}"
        pct = f"{100 * r.fraction_of_copy_bw:6.1f}%" if r.fraction_of_copy_bw else "     -"
        print(f"{r.case:<26} {r.paged_ms:9.3f} {_fmt(r.sdpa_ms)} {ratio} {_fmt(r.best_alternative_ms)} {alt} "
              f"{r.paged_gbps:7.2f} {pct}", flush=True)
        print(f"    SDPA backends: {', '.join(f'{k} {v:.3f} ms' for k, v in r.sdpa_backends.items()) or 'none accepts this case'}")
        if case.ragged:
            print(f"    alternatives: {', '.join(f'{k} {v:.3f} ms' for k, v in r.alternatives.items())}")
        if r.best_alternative:
            print(f"    best alternative: {r.best_alternative} ({r.best_alternative_ms:.3f} ms)")
        if r.skipped:
            print("    not timed: " + "; ".join(f"{k} ({v})" for k, v in r.skipped.items()))
        print("    memory: " + ", ".join(f"{k.replace('_bytes', '')} {_bytes(v)}" for k, v in r.memory.items()))
        if r.extra:
            print("    " + ", ".join(f"{k}={v:.3f}" for k, v in r.extra.items()))

    tuning = None
    if args.tune and device.type == "cuda" and backend == "triton":
        tuning = tune(device)
        for label, part in tuning.items():
            print(f"tuning {label} on {part['case']} (fastest first; default {part['default']} "
                  f"at {part['default_ms']:.3f} ms):")
            for row in part["rows"][:6]:
                print("   ", row)

    payload = dict(
        device=describe(device), torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version,
        backend=backend, sizes=sizes, copy_gbps=copy_gbps, results=[asdict(r) for r in results], tuning=tuning,
        cases={c.name: dict(asdict(c), seq_lens=None, num_seqs=len(c.seq_lens)) for c in cases},
    )
    targets = [args.json] if args.json else []
    if args.record:
        if device.type != "cuda":
            print("--record: not written, the figures it keeps are a GPU's", file=sys.stderr)
        else:
            targets.append(MEASURED)
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
