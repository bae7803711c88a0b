"""The iteration-level scheduler every allocator runs under, and the step accounting.

Each step: requests that have arrived join the waiting queue; waiting requests are
admitted first-come first-served while the memory model can place the first one;
then every running request generates one token; the memory is measured; requests
that reached their final length leave. Only requests whose state changes are touched:
finishes are looked up by step, and a contiguous model does no per-token work at all.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Protocol, Tuple

from ..errors import InvalidArgumentError
from .job import Job
from .metrics import Averager, SimResult, StepSnapshot
from .workloads import Workload


class MemoryModel(Protocol):
    """What the scheduler needs from an allocator (see ``reservation.py`` and ``paged.py``)."""

    name: str
    capacity: int
    lost: int
    tokens: int
    internal: int
    preemptions: int

    @property
    def block_size(self) -> Optional[int]: ...  # None: the contiguous models, which have no blocks

    def peak(self, job: Job) -> int: ...
    def allocated(self) -> int: ...
    def admit(self, job: Job, step: int) -> bool: ...
    def generate(self, running: List[Job], waiting: Deque[Job], step: int) -> None: ...
    def release(self, job: Job) -> None: ...
    def fragmented(self, job: Job) -> bool: ...
    def recount(self, running: List[Job], step: int) -> Tuple[int, int, int]: ...
    def check(self) -> None: ...


def run_schedule(
    workload: Workload,
    memory: MemoryModel,
    *,
    on_step: Optional[Callable[[StepSnapshot], None]] = None,
    check: bool = False,
    progress: Optional[object] = None,
) -> SimResult:
    """Serve every request of ``workload`` with ``memory``; returns the averaged result.

    ``on_step`` receives each step's :class:`StepSnapshot`. ``check`` recomputes the
    parts from scratch every step and checks the allocator's invariants (slow; for
    tests). ``progress`` is a tqdm-like object whose ``update(1)`` is called per finish.
    """
    requests = workload.requests
    total = len(requests)
    usable = memory.capacity - memory.lost
    for i, request in enumerate(requests):
        peak = memory.peak(Job(i, request))
        if peak > usable:
            raise InvalidArgumentError(
                f"request {i} ({request.prompt_len} + {request.output_len} tokens) needs {peak} "
                f"slots under {memory.name}, more than the {usable} usable slots of the capacity"
            )
    capacity, lost = memory.capacity, memory.lost
    waiting: Deque[Job] = deque()
    running: List[Job] = []
    finish_at: Dict[int, List[Tuple[Job, int]]] = {}
    averager = Averager()
    step = arrived = finished = 0

    while finished < total:
        while arrived < total and requests[arrived].arrival <= step:
            waiting.append(Job(arrived, requests[arrived]))
            arrived += 1
        if not running and not waiting:
            step = max(step + 1, math.ceil(requests[arrived].arrival))  # idle: jump ahead
            continue
        while waiting and memory.admit(waiting[0], step):
            job = waiting.popleft()
            running.append(job)
            end = step + job.final_len - job.prefill - 1
            finish_at.setdefault(end, []).append((job, job.epoch))
        if not running:
            raise RuntimeError(f"request {waiting[0].rid} does not fit into empty memory ({memory.name})")
        memory.generate(running, waiting, step)

        allocated = memory.allocated()
        free = capacity - allocated - lost
        reserved = allocated - memory.internal - memory.tokens
        external = free if waiting and memory.fragmented(waiting[0]) else 0
        averager.add(memory.tokens, reserved, memory.internal + lost, external, free - external,
                     len(running), bool(waiting))
        if on_step is not None or check:
            snap = StepSnapshot(step, memory.tokens, reserved, memory.internal + lost, external,
                                free - external, len(running), len(waiting))
            if check:
                _check_step(memory, running, snap)
            if on_step is not None:
                on_step(snap)

        done = finish_at.pop(step, None)
        if done:
            for job, epoch in done:
                if epoch == job.epoch:
                    memory.release(job)
                    running.remove(job)
                    finished += 1
                    if progress is not None:
                        progress.update(1)
        step += 1

    return averager.result(memory.name, memory.block_size, capacity, memory.preemptions, finished, step)


def _check_step(memory: MemoryModel, running: List[Job], snap: StepSnapshot) -> None:
    """Compare the running totals with a recount from the allocator's own state."""
    memory.check()
    tokens, reserved, internal = memory.recount(running, snap.step)
    got = (snap.token_states, snap.reserved, snap.internal - memory.lost)
    assert got == (tokens, reserved, internal), (
        f"step {snap.step}: running totals (tokens, reserved, internal) {got} != recount {(tokens, reserved, internal)}"
    )
    assert min(snap.token_states, snap.reserved, snap.internal, snap.external, snap.free) >= 0, snap
    assert snap.total() == memory.capacity, f"step {snap.step}: parts sum to {snap.total()}, not {memory.capacity}"
