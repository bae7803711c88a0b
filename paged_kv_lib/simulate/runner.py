"""``simulate()``: run one workload under several allocators and block sizes."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Union

from .._validate import as_count, as_iterable
from ..errors import InvalidArgumentError, InvalidTypeError
from .metrics import SimResult
from .paged import PagedMemory
from .reservation import RESERVATIONS, ContiguousMemory, check_fit
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
    raise InvalidArgumentError(f"unknown allocator {allocator!r}: choose from {ALLOCATORS}")


def check_workload(workload: Any) -> Workload:
    """``workload`` itself when it is a :class:`Workload`, else a typed error."""
    if not isinstance(workload, Workload):
        raise InvalidTypeError(f"workload must be a Workload (make_workload, load_workload), "
                               f"got {type(workload).__name__} {workload!r:.60}")
    return workload


def block_sizes(block_size: Any) -> List[int]:
    """``block_size`` (an int, or a sequence of them for a sweep) as a non-empty list of ints >= 1."""
    if isinstance(block_size, (str, bytes)):
        raise InvalidTypeError(f"block_size must be an int or a list of ints, got {block_size!r}")
    if hasattr(block_size, "__index__"):
        return [as_count(block_size, "block_size", minimum=1)]
    sizes = [as_count(size, "block_size", minimum=1) for size in as_iterable(block_size, "block_size")]
    if not sizes:
        raise InvalidArgumentError("block_size needs at least 1 value, got an empty list")
    return sizes


def allocator_entries(allocators: Any) -> List[Any]:
    """``allocators`` as a list (a lone string is refused: it would iterate as letters)."""
    if isinstance(allocators, (str, bytes)):
        raise InvalidTypeError(f"allocators must be a list of names, got the string {allocators!r}: "
                               f"write [{allocators!r}]")
    return list(as_iterable(allocators, "allocators"))


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
    check_workload(workload)
    capacity_tokens = as_count(capacity_tokens, "capacity_tokens", minimum=1)
    names = allocator_entries(allocators)
    for name in names:
        if not isinstance(name, str) or name not in ALLOCATORS:
            raise InvalidArgumentError(f"unknown allocator {name!r}: choose from {ALLOCATORS}")
    sizes = block_sizes(block_size)
    check_fit(fit)
    if "paged" in names and capacity_tokens < min(sizes):
        raise InvalidArgumentError(f"block_size {min(sizes)} is larger than the capacity of "
                                   f"{capacity_tokens} token slots")
    results = []
    for name in names:
        for size in sizes if name == "paged" else sizes[:1]:
            memory = make_memory(name, capacity_tokens, block_size=size, max_len=workload.max_len, fit=fit)
            results.append(run_schedule(workload, memory, progress=progress, check=check))
    return results
