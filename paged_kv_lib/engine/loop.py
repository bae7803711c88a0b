"""``Engine``: the serving loop (schedule, preempt, decode, admit, prefill) over one paged cache."""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .._validate import as_count, as_iterable
from ..allocator import PagedKVCacheAllocator
from ..attention import check_supported
from ..errors import InvalidArgumentError, InvalidTypeError
from ..model import TinyTransformer, check_temperature, encode, sample_generator, sample_token
from .requests import Request, RequestOutput, RequestTooLargeError, Sample, Status, TokenEvent
from .requests import UnknownRequestError, UnsupportedModelError
from .stats import EngineTotals, StepStats

PREEMPTION_MODES = ("recompute", "swap")
Prompt = Union[str, Sequence[int]]


class Engine:
    """Serve many requests at once on one model and one paged KV cache.

    Args:
        model: the transformer; its K/V shape must match the allocator's cache.
        allocator: the block pool (built with ``num_cpu_blocks`` for swap preemption).
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
    """

    def __init__(
        self,
        model: TinyTransformer,
        allocator: PagedKVCacheAllocator,
        *,
        max_batch_size: int = 64,
        watermark: float = 0.01,
        preemption_mode: str = "recompute",
        max_num_batched_tokens: Optional[int] = None,
    ) -> None:
        cfg = model.config
        try:  # ask paged attention whether it can serve this model, before anything is queued
            check_supported(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, model.dtype)
        except (ValueError, TypeError) as err:
            raise UnsupportedModelError(f"the engine cannot run this model: {err}") from err
        model.check_allocator(allocator)
        self.model = model
        self.allocator = allocator
        self.max_batch_size = as_count(max_batch_size, "max_batch_size", minimum=1)
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)):
            raise InvalidTypeError(f"watermark must be a float, got {type(watermark).__name__} {watermark!r}")
        if not 0.0 <= watermark < 1.0:
            raise InvalidArgumentError(f"watermark must be in [0, 1), got {watermark!r}")
        self.watermark = float(watermark)
        if preemption_mode not in PREEMPTION_MODES:
            raise InvalidArgumentError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        self.preemption_mode = preemption_mode
        self.max_num_batched_tokens = (
            sys.maxsize if max_num_batched_tokens is None
            else as_count(max_num_batched_tokens, "max_num_batched_tokens", minimum=1)
        )
        self.waiting: Deque[Request] = deque()  # preempted requests go back to the front
        self.running: List[Request] = []  # oldest first; the last one is preempted first
        self.totals = EngineTotals()
        self._finished: Dict[int, RequestOutput] = {}
        self._next_request_id = 0
        self._next_seq_id = 0
        self._seed_source = torch.Generator().manual_seed(0)
        self._peak_this_step = 0
        self._step_tokens: List[TokenEvent] = []  # the tokens the last step sampled, in order

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

    def _prepare(
        self, prompt: Prompt, max_new_tokens: int, n: int, temperature: float, seed: Optional[int]
    ) -> Tuple[List[int], int, int, float, Optional[int]]:
        """Check one request's arguments without changing anything; returns them normalised."""
        prompt_ids = encode(prompt) if isinstance(prompt, str) else self._token_list(prompt)
        max_new_tokens = as_count(max_new_tokens, "max_new_tokens", minimum=1)
        n = as_count(n, "n", minimum=1)
        if n > self.max_batch_size:
            raise InvalidArgumentError(f"n={n} samples can never run together: max_batch_size is {self.max_batch_size}")
        temperature = check_temperature(temperature)
        if seed is not None:
            seed = as_count(seed, "seed")
        self._check_fits(len(prompt_ids), max_new_tokens, n)
        return prompt_ids, max_new_tokens, n, temperature, seed

    def _queue(self, prepared: Tuple[List[int], int, int, float, Optional[int]]) -> int:
        prompt_ids, max_new_tokens, n, temperature, seed = prepared
        if seed is None:
            seed = int(torch.randint(0, 2**31, (), generator=self._seed_source))
        request_id = self._next_request_id
        self._next_request_id += 1
        samples = []
        for index in range(n):
            samples.append(Sample(index, self._next_seq_id, sample_generator(seed, index)))
            self._next_seq_id += 1
        self.waiting.append(Request(request_id, prompt_ids, max_new_tokens, n, temperature, seed, samples))
        return request_id

    def _token_list(self, prompt: Sequence[int]) -> List[int]:
        if isinstance(prompt, (bytes, bytearray)):
            raise InvalidTypeError("prompt must be a str or a sequence of token ids, got bytes (decode it, or list() it)")
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.reshape(-1).tolist()
        ids = [as_count(t, "token id") for t in prompt]
        if not ids:
            raise InvalidArgumentError("the prompt must hold at least one token")
        vocab = self.model.config.vocab_size
        for t in ids:
            if t >= vocab:
                raise InvalidArgumentError(f"token id {t} is outside the vocabulary [0, {vocab})")
        return ids

    def _check_fits(self, prompt_len: int, max_new_tokens: int, n: int) -> None:
        # The last sampled token is never fed back, so a sample holds at most
        # prompt + max_new_tokens - 1 tokens; n samples never hold more blocks than n
        # private copies would, and an admission must leave the watermark free.
        alloc = self.allocator
        per_sample = alloc.blocks_needed(prompt_len + max_new_tokens - 1)
        needed = n * per_sample + alloc.watermark_blocks(self.watermark)
        if needed > alloc.num_blocks:
            raise RequestTooLargeError(
                f"request can never fit: {n} sample(s) of up to {prompt_len} + {max_new_tokens} - 1 "
                f"tokens need {needed} blocks of {alloc.block_size} (watermark included), but the "
                f"pool has only {alloc.num_blocks}",
                needed,
                alloc.num_blocks,
            )

    def abort_request(self, request_id: int) -> bool:
        """Drop a waiting, running or swapped request and release its blocks at once; False if it had finished.

        Raises :class:`UnknownRequestError` for an id this engine never issued (nothing changes).
        """
        request_id = as_count(request_id, "request_id")
        if request_id >= self._next_request_id:
            raise UnknownRequestError(
                f"request {request_id} was never added: this engine issued ids 0 to {self._next_request_id - 1}"
            )
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._release(request)
                    request.status = Status.FINISHED
                    request.aborted = True
                    return True
        return False

    def _release(self, request: Request) -> None:
        """Give back every block (device or CPU) the request's samples hold; their prefill progress goes too."""
        for sample in request.samples:
            self.allocator.free_sequence(sample.seq_id)  # unknown ids are a no-op
            sample.reset_prefill()

    def has_unfinished(self) -> bool:
        """Whether any request is waiting, running or swapped out."""
        return bool(self.waiting or self.running)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(r.live_samples()) for r in self.running)

    # ------------------------------------------------------------ the loop
    @torch.no_grad()
    def step(self) -> StepStats:
        """One iteration: schedule decodes then prompt chunks under the token budget, run them in one forward.

        If anything fails inside, every running request is taken back to the waiting
        queue as if preempted by recompute (its blocks released, the tokens it generated
        kept), and the error propagates: the engine stays usable.
        """
        try:
            return self._step()
        except BaseException:
            self._recover()
            raise

    def _recover(self) -> None:
        """After a failed step: requeue every running request, in order, with its blocks released.

        The step may have registered blocks in the prefix cache whose K/V it never
        finished writing, so the cache's content keys are dropped too (no block is in use
        on the device any more: swapped requests hold only CPU blocks).
        """
        for request in reversed(self.running):
            self._release(request)
            request.status = Status.WAITING
            self.waiting.appendleft(request)
        self.running = []
        if self.allocator.num_used_blocks == 0:
            self.allocator.reset_prefix_cache()

    def _step(self) -> StepStats:
        start = time.perf_counter()
        self._step_tokens = []
        alloc = self.allocator
        self._peak_this_step = alloc.num_used_blocks
        budget = self.max_num_batched_tokens
        decodes, preempted = self._schedule_decodes(budget)
        budget -= len(decodes)
        chunks = self._schedule_chunks(budget)
        while not decodes and not chunks and self.running:
            # Every running sequence is mid-prompt and none can grow: free the newest for the oldest.
            self._preempt(self.running[-1])
            self.running.pop()
            preempted += 1
            chunks = self._schedule_chunks(budget)
        budget -= sum(len(c.tokens) for c in chunks)
        if self.max_num_batched_tokens == sys.maxsize:
            # No budget: decode, then admit into what the finished requests freed, and prefill the
            # admitted prompts whole in a second forward (the order the scheduler had before budgets,
            # which lesson 07's model-free scheduler replays step for step).
            generated = self._forward(decodes, chunks)
            self._retire_finished()
            admitted = [] if preempted else self._admit(budget)
            generated += self._forward([], admitted)
            chunks += admitted
        else:
            # A budget: decodes and prompt chunks share one forward (as vLLM v1 runs a step).
            if not preempted:
                chunks += self._admit(budget)
            generated = self._forward(decodes, chunks)
        if not self.running and self.waiting and not preempted and not chunks and not decodes:
            head = self.waiting[0]
            raise RuntimeError(  # guarded against by _check_fits; a bug if it happens
                f"engine stalled: request {head.request_id} cannot be admitted into an idle pool "
                f"({alloc.num_free_blocks}/{alloc.num_blocks} blocks free)"
            )
        self._retire_finished()
        elapsed = time.perf_counter() - start

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
        totals.peak_blocks_used = max(totals.peak_blocks_used, self._peak_this_step)
        return StepStats(
            step=totals.steps,
            running=len(self.running),
            waiting=sum(1 for r in self.waiting if r.status is Status.WAITING),
            swapped=sum(1 for r in self.waiting if r.status is Status.SWAPPED),
            prefill_tokens=prefill_tokens,
            cached_tokens=cached_tokens,
            decode_tokens=len(decodes),
            generated_tokens=generated,
            preempted=preempted,
            blocks_used=alloc.num_used_blocks,
            blocks_cached=alloc.num_cached_free_blocks,
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
            for r in list(self.waiting) + self.running
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

    def _queue_all(self, prompts: Iterable[Prompt], max_new_tokens: int, options: dict, call: str) -> List[int]:
        """Check every prompt with the same options, then queue them all; returns their request ids."""
        unknown = set(options) - {"n", "temperature", "seed"}
        if unknown:
            raise InvalidTypeError(f"{call}() got unexpected options {sorted(unknown)}; it takes n, temperature, seed")
        prepared = [
            self._prepare(p, max_new_tokens, options.get("n", 1), options.get("temperature", 0.0), options.get("seed"))
            for p in as_iterable(prompts, "prompts")
        ]
        return [self._queue(p) for p in prepared]

    def generate(self, prompts: Iterable[Prompt], max_new_tokens: int, **options) -> List[RequestOutput]:
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

    def stream(self, prompts: Iterable[Prompt], max_new_tokens: int, **options) -> Iterator[TokenEvent]:
        """Add every prompt (as :meth:`generate` does) and yield each new token the moment it is sampled.

        Yields :class:`TokenEvent` ``(request_id, sample_index, token_id)``, in the order the
        steps produce them. Between two tokens the caller may :meth:`abort_request` one of
        these requests: its blocks are released at once and it yields nothing more. Closing
        the generator early aborts the requests still running; outputs are not kept.
        Requests queued earlier run along (their outputs stay for :meth:`run`).
        """
        ids = self._queue_all(prompts, max_new_tokens, options, "stream")
        return self._stream(ids)

    def _stream(self, ids: List[int]) -> Iterator[TokenEvent]:
        mine = set(ids)
        requests = {r.request_id: r for r in list(self.waiting) + self.running if r.request_id in mine}
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

    # ------------------------------------------------------------ scheduling
    def _schedule_decodes(self, budget: int) -> Tuple[List[Tuple[Request, Sample]], int]:
        """Pick the decoding samples this step carries (oldest first, one token each, within the budget) and grow them.

        The allocator says whether they can all grow together (new blocks and copy-on-write
        copies counted); while it says no, the newest running request is preempted. Returns
        the decodes and how many requests were preempted.
        """
        alloc = self.allocator
        preempted = 0
        while True:
            decodes = [(r, s) for r in self.running for s in r.resident_samples() if s.prefill is None][:budget]
            if not decodes or alloc.can_append([s.seq_id for _, s in decodes]):
                break
            self._preempt(self.running[-1])  # the newest request; off the list once that worked (see step())
            self.running.pop()
            preempted += 1
        if decodes:
            seq_ids = [s.seq_id for _, s in decodes]
            if alloc.enable_prefix_caching:  # content is only worth telling an allocator that caches
                alloc.append_tokens_batch(seq_ids, 1, token_ids=[s.output[-1:] for _, s in decodes])
            else:
                alloc.append_tokens_batch(seq_ids, 1)
        return decodes, preempted

    def _schedule_chunks(self, budget: int) -> List[Chunk]:
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

        A sample not yet in the allocator is allocated with its cached prefix plus the chunk
        (the cached blocks are skipped, not computed; ``can_allocate`` decides, leaving
        ``watermark``); one already in grows by as much of the chunk as ``appendable_tokens``
        says fits now. At least the prompt's last token is always computed: its logits give
        the next token.
        """
        alloc = self.allocator
        tokens = sample.prefill
        assert tokens is not None
        by_content = alloc.enable_prefix_caching
        if sample.computed == 0:
            hit = alloc.cached_prefix_tokens(tokens) if by_content else 0
            total = len(tokens) if hit >= len(tokens) else hit + min(len(tokens) - hit, budget)
            ids = tokens[:total]
            if not alloc.can_allocate(total, token_ids=ids if by_content else None, watermark=watermark):
                return None
            cached = alloc.allocate_for_sequence(sample.seq_id, total, token_ids=ids if by_content else None)
            begin = min(cached, total - 1)
            sample.computed = total
            if not request.started:
                request.num_cached_tokens = cached
            return Chunk(request, sample, tokens[begin:total], cached < total, total == len(tokens), cached)
        begin = sample.computed
        n = alloc.appendable_tokens(sample.seq_id, min(len(tokens) - begin, budget))
        if n == 0:
            return None
        new = tokens[begin : begin + n]
        alloc.append_tokens(sample.seq_id, n, token_ids=new if by_content else None)
        sample.computed += n
        return Chunk(request, sample, new, True, sample.computed == len(tokens), 0)

    # ------------------------------------------------------------ the forward
    def _forward(self, decodes: List[Tuple[Request, Sample]], chunks: List[Chunk]) -> int:
        """Run these decodes and prompt chunks in one forward, sample; returns tokens generated."""
        self._peak_this_step = max(self._peak_this_step, self.allocator.num_used_blocks)
        if not decodes and not chunks:
            return 0
        alloc = self.allocator
        seq_ids = [s.seq_id for _, s in decodes] + [c.sample.seq_id for c in chunks]
        inputs = [s.output[-1:] for _, s in decodes] + [c.tokens for c in chunks]
        write = None if all(c.write for c in chunks) else [True] * len(decodes) + [c.write for c in chunks]
        logits = self.model.forward_paged(alloc, seq_ids, inputs, write=write)
        greedy = logits.argmax(dim=-1).tolist()
        generated = 0
        for row, (request, sample) in enumerate(decodes):
            if request.temperature == 0:
                self._append_token(request, sample, greedy[row])
            else:
                self._take_token(request, sample, logits[row])
            generated += 1
        for row, chunk in enumerate(chunks, start=len(decodes)):
            if not chunk.completes:
                continue
            request, sample = chunk.request, chunk.sample
            sample.reset_prefill()
            if not request.started:  # a new prompt: its other samples share it from here on
                for child in request.samples[1:]:
                    alloc.fork(sample.seq_id, child.seq_id)
                for each in request.samples:
                    self._take_token(request, each, logits[row])
                    generated += 1
            else:
                self._take_token(request, sample, logits[row])
                generated += 1
        self._peak_this_step = max(self._peak_this_step, alloc.num_used_blocks)
        return generated

    def _append_token(self, request: Request, sample: Sample, token: int) -> None:
        sample.output.append(token)
        self._step_tokens.append(TokenEvent(request.request_id, sample.index, token))
        if len(sample.output) >= request.max_new_tokens:
            sample.finished = True
            self.allocator.free_sequence(sample.seq_id)

    def _take_token(self, request: Request, sample: Sample, logits: torch.Tensor) -> None:
        self._append_token(request, sample, sample_token(logits, request.temperature, sample.generator))

    def _retire_finished(self) -> None:
        still = []
        for request in self.running:
            if request.live_samples():
                still.append(request)
                continue
            request.status = Status.FINISHED
            self._finished[request.request_id] = RequestOutput(
                request.request_id,
                tuple(request.prompt),
                tuple(tuple(s.output) for s in request.samples),
                request.num_cached_tokens,
                request.num_preemptions,
            )
        self.running = still

    # ------------------------------------------------------------ preemption
    def _preempt(self, request: Request) -> None:
        """Take a running request off the device; it goes back to the front of the queue.

        Swap keeps the K/V of a request whose samples all decode; one mid-prompt is
        recomputed (its chunks so far are dropped and computed again on re-admission).
        """
        request.num_preemptions += 1
        decoding = request.started and all(s.prefill is None for s in request.live_samples())
        if self.preemption_mode == "swap" and decoding and self._try_swap_out(request):
            request.status = Status.SWAPPED
        else:
            # Recompute: keep the generated tokens, drop the K/V; re-admission prefills
            # prompt + output again (the sampled tokens are not drawn again).
            self._release(request)
            request.status = Status.WAITING
        self.waiting.appendleft(request)

    def _try_swap_out(self, request: Request) -> bool:
        """Swap every live sample of the request to the CPU pool, if it has room for all of them."""
        alloc = self.allocator
        live = request.live_samples()
        # Each table's blocks get private CPU copies, even the blocks it shared.
        if sum(len(alloc.get_block_mapping(s.seq_id)) for s in live) > alloc.num_free_cpu_blocks:
            return False
        for sample in live:
            alloc.swap_out(sample.seq_id)
        return True

    # ------------------------------------------------------------ admission
    def _admit(self, budget: int) -> List[Chunk]:
        """Move waiting requests to running, oldest first, while batch slots, the budget and the allocator allow.

        A swapped request comes back whole by ``swap_in`` (no tokens computed; it decodes
        next step). Any other gets its first prompt chunk (or, resuming after recompute,
        each sample its own) if the allocator says the first one fits and leaves the
        watermark free; its other chunks follow in later steps. Returns the chunks scheduled.
        """
        chunks: List[Chunk] = []
        slots = self.max_batch_size - self.num_running_seqs
        while self.waiting:
            request = self.waiting[0]
            live = request.live_samples()
            if len(live) > slots:
                break
            if request.status is Status.SWAPPED:
                if not self._swap_in(live):
                    break
            else:
                if budget <= 0:
                    break
                samples = request.resident_samples()
                for sample in samples:
                    sample.prefill = request.prompt + sample.output
                first = self._next_chunk(request, samples[0], budget, watermark=self.watermark)
                if first is None:
                    for sample in samples:
                        sample.reset_prefill()
                    break
                chunks.append(first)
                budget -= len(first.tokens)
                for sample in samples[1:]:  # the others start now if the budget and the pool allow, else later
                    if budget <= 0:
                        break
                    more = self._next_chunk(request, sample, budget, watermark=self.watermark)
                    if more is None:
                        break
                    chunks.append(more)
                    budget -= len(more.tokens)
            self.waiting.popleft()
            self.running.append(request)
            request.status = Status.RUNNING
            slots -= len(live)
            self._peak_this_step = max(self._peak_this_step, self.allocator.num_used_blocks)
        return chunks

    def _swap_in(self, live: List[Sample]) -> bool:
        """Swap every sample back in if the allocator says each fits; all or none."""
        alloc = self.allocator
        done: List[Sample] = []
        for sample in live:
            if not alloc.can_swap_in(sample.seq_id, watermark=self.watermark):
                for back in done:  # their CPU blocks were freed just now, so this fits
                    alloc.swap_out(back.seq_id)
                return False
            alloc.swap_in(sample.seq_id)
            done.append(sample)
        return True


@dataclass(eq=False)
class Chunk:
    """A run of one sample's prompt scheduled this step: its tokens (already allocated), whether their K/V is
    written (not when the cache held the whole prompt), whether it ends the prompt, and the tokens found cached."""

    request: Request
    sample: Sample
    tokens: List[int]
    write: bool
    completes: bool
    cached: int
