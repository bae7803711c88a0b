"""``Scheduler``: which requests run each step, and what each sequence grows by, asked of the bookkeeping.

It holds the two queues (``queue``: requests waiting to run, new, preempted by recompute or
swapped out, first come first served; ``running``: oldest first) and decides, every step,
which decodes and prompt chunks go into the forward, whom to preempt and whom to admit. Every
question about blocks goes to the allocator (:class:`~paged_kv_lib.protocols.EngineAllocator`):
the scheduler keeps no rule of its own about what fits.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List, Optional, Tuple

from ..protocols import EngineAllocator
from .forward import Chunk, Decode
from .requests import Request, Sample, Status

PREEMPTION_MODES = ("recompute", "swap")


class Scheduler:
    """Decodes first, then prompt chunks, then admissions, under a token budget the caller gives each call.

    Args:
        allocator: the bookkeeping every question goes to (and the acts).
        max_batch_size: most sequences (samples) running at once.
        watermark: fraction of the pool an admission must leave free (checked by the caller).
        preemption_mode: ``"recompute"`` or ``"swap"`` (checked by the caller).
    """

    def __init__(self, allocator: EngineAllocator, *, max_batch_size: int, watermark: float,
                 preemption_mode: str) -> None:
        self.allocator = allocator
        self.max_batch_size = max_batch_size
        self.watermark = watermark
        self.preemption_mode = preemption_mode
        self.queue: Deque[Request] = deque()  # waiting or swapped out; preempted requests go back to the front
        self.running: List[Request] = []  # oldest first; the last one is preempted first
        self.peak_blocks = 0  # the most blocks in use seen since the caller last reset it

    # ------------------------------------------------------------ state
    @property
    def num_running_seqs(self) -> int:
        return sum(len(r.live_samples()) for r in self.running)

    def note_peak(self) -> None:
        """Remember the blocks in use now if they are the most seen this step."""
        self.peak_blocks = max(self.peak_blocks, self.allocator.num_used_blocks)

    def release(self, request: Request) -> None:
        """Give back every block (device or CPU) the request's samples hold; their prefill progress goes too."""
        for sample in request.samples:
            self.allocator.free_sequence(sample.seq_id)  # unknown ids are a no-op
            sample.reset_prefill()

    def remove(self, request_id: int) -> Optional[Request]:
        """Take a queued or running request out, its blocks released; ``None`` if it is in neither."""
        for requests in (self.queue, self.running):
            for request in requests:
                if request.request_id == request_id:
                    requests.remove(request)
                    self.release(request)
                    return request
        return None

    def requeue_running(self) -> None:
        """After a failed step: every running request back to the front of the queue, in order, blocks released.

        The step may have registered blocks in the prefix cache whose K/V it never finished
        writing, so the cache's content keys are dropped too once no block is in use on the
        device (swapped requests hold only CPU blocks).
        """
        for request in reversed(self.running):
            self.release(request)
            request.status = Status.WAITING
            self.queue.appendleft(request)
        self.running = []
        if self.allocator.num_used_blocks == 0:
            self.allocator.reset_prefix_cache()

    def retire_finished(self) -> List[Request]:
        """Take the requests whose samples have all finished off the running list; returns them, oldest first."""
        still: List[Request] = []
        done: List[Request] = []
        for request in self.running:
            (still if request.live_samples() else done).append(request)
        for request in done:
            request.status = Status.FINISHED
        self.running = still
        return done

    # ------------------------------------------------------------ decodes and chunks
    def schedule_decodes(self, budget: int) -> Tuple[List[Decode], int]:
        """Pick the decoding samples this step carries (oldest first, one token each, within the budget) and grow them.

        One call to the allocator grows them all and says what it placed (``allocate_slots``); when it
        says they do not fit (and changed nothing), the newest running request is preempted and the
        smaller batch asked again. Returns the decodes and how many requests were preempted.
        """
        preempted = 0
        while True:
            decodes = [(r, s) for r in self.running for s in r.resident_samples() if s.prefill is None][:budget]
            if not decodes:
                return decodes, preempted
            placed = self.allocator.allocate_slots([s.seq_id for _, s in decodes], 1,
                                                   token_ids=[s.output[-1] for _, s in decodes])
            if placed is not None:
                return decodes, preempted
            self.preempt_newest()
            preempted += 1

    def schedule_chunks(self, budget: int) -> List[Chunk]:
        """The next prompt chunk of each running sample that is mid-prefill, oldest first, within the budget."""
        chunks: List[Chunk] = []
        for request in self.running:
            for sample in request.resident_samples():
                if budget <= 0:
                    return chunks
                if sample.prefill is None or sample.computed == len(sample.prefill):
                    continue
                chunk = self._next_chunk(request, sample, budget, watermark=0.0)
                if chunk is not None:
                    chunks.append(chunk)
                    budget -= len(chunk.tokens)
        return chunks

    def _next_chunk(self, request: Request, sample: Sample, budget: int, *, watermark: float) -> Optional[Chunk]:
        """Grow the sample by its next prompt chunk (at most ``budget`` tokens) if the allocator has room; else None.

        One call places it (``allocate_prompt``, leaving ``watermark``): a sample not yet in the
        allocator is admitted with its cached prefix plus the chunk, or not at all (the cached blocks
        are skipped, not computed); one already in grows by as much of the chunk as fits now. At least
        the prompt's last token is always computed: its logits give the next token.
        """
        alloc = self.allocator
        tokens = sample.prefill
        assert tokens is not None
        before = alloc.allocate_prompt(sample.seq_id, tokens, max_new_tokens=budget, watermark=watermark)
        if before is None:
            return None
        total = alloc.get_num_tokens(sample.seq_id)
        if sample.computed:  # the next chunk of a sample already in
            sample.computed = total
            return Chunk(request, sample, tokens[before:total], True, total == len(tokens), 0)
        begin = min(before, total - 1)  # ``before`` tokens were found cached
        sample.computed = total
        if not request.started:
            request.num_cached_tokens = before
        return Chunk(request, sample, tokens[begin:total], before < total, total == len(tokens), before)

    # ------------------------------------------------------------ preemption
    def preempt_newest(self) -> None:
        """Take the newest running request off the device (off the list once that worked)."""
        self._preempt(self.running[-1])
        self.running.pop()

    def _preempt(self, request: Request) -> None:
        """Take a running request off the device; it goes back to the front of the queue.

        Swap keeps the K/V of a request whose samples all decode, if the CPU pool has room for
        all of them; otherwise (or mid-prompt) it is recomputed: the generated tokens stay, the
        K/V goes, and re-admission prefills prompt + output again (nothing is sampled twice).
        """
        request.num_preemptions += 1
        live = request.live_samples()
        decoding = request.started and all(s.prefill is None for s in live)
        seq_ids = [s.seq_id for s in live]
        if self.preemption_mode == "swap" and decoding and self.allocator.swap_out(*seq_ids) is not None:
            request.status = Status.SWAPPED
        else:
            self.release(request)
            request.status = Status.WAITING
        self.queue.appendleft(request)

    # ------------------------------------------------------------ admission
    def admit(self, budget: int) -> List[Chunk]:
        """Move queued requests to running, oldest first, while batch slots, the budget and the allocator allow.

        A swapped request comes back whole by one ``swap_in`` of its samples, all or none (no tokens
        computed; it decodes next step). Any other gets its first prompt chunk (or, resuming after recompute,
        each sample its own) if the allocator says the first one fits and leaves the
        watermark free; its other chunks follow in later steps. A resumed request whose samples'
        prefills all fit this step's budget (always, without a budget) comes back with all of
        them or not at all (``can_allocate_many``). Returns the chunks scheduled.
        """
        chunks: List[Chunk] = []
        slots = self.max_batch_size - self.num_running_seqs
        while self.queue:
            request = self.queue[0]
            live = request.live_samples()
            if len(live) > slots:
                break
            if request.status is Status.SWAPPED:
                if self.allocator.swap_in(*[s.seq_id for s in live], watermark=self.watermark) is None:
                    break
            else:
                started = self._start(request, budget)
                if started is None:
                    break
                chunks += started
                budget -= sum(len(c.tokens) for c in started)
            self.queue.popleft()
            self.running.append(request)
            request.status = Status.RUNNING
            slots -= len(live)
            self.note_peak()
        return chunks

    def _start(self, request: Request, budget: int) -> Optional[List[Chunk]]:
        """The first chunks of a request joining the batch (its resident samples', as far as budget and pool
        allow), or ``None`` when not even the first fits (then nothing changed)."""
        if budget <= 0:
            return None
        samples = request.resident_samples()
        for sample in samples:
            sample.prefill = request.prompt + sample.output
        whole = len(samples) > 1 and sum(len(s.prefill or ()) for s in samples) <= budget  # all in one step
        if whole and not self._fit_together(samples):
            first = None
        else:
            first = self._next_chunk(request, samples[0], budget, watermark=self.watermark)
        if first is None:
            for sample in samples:
                sample.reset_prefill()
            return None
        chunks = [first]
        budget -= len(first.tokens)
        for sample in samples[1:]:  # the others start now if the budget and the pool allow, else later
            if budget <= 0:
                break
            more = self._next_chunk(request, sample, budget, watermark=self.watermark)
            if more is None:
                break
            chunks.append(more)
            budget -= len(more.tokens)
        return chunks

    def _fit_together(self, samples: List[Sample]) -> bool:
        """Whether every sample's whole prefill fits now at once, leaving the watermark (the allocator decides)."""
        prefills = [s.prefill or [] for s in samples]
        return self.allocator.can_allocate_many([len(p) for p in prefills], token_ids=prefills,
                                                watermark=self.watermark)
