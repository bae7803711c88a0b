"""A request's state inside the simulator (mutable, one per request, reused across preemptions)."""

from __future__ import annotations

from .workloads import TraceRequest


class Job:
    """What the scheduler and the memory models track about one request.

    ``prefill`` is how many tokens the request holds when it is (re)admitted: its
    prompt at first, prompt plus the tokens already generated after a preemption
    (recompute). It then gains one token per step until it holds ``final_len``.
    ``epoch`` counts admissions, so a finish scheduled before a preemption is ignored.
    """

    __slots__ = ("rid", "request", "final_len", "prefill", "admit_step", "epoch",
                 "start", "size", "blocks", "internal")

    def __init__(self, rid: int, request: TraceRequest) -> None:
        self.rid = rid
        self.request = request
        self.final_len = request.prompt_len + request.output_len
        self.prefill = request.prompt_len
        self.admit_step = -1
        self.epoch = 0
        self.start = -1      # contiguous: where its region begins
        self.size = 0        # contiguous: slots reserved
        self.blocks = 0      # paged: blocks held
        self.internal = 0    # slots held that it will never fill

    def tokens_at(self, step: int) -> int:
        """Tokens held after ``step``'s generation, for a job admitted and running since."""
        return self.prefill + step - self.admit_step + 1

    def __repr__(self) -> str:
        return f"Job(rid={self.rid}, prefill={self.prefill}, final_len={self.final_len}, epoch={self.epoch})"
