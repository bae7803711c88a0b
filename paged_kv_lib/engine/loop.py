"""``Engine``: the serving loop (schedule, preempt, decode, admit, prefill) over one paged cache.

The engine owns the requests (ids, seeds, outputs, the tokens each step sampled) and the step
loop; :class:`~paged_kv_lib.engine.scheduler.Scheduler` decides what each step carries and
:func:`~paged_kv_lib.engine.forward.run_forward` runs it. Its allocator is any
:class:`~paged_kv_lib.protocols.EngineAllocator`: the engine asks it every question about
blocks and reads nothing else.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Deque, Dict, Generator, Iterable, List, Optional

import torch

from .._validate import as_count, as_iterable
from ..attention import check_supported
from ..errors import InvalidArgumentError, InvalidTypeError
from ..protocols import EngineAllocator
from ..model import TinyTransformer, sample_generator
from ..model.batch import DecodeAttention
from .forward import Chunk, Decode, run_forward
from .intake import Prepared, Prompt, check_options, check_parts, prepare, typed
from .requests import Request, RequestOutput, Sample, Status, TokenEvent
from .requests import UnknownRequestError, UnsupportedModelError
from .scheduler import PREEMPTION_MODES, Scheduler
from .stats import EngineTotals, StepStats



class Engine:
    """Serve many requests at once on one model and one paged KV cache.

    Args:
        model: the transformer; its K/V shape must match the allocator's cache.
        allocator: the block pool and its bookkeeping, any :class:`EngineAllocator` (built with
            ``num_cpu_blocks`` for swap preemption).
        max_batch_size: most sequences (samples) running at once.
        watermark: fraction of the pool a new admission must leave free, so running
            sequences can grow a while before anyone is preempted.
        preemption_mode: ``"recompute"`` or ``"swap"`` (falls back to recompute when the
            CPU pool is full, or for a request still mid-prompt).
        max_num_batched_tokens: most tokens one step computes (``None``: no limit). Decodes
            come first (one token each), then prompt chunks: a prompt longer than what is left
            spreads over several steps, its sequence growing chunk by chunk (chunked prefill,
            as vLLM v1 schedules), in one forward with the decodes. Tokens found in the prefix
            cache are not computed, so not counted. With no limit a step decodes first, then
            admits into the blocks finished requests freed and prefills those prompts whole.
        decode_attention: ``None`` (the library's paged attention), or a callable with
            :func:`~paged_kv_lib.attention.paged_attention`'s arguments and result that serves every
            step made of decodes only (prompt chunks keep the library's extend attention): how the
            course's capstone runs a learner's own kernel in the engine.

    Bad arguments raise a :class:`~paged_kv_lib.errors.PagedKVError` naming the value and the limit.
    """

    def __init__(
        self,
        model: TinyTransformer,
        allocator: EngineAllocator,
        *,
        max_batch_size: int = 64,
        watermark: float = 0.01,
        preemption_mode: str = "recompute",
        max_num_batched_tokens: Optional[int] = None,
        decode_attention: Optional[DecodeAttention] = None,
    ) -> None:
        check_parts(model, allocator)
        cfg = model.config
        try:  # ask paged attention whether it can serve this model, before anything is queued
            check_supported(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, model.dtype)
        except (ValueError, TypeError) as err:
            raise UnsupportedModelError(f"the engine cannot run this model: {err}") from err
        typed(model.check_allocator, allocator)
        max_batch_size = as_count(max_batch_size, "max_batch_size", minimum=1)
        needed = allocator.blocks_to_hold(1, watermark=watermark)  # the allocator checks the watermark
        if needed > allocator.num_blocks:
            raise InvalidArgumentError(
                f"watermark={watermark!r} leaves no room: a one-token request needs {needed} of the pool's "
                f"{allocator.num_blocks} blocks, no request could ever be admitted"
            )
        if not isinstance(preemption_mode, str) or preemption_mode not in PREEMPTION_MODES:
            raise InvalidArgumentError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        self._budget = _token_budget(max_num_batched_tokens)
        if decode_attention is not None and not callable(decode_attention):
            raise InvalidTypeError(f"decode_attention must be callable (q, k_cache, v_cache, block_tables, seq_lens), "
                                   f"got {type(decode_attention).__name__}")
        self.decode_attention = decode_attention
        self.model = model
        self.allocator = allocator
        self.scheduler = Scheduler(allocator, max_batch_size=max_batch_size, watermark=float(watermark),
                                   preemption_mode=preemption_mode)
        self.totals = EngineTotals()
        self._finished: Dict[int, RequestOutput] = {}
        self._next_request_id = 0
        self._next_seq_id = 0
        self._seed_source = torch.Generator().manual_seed(0)
        self._step_tokens: List[TokenEvent] = []  # the tokens the last step sampled, in order

    # ------------------------------------------------------------ the scheduler's settings and queues
    @property
    def max_batch_size(self) -> int:
        return self.scheduler.max_batch_size

    @property
    def watermark(self) -> float:
        return self.scheduler.watermark

    @property
    def preemption_mode(self) -> str:
        return self.scheduler.preemption_mode

    @property
    def max_num_batched_tokens(self) -> int:
        """Most tokens one step computes (``sys.maxsize``: no limit); may be changed between steps."""
        return self._budget

    @max_num_batched_tokens.setter
    def max_num_batched_tokens(self, value: Optional[int]) -> None:
        self._budget = _token_budget(value)

    @property
    def queue(self) -> Deque[Request]:
        """Requests not running: new, preempted by recompute (``Status.WAITING``) or swapped out
        (``Status.SWAPPED``), admitted first come, first served (preempted ones at the front)."""
        return self.scheduler.queue

    @property
    def waiting(self) -> Deque[Request]:
        """:attr:`queue` under its earlier name, swapped requests included (lesson 07 and the exercise checks read it)."""
        return self.scheduler.queue

    @property
    def running(self) -> List[Request]:
        """The requests running, oldest first (the last one is preempted first)."""
        return self.scheduler.running

    # ------------------------------------------------------------ requests
    def add_request(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        *,
        n: int = 1,
        temperature: float = 0.0,
        seed: Optional[int] = None,
    ) -> int:
        """Queue a prompt (text, encoded as BOS + UTF-8 bytes, or token ids); returns its request id.

        ``n`` samples are drawn at ``temperature`` (0: greedy). With ``seed`` the samples
        are reproducible whatever else is running. Raises :class:`RequestTooLargeError`
        if the request could not finish even alone in the pool; a refused request
        changes nothing.
        """
        return self._queue(self._prepare(prompt, max_new_tokens, n, temperature, seed))

    def _prepare(self, prompt: Prompt, max_new_tokens: int, n: int, temperature: float,
                 seed: Optional[int]) -> Prepared:
        return prepare(prompt, max_new_tokens, n, temperature, seed, vocab_size=self.model.config.vocab_size,
                       max_batch_size=self.max_batch_size, allocator=self.allocator, watermark=self.watermark)

    def _queue(self, prepared: Prepared) -> int:
        prompt_ids, max_new_tokens, n, temperature, seed = prepared
        if seed is None:
            seed = int(torch.randint(0, 2**31, (), generator=self._seed_source))
        request_id = self._next_request_id
        self._next_request_id += 1
        samples = []
        for index in range(n):
            samples.append(Sample(index, self._next_seq_id, sample_generator(seed, index)))
            self._next_seq_id += 1
        self.queue.append(Request(request_id, prompt_ids, max_new_tokens, n, temperature, seed, samples))
        return request_id

    def abort_request(self, request_id: int) -> bool:
        """Drop a waiting, running or swapped request and release its blocks at once; False if it had finished.

        Raises :class:`UnknownRequestError` for an id this engine never issued (nothing changes).
        """
        request_id = as_count(request_id, "request_id")
        if request_id >= self._next_request_id:
            raise UnknownRequestError(
                f"request {request_id} was never added: this engine issued ids 0 to {self._next_request_id - 1}"
            )
        request = self.scheduler.remove(request_id)
        if request is None:
            return False
        request.status = Status.FINISHED
        request.aborted = True
        return True

    def has_unfinished(self) -> bool:
        """Whether any request is waiting, running or swapped out."""
        return bool(self.queue or self.running)

    @property
    def num_running_seqs(self) -> int:
        return self.scheduler.num_running_seqs

    # ------------------------------------------------------------ the loop
    @torch.no_grad()
    def step(self) -> StepStats:
        """One iteration: schedule decodes then prompt chunks under the token budget, run them in one forward.

        If anything fails inside, every running request is taken back to the queue as if
        preempted by recompute (its blocks released, the tokens it generated kept), and the
        error propagates: the engine stays usable.
        """
        try:
            return self._step()
        except BaseException:
            self.scheduler.requeue_running()
            raise

    def _step(self) -> StepStats:
        start = time.perf_counter()
        self._step_tokens = []
        sched = self.scheduler
        sched.peak_blocks = self.allocator.num_used_blocks
        budget = self.max_num_batched_tokens
        decodes, preempted = sched.schedule_decodes(budget)
        budget -= len(decodes)
        chunks = sched.schedule_chunks(budget)
        while not decodes and not chunks and sched.running:
            # Every running sequence is mid-prompt and none can grow: free the newest for the oldest.
            sched.preempt_newest()
            preempted += 1
            chunks = sched.schedule_chunks(budget)
        budget -= sum(len(c.tokens) for c in chunks)
        if self.max_num_batched_tokens == sys.maxsize:
            # No budget: decode, then admit into what the finished requests freed, and prefill the
            # admitted prompts whole in a second forward (the order the scheduler had before budgets,
            # which lesson 07's model-free scheduler replays step for step).
            generated = self._forward(decodes, chunks)
            self._retire_finished()
            admitted = [] if preempted else sched.admit(budget)
            generated += self._forward([], admitted)
            chunks += admitted
        else:
            # A budget: decodes and prompt chunks share one forward (as vLLM v1 runs a step).
            if not preempted:
                chunks += sched.admit(budget)
            generated = self._forward(decodes, chunks)
        if not self.running and self.queue and not preempted and not chunks and not decodes:
            head = self.queue[0]
            raise RuntimeError(  # add_request refused such requests at add_request; a bug if it happens
                f"engine stalled: request {head.request_id} cannot be admitted into an idle pool "
                f"({self.allocator.num_blocks - self.allocator.num_used_blocks}/{self.allocator.num_blocks} blocks free)"
            )
        self._retire_finished()
        return self._account(decodes, chunks, generated, preempted, time.perf_counter() - start)

    def _forward(self, decodes: List[Decode], chunks: List[Chunk]) -> int:
        self.scheduler.note_peak()
        generated = run_forward(self.model, self.allocator, decodes, chunks, self._record_token, self.decode_attention)
        self.scheduler.note_peak()
        return generated

    def _record_token(self, request: Request, sample: Sample, token: int) -> None:
        """A sampled token joins the sample's output and this step's events; a sample done is freed at once."""
        sample.output.append(token)
        self._step_tokens.append(TokenEvent(request.request_id, sample.index, token))
        if len(sample.output) >= request.max_new_tokens:
            sample.finished = True
            self.allocator.free_sequence(sample.seq_id)

    def _retire_finished(self) -> None:
        for request in self.scheduler.retire_finished():
            self._finished[request.request_id] = RequestOutput(
                request.request_id,
                tuple(request.prompt),
                tuple(tuple(s.output) for s in request.samples),
                request.num_cached_tokens,
                request.num_preemptions,
            )

    def _account(self, decodes: List[Decode], chunks: List[Chunk], generated: int, preempted: int,
                 elapsed: float) -> StepStats:
        """Add the step to the totals; returns its stats."""
        prefill_tokens = sum(len(c.tokens) for c in chunks)
        cached_tokens = sum(c.cached for c in chunks)
        totals = self.totals
        totals.steps += 1
        totals.prefill_tokens += prefill_tokens
        totals.cached_tokens += cached_tokens
        totals.decode_tokens += len(decodes)
        totals.generated_tokens += generated
        totals.preemptions += preempted
        totals.elapsed_s += elapsed
        totals.peak_blocks_used = max(totals.peak_blocks_used, self.scheduler.peak_blocks)
        return StepStats(
            step=totals.steps,
            running=len(self.running),
            waiting=sum(1 for r in self.queue if r.status is Status.WAITING),
            swapped=sum(1 for r in self.queue if r.status is Status.SWAPPED),
            prefill_tokens=prefill_tokens,
            cached_tokens=cached_tokens,
            decode_tokens=len(decodes),
            generated_tokens=generated,
            preempted=preempted,
            blocks_used=self.allocator.num_used_blocks,
            blocks_cached=self.allocator.num_cached_free_blocks,
            elapsed_s=elapsed,
            prefill_sequences=len(chunks),
            decode_sequences=len(decodes),
            prefill_completed=sum(1 for c in chunks if c.completes),
        )

    def run(self, progress: bool = True) -> List[RequestOutput]:
        """Step until every request has finished; returns the outputs not yet returned, by request id."""
        from tqdm.auto import tqdm

        remaining = sum(
            len(r.live_samples()) * r.max_new_tokens - sum(len(s.output) for s in r.live_samples())
            for r in list(self.queue) + self.running
        )
        with tqdm(total=remaining, unit="tok", desc="generate", disable=not progress) as bar:
            while self.has_unfinished():
                stats = self.step()
                bar.update(stats.generated_tokens)
                bar.set_postfix(
                    running=stats.running, waiting=stats.waiting + stats.swapped,
                    blocks=f"{stats.blocks_used}/{self.allocator.num_blocks}", refresh=False,
                )
        outputs = [self._finished[k] for k in sorted(self._finished)]
        self._finished.clear()
        return outputs

    def _queue_all(self, prompts: Iterable[Prompt], max_new_tokens: int, options: Dict[str, Any], call: str) -> List[int]:
        """Check every prompt with the same options, then queue them all; returns their request ids."""
        check_options(options, call)
        prepared = [
            self._prepare(p, max_new_tokens, options.get("n", 1), options.get("temperature", 0.0), options.get("seed"))
            for p in as_iterable(prompts, "prompts")
        ]
        return [self._queue(p) for p in prepared]

    def generate(self, prompts: Iterable[Prompt], max_new_tokens: int, **options: Any) -> List[RequestOutput]:
        """Add every prompt with the same options, run until they finish, return their outputs in order.

        All prompts are checked before any is queued, so a refused one leaves the engine
        as it was. Requests queued earlier with ``add_request`` run along; their outputs
        stay for the next :meth:`run`. If a step fails, this call's requests are dropped
        and the error propagates.
        """
        progress = options.pop("progress", False)
        ids = self._queue_all(prompts, max_new_tokens, options, "generate")
        try:
            self._run_until(set(ids), progress)
        except BaseException:
            self._drop(ids)
            raise
        return [self._finished.pop(i) for i in ids]

    def stream(self, prompts: Iterable[Prompt], max_new_tokens: int, **options: Any) -> Generator[TokenEvent, None, None]:
        """Add every prompt (as :meth:`generate` does) and yield each new token the moment it is sampled.

        Yields :class:`TokenEvent` ``(request_id, sample_index, token_id)``, in the order the
        steps produce them. Between two tokens the caller may :meth:`abort_request` one of
        these requests: its blocks are released at once and it yields nothing more. Closing
        the generator early aborts the requests still running; outputs are not kept.
        Requests queued earlier run along (their outputs stay for :meth:`run`).
        """
        ids = self._queue_all(prompts, max_new_tokens, options, "stream")
        return self._stream(ids)

    def _stream(self, ids: List[int]) -> Generator[TokenEvent, None, None]:
        mine = set(ids)
        requests = {r.request_id: r for r in list(self.queue) + self.running if r.request_id in mine}
        pending = set(ids)
        try:
            while pending:
                self.step()
                events = [e for e in self._step_tokens if e.request_id in pending]
                for request_id in [i for i in pending if requests[i].status is Status.FINISHED]:
                    pending.discard(request_id)
                    self._finished.pop(request_id, None)  # streamed: the output is not kept
                for event in events:
                    if not requests[event.request_id].aborted:  # the caller may abort between two tokens
                        yield event
                pending = {i for i in pending if requests[i].status is not Status.FINISHED}
        finally:
            self._drop(sorted(pending))

    def _drop(self, ids: Iterable[int]) -> None:
        """Abort these requests if still queued or running, and forget their outputs."""
        for request_id in ids:
            self.abort_request(request_id)
            self._finished.pop(request_id, None)

    def _run_until(self, request_ids: set, progress: bool) -> None:
        """Step until the given requests have finished."""
        from tqdm.auto import tqdm

        with tqdm(unit="tok", desc="generate", disable=not progress) as bar:
            while not request_ids.issubset(self._finished):
                stats = self.step()
                bar.update(stats.generated_tokens)


def _token_budget(value: Optional[int]) -> int:
    """A step's token budget: a positive int, or ``None`` for no limit (typed errors otherwise)."""
    return sys.maxsize if value is None else as_count(value, "max_num_batched_tokens", minimum=1)
