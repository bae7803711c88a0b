"""Simulated serving: how much KV-cache memory holds tokens under each allocator.

Reproduces the memory-waste measurement of the PagedAttention paper (Kwon et al.,
SOSP 2023): contiguous Orca-style reservations against the paged allocator, under
one iteration-level scheduler and a seeded ShareGPT- or Alpaca-like workload::

    from paged_kv_lib.simulate import make_workload, simulate
    from paged_kv_lib.viz import plot_results
    results = simulate(make_workload("sharegpt", 2000, seed=0), capacity_tokens=15728)
    for r in results:
        print(r.label, f"{r.token_states:.1%}", r.mean_batch)
    plot_results(results)  # stacked bars of the five parts, and batch sizes

``load_workload(path)`` reads lengths from a CSV/JSON trace instead; ``run_schedule``
runs one memory model (``make_memory``) with a per-step callback, for step-by-step
pictures. ``metrics.py`` defines the five parts of the capacity.
"""

from .contiguous import ContiguousAllocator
from .metrics import PARTS, SimResult, StepSnapshot
from .runner import ALLOCATORS, DEFAULT_BLOCK_SIZE, DEFAULT_CAPACITY, make_memory, simulate
from .scheduler import run_schedule
from .workloads import (
    TRACES,
    TraceRequest,
    Workload,
    WorkloadError,
    load_workload,
    make_workload,
    requests_from_lengths,
)

__all__ = [
    "ALLOCATORS",
    "ContiguousAllocator",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CAPACITY",
    "PARTS",
    "TraceRequest",
    "SimResult",
    "StepSnapshot",
    "TRACES",
    "Workload",
    "WorkloadError",
    "load_workload",
    "make_memory",
    "make_workload",
    "requests_from_lengths",
    "run_schedule",
    "simulate",
]
