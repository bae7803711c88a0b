"""``simulate()``: run one workload under several allocators and block sizes."""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Union

from .._validate import as_count
from .metrics import SimResult
from .paged import PagedMemory
from .reservation import RESERVATIONS, ContiguousMemory
from .scheduler import MemoryModel, run_schedule
from .workloads import Workload

ALLOCATORS = RESERVATIONS + ("paged",)
# A 13B model on a 40 GB GPU holds about 15.7K tokens of KV cache (the paper's setup).
DEFAULT_CAPACITY = 15728
DEFAULT_BLOCK_SIZE = 16


def make_memory(
    allocator: str,
    capacity_tokens: int,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_len: int = 2048,
    fit: str = "buddy",
) -> MemoryModel:
    """The memory model named ``allocator`` (one of ``ALLOCATORS``)."""
    capacity_tokens = as_count(capacity_tokens, "capacity_tokens", minimum=1)
    if allocator == "paged":
        return PagedMemory(capacity_tokens, as_count(block_size, "block_size", minimum=1))
    if allocator in RESERVATIONS:
        return ContiguousMemory(allocator, capacity_tokens, max_len, fit)
    raise ValueError(f"unknown allocator {allocator!r}: choose from {ALLOCATORS}")


def simulate(
    workload: Workload,
    capacity_tokens: int = DEFAULT_CAPACITY,
    allocators: Iterable[str] = ALLOCATORS,
    block_size: Union[int, Sequence[int]] = DEFAULT_BLOCK_SIZE,
    *,
    fit: str = "buddy",
    progress: Optional[object] = None,
    check: bool = False,
) -> List[SimResult]:
    """Serve ``workload`` with each allocator; one :class:`SimResult` per allocator.

    ``block_size`` may be a list: the paged allocator then runs once per size (the
    contiguous ones ignore it). ``fit`` is the contiguous allocator's hole policy.
    ``progress`` (a tqdm bar) advances once per finished request; ``check`` verifies
    the accounting at every step (slow).
    """
    names = list(allocators)
    for name in names:
        if name not in ALLOCATORS:
            raise ValueError(f"unknown allocator {name!r}: choose from {ALLOCATORS}")
    sizes = [block_size] if isinstance(block_size, int) else list(block_size)
    if not sizes:
        raise ValueError("block_size needs at least one value")
    results = []
    for name in names:
        for size in sizes if name == "paged" else sizes[:1]:
            memory = make_memory(name, capacity_tokens, block_size=size, max_len=workload.max_len, fit=fit)
            results.append(run_schedule(workload, memory, progress=progress, check=check))
    return results
