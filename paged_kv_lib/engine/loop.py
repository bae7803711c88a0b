"""``Engine``: the serving loop (schedule, preempt, decode, admit, prefill) over one paged cache."""

from __future__ import annotations

import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .._validate import as_count
from ..allocator import PagedKVCacheAllocator
from ..attention import check_supported
from ..model import TinyTransformer, check_temperature, encode, sample_generator, sample_token
from .requests import Request, RequestOutput, RequestTooLargeError, Sample, Status, UnsupportedModelError
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
            CPU pool is full).
    """

    def __init__(
        self,
        model: TinyTransformer,
        allocator: PagedKVCacheAllocator,
        *,
        max_batch_size: int = 64,
        watermark: float = 0.01,
        preemption_mode: str = "recompute",
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
            raise TypeError(f"watermark must be a float, got {type(watermark).__name__} {watermark!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        self.watermark = float(watermark)
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        self.preemption_mode = preemption_mode
        self.waiting: Deque[Request] = deque()  # preempted requests go back to the front
        self.running: List[Request] = []  # oldest first; the last one is preempted first
        self.totals = EngineTotals()
        self._finished: Dict[int, RequestOutput] = {}
        self._next_request_id = 0
        self._next_seq_id = 0
        self._seed_source = torch.Generator().manual_seed(0)
        self._pending_prefill: Dict[int, list] = {}
        self._peak_this_step = 0

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
            raise ValueError(f"n={n} samples can never run together: max_batch_size is {self.max_batch_size}")
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
            raise TypeError("prompt must be a str or a sequence of token ids, got bytes (decode it, or list() it)")
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.reshape(-1).tolist()
        ids = [as_count(t, "token id") for t in prompt]
        if not ids:
            raise ValueError("the prompt must hold at least one token")
        vocab = self.model.config.vocab_size
        for t in ids:
            if t >= vocab:
                raise ValueError(f"token id {t} is outside the vocabulary [0, {vocab})")
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
        """Drop a waiting, running or swapped request and release its blocks; False if unknown or finished."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._release(request)
                    request.status = Status.FINISHED
                    return True
        return False

    def _release(self, request: Request) -> None:
        """Give back every block (device or CPU) the request's samples hold."""
        self._pending_prefill.pop(request.request_id, None)
        for sample in request.samples:
            self.allocator.free_sequence(sample.seq_id)  # unknown ids are a no-op

    def has_unfinished(self) -> bool:
        """Whether any request is waiting, running or swapped out."""
        return bool(self.waiting or self.running)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(r.live_samples()) for r in self.running)

    # ------------------------------------------------------------ the loop
    @torch.no_grad()
    def step(self) -> StepStats:
        """One iteration: decode the running batch (preempting if short of blocks), then admit.

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
        self._pending_prefill.clear()
        reset = getattr(self.allocator, "reset_prefix_cache", None)
        if reset is not None and self.allocator.num_used_blocks == 0:
            reset()

    def _step(self) -> StepStats:
        start = time.perf_counter()
        preempted = self._schedule_decode()
        decode_tokens = self._decode()
        prefill_tokens = cached_tokens = 0
        generated = decode_tokens
        if not preempted:
            admitted = self._admit()
            prefill_tokens, cached_tokens, first_tokens = self._prefill(admitted)
            generated += first_tokens
        if not self.running and self.waiting and not preempted and generated == 0:
            head = self.waiting[0]
            raise RuntimeError(  # guarded against by _check_fits; a bug if it happens
                f"engine stalled: request {head.request_id} cannot be admitted into an idle pool "
                f"({self.allocator.num_free_blocks}/{self.allocator.num_blocks} blocks free)"
            )
        elapsed = time.perf_counter() - start

        alloc = self.allocator
        totals = self.totals
        totals.steps += 1
        totals.prefill_tokens += prefill_tokens
        totals.cached_tokens += cached_tokens
        totals.decode_tokens += decode_tokens
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
            decode_tokens=decode_tokens,
            generated_tokens=generated,
            preempted=preempted,
            blocks_used=alloc.num_used_blocks,
            blocks_cached=alloc.num_cached_free_blocks,
            elapsed_s=elapsed,
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

    def generate(self, prompts: Iterable[Prompt], max_new_tokens: int, **options) -> List[RequestOutput]:
        """Add every prompt with the same options, run until they finish, return their outputs in order.

        All prompts are checked before any is queued, so a refused one leaves the engine
        as it was. Requests queued earlier with ``add_request`` run along; their outputs
        stay for the next :meth:`run`. If a step fails, this call's requests are dropped
        and the error propagates.
        """
        progress = options.pop("progress", False)
        unknown = set(options) - {"n", "temperature", "seed"}
        if unknown:
            raise TypeError(f"generate() got unexpected options {sorted(unknown)}")
        prepared = [
            self._prepare(p, max_new_tokens, options.get("n", 1), options.get("temperature", 0.0), options.get("seed"))
            for p in prompts
        ]
        ids = [self._queue(p) for p in prepared]
        try:
            self._run_until(set(ids), progress)
        except BaseException:
            for request_id in ids:
                self.abort_request(request_id)
                self._finished.pop(request_id, None)
            raise
        return [self._finished.pop(i) for i in ids]

    def _run_until(self, request_ids: set, progress: bool) -> None:
        """Step until the given requests have finished."""
        from tqdm.auto import tqdm

        with tqdm(unit="tok", desc="generate", disable=not progress) as bar:
            while not request_ids.issubset(self._finished):
                stats = self.step()
                bar.update(stats.generated_tokens)

    # ------------------------------------------------------------ decode
    def _schedule_decode(self) -> int:
        """Make room for one more token in every running sequence; returns requests preempted.

        The allocator says whether all of them can grow together (new blocks and
        copy-on-write copies counted); while it says no, the newest request is preempted.
        """
        alloc = self.allocator
        self._peak_this_step = alloc.num_used_blocks
        preempted = 0
        while self.running:
            if alloc.can_append([s.seq_id for r in self.running for s in r.live_samples()]):
                break
            self._preempt(self.running[-1])  # the newest request; off the list once that worked
            self.running.pop()
            preempted += 1
        return preempted

    def _decode(self) -> int:
        alloc = self.allocator
        batch = [(r, s) for r in self.running for s in r.live_samples()]
        if not batch:
            return 0
        # Content (for the prefix cache) is only worth telling an allocator that caches.
        by_content = getattr(alloc, "enable_prefix_caching", True)
        for _, sample in batch:
            alloc.append_tokens(sample.seq_id, 1, token_ids=sample.output[-1:] if by_content else None)
        self._peak_this_step = max(self._peak_this_step, alloc.num_used_blocks)
        logits = self.model.forward_paged(
            alloc, [s.seq_id for _, s in batch], [s.output[-1:] for _, s in batch]
        )
        self._take_tokens(batch, logits)
        self._retire_finished()
        return len(batch)

    def _take_tokens(self, batch: List[Tuple[Request, Sample]], logits: torch.Tensor) -> None:
        """Sample one token per row of ``logits``; greedy rows share one argmax over the batch."""
        greedy = logits.argmax(dim=-1).tolist()
        for row, (request, sample) in enumerate(batch):
            if request.temperature == 0:
                self._append_token(request, sample, greedy[row])
            else:
                self._take_token(request, sample, logits[row])

    def _append_token(self, request: Request, sample: Sample, token: int) -> None:
        sample.output.append(token)
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
        """Take a running request off the device; it goes back to the front of the queue."""
        request.num_preemptions += 1
        if self.preemption_mode == "swap" and self._try_swap_out(request):
            request.status = Status.SWAPPED
        else:
            # Recompute: keep the generated tokens, drop the K/V; re-admission prefills
            # prompt + output again (the sampled tokens are not drawn again).
            for sample in request.live_samples():
                self.allocator.free_sequence(sample.seq_id)
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
    def _admit(self) -> List[Request]:
        """Move waiting requests to running, oldest first, while the allocator and batch slots allow.

        Each admission asks the allocator whether it fits and leaves the watermark free,
        then takes its blocks at once (so the next question sees them taken); a request
        with several samples is admitted whole or not at all. Swapped requests come back
        by ``swap_in`` and simply decode next step; the others are returned to be
        prefilled.
        """
        to_prefill: List[Request] = []
        slots = self.max_batch_size - self.num_running_seqs
        while self.waiting:
            request = self.waiting[0]
            live = request.live_samples()
            if len(live) > slots:
                break
            # Move it first, so a failure below finds it among the running (see step()).
            self.waiting.popleft()
            self.running.append(request)
            if request.status is Status.SWAPPED:
                admitted = self._swap_in(live)
            else:
                admitted = self._allocate(request)
            if not admitted:
                self.running.pop()
                self.waiting.appendleft(request)
                break
            if request.status is not Status.SWAPPED:
                to_prefill.append(request)
            request.status = Status.RUNNING
            slots -= len(live)
            self._peak_this_step = max(self._peak_this_step, self.allocator.num_used_blocks)
        return to_prefill

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

    def _allocate(self, request: Request) -> bool:
        """Allocate what a request about to be prefilled needs, if the allocator says it fits; all or none.

        A new request allocates its prompt once (its other samples fork after prefill),
        as ``can_allocate`` allows. A request resuming after recompute re-allocates each
        sample's prompt + output: with one sample ``can_allocate`` decides; with several,
        the sum of their ``blocks_needed`` (cache hits not counted, so never too few) plus
        ``watermark_blocks`` must be free. It is decided before anything is allocated,
        since an allocation registers its blocks' content for the prefix cache before
        their K/V is computed, and must not be undone without computing it.
        """
        alloc = self.allocator
        samples = request.live_samples() if request.started else request.samples[:1]
        tokens = [request.prompt + s.output for s in samples]
        if len(samples) == 1:
            fits = alloc.can_allocate(len(tokens[0]), token_ids=tokens[0], watermark=self.watermark)
        else:
            needed = sum(alloc.blocks_needed(len(t)) for t in tokens)
            fits = needed + alloc.watermark_blocks(self.watermark) <= alloc.num_free_blocks
        if not fits:
            return False
        chunks = []
        for sample, ids in zip(samples, tokens):
            cached = alloc.allocate_for_sequence(sample.seq_id, len(ids), token_ids=ids)
            chunks.append((sample, ids, cached))
        if not request.started:
            request.num_cached_tokens = chunks[0][2]
        self._pending_prefill[request.request_id] = chunks
        return True

    def _prefill(self, requests: List[Request]) -> Tuple[int, int, int]:
        """Compute the uncached tail of each admitted sequence, sample, fork new requests' samples.

        Returns (tokens computed, tokens found cached, tokens generated).
        """
        if not requests:
            return 0, 0, 0
        alloc = self.allocator
        rows = []  # (request, sample, fresh)
        seq_ids, chunks, write = [], [], []
        computed = cached_total = 0
        for request in requests:
            fresh = not request.started
            for sample, tokens, cached in self._pending_prefill.pop(request.request_id):
                # Always compute at least the last token: its logits give the next one. If
                # the cache holds it all, its K/V is there already, so it is not rewritten.
                start = min(cached, len(tokens) - 1)
                seq_ids.append(sample.seq_id)
                chunks.append(tokens[start:])
                write.append(cached < len(tokens))
                rows.append((request, sample, fresh))
                computed += len(tokens) - start
                cached_total += cached
        logits = self.model.forward_paged(alloc, seq_ids, chunks, write=write)
        generated = 0
        for row, (request, sample, fresh) in enumerate(rows):
            if fresh:
                for child in request.samples[1:]:
                    alloc.fork(sample.seq_id, child.seq_id)
                for each in request.samples:
                    self._take_token(request, each, logits[row])
                    generated += 1
            else:
                self._take_token(request, sample, logits[row])
                generated += 1
        self._peak_this_step = max(self._peak_this_step, alloc.num_used_blocks)
        self._retire_finished()
        return computed, cached_total, generated
